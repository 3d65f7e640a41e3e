"""What one dense layer keeps for its backward on one GPU (Korthikanti et al. 2022's terms with s -> s / cp, and the
savings of FP8 and of the recomputed modules): the memory ledger's per-layer figure (``simtrain.plan.memory``), also
read by a search's memory floor (``simtrain.decide.bulk``)."""

from __future__ import annotations

from simtrain.plan.activations import activation_bytes_per_layer, fp8_activation_saving
from simtrain.plan.device import FP8_COPY_BYTES
from simtrain.plan.recompute import mla_qkv_width, modules_for, selective_saving


def dense_layer_activation(m, tr, *, tp: int, sequence_parallel: bool, cp: int, micro_batch: int, precision: str,
                           recompute: str) -> float:
    """Bytes one dense layer keeps for its backward per micro-batch on one GPU (Korthikanti et al. 2022 with
    s -> s / cp, FP8's and the recompute modules' savings); read by the ledger and by a search's memory floor."""
    s, b, h, a, t = tr.seq_len // cp, micro_batch, m.hidden, m.heads, tp
    sp = sequence_parallel and t > 1
    scale = 2.0 if precision == "fp32" else 1.0
    per_layer = activation_bytes_per_layer(
        s, b, h, a, ffn=m.ffn_hidden, mlp=m.mlp, t=t, sequence_parallel=sp, **attention_widths(m),
        attention_scores=not tr.flash_attention, recompute=recompute, dropout=tr.dropout) * scale
    if precision == "fp8" and recompute in ("none", "selective"):
        per_layer -= fp8_activation_saving(s, b, h, m.ffn_hidden, t, sp, tr.fp8_recipe)
    modules = modules_for(recompute, tr.recompute_modules)
    fp8_copy = FP8_COPY_BYTES[tr.fp8_recipe] if precision == "fp8" else None
    return per_layer - selective_saving(s, b, h, m.ffn_hidden, m.mlp, t, sp, modules, mla_qkv_width(m),
                                        fp8_copy) * scale


def attention_widths(m) -> dict:
    """The query width and K/V widths the activation formula needs when they differ from a Llama-style layer:
    heads of their own width (q = heads x head_dim), or MLA's per-head keys (nope + rope) and values plus its
    latents (kept for the up projections' weight gradients), folded into kv and q."""
    at = m.attention
    if at.kind == "mla":
        qk = at.qk_nope_head_dim + at.qk_rope_head_dim
        kv = (m.heads * (qk + at.v_head_dim) + at.kv_lora_rank + at.qk_rope_head_dim) // 2
        return {"q": m.heads * qk + (at.q_lora_rank or 0) // 2, "kv": kv}
    return {"kv": m.kv_width, "q": m.q_width} if m.q_width != m.hidden else {"kv": m.kv_width}
