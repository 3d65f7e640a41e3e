"""The event engine against independently derived pipeline and overlap arithmetic (issue 3).

Most tests run on ``tests/data/core_ideal.yaml``: huge bandwidth, zero latency, ideal kernels and a
tiny vocabulary, so stages are uniform and communication is negligible. Then, with t_f and t_b one
stage's forward and backward time from the plan (the per-chunk cost, not the schedule):

- GPipe and 1F1B take (m + p - 1)(t_f + t_b) + t_opt and idle (p - 1)/(m + p - 1) of the step
  (Narayanan et al. 2021, arXiv:2104.04473, Sec. 2.2.1; Huang et al. 2019, GPipe, Sec. 2.3);
- interleaving v chunks per rank cuts the idle time by v (Narayanan et al. 2021, Sec. 2.2.2);
- 1F1B keeps at most p micro-batches of activations on stage 0, GPipe all m.
These check the schedule arithmetic the engine plays out, not the cost model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import DATA, REPO, gpt_model, hardware_variant, make_scenario

from simtrain.engine.simulation import memory, simulate
from simtrain.plan.build import build_plan
from simtrain.plan.memory import edge_params, layer_params_per_rank
from simtrain.report.outputs import dumps_json
from simtrain.spec.scenario import load_scenario

PP4_DP4 = REPO / "scenarios" / "pp4_dp4.yaml"


def _pipeline(p: int, m: int, schedule: str = "1f1b", vpp: int = 1, layers: int | None = None, **training):
    layers = layers or 2 * p * vpp
    return make_scenario(model=gpt_model(layers=layers),
                         training={"seq_len": 512, "global_batch": m, "micro_batch": 1, **training},
                         parallel={"pp": p, "vpp": vpp, "schedule": schedule})


def _stage_times(s):
    """(t_f, t_b, t_opt) of a middle chunk, and the plan."""
    plan = build_plan(s)
    c = plan.chunks[1]
    return c.forward_time, c.backward_time, max(plan.optimizer_time), plan


# --- GPipe and 1F1B --------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 8), (2, 6), (8, 8)])
def test_pipeline_step_time(schedule, p, m):
    """Uniform stages, free communication: step = (m + p - 1)(t_f + t_b) + t_opt for GPipe and 1F1B."""
    s = _pipeline(p, m, schedule)
    tf, tb, topt, _ = _stage_times(s)
    # the first/last stage add an embedding and a tiny (vocab 8) output layer: < 0.1% of a stage
    assert simulate(s).step_time_s == pytest.approx((m + p - 1) * (tf + tb) + topt, rel=1e-3)


@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 16)])
def test_gpipe_and_1f1b_take_the_same_time(p, m):
    """GPipe and 1F1B have the same bubble, so the same step time (Narayanan et al. 2021, Sec. 2.2.1)."""
    assert simulate(_pipeline(p, m, "gpipe")).step_time_s == pytest.approx(
        simulate(_pipeline(p, m, "1f1b")).step_time_s, rel=1e-9)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 8), (8, 8)])
def test_compute_utilization_is_m_over_m_plus_p_minus_1(schedule, p, m):
    """Every stage computes m(t_f + t_b) of a (m + p - 1)(t_f + t_b) step: utilization m/(m + p - 1)."""
    r = simulate(_pipeline(p, m, schedule))
    for dev in r.devices:
        assert dev.compute_utilization == pytest.approx(m / (m + p - 1), rel=1e-3)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(4, 4), (4, 8)])
def test_bubble_fraction_is_p_minus_1_over_m_plus_p_minus_1(schedule, p, m):
    """GPipe and 1F1B bubble fraction equals (p - 1)/(m + p - 1) (the optimizer step is tiny)."""
    assert simulate(_pipeline(p, m, schedule)).bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=0.01)


@pytest.mark.parametrize(("schedule", "p", "m"), [("1f1b", 4, 8), ("1f1b", 4, 2), ("gpipe", 4, 8), ("gpipe", 2, 5)])
def test_activation_peak_micro_batches(schedule, p, m):
    """1F1B holds min(m, p - r) micro-batches of activations on stage r; GPipe all m."""
    s = _pipeline(p, m, schedule)
    r = simulate(s)
    plan = build_plan(s)
    for lane in r.timeline.lanes:
        held = lane.act_peak / plan.chunks[lane.rank].act_bytes
        assert held == pytest.approx(m if schedule == "gpipe" else min(m, p - lane.rank))


# --- interleaved 1F1B ------------------------------------------------------------------------------

@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 2), (4, 4, 2), (2, 4, 4)])
def test_interleaved_step_time(p, m, v):
    """Interleaved, chunks of t_f/v and t_b/v: step = (m v + p - 1)(t_fc + t_bc) + t_opt."""
    s = _pipeline(p, m, "interleaved-1f1b", vpp=v)
    tfc, tbc, topt, _ = _stage_times(s)
    assert simulate(s).step_time_s == pytest.approx((m * v + p - 1) * (tfc + tbc) + topt, rel=1e-3)


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_cuts_the_bubble_by_v(v):
    """The same model on the same ranks idles v times less with v chunks (Narayanan et al. 2021, Sec. 2.2.2)."""
    p, m, layers = 4, 8, 16

    def idle(s):
        r = simulate(s)
        return r.step_time_s - max(d.busy_s["compute"] for d in r.devices)

    plain = idle(_pipeline(p, m, "1f1b", layers=layers))
    inter = idle(_pipeline(p, m, "interleaved-1f1b", vpp=v, layers=layers))
    assert plain / inter == pytest.approx(v, rel=0.02)


def test_interleaved_stage0_activation_peak():
    """Interleaved stage 0 holds p (1 + (p - 1)/(p v)) micro-batches of its layers (Korthikanti et al. 2022, 4.2.3).
    Without dropout, so that stage 0's two chunks hold the same bytes (the embedding's dropout mask sits on chunk 0
    alone: tests/test_memory_chunks.py)."""
    p, m, v = 4, 8, 2
    s = make_scenario(model=gpt_model(layers=2 * p * v, dropout=False),
                      training={"seq_len": 512, "global_batch": m, "micro_batch": 1},
                      parallel={"pp": p, "vpp": v, "schedule": "interleaved-1f1b"})
    lane0 = next(ln for ln in simulate(s).timeline.lanes if ln.rank == 0)
    rank_bytes = sum(c.act_bytes for c in build_plan(s).chunks if c.rank == 0)   # one micro-batch, all chunks
    assert lane0.act_peak / rank_bytes == pytest.approx(p * (1 + (p - 1) / (p * v)))


# --- data-parallel overlap -------------------------------------------------------------------------

DP_MODEL = gpt_model(layers=8)


def _dp_scenario(tmp_path, ratio: float | None, overlap: bool = True, grad_dtype: str = "auto"):
    """dp=2 on one node, one gradient bucket per layer; intra-node bandwidth set so that one layer's
    all-reduce (of 16-bit gradients) takes ``ratio`` x one layer's backward (ratio None: the ideal, huge
    bandwidth). The plan ``c`` returned is the 16-bit one."""
    base = dict(model=DP_MODEL, training={"seq_len": 512, "global_batch": 8}, parallel={"dp": 2})
    c = build_plan(make_scenario(**base)).chunks[0]
    bucket, t_b = c.grad_bytes_layer, c.bwd_layer
    bandwidth = bucket / (ratio * t_b) if ratio else 1e18
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": f"{bandwidth!r} B/s"}, name=f"dp{ratio}")
    base["training"] = dict(base["training"], grad_dtype=grad_dtype)
    s = make_scenario(hardware=hw, simulation={"dp_bucket_size": f"{bucket!r} B", "overlap_dp": overlap}, **base)
    return s, c, bandwidth


def test_dp_all_reduce_hidden_behind_backward(tmp_path):
    """A bucket all-reduce shorter than a layer's backward hides behind it: only the final bucket
    (launched when the backward ends) is exposed. Ring of 2: time = S/B (Thakur et al. 2005)."""
    s, c, bw = _dp_scenario(tmp_path, ratio=0.5)
    t_ar = c.grad_bytes_layer / bw
    exposed = simulate(s).exposed_comm_s["dp"]
    assert exposed == pytest.approx(t_ar + c.grad_bytes_edge / bw, rel=1e-3)
    assert exposed < 0.15 * (c.layers * t_ar)   # 1 of 8 buckets


def test_dp_all_reduce_longer_than_backward_is_exposed(tmp_path):
    """Buckets slower than the backward queue up: exposed = L t_ar - (L - 1) t_b (comm minus the overlapped
    backward)."""
    s, c, bw = _dp_scenario(tmp_path, ratio=2.0)
    t_ar, t_b, L = c.grad_bytes_layer / bw, c.bwd_layer, c.layers
    expected = L * t_ar - (L - 1) * t_b + c.grad_bytes_edge / bw
    assert simulate(s).exposed_comm_s["dp"] == pytest.approx(expected, rel=1e-3)


def test_dp_without_overlap_exposes_everything(tmp_path):
    """With overlap_dp off, the whole gradient all-reduce runs after the backward: exposed = all bytes / B."""
    s, c, bw = _dp_scenario(tmp_path, ratio=0.5, overlap=False)
    total = c.layers * c.grad_bytes_layer + c.grad_bytes_edge
    assert simulate(s).exposed_comm_s["dp"] == pytest.approx(total / bw, rel=1e-3)


@pytest.mark.parametrize("parallel", [
    {"dp": 1},                  # the plain backward
    {"dp": 2, "zero": 1},       # the last backward launches DP buckets
    {"dp": 2, "zero": 2},       # every backward launches reduce-scatter buckets
    {"dp": 2, "zero": 3},       # ZeRO-3 layer by layer
])
def test_train_metrics_add_their_passes_after_every_backward(tmp_path, parallel):
    """training.train_metrics = 2 (Composer's per-micro-batch train metrics, two for llm-foundry's MPT) adds, per
    micro-batch, two eager loss forwards over the logits on the compute stream. With negligible communication
    the step grows by m x 2 x T V 14 B / B_HBM exactly, whichever backward path runs. T = 2 x 512, V = 32,000,
    m = 4 per DP rank, B_HBM = 1 TB/s: 4 x 2 x 1024 x 32000 x 14 B / 1e12 = 3.670 ms."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2, vocab=32000),
                training={"seq_len": 512, "global_batch": 8 * parallel["dp"], "micro_batch": 2}, parallel=parallel)
    s0 = make_scenario(**base)
    s2 = make_scenario(**{**base, "training": {**base["training"], "train_metrics": 2}})
    delta = simulate(s2).step_time_s - simulate(s0).step_time_s
    assert delta == pytest.approx(4 * 2 * 1024 * 32000 * 14 / 1e12, rel=1e-6)   # the negligible network: 1e-7


