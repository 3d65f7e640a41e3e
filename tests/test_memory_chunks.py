"""Rule: a pipeline rank of several chunks keeps each chunk's own bytes, played from its schedule. The output layer's
input and the loss's kept tensors sit on the last model stage's chunk, which under interleaved 1F1B runs each
forward just before its backward (one micro-batch held), and chunks of different layer counts hold their own layers.
Found by an audit (eighteenth session): the ledger multiplied the edges by the rank's mean in-flight count and, for
uneven chunks, `simtrain memory` and `simtrain run` disagreed by 27%. Expected values are hand calculations."""

from __future__ import annotations

import pytest
from conftest import make_scenario

import simtrain
from simtrain.engine.simulation import memory, simulate
from simtrain.plan.memory import stage_memory

S, H, V = 4096, 4096, 32000     # the toy model below: sequence, hidden, vocabulary
LAYER = 32 * S * H               # Korthikanti's 34 sbh per layer less the two 1-byte dropout masks (no dropout)
LAST_EDGE = 4 * S * H + 4 * S * V   # final norm / output-layer input (bf16, 2 x 2sbh) + the fp32 log-softmax (4sbV)
LOSS_PEAK = 8 * S * V            # the loss's own short-lived peak on the last stage (docs/model.md §3.5)


def _uneven():
    """p 4, v 2, m 8; layers_per_stage [0, 4, 4, 4, 4, 4, 4, 0]: rank 3 holds model stage 3 (4 layers, chunk 0)
    and stage 7 (the output layer alone, chunk 1); rank 0 stage 0 (the embedding alone) and stage 4 (4 layers)."""
    return make_scenario(
        model={"layers": 24, "hidden": H, "heads": 32, "ffn_hidden": 4 * H, "vocab": V, "mlp": "gelu",
               "dropout": False},
        training={"seq_len": S, "global_batch": 8, "micro_batch": 1, "precision": "bf16", "recompute": "none",
                  "flash_attention": True},
        parallel={"pp": 4, "vpp": 2, "schedule": "interleaved-1f1b", "layers_per_stage": [0, 4, 4, 4, 4, 4, 4, 0]})


def test_uneven_chunks_hold_their_own_layers():
    # Megatron's interleaved order by hand (forward k: chunk (k // p) % v; backwards start at the last chunk):
    # rank 3 warms up with 4 forwards of chunk 0 (mb 0-3), then pairs F(chunk 1) B(chunk 1) for mb 0-3, then
    # F(chunk 0, mb 4) before B(chunk 0, mb 0): 5 micro-batches of its 4 layers at the peak, the head's chunk empty
    # by then. Rank 0 warms up with 10 forwards: chunk 0 (no layers) mb 0-3, chunk 1 mb 0-3, chunk 0 mb 4-5: 4.
    s = _uneven()
    assert stage_memory(s, 3).activations == pytest.approx(5 * 4 * LAYER + LOSS_PEAK, rel=1e-12)
    assert stage_memory(s, 0).activations == pytest.approx(4 * 4 * LAYER, rel=1e-12)


def test_memory_and_run_agree_on_uneven_chunks():
    s = _uneven()
    ledger = {d.pp: d.memory["activations"] for d in memory(s).devices}
    played = {d.pp: d.memory["activations"] for d in simulate(s).devices}
    assert ledger == pytest.approx(played, rel=1e-9)
    assert played[3] == pytest.approx(5 * 4 * LAYER + LOSS_PEAK, rel=1e-9)


def test_the_last_chunk_holds_one_micro_batch_of_logits():
    # compare_h100: Llama 2 13B (h 5120, vocabulary 32000), s 4096, b 1, t 1, p 4, v 10, m 32, eager loss.
    # Rank 3 holds min((p - r - 1) 2 + (v - 1) p + 1, m v) / v = 37 / 10 = 3.7 micro-batches of its layers
    # (Megatron's warm-up count) and one of its last chunk's output-layer input and log-softmax output:
    # 4 x 4096 x 5120 + 4 x 4096 x 32000 = 608,174,080 bytes, not 3.7 x that.
    s = simtrain.load_scenario("compare_h100")
    st = stage_memory(s, 3)
    edge = 4 * 4096 * 5120 + 4 * 4096 * 32000
    assert st.micro_batch_bytes.last_edge == edge == 608_174_080
    assert st.kept_activations == pytest.approx(3.7 * st.micro_batch_bytes.layers + edge, rel=1e-12)
    played = next(d for d in simulate(s).devices if d.pp == 3).memory["activations"]
    assert played == pytest.approx(st.activations, rel=1e-9)


