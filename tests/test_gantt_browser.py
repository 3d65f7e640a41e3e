"""The Gantt HTML in a real headless Chromium, offline: it draws its bars with no console errors.

Chromium runs with every host name unresolvable (--host-resolver-rules), so a
page that fetched plotly.js from a CDN would draw nothing. A probe script added
to a copy of the page records errors, console.error calls and every resource
the page loaded into the DOM, which --dump-dom prints after the scripts ran.
Needs Debian's `chromium` (.ci/run installs it); skips with a message without it.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from simtrain.engine.simulation import simulate
from simtrain.report.charts import gantt_figure, write_outputs
from simtrain.spec.scenario import load_scenario

DATA = Path(__file__).parent / "data"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

PROBE = """<script>
window.__probe = [];
window.addEventListener("error", function (e) {
  window.__probe.push("error: " + (e.message || (e.target && (e.target.src || e.target.href)) || "unknown"));
}, true);
window.addEventListener("unhandledrejection", function (e) { window.__probe.push("rejection: " + e.reason); });
(function () {
  var original = console.error;
  console.error = function () {
    window.__probe.push("console.error: " + Array.prototype.join.call(arguments, " "));
    original.apply(console, arguments);
  };
})();
window.addEventListener("load", function () {
  setTimeout(function () {
    var out = document.createElement("pre");
    out.id = "probe";
    out.textContent = JSON.stringify({
      errors: window.__probe,
      resources: performance.getEntriesByType("resource").map(function (r) { return r.name; })
    });
    document.body.appendChild(out);
  }, 300);
});
</script>"""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium found (looked for " + ", ".join(BROWSERS) + "): install Debian's `chromium` "
                "(apt-get install chromium, as .ci/run does) to run the Gantt rendering test")


def _render(page: Path, profile: Path) -> tuple[str, dict, str]:
    """DOM after the scripts ran, the probe's findings, and Chromium's log."""
    probed = page.with_name("probed-" + page.name)
    probed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>\n" + PROBE, 1), encoding="utf-8")
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--window-size=1400,1000",
           "--dump-dom", probed.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, "the probe never reported: the page's scripts did not finish loading"
    return done.stdout, json.loads(html.unescape(found.group(1))), done.stderr


@pytest.fixture(scope="module")
def tiny():
    return simulate(load_scenario(DATA / "charts_tiny.yaml"))


def test_gantt_renders_offline_without_errors(tiny, tmp_path):
    """Offline, Chromium draws every bar of the Gantt chart, loads no resource and logs no error."""
    page = tmp_path / "gantt.html"
    write_outputs(tiny, gantt=str(page))
    dom, probe, log = _render(page, tmp_path / "profile")
    assert probe["errors"] == []
    assert [r for r in probe["resources"] if not r.startswith(("file:", "data:", "blob:"))] == []
    assert "Uncaught" not in log
    assert dom.count('class="plot-container') == 2          # the Gantt chart and the memory timeline
    bars = sum(len(tr.y) for tr in gantt_figure(tiny).data)
    paths = re.findall(r'<g class="point"><path d="(M[^"]+)"', dom)
    assert len(paths) == bars
    assert "stage 3 · PP send" in dom                       # the row labels are drawn


def test_probe_catches_errors(tmp_path):
    """The probe sees a failing script and a blocked network fetch (so a silent pass means something)."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><head><script src=\"https://cdn.example.org/lib.js\"></script>"
                    "</head><body><script>undefinedFunction();</script></body></html>", encoding="utf-8")
    _, probe, _ = _render(page, tmp_path / "profile")
    assert any("undefinedFunction" in e for e in probe["errors"])
    assert any("cdn.example.org" in e for e in probe["errors"])
