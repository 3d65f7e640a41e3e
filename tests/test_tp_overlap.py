"""TP communication overlap (parallel.tp_comm_overlap): what stays exposed, by hand from the published description
of Transformer Engine's userbuffers (ring-exchange all-gathers, a 4-chunk pipelined reduce-scatter, bulk overlap)."""

from __future__ import annotations

import pytest

import simtrain
from simtrain.plan.tp_overlap import exposed_tp
from simtrain.spec.scenario import scenario_from_dict


def test_exposed_by_hand_without_slowdown():
    """AG 1 s, RS 1 s, every GEMM 2 s, TP 4: a ring AG hides under 3/4 of its GEMM, a piped RS shows 1/4 of itself."""
    gemms = [(2.0, 2.0, 2.0)] * 4
    fwd, bwd = exposed_tp(1.0, 1.0, gemms, tp=4, slowdown=1.0)
    assert fwd == pytest.approx(0.0 + 0.25 + 0.0 + 0.25)
    assert bwd == pytest.approx(0.0)


def test_hidden_time_slows_the_gemms():
    """The hidden part is charged at (slowdown - 1): forward hides 1 + 0.75 + 1 + 0.75 s, backward 6 x 1 s."""
    gemms = [(2.0, 2.0, 2.0)] * 4
    fwd, bwd = exposed_tp(1.0, 1.0, gemms, tp=4, slowdown=1.2)
    assert fwd == pytest.approx(0.5 + 0.2 * 3.5)
    assert bwd == pytest.approx(0.2 * 6.0)


def test_short_gemms_leave_communication_exposed():
    """A GEMM shorter than its collective hides only part of it: AG 1 s under a 0.4 s GEMM at TP 2 shows 0.8 s."""
    gemms = [(0.4, 0.4, 0.4)] * 4
    fwd, _ = exposed_tp(1.0, 0.0, gemms, tp=2, slowdown=1.0)
    assert fwd == pytest.approx(2 * (1.0 - 0.4 / 2))


def test_overlap_shortens_a_tp8_step():
    """Llama 3 70B at TP 8 with sequence parallelism: overlap cuts the exposed TP time and the step."""
    raw = {"hardware": "dgx-h100", "model": "llama3-70b",
           "training": {"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "recompute": "full", "dropout": False},
           "parallel": {"tp": 8, "sequence_parallel": True, "zero": 1}}
    plain = simtrain.simulate(scenario_from_dict(raw))
    raw["parallel"]["tp_comm_overlap"] = True
    overlapped = simtrain.simulate(scenario_from_dict(raw))
    assert overlapped.exposed_comm_s["tp"] < 0.5 * plain.exposed_comm_s["tp"]
    assert overlapped.step_time_s < plain.step_time_s
