"""Group-limited routing (DeepSeek-V3's top-4 of 8 groups, arXiv:2412.19437 Sec. 2.1.2): the expected EP ranks and
nodes a token reaches, checked by hand, by exhaustive enumeration and by Monte Carlo, and what it changes in
DeepEP's time."""

from __future__ import annotations

import json
from fractions import Fraction
from itertools import combinations
from math import comb
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import make_scenario

from simtrain.plan.deepep import deepep_time, destinations, distinct
from simtrain.plan.memory_moe import moe_shape
from simtrain.plan.routing import expected_parts, rank_parts
from simtrain.spec.model_hf import from_hf_config
from simtrain.spec.model_load import _load_preset
from simtrain.spec.placement import placement_of

PRESETS = Path(__file__).resolve().parents[1] / "simtrain" / "presets"
HF_V3 = Path(__file__).resolve().parent / "data" / "hf_moe" / "deepseek-v3" / "config.json"


def _enumerate(experts: int, top_k: int, n_group: int, topk_group: int, parts: list[set[int]]) -> Fraction:
    """Expected distinct parts by listing every (group subset, expert subset) pair, each equally likely."""
    size = experts // n_group
    total, count = Fraction(0), 0
    for chosen in combinations(range(n_group), topk_group):
        pool = [x for g in chosen for x in range(g * size, (g + 1) * size)]
        for picked in combinations(pool, top_k):
            total += sum(1 for p in parts if p & set(picked))
            count += 1
    return total / count


def test_small_case_by_hand():
    """8 experts in 4 groups, top-2 of 2 groups, 2 nodes of 4 experts: E = 1/3 x 1 + 2/3 x (1/3 x 1 + 2/3 x 2)."""
    # two groups on one node (2 of the C(4,2) = 6 subsets): one node; otherwise the 2 experts fall on one node with
    # probability 2 x C(2,2)/C(4,2) = 1/3, on both with 2/3
    by_hand = 1 / 3 * 1 + 2 / 3 * (1 / 3 * 1 + 2 / 3 * 2)          # = 13/9
    nodes = rank_parts(8, 2)
    assert expected_parts(8, 2, nodes, 4, 2) == pytest.approx(13 / 9, abs=1e-12)
    assert by_hand == pytest.approx(13 / 9)


def test_one_group_of_its_own_experts():
    """4 experts in 2 groups, top-2 within 1 group: a token reaches exactly one group-sized rank, two of four."""
    assert expected_parts(4, 2, rank_parts(4, 2), 2, 1) == pytest.approx(1.0, abs=1e-12)
    assert expected_parts(4, 2, rank_parts(4, 4), 2, 1) == pytest.approx(2.0, abs=1e-12)


@pytest.mark.parametrize("experts, top_k, n_group, topk_group, parts", [
    (16, 3, 4, 2, [set(range(2 * i, 2 * i + 2)) for i in range(8)]),      # ranks inside groups
    (16, 3, 4, 2, [set(range(8)), set(range(8, 16))]),                     # nodes of two groups each
    (12, 3, 3, 2, [set(range(6)), set(range(6, 12))]),                     # parts straddling a group
    (12, 4, 6, 3, [{0, 5, 9}, {1, 2, 3, 4}, {6, 7, 8, 10, 11}]),          # ranks scattered over nodes
])
def test_closed_form_equals_enumeration(experts, top_k, n_group, topk_group, parts):
    """The closed form equals the exact expectation over every equally likely choice of groups and experts."""
    exact = _enumerate(experts, top_k, n_group, topk_group, parts)
    closed = expected_parts(experts, top_k, tuple(tuple(sorted(p)) for p in parts), n_group, topk_group)
    assert closed == pytest.approx(float(exact), abs=1e-12)


def test_without_groups_is_the_hypergeometric():
    """Without groups the sum over ranks equals parts x (1 - C(E - E/P, k)/C(E, k)), the uniform formula."""
    by_hand = 8 * (1 - comb(256 - 32, 8) / comb(256, 8))
    assert expected_parts(256, 8, rank_parts(256, 8), None, None) == pytest.approx(by_hand, rel=1e-12)
    assert distinct(256, 8, 8) == pytest.approx(by_hand, rel=1e-12)


