"""Ring collectives on the cluster graph and link sharing in the fluid network (issue 3, deliverable 3).

Expected times are the alpha-beta cost of ring algorithms (Thakur, Rabenseifner and Gropp 2005,
"Optimization of Collective Communication Operations in MPICH", Sec. 4; NCCL's bus-bandwidth
convention): on n GPUs with per-step latency alpha and link bandwidth B, an all-reduce of S bytes
takes 2(n-1)/n x S/B + 2(n-1) alpha, an all-gather or reduce-scatter (n-1)/n x S/B + (n-1) alpha.
The fixtures use efficiency 1, so B is the file's bandwidth.
"""

from __future__ import annotations

import pytest
import simpy
from conftest import DATA, hardware_variant, make_scenario

from simtrain.engine.fluid import FluidNetwork
from simtrain.plan.collectives import collective_phases, p2p_phase, phase_time_alone
from simtrain.spec.hardware import load_hardware
from simtrain.spec.topology import build_cluster

STAR_B = 100e9          # core_star8.yaml: 100 GB/s per direction
STAR_ALPHA = 2e-6       # GPU -> switch -> GPU: two 1 us hops


def _cluster(path):
    return build_cluster(load_hardware(str(path), base_dir=DATA, file="test.yaml")[0])


@pytest.fixture(scope="module")
def star():
    return _cluster(DATA / "core_star8.yaml")


