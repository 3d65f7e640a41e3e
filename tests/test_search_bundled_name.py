"""search given a bundled scenario's name resolves it as `simtrain run` does, also where the base's own layout
breaks a rule and the search reads it again with a plain layout of its cluster."""

from __future__ import annotations

import re

from conftest import REPO, run_cli


def test_cli_search_of_a_bundled_name_whose_layout_breaks_a_rule_runs_as_its_path(capsys):
    """pp4_dp4: 2 nodes x 8 GPUs = 16 GPUs; a global batch of 2 does not divide over its dp 4 (the base's rule),
    so the search starts from TP x DP of its 16 GPUs; by name as by path (scenarios/pp4_dp4.yaml), the same text."""
    args = ["--set", "training.global_batch=2", "--workers", "1", "--top", "1", "--no-progress"]
    code, by_name, err = run_cli(["search", "pp4_dp4", *args], capsys)
    assert (code, err) == (0, ""), err
    code, by_path, err = run_cli(["search", str(REPO / "scenarios/pp4_dp4.yaml"), *args], capsys)
    assert (code, err) == (0, ""), err
    assert "layouts of 16 GPUs:" in by_name
    seconds = re.compile(r"\(\d+\.\d s\)")      # the search's own time
    assert seconds.sub("", by_name) == seconds.sub("", by_path)
