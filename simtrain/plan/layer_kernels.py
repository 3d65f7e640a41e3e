"""The decoder layer's work outside its GEMMs and attention, by implementation (``training.layer_kernels``).

``fused`` is what :func:`simtrain.plan.costs.layer_cost` counts by itself: Megatron-Core / Transformer Engine style
kernels, with no layout copies around the attention and one activation kernel over the MLP width.

``nanotron`` is nanotron's Llama decoder layer as the Ultra-Scale Playbook's sweep ran it (huggingface/nanotron
``src/nanotron/models/llama.py`` and ``parallel/tensor_parallel/functional.py`` @67c5ebb6, branch nouamane/bench2).
Read kernel by kernel from that code, per token of the micro-batch, with ``Q`` the rank's query width (heads x
head width / tp), ``K`` its key width (= value width), ``F`` its MLP width and ``e`` the 16-bit element size, its
forward moves beyond the fused count:

- the QKV layout copy: multi-head, ``view(...).permute(2, 1, 0, 3, 4).contiguous()`` of the fused QKV output;
  grouped-query, three ``transpose(0, 1).contiguous()`` after a ``split``: read and write ``e (Q + 2K)``;
- ``torch.cat`` of keys and values, then ``permute(1, 2, 0, 3, 4).contiguous()``: read and write ``2eK`` each;
- flash-attn's rotary embedding (``flash_attn.layers.rotary``, a Triton kernel) in place on the queries and on the
  keys: read and write ``e (Q + K)``;
- the SwiGLU as two eager kernels (``GLUActivation``: ``act(gate) * up`` over a ``split`` of the merged
  gate/up output): silu reads and writes ``eF``, the product reads ``2eF`` and writes ``eF``: ``5eF`` where the
  fused count charges ``3eF``;
- with more than one sequence per micro-batch, the attention output's ``transpose(0, 1)`` is not contiguous, so
  the output projection's ``F.linear`` copies it: read and write ``eQ``.

The backward (autograd's kernels for the same ops):

- the SwiGLU: the product's two gradients (read ``2eF``, write ``eF``, each), silu's (read ``2eF``, write ``eF``)
  and the ``split``'s, a ``cat`` into the merged gradient (read and write ``2eF``): ``13eF`` where the fused count
  charges ``6eF``;
- the rotary embedding's conjugate rotation, in place on the query and key gradients: read and write ``e (Q + K)``;
- the ``split`` of the rotated keys and values: a ``cat`` of their gradients, read and write ``2eK``;
- the QKV layout: multi-head, ``unbind``'s ``stack`` of the three gradients and the ``reshape`` of its permuted
  view (read and write ``e (Q + 2K)`` each); grouped-query, the ``split``'s ``cat`` (once);
- with more than one sequence per micro-batch, the output projection's ``tensor.contiguous()`` of its saved input
  (``_RowLinearAsyncCommunication.backward``) and the ``reshape`` of the transposed input gradient: ``eQ`` each.

The forward also launches six small kernels per layer for the variable-length attention's sequence offsets
(``torch.zeros``, the mask's ``sum`` and its ``cumsum``, twice); their bytes are negligible.

``torchtitan`` is torchtitan's Llama 3 block run eagerly, as its December 2024 H100 benchmark ran without
torch.compile (pytorch/torchtitan ``torchtitan/models/llama/model.py`` and ``torchtitan/models/norms.py`` @9dec370,
``norm_type = "rmsnorm"``), tensor parallelism 1. Its forward moves beyond the fused count, per token (bytes):

- each of the two norms is ``RMSNorm``'s eager ``x32 = x.float(); (x32 * rsqrt(x32.pow(2).mean(-1) + eps))
  .type_as(x) * weight``: the cast (read e, write 4), ``pow`` (4 + 4), ``mean`` (read 4), the product with the row's
  rsqrt (4 + 4), the cast back (4 + e), the product with the weight (e + e): ``4e + 28`` per element where the fused
  count charges ``2e``;
- ``apply_rotary_emb`` on the queries and the keys: the cast to fp32 (e + 4), the complex product with the
  frequencies (4 + 4; the frequencies, one per token and head-dimension pair, broadcast over batch and heads and are
  negligible) and ``type_as`` back (4 + e): ``2e + 16`` per query and key element;
- ``repeat_kv`` when there are fewer key/value heads than query heads: ``expand(...).reshape(...)`` copies the keys
  and the values to the query width: ``e (K + Q)`` each;
- the SwiGLU ``silu(w1 x) * w3 x``: silu (e + e) and the product (2e + e), ``5eF`` where the fused count charges
  ``3eF``.

Scaled-dot-product attention takes the transposed queries, keys and values as they are and returns its output in
the layout the following ``transpose(1, 2).contiguous()`` already has: no copies. The backward, by PyTorch's
autograd formulas (``tools/autograd/derivatives.yaml``; ``pow_backward``, ``mean_backward``, ``sum_to``):

- each norm: the weight product's input gradient (e + e) and weight gradient (product e + e + e, sum e), the cast
  back to fp32 (e + 4), the row-rsqrt product's input gradient (4 + 4) and its row gradient (product 4 + 4 + 4,
  sum 4), ``mean``'s broadcast divided by h (write 4), ``pow``'s ``grad * (2 * x.pow(1))`` (copy 4 + 4, scale
  4 + 4, product 4 + 4 + 4), the sum of the two gradients of ``x.float()`` (4 + 4 + 4) and the cast to bf16
  (4 + e): ``8e + 76`` where the fused count charges ``3e``;
- the rotary embedding: the cast, the product with the conjugate frequencies and the cast back: ``2e + 16``;
- ``repeat_kv``: ``sum_to`` over the repeats, read ``eQ`` and write ``eK``, for keys and values;
- the SwiGLU: the product's two gradients (read 2e, write e, each) and silu's (read 2e, write e): ``9eF`` where
  the fused count charges ``6eF``;
- autograd's sums of input gradients: the separate ``wq``/``wk``/``wv`` projections (two adds) and ``w1``/``w3``
  (one add) besides the two residual branches: five adds of ``3eh`` where the fused count charges the residuals'
  backward ``12eh``: ``3eh`` more, in three more kernels (found by review, from a dispatch log of this block).
"""

