"""Scenario files: derived micro-batches, one test per error message, warnings (issue 2, deliverable 5).

Every bad file must raise one located sentence ``file:line: field: problem`` and make
the CLI exit with status 2 and that one line, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import IDEAL_HW, make_scenario, run_cli

from simtrain.spec.errors import InputError
from simtrain.spec.scenario import load_scenario

BASE = f"""\
name: bad
hardware: {IDEAL_HW}
nodes: 1
gpus_per_node: 8
model: llama2-7b
training:
  seq_len: 1024
  global_batch: 16
  micro_batch: 1
parallel:
  dp: 2
  tp: 2
  pp: 2
  schedule: 1f1b
"""

TINY_GQA = "model: {layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn_hidden: 1024, vocab: 100}"


def _write(tmp_path: Path, replacements: list[tuple[str, str]]) -> Path:
    text = BASE
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "scenario.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _line(path: Path, startswith: str) -> int:
    return next(i for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip().startswith(startswith))


def _case(case, replacements, field, key, message):
    """One bad file: text replacements on BASE, the field and the key whose line is reported, the message."""
    return pytest.param(replacements, field, key, message, id=case)


ERRORS = [
    _case("gpus", [("dp: 2", "dp: 4")], "parallel", "parallel:",
          "dp x tp x pp = 4 x 2 x 2 = 16 does not equal the 8 GPUs"),
    _case("heads_tp", [("gpus_per_node: 8", "gpus_per_node: 6"), ("dp: 2", "dp: 1"), ("tp: 2", "tp: 3")],
          "parallel.tp", "tp:", "3 does not divide heads=32"),
    _case("kv_heads_tp", [("gpus_per_node: 8", "gpus_per_node: 4"), ("model: llama2-7b", TINY_GQA),
                          ("dp: 2", "dp: 1"), ("tp: 2", "tp: 4"), ("pp: 2", "pp: 1")],
          "parallel.tp", "tp:", "4 does not divide kv_heads=2"),
    _case("layers_pp", [("gpus_per_node: 8", "gpus_per_node: 6"), ("dp: 2", "dp: 1"), ("pp: 2", "pp: 3")],
          "parallel.pp", "pp:", "layers=32 is not divisible by pp x vpp = 3"),
    _case("layers_vpp", [("pp: 2", "pp: 2\n  vpp: 3"), ("schedule: 1f1b", "schedule: interleaved-1f1b")],
          "parallel.pp", "pp:", "layers=32 is not divisible by pp x vpp = 6"),
    _case("lps_length", [("schedule: 1f1b", "schedule: 1f1b\n  layers_per_stage: [10, 11, 11]")],
          "parallel.layers_per_stage", "layers_per_stage:", "has 3 entries but pp x vpp = 2 stages need one each"),
    _case("lps_sum", [("schedule: 1f1b", "schedule: 1f1b\n  layers_per_stage: [15, 16]")],
          "parallel.layers_per_stage", "layers_per_stage:", "[15, 16] sums to 31 but the model has 32 layers"),
    _case("global_batch", [("global_batch: 16", "global_batch: 15")], "training.global_batch", "global_batch:",
          "15 is not divisible by micro_batch x dp = 1 x 2 = 2"),
    _case("interleaved_mb", [("global_batch: 16", "global_batch: 6"), ("pp: 2", "pp: 2\n  vpp: 2"),
                             ("schedule: 1f1b", "schedule: interleaved-1f1b")],
          "parallel.schedule", "schedule:",
          "interleaved-1f1b needs the micro-batch count (3) to be a multiple of pp=2"),
    _case("unknown_key", [("tp: 2", "tpp: 2")], "parallel.tpp", "tpp:", "unknown key (did you mean 'tp'?)"),
    _case("unknown_section", [("training:", "trainig:")], "trainig", "trainig:",
          "unknown key (did you mean 'training'?)"),
    _case("unknown_preset", [("model: llama2-7b", "model: llama2-7")], "model", "model:",
          "unknown model preset 'llama2-7' (did you mean 'llama2-7b'?)"),
    _case("missing_hardware", [(f"hardware: {IDEAL_HW}", "hardware: nothere.yaml")], "hardware", "hardware:",
          "hardware file 'nothere.yaml' does not exist"),
]


@pytest.mark.parametrize(("replacements", "field", "key", "message"), ERRORS)
def test_bad_scenario_raises_one_located_sentence(tmp_path, replacements, field, key, message):
    """Each rule that ties the sections together fails as 'file:line: field: message'."""
    path = _write(tmp_path, replacements)
    with pytest.raises(InputError) as exc:
        load_scenario(path)
    text = str(exc.value)
    assert text.startswith(f"{path}:{_line(path, key)}: {field}: "), text
    assert message in text


@pytest.mark.parametrize(("replacements", "field", "key", "message"), ERRORS)
def test_cli_exits_2_with_one_line(tmp_path, capsys, replacements, field, key, message):
    """Bad input makes the CLI exit 2 with exactly one located line on stderr and no traceback."""
    path = _write(tmp_path, replacements)
    code, out, err = run_cli(["memory", str(path)], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"error: {path}:{_line(path, key)}: {field}: "), lines[0]
    assert message in lines[0]


def test_valid_base_loads(tmp_path):
    """The unmodified base scenario of these tests is valid (so each error comes from its one change)."""
    s = load_scenario(_write(tmp_path, []))
    assert s.gpus == 8 and s.warnings == ()


def test_microbatches_follow_the_reference_rule():
    """Reference article rule 12: global 512, DP=8, PP=4, TP=2 on 64 GPUs, micro-batch 4 -> 16 accumulation steps."""
    s = make_scenario(nodes=8, model="llama2-13b", training={"seq_len": 4096, "global_batch": 512, "micro_batch": 4},
                      parallel={"dp": 8, "tp": 2, "pp": 4})
    assert s.gpus == 64
    assert s.microbatches == 512 // (4 * 8) == 16


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (1, 4), (2, 4)])
def test_tp_and_pp_do_not_multiply_data(tp, pp):
    """Micro-batches = global / (micro x dp), whatever TP and PP are (reference article rule 12)."""
    s = make_scenario(model="llama2-13b", training={"seq_len": 1024, "global_batch": 64, "micro_batch": 2},
                      parallel={"dp": 2, "tp": tp, "pp": pp})
    assert s.microbatches == 16


def test_warning_when_tp_spans_nodes():
    """A TP group larger than a node is a warning, not an error (reference article rule 9)."""
    s = make_scenario(nodes=2, gpus_per_node=4, model="llama2-7b", training={"seq_len": 1024, "global_batch": 8},
                      parallel={"tp": 8})
    assert any("TP group of 8 spans nodes" in w for w in s.warnings), s.warnings


def test_warning_when_fewer_microbatches_than_stages():
    """Fewer micro-batches than pipeline stages is a warning (reference article rule 13)."""
    s = make_scenario(model="llama2-7b", training={"seq_len": 1024, "global_batch": 2}, parallel={"pp": 4})
    assert any("2 micro-batches for 4 pipeline stages" in w for w in s.warnings), s.warnings


@pytest.mark.parametrize("key, value, zero, says", [
    ("zero_impl", "fsdp1", 1, "parallel.zero_impl: fsdp1 has no effect with zero 1"),
    ("backward_prefetch", "post", 2, "parallel.backward_prefetch: post has no effect with zero 2"),
])
def test_warning_when_a_zero_setting_has_no_effect(key, value, zero, says):
    """A ZeRO-2/3-only setting on a layout that does not use it is a warning: the user asked for something the
    simulation cannot show."""
    s = make_scenario(model="llama2-7b", training={"seq_len": 1024, "global_batch": 16},
                      parallel={"dp": 2, "zero": zero, key: value})
    assert any(says in w for w in s.warnings), s.warnings
    quiet = make_scenario(model="llama2-7b", training={"seq_len": 1024, "global_batch": 16},
                          parallel={"dp": 2, "zero": 3, key: value})
    assert quiet.warnings == ()


def test_no_warning_for_a_good_layout():
    """TP inside a node with enough micro-batches gives no warning."""
    s = make_scenario(model="llama2-7b", training={"seq_len": 1024, "global_batch": 16},
                      parallel={"tp": 2, "pp": 4})
    assert s.warnings == ()


def test_cli_prints_warnings_and_exits_0(tmp_path, capsys):
    """A warning is printed by the CLI, which still exits 0."""
    path = _write(tmp_path, [("global_batch: 16", "global_batch: 1"), ("dp: 2", "dp: 1"),
                             ("gpus_per_node: 8", "gpus_per_node: 4")])
    code, out, err = run_cli(["memory", str(path)], capsys)
    assert code == 0
    assert "warning: 1 micro-batches for 2 pipeline stages" in out + err


def test_set_override_is_validated_like_the_file(tmp_path, capsys):
    """--set values go through the same rules: a bad override exits 2 with one line naming file and field."""
    path = _write(tmp_path, [])
    code, out, err = run_cli(["memory", str(path), "--set", "training.global_batch=15"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"error: {path}" in err
    assert "training.global_batch: 15 is not divisible by micro_batch x dp = 1 x 2 = 2" in err


def test_bundled_article_layout_has_16_accumulation_steps(repo):
    """The bundled 64-GPU DP=8 x PP=4 x TP=2 scenario (reference article rule 12) runs 16 micro-batches of 4."""
    path = repo / "scenarios" / "dp8_pp4_tp2.yaml"
    if not path.exists():
        pytest.skip("scenarios/dp8_pp4_tp2.yaml not written yet")
    s = load_scenario(path)
    assert (s.gpus, s.parallel.dp, s.parallel.pp, s.parallel.tp) == (64, 8, 4, 2)
    assert (s.training.global_batch, s.training.micro_batch, s.microbatches) == (512, 4, 16)


#: flash1_triton's forward over backward rate, xformers#479's five rows (test_attention_passes.py): 1.95505
TRITON_K = (25831.9 / (2.5 * 5167.6) + 25811.2 / (2.5 * 5335.3) + 51084.6 / (2.5 * 10226.7)
            + 51265.2 / (2.5 * 10540.9) + 91356.3 / (2.5 * 19262.0)) / 5


@pytest.mark.parametrize("kernel, speed", [("flash1", 0.42), ("flash3", 1.66),
                                           ("flash1_triton", 0.42 * (1 + 2.5 * TRITON_K) / 3.5)])
def test_flash_kernel_choice_changes_only_the_attention_time(repo, kernel, speed):
    """training.flash_attention names the kernel; its speed relative to FlashAttention-2 comes from the
    hardware file (dgx-h100: flash1 0.42 = 137/328, FlashAttention-1 over -2 at 16k tokens in the flash-attn README's
    H100 figure, flash3 1.66 from Shah et al. 2024's forward/backward ranges); flash1_triton runs flash1's entry with
    its forward at (1 + 2.5 k) / 3.5 = 1.682179 of that rate (k = 1.95505, test_attention_passes.py). Hand calculation
    of the forward attention time, llama2-13b (h = 5120), s = 4096, b = 1, causal: 4 b s^2 h / 2 FLOP at 989.5 TFLOP/s
    x 0.32 x s / (s + 600) for FlashAttention-2."""
    from simtrain.plan.build import build_plan

    path = repo / "scenarios" / "pp4_dp4.yaml"
    base = load_scenario(path)
    other = load_scenario(path, overrides={"training.flash_attention": kernel})
    assert base.training.attention_kernel == "flash2" and other.training.attention_kernel == kernel
    executed = 4 * 4096**2 * 5120 / 2
    fa2 = executed / (989.5e12 * 0.32 * 4096 / (4096 + 600))
    expected_diff = fa2 / speed - fa2
    diff = build_plan(other).chunks[0].fwd_layer - build_plan(base).chunks[0].fwd_layer
    assert diff == pytest.approx(expected_diff, rel=1e-9)


@pytest.mark.parametrize("drop, named", [(("compute",), "no compute section"),
                                         (("memory_overheads",), "no memory_overheads section"),
                                         (("compute", "memory_overheads"), "no compute or memory_overheads section")])
def test_hardware_without_measured_sections_warns(tmp_path, drop, named):
    """A hardware file without `compute` (or `memory_overheads`) silently means datasheet-peak kernels (or no
    framework memory): say so, since every figure is then optimistic; `compute: {}` states it on purpose."""
    data = yaml.safe_load(IDEAL_HW.read_text(encoding="utf-8"))
    for key in drop:
        data.pop(key)
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump(data), encoding="utf-8")
    s = load_scenario(_write(tmp_path, [(f"hardware: {IDEAL_HW}", f"hardware: {hw}")]))
    text = " ".join(s.warnings)
    assert named in text
    # each missing section names its own effect, and only its own
    assert ("datasheet peaks" in text) == ("compute" in drop)
    assert ("no framework overhead" in text) == ("memory_overheads" in drop)


@pytest.mark.parametrize("override, field", [
    ({"parallel.vpp": 3}, "parallel.vpp"),                            # the file says schedule: 1f1b
    ({"parallel.schedule": "interleaved-1f1b"}, "parallel.schedule"),   # the file says vpp: 1
])
def test_a_schedule_rule_blames_the_key_an_override_set(override, field):
    """vpp > 1 needs the interleaved schedule (and the reverse). When --set changed one side only, the error
    names that key and says it came from the override, not the file's line of the other."""
    path = Path(__file__).resolve().parents[1] / "scenarios" / "pp4_dp4.yaml"
    with pytest.raises(InputError) as err:
        load_scenario(path, override)
    assert err.value.field == field and err.value.line is None
    assert "set by an override" in err.value.message
