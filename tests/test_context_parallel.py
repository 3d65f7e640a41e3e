"""Context parallelism: ring attention's overlap, the memory it saves, gradients over dp x cp, its reports.

Expected values are hand calculations from the fixture hardware (tests/data/core_ideal.yaml: 1000 TFLOPS, ideal
attention and GEMM kernels without launch overhead, links at the bandwidth given here with zero latency) and
Korthikanti et al. 2022's per-layer activation terms, never read back from the code under test.
"""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.engine.simulation import memory, simulate
from simtrain.plan.build import build_plan
from simtrain.plan.memory import stage_memory
from simtrain.spec.errors import InputError

PEAK = 1000e12          # core_ideal bf16 FLOP/s, attention efficiency 1
S, H, HEADS = 4096, 1024, 16


def _cp(tmp_path, cp=2, bandwidth="100 GB/s", dp=1, tp=1, cp_comm="p2p", **training):
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": bandwidth})
    return make_scenario(hardware=hw, nodes=1, gpus_per_node=dp * tp * cp,
                         model=gpt_model(layers=4, hidden=H, heads=HEADS),
                         training={"seq_len": S, "global_batch": 2 * dp, "micro_batch": 1, **training},
                         parallel={"dp": dp, "tp": tp, "cp": cp, "cp_comm": cp_comm})


def _ring_by_hand(cp: int, bandwidth: float) -> tuple[float, float]:
    """(one step's forward attention, one KV block's transfer): a causal s x s attention computes half of
    4 b s^2 h FLOP; each CP rank does 1/cp of it in cp equal steps. The block is K and V of s/cp tokens, 16-bit."""
    step = 4.0 * S * S * H * 0.5 / cp / cp / PEAK
    transfer = 2 * (S / cp) * H * 2 / bandwidth
    return step, transfer


@pytest.mark.parametrize("bandwidth, gbs", [("100 GB/s", 100e9), ("10000 GB/s", 10000e9)])
@pytest.mark.parametrize("cp", [2, 4])
def test_ring_step_is_max_of_block_attention_and_kv_transfer(tmp_path, cp, bandwidth, gbs):
    """p2p ring attention: each of the cp - 1 communicating forward steps takes max(block attention, KV transfer),
    so the exposed CP time of a layer forward is (cp - 1) x max(0, transfer - attention), the rest hidden."""
    plan = build_plan(_cp(tmp_path, cp=cp, bandwidth=bandwidth))
    step, transfer = _ring_by_hand(cp, gbs)
    c = plan.chunks[0]
    assert c.cp_fwd_layer == pytest.approx((cp - 1) * max(0.0, transfer - step), rel=1e-9, abs=1e-15)
    assert c.cp_fwd_hidden == pytest.approx((cp - 1) * min(transfer, step), rel=1e-9)
    critical = c.cp_fwd_layer + cp * step    # the layer's attention steps and what of the transfers shows
    assert critical == pytest.approx((cp - 1) * max(step, transfer) + step, rel=1e-9)


def test_ring_backward_moves_kv_and_dkv(tmp_path):
    """p2p backward (2.5x the forward's FLOP per block): step 0 sends KV, steps 1..cp-2 KV + dKV, the last dKV
    after the last block: exposed = max(0, x - b) + (cp - 2) max(0, 2x - b) + x."""
    cp = 4
    plan = build_plan(_cp(tmp_path, cp=cp, bandwidth="100 GB/s"))
    step, x = _ring_by_hand(cp, 100e9)
    b = 2.5 * step
    expected = max(0.0, x - b) + (cp - 2) * max(0.0, 2 * x - b) + x
    assert plan.chunks[0].cp_bwd_layer == pytest.approx(expected, rel=1e-9)


def test_activation_memory_falls_by_cp(tmp_path):
    """Every kept activation is of s/cp tokens: Korthikanti's 34 sbh per layer (flash attention, GELU, dropout,
    no TP) with s -> s/cp, plus the embedding's dropout mask (sbh bytes) and the output layer's input (4 sbh)
    and the loss's fp32 log-softmax (4 sbv)."""
    v = 8
    for cp in (1, 2, 4):
        s = S / cp
        layers = 4 * 34 * s * H
        expected = layers + s * H + 4 * s * H + 4 * s * v
        sc = _cp(tmp_path, cp=cp) if cp > 1 else make_scenario(
            hardware=hardware_variant(tmp_path, {}), nodes=1, gpus_per_node=1,
            model=gpt_model(layers=4, hidden=H, heads=HEADS), training={"seq_len": S, "global_batch": 2})
        assert stage_memory(sc, 0).activation_per_microbatch == pytest.approx(expected, rel=1e-12)


