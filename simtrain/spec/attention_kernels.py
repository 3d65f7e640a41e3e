"""Facts about the fused attention kernels a scenario can name (``training.flash_attention``) that are the kernels'
own, not a GPU's: which hardware-file entry a kernel runs at, how its forward's rate compares with its backward's,
and which head widths it is built for. The hardware files give each kernel one forward + backward rate
(``compute.attention_kernels``)."""

from __future__ import annotations

#: the hardware file's ``compute.attention_kernels`` entry a kernel runs at, where it is not the kernel's own name.
#: flash1_triton at flash1's forward + backward rate: its author measured it "slightly slower than CUDA forward +
#: backward" overall (flash-attn ``flash_attn/flash_attn_triton.py`` docstring, @f1a73d07), a difference no
#: published figure sizes, so none is applied.
SPEED_ENTRY = {"flash1_triton": "flash1"}

#: flash-attn's flash_attn_triton.py timed forward and backward apart: facebookresearch/xformers#479 ("Add Triton Flash
#: Attention", the benchmark tables of dianaml0's description, 2022), whose Triton op calls that file's
#: ``_flash_attn_forward`` and ``_flash_attn_backward`` (the review links it at flash-attn @0bf5e500, 2022-11-28, whose
#: kernels are 1.0.3.post0's: between the two only the docstring and the bias broadcast change). Causal
#: (``LowerTriangularMask``), head width 128, 160 heads, microseconds; (dtype, batch, tokens, forward, backward). The
#: GPU is not named (the A100 is most likely: xformers' benchmarks of 2022 ran on it, and the H100 shipped in 2023);
#: a ratio of two passes on one GPU is what is carried, not a rate. The 8k bf16 backward was not read (the stored copy
#: of the PR stops there).
XFORMERS_479_TRITON_US = (("f16", 1, 4096, 5167.6, 25831.9), ("b16", 1, 4096, 5335.3, 25811.2),
                          ("f16", 2, 4096, 10226.7, 51084.6), ("b16", 2, 4096, 10540.9, 51265.2),
                          ("f16", 1, 8192, 19262.0, 91356.3))


def forward_over_backward(forward_s: float, backward_s: float) -> float:
    """A forward's FLOP rate over its backward's, from their times: the backward does 2.5x the forward's FLOP."""
    return backward_s / (2.5 * forward_s)


#: a flash kernel's forward FLOP rate over its backward's, where the two differ (each pass's FLOP as FlashAttention
#: counts them, the backward 2.5x the forward). flash1_triton (fifteenth session): the mean over the five rows
#: above, 2.000, 1.935, 1.998, 1.945, 1.897: 1.955, the kernel itself. Until the fourteenth session 1.48, the Triton
#: project's own reference for its sibling kernel (triton-lang/triton python/test/regression/test_performance.py
#: @00693c1c, A100, causal fp16, 4 x 48 heads x 4096 tokens x 64: forward 0.37, backward 0.25 of peak), the lowest of
#: that family's published 1.48-2.34. Both agree with the author's "Triton forward is generally faster than CUDA
#: forward, while Triton backward is generally slower than CUDA backward" (flash-attn @f1a73d07). Every other kernel
#: 1.0: flash-attn's CUDA FlashAttention-1 takes 2.49-2.51x its forward's time for its backward at 16k-64k tokens
#: (Dao et al. 2022, arXiv 2205.14135, Tables 18-19: 134.03/336.00, 535.95/1338.56, 2147.05/5343.19 ms), both passes
#: at one rate. FlashAttention-2, -3 and cuDNN are not set: their per-pass bars give about 1.15 on H100 at 16k
#: (Shah et al. 2024, Figs. 5-6, non-causal: 370/322, 648/561, 595/516) and FlashAttention-2 about 1.08 on A100 (a
#: third-party transcription, docs/sources.md section 2); a ratio that depends on the GPU needs a hardware-file field
#: this table is not, and on H100 it also moves with the length and the head width (width 128: FA2 1.44 at 512 tokens
#: to 1.15 at 16k; width 64: 1.42 to 1.11; docs/model.md section 2.4).
ATTENTION_FORWARD_RATIO = {
    "flash1_triton": sum(forward_over_backward(f, b) for *_, f, b in XFORMERS_479_TRITON_US)
    / len(XFORMERS_479_TRITON_US)}


def forward_rate_factor(k: float) -> float:
    """A kernel's forward rate over its forward + backward rate, k its forward rate over its backward's: a forward of
    F and a backward of 2.5 F take (1/f + 2.5/(f/k)) F = 3.5 F at f = (1 + 2.5 k) / 3.5 of the combined rate."""
    return (1.0 + 2.5 * k) / 3.5


#: head widths the kernels are built for; a head runs on the narrowest that holds it (plan/layer_floor.py
#: ``attention_kernel_pad``), and the widest is the widest head the kernel takes (``WIDEST_HEAD``).
#: - flash1 (flash-attn 0.2 to 1.0): a head width d <= 32, <= 64 or <= 128 runs the 32, 64 or 128 kernel
#:   (csrc/flash_attn/fmha_api.cpp ``run_fmha_fwd`` / ``run_fmha_bwd`` @4a6eaa9f, the same at v1.0.5; its
#:   ``head_size <= 128`` check).
#: - flash1_triton (flash-attn's Triton FlashAttention-1): the next power of two, at least 16
#:   (flash_attn/flash_attn_triton.py, ``BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16)`` and ``assert d <= 128``,
#:   @f1a73d07).
#: - flash3 (FlashAttention-3): the next of its 64, 96, 128, 192 and 256 kernels (Dao-AILab/flash-attention
#:   hopper/flash_api.cpp ``round_up_headdim``, ``run_mha_fwd`` and ``head_size <= 256`` @000090d0).
#: flash-attn 2.0 to 2.6 (flash2) have a kernel for every multiple of 32 up to 256 (csrc/flash_attn/src/static_switch.h
#: ``HEADDIM_SWITCH``, v2.0.8; 2.7 drops 224 and 2.8 drops 160, which then run the next kernel up: not modelled), a
#: rule rather than a list; its widest head is not checked.
TILE_WIDTHS = {"flash1": (32, 64, 128), "flash1_triton": (16, 32, 64, 128), "flash3": (64, 96, 128, 192, 256)}

#: the widest head each kernel in TILE_WIDTHS runs, with who builds it and the check in its code, for the messages
WIDEST_HEAD = {"flash1": (TILE_WIDTHS["flash1"][-1], "flash-attn 0.2 to 1.0", "fmha_api.cpp: head_size <= 128"),
               "flash1_triton": (TILE_WIDTHS["flash1_triton"][-1], "flash-attn's flash_attn_triton.py",
                                 "its assert d <= 128"),
               "flash3": (TILE_WIDTHS["flash3"][-1], "FlashAttention-3", "hopper/flash_api.cpp: head_size <= 256")}
