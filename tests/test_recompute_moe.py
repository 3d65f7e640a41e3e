"""Recompute modules of mixture-of-experts and latent-attention layers (Megatron-Core's --recompute-modules moe_act,
moe, shared_experts, mla_up_proj): the bytes each stops keeping and the forward work it re-runs.

Layer shapes are Qwen3-30B-A3B's (hidden 2048, 128 experts, top-8, expert width 768, SwiGLU) and DeepSeek-V3's
(hidden 7168, MLA with q_lora 1536, kv_lora 512, qk 128 + 64, v 128, 256 experts of 2048 plus one shared), on a
few layers, one GPU (tp = ep = 1, so a GPU routes all T tokens and holds every expert: T x top-k rows), on the
idealised test node whose GEMMs run at exactly 1000 TFLOP/s. Every expected figure is written out here by hand.
"""

from __future__ import annotations

import pytest
from conftest import hardware_variant, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.plan.memory import stage_memory
from simtrain.spec.errors import InputError

T = 1024                 # tokens of one micro-batch (seq 1024, micro-batch 1)
PEAK = 1000e12           # FLOP/s of the test node
MB = 2                   # micro-batches per step

QWEN = {"layers": 4, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "ffn_hidden": 6144,
        "vocab": 8, "mlp": "swiglu", "dropout": False,
        "moe": {"experts": 128, "top_k": 8, "expert_ffn_hidden": 768}}
