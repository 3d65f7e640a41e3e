"""--grid (and --fix) values: split at top-level commas only, so a value may be a YAML list or mapping or a quoted
string with commas; each value read as --set reads it (YAML); an empty value or an unbalanced bracket or quote is
refused naming the option, before any point runs."""

from __future__ import annotations

import pytest
from conftest import make_scenario, run_cli, scenario_dict

import simtrain
from simtrain.cli.commands_decide import parse_grid
from simtrain.decide.sweep_files import read_table
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import parse_set


@pytest.mark.parametrize("item, values", [
    ("parallel.pp=2,4,8", [2, 4, 8]),
    ("training.recompute_modules=[core_attn],[core_attn,mlp]", [["core_attn"], ["core_attn", "mlp"]]),
    ("parallel.layers_per_stage=[10,10,10,10],auto", [[10, 10, 10, 10], "auto"]),
    ("parallel.layers_per_stage=[10, 10, 10, 10] , auto", [[10, 10, 10, 10], "auto"]),
    ("x.y={a: 1, b: [2, 3]},4", [{"a": 1, "b": [2, 3]}, 4]),
    ("x.y=\"a,b\",c", ["a,b", "c"]),
    ("x.y='it''s, ok',don't", ["it's, ok", "don't"]),
    ("x.y=\"\",1", ["", 1]),
    ("parallel.sequence_parallel=true,false", [True, False]),
])
def test_grid_values_split_at_top_level_commas(item, values):
    """The point lists, written by hand: commas inside [], {} and quotes stay in their value."""
    key = item.split("=", 1)[0]
    assert parse_grid((item,)) == {key: values}


def test_each_value_reads_as_set_reads_it():
    """Rule: --grid K=V1,V2 gives the values --set K=V1 and --set K=V2 give."""
    parts = ["[core_attn, mlp]", "auto", "8", "true", "{a: 1}", "1F1B", "0.5"]
    grid = parse_grid(("k.v=" + ",".join(parts),))["k.v"]
    assert grid == [parse_set([f"k.v={p}"])["k.v"] for p in parts]
    assert grid == [["core_attn", "mlp"], "auto", 8, True, {"a": 1}, "1F1B", 0.5]


@pytest.mark.parametrize("item, says", [
    ("training.micro_batch=1,,2", "--grid 'training.micro_batch=1,,2': value 2 of 3 is empty; give V1,V2,... "
                                  "without empty values (quote an empty string: \"\")"),
    ("training.micro_batch=1,2,", "--grid 'training.micro_batch=1,2,': value 3 of 3 is empty"),
    ("training.recompute_modules=[core_attn,mlp", "--grid 'training.recompute_modules=[core_attn,mlp': a '[' is "
                                                  "not closed"),
    ("training.recompute_modules=core_attn]", "--grid 'training.recompute_modules=core_attn]': ']' at character 10 "
                                              "closes no '['"),
    ("x.y=\"a,b", "--grid 'x.y=\"a,b': the quote \" is not closed"),
])
def test_malformed_grid_values_are_refused(item, says):
    with pytest.raises(InputError) as err:
        parse_grid((item,))
    assert str(err.value).startswith(says)


def test_cli_empty_grid_value_exits_2_before_any_point(tmp_path, capsys, monkeypatch):
    """Rule: a bad option value is exit 2 with one sentence naming the option, and no point runs (no table)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("hardware: dgx-h100\nmodel: llama2-7b\n"
                                     "training: {seq_len: 512, global_batch: 8}\n")
    code, stdout, err = run_cli(["sweep", "s.yaml", "--grid", "training.micro_batch=1,,2", "--out", "g.csv"], capsys)
    assert (code, stdout) == (2, "")
    assert err.startswith("error: --grid 'training.micro_batch=1,,2': value 2 of 3 is empty") and err.count("\n") == 1
    assert not (tmp_path / "g.csv").exists()


def test_cli_list_values_run_the_points_the_python_api_runs(tmp_path, capsys):
    """--grid 'training.recompute_modules=[core_attn],[core_attn,mlp]' runs 2 points (it ran 3, two of them with
    '[core_attn' and 'mlp]'), the same rows as simtrain.sweep(sc, {key: [[...], [...]]})."""
    import yaml

    fields = dict(parallel={"pp": 2}, training={"global_batch": 4, "recompute": "selective"})
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario_dict(**fields)))
    out = tmp_path / "g.csv"
    code, stdout, err = run_cli(["sweep", str(path), "--grid", "training.recompute_modules=[core_attn],[core_attn,mlp]",
                                 "--out", str(out), "--workers", "1"], capsys)
    assert code == 0, err
    assert "2 points: 2 simulated, 0 invalid or failed" in stdout
    table = read_table(out)
    api = simtrain.sweep(make_scenario(**fields), {"training.recompute_modules": [["core_attn"], ["core_attn", "mlp"]]},
                         workers=1, progress=False)
    assert len(table) == len(api) == 2
    assert table["step_time_s"].tolist() == pytest.approx(api["step_time_s"].tolist(), rel=1e-12)
    assert api["error"].isna().all()
