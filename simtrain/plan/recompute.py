"""Recompute granularity: which layers (``training.recompute_layers`` under full recompute) and which modules
(``training.recompute_modules`` under selective recompute) drop their activations and run their forward again
before the backward (/work/research/schedules_cp.md section 5).

- Full recompute of N layers per (virtual) stage is Megatron-Core's block method (``--recompute-method block
  --recompute-num-layers N``, transformer_block.py): the first N layers of each model chunk keep only their input
  and re-run whole; the others keep everything.
- Selective recompute of modules is Megatron-Core's ``--recompute-modules`` (transformer_config.py; default
  ``[core_attn]``): ``core_attn`` re-runs the attention core (with fused attention it keeps Q, K, V and the
  output, so it saves no memory: the config warns there is "no need"); ``mlp`` keeps the dense MLP's input and
  re-runs it, dropping its internals (Korthikanti et al. 2022: the fc1 output and the activation output, 2 sbf
  each; SwiGLU's gate, up and activation outputs, 6 sbf in all, split by t); ``layernorm`` drops the outputs of
  the two norms (the QKV and FC1 inputs: 2 x 2 sbh, split by t with sequence parallelism) and re-runs the norms.
"""

from __future__ import annotations

from simtrain.plan import costs, device

#: the default module list of selective recompute (Megatron-Core transformer_config.py)
DEFAULT_MODULES = ("core_attn",)


def modules_of(training) -> tuple[str, ...]:
    """The recomputed modules of a selective-recompute run (none otherwise)."""
    if training.recompute != "selective":
        return ()
    return tuple(training.recompute_modules or DEFAULT_MODULES)


def mlp_forward(sh: costs.LayerShape, dev: device.Device) -> tuple[float, float]:
    """(seconds, FLOP) of a dense MLP forward on one TP rank: its GEMMs (gemm_shapes' last two) and the
    activation function's element-wise pass (as layer_cost counts it: 2 or 3 x sbf/t 16-bit elements)."""
    if not sh.ffn:
        return 0.0, 0.0
    gemms = costs.gemm_shapes(sh)[-2:]
    seconds = sum(dev.linear_gemm_time(m, n, k) for m, n, k in gemms)
    seconds += dev.memory_time((2 if sh.mlp_matrices == 2 else 3) * sh.tokens * sh.ffn / sh.tp * dev.element_bytes,
                               kernels=1)
    return seconds, sum(2.0 * m * n * k for m, n, k in gemms)


def norms_forward(sh: costs.LayerShape, dev: device.Device) -> float:
    """Seconds of the two norms' forward (layer_cost's figure: read and write sbh each)."""
    split = sh.tp if sh.sequence_parallel else 1
    sbh = sh.tokens * sh.hidden * dev.element_bytes / split
    return dev.norm_time(2 * 2 * sbh, backward=False, kernels=2)


def selective_extra(sh: costs.LayerShape, dev: device.Device, modules: tuple[str, ...]) -> tuple[float, float]:
    """(seconds, FLOP) re-run before one layer's backward for the listed modules."""
    seconds = flops = 0.0
    if "core_attn" in modules:
        attn = costs.layer_cost(sh, dev, "selective")
        seconds += attn.recompute
        flops += attn.hardware_flops - 3.0 * attn.model_flops
    if "mlp" in modules:
        t, f = mlp_forward(sh, dev)
        seconds += t
        flops += f
    if "layernorm" in modules:
        seconds += norms_forward(sh, dev)
    return seconds, flops


def selective_tp_factor(modules: tuple[str, ...]) -> float:
    """The backward's TP collectives in forward-collective units: 1, plus half for a recomputed MLP (its
    row-parallel reduction, and with sequence parallelism its all-gather, run again; the attention's half does not,
    core_attn lies between the collectives)."""
    return 1.5 if "mlp" in modules else 1.0


def selective_saving(s: float, b: int, h: int, ffn: int, mlp: str, t: int, sequence_parallel: bool,
                     modules: tuple[str, ...]) -> float:
    """Bytes one layer's kept activations shrink by for ``mlp`` and ``layernorm`` (core_attn's saving, the score
    matrix of unfused attention, is the formula's own ``recompute='selective'``)."""
    saved = 0.0
    if "mlp" in modules and ffn:
        saved += (6.0 if mlp == "swiglu" else 4.0) * s * b * ffn / t
    if "layernorm" in modules:
        saved += 2 * 2.0 * s * b * h / (t if sequence_parallel else 1)
    return saved
