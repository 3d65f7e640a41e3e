"""Rules for training.flash_attention (a kernel the hardware file lists, at a head width the kernel runs) and
training.layer_kernels (a framework's own layer kernels are counted only for the layers that framework builds,
simtrain/plan/layer_kernels.py)."""

from __future__ import annotations

from simtrain.spec.attention_kernels import SPEED_ENTRY, WIDEST_HEAD
from simtrain.spec.errors import display_path


def check_attention_kernel_rules(s, m, tr, fail) -> None:
    """training.flash_attention: the kernel's speed entry is in the hardware file, and it runs the model's heads."""
    kernel = tr.attention_kernel
    listed = s.hardware.compute.attention_kernels
    available = ["true", "false", "flash2", *sorted(listed), *[k for k, e in SPEED_ENTRY.items() if e in listed]]
    head_width = m.q_width / m.heads
    checked = m.attention.kind != "mla"      # latent attention's query-key width is not checked against these
    runs = [k for k in available if not checked or k not in WIDEST_HEAD or WIDEST_HEAD[k][0] >= head_width]
    entry = SPEED_ENTRY.get(kernel, kernel)
    if entry in ("flash1", "flash3", "cudnn") and entry not in listed:
        fail("training.flash_attention", f"'{kernel}' is not available on {s.hardware.gpu.name}: "
             f"{display_path(s.hardware_file)} lists no compute.attention_kernels.{entry} (allowed here: "
             f"{', '.join(runs)})")
    if kernel in WIDEST_HEAD and checked and head_width > WIDEST_HEAD[kernel][0]:
        widest, who, code = WIDEST_HEAD[kernel]
        fail("training.flash_attention", f"'{kernel}' ({who}) runs head widths up to {widest} ({code}), and this "
             f"model's is {head_width:g} (allowed here: {', '.join(runs)})")


def check_layer_kernel_rules(m, tr, par, fail) -> None:
    """training.layer_kernels counts one framework's Llama layer (plan/layer_kernels.py): refuse what it is not."""
    impl = tr.layer_kernels
    who = {"nanotron": "nanotron's Llama decoder layer", "torchtitan": "torchtitan's eager Llama 3 block"}[impl]
    why = None
    if m.moe is not None:
        why = "a mixture-of-experts model"
    elif m.attention.kind != "mha" or m.attention.sliding_window is not None or m.qk_norm:
        why = "this attention (the layer has multi- or grouped-query attention, no windows, no qk_norm)"
    elif m.mlp != "swiglu":
        why = f"mlp: {m.mlp} (the layer's MLP is a SwiGLU)"
    elif m.norm_kind != "rmsnorm":
        why = f"norm: {m.norm_kind} (the layer's norms are RMSNorms)"
    elif m.bias:
        why = "bias: true (the layer's linears have no biases)"
    elif m.qkv_bias or m.attention_bias:
        key = "qkv_bias" if m.qkv_bias else "attention_bias"
        why = f"{key}: true (the layer's attention projections have no biases)"
    elif m.mlp_bias:
        why = "mlp_bias: true (the layer's MLP linears have no biases)"
    elif m.position_embeddings:
        why = f"position_embeddings: {m.position_embeddings} (the layer uses rotary positions, no learned table)"
    elif m.head_dim is not None and m.head_dim * m.heads != m.hidden:
        why = f"head_dim: {m.head_dim} (the layer's head width is hidden / heads = {m.hidden // m.heads})"
    elif tr.dropout:
        why = "dropout: true (the layer has no dropout; set training.dropout: false)"
    elif impl == "nanotron" and tr.attention_kernel != "flash2":
        why = f"flash_attention: {tr.flash_attention} (nanotron's Llama runs FlashAttention-2, flash_attn_varlen_func)"
    elif impl == "torchtitan" and tr.attention_kernel not in ("flash2", "cudnn"):
        why = (f"flash_attention: {tr.flash_attention} (torchtitan runs scaled_dot_product_attention, whose fused "
               "kernels are FlashAttention-2 and cuDNN's: flash2 or cudnn)")
    elif impl == "torchtitan" and tr.precision == "fp32":
        why = "precision: fp32 (the count's casts to and from fp32 are no-ops on fp32 activations)"
    elif impl == "torchtitan" and par.tp > 1:
        why = f"tp {par.tp} (torchtitan shards its norms over the sequence with TP; the count is for tp 1)"
    if why:
        fail("training.layer_kernels", f"'{impl}' ({who}) is not simulated with {why} (allowed here: fused)")


#: the longest key sequence Megatron-LM's fused softmax kernels take (megatron/core/fusions/fused_softmax.py
#: ``is_kernel_available``, main of 2026-08: 16 < sk <= 4096; 2,048 in the code of 2021, 16,384 in some forks)
MEGATRON_SOFTMAX_MAX_KEYS = 4096


def megatron_softmax_fused(seq: int, attn_batches: int, precision: str = "bf16") -> bool:
    """Whether Megatron-LM's fused softmax takes this shape (``FusedScaleMaskSoftmax.is_kernel_available``: 16-bit
    scores, 16 < sk <= MEGATRON_SOFTMAX_MAX_KEYS, sq and sk multiples of 4, micro-batch x heads per TP rank a multiple
    of the causal kernel's batches per block: 4, or 8 for sk <= 128, where each warp takes two rows
    (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h at NVIDIA/Megatron-LM cd126362bb~1,
    ``batches_per_warp``)); otherwise ``forward_torch_softmax`` runs."""
    per_block = 8 if seq <= 128 else 4
    return (precision in ("bf16", "fp16", "fp8") and 16 < seq <= MEGATRON_SOFTMAX_MAX_KEYS and seq % 4 == 0
            and attn_batches % per_block == 0)


def unfused_softmax_warning(m, tr, par, explicit: bool) -> str | None:
    """What a scenario should know about training.unfused_softmax: it applies only without a fused attention
    kernel, and Megatron's fused causal softmax runs only for the shapes its ``is_kernel_available`` accepts."""
    if tr.attention_kernel != "none":
        return (f"training.unfused_softmax has no effect with flash_attention: {tr.flash_attention} (it describes "
                "attention without a fused kernel)") if explicit else None
    if tr.unfused_softmax != "megatron":
        return None
    batches = tr.micro_batch * m.heads // par.tp
    if not megatron_softmax_fused(tr.seq_len, batches, tr.precision):
        return (f"training.unfused_softmax: megatron with precision {tr.precision}, seq_len {tr.seq_len} and "
                f"micro_batch x heads / tp = {batches}: Megatron-LM's fused softmax runs only on 16-bit scores for "
                f"16 < seq_len <= {MEGATRON_SOFTMAX_MAX_KEYS}, seq_len a multiple of 4 and micro_batch x heads / tp "
                "a multiple of 4 (8 up to 128 tokens); otherwise it falls back to PyTorch's softmax, which simtrain "
                "times as such (its casts, mask and softmax as separate kernels; its fp32 activations are not in "
                "the memory ledger)")
    return None
