"""The decoder layer's work outside its GEMMs, attention and norms, by implementation (``training.layer_kernels``).

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

The forward also launches four small kernels per layer for the variable-length attention's sequence offsets
(``torch.zeros`` and ``cumsum`` of the sequence mask, twice); their bytes are negligible.
"""

from __future__ import annotations

from dataclasses import dataclass

IMPLEMENTATIONS = ("fused", "nanotron")


@dataclass(frozen=True)
class ExtraWork:
    """Bytes through HBM and kernels one layer's forward and backward add beyond the fused count."""

    forward_bytes: float = 0.0
    forward_kernels: int = 0
    backward_bytes: float = 0.0
    backward_kernels: int = 0


def extra_work(impl: str, *, tokens: int, batch: int, q: float, k: float, f: float, elem: float) -> ExtraWork:
    """What ``impl``'s layer moves beyond the fused count (module docstring), for ``tokens`` tokens in ``batch``
    sequences; ``q``, ``k``, ``f`` are the rank's query, key and MLP widths, ``elem`` the activation element size."""
    if impl == "fused":
        return ExtraWork()
    if impl != "nanotron":
        raise ValueError(f"unknown layer_kernels {impl!r} (allowed: {', '.join(IMPLEMENTATIONS)})")
    mha = q == k
    qkv = 2 * (q + 2 * k)                       # read + write of the three projections
    several = batch > 1
    fwd = qkv + 2 * (2 * k) + 2 * (2 * k) + 2 * (q + k) + (5 - 3) * f + (2 * q if several else 0.0)
    bwd = (13 - 6) * f + 2 * (q + k) + 2 * (2 * k) + (2 if mha else 1) * qkv + (4 * q if several else 0.0)
    fwd_kernels = (1 if mha else 3) + 2 + 2 + 1 + (1 if several else 0) + 4
    bwd_kernels = 3 + 2 + 1 + (2 if mha else 1) + (2 if several else 0)
    return ExtraWork(forward_bytes=fwd * elem * tokens, forward_kernels=fwd_kernels,
                     backward_bytes=bwd * elem * tokens, backward_kernels=bwd_kernels)
