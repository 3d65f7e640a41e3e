"""The parallelism search (issue 5, deliverable 4): every valid layout enumerated, the ones that do
not fit dropped, the rest pruned by a bound that never excludes a winner, and a reason per loser."""

from __future__ import annotations

import pytest
import yaml
from conftest import DATA, gpt_model, hardware_variant, make_scenario, resolve_variant, run_cli

from simtrain.decide.search import enumerate_layouts, gpu_overrides, search, why_slower
from simtrain.decide.sweep_files import read_table
from simtrain.spec.errors import InputError

TWO_NODES = DATA / "core_two_nodes.yaml"
SMALL = gpt_model(layers=4, hidden=1024, heads=16, vocab=32000)


def test_enumeration_counts_every_layout_by_hand():
    """4 GPUs in one node, 4 layers, 16 heads, global batch 4. By hand, per (tp, pp, dp), counting
    micro-batch sizes dividing 4/dp, schedules (gpipe and 1f1b when pp > 1, interleaved with vpp >= 2
    dividing 4/pp when pp divides the micro-batch count), ZeRO 0-3 when dp > 1, 4 recompute modes (none,
    selective, selective_op, full), sequence parallelism on/off when tp > 1:
      tp1 pp1 dp4: 1 mb x 1 schedule x 4 x 4          = 16
      tp1 pp2 dp2: (mb1: 3 schedules + mb2: 2) x 4 x 4 = 80
      tp1 pp4 dp1: 3 mb x 2 schedules x 4              = 24
      tp2 pp1 dp2: 2 mb x 4 x 4 x 2                    = 64
      tp2 pp2 dp1: (mb1: 3 + mb2: 3 + mb4: 2) x 4 x 2  = 64
      tp4 pp1 dp1: 3 mb x 4 x 2                        = 24   -> 272;
    plus the zero-bubble and DualPipe schedules (issue 22) with ZeRO 0-1 only: zb-h1 whenever pp > 1, zb-v and
    dualpipev with vpp 2 (8 chunks of 4 layers: only for pp 2), dualpipe and dualpipev with >= 2 pp micro-batches
    (dualpipe: an even count):
      tp1 pp2 dp2: micro-batches 2, 1: zb-h1 and zb-v, 2 mb x 2 x 2 zero x 4       = 32
      tp1 pp4 dp1: zb-h1, 3 mb x 4                                                = 12
      tp2 pp2 dp1: micro-batches 4, 2, 1: (zb-h1, zb-v) 3 mb + (dualpipe,
                   dualpipev) mb 1, x 4 x 2                                       = 64   -> 380;
    plus the recompute-granularity variants (issue 21): one per selective layout (modules added), 380 / 4 = 95; one
    per full-recompute layout with an even split of at least 2 layers per (virtual) stage (fewest layers
    recomputed), i.e. vpp 1 and pp <= 2:
      tp1 pp1 dp4: 1 mb x 4 zero = 4;   tp2 pp1 dp2: 2 mb x 4 zero x 2 sp = 16;   tp4 pp1 dp1: 3 mb x 2 sp = 6
      tp1 pp2 dp2: mb 1 (gpipe, 1f1b x 4 zero + zb-h1 x 2 zero) + mb 2 (the same)     = 20
      tp2 pp2 dp1: (gpipe, 1f1b, zb-h1) x 3 mb + dualpipe at mb 1, x 2 sp             = 20   -> 66; 380 + 95 + 66
    = 541."""
    sc = make_scenario(hardware=TWO_NODES, nodes=1, gpus_per_node=4, model=SMALL,
                       training={"global_batch": 4}, parallel={"dp": 4})
    layouts = enumerate_layouts(sc)
    assert len(layouts) == 541
    assert len({tuple(sorted(x.items())) for x in layouts}) == 541
    assert all(x["tp"] * x["pp"] * x["dp"] == 4 for x in layouts)


@pytest.fixture
def small_case(tmp_path):
    """2 nodes x 2 GPUs, global batch 8, and 0.8 GiB GPUs so that some layouts do not fit."""
    hw = hardware_variant(tmp_path, {"gpu.memory": {"value": "0.8 GiB", "source": "test fixture"}}, base=TWO_NODES)
    return make_scenario(hardware=hw, nodes=2, gpus_per_node=2, model=SMALL, training={"global_batch": 8},
                         parallel={"dp": 4})


