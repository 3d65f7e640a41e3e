"""Hardware files and the cluster graph (issue 2, deliverable 3).

The bundled files must load, cite a source for every number, and match the
machines the issue names; the networkx graph must hold GPUs, switches and NICs
joined by directed links; template routes must be shortest paths of that graph.
"""

from __future__ import annotations

import re
from pathlib import Path

import networkx as nx
import pytest
import yaml
from conftest import DATA, REPO, hardware_variant, run_cli, scenario_dict

from simtrain.spec.hardware import HardwareSpec, load_hardware
from simtrain.spec.topology import build_cluster

HARDWARE_DIR = REPO / "hardware"
REQUIRED = ["dgx-a100", "dgx-h100"]
BUNDLED = sorted({p.stem for p in HARDWARE_DIR.glob("*.yaml")} | set(REQUIRED))

#: counts and labels that describe structure, not measured quantities (no source needed)
STRUCTURAL = {"name", "description", "fabric", "topology", "nodes", "gpus_per_node", "nics_per_node",
              "nodes_per_leaf", "kind", "a", "b", "node"}
_NUMERIC = re.compile(r"^\s*[-+]?(\d|\.\d)")


def _bundled(name: str) -> Path:
    path = HARDWARE_DIR / f"{name}.yaml"
    if not path.exists():
        pytest.skip(f"hardware/{name}.yaml not written yet")
    return path


def _load(name: str) -> HardwareSpec:
    return load_hardware(str(_bundled(name)), base_dir=REPO, file="test.yaml")[0]


