"""The fuzzing harness (issue 26, deliverable 6): hostile values in every input simtrain takes (scenario, hardware,
model and HuggingFace config files, command-line flags and grid values, Python API arguments).

The invariant: the command exits 0 or 2, never 1; stderr never holds a traceback; an exit 2 is one line; a run that
exits 0 writes a report whose numbers are all finite; each example finishes in bounded time. A Python call returns
or raises InputError (a TypeError naming the argument for a value of the wrong Python type), never anything else.

The default test run has a small, derandomized budget (the same examples every time, about a minute in all);
``pytest -m fuzz`` runs a long, randomized one. Every input this harness ever found failing is a named case in
tests/bad_inputs (expected.yaml, section "issue 26").
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GOOD = Path(__file__).resolve().parent / "bad_inputs" / "good"
BASE = yaml.safe_load((GOOD / "base.yaml").read_text(encoding="utf-8"))
HW = yaml.safe_load((GOOD / "hw.yaml").read_text(encoding="utf-8"))
MODEL = yaml.safe_load((GOOD / "model.yaml").read_text(encoding="utf-8"))
HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 64,
      "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 128, "max_position_embeddings": 4096}
#: seconds one example may take: the tiny base runs in ~0.1 s, and the event bound keeps any accepted run to seconds
TIME_LIMIT_S = 60.0

BUDGETS = [pytest.param("ci", id="ci"), pytest.param("long", id="long", marks=pytest.mark.fuzz)]


def _settings(budget: str, examples: int) -> settings:
    """The default run: ``examples`` derandomized examples; the long run (-m fuzz): 20 times as many, random."""
    if budget == "ci":
        return settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                        suppress_health_check=list(HealthCheck))
    return settings(max_examples=20 * examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))


# --- hostile values ----------------------------------------------------------------------------------------------

EDGE_NUMBERS = [0, 1, -1, 2, 2**31, 2**40 + 1, 2**53 + 1, 2**63, 10**30, 10**400, 1e-300, 1e300, 5e-324,
                1.7976931348623157e308, -1e300, 0.5, 1.5, math.inf, -math.inf, math.nan, 3_000_000]
NUMBERS = st.one_of(st.sampled_from(EDGE_NUMBERS), st.integers(min_value=-10**30, max_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True))
EDGE_TEXTS = ["1e999 GB", "1e-300 B/s", "-5 GB", "1e300 TFLOPS", "0 s", "1 EB/s", "1e30 FLOPS", "nan", ".inf", "",
              " ", "gpu0", "\x1b[31m", "a\nb", "../../etc/passwd", "1e300", "450", "80 GiBB", "25 GB/s", "1 us"]
TEXTS = st.one_of(st.sampled_from(EDGE_TEXTS), st.text(max_size=10))
SCALARS = st.one_of(NUMBERS, TEXTS, st.booleans(), st.none())
VALUES = st.one_of(SCALARS, st.lists(NUMBERS, max_size=3),
                   st.dictionaries(st.sampled_from(["value", "source", "rank", "x"]), NUMBERS, max_size=2))


def _leaves(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a scalar (and every section) in a parsed file."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += _leaves(value, (*prefix, key))
    return out


def _set(data: dict, path: tuple, value: Any) -> dict:
    out = json.loads(json.dumps(data))
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node.get(part), dict) else node.setdefault(part, {})
    node[path[-1]] = value
    return out


#: keys the good files leave out, which a user may write
EXTRA_SCENARIO = [("simulation", "jitter"), ("simulation", "seed"), ("simulation", "dp_bucket_size"),
                  ("simulation", "max_events"), ("simulation", "max_gpus"), ("simulation", "stragglers"),
                  ("simulation", "degraded_links"), ("parallel", "vpp"), ("parallel", "zero"),
                  ("parallel", "layers_per_stage"), ("training", "train_metrics"), ("training", "precision")]
EXTRA_HW = [("memory_overheads", "fragmentation"), ("compute", "gemm_efficiency"), ("compute", "overlap_slowdown"),
            ("cost", "price_per_gpu_hour"), ("intra_node", "efficiency"), ("inter_node", "oversubscription"),
            ("gpu", "peak_flops", "fp16")]
EXTRA_MODEL = [("kv_heads",), ("position_embeddings",), ("max_positions",), ("attention_window",), ("mlp",)]
EXTRA_HF = ["num_key_value_heads", "sliding_window", "n_positions", "tie_word_embeddings", "head_dim", "rope_theta",
            "num_local_experts", "hidden_act", "_name_or_path", "n_inner", "attention_bias", "mlp_bias",
            "use_sliding_window", "hidden_activation", "attn_logit_softcapping", "is_encoder_decoder"]


def _finite_json(text: str) -> None:
    """Every number of a JSON report is finite (json.loads would read Infinity and NaN)."""
    def refuse(token: str):
        raise AssertionError(f"the report holds {token}")

    def walk(node: Any) -> None:
        if isinstance(node, float):
            assert math.isfinite(node), node
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(text, parse_constant=refuse))


def _check(args: list[str], capsys, report: Path | None = None) -> tuple[int, str]:
    """Run the CLI in this process and check the invariant; returns (exit status, stderr)."""
    started = time.monotonic()
    code, _, err = run_cli(args, capsys)
    elapsed = time.monotonic() - started
    assert elapsed < TIME_LIMIT_S, (args, elapsed)
    assert code in (0, 2), (args, err)
    assert "Traceback" not in err and "internal error" not in err, (args, err)
    if code == 2:
        lines = [line for line in err.strip().splitlines() if not line.startswith("warning:")]
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, err)
    elif report is not None and report.exists():
        _finite_json(report.read_text(encoding="utf-8"))
    return code, err


def _folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="simtrain-fuzz-"))
    (folder / "hw.yaml").write_text(yaml.safe_dump(HW), encoding="utf-8")
    (folder / "model.yaml").write_text(yaml.safe_dump(MODEL), encoding="utf-8")
    (folder / "base.yaml").write_text(yaml.safe_dump(BASE), encoding="utf-8")
    return folder


# --- files ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("which", ["scenario", "hardware", "model"])
def test_hostile_values_in_files(budget, which, capsys):
    """A hostile value at any key of a scenario, hardware or model file: exit 0 (finite report) or 2, one line."""
    base = {"scenario": BASE, "hardware": HW, "model": MODEL}[which]
    extra = {"scenario": EXTRA_SCENARIO, "hardware": EXTRA_HW, "model": EXTRA_MODEL}[which]
    paths = sorted(set(_leaves(base)) | set(extra), key=str)
    name = {"scenario": "base.yaml", "hardware": "hw.yaml", "model": "model.yaml"}[which]

    @_settings(budget, 40)
    @given(path=st.sampled_from(paths), value=VALUES)
    def probe(path, value):
        folder = _folder()
        (folder / name).write_text(yaml.safe_dump(_set(base, path, value)), encoding="utf-8")
        _check(["run", str(folder / "base.yaml"), "--json", str(folder / "r.json")], capsys, folder / "r.json")

    probe()


@pytest.mark.parametrize("budget", BUDGETS)
def test_hostile_values_in_hf_configs(budget, capsys):
    """A hostile value (also JSON's non-standard Infinity and NaN) at a HuggingFace config key: exit 0 or 2."""
    keys = sorted(set(HF) | set(EXTRA_HF))
    raw = st.one_of(VALUES.map(lambda v: json.dumps(v, default=str) if _json_safe(v) else '"x"'),
                    st.sampled_from(["Infinity", "-Infinity", "NaN", "1e400", "-1e400", "1" + "0" * 40, "[]", "{}"]))

    @_settings(budget, 40)
    @given(key=st.sampled_from(keys), token=raw)
    def probe(key, token):
        folder = _folder()
        config = dict(HF, **{key: "@@"})
        (folder / "config.json").write_text(json.dumps(config).replace('"@@"', token), encoding="utf-8")
        scenario = dict(BASE, model="config.json")
        (folder / "base.yaml").write_text(yaml.safe_dump(scenario), encoding="utf-8")
        _check(["run", str(folder / "base.yaml"), "--json", str(folder / "r.json")], capsys, folder / "r.json")

    probe()


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (ValueError, TypeError):
        return False


# --- the command line -------------------------------------------------------------------------------------------

SET_KEYS = ["training.seq_len", "training.global_batch", "training.micro_batch", "parallel.dp", "parallel.pp",
            "parallel.tp", "parallel.vpp", "simulation.seed", "simulation.jitter", "simulation.dp_bucket_size",
            "simulation.max_events", "nodes", "gpus_per_node", "training.train_metrics", "simulation.stragglers",
            "hardware", "model", "parallel.layers_per_stage", "simulation.stragglers.0.rank", "parallel.zero"]
FLAG_TEXT = st.one_of(st.sampled_from(["1e999", "1e300", "-1", "0", "1" + "0" * 30, ".inf", ".nan", "[1e300, 1]",
                                       "{rank: 1e300}", "2**40", "1e-300 B", "1e300 GB", "3000000", "", "x"]),
                      st.text(alphabet="0123456789.e+-[]{}:, abc", max_size=12))


@pytest.mark.parametrize("budget", BUDGETS)
def test_hostile_set_values(budget, capsys):
    """--set KEY=VALUE with hostile values goes through the file's checks: exit 0 or 2, one line."""
    folder = _folder()

    @_settings(budget, 40)
    @given(key=st.sampled_from(SET_KEYS), text=FLAG_TEXT)
    def probe(key, text):
        _check(["run", str(folder / "base.yaml"), "--set", f"{key}={text}", "--json", str(folder / "r.json")], capsys,
               folder / "r.json")

    probe()


@pytest.mark.parametrize("budget", BUDGETS)
def test_hostile_grids(budget, capsys):
    """--grid with hostile values: each bad value is its point's error, a bad key or a too large grid exit 2."""
    folder = _folder()

    @_settings(budget, 15)
    @given(key=st.sampled_from(SET_KEYS[:14]), values=st.lists(FLAG_TEXT.filter(lambda t: "," not in t and t.strip()),
                                                                min_size=1, max_size=3, unique=True))
    def probe(key, values):
        out = folder / "t.csv"
        _check(["sweep", str(folder / "base.yaml"), "--grid", f"{key}={','.join(values)}", "--out", str(out),
                "--workers", "1"], capsys)

    probe()


@pytest.mark.parametrize("budget", BUDGETS)
def test_hostile_numeric_flags(budget, capsys):
    """--gpus, --top, --samples, --tokens, --max-memory with hostile numbers: exit 0 or 2, never a hang."""
    folder = _folder()
    number = st.one_of(st.sampled_from(["0", "-1", "1" + "0" * 30, "1e300", "inf", "nan", "1e-300", "3", "16", "x"]),
                       st.integers(min_value=-10**20, max_value=10**20).map(str))

    @_settings(budget, 25)
    @given(flag=st.sampled_from(["--gpus", "--top", "--samples", "--tokens", "--max-memory"]), text=number)
    def probe(flag, text):
        base = str(folder / "base.yaml")
        if flag == "--samples":
            args = ["run", base, "--samples", text, "--set", "simulation.jitter=0.05"]
        elif flag == "--tokens":
            args = ["compare", base, "--tokens", text]
        else:
            args = ["search", base, flag, text, "--workers", "1", "--top", "1"] if flag != "--top" else \
                ["search", base, "--top", text, "--workers", "1"]
        _check(args, capsys)

    probe()


# --- the Python API -----------------------------------------------------------------------------------------------

API_VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2), st.just(object()), st.just(b"bytes"),
                       st.just(Path("no-such-file.yaml")), st.just({"training.seq_len": 1e300}))