def _run_fluid(cluster, jobs):
    """Run lists of phases concurrently in a bare simpy env; returns each job's finish time."""
    env = simpy.Environment()
    net = FluidNetwork(env, {link: cluster.bandwidth(link) for link in cluster.graph.edges})
    done = {}

    def job(name, phases):
        for phase in phases:
            yield from net.run_phase(phase)
        done[name] = env.now

    for name, phases in jobs.items():
        env.process(job(name, phases))
    env.run()
    return done


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1e6, 1e9])
def test_ring_all_reduce_alpha_beta(star, n, size):
    """Ring all-reduce of S bytes on n GPUs, uniform links: 2(n-1)/n x S/B + 2(n-1) alpha, exactly."""
    expected = 2 * (n - 1) / n * size / STAR_B + 2 * (n - 1) * STAR_ALPHA
    phases = collective_phases("all_reduce", size, [list(range(n))], star)
    assert sum(phase_time_alone(p, star) for p in phases) == pytest.approx(expected, rel=1e-12)
    assert _run_fluid(star, {"ar": phases})["ar"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
@pytest.mark.parametrize("n", [2, 8])
def test_ring_all_gather_reduce_scatter_alpha_beta(star, kind, n):
    """All-gather / reduce-scatter of S bytes on n GPUs: (n-1)/n x S/B + (n-1) alpha."""
    size = 256e6
    expected = (n - 1) / n * size / STAR_B + (n - 1) * STAR_ALPHA
    phases = collective_phases(kind, size, [list(range(n))], star)
    assert sum(phase_time_alone(p, star) for p in phases) == pytest.approx(expected, rel=1e-12)
    assert _run_fluid(star, {"c": phases})["c"] == pytest.approx(expected, rel=1e-12)


def test_single_member_collective_is_free(star):
    """A group of one GPU communicates nothing."""
    assert collective_phases("all_reduce", 1e9, [[3]], star) == []


def test_two_transfers_sharing_a_link_take_twice_as_long(star):
    """Two sends out of gpu0 share its uplink: each moves at B/2, so its transfer time doubles."""
    size = 1e9
    alone = _run_fluid(star, {"a": [p2p_phase(size, [(0, 1)], star)]})["a"]
    assert alone == pytest.approx(STAR_ALPHA + size / STAR_B, rel=1e-12)
    both = _run_fluid(star, {"a": [p2p_phase(size, [(0, 1)], star)], "b": [p2p_phase(size, [(0, 2)], star)]})
    assert both["a"] == pytest.approx(STAR_ALPHA + 2 * size / STAR_B, rel=1e-12)
    assert both["b"] == pytest.approx(STAR_ALPHA + 2 * size / STAR_B, rel=1e-12)


def test_disjoint_transfers_do_not_slow_each_other(star):
    """Sends on disjoint links (0->1, 2->3) each run at the full link rate."""
    size = 1e9
    both = _run_fluid(star, {"a": [p2p_phase(size, [(0, 1)], star)], "b": [p2p_phase(size, [(2, 3)], star)]})
    assert both["a"] == both["b"] == pytest.approx(STAR_ALPHA + size / STAR_B, rel=1e-12)


def test_flow_speeds_up_when_the_other_finishes(star):
    """Sharing a link, a 1 GB and a 3 GB send end at 2 GB/B and (1+3) GB/B: rates are recomputed."""
    done = _run_fluid(star, {"short": [p2p_phase(1e9, [(0, 1)], star)], "long": [p2p_phase(3e9, [(0, 2)], star)]})
    assert done["short"] == pytest.approx(STAR_ALPHA + 2e9 / STAR_B, rel=1e-12)
    assert done["long"] == pytest.approx(STAR_ALPHA + 4e9 / STAR_B, rel=1e-12)


# --- two nodes: hierarchical all-reduce and NIC sharing -------------------------------------------
# core_two_nodes.yaml: 2 nodes x 4 GPUs; NVSwitch 100 GB/s, 2 us GPU-to-GPU; 4 NICs/node at 25 GB/s,
# 10 us NIC-to-NIC through one switch; GPU-NIC PCIe unlimited.
INTRA_B, INTRA_ALPHA = 100e9, 2e-6
NIC_B, NET_ALPHA = 25e9, 10e-6


def test_hierarchical_all_reduce_is_the_sum_of_its_phases():
    """8 GPUs on 2 nodes: reduce-scatter in node, all-reduce of S/4 across nodes on 4 rings, all-gather in node."""
    cluster = _cluster(DATA / "core_two_nodes.yaml")
    size = 400e6
    rs_intra = 3 / 4 * size / INTRA_B + 3 * INTRA_ALPHA
    ar_inter = 2 * 1 / 2 * (size / 4) / NIC_B + 2 * 1 * NET_ALPHA   # rings of 2 (one GPU per node), S/4 each
    ag_intra = 3 / 4 * size / INTRA_B + 3 * INTRA_ALPHA
    phases = collective_phases("all_reduce", size, [list(range(8))], cluster)
    assert len(phases) == 3
    times = [phase_time_alone(p, cluster) for p in phases]
    assert times == pytest.approx([rs_intra, ar_inter, ag_intra], rel=1e-12)
    assert _run_fluid(cluster, {"ar": phases})["ar"] == pytest.approx(rs_intra + ar_inter + ag_intra, rel=1e-12)


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_all_gather_reduce_scatter_across_nodes_pay_the_flat_rings_step_latencies(kind):
    """8 GPUs on 2 nodes. The bytes: (l-1)/l x S in the node plus (m-1)/m x S/l across it (l = 4 per node,
    m = 2 nodes). The latency: NCCL runs one flat ring of 8, whose 7 hops are 8 - 2 = 6 inside a node and
    2 - 1 = 1 across (NCCL src/graph/tuning.cc: nsteps = nRanks - 1, nInterSteps = nNodes - 1)."""
    cluster = _cluster(DATA / "core_two_nodes.yaml")
    size = 400e6
    node_bytes = 3 / 4 * size / INTRA_B
    net_bytes = 1 / 2 * (size / 4) / NIC_B
    expected = node_bytes + net_bytes + 6 * INTRA_ALPHA + 1 * NET_ALPHA
    phases = collective_phases(kind, size, [list(range(8))], cluster)
    assert sum(phase_time_alone(p, cluster) for p in phases) == pytest.approx(expected, rel=1e-12)
    assert _run_fluid(cluster, {"c": phases})["c"] == pytest.approx(expected, rel=1e-12)


def test_concurrent_rings_share_a_nic(tmp_path):
    """Two DP rings whose GPUs share one NIC each get half of it (2 NICs for 4 GPUs per node)."""
    path = hardware_variant(tmp_path, {"inter_node.nics_per_node": 2}, base=DATA / "core_two_nodes.yaml")
    cluster = _cluster(path)
    size = 100e6
    # rings {0,4} and {1,5}: GPUs 0 and 1 both use NIC 0 of their node
    phases = collective_phases("all_reduce", size, [[0, 4], [1, 5]], cluster)
    expected = 2 * 1 / 2 * size / (NIC_B / 2) + 2 * NET_ALPHA
    assert sum(phase_time_alone(p, cluster) for p in phases) == pytest.approx(expected, rel=1e-12)
    alone = collective_phases("all_reduce", size, [[0, 4]], cluster)
    assert sum(phase_time_alone(p, cluster) for p in alone) == pytest.approx(size / NIC_B + 2 * NET_ALPHA, rel=1e-12)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tp_layer_communication_is_two_all_reduces(sequence_parallel):
    """Megatron TP: 2 all-reduces of the b x s x h activations per layer pass (or 2 all-gathers + 2
    reduce-scatters with sequence parallelism, the same bytes: Korthikanti et al. 2022, Sec. 4.2.2)."""
    from simtrain.plan.build import build_plan

    s = make_scenario(hardware=DATA / "core_two_nodes.yaml", nodes=None,
                      model={"layers": 2, "hidden": 1024, "heads": 16, "ffn_hidden": 4096, "vocab": 64},
                      training={"seq_len": 2048, "global_batch": 2, "micro_batch": 1},
                      parallel={"tp": 4, "dp": 2, "sequence_parallel": sequence_parallel})
    size = 1 * 2048 * 1024 * 2                    # b s h in bf16
    n = 4
    all_reduce = 2 * (n - 1) / n * size / INTRA_B + 2 * (n - 1) * INTRA_ALPHA
    assert build_plan(s).chunks[0].tp_fwd_layer == pytest.approx(2 * all_reduce, rel=1e-12)


# --- the message-size ramp from a measured bus-bandwidth curve (issue 6, deliverable 2) ---------------------

# nccl-tests all_reduce_perf, in place, 8x A100-SXM4-80GB, Azure ND A100 v4 (NCCL 2.18.5):
# bus bandwidth in GB/s at 64 KiB, 256 KiB, 1 MiB, 2 MiB, ... 1 GiB (doubling) and 8 GiB.
# https://github.com/Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md (docs/sources.md section 3)
AZURE_A100_SIZES = [2**16, 2**18] + [2**k for k in range(20, 31)] + [2**33]
AZURE_A100_BUSBW = [2.70, 10.1, 36.2, 53.5, 71.4, 90.0, 109.2, 132.8, 166.6, 174.2, 213.9, 221.6, 228.1, 231.6]


def _all_reduce_time(cluster, size, n=8):
    return sum(phase_time_alone(p, cluster) for p in collective_phases("all_reduce", size, [list(range(n))], cluster))


@pytest.mark.parametrize("size,busbw", list(zip(AZURE_A100_SIZES, AZURE_A100_BUSBW)))
def test_a100_all_reduce_follows_nccl_tests_at_every_size(size, busbw):
    """The bundled DGX A100 gives back the measured bus bandwidth, 2(n-1)/n x S / t, at every size of the curve,
    from the 42 us latency floor at 64 KiB to the plateau (within 1%: the file's large-message figure is
    300 GB/s x 0.77 = 231.0 GB/s, against 231.6 measured)."""
    cluster = build_cluster(load_hardware("dgx-a100", base_dir=DATA, file="test.yaml")[0])
    t = _all_reduce_time(cluster, size)
    assert 2 * 7 / 8 * size / t / 1e9 == pytest.approx(busbw, rel=0.01)


def _curve_node(tmp_path, latency):
    """8 GPUs, 100 GB/s, efficiency 1, and a two-point curve: 25% of the bandwidth at 1 MB, all of it at 4 MB."""
    path = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s", "intra_node.latency": latency,
                                       "intra_node.busbw_curve": [[1e6, 0.25], [4e6, 1.0]]})
    return _cluster(path)


