"""A chunk's per-layer figures (plan.build.ChunkPlan): its dense leading layers keep their own costs whether or not
they are recomputed (a partial recompute may stop inside them)."""

from __future__ import annotations

from simtrain.plan.chunk import ChunkPlan


def _chunk(recompute_count: int) -> ChunkPlan:
    return ChunkPlan(vstage=0, rank=0, chunk=0, layer_lo=0, layers=4, has_embedding=False, has_head=False,
                     fwd_layer=10.0, bwd_layer=20.0, recompute_layer=10.0, tp_fwd_layer=0.0, tp_bwd_layer=0.0,
                     embed_fwd=0.0, embed_bwd=0.0, head_fwd=0.0, head_bwd=0.0, act_bytes=0.0, grad_bytes_layer=8.0,
                     grad_bytes_edge=0.0, zero3_layer_bytes=0.0, ep_fwd_layer=3.0, ep_bwd_layer=6.0, lead_layers=2,
                     lead_fwd=1.0, lead_bwd=2.0, lead_recompute=1.0, lead_grad_bytes=4.0,
                     recompute_count=recompute_count,
                     wgrad_layer=9.0, lead_wgrad=0.9)


def test_a_dense_leading_layer_not_recomputed_keeps_its_own_costs():
    """Rule: layer 1 of a chunk with two dense leading layers and recompute_count 1 is dense (1, 2 s, no all-to-all,
    4 gradient bytes) and not recomputed (0 s); layer 0 is recomputed (1 s); MoE layer 2 is not (0 s)."""
    c = _chunk(recompute_count=1)
    assert c.layer_costs(0) == (1.0, 2.0, 1.0, 0.0, 0.0, 4.0)
    assert c.layer_costs(1) == (1.0, 2.0, 0.0, 0.0, 0.0, 4.0)
    assert c.layer_costs(2) == (10.0, 20.0, 0.0, 3.0, 6.0, 8.0)
    assert [c.layer_wgrad(i) for i in range(4)] == [0.9, 0.9, 9.0, 9.0]
    assert c.grad_bytes_layers == 4.0 + 4.0 + 8.0 + 8.0


def test_every_layer_recomputed_by_default():
    """Rule: recompute_count -1 recomputes every layer, each with its own kind's recompute time."""
    c = _chunk(recompute_count=-1)
    assert [c.layer_costs(i)[2] for i in range(4)] == [1.0, 1.0, 10.0, 10.0]


def test_partial_recompute_of_every_layer_under_dualpipe_keeps_what_full_recompute_keeps():
    """Rule: DualPipe holds two chunks per rank (its model stage and the mirror's), each of L / p layers; recomputing
    recompute_layers = L / p of each chunk is recomputing every layer, so the ledger keeps what full recompute keeps
    (the chunk's layers were looked up by virtual stage, past the model stages' list: IndexError)."""
    from conftest import gpt_model, make_scenario

    from simtrain.plan.memory import memory_report

    sc = make_scenario(model=gpt_model(layers=8), nodes=1, gpus_per_node=4,
                       training={"global_batch": 16, "recompute": "full"},
                       parallel={"pp": 4, "schedule": "dualpipe"})
    every = memory_report(sc).stages
    partial = memory_report(sc.with_overrides({"training.recompute_layers": 2})).stages
    assert [st.activations for st in partial] == [st.activations for st in every]
    fewer = memory_report(sc.with_overrides({"training.recompute_layers": 1})).stages
    assert all(f.activations > e.activations for f, e in zip(fewer, every))
