"""The embedding table's backward and how its gradient joins the gradient buffer, as the stacks' code runs them:
the dense table gradient PyTorch returns, Megatron's DDP hook, autograd's sum of a tied table's two gradients."""

from __future__ import annotations

from simtrain.plan.device import Device


def embedding_backward_time(tokens: int, hidden: int, rows: float, dev: Device) -> float:
    """The backward of one micro-batch's embedding lookup into a table shard of ``rows`` rows. PyTorch's CUDA
    embedding backward returns a dense gradient of the whole shard: ``at::zeros({num_weights, grad.size(-1)})``
    (pytorch/pytorch aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu, ``embedding_backward_cuda_kernel``; the
    same zero-filled table in the 2018 aten/src/ATen/native/cuda/Embedding.cu), e bytes per entry written. It then
    sorts the token indices and sums each token's output-gradient row into fp32 partial sums
    (``compute_grad_weight``: read e, write 4) that ``sum_and_scatter`` reads (4) and scatters into the table (write
    e): at most (2e + 8) bytes per token and hidden unit (a partial per run of equal indices: one per token when
    they differ; counted so). About 10 kernels: the fill, the index sort, ``unique_by_key``,
    four segment-bookkeeping kernels, the partial sums, the scatter."""
    e = dev.element_bytes
    return dev.memory_time(rows * hidden * e + tokens * hidden * (2 * e + 8), kernels=10)


def embedding_grad_join_time(scenario, weight_bytes: float, grad_bytes: float, dev: Device) -> float:
    """Per micro-batch: moving the embedding table's dense gradient (``embedding_backward_time``) into the
    gradient buffer beyond what ``grad_accumulation_bytes`` charges every parameter:

    - ``fused`` accumulation (Megatron-LM's gradient_accumulation_fusion) fuses only the linears' weight gradients;
      the embedding's ``.grad`` is added into ``main_grad`` by the DDP's backward hook (Megatron-Core
      distributed/distributed_data_parallel.py ``_make_backward_post_hook``: ``param.main_grad.add_(param.grad.data)``
      @d98e8a6): read w, read g, write g per entry. Not under ZeRO-3 (FSDP reduces the gradient itself).
    - A tied table on one stage (pp 1) receives two gradients, the output layer's and the lookup's, which autograd
      sums before the parameter's hook or accumulation (torch/csrc/autograd/input_buffer.cpp, ``InputBuffer::add``):
      read w twice, write w. Under ``fused`` the output layer's GEMM accumulates into ``main_grad`` but hands
      autograd a zero-filled dummy gradient (Megatron sets ``zero_out_wgrad`` at pp 1, language_module.py; the
      dummy in tensor_parallel/layers.py ``LinearWithGradAccumulationAndAsyncCommunication.backward``), which is
      filled (write w) and summed the same way.
    """
    par, m, acc = scenario.parallel, scenario.model, scenario.training.grad_accumulation
    table = m.vocab * m.hidden / par.tp
    nbytes = 0.0
    if acc == "fused" and par.zero < 3:
        nbytes += table * (weight_bytes + 2.0 * grad_bytes)
    if m.tied_embeddings and par.pp == 1:
        nbytes += table * (4.0 if acc == "fused" and par.zero < 3 else 3.0) * weight_bytes
    return dev.memory_time(nbytes, kernels=1) if nbytes else 0.0