@pytest.mark.parametrize("budget", BUDGETS)
def test_hostile_api_arguments(budget):
    """simulate, memory_only, sweep, search and with_overrides given hostile arguments return or raise InputError
    (TypeError for a value of the wrong Python type, naming it), nothing else."""
    import simtrain
    from simtrain.spec.errors import InputError

    scenario = simtrain.load_scenario(_folder() / "base.yaml")

    @_settings(budget, 40)
    @given(call=st.sampled_from(["simulate", "memory_only", "sweep", "search_gpus", "search_top", "overrides",
                                 "sweep_grid"]), value=API_VALUES, key=st.sampled_from(SET_KEYS))
    def probe(call, value, key):
        started = time.monotonic()
        try:
            if call == "simulate":
                simtrain.simulate(value)
            elif call == "memory_only":
                simtrain.memory_only(value)
            elif call == "sweep":
                simtrain.sweep(scenario, value, workers=1, progress=False)
            elif call == "sweep_grid":
                simtrain.sweep(scenario, {key: [value]}, workers=1, progress=False)
            elif call == "search_gpus":
                simtrain.search(scenario, gpus=value, workers=1, top=1)
            elif call == "search_top":
                simtrain.search(scenario, top=value, workers=1)
            else:
                simtrain.simulate(scenario.with_overrides({key: value}))
        except InputError:
            pass
        except TypeError as err:
            assert "simtrain" in str(err) or "must be" in str(err), (call, value, err)
        assert time.monotonic() - started < TIME_LIMIT_S

    probe()