def test_deepseek_v3_nodes_monte_carlo():
    """DeepSeek-V3 at EP 64 on 8 nodes (node = group): the closed form is within 4 standard errors of sampling."""
    rng = np.random.default_rng(20261201)
    n, experts, groups, chosen_groups, top_k = 40_000, 256, 8, 4, 8
    size = experts // groups
    chosen = np.argsort(rng.random((n, groups)), axis=1)[:, :chosen_groups]          # a uniform 4-subset of groups
    slot = np.argsort(rng.random((n, chosen_groups * size)), axis=1)[:, :top_k]       # 8 of the 128 pooled experts
    group_of_slot = np.take_along_axis(chosen, slot // size, axis=1)
    nodes = np.array([len(set(row)) for row in group_of_slot])                        # node = group here
    mean, stderr = nodes.mean(), nodes.std(ddof=1) / np.sqrt(n)
    closed = expected_parts(experts, top_k, rank_parts(experts, 8), groups, chosen_groups)
    assert abs(closed - mean) < 4 * stderr
    # by hand: each chosen group is a node, missed when all 8 experts fall in the other 96 of the 128
    assert closed == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)), rel=1e-12)


def test_preset_and_hf_config_carry_the_groups():
    """The deepseek-v3 preset and DeepSeek-V3's config.json both give n_group 8 and topk_group 4."""
    preset = _load_preset("deepseek-v3")
    hf = from_hf_config(json.loads(HF_V3.read_text()), file=str(HF_V3))
    assert (preset.moe.n_group, preset.moe.topk_group) == (8, 4)
    assert (hf.moe.n_group, hf.moe.topk_group) == (8, 4)


def _deepseek_256(model):
    return make_scenario(hardware="dgx-h100", nodes=32, model=model,
                         training={"seq_len": 4096, "global_batch": 256, "micro_batch": 1, "dropout": False},
                         parallel={"dp": 64, "tp": 1, "pp": 4, "ep": 64, "etp": 1, "moe_dispatcher": "deepep",
                                   "layers_per_stage": [16, 15, 15, 15]})


def test_deepep_nodes_and_time_on_256_h100():
    """DeepSeek-V3, EP 64 over 8 nodes: 3.63 nodes a token instead of 5.29, and DeepEP's time falls with them."""
    grouped = _deepseek_256("deepseek-v3")
    plain = yaml.safe_load((PRESETS / "deepseek-v3.yaml").read_text())
    for key in ("source", "params_published", "params_active_published"):
        plain.pop(key)
    del plain["moe"]["n_group"], plain["moe"]["topk_group"]
    uniform = _deepseek_256(plain)
    msh, placement = moe_shape(grouped), placement_of(grouped)
    ranks, nodes = destinations(grouped, placement, msh, placement.ep_groups(0), 8)
    assert nodes == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)), rel=1e-12)     # 3.629
    # a rank's 4 experts lie in a chosen group with probability 4/8, then all 8 picks miss them: C(124,8)/C(128,8)
    assert ranks == pytest.approx(64 * 4 / 8 * (1 - comb(124, 8) / comb(128, 8)), rel=1e-12)
    assert destinations(uniform, placement, msh, placement.ep_groups(0), 8)[1] == \
        pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)), rel=1e-12)                 # 5.295
    assert deepep_time(grouped, placement, msh, 0) < deepep_time(uniform, placement_of(uniform), moe_shape(uniform), 0)


def test_explicit_nulls_mean_no_groups():
    """n_group: null and topk_group: null (a model dumped and read back) describe routing without groups."""
    plain = yaml.safe_load((PRESETS / "deepseek-v3.yaml").read_text())
    for key in ("source", "params_published", "params_active_published"):
        plain.pop(key)
    plain["moe"].update(n_group=None, topk_group=None)
    sc = _deepseek_256(plain)
    assert (sc.model.moe.n_group, sc.model.moe.topk_group) == (None, None)