from __future__ import annotations

from dataclasses import dataclass

IMPLEMENTATIONS = ("fused", "nanotron", "torchtitan")

#: The least time per layer and micro-batch nanotron's one-node, PP-1 runs with one sequence per micro-batch were
#: measured at, as step / (micro-batches x layers) (the output layer, the loss and the once-per-step work included):
#: 4.309 ms (3B at DP 2 TP 4 ZeRO-0: 256 x 4096 / (8 x 8,488 tok/s/GPU) = 15.44 s over 128 x 28), rounded down, the
#: least of the fourteen such runs at TP 2-8; the nine simtrain gives 1.5-3.2 ms measured 4.31-4.63 ms whatever the
#: model (1B-8B) and TP degree (nanotron/ultrascale-playbook benchmarks_interactive.html @e3bcfc5c,
#: simtrain/validation/ultrascale_playbook.yaml; docs/validation.md, nanotron). Measured at PP 1 only: at PP 2-4
#: some of the same source's runs bound a stage's layers below it (1B: 3.6-4.0 ms), so no floor is known there. A
#: threshold for a warning, read off published runs: simtrain times no host work and this value never enters a step
#: time.
NANOTRON_HOST_FLOOR_S = 4.30e-3


def host_floor_warning(impl: str, pp: int, per_layer_s: float) -> str | None:
    """A warning when a PP-1 nanotron step's simulated time per layer and micro-batch (step / (micro-batches x
    layers), as the floor was measured) is under ``NANOTRON_HOST_FLOOR_S``; None otherwise."""
    if impl != "nanotron" or pp != 1 or per_layer_s >= NANOTRON_HOST_FLOOR_S:
        return None
    return (f"host-bound risk: {per_layer_s * 1e3:.2f} ms per layer and micro-batch (step / (micro-batches x "
            f"layers)), below {NANOTRON_HOST_FLOOR_S * 1e3:.2f} ms, the least nanotron's one-node PP-1 runs with "
            "one sequence per micro-batch were measured at (Ultra-Scale Playbook: runs simtrain puts at 1.5-3.2 ms "
            "measured 4.31-4.63 ms); simtrain does not time the host that issues the layer's kernels, so the step "
            "may be longer than predicted (docs/validation.md, nanotron)")


@dataclass(frozen=True)
class ExtraWork:
    """Bytes through HBM and kernels one layer's forward and backward add beyond the fused count."""

    forward_bytes: float = 0.0
    forward_kernels: int = 0
    backward_bytes: float = 0.0
    backward_kernels: int = 0


def extra_work(impl: str, *, tokens: int, batch: int, h: float, q: float, k: float, f: float,
               elem: float) -> ExtraWork:
    """What ``impl``'s layer moves beyond the fused count (module docstring), for ``tokens`` tokens in ``batch``
    sequences; ``h`` is the hidden size, ``q``, ``k``, ``f`` the rank's query, key and MLP widths, ``elem`` the
    activation element size."""
    if impl == "fused":
        return ExtraWork()
    if impl == "torchtitan":
        return _torchtitan(tokens=tokens, h=h, q=q, k=k, f=f, e=elem)
    if impl != "nanotron":
        raise ValueError(f"unknown layer_kernels {impl!r} (allowed: {', '.join(IMPLEMENTATIONS)})")
    mha = q == k
    qkv = 2 * (q + 2 * k)                       # read + write of the three projections
    several = batch > 1
    fwd = qkv + 2 * (2 * k) + 2 * (2 * k) + 2 * (q + k) + (5 - 3) * f + (2 * q if several else 0.0)
    bwd = (13 - 6) * f + 2 * (q + k) + 2 * (2 * k) + (2 if mha else 1) * qkv + (4 * q if several else 0.0)
    fwd_kernels = (1 if mha else 3) + 2 + 2 + 1 + (1 if several else 0) + 6
    bwd_kernels = 3 + 2 + 1 + (2 if mha else 1) + (2 if several else 0)
    return ExtraWork(forward_bytes=fwd * elem * tokens, forward_kernels=fwd_kernels,
                     backward_bytes=bwd * elem * tokens, backward_kernels=bwd_kernels)


def _torchtitan(*, tokens: int, h: float, q: float, k: float, f: float, e: float) -> ExtraWork:
    """torchtitan's eager Llama 3 block beyond the fused count (module docstring): bytes per token, two norms."""
    repeat = k < q
    fwd = 2 * ((4 * e + 28) - 2 * e) * h + (2 * e + 16) * (q + k) + (2 * e * (k + q) if repeat else 0.0) \
        + (5 - 3) * e * f
    bwd = 2 * ((8 * e + 76) - 3 * e) * h + (2 * e + 16) * (q + k) + (2 * e * (q + k) if repeat else 0.0) \
        + (9 - 6) * e * f + (5 * 3 - 12) * e * h
    fwd_kernels = 2 * (8 - 1) + 2 * 3 + (2 if repeat else 0) + 1
    bwd_kernels = 2 * (15 - 1) + 2 * 3 + (2 if repeat else 0) + 2 + 3
    return ExtraWork(forward_bytes=fwd * tokens, forward_kernels=fwd_kernels,
                     backward_bytes=bwd * tokens, backward_kernels=bwd_kernels)
