"""Activation offloading (training.activation_offload_layers): Transformer Engine's double-buffered group offload
as Megatron-Core's --cpu-offloading runs it; copy windows, waits, the memory ledger and host memory.

Expected values are hand calculations written here: the layer windows from TE's layer_window_map rule, the waits of
two copy streams traced by hand, and Korthikanti's 34 sbh per GPT layer (flash attention, dropout masks).
"""

from __future__ import annotations

import pytest
from conftest import REPO, gpt_model, hardware_variant, make_scenario

from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan
from simtrain.plan.memory import stage_memory
from simtrain.plan.offload import layer_windows, offload_stalls
from simtrain.spec.errors import InputError

S, H = 512, 1024
LAYER = 34 * S * H            # bytes one GPT layer keeps (Korthikanti Sec. 4.1, flash attention)
BW = 10e9                     # host link of the test node variant, bytes/s per direction
MB = 4


def _hw(tmp_path, **extra):
    changes = {"inter_node.pcie_bandwidth": {"value": "10 GB/s", "source": "test"}, **extra}
    return hardware_variant(tmp_path, changes)


def _sc(hw, n, **parallel):
    return make_scenario(hardware=hw, model=gpt_model(layers=8), training={"seq_len": S, "global_batch": MB,
                                                                           "activation_offload_layers": n},
                         parallel=parallel)


def test_layer_windows_follow_transformer_engines_rule():
    """Group g's deadline is (L // N)(g + 1) - 1, the first L % N windows one layer longer (cumulatively)."""
    assert layer_windows(32, 4) == [7, 15, 23, 31]
    assert layer_windows(10, 3) == [3, 6, 9]        # 10 // 3 = 3, one extra layer from group 0 on
    assert layer_windows(4, 3) == [1, 2, 3]


def test_forward_waits_at_the_window_for_every_queued_copy():
    """8 layers of 1 s, two 3 s copies: copy 0 runs 1-4, copy 1 4-7; at layer 3's end (4 s) the compute waits 3 s."""
    f_wait, b_wait = offload_stalls([1.0] * 8, [2.0] * 8, 3.0, 2)
    assert f_wait == [0, 0, 0, 3.0, 0, 0, 0, 0]
    assert b_wait == [0.0] * 8                      # reloads hide under 2 s backwards


def test_backward_waits_for_reloads():
    """Backwards of 0.5 s: reload 1 issued before layer 7 (0-3), layer 3 waits for it (2 -> 3 s) and issues reload 0
    (3-6); layer 0 waits from 4.5 s to 6 s."""
    _f, b_wait = offload_stalls([1.0] * 8, [0.5] * 8, 3.0, 2)
    assert b_wait == [1.5, 0, 0, 1.0, 0, 0, 0, 0]


def test_offloaded_layers_leave_the_gpu_but_two_buffers(tmp_path):
    """4 of 8 layers offloaded: 4 - 2 (double buffer) layers of 34 sbh leave the GPU; 4 layers sit in host memory."""
    hw = _hw(tmp_path)
    base, off = stage_memory(_sc(hw, 0), 0), stage_memory(_sc(hw, 4), 0)
    assert base.activation_per_microbatch - off.activation_per_microbatch == pytest.approx(2 * LAYER, rel=1e-12)
    assert off.host_bytes == pytest.approx(4 * LAYER, rel=1e-12)


def test_exposed_copy_time_lengthens_the_step(tmp_path):
    """2 of 8 layers, copy c = 34 sbh / 10 GB/s far longer than a layer (f forward, b backward): per micro-batch the
    forward waits 2c - 3f at layer 3 and the backward c - 4b before layer 3 and c - 3b before layer 0."""
    hw = _hw(tmp_path)
    c = LAYER / BW
    chunk = build_plan(_sc(hw, 0)).chunks[0]
    f, b = chunk.fwd_layer + chunk.tp_fwd_layer, chunk.bwd_layer + chunk.tp_bwd_layer
    waits = (2 * c - 3 * f) + (c - 4 * b) + (c - 3 * b)
    base, off = simulate(_sc(hw, 0)), simulate(_sc(hw, 2))
    assert off.step_time_s - base.step_time_s == pytest.approx(MB * waits, rel=1e-6)
    assert off.stages[0].exposed_comm_s["offload"] == pytest.approx(MB * waits, rel=1e-6)
    assert "offload" not in base.stages[0].exposed_comm_s