#: FSDP1's fixed cost per FSDP unit and micro-batch: the median per-layer gap between FSDP1 and YaFSDP iteration
#: times at 4096-8192 tokens, no checkpointing, A100 (yandex/YaFSDP README, "Benchmarks"): 1.56, 1.88, 0.94, 1.88,
#: 2.00 and 3.75 ms -> 1.875 ms
FSDP1_UNIT = 1.875e-3


def test_fsdp1_gradient_handling_costs_its_bytes(tmp_path):
    """parallel.zero_impl fsdp1 (PyTorch FSDP's flat parameters), bf16 weights and gradients: per micro-batch each
    unit's gradient is concatenated into the flat gradient on the compute stream (read 2 + write 2 B/param), and
    pre-divided in place before its reduce-scatter (read 2 + write 2 B/param) on the DP stream. ZeRO-2 over 2 GPUs,
    one bucket (launched after each backward), negligible network, HBM at 1 TB/s: the compute grows by
    m x 4 P / B and only the last bucket's pre-divide, 4 P / B, is exposed (the earlier ones overlap the next
    micro-batch's forward): step(fsdp1) - step(generic) = (m + 1) x 4 P / B, P = all parameters one GPU holds,
    plus FSDP1's fixed cost per unit and micro-batch on the compute stream, L x m x 1.875 ms (the median per-layer
    gap between FSDP1 and YaFSDP at 4096-8192 tokens, yandex/YaFSDP README). m = 4, L = 2, P = 2 layers x 12.6M +
    the 8-token vocabulary's embedding."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2), training={"seq_len": 512, "global_batch": 16, "micro_batch": 2},
                simulation={"dp_bucket_size": "10 GB"})
    generic = make_scenario(**base, parallel={"dp": 2, "zero": 2})
    fsdp1 = make_scenario(**base, parallel={"dp": 2, "zero": 2, "zero_impl": "fsdp1"})
    n_all = 2 * layer_params_per_rank(generic.model, 1) + edge_params(generic.model, 1, 1, first=True, last=True)
    delta = simulate(fsdp1).step_time_s - simulate(generic).step_time_s
    assert delta == pytest.approx((4 + 1) * 4 * n_all / 1e12 + 2 * 4 * FSDP1_UNIT, rel=1e-6)
    # the report names that fixed part: L x m x 1.875 ms on the critical GPU, none without fsdp1
    assert simulate(fsdp1).framework_overhead_s == pytest.approx(2 * 4 * FSDP1_UNIT, rel=1e-12)
    assert simulate(generic).framework_overhead_s == 0.0


@pytest.mark.parametrize("fraction, warned", [(0.97, True), (0.90, False)])
def test_edge_of_memory_is_a_warning(tmp_path, fraction, warned):
    """A run that fits but uses more than 95% of the GPU's memory is warned about (allocator retries are not
    timed): the same scenario on a GPU whose memory is its peak / 0.97 warns, on one with peak / 0.90 not."""
    base = dict(model=gpt_model(layers=4), training={"seq_len": 512, "global_batch": 8, "micro_batch": 2})
    peak = simulate(make_scenario(**base)).peak_memory_bytes_max
    hw = hardware_variant(tmp_path, {"gpu.memory": f"{peak / fraction!r} B"}, name=f"mem{fraction}")
    r = simulate(make_scenario(hardware=hw, **base))
    assert r.fits_in_memory
    assert any("at the edge of memory" in w for w in r.warnings) is warned


def test_fsdp1_zero3_fp32_reduce_exposes_its_cast_at_micro_batch_boundaries(tmp_path):
    """ZeRO-3, fsdp1, bf16 weights reduced in fp32: per layer the concatenation costs c = 4n/B on the compute stream
    and the cast (2 + 4) and pre-divide (4 + 4) p = 14n/B ahead of each reduce-scatter on the DP stream. With a
    negligible network the layers' p hide behind the next layer's backward, but after the last layer the DP
    stream still runs p (layer 0) and p_e (the edge gradients) when the next micro-batch's first gather is queued
    behind them, where the generic step only ran the embedding backward e_b ((V h e + T h (2e + 8)) / B: PyTorch's
    dense table gradient and the tokens' fp32 partial sums, embedding_costs.embedding_backward_time). Per micro-batch:
    L c + p + p_e - e_b (the edge's own concatenation hides inside p), plus FSDP1's fixed cost per unit,
    L x 1.875 ms. m = 4, L = 2, T = 1024, h = 1024, B = 1 TB/s."""
    hw = hardware_variant(tmp_path, {"gpu.memory_bandwidth": "1 TB/s"}, name="hbm1")
    base = dict(hardware=hw, model=gpt_model(layers=2), training={"seq_len": 512, "global_batch": 16,
                "micro_batch": 2, "grad_dtype": "fp32"})
    generic = make_scenario(**base, parallel={"dp": 2, "zero": 3})
    fsdp1 = make_scenario(**base, parallel={"dp": 2, "zero": 3, "zero_impl": "fsdp1"})
    n = layer_params_per_rank(generic.model, 1)
    n_e = edge_params(generic.model, 1, 1, first=True, last=True)
    c, p, p_e, e_b = 4 * n / 1e12, 14 * n / 1e12, 14 * n_e / 1e12, (8 * 1024 * 2 + 1024 * 1024 * 12) / 1e12
    delta = simulate(fsdp1).step_time_s - simulate(generic).step_time_s
    assert delta == pytest.approx(4 * (2 * c + p + p_e - e_b + 2 * FSDP1_UNIT), rel=1e-6)


def test_fp32_gradients_double_the_all_reduce(tmp_path):
    """training.grad_dtype fp32 with bf16 weights reduces 4-byte gradients: with overlap off the exposed
    all-reduce is twice the 16-bit one, 2 x (all gradient bytes) / B on a ring of 2 (Thakur et al. 2005)."""
    s32, c, bw = _dp_scenario(tmp_path, ratio=0.5, overlap=False, grad_dtype="fp32")
    total16 = c.layers * c.grad_bytes_layer + c.grad_bytes_edge
    assert c.grad_bytes_layer == pytest.approx(2 * layer_params_per_rank(s32.model, 1))   # 2 bytes per weight
    assert simulate(s32).exposed_comm_s["dp"] == pytest.approx(2 * total16 / bw, rel=1e-3)


def test_fp32_gradients_leave_zero3_gathers_16bit():
    """FSDP with param_dtype bf16 and reduce_dtype fp32 gathers 2-byte weights and reduce-scatters 4-byte
    gradients (PyTorch MixedPrecision): per layer 2 n and 4 n bytes, the embedding gathered at 2 bytes too."""
    s = make_scenario(model=DP_MODEL, training={"seq_len": 512, "global_batch": 8, "grad_dtype": "fp32"},
                      parallel={"dp": 2, "zero": 3})
    c = build_plan(s).chunks[0]
    n, n_edge = layer_params_per_rank(s.model, 1), edge_params(s.model, 1, 1, first=True, last=True)
    assert (c.zero3_layer_bytes, c.grad_bytes_layer) == (2 * n, 4 * n)
    assert (c.zero3_edge_bytes, c.grad_bytes_edge) == (2 * n_edge, 4 * n_edge)


def test_overlap_slowdown_lasts_only_while_the_collective_runs(tmp_path):
    """Compute slows by f only while a collective runs (issue 6, overlap realism). In the last backward each
    layer's bucket all-reduce (t_ar = t_b / 2) overlaps the next layer's backward: that layer progresses
    t_ar / f during the all-reduce and finishes t_b - t_ar / f later, so it takes t_b + t_ar (1 - 1/f).
    L - 1 layers meet a bucket: step(f) - step(1) = (L - 1) t_ar (1 - 1/f). (Slowing the whole op would
    give (L - 1) t_b (f - 1), three times as much here.)"""
    f = 1.5
    base = dict(model=DP_MODEL, training={"seq_len": 512, "global_batch": 8}, parallel={"dp": 2})
    c = build_plan(make_scenario(**base)).chunks[0]
    t_b, bucket = c.bwd_layer, c.grad_bytes_layer
    t_ar = 0.5 * t_b
    steps = []
    for slowdown in (1, f):
        hw = hardware_variant(tmp_path, {"intra_node.bandwidth": f"{bucket / t_ar!r} B/s",
                                         "compute.overlap_slowdown": slowdown}, name=f"ov{slowdown}")
        s = make_scenario(hardware=hw, simulation={"dp_bucket_size": f"{bucket!r} B"}, **base)
        steps.append(simulate(s).step_time_s)
    assert steps[1] - steps[0] == pytest.approx((c.layers - 1) * t_ar * (1 - 1 / f), rel=1e-6)


def test_backward_prefetch_post_waits_for_each_gather(tmp_path):
    """ZeRO-3 backward, FSDP's BackwardPrefetch (torch/distributed/fsdp/api.py): "pre" gathers the next
    layer's weights while this layer's gradients are computed (hidden when the gather, even queued behind the
    previous layer's reduce-scatter, is shorter); "post" gathers them once this layer's gradients are done,
    before their reduce-scatter on the same stream, so every layer but the first waits one gather g:
    step(post) - step(pre) = (L - 1) g, with g = (S/2) / B on a ring of 2 (S = the layer's 16-bit weights)."""
    base = dict(model=DP_MODEL, training={"seq_len": 512, "global_batch": 2}, parallel={"dp": 2, "zero": 3})
    c = build_plan(make_scenario(**base)).chunks[0]
    g = 0.1 * c.bwd_layer
    bandwidth = c.zero3_layer_bytes / 2 / g          # a ring of 2 moves S/2 per flow: time (S/2) / B = g
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": f"{bandwidth!r} B/s"}, name="z3")
    steps = {}
    for mode in ("pre", "post"):
        s = make_scenario(hardware=hw, **{**base, "parallel": {**base["parallel"], "backward_prefetch": mode}})
        steps[mode] = simulate(s).step_time_s
    assert c.grad_bytes_layer == c.zero3_layer_bytes
    assert steps["post"] - steps["pre"] == pytest.approx((c.layers - 1) * g, rel=1e-6)


# --- monotonicity and determinism ------------------------------------------------------------------

LAYOUTS = [
    {"dp": 2, "tp": 2, "pp": 2},
    {"dp": 4, "tp": 2, "pp": 1, "zero": 1},
    {"dp": 2, "tp": 1, "pp": 4},
    {"dp": 4, "tp": 1, "pp": 2, "zero": 3},
    {"dp": 1, "tp": 2, "pp": 4, "vpp": 2, "schedule": "interleaved-1f1b"},
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_more_bandwidth_never_slower(tmp_path, layout):
    """Raising every link's bandwidth never makes a step slower."""
    times = []
    for scale in (0.25, 1, 4, 16):
        hw = hardware_variant(tmp_path, {"intra_node.bandwidth": f"{100 * scale} GB/s",
                                         "inter_node.nic_bandwidth": f"{25 * scale} GB/s"},
                              base=DATA / "core_two_nodes.yaml", name=f"bw{scale}")
        s = make_scenario(hardware=hw, nodes=None, model=gpt_model(layers=8, vocab=1024),
                          training={"seq_len": 1024, "global_batch": 16}, parallel=layout)
        times.append(simulate(s).step_time_s)
    assert all(a >= b * (1 - 1e-12) for a, b in zip(times, times[1:])), times
    assert times[0] > times[-1]   # the layouts do communicate


def test_same_input_same_json():
    """Two runs of the same scenario give byte-identical JSON reports."""
    s = load_scenario(PP4_DP4)
    assert dumps_json(simulate(s).to_dict()) == dumps_json(simulate(load_scenario(PP4_DP4)).to_dict())


def test_json_independent_of_hash_seed():
    """The JSON report does not depend on PYTHONHASHSEED (separate interpreters)."""
    code = ("import sys; from simtrain.report.outputs import dumps_json; "
            "from simtrain.spec.scenario import load_scenario; "
            "from simtrain.engine.simulation import simulate; "
            "sys.stdout.write(dumps_json(simulate(load_scenario(sys.argv[1])).to_dict()))")
    outs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", code, str(PP4_DP4)], capture_output=True, text=True, env=env,
                              check=True, timeout=60)
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and outs[0]


# --- the reference article's measurement -----------------------------------------------------------

@pytest.mark.parametrize(("global_batch", "m"), [(16, 4), (64, 16)])
def test_pp4_dp4_utilization_matches_the_article(global_batch, m):
    """Reference article rule 15: PP=4 x DP=4 idles (p-1)/(m+p-1) = 3/7 with 4 micro-batches, 3/19 with 16.

    The ideal utilization m/(m+p-1) (57.1%, 84.2%) assumes uniform stages and free communication;
    on DGX H100 the last stage also runs the 32000-word output layer and loss, and pipeline sends,
    the DP gradient sync and the optimizer step take time, all of which only lower utilization.
    So the mean utilization must lie within 5 points below the ideal, and not above it.
    """
    s = load_scenario(PP4_DP4, {"training.global_batch": global_batch})
    assert s.microbatches == m
    r = simulate(s)
    mean_util = sum(d.compute_utilization for d in r.devices) / len(r.devices)
    ideal = m / (m + 4 - 1)
    assert ideal - 0.05 <= mean_util <= ideal + 0.005


# --- MFU -------------------------------------------------------------------------------------------

def test_mfu_follows_narayanan_equation_3():
    """MFU = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) / (step x GPUs x peak): Narayanan et al. 2021 Eq. 3
    without the recompute pass (the 13h bias/norm terms, 0.1% at h = 1024, are inside the tolerance)."""
    l, h, V, seq, gb = 8, 1024, 512, 1024, 16
    s = make_scenario(model=gpt_model(layers=l, hidden=h, vocab=V), training={"seq_len": seq, "global_batch": gb},
                      parallel={"dp": 2, "pp": 2})
    r = simulate(s)
    flops = 72 * gb * seq * l * h * h * (1 + seq / (6 * h) + V / (12 * l * h))
    assert r.mfu == pytest.approx(flops / (r.step_time_s * 4 * 1000e12), rel=2e-3)


def test_hfu_with_full_recompute_follows_equation_3():
    """With full recompute, HFU counts the extra forward: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (Narayanan Eq. 3)."""
    l, h, V, seq, gb = 8, 1024, 512, 1024, 16
    s = make_scenario(model=gpt_model(layers=l, hidden=h, vocab=V), training={"seq_len": seq, "global_batch": gb,
                                                                              "recompute": "full"},
                      parallel={"dp": 2, "pp": 2})
    r = simulate(s)
    flops = 96 * gb * seq * l * h * h * (1 + seq / (6 * h) + V / (16 * l * h))
    assert r.hfu == pytest.approx(flops / (r.step_time_s * 4 * 1000e12), rel=2e-3)


def test_hfu_never_below_mfu():
    """HFU counts every executed FLOP, MFU only the model's: HFU >= MFU (Chowdhery et al. 2022, App. B)."""
    r = simulate(load_scenario(PP4_DP4))
    assert r.hfu >= r.mfu


# --- the report and the command --------------------------------------------------------------------

def test_report_has_every_public_key():
    """The JSON report has the keys issue 3 lists, per device too."""
    d = simulate(load_scenario(PP4_DP4)).to_dict()
    for key in ("scenario", "gpus", "microbatches", "step_time_s", "tokens_per_s", "mfu", "hfu", "bubble_fraction",
                "exposed_comm_s", "fits_in_memory", "peak_memory_bytes_max", "devices"):
        assert key in d, key
    assert set(d["exposed_comm_s"]) >= {"tp", "pp", "dp"}
    assert len(d["devices"]) == d["gpus"] == 16
    for dev in d["devices"]:
        for key in ("rank", "node", "dp", "tp", "pp", "peak_memory_bytes", "memory", "busy_s",
                    "compute_utilization"):
            assert key in dev, key
        assert set(dev["memory"]) == {"params", "grads", "optimizer", "activations", "other"}
        assert set(dev["busy_s"]) >= {"compute", "tp", "pp", "dp"}
    tokens = 64 * 4096
    assert d["tokens_per_s"] == pytest.approx(tokens / d["step_time_s"], rel=1e-6)


@pytest.mark.parametrize("overrides", [{}, {"parallel.schedule": "gpipe", "training.global_batch": 16},
                                       {"parallel.schedule": "interleaved-1f1b", "parallel.vpp": 2}])
def test_timeline_memory_agrees_with_memory_command(overrides):
    """Each device's peak from the simulated timeline equals the `simtrain memory` ledger."""
    s = load_scenario(PP4_DP4, overrides)
    sim, ledger = simulate(s), memory(s)
    assert sim.peak_memory_bytes_max == pytest.approx(ledger.peak_memory_bytes_max, rel=1e-9)
    for a, b in zip(sim.devices, ledger.devices):
        assert a.rank == b.rank
        assert a.memory == pytest.approx(b.memory, rel=1e-9)


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_scenario_runs(path):
    """Every scenario in scenarios/ loads and simulates to a positive step time."""
    r = simulate(load_scenario(path))
    assert r.step_time_s > 0 and r.gpus == load_scenario(path).gpus


def test_run_command_writes_json(tmp_path, simtrain_exe):
    """`simtrain run scenarios/pp4_dp4.yaml --json out.json` exits 0 and writes the report."""
    out = tmp_path / "out.json"
    proc = subprocess.run([*simtrain_exe, "run", str(PP4_DP4), "--json", str(out)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(out.read_text())
    assert d["scenario"] == "pp4_dp4" and d["gpus"] == 16 and d["step_time_s"] > 0
    assert "step time" in proc.stdout


def test_run_command_set_overrides(tmp_path, simtrain_exe):
    """--set parallel.pp=8 (with parallel.dp=2 to keep 16 GPUs) re-lays the scenario out."""
    out = tmp_path / "out.json"
    proc = subprocess.run([*simtrain_exe, "run", str(PP4_DP4), "--set", "parallel.pp=8", "--set", "parallel.dp=2",
                           "--json", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(out.read_text())
    assert d["config"]["parallel"]["pp"] == 8 and d["config"]["parallel"]["dp"] == 2
    assert d["microbatches"] == 64 // 2
    assert sorted({dev["pp"] for dev in d["devices"]}) == list(range(8))
