"""The mixture-of-experts rules that need more than a line: where NVIDIA's published HybridEP figures reach, and what
Megatron-Core asserts before it overlaps the EP all-to-alls. Each rule names the key it blames (``fail`` is the
caller's, which locates the key in the file).
"""

from __future__ import annotations

from collections import Counter

from simtrain.spec.placement import placement_of

#: GPUs NVIDIA published HybridEP figures for (DeepEP hybrid-ep docs/README_Hybrid-EP.md @94a9f8f): within one
#: NVLink domain B200 (EP 8), across domains H100 (EP 16-64 over RDMA, 8 GPUs a node; H200 and H800 are the same die)
HYBRIDEP_NVLINK_GPUS = ("B200",)
HYBRIDEP_RDMA_GPUS = ("H100", "H200", "H800")
HYBRIDEP_MAX_DOMAINS = 8
HYBRIDEP_RANKS_PER_DOMAIN = 8


def check_hybridep_scope(s, fail) -> None:
    """HybridEP is timed only inside its published figures (plan.hybridep): every EP group whole NVLink domains of
    equal parts (deep_ep/hybrid_ep_buffer.py asserts group_size % ranks_per_nvlink_domain == 0), one domain on B200,
    2 to 8 domains of 8 GPUs on Hopper."""
    par, cluster, gpu = s.parallel, s.cluster, s.hardware.gpu.name
    placement = placement_of(s)
    for pp_rank in range(par.pp):
        for group in placement.ep_groups(pp_rank):
            counts = Counter(cluster.domain_of(r) for r in group)
            per = set(counts.values())
            domains = len(counts)
            if len(per) > 1 or (domains > 1 and per != {HYBRIDEP_RANKS_PER_DOMAIN}):
                fail("parallel.ep", f"{par.ep} with the hybridep dispatcher puts GPUs {group[0]}-{group[-1]} of an EP "
                     f"group {'/'.join(str(n) for n in counts.values())} in {domains} NVLink domains: HybridEP "
                     "needs equal parts per domain (deep_ep/hybrid_ep_buffer.py), and its published RDMA figures "
                     f"have {HYBRIDEP_RANKS_PER_DOMAIN} GPUs of the group in each")
            if domains == 1 and not gpu.startswith(HYBRIDEP_NVLINK_GPUS):
                fail("parallel.moe_dispatcher", f"'hybridep' within one NVLink domain on {gpu} is not simulated: "
                     "NVIDIA's HybridEP figures inside a domain are for B200 only (DeepEP hybrid-ep "
                     "docs/README_Hybrid-EP.md), and a kernel's share of another GPU's NVLink is not carried over "
                     "(allowed here: alltoall, allgather, deepep)")
            if domains > 1 and not gpu.startswith(HYBRIDEP_RDMA_GPUS):
                fail("parallel.moe_dispatcher", f"'hybridep' across NVLink domains on {gpu} is not simulated: "
                     "NVIDIA's HybridEP RDMA figures are for H100 only (DeepEP hybrid-ep docs/README_Hybrid-EP.md) "
                     "(allowed here: alltoall, allgather, deepep)")
            if domains > HYBRIDEP_MAX_DOMAINS:
                fail("parallel.ep", f"{par.ep} with the hybridep dispatcher spans {domains} NVLink domains: "
                     f"HybridEP's published figures reach {HYBRIDEP_MAX_DOMAINS} (EP 64) and fall with the group "
                     "(54.5, 47.4, 41.2 GB/s at 2, 4, 8 nodes), so a larger group is not timed (allowed: EP groups "
                     f"of at most {HYBRIDEP_MAX_DOMAINS} domains, or the deepep dispatcher)")


def check_ep_overlap_rules(s, fail) -> None:
    """What Megatron-Core asserts before it merges forward and backward to hide the EP all-to-alls
    (TransformerConfig.__post_init__, overlap_moe_expert_parallel_comm, NVIDIA/Megatron-LM at d98e8a6), and what
    simtrain plays it with."""
    par, tr, m = s.parallel, s.training, s.model
    if par.ep == 1:
        fail("parallel.ep_overlap", "true needs expert parallelism (ep > 1): with ep 1 there is no all-to-all to "
             "hide (Megatron-Core asserts expert_model_parallel_size > 1)")
    if par.moe_dispatcher not in ("alltoall", "deepep", "hybridep"):
        fail("parallel.ep_overlap", f"true runs with the alltoall, deepep or hybridep dispatcher only (Megatron-Core: "
             f"alltoall or flex), not moe_dispatcher '{par.moe_dispatcher}'")
    if par.schedule not in ("1f1b", "interleaved-1f1b") or (par.schedule == "1f1b" and par.pp > 1):
        fail("parallel.ep_overlap", f"true merges the 1F1B steady state of schedule 1f1b with pp 1 or of "
             f"interleaved-1f1b (Megatron-Core needs virtual pipeline stages when pp > 1), not '{par.schedule}' "
             f"with pp {par.pp}")
    if tr.recompute == "full":
        fail("parallel.ep_overlap", "true with training.recompute: full is refused by Megatron-Core (disable full "
             "recomputation when enabling overlap_moe_expert_parallel_comm); use none or selective")
    if m.mtp_layers > 1:
        fail("parallel.ep_overlap", f"true supports at most one MTP module (Megatron-Core), but the model has "
             f"mtp_layers {m.mtp_layers}")
    if par.zero >= 2 and par.dp > 1:
        fail("parallel.zero", f"{par.zero}: ep_overlap runs with zero 0 or 1 (Megatron's distributed optimizer "
             "shards the optimizer state only), not with gradients or weights sharded")