def test_search_agrees_with_brute_force(small_case):
    """The top 3 by tokens/s equal those of simulating every layout that fits (memory model) within 95% of the
    GPU's memory, each recompute-granularity variant resolved by trying every count or module set in cost order
    (conftest.resolve_variant)."""
    from simtrain.engine.simulation import simulate

    result = search(small_case, top=3, workers=1, progress=False, max_memory=0.95)
    scored = []
    for i, layout in enumerate(enumerate_layouts(small_case)):
        resolved = resolve_variant(small_case, layout, 0.95)
        if resolved is not None:
            scored.append((-simulate(resolved[0]).tokens_per_s, i, resolved[1]))
    scored.sort(key=lambda x: (x[0], x[1]))
    brute = [(layout, -neg) for neg, _, layout in scored[:3]]
    found = [({k: r.get(k) for k in layout}, r["tokens_per_s"]) for (layout, _), r in zip(brute, result.top)]
    assert len(result.top) == len(brute) and found == brute
    assert result.counts["oom"] > 0
    assert result.counts["pruned"] > 0
    # every layout that competes is simulated, pruned by its bound, or never screened because its floor lost;
    # those never screened are slower than the third best, as simulated here
    competed = {i: -neg for neg, i, _ in scored}
    assert {r["status"] for i, r in enumerate(result.rows) if i in competed} <= {"simulated", "pruned", "unscreened"}
    assert result.counts["simulated"] + result.counts["pruned"] == \
        len(scored) - sum(1 for i in competed if result.rows[i]["status"] == "unscreened")
    assert result.counts["unscreened"] > 0
    assert all(competed[i] < brute[-1][1] for i in competed if result.rows[i]["status"] == "unscreened")
    assert result.counts["bound_violations"] == 0


def test_reasons_name_the_largest_difference():
    """A loser's reason names its biggest extra cost per step: bubble, exposed DP comm or recompute."""
    layout = {"tp": 1, "pp": 4, "dp": 4, "vpp": 1, "micro_batch": 1, "zero": 1, "recompute": "none",
              "schedule": "1f1b", "sequence_parallel": False}
    best = {**layout, "step_time_s": 1.0, "bubble_fraction": 0.06, "exposed_dp_s": 0.01, "exposed_tp_s": 0.0,
            "exposed_pp_s": 0.0, "compute_s": 0.9, "recompute_s": 0.0}
    bubbly = {**best, "micro_batch": 2, "step_time_s": 1.15, "bubble_fraction": 0.18}
    assert why_slower(bubbly, best).startswith("bubble 18% vs 6%")
    assert "(micro_batch 2 vs 1)" in why_slower(bubbly, best)
    chatty = {**best, "zero": 3, "step_time_s": 1.12, "exposed_dp_s": 0.12}
    assert why_slower(chatty, best).startswith("exposed DP comm 120 ms vs 10 ms")
    # full recompute repeats the forward: compute 0.9 -> 1.2 s, of which 0.3 s recompute = +33%
    heavy = {**best, "recompute": "full", "step_time_s": 1.3, "compute_s": 1.2, "recompute_s": 0.3}
    assert why_slower(heavy, best).startswith("recompute full +33% compute")
    assert why_slower({**best, "zero": 2}, best) == "ties with the best (zero 2 vs 1)"


def test_gpus_option_sets_the_node_count():
    """gpus=N gives N / gpus_per_node nodes (or one smaller node); a partial node is an error named by the
    argument."""
    sc = make_scenario(hardware=TWO_NODES, nodes=2, gpus_per_node=4, model=SMALL, parallel={"dp": 8},
                       training={"global_batch": 8})
    assert gpu_overrides(sc, 16) == {"nodes": 4}
    assert gpu_overrides(sc, 2) == {"nodes": 1, "gpus_per_node": 2}
    assert gpu_overrides(sc, None) == {}
    with pytest.raises(InputError, match="gpus=6 is not a whole number of 4-GPU nodes"):
        gpu_overrides(sc, 6)
    result = search(sc, gpus=4, top=1, workers=1, progress=False)
    assert result.gpus == 4
    assert result.top[0]["tp"] * result.top[0]["pp"] * result.top[0]["dp"] == 4