def _unsourced(node, path: str = ""):
    """Dotted paths of numbers that are not given as {value, source} with a non-empty source."""
    if isinstance(node, dict):
        if "value" in node:
            if not str(node.get("source") or "").strip():
                yield path
            return
        for key, value in node.items():
            if key not in STRUCTURAL:
                yield from _unsourced(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _unsourced(value, f"{path}.{i}")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path
    elif isinstance(node, str) and _NUMERIC.match(node):
        yield path


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_hardware_file_loads(name):
    """Every bundled hardware file validates against the schema."""
    spec = _load(name)
    assert spec.gpu.memory > 0 and spec.gpu.peak("bf16") > 0


@pytest.mark.parametrize("name", BUNDLED)
def test_every_number_in_a_bundled_file_has_a_source(name):
    """Every quantity in a bundled hardware file is {value, source} with a non-empty source."""
    data = yaml.safe_load(_bundled(name).read_text(encoding="utf-8"))
    assert [p for p in _unsourced(data) if p != "inter_node.oversubscription"] == []


@pytest.mark.parametrize("name", BUNDLED)
def test_oversubscription_has_a_source(name):
    """The fabric's oversubscription ratio is a number from the world too: it needs a source."""
    data = yaml.safe_load(_bundled(name).read_text(encoding="utf-8"))
    assert "inter_node.oversubscription" not in list(_unsourced(data))


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_file_builds_a_two_node_graph(name):
    """Every bundled file becomes a connected two-node cluster graph."""
    spec = _load(name)
    cluster = build_cluster(spec, nodes=2)
    gpus = cluster.gpus
    assert gpus == 2 * spec.gpus_per_node
    assert nx.is_strongly_connected(cluster.graph)
    assert len(cluster.route(0, gpus - 1)) >= 2


def test_bundled_set_has_the_machines_the_issue_names():
    """Bundled files include an H200 node and a PCIe node without NVLink."""
    specs = [_load(name) for name in BUNDLED]
    assert any("H200" in s.gpu.name for s in specs), "no H200 node"
    assert any(s.intra_node is not None and s.intra_node.fabric == "pcie" for s in specs), "no PCIe node"


@pytest.mark.parametrize(("name", "gpu", "nic_bytes_per_s"), [
    ("dgx-a100", "A100", 200e9 / 8),   # 8x HDR InfiniBand 200 Gb/s (DGX A100 user guide)
    ("dgx-h100", "H100", 400e9 / 8),   # 8x NDR InfiniBand 400 Gb/s (DGX H100 datasheet)
])
def test_dgx_files_match_the_datasheets(name, gpu, nic_bytes_per_s):
    """DGX A100/H100: 8 GPUs of the named kind over NVSwitch, 8 NICs at the datasheet rate."""
    spec = _load(name)
    assert gpu in spec.gpu.name
    assert spec.gpus_per_node == 8 and spec.intra_node.fabric == "nvswitch"
    assert spec.inter_node.nics_per_node == 8
    assert spec.inter_node.nic_bandwidth == pytest.approx(nic_bytes_per_s)
    assert 80e9 <= spec.gpu.memory <= 86e9   # "80GB" class, decimal or the usable nvidia-smi figure


def test_dgx_h100_two_node_graph_structure():
    """dgx-h100 x 2 nodes: 16 GPUs, an NVSwitch per node, NICs, directed links with bandwidth and latency."""
    spec = _load("dgx-h100")
    g = build_cluster(spec, nodes=2).graph
    kinds = nx.get_node_attributes(g, "kind")
    gpus = [n for n, k in kinds.items() if k == "gpu"]
    assert len(gpus) == 16
    assert sum(k == "nvswitch" for k in kinds.values()) == 2
    assert sum(k == "nic" for k in kinds.values()) == 16
    assert g.is_directed()
    for a, b, attrs in g.edges(data=True):
        assert g.has_edge(b, a), f"link {a}->{b} has no reverse direction"
        assert attrs["bandwidth"] > 0 and attrs["latency"] >= 0
    # NVLink: 450 GB/s per direction (datasheet), scaled by the file's efficiency
    nvlink = g.edges["gpu0", "nvsw0"]["bandwidth"]
    assert nvlink == pytest.approx(450e9 * spec.intra_node.efficiency)
    # a message between nodes leaves through a NIC and no GPU-to-GPU route skips the network
    route = build_cluster(spec, nodes=2).route(0, 8)
    assert any(kinds[a] == "nic" for a, _ in route)


def _template(tmp_path: Path, fabric: str, topology: str) -> HardwareSpec:
    path = hardware_variant(tmp_path, {"intra_node.fabric": fabric, "inter_node.topology": topology,
                                       "inter_node.nodes_per_leaf": 2, "nodes": 4},
                            base=DATA / "core_two_nodes.yaml", name=f"{fabric}-{topology}")
    return load_hardware(str(path), base_dir=tmp_path, file="test.yaml")[0]


@pytest.mark.parametrize("topology", ["single-switch", "fat-tree", "rail-optimized"])
@pytest.mark.parametrize("fabric", ["nvswitch", "pcie"])
def test_template_routes_are_shortest_paths(tmp_path, fabric, topology):
    """A template route is a path of the graph with the fewest hops and the least latency (networkx)."""
    cluster = build_cluster(_template(tmp_path, fabric, topology))
    g = cluster.graph
    hops = dict(nx.all_pairs_shortest_path_length(g))
    fastest = dict(nx.all_pairs_dijkstra_path_length(g, weight="latency"))
    for a in range(cluster.gpus):
        for b in range(cluster.gpus):
            if a == b:
                continue
            route = cluster.route(a, b)
            src, dst = cluster.gpu(a), cluster.gpu(b)
            assert route[0][0] == src and route[-1][1] == dst
            assert all(route[i][1] == route[i + 1][0] for i in range(len(route) - 1))
            assert all(g.has_edge(*link) for link in route)
            assert len(route) == hops[src][dst], (a, b, route)
            assert cluster.route_latency(a, b) == pytest.approx(fastest[src][dst], abs=1e-15), (a, b, route)


@pytest.mark.parametrize("topology", ["single-switch", "fat-tree", "rail-optimized"])
@pytest.mark.parametrize("fabric", ["nvswitch", "pcie", "mesh"])
def test_template_links_read_from_names_are_the_graphs_edges(tmp_path, fabric, topology):
    """Cluster.has_link (names only, no graph) says yes exactly for the graph's edges, among every pair of its
    nodes and names it has no node for (a GPU, NIC, rail or leaf past the last)."""
    cluster = build_cluster(_template(tmp_path, fabric, topology))
    g = cluster.graph
    names = list(g) + [f"gpu{cluster.gpus}", "nic4.0", "nic0.8", "rail8", "leaf2", "nvsw4", "host4", "gpu0.1", "x"]
    for a in names:
        for b in names:
            assert cluster.has_link(a, b) == g.has_edge(a, b), (a, b)


def test_explicit_routes_follow_the_graph():
    """An explicit topology routes through its listed links (star: GPU -> switch -> GPU)."""
    spec = load_hardware(str(DATA / "core_star8.yaml"), base_dir=DATA, file="test.yaml")[0]
    cluster = build_cluster(spec)
    assert cluster.gpus == 8
    assert cluster.route(2, 5) == (("gpu2", "nvsw"), ("nvsw", "gpu5"))
    assert cluster.route_latency(2, 5) == pytest.approx(2e-6)


def _scenario_on(raw_changes: dict, **kwargs):
    from simtrain.spec.scenario import scenario_from_dict

    raw = scenario_dict(hardware="dgx-h100", nodes=None, model="llama2-7b", **kwargs)
    raw.update(raw_changes)
    return scenario_from_dict(raw, file="test.yaml", base_dir=DATA)


def test_scenario_nodes_override_scales_to_16384_gpus():
    """hardware: dgx-h100 with nodes: 2048 is a 16,384-GPU cluster."""
    _bundled("dgx-h100")
    s = _scenario_on({"nodes": 2048}, training={"seq_len": 4096, "global_batch": 2048},
                     parallel={"dp": 2048, "tp": 8, "pp": 1})
    assert s.nodes == 2048 and s.gpus_per_node == 8
    assert s.cluster.gpus == 16_384 and s.gpus == 16_384


def test_scenario_gpus_per_node_override_gives_one_gpu():
    """hardware: dgx-h100 with gpus_per_node: 1 is a single GPU."""
    _bundled("dgx-h100")
    s = _scenario_on({"gpus_per_node": 1}, training={"seq_len": 4096, "global_batch": 8})
    assert s.cluster.gpus == 1 and s.gpus == 1
    assert [n for n, k in s.cluster.graph.nodes(data="kind") if k == "gpu"] == ["gpu0"]


@pytest.mark.parametrize("name", ["dgx-h100", "hgx-h200"])
def test_hopper_files_hold_the_sustained_matmul_rate(name):
    """Hopper at 700 W holds 743-746 TFLOP/s of dense BF16 matmul once saturated (MSMF), against 843-850 in a short
    burst (MAMF), five runs each on an H200 (stas00/ml-engineering, compute/accelerator/benchmarks/README.md):
    744.5 / 846.5 = 0.880. The H100 has the same die, clocks and power limit."""
    assert _load(name).compute.sustained_fraction == pytest.approx(744.5 / 846.5, abs=5e-4)


def test_gpus_without_a_sustained_measurement_keep_their_benchmark_rate():
    """No sustained-rate measurement is published for the A100 or L40S: their curves stand as measured."""
    for name in ("dgx-a100", "pcie-l40s"):
        assert _load(name).compute.sustained_fraction == 1.0


def test_grand_teton_file_holds_the_torchtitan_hardware_statement():
    """torchtitan's H100 benchmarks ran on 96GB HBM2e at 2.4 TB/s, a 500 W limit and 400 Gb/s per GPU
    (benchmarks/llama3_h100_202412_torchtitan.md); PyTorch reports 33.21 GiB as 34.95% of the device (PR #1884 log)."""
    spec = _load("grand-teton-h100-96gb")
    assert spec.gpu.memory / 2**30 == pytest.approx(33.21 / 0.3495, abs=0.01)
    assert spec.gpu.memory_bandwidth == 2.4e12
    assert spec.gpu.power == 500.0
    assert spec.inter_node.nic_bandwidth * 8 == 400e9
    assert spec.inter_node.nics_per_node == spec.gpus_per_node == 8


def test_grand_teton_gemm_rate_is_no_faster_than_the_700_w_h100():
    """A lower power limit cannot raise the clock a saturated GPU holds: the 500 W file's matmul rate is at most the
    700 W H100's (dgx-h100.yaml), the bound its source text states."""
    h100, teton = _load("dgx-h100"), _load("grand-teton-h100-96gb")
    assert teton.gpu.peak("bf16") * teton.compute.sustained_fraction <= \
        h100.gpu.peak("bf16") * h100.compute.sustained_fraction


@pytest.mark.parametrize("section", ["compute", "intra_node", "inter_node"])
def test_an_overlap_slowdown_below_1_is_refused(tmp_path, monkeypatch, capsys, section):
    """Rule: overlap_slowdown multiplies compute time while a collective runs (docs/model.md section 7), so it is at
    least 1: 0.5 would make overlapped compute twice as fast as compute alone. Exit 2, one line naming the hardware
    file, the key's line, the field, the value and the range, in each section that may set it."""
    hw = hardware_variant(tmp_path, {f"{section}.overlap_slowdown": 0.5})
    lines = hw.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"{section}:")
    line = next(i for i, text in enumerate(lines[start:], start + 1) if text.startswith("  overlap_slowdown:"))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario_dict(hardware=hw)), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["run", "s.yaml"], capsys)
    assert (code, out) == (2, "")
    assert err == (f"error: hw.yaml:{line}: {section}.overlap_slowdown: 0.5 is outside the range simtrain accepts "
                   "(1 to 1000: it multiplies compute time while a collective runs; below 1 overlapped compute would "
                   "run faster)\n")
