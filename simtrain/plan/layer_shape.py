"""The shape of one transformer layer as one TP rank sees it for one micro-batch (:class:`LayerShape`), which the
cost functions of ``simtrain.plan.costs`` and ``simtrain.plan.unfused_attention`` take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerShape:
    """One transformer layer as one TP rank sees it for one micro-batch."""

    tokens: int          # b x s
    seq: int
    batch: int
    hidden: int
    ffn: int
    heads: int
    kv_width: int
    mlp_matrices: int    # 2 gelu, 3 swiglu
    tp: int
    sequence_parallel: bool
    flash: bool
    causal: bool = True
    dropout: bool = True   # False: p = 0, no dropout kernels (PyTorch returns the input unchanged)
    q_width: int = 0       # heads x head width when it differs from hidden (Qwen3, GPT-OSS); 0: = hidden
    window: int = 0        # sliding-window width of this layer's attention (GPT-OSS); 0: full causal
    mla: tuple[int, int, int, int, int] | None = None   # (q_lora or 0, kv_lora, qk_nope, qk_rope, v) latent attention
    layer_kernels: str = "fused"   # training.layer_kernels: whose element-wise and layout kernels (layer_kernels.py)
    attn_pad: float = 1.0  # head width the flash kernel computes / the head width (layer_floor.attention_kernel_pad)
    # training.unfused_softmax: whose softmax unfused attention runs; "torch": Megatron's PyTorch fallback, where its
    # fused kernel does not take the shape (plan.layer_floor.layer_shapes)
    unfused_softmax: str = "megatron"

    @property
    def q(self) -> int:
        return self.q_width or self.hidden
