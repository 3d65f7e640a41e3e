"""Rule: nanotron's eager layer was never measured faster than 4.31 ms per layer and micro-batch (the Ultra-Scale
Playbook's one-node runs), so `run` warns of a host-bound step when its simulated nanotron layer is faster than that;
the warning changes no time (plan/layer_kernels.py, docs/validation.md "nanotron")."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_scenario

from simtrain import simulate
from simtrain.plan.layer_kernels import NANOTRON_HOST_FLOOR_S, host_floor_warning

DGX_H100 = Path(__file__).resolve().parents[1] / "hardware" / "dgx-h100.yaml"
PLAYBOOK_1B = {"name": "ultrascale-1b", "layers": 16, "hidden": 2048, "heads": 32, "ffn_hidden": 8192,
               "vocab": 131072, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": True}


def _nanotron(micro_batch=1, global_batch=32, kernels="nanotron", tp=8):
    training = {"seq_len": 4096, "global_batch": global_batch, "micro_batch": micro_batch, "precision": "bf16",
                "recompute": "none", "flash_attention": "flash2", "dropout": False, "grad_dtype": "fp32",
                "grad_accumulation": "unfused", "cross_entropy": "vocab_parallel", "layer_kernels": kernels}
    parallel = {"dp": 8 // tp, "tp": tp, "pp": 1, "sequence_parallel": tp > 1, "tp_async_linears": tp > 1}
    return make_scenario(hardware=DGX_H100, model=PLAYBOOK_1B, training=training, parallel=parallel)


def test_the_floor_is_the_playbooks_fastest_measured_layer():
    # 3B (28 layers) at DP 2 TP 4 ZeRO-0, one node: 8,488 tok/s/GPU, GBS 256 of 4096 tokens, 128 micro-batches
    step = 256 * 4096 / (8 * 8488)
    assert step / (128 * 28) == pytest.approx(NANOTRON_HOST_FLOOR_S, abs=0.005e-3)


def test_a_one_sequence_tp8_layer_warns_with_its_own_time():
    sc = _nanotron()
    r = simulate(sc)
    floor = [w for w in r.warnings if w.startswith("host-bound risk")]
    assert len(floor) == 1
    # PP 1: nothing idles, so the stage's time per layer and micro-batch is the step's
    per_layer = r.step_time_s / (sc.microbatches * 16)
    assert per_layer < NANOTRON_HOST_FLOOR_S
    assert f"stage 0 runs {per_layer * 1e3:.2f} ms" in floor[0]


def test_sixteen_sequences_per_micro_batch_are_above_the_floor():
    r = simulate(_nanotron(micro_batch=16, global_batch=32))
    assert not any(w.startswith("host-bound risk") for w in r.warnings)


def test_other_layer_implementations_get_no_such_warning():
    r = simulate(_nanotron(kernels="fused"))
    assert not any(w.startswith("host-bound risk") for w in r.warnings)


def test_a_stage_without_layers_is_left_out():
    # nanotron's own split of the 1B model at PP 4 leaves the last stage the LM head alone (6, 5, 5, 0); the
    # stages with layers run 4-7 ms per layer and micro-batch at one sequence (simtrain), above the floor
    sc = _nanotron(tp=1)
    raw = {**sc.raw, "parallel": {"dp": 2, "tp": 1, "pp": 4, "layers_per_stage": [6, 5, 5, 0]}}
    from simtrain.spec.scenario import scenario_from_dict
    r = simulate(scenario_from_dict(raw, file="test.yaml", base_dir=DGX_H100.parent))
    assert r.stages[3].layers == 0
    assert not any(w.startswith("host-bound risk") for w in r.warnings)


@pytest.mark.parametrize(("stages", "expected"), [
    ([(0, 5.0e-3), (1, 3.0e-3), (2, 3.0e-3)], "stage 1 runs 3.00 ms"),   # the fastest, the first of a tie
    ([(0, NANOTRON_HOST_FLOOR_S)], None),                                # at the floor: not below it
    ([], None),                                                          # no stage holds layers
])
def test_the_fastest_stage_is_named(stages, expected):
    w = host_floor_warning("nanotron", stages)
    assert (w is None) if expected is None else (expected in w)


def test_only_nanotron_has_a_measured_floor():
    assert host_floor_warning("torchtitan", [(0, 1e-3)]) is None
    assert host_floor_warning("fused", [(0, 1e-3)]) is None
