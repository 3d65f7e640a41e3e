"""Property-based tests (issue 8, deliverable 3): generated scenarios either simulate or raise the
documented InputError, and every simulated step obeys invariants that follow from the definitions.

Scenarios are small (a few layers of width <= 128, <= 8 GPUs of the tiny test node) so that each
simulates in well under 0.2 s; example counts are limited so the file runs in well under a minute.
The YAML fuzzers feed random bytes and mutated copies of a valid scenario to the loader.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simtrain.engine.simulation import memory, simulate
from simtrain.spec.errors import InputError
from simtrain.spec.scenario import load_scenario, scenario_from_dict

GOOD = Path(__file__).resolve().parent / "bad_inputs" / "good"
HW = GOOD / "hw.yaml"          # tiny test node: 80 GiB, 100 TFLOPS bf16, 4 GPUs per node, single switch
BASE_TEXT = (GOOD / "base.yaml").read_text(encoding="utf-8")
# No example database: nothing is written into the checkout; a failure prints its example to reproduce.
FAST = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def scenarios(draw, valid_bias: bool = True) -> dict:
    """A raw scenario mapping: mostly consistent layouts, sometimes not (those must raise InputError)."""
    nodes = draw(st.sampled_from([1, 2]))
    gpn = draw(st.sampled_from([1, 2, 4]))
    gpus = nodes * gpn
    tp = draw(st.sampled_from(_divisors(gpus)))
    pp = draw(st.sampled_from(_divisors(gpus // tp)))
    dp = gpus // (tp * pp)
    if not valid_bias and draw(st.booleans()):
        dp = draw(st.integers(1, 8))                      # may not match the GPU count
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([8, 16]))
    hidden = heads * head_dim
    kv_heads = draw(st.sampled_from(_divisors(heads)))
    vpp = draw(st.sampled_from([1, 2]))
    layers = pp * vpp * draw(st.integers(1, 3))
    if not valid_bias and draw(st.booleans()):
        layers = draw(st.integers(1, 8))                  # may not divide into stages
    schedule = "interleaved-1f1b" if vpp > 1 else draw(st.sampled_from(["gpipe", "1f1b"]))
    micro = draw(st.integers(1, 3))
    per_replica = draw(st.integers(1, 4)) * (pp if schedule == "interleaved-1f1b" else 1)
    global_batch = micro * dp * per_replica
    if not valid_bias and draw(st.booleans()):
        global_batch = draw(st.integers(1, 40))           # may not divide
    sim: dict = {"fidelity": draw(st.sampled_from(["folded", "full"]))}
    if draw(st.integers(0, 4)) == 0:
        sim["jitter"] = draw(st.sampled_from([0.05, 0.2]))
        sim["seed"] = draw(st.integers(0, 3))
    if draw(st.integers(0, 4)) == 0:
        sim["stragglers"] = [{"rank": draw(st.integers(0, gpus - 1)), "slowdown": draw(st.sampled_from([1.2, 2.0]))}]
    return {
        "name": "generated",
        "hardware": str(HW),
        "nodes": nodes,
        "gpus_per_node": gpn,
        "model": {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
                  "ffn_hidden": hidden * draw(st.sampled_from([2, 4])), "vocab": draw(st.sampled_from([16, 100, 256])),
                  "mlp": draw(st.sampled_from(["gelu", "swiglu"])), "tied_embeddings": draw(st.booleans())},
        "training": {"seq_len": draw(st.sampled_from([16, 64, 128])), "global_batch": global_batch,
                     "micro_batch": micro, "precision": draw(st.sampled_from(["bf16", "fp16", "fp32"])),
                     "optimizer": draw(st.sampled_from(["adam", "adam", "sgd", "adafactor"])),
                     "recompute": draw(st.sampled_from(["none", "selective", "full"])),
                     "flash_attention": draw(st.booleans())},
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "vpp": vpp, "schedule": schedule,
                     "zero": draw(st.sampled_from([0, 1, 2, 3])), "sequence_parallel": draw(st.booleans())},
        "simulation": sim,
    }


def _build(raw: dict):
    return scenario_from_dict(raw, file="generated.yaml", base_dir=GOOD)


@FAST
@given(scenarios(valid_bias=False))
def test_generated_scenarios_simulate_or_raise_input_error(raw):
    """Any generated scenario either simulates or raises InputError: never another exception."""
    try:
        result = simulate(_build(raw))
    except InputError as err:
        assert str(err)                      # a message, located where it can be
        return
    assert result.step_time_s > 0


def _gemm_params_lower_bound(model: dict) -> int:
    """Weights that take part in matrix multiplies: per layer Q and O (h x h each), K and V (h x kv each),
    the MLP matrices (2 or 3 of h x f), plus the input embedding (vocab x h). Norms and biases only add."""
    h, f = model["hidden"], model["ffn_hidden"]
    kv = h // model["heads"] * model["kv_heads"]
    matrices = 3 if model["mlp"] == "swiglu" else 2
    return model["layers"] * (2 * h * h + 2 * h * kv + matrices * h * f) + model["vocab"] * h


@FAST
@given(scenarios())
def test_invariants_of_every_simulated_step(raw):
    """Step time > 0; utilization and bubble fraction in [0, 1]; tokens/s x step time = tokens per step;
    peak memory >= the GPU's share of weights + Adam state."""
    try:
        scenario = _build(raw)
    except InputError:
        assume(False)
    result = simulate(scenario)
    assert result.step_time_s > 0 and math.isfinite(result.step_time_s)
    assert 0.0 <= result.bubble_fraction <= 1.0
    for device in result.devices:
        assert 0.0 <= device.compute_utilization <= 1.0 + 1e-12
    tokens_per_step = raw["training"]["global_batch"] * raw["training"]["seq_len"]
    assert result.tokens_per_s * result.step_time_s == pytest.approx(tokens_per_step, rel=1e-12)

    # Static memory (reference article rule 2; ZeRO paper Sec. 3.1): 16-bit weights are 2 bytes per
    # parameter (fp32: 4), mixed-precision Adam keeps 12 more (fp32 master, momentum, variance; fp32
    # training: 8). TP and PP split the weights; ZeRO-1/2 shard the optimizer over DP, ZeRO-3 the weights too.
    par, tr = raw["parallel"], raw["training"]
    weights = 4.0 if tr["precision"] == "fp32" else 2.0
    adam = (8.0 if tr["precision"] == "fp32" else 12.0) if tr["optimizer"] == "adam" else 0.0
    share = _gemm_params_lower_bound(raw["model"]) / (par["tp"] * par["pp"])
    bound = share * (weights / (par["dp"] if par["zero"] >= 3 else 1) + adam / (par["dp"] if par["zero"] >= 1 else 1))
    assert result.peak_memory_bytes_max >= bound * (1 - 1e-12)


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_more_microbatches_never_lower_compute_time(raw):
    """Doubling the micro-batches (same micro-batch size) never lowers any stage's compute busy time."""
    raw["simulation"].pop("jitter", None)         # the same kernels must take the same time in both runs
    try:
        scenario = _build(raw)
    except InputError:
        assume(False)
    doubled = scenario.with_overrides({"training.global_batch": 2 * raw["training"]["global_batch"]})
    assert doubled.microbatches == 2 * scenario.microbatches
    before, after = simulate(scenario), simulate(doubled)
    for one, two in zip(before.stages, after.stages):
        assert two.compute_s >= one.compute_s * (1 - 1e-9), (one.pp, one.compute_s, two.compute_s)


