"""Activation offloading to host memory (``training.activation_offload_layers``): Megatron-Core's
``--cpu-offloading --cpu-offloading-num-layers N`` (transformer_block.py hands it to Transformer Engine's
``get_cpu_offload_context``; NVIDIA/Megatron-LM at d98e8a6), played as Transformer Engine's
``AsyncDoubleBufferGroupOffloadHandler`` does it (transformer_engine/pytorch/cpu_offload.py, TE 1.x-2.x):

- the activations the first N layers save for the backward are the offload groups; after a layer's forward its
  group is copied to pinned host memory on a device-to-host stream that runs beside the compute (copies one
  after another);
- ``layer_window_map[g]`` is the layer whose forward end is group g's deadline: there the compute stream waits for
  the copy stream (``current_stream().wait_stream(d2h_stream)``) and group g's GPU buffers are freed;
- in the backward, before the backward of layer ``layer_window_map[g]``, the compute waits for the reloads issued so
  far and issues group g's reload on a host-to-device stream; a layer's backward cannot start before its own group
  is back (and the last group waits for every reload).

The engine plays these copies (``engine.host_copies``): each one a flow over the GPU's PCIe link in the cluster
graph (its x16 link to the NIC, which GPUDirect RDMA traffic of the DP, PP and EP flows shares), the compute
waiting for the copy streams where the handler waits. ``offload_stalls`` is the closed form of those waits for one
micro-batch with each copy alone on the link (what the engine's played waits equal when nothing else crosses it).
"""

from __future__ import annotations

from dataclasses import replace


def layer_windows(layers: int, groups: int) -> list[int]:
    """Transformer Engine's ``layer_window_map``: group g's deadline layer, the groups spread evenly over the
    layers (the first layers % groups windows one layer longer)."""
    out, constant = [], 0
    for g in range(groups):
        w = (layers // groups) * (g + 1) - 1
        if g < layers % groups:
            w += g + 1
            constant = g + 1
        else:
            w += constant
        out.append(w)
    return out


def offload_stalls(fwd: list[float], bwd: list[float], copy_s: float, groups: int) -> tuple[list[float], list[float]]:
    """(seconds the compute waits after each layer's forward, seconds it waits before each layer's backward) for one
    micro-batch: ``fwd``/``bwd`` are the layers' forward and backward seconds in layer order, ``copy_s`` one layer's
    copy over the host link, ``groups`` the offloaded layers (the first ones)."""
    layers = len(fwd)
    windows = layer_windows(layers, groups)
    deadline = set(windows)
    f_wait, b_wait = [0.0] * layers, [0.0] * layers
    t = d2h_free = 0.0
    for i in range(layers):
        t += fwd[i]
        if i < groups:                      # this layer's group leaves after its forward
            d2h_free = max(t, d2h_free) + copy_s
        if i in deadline and d2h_free > t:  # the compute stream waits for the copy stream
            f_wait[i] = d2h_free - t
            t = d2h_free
    t = h2d_free = 0.0
    back = [0.0] * groups                  # when each group is back on the GPU
    issue_at = {w: g for g, w in enumerate(windows)}
    for i in reversed(range(layers)):
        start = t
        if i in issue_at:                   # wait for the reloads so far, then reload the group
            t = max(t, h2d_free)
            g = issue_at[i]
            h2d_free = max(t, h2d_free) + copy_s
            back[g] = h2d_free
        if i < groups:
            t = max(t, back[i])
        if i == 0:
            t = max(t, h2d_free)
        b_wait[i] = t - start
        t += bwd[i]
    return f_wait, b_wait


def resident_layers(groups: int) -> int:
    """Offloaded layers whose activations are on the GPU at once: the group being copied and the one being
    reloaded (the handler's double buffer)."""
    return min(groups, 2)


def with_offload(c, groups: int, layer_bytes: float, host_bandwidth: float):
    """A ChunkPlan whose first ``groups`` layers are offloaded, each copying ``layer_bytes`` (the ledger's mean
    layer) each way, ``layer_bytes / host_bandwidth`` seconds alone on the host link; the engine plays the copies
    (engine.host_copies)."""
    return replace(c, offload_groups=min(groups, c.layers), offload_copy_s=layer_bytes / host_bandwidth,
                   offload_bytes=layer_bytes)


def host_memory_warning(scenario, report) -> str:
    """'does not fit: ...' when a node's GPUs put more in host memory than the hardware file's ``host_memory``: the
    offloaded activations (the offloaded layers of every micro-batch in flight, pinned buffers of the same size) and
    the offloaded optimizer state (plan.offload_optimizer); empty when they fit or nothing is offloaded. Without a
    published host memory figure nothing is checked."""
    worst = max(report.stages, key=lambda st: st.host_bytes + st.host_optimizer)
    cap = scenario.hardware.host_memory
    gpus = scenario.cluster.gpus_per_node
    acts, optim = worst.host_bytes * gpus, worst.host_optimizer * gpus
    if not acts + optim or cap is None or acts + optim <= cap:
        return ""
    if not optim:
        return f"does not fit: offloaded activations {acts / 1e9:.1f} GB > {cap / 1e9:.1f} GB of host memory per node"
    what = f"offloaded optimizer state {optim / 1e9:.1f} GB"
    if acts:
        what = f"offloaded activations {acts / 1e9:.1f} GB + {what}"
    return f"does not fit: {what} > {cap / 1e9:.1f} GB of host memory per node"
