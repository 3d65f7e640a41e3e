"""The gradient collectives between the DP reduction and the optimizer step (``simtrain.plan.grad_finalize``), read
from NVIDIA/Megatron-LM ``finalize_model_grads`` @d98e8a6 (and ``train_step`` @de7dc40f) and nanotron's
``sync_tied_weights_gradients`` @67c5ebb6:

- a tied word embedding at pp > 1: the first and the last pipeline rank all-reduce its gradient, vocab / tp x h
  elements (a two-rank ring all-reduce moves the whole tensor each way once);
- under sequence parallelism, the TP group sums the gradients of the weights each TP rank holds whole (layer norms,
  row-parallel biases, the router), and the query/key norms' at any tp > 1: one all-reduce.

Hand calculations on ``core_ideal.yaml`` (efficiency 1, zero latency, memory time nil) with NVLink set to 100 GB/s
per GPU and direction; 16-bit gradients (2 bytes).
"""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.decide.estimate import estimate
from simtrain.engine.simulation import simulate
from simtrain.plan.build import build_plan

H, V = 1024, 32768
LINK = 100e9


def _scenario(tmp_path, *, tied=True, pp=4, tp=1, sp=False, schedule="1f1b", vpp=1, zero=0, dp=1, **model):
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s"})
    return make_scenario(hardware=hw, model=gpt_model(layers=8, hidden=H, vocab=V, tied_embeddings=tied, **model),
                         training={"seq_len": 512, "global_batch": 8 * dp, "micro_batch": 1},
                         parallel={"pp": pp, "tp": tp, "dp": dp, "vpp": vpp, "schedule": schedule, "zero": zero,
                                   "sequence_parallel": sp})


def _records(result, kind):
    return [r for r in result.timeline.records if r[2] == kind]


def test_first_and_last_stage_sum_the_tied_embedding_gradient(tmp_path):
    """V x h x 2 bytes = 67,108,864 B each way between ranks 0 and 3 at 100 GB/s: 671.1 us; the middle ranks run
    none; each end's optimizer step waits for it."""
    result = simulate(_scenario(tmp_path))
    nbytes = V * H * 2
    sums = _records(result, "embedding_grad_sum")
    lanes = {lane.index: lane for lane in result.timeline.lanes}
    assert sorted(lanes[r[0]].rank for r in sums) == [0, 3]
    for r in sums:
        assert r[9] == nbytes
        assert r[4] - r[3] == pytest.approx(nbytes / LINK, rel=1e-9)
        assert lanes[r[0]].end >= r[4]


def test_the_tied_sum_lengthens_the_step_by_its_transfer(tmp_path):
    """Rank 0 ends the 1F1B step last (its last backward is the step's last); the sum adds its transfer to it,
    671.1 us, in the simulation and in the analytic estimate alike."""
    t = V * H * 2 / LINK
    tied, untied = _scenario(tmp_path), _scenario(tmp_path, tied=False)
    assert simulate(tied).step_time_s - simulate(untied).step_time_s == pytest.approx(t, rel=1e-6)
    assert estimate(tied).step_time_s - estimate(untied).step_time_s == pytest.approx(t, rel=1e-6)


@pytest.mark.parametrize("case", [dict(tied=False), dict(pp=1), dict(schedule="dualpipe")])
def test_no_tied_sum_without_two_ends(tmp_path, case):
    """Untied weights, one stage (the embedding and the output layer are one tensor), or DualPipe (whose mirror
    sum adds the copies on the ranks that hold both ends): nothing runs."""
    assert not _records(simulate(_scenario(tmp_path, **case)), "embedding_grad_sum")


def test_interleaved_stages_sum_between_the_first_and_last_rank(tmp_path):
    """With 2 virtual stages per rank the embedding is on rank 0's first chunk, the output layer on rank 3's last:
    still ranks 0 and 3, the same bytes."""
    plan = build_plan(_scenario(tmp_path, vpp=2, schedule="interleaved-1f1b"))
    assert plan.tied_grad_bytes == (V * H * 2, 0.0, 0.0, V * H * 2)