def test_one_chunk_ranks_are_unchanged():
    # 1F1B holds min(m, p - r) whole micro-batches, edges included (Narayanan et al. 2021, Sec. 2.2.1)
    s = _uneven().with_overrides({"parallel.vpp": 1, "parallel.schedule": "1f1b",
                                  "parallel.layers_per_stage": [6, 6, 6, 6]})
    st = stage_memory(s, 3)
    assert st.kept_activations == pytest.approx(1 * (6 * LAYER + LAST_EDGE), rel=1e-12)
    assert stage_memory(s, 1).kept_activations == pytest.approx(3 * 6 * LAYER, rel=1e-12)


def test_a_split_backward_keeps_the_logits_gradient_not_the_log_softmax():
    # ZB-H1, p 2, m 3: the last rank plays F0 B0 F1 B1 W0 F2 B2 W1 W2 (Qi et al. 2024, Fig. 3's order), so its peak
    # is one whole micro-batch (F1) over one kept from B to W (B0's): (L + E) + (w L + E_w), where L is its layers'
    # activations, E the output layer's input and log-softmax output (4sbh + 4sbV) and E_w what W needs of them:
    # the output layer's input and the logits' bf16 gradient, 2sbh + 2sbV (the zero-bubble fork's WeightGradStore
    # keeps the input and output gradient of every linear, the output layer's included). Before: w (L + E).
    from simtrain.plan.activations import weight_grad_fraction

    s = make_scenario(
        model={"layers": 4, "hidden": H, "heads": 32, "ffn_hidden": 4 * H, "vocab": V, "mlp": "gelu",
               "dropout": False},
        training={"seq_len": S, "global_batch": 3, "micro_batch": 1, "precision": "bf16", "recompute": "none",
                  "flash_attention": True},
        parallel={"pp": 2, "schedule": "zb-h1"})
    w = weight_grad_fraction(s)
    assert 0.0 < w <= 1.0
    layers = 2 * LAYER
    expected = (layers + LAST_EDGE) + (w * layers + 2 * S * H + 2 * S * V) + LOSS_PEAK
    assert stage_memory(s, 1).activations == pytest.approx(expected, rel=1e-12)
    played = next(d for d in simulate(s).devices if d.pp == 1).memory["activations"]
    assert played == pytest.approx(expected, rel=1e-9)


def test_chunks_keep_their_own_recomputed_layers():
    # p 2, v 2, layers_per_stage [4, 1, 1, 4], full recompute of the first layer of each chunk (Megatron's block
    # method): a recomputed layer keeps its input, 2sbh; the others 32sbh. Rank 0's chunk 0 (4 layers) holds
    # 2 + 3 x 32 = 98 sbh, its chunk 1 (1 layer) 2 sbh; by layer count they were given 80 and 20 of the 100
    # (a review found it). Rank 0 of interleaved p 2, v 2, m 8 plays F(0,0) F(0,1) F(1,0) F(1,1) F(0,2) B(1,0)
    # F(0,3) B(1,1) F(1,2) B(0,0) ... as (chunk, mb) (Megatron's order: 4 warm-up forwards, then one forward before
    # each backward, backwards from the last chunk): after F(0,3) it holds 4 of chunk 0 and 1 of chunk 1, its peak
    # (one layer's full activations, recomputed, come on top).
    sbh = S * H
    s = make_scenario(
        model={"layers": 10, "hidden": H, "heads": 32, "ffn_hidden": 4 * H, "vocab": V, "mlp": "gelu",
               "dropout": False},
        training={"seq_len": S, "global_batch": 8, "micro_batch": 1, "precision": "bf16", "recompute": "full",
                  "recompute_layers": 1, "flash_attention": True},
        parallel={"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "layers_per_stage": [4, 1, 1, 4]})
    st = stage_memory(s, 0)
    assert st.micro_batch_bytes.chunk_layers == {0: 98 * sbh, 1: 2 * sbh}
    assert st.kept_activations == pytest.approx(4 * 98 * sbh + 1 * 2 * sbh, rel=1e-12)
    played = next(d for d in simulate(s).devices if d.pp == 0).memory["activations"]
    assert played == pytest.approx(st.activations, rel=1e-9)


def test_the_mtp_module_sits_on_the_last_stage_chunk():
    # Megatron runs the multi-token-prediction module after the last stage's layers: its activations belong to the
    # chunk that holds the last model stage (rank 1's chunk 1 here), not to the rank's chunks by layer count
    def scenario(mtp):
        model = {"layers": 4, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 8,
                 "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 512}, "mtp_layers": mtp}
        return make_scenario(model=model, training={"seq_len": 1024, "global_batch": 8, "micro_batch": 1},
                             parallel={"pp": 2, "vpp": 2, "schedule": "interleaved-1f1b"})

    with_mtp, without = stage_memory(scenario(1), 1).micro_batch_bytes, stage_memory(scenario(0), 1).micro_batch_bytes
    assert with_mtp.chunk_layers[0] == without.chunk_layers[0]
    assert with_mtp.chunk_layers[1] - without.chunk_layers[1] == pytest.approx(with_mtp.layers - without.layers)
    assert with_mtp.layers > without.layers