def test_curve_interpolates_in_log_size_and_floors_below_its_first_point(tmp_path):
    """Without latency the fraction is the curve's. Hand values, 8-GPU all-reduce (bytes 2 x 7/8 x S):
    - 2 MB, halfway in log size between 1 and 4 MB: fraction sqrt(0.25 x 1) = 0.5 -> 3.5e6 B / 50 GB/s = 70 us;
    - 0.5 MB, below the curve: the time of the first point, 1.75e6 B / 25 GB/s = 70 us (latency-bound floor);
    - 8 MB, above it: the full bandwidth, 14e6 B / 100 GB/s = 140 us."""
    cluster = _curve_node(tmp_path, "0 us")
    assert _all_reduce_time(cluster, 2e6) == pytest.approx(70e-6, rel=1e-9)
    assert _all_reduce_time(cluster, 0.5e6) == pytest.approx(70e-6, rel=1e-9)
    assert _all_reduce_time(cluster, 8e6) == pytest.approx(140e-6, rel=1e-9)


def test_curve_point_time_includes_the_step_latencies_once(tmp_path):
    """With 1 us per step the measured time of a curve point is still what the model gives: at 1 MB,
    1.75e6 B / (0.25 x 100 GB/s) = 70 us in all, of which 2(n-1) = 14 us are step latencies (not 70 + 14)."""
    cluster = _curve_node(tmp_path, "1 us")
    assert _all_reduce_time(cluster, 1e6) == pytest.approx(70e-6, rel=1e-9)


def test_half_peak_size_adds_to_the_message(tmp_path):
    """busbw(S) = B x S / (S + S_half): an 8-GPU all-reduce of S = S_half = 16 MiB at 100 GB/s, no latency,
    runs at half the bandwidth: 2 x 7/8 x 2 x 16 MiB / 100 GB/s."""
    path = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s", "intra_node.half_peak_message": "16 MiB"})
    cluster = _cluster(path)
    assert _all_reduce_time(cluster, 2**24) == pytest.approx(2 * 7 / 8 * 2 * 2**24 / 100e9, rel=1e-9)


def test_multi_node_all_gather_is_near_the_one_measurement_found():
    """NVIDIA/nccl#1218 (2024-03): all_gather_perf of 2 GiB on 32 H100 nodes (256 GPUs, 8 x 400 Gb/s NICs each)
    reached 200 GB/s bus bandwidth, (n-1)/n x S / t. The bundled dgx-h100 file, with no constant fitted to it,
    stays within 10% (docs/model.md section 4.3; a ring pipelining NVLink and NICs would give 376 GB/s)."""
    spec = load_hardware("dgx-h100", base_dir=DATA, file="test.yaml")[0].model_copy(update={"nodes": 32})
    cluster = build_cluster(spec)
    size, n = 2 * 2**30, 256
    t = sum(phase_time_alone(p, cluster) for p in collective_phases("all_gather", size, [list(range(n))], cluster))
    assert (n - 1) / n * size / t / 1e9 == pytest.approx(200, rel=0.10)
