"""A MoE layer's tensor-parallel collectives are the ones Megatron-Core runs on the attention's TP group
(NVIDIA/Megatron-LM @d98e8a6): its attention's all-gather + reduce-scatter pair and, with shared experts, their pair
(SharedExpertMLP is an MLP on pg_collection.tp); the routed experts' go through the token dispatcher's expert-TP
group (none at etp 1). Expected times are 2-GPU rings by hand: 1 step of latency + 1/2 x S / B, S = b x s x h x 2."""

from __future__ import annotations

import pytest
from conftest import hardware_variant, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan

B = 100e9            # NVLink per direction in the test file
LATENCY = 1e-6       # GPU -> NVSwitch -> GPU
SEQ, HIDDEN = 1024, 1024
# one all-gather + one reduce-scatter of b x s x h BF16 activations over a 2-GPU ring, each alone
PAIR = 2 * (LATENCY + 0.5 * SEQ * HIDDEN * 2 / B)
# an MTP module's eh_proj under sequence parallelism: forward an all-gather of its 2h-wide input and one of its
# output, backward the split's all-gather and the input gradient's 2h-wide reduce-scatter (each one ring step)
EH_PROJ = (LATENCY + 0.5 * 2 * SEQ * HIDDEN * 2 / B) + (LATENCY + 0.5 * SEQ * HIDDEN * 2 / B)


