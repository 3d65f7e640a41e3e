"""Search, sweeps and compare on mixtures of experts: ep and etp enumerated as Megatron-Core folds them, the
search's pruning still exact, and compare's rows naming the expert layout."""

from __future__ import annotations

import pytest
from conftest import DATA, REPO, gpt_model, hardware_variant, make_scenario

from simtrain.decide.compare import compare, compare_text
from simtrain.decide.search import enumerate_layouts, search, search_text
from simtrain.engine.simulation import memory, simulate
from simtrain.spec.errors import InputError

TWO_NODES = DATA / "core_two_nodes.yaml"
MOE = gpt_model(layers=4, hidden=1024, heads=16, vocab=32000, mlp="swiglu", ffn_hidden=2048,
                moe={"experts": 4, "top_k": 2, "expert_ffn_hidden": 512})
#: eight 2048-wide experts: EP both saves memory and speeds the expert GEMMs up (more rows per expert)
MOE8 = {**MOE, "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 2048}}


def test_enumeration_counts_expert_layouts_by_hand():
    """4 GPUs in one node, 4 experts (4 layers, all MoE): test_search's dense count per (tp, pp, dp) without ZeRO-3
    and selective_op (refused for MoE: ZeRO 0-2 when dp > 1, recompute none/selective/full), times the (ep, etp)
    pairs with ep | 4, etp | tp and etp x ep | tp x dp; plus the split-backward schedules with even splits (zb-h1;
    zb-v with layers % 2pp = 0; dualpipe(v) with >= 2pp micro-batches; ZeRO 0/1), plus ep_overlap on the layouts
    with ep > 1, 1f1b at pp 1 or interleaved, ZeRO 0/1, recompute none/selective:
      tp1 pp1 dp4:  27 + overlap 2 ep x 2 zero x 2 rc = 8                                       =  35
      tp1 pp2 dp2:  90 + split (zb-h1, zb-v) x 2 mb x 2 zero x 3 rc x 2 ep = 48
                       + overlap vpp 2 mb 1 x 2 zero x 2 rc x ep 2 = 4                          = 142
      tp1 pp4 dp1:  18 + zb-h1 x 3 mb x 3 rc = 9 (zb-v: 4 % 8 != 0; dualpipe(v): < 8 micro-batches) =  27
      tp2 pp1 dp2: 180 + overlap 3 expert layouts with ep > 1 x 2 zero x 2 rc x 2 sp x 2 mb = 48 = 228
      tp2 pp2 dp1: 144 + split (zb-h1, zb-v) x 3 mb + dualpipe + dualpipev at mb 1 = 8 shapes x 3 rc x 2 sp
                       x 3 expert layouts = 144, + overlap 2 mb x 2 rc x 2 sp x ep 2 = 8                = 296
      tp4 pp1 dp1: 108 + overlap 3 expert layouts with ep > 1 x 3 mb x 2 rc x 2 sp = 36         = 144  -> 872;
    but a mixture of experts with tp > 1 runs only with sequence parallelism (Megatron-Core's MoELayer refuses it
    without), so the tp > 1 rows keep sp on only, half of each: 228 + 296 + 144 = 668 -> 334, 872 - 334 = 538."""
    sc = make_scenario(hardware=TWO_NODES, nodes=1, gpus_per_node=4, model=MOE, training={"global_batch": 4},
                       parallel={"dp": 4})
    layouts = enumerate_layouts(sc)
    assert len(layouts) == 538
    assert len({tuple(sorted(x.items())) for x in layouts}) == 538
    assert all(x["sequence_parallel"] for x in layouts if x["tp"] > 1)
    assert all((x["tp"] * x["dp"]) % (x["etp"] * x["ep"]) == 0 and 4 % x["ep"] == 0 for x in layouts)


def test_dense_layouts_carry_no_expert_keys():
    """A dense model's layouts have no ep or etp (its search table and --out columns stay as they were)."""
    sc = make_scenario(hardware=TWO_NODES, nodes=1, gpus_per_node=4, model=gpt_model(), training={"global_batch": 4},
                       parallel={"dp": 4})
    assert not any("ep" in x or "etp" in x for x in enumerate_layouts(sc))


@pytest.fixture
def moe_case(tmp_path):
    """2 nodes x 2 GPUs, global batch 4, and 1.6 GiB GPUs so that some layouts do not fit."""
    hw = hardware_variant(tmp_path, {"gpu.memory": {"value": "1.6 GiB", "source": "test fixture"}}, base=TWO_NODES)
    return make_scenario(hardware=hw, nodes=2, gpus_per_node=2, model=MOE8, training={"global_batch": 4},
                         parallel={"dp": 4})


def test_moe_search_agrees_with_brute_force(moe_case):
    """The top 3 by tokens/s equal those of simulating every MoE layout (ep and etp included) that fits within the
    search's default share of the GPU's memory; the analytic bound never exceeds a simulated step."""
    result = search(moe_case, top=3, workers=1, progress=False)
    scored = []
    for i, layout in enumerate(enumerate_layouts(moe_case)):
        keys = {"parallel.tp": layout["tp"], "parallel.pp": layout["pp"], "parallel.dp": layout["dp"],
                "parallel.vpp": layout["vpp"], "training.micro_batch": layout["micro_batch"],
                "parallel.zero": layout["zero"], "training.recompute": layout["recompute"],
                "parallel.schedule": layout["schedule"], "parallel.sequence_parallel": layout["sequence_parallel"],
                "parallel.ep": layout["ep"], "parallel.etp": layout["etp"],
                "parallel.ep_overlap": layout["ep_overlap"], "training.precision": layout["precision"]}
        try:
            sc = moe_case.with_overrides(keys)
        except InputError:
            continue
        mem = memory(sc)
        if mem.fits_in_memory and mem.peak_memory_bytes_max <= result.max_memory * mem.capacity_bytes:
            scored.append((-simulate(sc).tokens_per_s, i, layout))
    scored.sort(key=lambda x: (x[0], x[1]))
    brute = [(layout, -neg) for neg, _, layout in scored[:3]]
    found = [({k: r[k] for k in brute[0][0]}, r["tokens_per_s"]) for r in result.top]
    assert found == brute
    assert result.counts["oom"] > 0 and result.counts["pruned"] > 0
    assert result.counts["simulated"] + result.counts["pruned"] == len(scored)
    assert result.counts["bound_violations"] == 0
    competed = {(r["ep"], r["etp"]) for r in result.rows if r["status"] in ("simulated", "pruned")}
    assert len(competed) > 1 and any(ep > 1 for ep, _ in competed) and any(etp > 1 for _, etp in competed)
    rivals = [r for r in result.rows if r["status"] in ("simulated", "pruned")]
    assert any(r["ep_overlap"] for r in rivals) and {"zb-h1", "zb-v"} <= {r["schedule"] for r in rivals}
    head = search_text(result).splitlines()[0].split()
    assert head[head.index("prec") + 1:head.index("prec") + 4] == ["ep", "etp", "ovl"]


def test_sweep_over_ep():
    """A sweep over parallel.ep gives one row per EP size, each the simulated step of that layout."""
    from simtrain import sweep

    sc = make_scenario(hardware=TWO_NODES, nodes=2, gpus_per_node=2, model=MOE, training={"global_batch": 4},
                       parallel={"dp": 4})
    table = sweep(sc, {"parallel.ep": [1, 2, 4]}, workers=1, progress=False)
    assert list(table["parallel_ep"]) == [1, 2, 4]
    for ep, step in zip(table["parallel_ep"], table["step_time_s"]):
        assert step == pytest.approx(simulate(sc.with_overrides({"parallel.ep": int(ep)})).step_time_s, rel=1e-9)


def test_compare_moe_scenarios():
    """`compare` runs MoE scenarios: Qwen3-30B-A3B EP8 on one DGX H100 and one DGX B200, time to train = tokens /
    simulated tokens/s, and the layout names the expert parallelism."""
    def qwen(hardware):
        return make_scenario(hardware=REPO / "hardware" / f"{hardware}.yaml", nodes=1, model="qwen3-30b-a3b",
                             training={"seq_len": 4096, "global_batch": 16, "micro_batch": 1, "dropout": False,
                                       "recompute": "full"},
                             parallel={"dp": 8, "ep": 8})

    a, b = qwen("dgx-h100"), qwen("dgx-b200")
    rows = compare([a, b], tokens=1e9)
    for sc, row in zip((a, b), rows):
        assert row["time_to_train_s"] == pytest.approx(1e9 / simulate(sc).tokens_per_s, rel=1e-12)
        assert row["layout"].endswith(" ep8")
    assert rows[1]["time_to_train_s"] < rows[0]["time_to_train_s"]
    assert "ep8" in compare_text(rows)


def test_deepep_layouts_carry_no_expert_tp():
    """With the deepep dispatcher the search enumerates etp 1 only (the rules refuse expert TP with it), exactly the
    alltoall enumeration's etp-1 layouts; and a fix on ep_overlap for a dense model is refused, as for ep."""
    sc = make_scenario(hardware=TWO_NODES, nodes=1, gpus_per_node=4, model=MOE, training={"global_batch": 4},
                       parallel={"dp": 4})
    deepep = enumerate_layouts(sc.with_overrides({"parallel.moe_dispatcher": "deepep"}))
    assert deepep and all(x["etp"] == 1 for x in deepep)
    assert deepep == [x for x in enumerate_layouts(sc) if x["etp"] == 1]
    dense = make_scenario(hardware=TWO_NODES, nodes=1, gpus_per_node=4, model=gpt_model(),
                          training={"global_batch": 4}, parallel={"dp": 4})
    with pytest.raises(InputError, match="ep_overlap"):
        enumerate_layouts(dense, fix={"parallel.ep_overlap": True})