def test_cli_search_prints_top_k_and_writes_the_table(tmp_path, capsys):
    """`simtrain search --top 2 --out t.csv`: a 2-row table with reasons, and every candidate in the file."""
    path = tmp_path / "s.yaml"
    path.write_text(f"hardware: {TWO_NODES}\nnodes: 1\ngpus_per_node: 4\n"
                    "model: {layers: 4, hidden: 1024, heads: 16, ffn_hidden: 4096, vocab: 32000, mlp: gelu}\n"
                    "training: {seq_len: 512, global_batch: 4}\nparallel: {dp: 4}\n")
    out = tmp_path / "t.csv"
    code, stdout, stderr = run_cli(["search", str(path), "--top", "2", "--workers", "1", "--out", str(out)], capsys)
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].split()[:3] == ["#", "tp", "pp"]
    assert lines[1].split()[0] == "1" and lines[1].endswith("best")
    assert lines[2].split()[0] == "2"
    assert "541 layouts of 4 GPUs" in stdout   # the hand count of test_enumeration_counts_every_layout_by_hand
    table = read_table(out)
    assert len(table) == 541
    assert set(table["status"]) <= {"simulated", "pruned", "oom", "tight", "invalid", "failed", "unscreened"}


def test_max_memory_keeps_headroom(small_case):
    """With max_memory 1.0 every fitting layout competes; with 0.5 none whose peak passes half the GPU's memory
    reaches the top, and the layouts set aside are counted as 'tight'."""
    loose = search(small_case, top=50, workers=1, progress=False, max_memory=1.0)
    tight = search(small_case, top=50, workers=1, progress=False, max_memory=0.5)
    cap = 0.8 * 2**30
    assert any(r["peak_memory_bytes_max"] > 0.5 * cap for r in loose.top)
    assert all(r["peak_memory_bytes_max"] <= 0.5 * cap for r in tight.top)
    # a recompute-granularity variant is resolved for max_memory itself (the fewest layers or modules within it), so
    # it is never 'tight': the count is of the plain layouts
    assert tight.counts["tight"] == sum(1 for r in loose.rows if r["status"] in ("simulated", "pruned")
                                        and r["peak_memory_bytes_max"] > 0.5 * cap
                                        and not (r.get("partial") or r.get("modules")))
    with pytest.raises(InputError):
        search(small_case, max_memory=1.5)


def test_search_table_is_the_same_on_any_number_of_workers(small_case):
    """Which layouts are simulated and which pruned does not depend on the worker count (else --out would
    differ from machine to machine): one worker and a pool of three give the same rows."""
    from concurrent.futures import ThreadPoolExecutor

    serial = search(small_case, top=3, workers=1, progress=False)
    with ThreadPoolExecutor(max_workers=3) as pool:
        pooled = search(small_case, top=3, executor=pool, progress=False)
    assert serial.rows == pooled.rows
    assert serial.counts == pooled.counts


def test_cli_search_repeats_the_base_scenario_warnings_once(tmp_path, capsys):
    """A hardware file without its `compute` section makes every layout optimistic: `simtrain search` says so
    once under its table, as `simtrain run` does for one layout."""
    hw = yaml.safe_load(TWO_NODES.read_text(encoding="utf-8"))
    hw.pop("compute")
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(hw), encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text("hardware: hw.yaml\nnodes: 1\ngpus_per_node: 4\n"
                    "model: {layers: 4, hidden: 1024, heads: 16, ffn_hidden: 4096, vocab: 32000, mlp: gelu}\n"
                    "training: {seq_len: 512, global_batch: 4}\nparallel: {dp: 4}\n")
    code, stdout, stderr = run_cli(["search", str(path), "--top", "1", "--workers", "1"], capsys)
    assert code == 0, stderr
    assert stdout.count("no compute section: kernels run at the datasheet peaks") == 1