DSV3 = {"layers": 4, "hidden": 7168, "heads": 128, "ffn_hidden": 18432, "vocab": 8, "mlp": "swiglu",
        "dropout": False,
        "attention": {"kind": "mla", "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                      "qk_rope_head_dim": 64, "v_head_dim": 128},
        "moe": {"experts": 256, "top_k": 8, "expert_ffn_hidden": 2048, "shared_experts": 1, "dense_layers": 1}}


def _sc(model, modules=None, hardware=None, parallel=None):
    training = {"seq_len": T, "global_batch": MB}
    if modules:
        training.update(recompute="selective", recompute_modules=modules)
    kw = {"hardware": hardware} if hardware else {}
    return make_scenario(model=model, training=training, parallel=parallel or {}, **kw)


def _act(sc) -> float:
    return stage_memory(sc, 0).activation_per_microbatch


def test_moe_act_drops_the_activation_output():
    """moe_act: each MoE layer drops its experts' activation output, T k rows x f x 2 bytes."""
    saved = 4 * T * 8 * 768 * 2
    assert _act(_sc(QWEN)) - _act(_sc(QWEN, ["moe_act"])) == pytest.approx(saved, rel=1e-12)


def test_moe_drops_the_whole_block():
    """moe: each MoE layer keeps only its input: router probabilities (T E fp32), permuted rows (T k h), fc1 and
    activation outputs (T k x 3f) and expert outputs (T k h) all go."""
    rows = T * 8
    per_layer = T * 128 * 4 + rows * 2048 * 2 + rows * 3 * 768 * 2 + rows * 2048 * 2
    assert _act(_sc(QWEN)) - _act(_sc(QWEN, ["moe"])) == pytest.approx(4 * per_layer, rel=1e-12)


def test_moe_recompute_peaks_one_block():
    """moe: the block being recomputed holds its activations once more on top of what is kept."""
    rows = T * 8
    per_layer = T * 128 * 4 + rows * 2048 * 2 + rows * 3 * 768 * 2 + rows * 2048 * 2
    mem = stage_memory(_sc(QWEN, ["moe"]), 0)
    assert mem.activations - mem.activation_per_microbatch * mem.inflight == pytest.approx(per_layer, rel=1e-12)


def test_shared_experts_and_mla_up_proj_drop_their_tensors():
    """shared_experts: fc1 (2 x 2048) and activation (2048) outputs of the shared expert, 3 x T x 2048 x 2 bytes per
    MoE layer (3 of 4); mla_up_proj: per-head Q, K (128 x 192 each) and V (128 x 128), 2 bytes, on every layer."""
    base = _act(_sc(DSV3))
    assert base - _act(_sc(DSV3, ["shared_experts"])) == pytest.approx(3 * 3 * T * 2048 * 2, rel=1e-12)
    assert base - _act(_sc(DSV3, ["mla_up_proj"])) == pytest.approx(4 * 2 * T * 128 * (192 + 192 + 128),
                                                                     rel=1e-12)


def test_shared_experts_recompute_runs_their_gemms():
    """shared_experts: the shared MLP's forward GEMMs, 2 T h (2 x 2048) + 2 T 2048 h FLOP, run again before each
    MoE layer's backward: that many seconds at 1000 TFLOP/s, and that many FLOP more per step."""
    flop = 2 * T * 7168 * 4096 + 2 * T * 2048 * 7168
    base, plan = build_plan(_sc(DSV3)), build_plan(_sc(DSV3, ["shared_experts"]))
    c0, c1 = base.chunks[0], plan.chunks[0]
    assert c1.recompute_layer - c0.recompute_layer == pytest.approx(flop / PEAK, rel=1e-6)
    assert c1.lead_recompute == c0.lead_recompute     # the dense leading layer has no shared expert
    assert plan.hardware_flops_per_step - base.hardware_flops_per_step == pytest.approx(3 * MB * flop, rel=1e-9)


def test_mla_up_proj_recompute_runs_the_up_projections():
    """mla_up_proj: q up [T, 128 x 192] from the 1536 latent and kv up [T, 128 x 256] from the 512 latent, on every
    layer; the simulated step grows by those seconds for every layer and micro-batch (one stage, ideal links)."""
    flop = 2 * T * 128 * 192 * 1536 + 2 * T * 128 * 256 * 512
    base, plan = build_plan(_sc(DSV3)), build_plan(_sc(DSV3, ["mla_up_proj"]))
    assert plan.chunks[0].recompute_layer - base.chunks[0].recompute_layer == pytest.approx(flop / PEAK, rel=1e-6)
    assert plan.chunks[0].lead_recompute - base.chunks[0].lead_recompute == pytest.approx(flop / PEAK, rel=1e-6)
    grown = simulate(_sc(DSV3, ["mla_up_proj"])).step_time_s - simulate(_sc(DSV3)).step_time_s
    assert grown == pytest.approx(4 * MB * flop / PEAK, rel=1e-4)


def test_moe_recompute_reruns_router_experts_and_all_to_alls():
    """moe: the router GEMM (2 T E h) and the experts' GEMMs (T k rows x 2 h (2f + f)) run again, and with ep > 1
    the dispatch and combine run twice in the backward."""
    flop = 2 * T * 128 * 2048 + T * 8 * 2 * 2048 * (2 * 768 + 768)
    base, plan = build_plan(_sc(QWEN)), build_plan(_sc(QWEN, ["moe"]))
    assert plan.hardware_flops_per_step - base.hardware_flops_per_step == pytest.approx(4 * MB * flop, rel=1e-9)
    assert plan.chunks[0].recompute_layer - base.chunks[0].recompute_layer > flop / PEAK   # + permutes, top-k
    ep = build_plan(make_scenario(model=QWEN, nodes=1, gpus_per_node=8, parallel={"dp": 8, "ep": 8},
                                  training={"seq_len": T, "global_batch": 8, "recompute": "selective",
                                            "recompute_modules": ["moe"]})).chunks[0]
    assert ep.ep_fwd_layer > 0 and ep.ep_bwd_layer == pytest.approx(2 * ep.ep_fwd_layer, rel=1e-12)


def test_moe_act_recompute_is_one_element_wise_pass(tmp_path):
    """moe_act: the activation re-reads fc1's output (2f) and writes its own (f) for T k rows, 2 bytes each: on
    a node with 1 TB/s of HBM and no launch overhead, 3 x 8192 x 768 x 2 / 1e12 s per MoE layer."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": {"value": "1 TB/s", "source": "test"}})
    base, plan = build_plan(_sc(QWEN, hardware=hw)), build_plan(_sc(QWEN, ["moe_act"], hardware=hw))
    assert plan.chunks[0].recompute_layer - base.chunks[0].recompute_layer == pytest.approx(
        3 * T * 8 * 768 * 2 / 1e12, rel=1e-9)


def test_moe_with_ep_overlap_is_refused():
    """Megatron-Core refuses recomputing the moe module under the EP all-to-all overlap."""
    with pytest.raises(InputError, match=r"'moe' with parallel.ep_overlap is refused by Megatron-Core"):
        make_scenario(model=QWEN, nodes=1, gpus_per_node=8, parallel={"dp": 8, "ep": 8, "ep_overlap": True},
                      training={"seq_len": T, "global_batch": 32, "recompute": "selective",
                                "recompute_modules": ["moe"]})


def test_mlp_module_runs_on_the_dense_layers_of_a_moe_model():
    """mlp on DeepSeek-V3's shape: only the dense leading layer drops its SwiGLU internals, 6 x T x f bytes (gate,
    up and activation outputs, 2 bytes each)."""
    assert _act(_sc(DSV3)) - _act(_sc(DSV3, ["mlp"])) == pytest.approx(6 * T * 18432, rel=1e-12)