def test_tp_and_zero3_shard_the_tied_gradient(tmp_path):
    """Each TP rank sums its vocabulary shard (V / 2 x h); under ZeRO-3 each DP rank its 1 / dp of it."""
    assert build_plan(_scenario(tmp_path, tp=2)).tied_grad_bytes[0] == V // 2 * H * 2
    assert build_plan(_scenario(tmp_path, zero=3, dp=2)).tied_grad_bytes[-1] == V * H * 2 / 2


def test_sequence_parallel_sums_the_norms_gradients_over_tp(tmp_path):
    """GPT layers with LayerNorm (weight and bias, 2h each) and no biases elsewhere: 2 norms x 2h = 4h elements a
    layer, 2 layers a stage, the last stage adds the final norm (2h): 8h and 10h elements x 2 bytes, one all-reduce
    over 2 GPUs, 2 (n - 1) / n x bytes / 100 GB/s."""
    plan = build_plan(_scenario(tmp_path, tied=False, tp=2, sp=True))
    ar = lambda elements: 2 * (2 - 1) / 2 * elements * 2 / LINK  # noqa: E731
    assert [t for t, _ in plan.replicated_grad_tp] == pytest.approx([ar(8 * H)] * 3 + [ar(10 * H)], rel=1e-9)
    assert [b for _, b in plan.replicated_grad_tp] == [8 * H * 2] * 3 + [10 * H * 2]
    result = simulate(_scenario(tmp_path, tied=False, tp=2, sp=True))
    recs = _records(result, "tp_grad_all_reduce")
    assert len(recs) == 4
    assert max(r[4] - r[3] for r in recs) == pytest.approx(ar(10 * H), rel=1e-9)


def test_without_sequence_parallelism_only_qk_norms_are_summed(tmp_path):
    """Without sequence parallelism each TP rank sees every token: norms need no sum, nothing runs; query/key norms
    (head_dim 64 each, 2 a layer) are summed at any tp > 1: 2 layers x 128 elements x 2 bytes."""
    assert build_plan(_scenario(tmp_path, tied=False, tp=2)).replicated_grad_tp == ((0.0, 0.0),) * 4
    plan = build_plan(_scenario(tmp_path, tied=False, tp=2, qk_norm=True))
    assert plan.replicated_grad_tp[1][0] == pytest.approx(2 * (2 - 1) / 2 * 2 * 128 * 2 / LINK, rel=1e-9)
    assert build_plan(_scenario(tmp_path, tied=False, tp=1, pp=4, sp=False)).replicated_grad_tp == ((0.0, 0.0),) * 4


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_a_v_shaped_layout_holds_both_ends_on_rank_0(tmp_path, schedule):
    """zb-v and dualpipev place virtual stages 0 and 2 pp - 1 on rank 0 (ranks 0 1 2 3 3 2 1 0): the embedding and
    its copy are one rank's, nothing crosses the pipeline."""
    plan = build_plan(_scenario(tmp_path, schedule=schedule, vpp=2))
    assert plan.layout.rank[0] == plan.layout.rank[-1] == 0
    assert plan.tied_grad_bytes == (0.0,) * 4
    assert not _records(simulate(_scenario(tmp_path, schedule=schedule, vpp=2)), "embedding_grad_sum")


def test_the_tied_sum_is_gradient_synchronisation_time(tmp_path):
    """Reported with the step's gradient synchronisation: the end rank's exposed DP time grows by the transfer,
    its exposed PP time (pipeline sends) does not."""
    tied = simulate(_scenario(tmp_path))
    untied = simulate(_scenario(tmp_path, tied=False))
    t = V * H * 2 / LINK
    assert tied.stages[0].exposed_comm_s["dp"] - untied.stages[0].exposed_comm_s["dp"] == pytest.approx(t, rel=1e-6)
    assert tied.stages[0].exposed_comm_s["pp"] == pytest.approx(untied.stages[0].exposed_comm_s["pp"], abs=1e-12)


