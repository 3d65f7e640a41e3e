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
- The modules of mixture-of-experts and latent-attention layers (NVIDIA/Megatron-LM at d98e8a6):
  ``moe_act`` (moe/experts.py, ``CheckpointWithoutOutput`` around the grouped MLP's activation function, its output
  discarded once fc2 has run) drops the activation's output, rows x f / etp, and re-runs the element-wise
  activation from the kept fc1 output; ``shared_experts`` (moe/moe_layer.py, ``tensor_parallel.checkpoint`` around
  the shared experts) keeps their input, already kept as the MoE block's input, and drops and re-runs the shared
  MLP; ``moe`` (moe/moe_layer.py, ``tensor_parallel.checkpoint`` around the whole MoE layer: router, dispatch,
  experts, combine, shared experts) keeps only its input and re-runs all of it, the dispatch and combine
  all-to-alls included; ``mla_up_proj`` (multi_latent_attention.py, ``CheckpointWithoutOutput`` around
  ``qkv_up_proj_and_rope_apply``, discarded after the attention core) drops the per-head query, key and value the
  attention kernel keeps and re-runs the two up projections from the kept latents (RoPE's element-wise pass is not
  timed in the forward either, ``costs.layer_cost``).
- ``mlp`` under FP8 (Megatron-Core transformer_layer.py @d98e8a6: ``recompute_mlp`` only on layers that are not
  MoE layers, run through Transformer Engine's ``te_checkpoint`` when fp8 is on). TE's checkpoint runs the
  forward without keeping anything and saves only the checkpoint's input; before the backward it runs the
  forward again (transformer_engine/pytorch/distributed.py, ``activation_recompute_forward``: "the forward pass
  will run without storing intermediate activations. Instead, the forward pass saves the inputs tuple").
  Megatron-Core's TE layer spec fuses the MLP's norm into fc1 (gpt_layer_specs.py @d98e8a6: a dense layer's
  ``pre_mlp_layernorm`` is ``IdentityOp`` and ``linear_fc1`` ``column_parallel_layer_norm_linear``), so the
  checkpoint's input is the layer's residual (already kept as the norm's input), and the MLP drops everything
  else: fc1's FP8 input copy, the fc1 outputs and FC2's FP8 input copy. The recompute re-runs the norm, the two
  FP8 quantizations of the GEMM inputs (the BF16 input is all that was kept) and the two FP8 GEMMs with the
  activation. (The BF16 ``mlp`` above keeps Korthikanti's accounting: the FC1 input stays, no norm re-run.)
"""

from __future__ import annotations

from simtrain.plan import costs, device
from simtrain.plan.costs_moe import MoECost
from simtrain.plan.memory_moe import layer_indices

#: the default module list of selective recompute (Megatron-Core transformer_config.py)
DEFAULT_MODULES = ("core_attn",)


#: the modules selective recompute may add, in the order of what re-running them costs: the two norms and the experts'
#: element-wise activation (memory-bound passes), then the latent-attention up projections (two small GEMMs), the
#: dense MLP's GEMMs, the shared experts' GEMMs, and last the whole MoE layer with its all-to-alls
MODULE_ORDER = ("layernorm", "moe_act", "mla_up_proj", "mlp", "shared_experts", "moe")


def module_sets(base, extra) -> list[list[str]]:
    """The module lists ``base`` plus a non-empty subset of ``extra`` (in :data:`MODULE_ORDER`), cheapest first as if
    each module cost more than all cheaper ones together: the subsets in binary counting order ([a], [b], [a, b],
    [c], ...)."""
    extra = [x for x in MODULE_ORDER if x in extra and x not in base]
    return [list(base) + [x for bit, x in enumerate(extra) if i >> bit & 1] for i in range(1, 2 ** len(extra))]


def modules_of(training) -> tuple[str, ...]:
    """The recomputed modules of a selective-recompute run (none otherwise)."""
    return modules_for(training.recompute, training.recompute_modules)


def modules_for(recompute: str, listed) -> tuple[str, ...]:
    """The recomputed modules under ``recompute`` with ``training.recompute_modules`` = ``listed``."""
    if recompute != "selective":
        return ()
    return tuple(listed or DEFAULT_MODULES)


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
        if dev.fp8 and sh.ffn:        # TE's checkpoint: the fused norm and the FP8 casts of both GEMM inputs again
            seconds += norms_forward(sh, dev) / 2.0
            seconds += dev.fp8_cast_time(sum(m * k for m, _, k in costs.gemm_shapes(sh)[-2:]), 2)
    if "layernorm" in modules:
        seconds += norms_forward(sh, dev)
    if "mla_up_proj" in modules and sh.mla is not None:
        ups = mla_up_shapes(sh)
        seconds += sum(dev.linear_gemm_time(m, n, k) for m, n, k in ups)
        flops += sum(2.0 * m * n * k for m, n, k in ups)
    return seconds, flops


def mla_up_shapes(sh: costs.LayerShape) -> list[tuple[float, float, float]]:
    """The GEMMs inside ``qkv_up_proj_and_rope_apply`` among ``costs.mla_gemm_shapes``: the query's up projection
    (or, without a query latent, its projection from h: ``linear_q_proj``) and the key/value up projection."""
    shapes = costs.mla_gemm_shapes(sh)
    q_lora = sh.mla[0]
    return [shapes[1], shapes[3]] if q_lora else [shapes[0], shapes[2]]


def moe_selective_extra(moe: MoECost, modules: tuple[str, ...]) -> tuple[float, float, bool]:
    """(seconds, FLOP, whether the dispatch and combine run again) re-run before one MoE block's backward."""
    if "moe" in modules:
        return moe.forward, moe.model_flops, True
    seconds = flops = 0.0
    if "moe_act" in modules:
        seconds += moe.activation_forward     # element-wise: no FLOP counted, as in the forward
    if "shared_experts" in modules:
        seconds += moe.shared_forward
        flops += moe.shared_flops
    return seconds, flops, False


def selective_tp_factor(modules: tuple[str, ...], dense_share: float = 1.0) -> float:
    """The backward's TP collectives in forward-collective units: 1, plus half for a recomputed MLP (its
    row-parallel reduction, and with sequence parallelism its all-gather, run again; the attention's half does not,
    core_attn lies between the collectives; a recomputed MoE layer runs its block's again, as the MLP's).
    ``dense_share``: the share of the stage's layers whose MLP is dense, the only ones ``mlp`` recomputes
    (Megatron-Core: ``recompute_mlp`` is not set on MoE layers)."""
    if "moe" in modules:
        return 1.5
    return 1.0 + 0.5 * dense_share if "mlp" in modules else 1.0


def dense_share(scenario, pp_rank: int) -> float:
    """Share of the rank's layers whose MLP is dense (1 for a dense model; a MoE model's leading dense layers)."""
    m = scenario.model
    if m.moe is None:
        return 1.0
    held = layer_indices(scenario, pp_rank)
    return sum(1 for i in held if not m.is_moe_layer(i)) / len(held) if held else 0.0


def selective_saving(s: float, b: int, h: int, ffn: int, mlp: str, t: int, sequence_parallel: bool,
                     modules: tuple[str, ...], mla_qkv: int = 0, fp8_copy: float | None = None) -> float:
    """Bytes one layer's kept activations shrink by for ``mlp``, ``layernorm`` and ``mla_up_proj`` (core_attn's
    saving, the score matrix of unfused attention, is the formula's own ``recompute='selective'``); ``mla_qkv`` is
    the per-token width of latent attention's query, key and value (``mla_qkv_width``). ``fp8_copy``: bytes per
    element of the FP8 input copies under fp8 training (``FP8_COPY_BYTES``), whose saving
    ``activations.fp8_activation_saving`` already took from the 16-bit count."""
    saved = 0.0
    if "mla_up_proj" in modules:
        saved += 2.0 * s * b * mla_qkv / t     # Q, K, V of this rank's heads, 16-bit
    if "mlp" in modules and ffn:
        saved += (6.0 if mlp == "swiglu" else 4.0) * s * b * ffn / t
        if fp8_copy is not None:
            # TE's checkpoint keeps only the residual: fc1's FP8 input copy goes too, and FC2's input, counted 16-bit
            # above, was already cut to its FP8 copy by the FP8 saving
            saved += fp8_copy * s * b * h / (t if sequence_parallel else 1) - (2.0 - fp8_copy) * s * b * ffn / t
    if "layernorm" in modules:
        saved += 2 * 2.0 * s * b * h / (t if sequence_parallel else 1)
    return saved


def mla_qkv_width(model) -> int:
    """Per-token width of latent attention's query, key and value over all heads: a x (qk + qk + v), qk = nope +
    rope (the tensors ``qkv_up_proj_and_rope_apply`` returns); 0 for other attention."""
    at = model.attention
    if at.kind != "mla":
        return 0
    qk = at.qk_nope_head_dim + at.qk_rope_head_dim
    return model.heads * (2 * qk + at.v_head_dim)
