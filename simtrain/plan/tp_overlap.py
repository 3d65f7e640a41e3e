"""What stays exposed of a layer's TP communication under Transformer Engine's userbuffers overlap, or, without
sequence parallelism, under Megatron's asynchronous all-reduce of the input gradient
(``parallel.tp_comm_overlap``; Megatron-Core ``tp_comm_overlap``), from the published descriptions of the
technique (NeMo ``docs/source/features/optimizations/communication_overlap.rst``; the shipped per-GEMM presets
in NeMo ``nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py``).

With sequence parallelism a layer's forward has two all-gathers (before QKV and FC1) and two reduce-scatters
(after the attention output projection and FC2); the backward mirrors them.

- All-gather before a GEMM, forward (``qkv_fprop``, ``fc1_fprop``) and the backward's mirror (``proj_dgrad``,
  ``fc2_dgrad``): ring exchange. "the activation (gradient) tensor all-gather is replaced with multiple steps of
  input P2P ring exchanges": the local shard's GEMM chunk starts at once, each of the t - 1 transfers runs under
  the GEMM chunk of the shard before it, so t - 1 of the t GEMM chunks can hide it:
  exposed = max(0, AG - GEMM x (t - 1) / t).
- Reduce-scatter after a GEMM (``proj_fprop``, ``fc2_fprop``): pipelined in 4 chunks (``num_splits=4``);
  "NeMo also provides the option to pipeline-overlap using chunks of reduce-scatter, which exposes one
  reduce-scatter chunk": exposed = RS / 4 + max(0, (RS - GEMM) x 3 / 4).
- Backward of QKV and FC1 (``qkv_dgrad``/``qkv_wgrad``, ``fc1_dgrad``/``fc1_wgrad``): bulk overlap of work
  "without direct computation dependency": the all-gather of the saved input runs under the data-gradient GEMM,
  the reduce-scatter of the data gradient under the weight-gradient GEMM: exposed = max(0, AG - DGRAD) +
  max(0, RS - WGRAD).

The communication kernels take SMs from the GEMMs they run under (``num_sm``, ``set_sm_margin``): the hidden
time is charged at the hardware file's ``overlap_slowdown`` on the NVLink fabric, the measured slowdown of
compute overlapped with communication (arXiv:2507.03114).
"""

from __future__ import annotations

from simtrain.plan import costs

#: chunks of the pipelined reduce-scatter in the shipped presets (NeMo userbuffers.py, PipelineOverlapCfg)
RS_SPLITS = 4


