"""The JAX-Toolbox Pax cases (simtrain/validation/jax_toolbox_pax.yaml): NVIDIA/JAX-Toolbox
rosetta/rosetta/projects/pax/README.md @00056429, "A100 Results" and "H100 Results", GPT 126M / 5B / 175B on DGX
A100 80G and DGX H100 80G, models from google/paxml paxml/contrib/gpu/scripts_gpu/configs.py @7241216."""

from importlib import resources
from pathlib import Path

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v

CASES = Path(str(resources.files("simtrain.validation") / "jax_toolbox_pax.yaml"))
SOURCE = "NVIDIA/JAX-Toolbox rosetta/rosetta/projects/pax/README.md"

# the README's rows, copied by hand: (table, size, precision, #GPUs, DP, FSDP, BS / GPU, sequences/s); the A100 175B
# BF16 row has no figure ("*")
ROWS = [
    ("a100", "126M", "BF16", 64, 64, 1, 4, 2098.16),
    ("a100", "5B", "BF16", 256, 1, 256, 8, 594.13),
    ("a100", "126M", "TE BF16", 64, 64, 1, 4, 2526.72),
    ("a100", "5B", "TE BF16", 256, 1, 256, 8, 718.19),
    ("a100", "175B", "TE BF16", 256, 1, 256, 6, 20.44),
    ("h100", "126M", "TE BF16", 64, 64, 1, 4, 4709.12),
    ("h100", "5B", "TE BF16", 256, 1, 256, 8, 1657.24),
    ("h100", "175B", "TE BF16", 256, 1, 256, 6, 51.00),
    ("h100", "5B", "TE FP8", 256, 1, 256, 8, 2374.66),
    ("h100", "175B", "TE FP8", 256, 1, 256, 6, 84.45),
]
# configs.py: NUM_LAYERS, MODEL_DIMS, NUM_HEADS, HIDDEN_DIMS, VOCAB_SIZE
MODELS = {"126M": (12, 768, 12, 3072, 50304), "5B": (24, 4096, 32, 16384, 50304),
          "175B": (96, 12288, 96, 49152, 50257)}


def _id(gpu, size, precision, gpus):
    return f"pax_{gpu}_{size.lower()}_{precision.lower().replace(' ', '_')}_{gpus}gpu"


@pytest.fixture(scope="module")
def cases():
    return {c["id"]: c for c in case_files.load_cases(CASES)[0]}


def test_every_row_with_a_figure_is_an_ungated_case(cases):
    """Ten cases, one per row with a figure; none gated (XLA vs TE kernels, FSDP gather dtype, 5B remat not stated)."""
    assert set(cases) == {_id(g, s, p, n) for g, s, p, n, *_ in ROWS} and len(cases) == 10
    assert not any(c["gate"] for c in cases.values()) and all(c["assumed"] for c in cases.values())


def test_layouts_and_models_are_the_readmes(cases):
    """GPUs = 8 x nodes on the row's DGX; DP 64 plain or FSDP 256 (ZeRO-3); batch = BS/GPU x GPUs; the config's dims."""
    for gpu, size, precision, gpus, dp, fsdp, bs, _ in ROWS:
        sc = cases[_id(gpu, size, precision, gpus)]["scenario"]
        assert sc["hardware"] == f"dgx-{gpu}" and sc["nodes"] * 8 == gpus == dp * fsdp
        assert sc["parallel"]["dp"] == gpus and sc["parallel"]["zero"] == (3 if fsdp > 1 else 0)
        assert sc["training"]["global_batch"] == bs * gpus and sc["training"]["micro_batch"] == bs
        assert sc["training"]["seq_len"] == 2048 and (sc["training"]["precision"] == "fp8") is precision.endswith("FP8")
        model = sc["model"]
        assert (model["layers"], model["hidden"], model["heads"], model["ffn_hidden"], model["vocab"]) == MODELS[size]
        assert sc["training"]["recompute"] == {"126M": "none", "5B": "selective", "175B": "full"}[size]


def test_targets_are_batch_over_sequences_per_second(cases):
    """Target = BS/GPU x GPUs / the row's sequences/s (A100 175B TE BF16: 1536 / 20.44 = 75.15 s)."""
    for gpu, size, precision, gpus, _, _, bs, seqs in ROWS:
        case = cases[_id(gpu, size, precision, gpus)]
        assert case["measured"]["sequences_per_s"] == seqs
        assert case["target_step_time_s"] == pytest.approx(bs * gpus / seqs, rel=1e-5)
    assert cases["pax_a100_175b_te_bf16_256gpu"]["target_step_time_s"] == pytest.approx(75.15, abs=0.01)


def test_every_case_simulates_and_is_its_own_source():
    """Each prediction runs; the per-source summary groups the ten under the README, apart from the other sources."""
    results = v.validate(CASES)
    assert len(results) == 10 and all(r.failure is None and r.predicted_step_time_s > 0 for r in results)
    groups = v.by_group(results, lambda r: v.source_name(r.source))
    assert list(groups) == [SOURCE] and groups[SOURCE].cases == 10
    others = set()
    for name, path in case_files.dev_case_files().items():
        if name != "jax_toolbox_pax":
            others |= {v.source_name(str(c.get("source", ""))) for c in case_files.load_cases(path)[0]}
    assert SOURCE not in others
