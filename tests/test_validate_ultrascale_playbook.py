"""The Ultra-Scale Playbook benchmarks (simtrain/validation/ultrascale_playbook.yaml): nanotron on 8 x H100 nodes, the
points of the playbook's interactive benchmark figure (assets/data/benchmarks/benchmarks_interactive.html of the
Hugging Face space nanotron/ultrascale-playbook), with the settings of nanotron's sweep generator and base config."""

from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v

CASES = Path(str(resources.files("simtrain.validation") / "ultrascale_playbook.yaml"))
SOURCE = "nanotron/ultrascale-playbook assets/data/benchmarks/benchmarks_interactive.html"

# scripts/scaling_benchmarks.py model_configs (layers, hidden, heads, intermediate); tied embeddings under 10,000
MODELS = {"1B": (16, 2048, 32, 8192), "3B": (28, 3072, 32, 8192), "8B": (32, 4096, 32, 14336),
          "80B": (80, 8192, 64, 28672)}
# the figure's points, copied from their hover texts: (panel, Nodes, MBS, GradAcc, DP, PP, TP, ZeRO, tok/s/gpu); every
# successful 1-node run of 1B, 3B and 8B (less the two whose DP x MBS x GradAcc is not 256 and the 1B DP 1 PP 8 run),
# then the best configuration per model and node count above one node (docs/benchmark_summary.svg)
POINTS = [
    ("1B", 1, 1, 32, 8, 1, 1, 0, 39_273),
    # the six PP-1 points with MBS > 1 (added after review: the figure's hover texts, read by hand)
    ("1B", 1, 2, 16, 8, 1, 1, 0, 40_150),
    ("1B", 1, 8, 8, 4, 1, 2, 0, 37_628),
    ("1B", 1, 16, 8, 2, 1, 4, 0, 33_597),
    ("3B", 1, 2, 16, 8, 1, 1, 1, 15_997),
    ("3B", 1, 2, 32, 4, 1, 2, 1, 14_532),
    ("3B", 1, 8, 16, 2, 1, 4, 0, 13_367),
    ("1B", 1, 1, 32, 8, 1, 1, 1, 39_006),
    ("1B", 1, 1, 64, 4, 1, 2, 0, 29_274),
    ("1B", 1, 1, 64, 4, 1, 2, 1, 27_877),
    ("1B", 1, 1, 64, 4, 2, 1, 0, 37_995),
    ("1B", 1, 1, 64, 4, 2, 1, 1, 37_802),
    ("1B", 1, 1, 128, 2, 1, 4, 0, 14_368),
    ("1B", 1, 1, 128, 2, 1, 4, 1, 14_047),
    ("1B", 1, 1, 128, 2, 2, 2, 0, 23_340),
    ("1B", 1, 1, 128, 2, 2, 2, 1, 20_952),
    ("1B", 1, 1, 128, 2, 4, 1, 0, 36_910),
    ("1B", 1, 1, 128, 2, 4, 1, 1, 37_097),
    ("1B", 1, 1, 256, 1, 1, 8, 0, 6_907),
    ("1B", 1, 1, 256, 1, 2, 4, 0, 12_013),
    ("1B", 1, 1, 256, 1, 4, 2, 0, 23_540),
    ("1B", 1, 2, 32, 4, 2, 1, 1, 38_299),
    ("1B", 1, 2, 64, 2, 2, 2, 1, 23_765),
    ("1B", 1, 2, 64, 2, 4, 1, 1, 37_078),
    ("1B", 1, 4, 16, 4, 2, 1, 1, 38_895),
    ("1B", 1, 4, 32, 2, 2, 2, 1, 35_063),
    ("1B", 1, 4, 32, 2, 4, 1, 1, 36_566),
    ("1B", 1, 8, 16, 2, 2, 2, 1, 35_325),
    ("1B", 1, 8, 32, 1, 2, 4, 0, 32_640),
    ("1B", 1, 8, 32, 1, 4, 2, 0, 34_469),
    ("1B", 1, 16, 16, 1, 1, 8, 0, 28_101),
    ("1B", 1, 16, 16, 1, 2, 4, 0, 32_814),
    ("3B", 1, 1, 32, 8, 1, 1, 1, 16_341),
    ("3B", 1, 1, 64, 4, 1, 2, 0, 13_834),
    ("3B", 1, 1, 64, 4, 1, 2, 1, 13_875),
    ("3B", 1, 1, 64, 4, 2, 1, 0, 15_565),
    ("3B", 1, 1, 64, 4, 2, 1, 1, 15_567),
    ("3B", 1, 1, 128, 2, 1, 4, 0, 8_488),
    ("3B", 1, 1, 128, 2, 1, 4, 1, 8_187),
    ("3B", 1, 1, 128, 2, 2, 2, 0, 13_288),
    ("3B", 1, 1, 128, 2, 2, 2, 1, 12_868),
    ("3B", 1, 1, 128, 2, 4, 1, 0, 15_278),
    ("3B", 1, 1, 128, 2, 4, 1, 1, 15_402),
    ("3B", 1, 1, 256, 1, 1, 8, 0, 4_144),
    ("3B", 1, 1, 256, 1, 2, 4, 0, 7_431),
    ("3B", 1, 1, 256, 1, 4, 2, 0, 13_100),
    ("3B", 1, 1, 256, 1, 8, 1, 0, 14_833),
    ("3B", 1, 2, 32, 4, 2, 1, 1, 16_426),
    ("3B", 1, 2, 64, 2, 2, 2, 1, 13_799),
    ("3B", 1, 2, 64, 2, 4, 1, 1, 16_097),
    ("3B", 1, 4, 32, 2, 2, 2, 1, 14_666),
    ("3B", 1, 8, 32, 1, 2, 4, 0, 13_991),
    ("3B", 1, 16, 16, 1, 1, 8, 0, 11_855),
    ("8B", 1, 1, 64, 4, 1, 2, 1, 7_141),
    ("8B", 1, 1, 64, 4, 2, 1, 1, 2_752),
    ("8B", 1, 1, 128, 2, 1, 4, 0, 6_268),
    ("8B", 1, 1, 128, 2, 1, 4, 1, 6_238),
    ("8B", 1, 1, 128, 2, 2, 2, 0, 6_766),
    ("8B", 1, 1, 128, 2, 2, 2, 1, 6_753),
    ("8B", 1, 1, 128, 2, 4, 1, 1, 7_503),
    ("8B", 1, 1, 256, 1, 1, 8, 0, 3_616),
    ("8B", 1, 1, 256, 1, 2, 4, 0, 5_883),
    ("8B", 1, 1, 256, 1, 4, 2, 0, 6_689),
    ("8B", 1, 1, 256, 1, 8, 1, 0, 6_807),
    ("8B", 1, 2, 64, 2, 2, 2, 1, 7_016),
    ("8B", 1, 8, 32, 1, 1, 8, 0, 5_909),
    ("1B", 64, 2, 1, 128, 2, 2, 1, 4_603),
    ("3B", 64, 2, 1, 128, 1, 4, 1, 4_045),
    ("8B", 64, 2, 1, 128, 1, 4, 0, 3_101),
    ("80B", 64, 2, 4, 32, 1, 16, 1, 343),
    ("1B", 32, 4, 1, 64, 1, 4, 0, 23_775),
    ("3B", 32, 4, 1, 64, 1, 4, 0, 10_323),
    ("8B", 32, 8, 1, 32, 1, 8, 0, 5_428),
    ("80B", 32, 1, 64, 4, 16, 4, 1, 594),
    ("1B", 16, 4, 1, 64, 1, 2, 0, 30_186),
    ("3B", 16, 8, 1, 32, 1, 4, 0, 13_337),
    ("8B", 16, 8, 2, 16, 1, 8, 0, 6_028),
    ("1B", 8, 1, 8, 32, 2, 1, 1, 28_494),
    ("3B", 8, 1, 8, 32, 2, 1, 1, 12_501),
    ("8B", 8, 1, 8, 32, 2, 1, 1, 6_555),
    ("1B", 4, 1, 16, 16, 2, 1, 1, 33_677),
    ("3B", 4, 2, 8, 16, 2, 1, 1, 14_210),
    ("8B", 4, 1, 16, 16, 2, 1, 1, 7_186),
    ("1B", 2, 1, 32, 8, 2, 1, 1, 36_497),
    ("3B", 2, 2, 16, 8, 2, 1, 1, 15_402),
    ("8B", 2, 4, 16, 4, 1, 4, 1, 7_290),
]


