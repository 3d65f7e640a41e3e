"""search on an explicit topology: the layouts are of the hardware file's devices (not the template's default
node of 8 GPUs), and --gpus can only repeat that count."""

from __future__ import annotations

import pytest
from conftest import REPO, run_cli

from simtrain.decide.search import search
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import load_scenario

# tests/bad_inputs/good/hw.yaml's GPU, on four devices of two nodes joined by one switch
STAR4 = (REPO / "tests/bad_inputs/good/hw.yaml").read_text(encoding="utf-8").split("\nnodes:")[0] + """
devices: [{name: g0, node: 0}, {name: g1, node: 0}, {name: g2, node: 1}, {name: g3, node: 1}]
switches: [{name: s0}]
links:
  - {a: g0, b: s0, bandwidth: 100 GB/s}
  - {a: g1, b: s0, bandwidth: 100 GB/s}
  - {a: g2, b: s0, bandwidth: 100 GB/s}
  - {a: g3, b: s0, bandwidth: 100 GB/s}
"""
SCENARIO = ("hardware: star4.yaml\nmodel: model.yaml\ntraining: {seq_len: 128, global_batch: 8, micro_batch: 1}\n"
            "parallel: {dp: 4, tp: 1, pp: 1}\n")


@pytest.fixture
def star4(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)     # files shown by their path from the working folder
    (tmp_path / "star4.yaml").write_text(STAR4, encoding="utf-8")
    (tmp_path / "model.yaml").write_text((REPO / "tests/bad_inputs/good/model.yaml").read_text(encoding="utf-8"),
                                         encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    return str(path)


def test_search_lays_out_the_explicit_topologys_four_devices(star4):
    """Rule: four devices listed -> every layout has tp x pp x dp = 4, and TP takes each divisor of 4 (an explicit
    topology's links price a TP group across its nodes; the scenario rules set no domain), so a layout is found."""
    result = search(load_scenario(star4), workers=1, progress=False)
    assert result.gpus == 4
    assert all(r["tp"] * r["pp"] * r["dp"] == 4 for r in result.rows)
    assert {r["tp"] for r in result.rows} == {1, 2, 4}
    assert result.top and result.counts["simulated"] >= 1
    assert not any("does not equal" in (r.get("error") or "") for r in result.rows)


def test_cli_search_on_an_explicit_topology_accepts_its_own_gpu_count(star4, capsys):
    """`--gpus 4` names the topology's own size: the same search as without it (4 GPUs)."""
    code, out, err = run_cli(["search", star4, "--workers", "1", "--gpus", "4", "--no-progress"], capsys)
    assert code == 0, err
    assert "layouts of 4 GPUs:" in out and "no layout fits" not in out


def test_cli_gpus_other_than_the_explicit_topologys_is_refused_naming_the_value(star4, capsys):
    """Rule: bad option values exit 2 with one sentence naming the value, the file and what is allowed."""
    code, out, err = run_cli(["search", star4, "--workers", "1", "--gpus", "8"], capsys)
    assert (code, out, err) == (2, "", "error: --gpus 8 cannot resize the explicit topology of star4.yaml: it lists "
                                       "4 GPUs (allowed: 4)\n")
    with pytest.raises(InputError) as refused:
        search(load_scenario(star4), gpus=8, workers=1, progress=False)
    assert (refused.value.field, refused.value.message) == (
        "gpus", "gpus=8 cannot resize the explicit topology of star4.yaml: it lists 4 GPUs (allowed: 4)")


def test_a_layout_of_the_wrong_size_names_the_explicit_files_devices(star4, capsys):
    """dp 8 on four listed devices: the refusal counts the file's devices (it said 'the 4 GPUs of the cluster
    (1 node x 8 GPUs)', the template's default node, on an explicit file)."""
    code, _, err = run_cli(["run", star4, "--set", "parallel.dp=8"], capsys)
    assert code == 2
    assert "dp x tp x pp = 8 x 1 x 1 = 8 does not equal the 4 devices of star4.yaml" in err, err


def test_dp_auto_on_an_explicit_topology_fills_its_devices(star4, capsys):
    """dp: auto is the devices / (tp x pp): 4 on star4's four devices (it took the template default's node of 8,
    and then refused the dp 8 nobody wrote)."""
    code, out, err = run_cli(["run", star4, "--set", "parallel.dp=auto"], capsys)
    assert code == 0, err
    assert "dp=4 tp=1 pp=1" in out