def test_ring_kv_buffers_counted(tmp_path):
    """p2p holds two receive buffers of the local K and V, and cp partial outputs (16-bit, s/cp x h) with their fp32
    log-sum-exp (s/cp x heads) until the final correction."""
    cp = 4
    s = S // cp
    expected = 2 * (2 * s * H * 2) + cp * (s * H * 2 + s * HEADS * 4)
    assert stage_memory(_cp(tmp_path, cp=cp), 0).other_detail["cp_buffers"] == pytest.approx(expected, rel=1e-12)


def test_zero_shards_over_dp_times_cp(tmp_path):
    """Gradients are reduced and ZeRO-1 shards the optimizer state over dp x cp (Megatron-Core's dp_cp group):
    with dp 1 and cp 4 the 12 bytes per parameter of Adam's state split four ways."""
    sc = _cp(tmp_path, cp=4)
    sc = sc.with_overrides({"parallel.zero": 1})
    st = stage_memory(sc, 0)
    assert st.optimizer == pytest.approx(st.params_local * 12 / 4, rel=1e-12)
    result = simulate(sc)
    kinds = {r[2] for r in result.timeline.records if r[1] == "dp"}
    assert "dp_reduce_scatter" in kinds or "dp_all_reduce" in kinds


def test_cp_lane_and_keys_only_with_cp(tmp_path):
    """A CP run reports exposed_comm_s.cp and busy_s.cp and records CP transfers on their own stream; a run without
    CP has no cp key."""
    with_cp = simulate(_cp(tmp_path, cp=2, bandwidth="100 GB/s")).to_dict()
    assert with_cp["exposed_comm_s"]["cp"] > 0
    assert with_cp["devices"][0]["busy_s"]["cp"] >= with_cp["exposed_comm_s"]["cp"]
    assert with_cp["config"]["parallel"]["cp"] == 2 and with_cp["config"]["parallel"]["cp_comm"] == "p2p"
    plain = simulate(make_scenario(model=gpt_model(layers=4), nodes=1, gpus_per_node=1)).to_dict()
    assert "cp" not in plain["exposed_comm_s"] and "cp" not in plain["config"]["parallel"]


def test_gpus_are_dp_tp_pp_cp(tmp_path):
    """GPUs = dp x tp x pp x cp: a 4-GPU node holds dp 1, tp 2, cp 2 and refuses cp 4."""
    assert _cp(tmp_path, cp=2, tp=2).gpus == 4
    with pytest.raises(InputError, match=r"dp x tp x pp x cp = 1 x 2 x 1 x 4 = 8 does not equal the 4 GPUs"):
        make_scenario(hardware=hardware_variant(tmp_path, {}), nodes=1, gpus_per_node=4,
                      model=gpt_model(layers=4, hidden=H, heads=HEADS),
                      training={"seq_len": S, "global_batch": 2}, parallel={"tp": 2, "cp": 4})


def test_seq_len_must_split_into_2cp_chunks(tmp_path):
    """p2p splits each sequence into 2 x cp chunks for load balancing: 4100 tokens cannot take cp 4."""
    with pytest.raises(InputError, match=r"training.seq_len.*4100 is not divisible by 2 x cp = 8"):
        _cp(tmp_path, cp=4, seq_len=4100)


def test_a2a_needs_heads_divisible_by_cp(tmp_path):
    """Ulysses splits the heads of a TP rank over cp: 16 heads take cp 2 and 4 (a2a), not 3."""
    _cp(tmp_path, cp=4, cp_comm="a2a")
    hw = hardware_variant(tmp_path, {})
    with pytest.raises(InputError, match=r"parallel.cp.*3 does not divide the 16 heads"):
        make_scenario(hardware=hw, nodes=1, gpus_per_node=3, model=gpt_model(layers=4, hidden=H, heads=HEADS),
                      training={"seq_len": 3 * 1024, "global_batch": 2},
                      parallel={"cp": 3, "cp_comm": "a2a"})


def test_a2a_and_allgather_are_exposed(tmp_path):
    """a2a and allgather communication is on the critical path (nothing hidden), and the attention work per GPU is
    the same 1/cp of the causal total (hardware FLOP equal across the three CP methods)."""
    flops = {}
    for mode in ("p2p", "a2a", "allgather"):
        plan = build_plan(_cp(tmp_path, cp=4, cp_comm=mode))
        c = plan.chunks[0]
        if mode != "p2p":
            assert c.cp_fwd_hidden == 0.0 and c.cp_fwd_layer > 0
        flops[mode] = plan.hardware_flops_per_step
    assert flops["a2a"] == pytest.approx(flops["p2p"], rel=1e-12)
    assert flops["allgather"] == pytest.approx(flops["p2p"], rel=1e-12)


def test_memory_report_lists_cp_buffers(tmp_path):
    """simtrain memory names the CP buffers among 'other' of a CP run."""
    result = memory(_cp(tmp_path, cp=2)).to_dict()
    assert "cp_buffers" in result["stages"][0]["other_detail"]