def _id(model, nodes, mbs, dp, pp, tp, zero):
    return f"usp_{model.lower()}_{nodes}n_dp{dp}_tp{tp}_pp{pp}_mbs{mbs}_z{zero}"


@pytest.fixture(scope="module")
def cases():
    return {c["id"]: c for c in case_files.load_cases(CASES)[0]}


@pytest.fixture(scope="module")
def results():
    return v.validate(CASES)


def test_the_points_are_the_cases(cases):
    """86 cases, one per point listed here; 66 gated: the 1-node runs (no EFA), those with TP > 1 under nanotron's
    asynchronous TP linears (tp_mode REDUCE_SCATTER with tp_linear_async_communication, scaling_benchmarks.py)."""
    assert set(cases) == {_id(m, n, mbs, dp, pp, tp, z) for m, n, mbs, _, dp, pp, tp, z, _ in POINTS}
    assert len(cases) == 86
    gated = {cid for cid, c in cases.items() if c["gate"]}
    assert gated == {_id(m, n, mbs, dp, pp, tp, z) for m, n, mbs, _, dp, pp, tp, z, _ in POINTS if n == 1}
    assert len(gated) == 66
    for c in cases.values():
        par = c["scenario"]["parallel"]
        assert par.get("tp_async_linears", False) == (par["tp"] > 1) and par["sequence_parallel"] == (par["tp"] > 1)
    assert all(cases[cid]["assumed"] == [] for cid in gated)
    assert all(c["assumed"] for cid, c in cases.items() if cid not in gated)