# --- the loader never fails with anything but InputError ----------------------------------------

def _load_only(path: Path) -> None:
    try:
        scenario = load_scenario(path)
    except InputError as err:
        assert "\n" not in str(err)           # always one line
        return
    memory(scenario)                          # a loaded scenario is one the rest of simtrain accepts


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_loader(tmp_path_factory, data):
    """Random bytes as a scenario file raise InputError (or, by chance, load): nothing else."""
    path = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    path.write_bytes(data)
    _load_only(path)


_TOKENS = ["", " ", ":", "- ", "[", "]", "{", "}", ",", "'", '"', "&a", "*a", "!!str", "!!python/name:os.system",
           "\t", "#", "---", "...", "0", "-1", "1e999", ".nan", "null", "yes", "~", "\\", "\x00", "é", "%",
           "99999999999999999999", "8 GB", "-4", "1.5", "<<: *a", "? ", "|", ">"]


@st.composite
def mutated_scenarios(draw) -> str:
    """The valid base scenario with a few random edits: tokens inserted, text deleted, lines repeated or swapped."""
    text = BASE_TEXT.replace("hardware: hw.yaml", f"hardware: {HW}").replace("model: model.yaml",
                                                                            f"model: {GOOD / 'model.yaml'}")
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "repeat", "swap", "replace_value"]))
        lines = text.splitlines(keepends=True)
        if kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(_TOKENS) | st.text(max_size=5)) + text[at:]
        elif kind == "delete":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        elif kind == "repeat" and lines:
            i = draw(st.integers(0, len(lines) - 1))
            text = "".join(lines[:i + 1] + [lines[i]] + lines[i + 1:])
        elif kind == "swap" and len(lines) > 1:
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "".join(lines)
        elif kind == "replace_value":
            candidates = [i for i, line in enumerate(lines) if ": " in line and not line.lstrip().startswith("#")]
            if candidates:
                i = draw(st.sampled_from(candidates))
                key = lines[i].split(": ", 1)[0]
                lines[i] = f"{key}: {draw(st.sampled_from(_TOKENS))}\n"
                text = "".join(lines)
    return text


@FUZZ
@given(mutated_scenarios())
def test_mutated_scenarios_never_crash_the_loader(tmp_path_factory, text):
    """A valid scenario with random edits loads or raises InputError: never another exception."""
    path = tmp_path_factory.mktemp("mutant") / "s.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _load_only(path)


@FUZZ
@given(st.dictionaries(st.sampled_from(["parallel.tp", "parallel.pp", "training.global_batch", "model",
                                        "simulation.stragglers.0.rank", "hardware", "parallel", "nodes",
                                        "training.seq_len", "x.y", "simulation.max_events"]),
                       st.one_of(st.integers(-3, 10**6), st.text(max_size=6), st.none(), st.booleans(),
                                 st.floats(allow_nan=True), st.lists(st.integers(), max_size=3)),
                       max_size=3))
def test_random_overrides_never_crash(overrides):
    """--set style overrides with random values load or raise InputError: never another exception."""
    path = GOOD / "base.yaml"
    try:
        scenario = load_scenario(path, overrides)
    except InputError as err:
        assert "\n" not in str(err)
        return
    memory(scenario)
