"""What a PyTorch FSDP implementation adds around ZeRO-2/3's collectives (``parallel.zero_impl``).

simtrain's generic ZeRO (``zero_impl: generic``) hands the layers' gradients to the reduce-scatter and the gathered
weights to the layers in place, as Megatron-LM's contiguous buffers do. PyTorch's two FSDP implementations copy:

- **FSDP1** (``FullyShardedDataParallel``, flat parameters): the gradient concatenation into the flat gradient on
  the compute stream, the cast and pre-divide on the post-backward stream
  (:func:`simtrain.plan.costs.fsdp1_grad_bytes`), and a fixed cost per unit and micro-batch
  (:data:`simtrain.plan.costs.FSDP1_UNIT_OVERHEAD`).
- **FSDP2** (``fully_shard``, per-parameter sharding): :func:`fsdp2_copy_bytes`.

Each copy is a memory-bound kernel timed by :meth:`simtrain.plan.device.Device.memory_time` at the hardware file's
streaming rate; only the byte counts come from here, read from the implementations' code.
"""

from __future__ import annotations

from dataclasses import dataclass

from simtrain.plan import costs


def fsdp2_copy_bytes(weight_bytes: float, grad_bytes: float, mixed: bool) -> tuple[float, float, float]:
    """Bytes PyTorch FSDP2 moves through HBM per parameter around its collectives:
    (all-gather copy-in per *sharded* parameter, all-gather copy-out per unsharded parameter, reduce-scatter copy-in
    per unsharded parameter).

    Read from ``foreach_all_gather``, ``foreach_all_gather_copy_out`` and ``foreach_reduce``
    (pytorch/pytorch ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` @010ae4a; the same copies in
    ``torch/distributed/_composable/fsdp/_fsdp_collectives.py`` @415cc26, 2024):

    - copy-in, on the all-gather copy-in stream ahead of the all-gather: with a mixed-precision policy the fp32
      sharded parameters are cast into one flat buffer in the parameter dtype (read 4, write w; the ``foreach_copy``
      fast path of ``_get_param_all_gather_inputs``), which ``all_gather_copy_in`` copies into this rank's slot of
      the all-gather output (read w, write w); without one, only that second copy;
    - copy-out, on the compute stream once the all-gather is waited for: ``split_with_sizes_copy`` from the
      all-gather output into each parameter's unsharded tensor (read w, write w);
    - reduce-scatter copy-in: ``chunk_cat`` of the unsharded gradients (in the parameter dtype) into the
      reduce-scatter input in the reduce dtype (read w, write g), on the compute stream in the current code (on the
      reduce-scatter stream in 2024's, with the compute stream waiting for it before it frees the gradients).

    No division kernel: for fp32 and bf16 reduce dtypes FSDP2 reduces with NCCL's AVG
    (``_get_gradient_divide_factors``). Per-shard work after the reduce-scatter (accumulating a micro-batch's shard
    gradient) is at most 1/dp of the copy-in and is left out.
    """
    copy_in = (4.0 + weight_bytes if mixed else 0.0) + 2.0 * weight_bytes
    return copy_in, 2.0 * weight_bytes, weight_bytes + grad_bytes


@dataclass(frozen=True)
class FsdpCosts:
    """The per-unit costs of ``parallel.zero_impl`` (all zero for ``generic``). ``forward`` and ``backward`` are
    compute-stream seconds for a unit of ``n`` parameters (per TP rank, unsharded); the two ``*_prep_per_byte``
    figures are seconds per byte run on a collective's own stream ahead of it (per gradient byte of a
    reduce-scatter, per gathered weight byte of an all-gather)."""

    impl: str = "generic"           # the zero_impl in effect ("generic" where FSDP shards nothing)
    forward_bytes: float = 0.0      # per unsharded parameter, each forward of a unit
    backward_bytes: float = 0.0     # per unsharded parameter, each backward of a unit
    forward_kernels: int = 0
    backward_kernels: int = 0
    unit_overhead: float = 0.0      # s per unit and micro-batch (FSDP1's hooks)
    grad_prep_per_byte: float = 0.0
    gather_prep_per_byte: float = 0.0

    def forward(self, dev, n_params: float) -> float:
        if not (self.forward_bytes and n_params):
            return 0.0
        return dev.memory_time(n_params * self.forward_bytes, kernels=self.forward_kernels)

    def backward(self, dev, n_params: float) -> float:
        if not (self.backward_bytes and n_params):
            return 0.0
        return dev.memory_time(n_params * self.backward_bytes, kernels=self.backward_kernels)


def fsdp_costs(impl: str, zero: int, shards: int, weight_bytes: float, grad_bytes: float, mixed: bool,
               dev, fp16_reduce: bool = False) -> FsdpCosts:
    """The costs of ``parallel.zero_impl`` ``impl`` for ZeRO ``zero`` sharded over ``shards`` ranks (dp x cp; none
    below ZeRO-2 or on one rank, where FSDP shards nothing). FSDP2 divides an fp16 gradient in place before its
    reduce-scatter (``_get_gradient_divide_factors``: a pre-divide factor against overflow; NCCL's AVG otherwise):
    read g, write g ahead of the collective; the post-divide of the shard is 1/shards of that and left out."""
    if impl == "generic" or zero < 2 or shards <= 1:
        return FsdpCosts()
    if impl == "fsdp1":
        cat, prep = costs.fsdp1_grad_bytes(weight_bytes, grad_bytes)
        # the cast and pre-divide kernels' launch gaps are below a microsecond per unit and left out
        return FsdpCosts(impl="fsdp1", backward_bytes=cat, backward_kernels=1, unit_overhead=costs.FSDP1_UNIT_OVERHEAD,
                         grad_prep_per_byte=dev.memory_time(prep / grad_bytes, kernels=0))
    copy_in, copy_out, rs_in = fsdp2_copy_bytes(weight_bytes, grad_bytes, mixed)
    gathers = zero >= 3          # fsdp2 with ZeRO-2 is refused (spec.scenario_rules); kept general here
    return FsdpCosts(impl="fsdp2", forward_bytes=copy_out if gathers else 0.0, forward_kernels=1 if gathers else 0,
                     backward_bytes=rs_in + (copy_out if gathers else 0.0), backward_kernels=2 if gathers else 1,
                     gather_prep_per_byte=dev.memory_time(copy_in / shards / weight_bytes, kernels=0)
                     if gathers else 0.0,
                     grad_prep_per_byte=dev.memory_time(2.0, kernels=0) if fp16_reduce else 0.0)