def exposed_tp(ag: float, rs: float, gemms: list[tuple[float, float, float]], tp: int,
               slowdown: float, nanotron: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's TP communication left on the critical path.

    ``ag``/``rs``: one all-gather / reduce-scatter of the layer's activations, alone on the fabric; ``gemms``:
    (forward, data-gradient, weight-gradient) seconds of the layer's QKV, output, MLP-up and MLP-down GEMMs.
    ``nanotron``: nanotron's asynchronous linears instead of Transformer Engine's userbuffers
    (``exposed_tp_async_linears``)."""
    if nanotron:
        return exposed_tp_async_linears(ag, rs, gemms, tp, slowdown)
    (qkv_f, qkv_d, qkv_w), (proj_f, proj_d, _), (up_f, up_d, up_w), (down_f, down_d, _) = gemms
    hide = (tp - 1) / tp

    def ring_ag(gemm: float) -> tuple[float, float]:
        exposed = max(0.0, ag - gemm * hide)
        return exposed, ag - exposed

    def piped_rs(gemm: float) -> tuple[float, float]:
        exposed = rs / RS_SPLITS + max(0.0, (rs - gemm) * (RS_SPLITS - 1) / RS_SPLITS)
        return exposed, rs - exposed

    def bulk(comm: float, gemm: float) -> tuple[float, float]:
        exposed = max(0.0, comm - gemm)
        return exposed, comm - exposed

    fwd = [ring_ag(qkv_f), piped_rs(proj_f), ring_ag(up_f), piped_rs(down_f)]
    bwd = [ring_ag(proj_d), ring_ag(down_d), bulk(ag, qkv_d), bulk(rs, qkv_w), bulk(ag, up_d), bulk(rs, up_w)]
    extra = slowdown - 1.0

    def total(parts: list[tuple[float, float]]) -> float:
        return sum(exposed + extra * hidden for exposed, hidden in parts)

    return total(fwd), total(bwd)


def exposed_tp_async_linears(ag: float, rs: float, gemms: list[tuple[float, float, float]], tp: int,
                             slowdown: float) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's TP communication left on the critical path under nanotron's
    asynchronous linears (``parallel.tp_async_linears``; huggingface/nanotron
    src/nanotron/parallel/tensor_parallel/functional.py @67c5ebb6, REDUCE_SCATTER mode). Where nanotron does what
    Megatron does without Transformer Engine's overlap, the layers' convention stands (docs/model.md section 6.1);
    where it does more, its overlap is played:

    - column-parallel (QKV, MLP up), ``_ColumnLinearAsyncCommunication``: the forward issues the input's all-gather
      asynchronously and multiplies its own shard (1/t of the GEMM) meanwhile, then the others: exposed
      max(0, AG - GEMM / t). Its backward is Megatron's (the input gathered again under the data-gradient GEMM, the
      data gradient reduce-scattered under the weight gradient): by the convention the re-gather is not counted and
      the reduce-scatter is exposed;
    - row-parallel (attention output, MLP down), ``_RowLinearAsyncCommunication``: the forward's reduce-scatter
      (``differentiable_reduce_scatter_sum``) waits, exposed whole; the backward all-gathers the output gradient
      asynchronously under its own shard's data-gradient GEMM: exposed max(0, AG - DGRAD / t).

    The hidden parts slow the GEMMs they run under at ``slowdown``, as ``exposed_tp``'s."""
    (qkv_f, _, _), (_, proj_d, _), (up_f, _, _), (_, down_d, _) = gemms

    def under(comm: float, gemm: float) -> tuple[float, float]:
        exposed = max(0.0, comm - gemm)
        return exposed, comm - exposed

    fwd = [under(ag, qkv_f / tp), (rs, 0.0), under(ag, up_f / tp), (rs, 0.0)]
    bwd = [(rs, 0.0), under(ag, proj_d / tp), (rs, 0.0), under(ag, down_d / tp)]
    extra = slowdown - 1.0
    return tuple(sum(exposed + extra * hidden for exposed, hidden in parts) for parts in (fwd, bwd))


def exposed_async_allreduce(all_reduce: float, wgrads: tuple[float, float], slowdown: float) -> tuple[float, float]:
    """(seconds, extra seconds of a split backward's B) of one layer backward's two TP all-reduces without sequence
    parallelism (``parallel.tp_async_allreduce``). Each column-parallel linear (QKV, MLP up) all-reduces its input
    gradient asynchronously and computes its weight gradient under it (Megatron-LM ``--async-tensor-model-parallel-
    allreduce``, on by default since NVIDIA/Megatron-LM 3f65246 of 2021-09-02, ``LinearWithGradAccumulationAndAsync
    Communication.backward``; Megatron-Core ``allreduce_dgrad`` in tensor_parallel/layers.py @d98e8a6; Transformer
    Engine's column-parallel ``Linear``/``LayerNormLinear`` backward, ``allreduce(dgrad, tp_group, async_op=True)``
    before the wgrad GEMM; Korthikanti et al. 2022 Sec. 5: "we overlap all-reduce communication with the linear
    weight's gradient computation"): exposed = max(0, AR - WGRAD), the hidden part slowing the GEMM at ``slowdown``.

    ``all_reduce``: one all-reduce of the layer's activations alone on the fabric; ``wgrads``: the QKV and MLP-up
    weight-gradient GEMMs. A split backward (zero-bubble schedules) moves the weight gradients to W, so its B waits
    for the whole all-reduces: the second figure is what it adds back."""
    extra = slowdown - 1.0
    total = back = 0.0
    for wgrad in wgrads:
        exposed = max(0.0, all_reduce - wgrad)
        hidden = all_reduce - exposed
        total += exposed + extra * hidden
        back += hidden - extra * hidden
    return total, back


def async_allreduce_wgrads(scenario, shape, dev) -> tuple[float, float] | None:
    """The QKV and MLP-up weight-gradient GEMMs the asynchronous all-reduces run under (``exposed_async_allreduce``),
    or None where the overlap does not apply: ``tp_async_allreduce`` off, tp 1, sequence parallelism, or multi-head
    latent attention, whose column-parallel up projections take the latents (their all-reduce pairing is not
    modelled: its backward all-reduces stay whole). ``shape``: the layer's GEMM shapes on one TP rank
    (``costs.gemm_shapes``: QKV first, MLP up second to last)."""
    par = scenario.parallel
    if not par.tp_async_allreduce or par.sequence_parallel or par.tp == 1 or shape.mla is not None:
        return None
    shapes = costs.gemm_shapes(shape)
    if not shape.ffn or len(shapes) < 4:
        return None
    (qm, qn, qk), (um, un, uk) = shapes[0], shapes[-2]
    return dev.linear_gemm_time(qk, qn, qm), dev.linear_gemm_time(uk, un, um)
