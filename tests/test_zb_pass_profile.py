"""simtrain's per-pass times of one pipeline stage against the only published in-training per-pass profile on A100
found (docs/validation.md, "What the A100 misses are made of"): Qi et al. 2024 (Zero Bubble Pipeline Parallelism,
arXiv:2401.10241v1) Table 9, the profiled forward (T_F), input-gradient backward (T_B) and weight-gradient backward
(T_W) of one stage, in ms, at m = 24 (the same values as ``iclr_bubble_rates`` in sail-sg/zero-bubble-pipeline-
parallelism megatron/core/pipeline_parallel/efficiency.py @f68d3879, in us). There a stage is (layers + 2) / p
layer slots (the file's ``l // p``): 3 transformer layers of the 1.5B model, 4 of the 6.2B on a middle stage.

What the table says about simtrain: the weight-gradient GEMMs (the W pass is those alone) and the backward agree,
the forward is short. The last test pins that miss's size, so that a change which closes it, or widens it, is seen.
"""

from __future__ import annotations

import pytest

from simtrain.decide.cases import load_cases
from simtrain.plan.build import build_plan
from simtrain.spec.scenario import scenario_from_dict

CASES, BASE = load_cases("zero_bubble")
BY_ID = {c["id"]: c for c in CASES}

#: Qi et al. 2024 Table 9, m = 24 rows: (T_F, T_B, T_W) in seconds for one middle stage
TABLE_9 = {"1.5b": (18.522e-3, 18.086e-3, 9.337e-3), "6.2b": (29.718e-3, 29.444e-3, 19.927e-3)}


def _passes(model: str) -> tuple[float, float, float, int]:
    """(F, B, W, layers) of a middle stage of the 1F1B case at m = 24 as simtrain plans it."""
    case = BY_ID[f"zb_{model}_p8_m24_1f1b"]
    plan = build_plan(scenario_from_dict(case["scenario"], base_dir=BASE, units=False))
    ch = plan.chunks[3]
    assert not ch.has_embedding and not ch.has_head
    w = ch.layers * ch.wgrad_layer
    return ch.layers * (ch.fwd_layer + ch.tp_fwd_layer), ch.layers * ch.bwd_layer - w, w, ch.layers


@pytest.mark.parametrize("model,layers", [("1.5b", 3), ("6.2b", 4)])
def test_a_middle_stage_holds_the_tables_layer_slots(model, layers):
    """A middle stage of the 1.5B (22 layers) and 6.2B (30 layers) runs on 8 stages holds (L + 2) / 8 layers."""
    assert _passes(model)[3] == layers


@pytest.mark.parametrize("model", ["1.5b", "6.2b"])
def test_weight_gradient_pass_within_ten_percent_of_table_9(model):
    """The W pass (the weight-gradient GEMMs alone) is within 10% of the profiled T_W: the A100 GEMM curve holds in
    a real fp16 training run (1.5B: 9.337 ms for 3 x 7.83e11 FLOP = 252 TFLOP/s)."""
    _f, _b, w, _n = _passes(model)
    assert w == pytest.approx(TABLE_9[model][2], rel=0.10)


@pytest.mark.parametrize("model", ["1.5b", "6.2b"])
def test_input_gradient_pass_within_ten_percent_of_table_9(model):
    """The B pass (backward without the weight-gradient GEMMs) is within 10% of the profiled T_B."""
    _f, b, _w, _n = _passes(model)
    assert b == pytest.approx(TABLE_9[model][1], rel=0.10)


@pytest.mark.parametrize("model,low,high", [("1.5b", 0.75, 0.85), ("6.2b", 0.80, 0.90)])
def test_forward_pass_is_short_of_table_9(model, low, high):
    """The forward is the pass simtrain misses: 0.812 (1.5B) and 0.860 (6.2B) of the profiled T_F today (with unfused
    attention at its measured A100 rate; 0.806 and 0.856 at the streaming rate)."""
    f, _b, _w, _n = _passes(model)
    assert low < f / TABLE_9[model][0] < high
