"""Recompute granularity: recompute_layers under full recompute, recompute_modules under selective recompute.

Expected activation bytes are Korthikanti et al. 2022's per-layer terms written out here (16-bit tensors, 1-byte
dropout masks; GELU MLP of width 4h; flash attention, so no score matrix), never read from the code under test.
"""

from __future__ import annotations

import pytest
from conftest import gpt_model, make_scenario

from simtrain.plan.build import build_plan
from simtrain.plan.memory import stage_memory
from simtrain.spec.errors import InputError

S, B, H = 512, 1, 1024
SBH = S * B * H
FULL_LAYER = 34 * SBH          # Korthikanti Sec. 4.1 without the 5as/h term (flash attention), no TP
INPUT_ONLY = 2 * SBH           # full recompute keeps the layer's input (Table 2)


def _sc(**training):
    return make_scenario(model=gpt_model(layers=8), nodes=1, gpus_per_node=2,
                         training={"seq_len": S, "global_batch": 8, **training},
                         parallel={"pp": 2})


def _layers_part(sc) -> float:
    """The per-micro-batch activations of stage 0 less its embedding dropout mask (sbh bytes)."""
    return stage_memory(sc, 0).activation_per_microbatch - SBH


def test_recompute_layers_keeps_inputs_of_n_layers():
    """Block method: of a stage's 4 layers, N keep only their 2sbh input and 4 - N keep all 34sbh."""
    for n in (1, 2, 4):
        sc = _sc(recompute="full", recompute_layers=n)
        assert _layers_part(sc) == pytest.approx(n * INPUT_ONLY + (4 - n) * FULL_LAYER, rel=1e-12)
    assert _layers_part(_sc(recompute="full")) == pytest.approx(4 * INPUT_ONLY, rel=1e-12)


def test_recompute_layers_recomputes_only_n_layers():
    """Only the first N layers of a chunk carry a recomputed forward: the backward time grows by N forwards."""
    none = build_plan(_sc()).chunks[0]
    part = build_plan(_sc(recompute="full", recompute_layers=1)).chunks[0]
    assert part.backward_time - none.backward_time == pytest.approx(none.fwd_layer, rel=1e-9)
    assert [part.layer_costs(i)[2] > 0 for i in range(4)] == [True, False, False, False]


def test_recompute_modules_mlp_drops_its_internals():
    """mlp: the fc1 output and the GELU output, 2 x 2sb(4h) = 16sbh per layer, are dropped."""
    sc = _sc(recompute="selective", recompute_modules=["mlp"])
    assert _layers_part(sc) == pytest.approx(4 * (FULL_LAYER - 16 * SBH), rel=1e-12)


def test_recompute_modules_layernorm_drops_norm_outputs():
    """layernorm: the two norm outputs (the QKV and FC1 inputs), 2 x 2sbh per layer, are dropped."""
    sc = _sc(recompute="selective", recompute_modules=["layernorm"])
    assert _layers_part(sc) == pytest.approx(4 * (FULL_LAYER - 4 * SBH), rel=1e-12)
    both = _sc(recompute="selective", recompute_modules=["mlp", "layernorm", "core_attn"])
    assert _layers_part(both) == pytest.approx(4 * (FULL_LAYER - 20 * SBH), rel=1e-12)


def test_default_modules_are_todays_selective():
    """recompute: selective with no module list is [core_attn]: the same plan as naming it."""
    a = build_plan(_sc(recompute="selective"))
    b = build_plan(_sc(recompute="selective", recompute_modules=["core_attn"]))
    assert a.chunks == b.chunks and a.hardware_flops_per_step == b.hardware_flops_per_step


def test_mlp_recompute_costs_its_gemms():
    """Recomputing the MLP re-runs its two GEMMs, 2 x 2 s h (4h) FLOP per layer, beyond the model FLOP."""
    plan = build_plan(_sc(recompute="selective", recompute_modules=["mlp"]))
    base = build_plan(_sc())
    per_layer = 2 * 2 * S * H * 4 * H
    assert plan.hardware_flops_per_step - base.hardware_flops_per_step == pytest.approx(
        per_layer * 8 * 8, rel=1e-9)   # 8 layers, 8 micro-batches


def test_recompute_layers_larger_than_a_stage_is_refused():
    """recompute_layers larger than a stage's layers is bad input naming the limit."""
    with pytest.raises(InputError, match=r"training.recompute_layers.*5 is more than the 4 layers"):
        _sc(recompute="full", recompute_layers=5)


def test_recompute_module_the_model_lacks_is_refused():
    """moe_act on a dense model, mla_up_proj without MLA: bad input naming what the module needs."""
    with pytest.raises(InputError, match=r"'moe_act' is not a module of .*mixture-of-experts"):
        _sc(recompute="selective", recompute_modules=["moe_act"])
    with pytest.raises(InputError, match=r"'mla_up_proj' is not a module of .*latent attention"):
        _sc(recompute="selective", recompute_modules=["mla_up_proj"])
