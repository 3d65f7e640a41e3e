"""search's fix= / --fix: every value is read as the scenario schema reads its key (the same closed lists and ranges
as a scenario file), so a misspelt value is refused by name instead of silently matching no layout; and the
refusals that name --fix name it once."""

from __future__ import annotations

import pytest
from conftest import DATA, make_scenario, run_cli

from simtrain.decide.search import enumerate_layouts
from simtrain.decide.search_space import _screening_time
from simtrain.spec.errors import InputError

TWO_NODES = DATA / "core_two_nodes.yaml"
SCENARIO = (f"hardware: {TWO_NODES}\nnodes: 1\ngpus_per_node: 4\n"
            "model: {layers: 4, hidden: 1024, heads: 16, ffn_hidden: 4096, vocab: 32000, mlp: gelu}\n"
            "training: {seq_len: 512, global_batch: 4}\nparallel: {dp: 4}\n")


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    return str(path)


@pytest.mark.parametrize("fix, message", [
    # the scenario schema's lists (simtrain/spec/scenario_schema.py): ZeRO stages 0-3; the four recompute modes;
    # the seven schedules
    ("parallel.zero=7", "--fix parallel.zero: 7 is not allowed (allowed: 0, 1, 2 or 3)"),
    ("parallel.zero=1,7", "--fix parallel.zero: 7 is not allowed (allowed: 0, 1, 2 or 3)"),   # not dropped quietly
    ("training.recompute=ful", "--fix training.recompute: 'ful' is not allowed (did you mean 'full'?) (allowed: "
                               "'none', 'selective', 'selective_op' or 'full')"),
    ("parallel.schedule=1F1B", "--fix parallel.schedule: '1F1B' is not allowed (did you mean '1f1b'?) (allowed: "
                               "'gpipe', '1f1b', 'interleaved-1f1b', 'zb-h1', 'zb-v', 'dualpipe' or 'dualpipev')"),
    ("parallel.sequence_parallel=maybe", "--fix parallel.sequence_parallel: 'maybe' is not true or false"),
    ("parallel.tp=0", "--fix parallel.tp: 0 must be greater than 0"),
])
def test_cli_fix_value_outside_the_schema_is_refused_by_name(small_file, capsys, fix, message):
    """Rule: bad option values exit 2 with one sentence naming the option, the key, the value and what is allowed."""
    code, stdout, err = run_cli(["search", small_file, "--fix", fix, "--workers", "1"], capsys)
    assert (code, stdout, err) == (2, "", f"error: {message}\n")


def test_fix_values_are_read_as_the_schema_reads_them():
    """Python API: fix={'parallel.zero': [1, 7]} is refused at 7 (field 'fix'); text where the schema takes a
    number ('2' for tp 2) is refused as the schema refuses it in a file (it was read as 2, as pydantic's lax mode
    read it); a float the schema reads as a whole number (2.0) narrows the search as 2 does."""
    sc = make_scenario(hardware=TWO_NODES, nodes=1, gpus_per_node=4, training={"global_batch": 4},
                       parallel={"dp": 4})
    with pytest.raises(InputError) as err:
        enumerate_layouts(sc, fix={"parallel.zero": [1, 7]})
    assert err.value.field == "fix"
    assert str(err.value) == "fix: parallel.zero: 7 is not allowed (allowed: 0, 1, 2 or 3)"
    with pytest.raises(InputError) as err:
        enumerate_layouts(sc, fix={"parallel.tp": "2"})
    assert str(err.value) == "fix: parallel.tp: '2' is text, not a whole number (write the number without quotes)"
    as_float = enumerate_layouts(sc, fix={"parallel.tp": 2.0})
    assert as_float and as_float == enumerate_layouts(sc, fix={"parallel.tp": 2})
    assert {x["tp"] for x in as_float} == {2}


def test_cli_no_layout_with_the_fixed_values_names_the_option_once(small_file, capsys):
    """pp 3 cannot divide 4 GPUs: the refusal gives the option and its values once, then the reason."""
    code, _, err = run_cli(["search", small_file, "--fix", "parallel.pp=3", "--workers", "1"], capsys)
    assert code == 2
    assert err == ("error: --fix parallel.pp=3: no layout of 4 GPUs with these values divides the model and the "
                   "global batch of 4\n")


def test_max_layouts_refusal_gives_the_screening_time_in_a_readable_unit(small_file, capsys):
    """4.5 ms of screening per layout (search_space.MAX_LAYOUTS): 10 layouts = 45 ms (not 'about 0 s'); the default
    200,000 = 900 s = 15 min; 100 = 450 ms; 1,000 = 4.5 s (shown '4 s' or '5 s', whole seconds)."""
    code, _, err = run_cli(["search", small_file, "--max-layouts", "10", "--workers", "1"], capsys)
    assert code == 2
    assert "(about 45 ms of one core before any simulation)" in err
    assert "narrow it (--fix)," in err
    assert _screening_time(200_000) == "15 min"
    assert _screening_time(100) == "450 ms"
    assert _screening_time(1_000) in ("4 s", "5 s")


def test_a_value_fixed_twice_is_refused_as_a_grid_refuses_it(small_file, capsys):
    """--fix parallel.tp=1,1: refused, as --grid training.micro_batch=1,1 is (a repeated value is most likely a typo
    for another); the audit found it searched silently."""
    code, _, err = run_cli(["search", small_file, "--fix", "parallel.tp=1,1", "--workers", "1"], capsys)
    assert code == 2
    assert err == "error: --fix parallel.tp: lists 1 twice; give each value once\n"