def test_the_model_dims_give_the_figures_parameter_counts():
    """The sweep script's estimate_num_params (V h tied or 2 V h, plus L (3 h f + 4 h^2)) = 1.34/3.57/8.86/80.0 B."""
    axis = {"1B": 1.34, "3B": 3.57, "8B": 8.86, "80B": 80.0}     # docs/benchmark_summary.svg x tick labels, billions
    for label, (layers, h, _, f) in MODELS.items():
        params = 131072 * h * (1 if f < 10_000 else 2) + layers * (3 * h * f + 4 * h * h)
        assert float(f"{params / 1e9:.3g}") == axis[label], label


def test_layouts_are_the_points(cases):
    """Each case runs its point's nodes x 8 GPUs, DP / TP / PP / MBS / ZeRO, GBS 256 = DP x MBS x GradAcc, seq 4096."""
    for m, nodes, mbs, gas, dp, pp, tp, zero, _ in POINTS:
        sc = cases[_id(m, nodes, mbs, dp, pp, tp, zero)]["scenario"]
        par, tr, model = sc["parallel"], sc["training"], sc["model"]
        assert sc["nodes"] * 8 == dp * tp * pp and dp * mbs * gas == tr["global_batch"] == 256
        assert tr["seq_len"] == 4096 and tr["micro_batch"] == mbs and tr["recompute"] == "none"
        assert par["sequence_parallel"] is (tp > 1)                   # tp_mode REDUCE_SCATTER
        assert (model["layers"], model["hidden"], model["heads"], model["ffn_hidden"]) == MODELS[m]
        assert model["tied_embeddings"] is (MODELS[m][3] < 10_000) and model["vocab"] == 131072
        if pp > 1:
            split = par["layers_per_stage"]
            assert len(split) == pp and sum(split) == MODELS[m][0] and all(split[:-1])


def test_stages_follow_nanotrons_cost_walk(cases):
    """nanotron's build_model split, by hand: 1B PP 4 = 6,5,5,0 (layer c = 2^26, head 4c: thresholds 5c, 10c, 15c);
    3B PP 8 = 4 x 7, 0 (head 3.56 layers: a stage's share is 3.94 layers, passed at the 4th)."""
    assert cases[_id("1B", 1, 1, 2, 4, 1, 0)]["scenario"]["parallel"]["layers_per_stage"] == [6, 5, 5, 0]
    assert cases[_id("3B", 1, 1, 1, 8, 1, 0)]["scenario"]["parallel"]["layers_per_stage"] == [4] * 7 + [0]
    assert cases[_id("1B", 1, 1, 4, 2, 1, 0)]["scenario"]["parallel"]["layers_per_stage"] == [11, 5]


def test_targets_are_the_measured_throughput(cases):
    """Target = 256 x 4096 tokens / (GPUs x the point's tok/s/gpu)."""
    for m, nodes, mbs, _, dp, pp, tp, zero, tokens_per_gpu in POINTS:
        case = cases[_id(m, nodes, mbs, dp, pp, tp, zero)]
        assert case["measured"]["tokens_per_s_per_gpu"] == tokens_per_gpu
        assert case["target_step_time_s"] == pytest.approx(256 * 4096 / (nodes * 8 * tokens_per_gpu), rel=1e-5)


def test_every_case_simulates(results):
    """No case is refused: each prediction runs and gives a positive step time."""
    assert len(results) == 86
    assert all(r.failure is None and r.predicted_step_time_s > 0 for r in results), \
        [(r.id, r.failure) for r in results if r.failure]


def test_the_file_is_its_own_source(results):
    """The per-source summary groups the 86 cases under the playbook's figure, apart from every other bundled source."""
    groups = v.by_group(results, lambda r: v.source_name(r.source))
    assert list(groups) == [SOURCE] and groups[SOURCE].cases == 86
    others = set()
    for name, path in case_files.dev_case_files().items():
        if name != "ultrascale_playbook":
            others |= {v.source_name(str(c.get("source", ""))) for c in case_files.load_cases(path)[0]}
    assert SOURCE not in others