def test_search_enumerates_cp_for_long_sequences():
    """search lists cp sizes where each CP rank keeps >= 8,192 tokens: a 131,072-token run on 128 GPUs gets cp up to
    16, and GPUs = dp x tp x pp x cp in every layout; an 8,192-token run gets no cp key."""
    from simtrain.decide.search import enumerate_layouts

    long = make_scenario(hardware="dgx-h100", nodes=16, model="llama3-70b",
                         training={"seq_len": 131072, "global_batch": 32},
                         parallel={"tp": 8, "pp": 4, "dp": 4})
    layouts = enumerate_layouts(long)
    assert {x["cp"] for x in layouts} == {1, 2, 4, 8, 16}
    assert all(x["dp"] * x["tp"] * x["pp"] * x["cp"] == 128 for x in layouts)
    short = long.with_overrides({"training.seq_len": 8192})
    assert all("cp" not in x for x in enumerate_layouts(short))


def test_memory_advice_names_cp_with_its_saving(tmp_path):
    """A run that does not fit for its activations is told to raise parallel.cp, with the activations it saves:
    half of the fullest stage's activations for cp 1 -> 2."""
    sc = make_scenario(hardware=hardware_variant(tmp_path, {"gpu.memory": "1 GB"}), nodes=1, gpus_per_node=1,
                       model=gpt_model(layers=4, hidden=H, heads=HEADS),
                       training={"seq_len": S, "global_batch": 2})
    result = memory(sc)
    acts = max(st.memory["activations"] for st in result.stages)
    tip = next(t for t in result.advice if "parallel.cp: 2" in t)
    assert f"{acts / 2 / 1e9:.1f} GB" in tip


def test_dp_auto_counts_context_parallel_ranks():
    """parallel.dp: auto on 2 nodes of 8 GPUs with tp 2, pp 2, cp 2 gives dp = 16 / (2 x 2 x 2) = 2."""
    from conftest import make_scenario

    sc = make_scenario(nodes=2, gpus_per_node=8, training={"seq_len": 4096, "global_batch": 8},
                       parallel={"dp": "auto", "tp": 2, "pp": 2, "cp": 2})
    assert sc.parallel.dp == 2 and sc.gpus == 16


def test_the_text_report_header_names_cp_ep_and_fp8():
    """`simtrain run`'s first line names the dimensions a scenario uses beyond dp/tp/pp/vpp: cp, ep/etp, fp8."""
    from simtrain.report.text import _extra_dims

    assert _extra_dims({"parallel": {"cp": 16}, "training": {"precision": "bf16"}}) == " cp=16"
    assert _extra_dims({"parallel": {"cp": 1, "ep": 64, "etp": 1},
                        "training": {"precision": "fp8", "fp8_recipe": "mxfp8"}}) == " ep=64 etp=1 fp8 (mxfp8)"
    assert _extra_dims({"parallel": {"dp": 4}, "training": {"precision": "bf16"}}) == ""


def test_ring_steps_of_a_kernel_whose_forward_outruns_its_backward(tmp_path):
    """flash1_triton (forward k = 1.95505x its backward's rate, xformers#479, test_attention_passes.py; forward +
    backward at the flash1 entry, here 0.5): a ring step's forward runs at 0.5 x (1 + 2.5 k) / 3.5 of the peak and
    its backward at that / k, so the KV transfers hide behind shorter forward and longer backward steps than
    FlashAttention-2's."""
    cp = 4
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s", "compute.attention_kernels": {"flash1": 0.5}})
    sc = make_scenario(hardware=hw, nodes=1, gpus_per_node=cp, model=gpt_model(layers=4, hidden=H, heads=HEADS),
                       training={"seq_len": S, "global_batch": 2, "micro_batch": 1, "flash_attention": "flash1_triton"},
                       parallel={"dp": 1, "tp": 1, "cp": cp, "cp_comm": "p2p"})
    c = build_plan(sc).chunks[0]
    step, x = _ring_by_hand(cp, 100e9)
    k = (25831.9 / (2.5 * 5167.6) + 25811.2 / (2.5 * 5335.3) + 51084.6 / (2.5 * 10226.7)
         + 51265.2 / (2.5 * 10540.9) + 91356.3 / (2.5 * 19262.0)) / 5     # xformers#479's five rows: 1.95505
    f = step / (0.5 * (1 + 2.5 * k) / 3.5)
    b = 2.5 * step / (0.5 * (1 + 2.5 * k) / 3.5 / k)
    assert c.cp_fwd_layer == pytest.approx((cp - 1) * max(0.0, x - f), rel=1e-9)
    assert c.cp_fwd_hidden == pytest.approx((cp - 1) * min(x, f), rel=1e-9)
    assert c.cp_bwd_layer == pytest.approx(max(0.0, x - b) + (cp - 2) * max(0.0, 2 * x - b) + x, rel=1e-9)
