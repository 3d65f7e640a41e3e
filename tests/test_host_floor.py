"""Rule: nanotron's one-node PP-1 runs with one sequence per micro-batch were never measured below 4.30 ms per layer
and micro-batch (step / (micro-batches x layers), the Ultra-Scale Playbook), so `run` warns of a host-bound step when
a PP-1 nanotron step is simulated below that; the warning changes no time (plan/layer_kernels.py,
docs/validation.md "nanotron")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import make_scenario

import simtrain.engine.simulation as simulation
from simtrain import simulate
from simtrain.plan.layer_kernels import NANOTRON_HOST_FLOOR_S, host_floor_warning

PLAYBOOK = Path(__file__).resolve().parents[1] / "simtrain" / "validation" / "ultrascale_playbook.yaml"

DGX_H100 = Path(__file__).resolve().parents[1] / "hardware" / "dgx-h100.yaml"
PLAYBOOK_1B = {"name": "ultrascale-1b", "layers": 16, "hidden": 2048, "heads": 32, "ffn_hidden": 8192,
               "vocab": 131072, "mlp": "swiglu", "norm": "rmsnorm", "tied_embeddings": True}


def _nanotron(micro_batch=1, global_batch=32, kernels="nanotron", tp=8):
    training = {"seq_len": 4096, "global_batch": global_batch, "micro_batch": micro_batch, "precision": "bf16",
                "recompute": "none", "flash_attention": "flash2", "dropout": False, "grad_dtype": "fp32",
                "grad_accumulation": "unfused", "cross_entropy": "vocab_parallel", "layer_kernels": kernels}
    parallel = {"dp": 8 // tp, "tp": tp, "pp": 1, "sequence_parallel": tp > 1, "tp_async_linears": tp > 1}
    return make_scenario(hardware=DGX_H100, model=PLAYBOOK_1B, training=training, parallel=parallel)


def test_the_floor_is_the_least_of_the_playbooks_one_node_pp1_one_sequence_runs():
    # every bundled one-node PP-1 TP>1 run with one sequence per micro-batch: its published tok/s/GPU as a step,
    # per micro-batch and layer
    per_layer = []
    for case in yaml.safe_load(PLAYBOOK.read_text(encoding="utf-8")):
        sc = case["scenario"]
        par, tr = sc["parallel"], sc["training"]
        if sc["nodes"] != 1 or par["pp"] != 1 or par["tp"] == 1 or tr["micro_batch"] != 1:
            continue
        step = tr["global_batch"] * tr["seq_len"] / (8 * case["measured"]["tokens_per_s_per_gpu"])
        per_layer.append(step / (tr["global_batch"] // par["dp"] * sc["model"]["layers"]))
    assert len(per_layer) == 14   # TP 2, 4 and 8; 1B, 3B and 8B; ZeRO-0 and ZeRO-1
    # the least is the 3B at DP 2 TP 4 ZeRO-0: 256 x 4096 / (8 x 8,488) s over 128 x 28, 4.309 ms; rounded down
    assert min(per_layer) == pytest.approx(256 * 4096 / (8 * 8488) / (128 * 28))
    assert min(per_layer) - 0.01e-3 < NANOTRON_HOST_FLOOR_S <= min(per_layer)


def test_a_one_sequence_tp8_layer_warns_with_its_own_time():
    sc = _nanotron()
    r = simulate(sc)
    floor = [w for w in r.warnings if w.startswith("host-bound risk")]
    assert len(floor) == 1
    per_layer = r.step_time_s / (sc.microbatches * 16)   # as the floor was measured
    assert per_layer < NANOTRON_HOST_FLOOR_S
    assert f"host-bound risk: {per_layer * 1e3:.2f} ms per layer and micro-batch" in floor[0]


def test_the_warning_changes_no_time(monkeypatch):
    sc = _nanotron()
    warned = simulate(sc)
    monkeypatch.setattr(simulation, "host_floor_warning", lambda *args: None)
    silent = simulate(sc)
    assert any(w.startswith("host-bound risk") for w in warned.warnings)
    assert not any(w.startswith("host-bound risk") for w in silent.warnings)
    assert (warned.step_time_s, warned.tokens_per_s, warned.peak_memory_bytes_max) == \
        (silent.step_time_s, silent.tokens_per_s, silent.peak_memory_bytes_max)


def test_sixteen_sequences_per_micro_batch_are_above_the_floor():
    r = simulate(_nanotron(micro_batch=16, global_batch=32))
    assert not any(w.startswith("host-bound risk") for w in r.warnings)


def test_other_layer_implementations_get_no_such_warning():
    r = simulate(_nanotron(kernels="fused"))
    assert not any(w.startswith("host-bound risk") for w in r.warnings)


def test_pipelined_steps_get_no_warning():
    # the floor is measured at PP 1; the same source's PP 2-4 runs bound a stage's layers below it (1B: 3.6-4.0 ms),
    # so a pipelined step at one sequence per micro-batch, here 1B TP 2 PP 4 with nanotron's split, is not warned
    sc = _nanotron(tp=2)
    raw = {**sc.raw, "parallel": {"dp": 1, "tp": 2, "pp": 4, "sequence_parallel": True, "tp_async_linears": True,
                                  "layers_per_stage": [6, 5, 5, 0]}}
    from simtrain.spec.scenario import scenario_from_dict
    r = simulate(scenario_from_dict(raw, file="test.yaml", base_dir=DGX_H100.parent))
    assert r.step_time_s / (sc.microbatches * 16) < NANOTRON_HOST_FLOOR_S   # it would be under the PP-1 floor
    assert not any(w.startswith("host-bound risk") for w in r.warnings)


@pytest.mark.parametrize(("impl", "pp", "per_layer", "warned"), [
    ("nanotron", 1, 3.0e-3, True),
    ("nanotron", 1, NANOTRON_HOST_FLOOR_S, False),   # at the floor: not below it
    ("nanotron", 2, 3.0e-3, False),
    ("torchtitan", 1, 1.0e-3, False),
    ("fused", 1, 1.0e-3, False),
])
def test_only_pp1_nanotron_below_the_floor_warns(impl, pp, per_layer, warned):
    assert (host_floor_warning(impl, pp, per_layer) is not None) is warned
