"""The examples under examples/ run as shipped (issue 5, deliverable 6)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_sweep_microbatches_example(tmp_path):
    """The micro-batch sweep runs from any folder, writes its chart and picks the largest count: with
    1F1B the bubble (p-1)/(m+p-1) only shrinks with m while the activations held stay at pp
    micro-batches, so throughput is highest at the most micro-batches (64 of 4..64)."""
    out = tmp_path / "chart.html"
    done = subprocess.run([sys.executable, str(REPO / "examples" / "sweep_microbatches.py"), str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    assert [int(r[0]) for r in rows] == [4, 8, 16, 32, 64]
    assert [int(r[1]) for r in rows] == [16, 32, 64, 128, 256]       # global = 1 x m x dp 4 (rule 12)
    assert "best throughput: 64 micro-batches (global batch 256)" in done.stdout
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_example_default_output_goes_to_a_temporary_folder(tmp_path):
    """Without an argument the chart lands in a new temporary folder, named in the output."""
    done = subprocess.run([sys.executable, str(REPO / "examples" / "sweep_microbatches.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip().splitlines()[-1].removeprefix("wrote ")
    assert path.endswith("sweep_microbatches.html") and "simtrain-example-" in path
    assert list(tmp_path.iterdir()) == []
    written = Path(path)
    assert written.is_file()
    shutil.rmtree(written.parent)


def test_compare_generations_example(tmp_path):
    """The generations example prints days, dollars and MWh for H100, B200 and GB200 NVL72 and writes its chart."""
    out = tmp_path / "gen.html"
    done = subprocess.run([sys.executable, str(REPO / "examples" / "compare_generations.py"), str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pattern = re.compile(r"(H100|B200|GB200-NVL72)\s+[\d.]+ days")
    rows = [line.split() for line in done.stdout.splitlines() if pattern.match(line)]
    assert [r[0] for r in rows] == ["H100", "B200", "GB200-NVL72"]
    assert all(r[3].startswith("$") and r[-1] == "MWh" for r in rows)
    assert out.read_text().startswith("<!DOCTYPE html>")