def test_an_untied_model_with_mtp_sums_its_embedding_copy(tmp_path):
    """Megatron keeps a copy of the embedding on the last stage for the multi-token-prediction module's own lookup,
    tied or not (``share_embeddings_and_output_weights or mtp_num_layers``): V x h x 2 bytes between ranks 0 and 3;
    the last stage's ledger holds the copy beside its output layer (2 V h of edge weights, + the final norm)."""
    from simtrain.plan.memory import edge_params

    plan = build_plan(_scenario(tmp_path, tied=False, mtp_layers=1))
    assert plan.tied_grad_bytes == (V * H * 2, 0.0, 0.0, V * H * 2)
    m = plan.scenario.model
    assert edge_params(m, 1, 4, first=False, last=True) == 2 * V * H + m.norm_params
    assert edge_params(m, 1, 1, first=True, last=True) == 2 * V * H + m.norm_params   # pp 1: the lookup's own table
    assert build_plan(_scenario(tmp_path, tied=False, mtp_layers=1, pp=1)).tied_grad_bytes == (0.0,)
    assert simulate(_scenario(tmp_path, tied=False, mtp_layers=1)).step_time_s > 0   # a dense model's MTP layer runs


def test_latent_attention_sums_its_duplicated_down_projections(tmp_path):
    """Multi-head latent attention's down projections are duplicated over the TP group (TELinear parallel_mode
    'duplicated', marked sequence_parallel) as are its latents' norms: under sequence parallelism one MLA layer adds
    h x (256 + 128 + 64) + 256 + 128 elements to its two norms (2 x 2h, LayerNorm) and its router (4 x h)."""
    from simtrain.plan.grad_finalize import replicated_grad_elements

    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s"})
    model = {"layers": 1, "hidden": H, "heads": 16, "ffn_hidden": 4096, "vocab": 8,
             "attention": {"kind": "mla", "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
                           "qk_rope_head_dim": 64, "v_head_dim": 64},
             "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512}}
    s = make_scenario(hardware=hw, nodes=1, gpus_per_node=2, model=model,
                      training={"seq_len": 512, "global_batch": 1, "micro_batch": 1},
                      parallel={"tp": 2, "ep": 1, "etp": 1, "sequence_parallel": True})
    assert replicated_grad_elements(s.model, [0], False, True) == \
        2 * 2 * H + 4 * H + H * (256 + 128 + 64) + 256 + 128


def test_a_degraded_link_slows_both_ends_of_the_sum_alike_in_every_fidelity(tmp_path):
    """Rank 0's GPU link to its NVSwitch at 1/4 (25 GB/s): the sum's flow out of rank 0 takes 4 x 671.1 us, and a
    two-rank ring all-reduce ends for both ends with its slower direction: the tied step is 4 x 671.1 us longer than
    the untied one on the same degraded node (rank 0 ends the step last), and folded (symmetry classes) and full
    fidelity agree."""
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s"})
    slow = {"degraded_links": [{"a": "gpu0", "b": "nvsw0", "factor": 0.25}]}

    def run(tied, fidelity=None):
        sc = make_scenario(hardware=hw, model=gpt_model(layers=8, hidden=H, vocab=V, tied_embeddings=tied),
                           training={"seq_len": 512, "global_batch": 8, "micro_batch": 1}, parallel={"pp": 4},
                           simulation=slow)
        return simulate(sc, fidelity=fidelity)

    t = V * H * 2 / LINK
    tied, untied = run(True), run(False)
    flows = _records(tied, "embedding_grad_sum")
    assert max(r[4] - r[3] for r in flows) == pytest.approx(4 * t, rel=1e-6)
    done = max(r[4] for r in flows)   # the fast end (rank 3) starts its optimizer step only then
    assert all(r[3] >= done - 1e-12 for r in _records(tied, "optimizer") if r[0] in {f[0] for f in flows})
    assert tied.step_time_s - untied.step_time_s == pytest.approx(4 * t, rel=1e-6)
    assert run(True, "full").step_time_s == pytest.approx(tied.step_time_s, rel=1e-12)
