"""simtrain benchmarks (issue 7): wall time, simulated events and events per second at scale.

    python benchmarks/run_benchmarks.py            # best of 3 fresh subprocesses per case (about 1 min on 2 cores)
    python benchmarks/run_benchmarks.py --quick    # one run per case, no search (~1 min)
    python benchmarks/run_benchmarks.py --cases e,l,m   # the three searches of issue 25 alone (one run each)

Every case runs in a fresh ``python`` subprocess, so each pays its own imports. Inside the
subprocess the clock starts before ``import simtrain`` and stops after the simulation, so the
wall time counts import + load + simulate and leaves out only the interpreter's own start-up;
the three parts are reported apart as well. The best (shortest) of the repeats is kept.
Results are printed and written to benchmarks/RESULTS.md (and, for a full run,
benchmarks/README_SECTION.md, the section the README carries).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCEN = HERE / "scenarios"

#: id -> (label, scenario file, fidelity or "search")
CASES = {
    "a": ("pp4_dp4 (16 H100, llama2-13b)", REPO / "scenarios" / "pp4_dp4.yaml", "folded"),
    "b": ("GPT-3 175B, 1,024 A100, TP8 PP8 DP16 interleaved", SCEN / "gpt3_175b_1024_a100.yaml", "folded"),
    "c": ("Llama 3 405B, 16,384 H100, TP8 PP16 DP128", SCEN / "llama3_405b_16k_h100.yaml", "folded"),
    "d": ("GPT-3 175B, 1,024 A100, full fidelity", SCEN / "gpt3_175b_1024_a100.yaml", "full"),
    "e": ("search: Llama 3 70B on 1,024 H100", SCEN / "llama3_70b_1024_h100.yaml", "search"),
    "g": ("Llama 3 405B, 1,024 H100, TP8 PP16 DP8 (memory reference)", SCEN / "llama3_405b_1k_h100.yaml", "folded"),
    "h": ("DeepSeek-V3, 2,048 H100, TP1 PP16 EP64 1F1B", SCEN / "deepseek_v3_2048_h100.yaml", "folded"),
    "i": ("DeepSeek-V3, 256 H100, PP16 EP16, full fidelity", SCEN / "deepseek_v3_256_h100_full.yaml", "full"),
    "j": ("search: Qwen3-235B-A22B on 256 H100", SCEN / "qwen3_235b_256_h100.yaml", "search"),
    "k": ("Llama 3 405B, 131,072 tokens, 16,384 H100, TP8 CP16 PP16 DP8", SCEN / "llama3_405b_128k_cp16_h100.yaml",
          "folded"),
    # a fault makes the run play symmetry classes of DP replicas (fidelity "classes"): the scenario's own fidelity
    "c-straggler": ("(c) with one straggler (rank 5000 = DP replica 113 of stage 4, x1.3)",
                    SCEN / "llama3_405b_16k_h100.yaml", None),
    "c-link": ("(c) with one degraded link (nic100.0 -> rail0 at 1/4: DP replica 100's sends, stage 0's DP ring)",
               SCEN / "llama3_405b_16k_h100.yaml", None),
    "l": ("search: GPT-3 175B on 1,024 A100, global batch 1,536", SCEN / "gpt3_175b_1024_a100_search.yaml", "search"),
    "m": ("search: DeepSeek-V3 on 2,048 H100, 32K tokens (ep, cp, fp8)", SCEN / "deepseek_v3_2048_h100_search.yaml",
          "search"),
}
#: overrides of a case's scenario (what-ifs)
OVERRIDES = {
    "c-straggler": {"simulation.stragglers": [{"rank": 5000, "slowdown": 1.3}]},
    "c-link": {"simulation.degraded_links": [{"a": "nic100.0", "b": "rail0", "factor": 0.25}]},
}
SEARCHES = ("e", "j", "l", "m")

TARGETS = {   # id -> (what, seconds)
    "c": ("16,384-GPU step, folded (load + simulate)", 1.0),
    "d": ("full fidelity, 1,024 GPUs (load + simulate)", 30.0),
    "a": ("import simtrain + small run (pp4_dp4)", 0.5),
    "e": ("Llama-3-70B / 1,024 H100 search (issue 25)", 5.0),
    "l": ("GPT-3 175B / 1,024 A100 search, batch 1,536 (issue 25)", 30.0),
    "m": ("DeepSeek-V3 / 2,048 H100 search (issue 25)", 120.0),
    "h": ("DeepSeek-V3 2,048 H100, folded (load + simulate)", 1.0),
    "i": ("DeepSeek-V3 256 H100, full fidelity (load + simulate)", 60.0),
    "j": ("Qwen3-235B-A22B / 256-GPU search", 120.0),
    "c-straggler": ("16,384-GPU step with one straggler, symmetry classes (load + simulate)", 2.0),
    "c-link": ("16,384-GPU step with one degraded link, symmetry classes (load + simulate)", 2.0),
}


# --- the subprocess side ---------------------------------------------------------------------

def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6   # ru_maxrss is KiB on Linux


def child(case: str) -> dict:
    """Runs in a fresh interpreter: time import, load and simulate (or search) of one case."""
    label, path, mode = CASES[case]
    t0 = time.perf_counter()
    import simtrain

    if mode == "search":
        from simtrain.decide.search import search
    else:
        from simtrain.engine.simulation import simulate
    t1 = time.perf_counter()
    rss_import = _rss_mb()
    scenario = simtrain.load_scenario(path)
    if case in OVERRIDES:
        scenario = scenario.with_overrides(OVERRIDES[case])
    t2 = time.perf_counter()
    out: dict = {}
    if mode == "search":
        found = search(scenario, top=5, progress=False)
        best = found.top[0] if found.top else {}
        out.update(counts=found.counts, phase_seconds=found.phase_seconds, gpus=found.gpus,
                   best={k: best.get(k) for k in ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "zero", "recompute",
                                                  "schedule", "precision", "ep", "etp", "step_time_s") if k in best})
    else:
        result = simulate(scenario, fidelity=mode)
        out.update(events=result.events, step_time_s=result.step_time_s, gpus=result.gpus, fidelity=result.fidelity)
    t3 = time.perf_counter()
    heavy = [m for m in ("pandas", "plotly", "scipy", "matplotlib") if m in sys.modules]
    return {**out, "import_s": t1 - t0, "load_s": t2 - t1, "run_s": t3 - t2, "wall_s": t3 - t0,
            "rss_after_import_mb": rss_import, "peak_rss_mb": _rss_mb(), "heavy_modules": heavy,
            "gpus": out.get("gpus", scenario.gpus)}


def effects() -> dict:
    """Step times of the straggler and degraded-link scenarios against their healthy baselines."""
    import simtrain
    from simtrain.engine.simulation import simulate
    from simtrain.engine.variation import sample_step_times

    strag = simtrain.load_scenario(REPO / "scenarios" / "straggler.yaml")
    link = simtrain.load_scenario(REPO / "scenarios" / "degraded_link.yaml")
    jitter = strag.with_overrides({"simulation.stragglers": [], "simulation.jitter": 0.05})
    rows = {
        "straggler: healthy (no straggler)": simulate(strag.with_overrides({"simulation.stragglers": []})),
        "straggler: rank 4 x1.3": simulate(strag),
        "degraded link: healthy": simulate(link.with_overrides({"simulation.degraded_links": []})),
        "degraded link: nic0.0->rail0 x0.25": simulate(link),
        "degraded link: nic0.0->rail0 x0.1": simulate(link.with_overrides({"simulation.degraded_links.0.factor": 0.1})),
    }
    out = {k: {"step_time_s": r.step_time_s, "exposed_dp_s": r.exposed_comm_s.get("dp", 0.0),
               "exposed_dp_max_s": max(d.exposed_comm_s.get("dp", 0.0) for d in r.devices),
               "fidelity": r.fidelity} for k, r in rows.items()}
    out["jitter"] = sample_step_times(jitter, 20)
    return out


# --- the parent side ---------------------------------------------------------------------------

#: the children run as a user's installed simtrain does: with Python's bytecode cache (a shell that sets
#: PYTHONDONTWRITEBYTECODE would make every child compile simtrain again, about 0.2 s)
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _sub(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, check=True,
                          env=CHILD_ENV)


def run_case(case: str, repeats: int) -> dict:
    runs = [json.loads(_sub([__file__, "--child", case]).stdout.strip().splitlines()[-1]) for _ in range(repeats)]
    best = min(runs, key=lambda r: r["wall_s"])
    best["repeats"] = repeats
    best["walls_s"] = [r["wall_s"] for r in runs]
    best["load_and_run_s"] = [r["load_s"] + r["run_s"] for r in runs]
    return best


def import_times(repeats: int) -> dict:
    """``python -X importtime``: cumulative microseconds of simtrain and of what a run needs."""
    def once(code: str) -> dict[str, int]:
        err = _sub(["-X", "importtime", "-c", code]).stderr
        cumulative: dict[str, int] = {}
        for line in err.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)", line)
            if m:
                cumulative[m.group(4)] = max(cumulative.get(m.group(4), 0), int(m.group(2)))
        return cumulative

    best = min((once("import simtrain") for _ in range(repeats)), key=lambda c: c["simtrain"])
    run = min((once("import simtrain, simtrain.engine.simulation") for _ in range(repeats)),
              key=lambda c: c["simtrain"] + c.get("simtrain.engine.simulation", 0))
    parts = {name: run[name] for name in ("numpy", "networkx", "pydantic", "simpy", "yaml", "simtrain.engine.core")
             if name in run}
    t = []
    for _ in range(repeats):    # the whole process, interpreter start-up included, as a user sees it
        start = time.perf_counter()
        _sub(["-c", "import simtrain; from simtrain.engine.simulation import simulate; "
                    "simulate(simtrain.load_scenario('scenarios/pp4_dp4.yaml'))"])
        t.append(time.perf_counter() - start)
    startup = []
    for _ in range(repeats):
        start = time.perf_counter()
        _sub(["-c", "pass"])
        startup.append(time.perf_counter() - start)
    big = []      # `simtrain run <16,384-GPU case> --json FILE` as a whole process (issue 25's start-up target)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        for _ in range(repeats):
            start = time.perf_counter()
            _sub(["-c", "import sys; from simtrain.cli import main; "
                        f"main(['run', {str(SCEN / 'llama3_405b_16k_h100.yaml')!r}, '--json', {str(out)!r}])"])
            big.append(time.perf_counter() - start)
    return {"import_simtrain_s": best["simtrain"] / 1e6, "process_16k_run_s": min(big),
            "import_for_a_run_s": (run["simtrain"] + run.get("simtrain.engine.simulation", 0)) / 1e6,
            "parts_s": {k: v / 1e6 for k, v in parts.items()}, "process_small_run_s": min(t),
            "interpreter_startup_s": min(startup), "pandas_or_plotly": [m for m in ("pandas", "plotly") if m in run]}


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() or str(os.cpu_count())
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "simtrain"], capture_output=True, text=True).stdout
    return {"nproc": nproc, "cpu": cpu, "python": platform.python_version(), "os": platform.platform(),
            "date": datetime.date.today().isoformat(), "commit": commit or "unknown",
            "dirty": len(dirty.splitlines()), "load": os.getloadavg()[0]}


# --- report ------------------------------------------------------------------------------------

def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def case_table(results: dict) -> list[str]:
    lines = ["| case | GPUs | fidelity | import s | load s | simulate s | wall s | worst wall s | events | events/s "
             "| peak RSS MB |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case, r in results.items():
        label, _, mode = CASES[case]
        if r is None:
            lines.append(f"| ({case}) {label} | | {mode} | | | | skipped | | | | |")
            continue
        events = r.get("events")
        rate = f"{events / r['run_s']:,.0f}" if events else "-"
        lines.append(f"| ({case}) {label} | {r['gpus']:,} | {r.get('fidelity', mode or '-')} | {_f(r['import_s'])} | "
                     f"{_f(r['load_s'])} | {_f(r['run_s'])} | {_f(r['wall_s'])} | {_f(max(r['walls_s']))} | "
                     f"{f'{events:,}' if events else '-'} | {rate} | {r['peak_rss_mb']:.0f} |")
    return lines


def search_table(results: dict) -> list[str]:
    """Per search: what happened to its layouts, where the time went, and the simulations' events per second.
    Floored: every layout's step-time and memory floors, in bulk (numpy); set aside: the floors alone show it cannot
    fit or cannot reach the top K (never built); screened: built, validated by the scenario rules, memory-checked
    and, if it fits, estimated and bounded; simulated: the rest were pruned by the bound (or set aside above
    max_memory)."""
    lines = ["| search | GPUs | enumerated | set aside by floors | screened | bounded | simulated | pruned "
             "| floor s | screen s | simulate s | total s | events | events/s (simulate phase) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case in SEARCHES:
        r = results.get(case)
        if not r:
            continue
        c, ph = r["counts"], r.get("phase_seconds", {})
        screened = c.get("screened", c["enumerated"] - c["invalid"] - c["failed"])
        aside = c["enumerated"] - screened
        bounded = c["tight"] + c["pruned"] + c["simulated"]
        sim_s = ph.get("simulate", 0.0)
        rate = f"{c.get('events', 0) / sim_s:,.0f}" if sim_s > 0 and c.get("events") else "-"
        lines.append(f"| ({case}) {CASES[case][0]} | {r['gpus']:,} | {c['enumerated']:,} | {aside:,} | "
                     f"{screened:,} | {bounded:,} | {c['simulated']:,} | {c['pruned']:,} | "
                     f"{_f(ph.get('floor', 0.0), 2)} | {_f(ph.get('screen', 0.0), 1)} | "
                     f"{_f(sim_s, 1)} | {_f(r['run_s'], 1)} | {c.get('events', 0):,} | {rate} |")
    return lines


def target_table(results: dict, imports: dict) -> list[str]:
    lines = ["| target | limit | best | worst of the repeats | met (best / worst) |", "|---|---:|---:|---:|---|"]

    def met(value: float, limit: float) -> str:
        return "yes" if value < limit else "**no**"

    for case, (what, limit) in TARGETS.items():
        r = results.get(case)
        if r is None:
            lines.append(f"| {what} | {limit:g} s | not run | | - |")
            continue
        runs = r["walls_s"] if case in ("a", *SEARCHES) else r["load_and_run_s"]
        value, worst = min(runs), max(runs)
        lines.append(f"| {what} | {limit:g} s | {_f(value)} s | {_f(worst)} s | "
                     f"{met(value, limit)} / {met(worst, limit)} |")
    proc = imports["process_small_run_s"]
    lines.append(f"| `simtrain run`-like process, pp4_dp4, interpreter start-up included | 0.5 s | {_f(proc)} s | | "
                 f"{met(proc, 0.5)} |")
    big_run = imports.get("process_16k_run_s")
    if big_run is not None:
        lines.append(f"| `simtrain run --json` process, 16,384-GPU case (c), interpreter start-up included (issue 25) "
                     f"| 0.5 s | {_f(big_run)} s | | {met(big_run, 0.5)} |")
    big, small = results.get("c"), results.get("g")
    if big and small:
        grow_big = big["peak_rss_mb"] - big["rss_after_import_mb"]
        grow_small = small["peak_rss_mb"] - small["rss_after_import_mb"]
        ok = big["peak_rss_mb"] <= 1.25 * small["peak_rss_mb"]
        lines.append(f"| folded peak RSS independent of GPU count (16,384 vs 1,024 GPUs, same PP and micro-batches) "
                     f"| <= 1.25x | {big['peak_rss_mb']:.0f} vs {small['peak_rss_mb']:.0f} MB (growth after import: "
                     f"{grow_big:.0f} vs {grow_small:.0f} MB) | | {'yes' if ok else '**no**'} |")
    return lines


def effect_table(eff: dict) -> list[str]:
    lines = ["| scenario | fidelity | step time s | vs healthy | exposed DP s (critical GPU) | "
             "exposed DP s (most, any GPU) |",
             "|---|---|---:|---:|---:|---:|"]
    base = {"straggler": eff["straggler: healthy (no straggler)"]["step_time_s"],
            "degraded link": eff["degraded link: healthy"]["step_time_s"]}
    for name, r in eff.items():
        if name == "jitter":
            continue
        ref = base[name.split(":")[0]]
        lines.append(f"| {name} | {r['fidelity']} | {_f(r['step_time_s'])} | {r['step_time_s'] / ref - 1:+.1%} | "
                     f"{_f(r['exposed_dp_s'])} | {_f(r['exposed_dp_max_s'])} |")
    j = eff["jitter"]
    lines.append(f"| pp4_dp4 + jitter CV 0.05, {j['samples']} seeds | full | mean {_f(j['mean_s'])}, P50 "
                 f"{_f(j['p50_s'])}, P95 {_f(j['p95_s'])} | {j['p95_s'] / base['straggler'] - 1:+.1%} (P95) | | |")
    return lines


GANTT_NOTE = [
    "The Gantt charts show the same: `simtrain run scenarios/straggler.yaml --gantt straggler.html` draws stage 1 "
    "of DP replica 0 (the slow GPU) with longer forward and backward bars and less idle than the other stages, "
    "which wait for it; the healthy replicas of its stage wait for it inside the DP all-reduce (the last column; "
    "the report's \"replicas differ\" warning gives the difference, `devices[].exposed_comm_s` in `--json` the "
    "figure per GPU); `simtrain run scenarios/degraded_link.yaml --gantt degraded_link.html` draws the DP "
    "reduce-scatter and ZeRO all-gather at the end of the step several times longer than in the healthy run "
    "(`--set 'simulation.degraded_links=[]'`)."]


def render(m: dict, results: dict, imports: dict, eff: dict, quick: bool) -> tuple[str, str]:
    how = ("one run per case (--quick)" if quick else "best of 3 fresh subprocesses per case, one per search")
    dirty = f" with {m['dirty']} uncommitted file(s) in simtrain/" if m["dirty"] else ""
    moved = f" (HEAD moved to {m['commit_end']} during the run)" if m["commit_end"] != m["commit"] else ""
    head = [f"Machine: {m['nproc']} CPUs (`nproc`), {m['cpu']}, Python {m['python']}, {m['os']}; "
            f"date {m['date']}; simtrain commit {m['commit']}{dirty}{moved}. Figures: {how}; 1-minute load "
            f"average {m['load']:.2f} before and {m['load_end']:.2f} after (other work on the machine inflates times)."]
    searches = {c: results[c] for c in SEARCHES if results.get(c)}
    notes = [
        "", "Wall = `import simtrain` + load + simulate, timed inside the subprocess (interpreter start-up, "
        f"{_f(imports['interpreter_startup_s'])} s here, excluded). Events are the simpy events the engine scheduled "
        "(`Result.events`); events/s divides them by the simulate time.",
    ]
    for c, search in searches.items():
        notes.append(f"Search ({c}) runs its screening and simulations on a pool of `nproc` worker processes (their "
                     f"memory is not in the RSS column); {search['counts']}; best layout {search['best']}.")
    imp = [f"`python -X importtime -c 'import simtrain'`: {_f(imports['import_simtrain_s'])} s; with the engine "
           f"(`simtrain.engine.simulation`, needed for a run): {_f(imports['import_for_a_run_s'])} s. Largest parts: "
           + ", ".join(f"{k} {_f(v)} s" for k, v in sorted(imports["parts_s"].items(), key=lambda kv: -kv[1]))
           + f". pandas/plotly imported: {imports['pandas_or_plotly'] or 'no'}."]
    body = ["## Cases", "", *case_table(results), *notes, "", "## Searches", "", *search_table(results), "",
            "## Targets (2-core machine)", "",
            *target_table(results, imports), "", "## Import", "", *imp, "",
            "## Variation and faults (scenarios/straggler.yaml, scenarios/degraded_link.yaml)", "",
            *effect_table(eff), "", *GANTT_NOTE, ""]
    results_md = "\n".join(["# simtrain benchmarks", "", *head, "", "Reproduce: `python benchmarks/run_benchmarks.py`.",
                            "", *body])
    section = "\n".join(["## Performance", "", "simtrain simulates one representative lane per pipeline stage "
                         "(*folded* fidelity) and counts the other DP replicas' traffic on every shared link, so a "
                         "step costs about the same at 1,024 or 16,384 GPUs; `fidelity: full` (`simtrain run --full`) "
                         "simulates every (DP replica, stage) lane. Stragglers and degraded links make a run play "
                         "symmetry classes (the replicas a fault touches on their own, the others once; fidelity "
                         "`classes`, equal to full); jitter switches it to full fidelity.", "", *head, "",
                         "Reproduce with `python benchmarks/run_benchmarks.py` (scenarios in `benchmarks/scenarios/`).",
                         "", *[line.replace("## ", "### ") for line in body]])
    return results_md, section


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one run per case and no search")
    ap.add_argument("--repeats", type=int, default=3, help="subprocess runs per case; the best is kept")
    ap.add_argument("--cases", help="comma-separated case ids to run (default: all), e.g. --cases e,l,m")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(effects() if args.child == "effects" else child(args.child)))
        return
    from simtrain.report.outputs import write_atomic

    repeats = 1 if args.quick else args.repeats
    info = machine()
    results: dict = {}
    chosen = set(args.cases.split(",")) if args.cases else set(CASES)
    for case in CASES:
        if case in SEARCHES and args.quick or case not in chosen:
            results[case] = None
            continue
        print(f"({case}) {CASES[case][0]} ...", file=sys.stderr, flush=True)
        results[case] = run_case(case, 1 if case in SEARCHES else repeats)   # a search takes minutes: one run
    print("import times ...", file=sys.stderr, flush=True)
    imports = import_times(repeats)
    eff = json.loads(_sub([__file__, "--child", "effects"]).stdout.strip().splitlines()[-1])
    end = machine()
    info.update(commit_end=end["commit"], load_end=end["load"])
    results_md, section = render(info, results, imports, eff, args.quick)
    print(results_md)
    # a run of chosen cases leaves the whole run's files alone: RESULTS_<cases>.md and results_<cases>.json
    tail = "_" + "".join(sorted(chosen)) if args.cases else ""
    write_atomic(HERE / f"RESULTS{tail}.md", results_md)
    write_atomic(HERE / f"results{tail}.json", json.dumps({"machine": info, "cases": results, "imports": imports,
                                                         "effects": eff}, indent=1, sort_keys=True) + "\n")
    if not args.quick and not args.cases:
        write_atomic(HERE / "README_SECTION.md", section)


if __name__ == "__main__":
    main()
