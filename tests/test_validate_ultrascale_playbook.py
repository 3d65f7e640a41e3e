"""The Ultra-Scale Playbook benchmark cells (simtrain/validation/ultrascale_playbook.yaml): nanotron v0.5 on H100, the
best configuration per model size and node count as huggingface/nanotron docs/benchmark_summary.svg @c2528430 gives
them (MFU, DP / TP / PP / GAS / MBS / ZeRO), the models from scripts/scaling_benchmarks.py of the same commit."""

from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v

CASES = Path(str(resources.files("simtrain.validation") / "ultrascale_playbook.yaml"))
SOURCE = "huggingface/nanotron docs/benchmark_summary.svg"

# scripts/scaling_benchmarks.py model_configs (layers, hidden, heads, intermediate); tied embeddings under 10,000
MODELS = {"1.34B": (16, 2048, 32, 8192), "3.57B": (28, 3072, 32, 8192), "8.86B": (32, 4096, 32, 14336),
          "80B": (80, 8192, 64, 28672)}
# the SVG's cells, copied by hand: (model, nodes): (MFU %, dp, tp, pp, gradient accumulation, micro-batch, ZeRO stage);
# the 80B cell at 16 nodes (pp 32 over 80 layers, an uneven split) is left out
CELLS = {
    ("1.34B", 64): (5.25, 128, 2, 2, 1, 2, 1), ("3.57B", 64): (10.49, 128, 4, 1, 1, 2, 1),
    ("8.86B", 64): (18.69, 128, 4, 1, 1, 2, 0), ("80B", 64): (17.79, 32, 16, 1, 4, 2, 1),
    ("1.34B", 32): (23.20, 64, 4, 1, 1, 4, 0), ("3.57B", 32): (26.77, 64, 4, 1, 1, 4, 0),
    ("8.86B", 32): (32.71, 32, 8, 1, 1, 8, 0), ("80B", 32): (30.75, 4, 4, 16, 64, 1, 1),
    ("1.34B", 16): (29.46, 64, 2, 1, 1, 4, 0), ("3.57B", 16): (34.59, 32, 4, 1, 1, 8, 0),
    ("8.86B", 16): (36.33, 16, 8, 1, 2, 8, 0),
    ("1.34B", 8): (32.47, 32, 1, 2, 8, 1, 1), ("3.57B", 8): (35.53, 32, 1, 2, 8, 1, 1),
    ("8.86B", 8): (39.50, 32, 1, 2, 8, 1, 1), ("80B", 8): (30.65, 1, 4, 16, 256, 1, 0),
    ("1.34B", 4): (38.38, 16, 1, 2, 16, 1, 1), ("3.57B", 4): (40.39, 16, 1, 2, 8, 2, 1),
    ("8.86B", 4): (43.31, 16, 1, 2, 16, 1, 1), ("80B", 4): (14.76, 1, 8, 4, 256, 1, 0),
    ("1.34B", 2): (41.59, 8, 1, 2, 32, 1, 1), ("3.57B", 2): (43.77, 8, 1, 2, 16, 2, 1),
    ("8.86B", 2): (43.94, 4, 4, 1, 16, 4, 1),
    ("1.34B", 1): (44.32, 4, 1, 2, 16, 4, 1), ("3.57B", 1): (46.68, 4, 1, 2, 32, 2, 1),
    ("8.86B", 1): (45.22, 2, 1, 4, 128, 1, 1),
}


@pytest.fixture(scope="module")
def cases():
    return {c["id"]: c for c in case_files.load_cases(CASES)[0]}


@pytest.fixture(scope="module")
def results():
    return v.validate(CASES)


def _case(cases, model, nodes):
    return cases[f"usp_{model.replace('.', 'p').lower()}_{nodes}n"]


def test_every_expressible_cell_is_a_case_and_none_is_gated(cases):
    """25 cases, one per expressible cell of the figure, all ungated (peak, network and base config not stated)."""
    assert len(cases) == len(CELLS) == 25
    assert sum(c["gate"] for c in cases.values()) == 0
    assert all(c["assumed"] for c in cases.values())


def test_the_model_dims_give_the_figures_parameter_counts():
    """estimate_num_params of the sweep script (V h tied, 2 V h untied, plus L (3 h f + 4 h^2)) = the axis labels."""
    axis = {"1.34B": 1.34, "3.57B": 3.57, "8.86B": 8.86, "80B": 80.0}     # the SVG's x tick labels, billions
    for label, (layers, h, _, f) in MODELS.items():
        embed = 131072 * h * (1 if f < 10_000 else 2)
        params = embed + layers * (3 * h * f + 4 * h * h)
        assert float(f"{params / 1e9:.3g}") == axis[label], label


def test_layouts_are_the_figures(cases):
    """Each case runs the cell's DP / TP / PP / micro-batch / ZeRO on nodes x 8 GPUs, and DP x GAS x MBS = 256."""
    for (model, nodes), (_, dp, tp, pp, gas, mbs, zero) in CELLS.items():
        sc = _case(cases, model, nodes)["scenario"]
        par, tr = sc["parallel"], sc["training"]
        assert (par["dp"], par["tp"], par["pp"], par["zero"]) == (dp, tp, pp, zero), (model, nodes)
        assert sc["nodes"] * 8 == dp * tp * pp and tr["micro_batch"] == mbs
        assert tr["global_batch"] == dp * gas * mbs == 256 and tr["seq_len"] == 4096
        assert par["sequence_parallel"] is (tp > 1)        # TP mode REDUCE_SCATTER
        assert (sc["model"]["layers"], sc["model"]["hidden"], sc["model"]["heads"],
                sc["model"]["ffn_hidden"]) == MODELS[model]


def test_targets_are_nanotron_model_flops_over_mfu(cases):
    """Target = nanotron's model FLOPs of a step, 24Lbsh^2 + 12Lbs^2h + 18Lbshf + 6bshV, / (MFU x 989.5 TFLOP/s x n)."""
    b, s, vocab = 256, 4096, 131072
    for (model, nodes), (mfu, *_rest) in CELLS.items():
        layers, h, _, f = MODELS[model]
        flops = (24 * layers * b * s * h * h + 12 * layers * b * s * s * h + 18 * layers * b * s * h * f
                 + 6 * b * s * h * vocab)
        case = _case(cases, model, nodes)
        assert case["measured"]["mfu_percent"] == mfu
        assert case["target_step_time_s"] == pytest.approx(flops / (mfu / 100 * 989.5e12 * nodes * 8), rel=1e-4)


def test_every_case_simulates(results):
    """No case is refused: each prediction runs and gives a positive step time."""
    assert len(results) == 25
    assert all(r.failure is None and r.predicted_step_time_s > 0 for r in results), \
        [(r.id, r.failure) for r in results if r.failure]


def test_the_file_is_its_own_source(results):
    """The per-source summary groups the 25 cases under the nanotron figure, apart from every other bundled source."""
    groups = v.by_group(results, lambda r: v.source_name(r.source))
    assert list(groups) == [SOURCE] and groups[SOURCE].cases == 25
    others = set()
    for name, path in case_files.dev_case_files().items():
        if name != "ultrascale_playbook":
            others |= {v.source_name(str(c.get("source", ""))) for c in case_files.load_cases(path)[0]}
    assert SOURCE not in others
