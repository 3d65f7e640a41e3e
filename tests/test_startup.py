"""What `simtrain run` loads: a run imports only what it needs, so the process starts fast (issue 25, item 3).

Checked on sys.modules in a fresh interpreter, not on time: a lazy import turned eager fails here on any machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: what neither `import simtrain.cli` nor a `simtrain run --json` needs: charts (plotly), tables (pandas), numpy,
#: the graph library (template clusters route by name), progress bars, the decision tools (sweep, search, validate)
NOT_FOR_A_RUN = ("plotly", "pandas", "numpy", "networkx", "tqdm", "scipy", "simtrain.decide", "simtrain.report.charts",
                 "simtrain.report.svg", "simtrain.report.trace", "simtrain.report.notebook")


def _loaded(names, modules) -> list[str]:
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def test_cli_import_and_a_run_leave_heavy_modules_unloaded(tmp_path):
    """`import simtrain.cli` loads no command, no click and no pydantic (main() imports them); a whole
    `simtrain run --json` loads none of plotly, pandas, numpy, networkx, tqdm or simtrain.decide."""
    out = tmp_path / "report.json"
    code = (
        "import json, sys\n"
        "import simtrain.cli\n"
        "at_import = sorted(sys.modules)\n"
        "try:\n"
        f"    simtrain.cli.main(['run', 'pp4_dp4', '--json', {str(out)!r}])\n"
        "except SystemExit as end:\n"
        "    status = end.code\n"
        "print(json.dumps({'status': status, 'at_import': at_import, 'after_run': sorted(sys.modules)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["status"] == 0
    assert json.loads(out.read_text())["step_time_s"] > 0
    assert _loaded(("click", "pydantic", "yaml", "simpy", "simtrain.cli.commands_core", "simtrain.engine"),
                   seen["at_import"]) == []
    assert _loaded(NOT_FOR_A_RUN, seen["after_run"]) == []