def _copies(run, kind):
    """(start, end, micro-batch, layer) of the trace's copies of one kind, in time order."""
    return sorted((r[3], r[4], r[5], r[7]) for r in run.timeline.records if r[1] == "offload" and r[2] == kind)


def test_copies_are_the_offload_lanes_busy_time(tmp_path):
    """2 of 8 layers: each micro-batch copies 2 layers out and 2 back, c = 34 sbh / 10 GB/s each, so the device's
    offload lane is busy 4c per micro-batch, drawn as 2 offload_d2h and 2 offload_h2d copies of c each."""
    c = LAYER / BW
    run = simulate(_sc(_hw(tmp_path), 2))
    assert run.devices[0].busy_s["offload"] == pytest.approx(MB * 4 * c, rel=1e-9)
    for kind in ("offload_d2h", "offload_h2d"):
        copies = _copies(run, kind)
        assert len(copies) == MB * 2
        assert all(end - start == pytest.approx(c, rel=1e-9) for start, end, _mb, _layer in copies)


def test_copies_queue_on_their_stream(tmp_path):
    """c longer than a layer's forward and backward: layer 1 leaves when layer 0's copy ends (one copy stream);
    group 1 comes back first (before layer 7's backward) and group 0's reload starts when it is back (the handler
    waits for the reloads so far before issuing the next)."""
    run = simulate(_sc(_hw(tmp_path), 2))
    out = [x for x in _copies(run, "offload_d2h") if x[2] == 0]
    back = [x for x in _copies(run, "offload_h2d") if x[2] == 0]
    assert [x[3] for x in out] == [0, 1] and out[1][0] == pytest.approx(out[0][1], rel=1e-12)
    assert [x[3] for x in back] == [1, 0] and back[1][0] == pytest.approx(back[0][1], rel=1e-12)


def test_trace_draws_the_copies_on_the_host_offload_row(tmp_path):
    """The trace's 'host offload' thread holds each micro-batch's copies in the handler's order: layers 0 and 1 out,
    then layer 1's group and layer 0's back (4 per micro-batch)."""
    from simtrain.report.trace import trace_events

    events = trace_events(simulate(_sc(_hw(tmp_path), 2)))["traceEvents"]
    tid = next(e["tid"] for e in events if e.get("ph") == "M" and e["args"].get("name") == "host offload")
    copies = [(e["name"], e["args"]["layers"]) for e in sorted(
        (e for e in events if e.get("ph") == "X" and e["tid"] == tid), key=lambda e: e["ts"])]
    assert copies[:4] == [("offload_d2h mb0", "0"), ("offload_d2h mb0", "1"), ("offload_h2d mb0", "1"),
                          ("offload_h2d mb0", "0")]
    assert len(copies) == MB * 4


def test_bucketed_backward_counts_its_waits(tmp_path):
    """dp 2 with DP overlap (the last micro-batch's backward sends its gradients in buckets as its layers finish):
    the offload waits are exposed as with dp 1, 2c - 3f + c - 4b + c - 3b per micro-batch (the test node's DP
    communication is negligible)."""
    hw = _hw(tmp_path)
    c = LAYER / BW
    chunk = build_plan(_sc(hw, 0)).chunks[0]
    f, b = chunk.fwd_layer + chunk.tp_fwd_layer, chunk.bwd_layer + chunk.tp_bwd_layer
    waits = (2 * c - 3 * f) + (c - 4 * b) + (c - 3 * b)
    sc = make_scenario(hardware=hw, model=gpt_model(layers=8), training={
        "seq_len": S, "global_batch": 2 * MB, "activation_offload_layers": 2}, parallel={"dp": 2})
    assert simulate(sc).exposed_comm_s["offload"] == pytest.approx(MB * waits, rel=1e-6)