def _scenario(tmp_path, layers=1, recompute="none", modules=None, mtp=0, **moe):
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s", "intra_node.latency": "1 us"})
    model = {"layers": layers, "hidden": HIDDEN, "heads": 16, "ffn_hidden": 4096, "vocab": 8,
             "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512, **moe}}
    if mtp:
        model["mtp_layers"] = mtp
    training = {"seq_len": SEQ, "global_batch": 1, "micro_batch": 1, "dropout": False, "recompute": recompute}
    if modules:
        training["recompute_modules"] = modules
    return make_scenario(hardware=hw, nodes=1, gpus_per_node=2, model=model, training=training,
                         parallel={"dp": 1, "tp": 2, "pp": 1, "ep": 1, "etp": 1, "sequence_parallel": True})


def test_routed_experts_only_attention_pair(tmp_path):
    """etp 1, no shared experts: the layer's forward and backward each run the attention's AG + RS only."""
    c = build_plan(_scenario(tmp_path)).chunks[0]
    assert c.tp_fwd_layer == pytest.approx(PAIR, rel=1e-12)
    assert c.tp_bwd_layer == pytest.approx(PAIR, rel=1e-12)


def test_shared_experts_add_their_pair(tmp_path):
    """One shared expert: its fc1 all-gathers and its fc2 reduce-scatters the activations, a second pair."""
    c = build_plan(_scenario(tmp_path, shared_experts=1)).chunks[0]
    assert c.tp_fwd_layer == pytest.approx(2 * PAIR, rel=1e-12)
    assert c.tp_bwd_layer == pytest.approx(2 * PAIR, rel=1e-12)


def test_leading_dense_layer_keeps_both_pairs(tmp_path):
    """A leading dense layer (DeepSeek-V3's first three) runs attention's and its MLP's pairs; a run of one dense
    and one MoE layer, one micro-batch, exposes (2 + 1) pairs forward and as many backward on the TP lane, plus the
    model's ends (plan.edge_tp, sequence parallelism, eager loss): the embedding's reduce-scatter and its backward's
    all-gather, the output layer's input all-gather and its backward's reduce-scatter, 2 pairs more; and before the
    optimizer one all-reduce of the gradients each TP rank holds whole under sequence parallelism (plan.grad_finalize):
    2 layers x 2 LayerNorms x 2h + the router's 4 x h + the final norm's 2h = 14,336 BF16 elements, 28,672 bytes, a
    2-GPU ring all-reduce of 2 steps of latency + 2 x 1/2 x bytes / B."""
    sc = _scenario(tmp_path, layers=2, dense_layers=1)
    c = build_plan(sc).chunks[0]
    assert (c.lead_layers, c.lead_tp_fwd, c.tp_fwd_layer) == (1, pytest.approx(2 * PAIR), pytest.approx(PAIR))
    grads_ar = 2 * LATENCY + (2 * 2 * 2 * HIDDEN + 4 * HIDDEN + 2 * HIDDEN) * 2 / B
    assert simulate(sc).exposed_comm_s["tp"] == pytest.approx(2 * 3 * PAIR + 2 * PAIR + grads_ar, rel=1e-9)


def test_full_recompute_runs_the_forward_pairs_again(tmp_path):
    """Full recompute: the backward runs the recomputed forward's pairs too (1 + 1 without shared experts)."""
    c = build_plan(_scenario(tmp_path, recompute="full")).chunks[0]
    assert c.tp_bwd_layer == pytest.approx(2 * PAIR, rel=1e-12)


def test_selective_moe_recompute_reruns_the_shared_pair(tmp_path):
    """Selective recompute of the MoE block re-runs its shared experts (their pair), no other TP collective."""
    c = build_plan(_scenario(tmp_path, recompute="selective", modules=["moe"], shared_experts=1)).chunks[0]
    assert c.tp_bwd_layer == pytest.approx(3 * PAIR, rel=1e-12)
    c = build_plan(_scenario(tmp_path, recompute="selective", modules=["moe"])).chunks[0]
    assert c.tp_bwd_layer == pytest.approx(PAIR, rel=1e-12)


def _mla(tmp_path, modules=None):
    """The 1-layer MoE scenario with latent attention (query latent 256, key/value latent 128, RoPE part 64) on a
    zero-latency 2-GPU ring."""
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s", "intra_node.latency": "0 us"}, name="mla")
    model = {"layers": 1, "hidden": HIDDEN, "heads": 16, "ffn_hidden": 4096, "vocab": 8,
             "attention": {"kind": "mla", "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
                           "qk_rope_head_dim": 64, "v_head_dim": 64},
             "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512}}
    training = {"seq_len": SEQ, "global_batch": 1, "micro_batch": 1, "dropout": False,
                "recompute": "selective" if modules else "none", **({"recompute_modules": modules} if modules else {})}
    return make_scenario(hardware=hw, nodes=1, gpus_per_node=2, model=model, training=training,
                         parallel={"dp": 1, "tp": 2, "pp": 1, "ep": 1, "etp": 1, "sequence_parallel": True})


def test_latent_attention_gathers_its_latents_not_the_hidden_state(tmp_path):
    """Multi-head latent attention (Megatron-Core @d98e8a6: duplicated down projections, column-parallel up
    projections): the forward all-gathers the query and key/value latents and the RoPE key part, (256 + 128 + 64) x
    s x 2 bytes, and reduce-scatters the output, 1024 x s x 2; on a 2-GPU ring with no latency each moves half its
    bytes at B. The backward mirrors both; recomputing mla_up_proj re-runs the two latent gathers, (256 + 128) x s
    x 2."""
    full = SEQ * HIDDEN * 2
    gathers = SEQ * (256 + 128 + 64) * 2
    c = build_plan(_mla(tmp_path)).chunks[0]
    assert c.tp_fwd_layer == pytest.approx(0.5 * (gathers + full) / B, rel=1e-12)
    assert c.tp_bwd_layer == pytest.approx(0.5 * (gathers + full) / B, rel=1e-12)
    r = build_plan(_mla(tmp_path, modules=["mla_up_proj"])).chunks[0]
    assert r.tp_bwd_layer == pytest.approx(0.5 * (gathers + full + SEQ * (256 + 128) * 2) / B, rel=1e-12)


def test_a_multi_token_prediction_module_runs_its_own_layers_and_edges_collectives(tmp_path):
    """One MTP module (Megatron-Core multi_token_prediction.py): its embedding (reduce-scatter; backward all-gather),
    one MoE layer like the last (one pair each way) and its output layer (all-gather; backward reduce-scatter): two
    pairs more forward and two backward than without it, and its eh_proj's collectives each way, by hand."""
    plain = simulate(_scenario(tmp_path, layers=2, dense_layers=1)).exposed_comm_s["tp"]
    with_mtp = simulate(_scenario(tmp_path, layers=2, dense_layers=1, mtp=1)).exposed_comm_s["tp"]
    assert with_mtp - plain == pytest.approx(4 * PAIR + 2 * EH_PROJ, rel=1e-9)


def test_an_mtp_module_on_a_loss_only_last_stage_runs_a_moe_layers_pairs(tmp_path):
    """PP 2 with the layers on the first stage and the loss (and the MTP module) alone on the last: the module's layer
    is the model's last, a MoE layer, one pair each way, not a dense layer's two. The last chunk's output-layer TP
    time: the head's all-gather (half a pair) + the module's embedding reduce-scatter, layer pair and output
    all-gather = 2.5 pairs forward, and as many backward, plus its eh_proj's, by hand."""
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s", "intra_node.latency": "1 us"})
    model = {"layers": 2, "hidden": HIDDEN, "heads": 16, "ffn_hidden": 4096, "vocab": 8, "mtp_layers": 1,
             "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512, "dense_layers": 1}}
    sc = make_scenario(hardware=hw, nodes=1, gpus_per_node=4, model=model,
                       training={"seq_len": SEQ, "global_batch": 2, "micro_batch": 1, "dropout": False},
                       parallel={"dp": 1, "tp": 2, "pp": 2, "ep": 1, "etp": 1, "sequence_parallel": True,
                                 "layers_per_stage": [2, 0]})
    last = build_plan(sc).chunks[-1]
    assert last.layers == 0 and last.has_head
    assert last.head_tp_fwd == pytest.approx(2.5 * PAIR + EH_PROJ, rel=1e-9)
    assert last.head_tp_bwd == pytest.approx(2.5 * PAIR + EH_PROJ, rel=1e-9)