def test_host_memory_overflow_does_not_fit(tmp_path):
    """A node whose host memory is smaller than its GPUs' offloaded activations does not fit, with the figures."""
    hw = _hw(tmp_path, host_memory={"value": "10 MB", "source": "test"})
    run = simulate(_sc(hw, 4))
    assert not run.fits_in_memory
    node = 4 * LAYER * 1 / 1e9    # one GPU on the node
    assert any(w == f"does not fit: offloaded activations {node:.1f} GB > 0.0 GB of host memory per node"
               for w in run.warnings)


def test_offload_rules_follow_megatron(tmp_path):
    """No host link, N >= layers, pp > 1, recompute: bad input naming the key (Megatron-Core's asserts)."""
    with pytest.raises(InputError, match=r"activation_offload_layers: 1 needs the GPUs' host link"):
        make_scenario(model=gpt_model(layers=8), training={"seq_len": S, "global_batch": MB,
                                                           "activation_offload_layers": 1})
    hw = _hw(tmp_path)
    with pytest.raises(InputError, match=r"not fewer than the model's 8 layers"):
        _sc(hw, 8)
    with pytest.raises(InputError, match=r"no support for Pipeline parallelism"):
        _sc(hw, 2, pp=2)
    with pytest.raises(InputError, match=r"does not work when activation recomputation is enabled"):
        make_scenario(hardware=hw, model=gpt_model(layers=8), training={
            "seq_len": S, "global_batch": MB, "activation_offload_layers": 2, "recompute": "selective"})


def test_memory_advice_names_the_fewest_offloaded_layers_that_fit():
    """Llama-3-8B at 8k tokens on DGX H100 (dp 8, ZeRO-1) does not fit; the offload tip comes first and names the
    N with which it fits while N - 1 does not."""
    import re

    from simtrain.plan.advice import advice
    from simtrain.plan.memory import memory_report
    from simtrain.spec.scenario import scenario_from_dict

    def sc(n):
        return scenario_from_dict({"hardware": "dgx-h100", "nodes": 1, "model": "llama3-8b", "parallel": {
            "dp": 8, "zero": 1}, "training": {"seq_len": 8192, "global_batch": 16, "activation_offload_layers": n}})

    rep = memory_report(sc(0))
    tips = advice(sc(0), rep)
    n = int(re.search(r"activation_offload_layers: (\d+)", tips[0]).group(1))
    assert stage_memory(sc(n), 0).total <= rep.capacity < stage_memory(sc(n - 1), 0).total


def test_a_run_that_does_not_fit_gets_no_edge_of_memory_warning():
    """'does not fit' and 'at the edge of memory' exclude each other (pp4_dp4 at micro-batch 4: 153.6 GB on an
    85.5 GB GPU is not at its edge)."""
    from simtrain.engine.simulation import simulate
    from simtrain.spec.scenario import load_scenario

    r = simulate(load_scenario(REPO / "scenarios" / "pp4_dp4.yaml", {"training.micro_batch": 4}))
    assert not r.fits_in_memory
    assert any(w.startswith("does not fit") for w in r.warnings)
    assert not any("edge of memory" in w for w in r.warnings)


@pytest.mark.parametrize("parallel", [{"dp": 8, "zero": 3}, {"dp": 8, "zero": 2}])
def test_the_offload_tip_is_never_a_setting_the_rules_refuse(parallel):
    """simtrain memory's offload tip is given only where the rules take activation_offload_layers (not with ZeRO-3);
    following the tip (27 layers with ZeRO-2) is accepted. Llama-3-8B, 8,192 tokens, micro-batch 2, one DGX H100."""
    from simtrain.plan.advice import advice
    from simtrain.plan.memory import memory_report

    sc = make_scenario(hardware="dgx-h100", nodes=1, model="llama3-8b",
                       training={"seq_len": 8192, "global_batch": 16, "micro_batch": 2}, parallel=parallel)
    tips = [t for t in advice(sc, memory_report(sc)) if "activation_offload_layers" in t]
    if parallel["zero"] >= 3:
        assert tips == []
    else:
        n = int(tips[0].split("activation_offload_layers: ")[1].split(")")[0])
        make_scenario(hardware="dgx-h100", nodes=1, model="llama3-8b",
                      training={"seq_len": 8192, "global_batch": 16, "micro_batch": 2,
                                "activation_offload_layers": n}, parallel=parallel)
