"""A search's layouts count against max_layouts by what they cost: beyond SCREEN_GPUS (16,384) GPUs a screened
layout's collectives span the cluster, so one counts (GPUs / 16,384) ** 1.42 layouts (the measured growth: 51 ms a
layout at 16,384 GPUs, 365 ms at 65,536). A search of 200,000 GPUs is refused before it screens, instead of running
for hours (measured: 189 of 102,952 layouts in 50 s, 1.2 GB and growing); one of 16,384 GPUs, which finishes in
3-5 minutes, is not (a review found the first weight, GPUs / 4,096, refusing tp8_llama3_70b there)."""

from __future__ import annotations

import math
import subprocess

import pytest

import simtrain
from simtrain.decide.search_space import enumerate_layouts
from simtrain.spec.errors import SimulationLimitError


def test_a_layout_of_32768_gpus_counts_2_68_times_against_max_layouts():
    """2 ** 1.42 = 2.676: the L = 47,710 layouts of pp4_dp4 on 32,768 GPUs cost 2.676 L = 127,665.05; taken at,
    refused one below; on 16,384 GPUs each counts once (taken at L)."""
    sc = simtrain.load_scenario("pp4_dp4", {"training.global_batch": 32768})
    count = len(enumerate_layouts(sc, 32768, max_layouts=10**9))
    assert count == 47_710
    cost = count * 2 ** 1.42
    assert math.floor(cost) == 127_665
    assert len(enumerate_layouts(sc, 32768, max_layouts=math.ceil(cost))) == count
    with pytest.raises(SimulationLimitError) as refused:
        enumerate_layouts(sc, 32768, max_layouts=math.floor(cost))
    assert refused.value.field == "max_layouts"
    assert "layouts of 32,768 GPUs, each costing about 2.7 times a layout of 16,384 GPUs or fewer" in \
        refused.value.message
    small = simtrain.load_scenario("pp4_dp4", {"training.global_batch": 16384})
    assert len(enumerate_layouts(small, 16384, max_layouts=count)) == count


def test_cli_search_of_200000_gpus_is_refused_at_once_naming_what_to_narrow(simtrain_exe):
    """(200,000 / 16,384) ** 1.42 = 34.91: more than 200,000 / 34.91 = 5,729 layouts pass the default limit; exit 2,
    one sentence, within seconds (the old search ran for hours)."""
    done = subprocess.run([*simtrain_exe, "search", "pp4_dp4", "--gpus", "200000", "--workers", "1", "--set",
                           "training.global_batch=200000"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: this search would screen more than 5,729 layouts of 200,000 GPUs, each costing about 34.9 times a "
        "layout of 16,384 GPUs or fewer (its collectives span the cluster): the work of more than max_layouts=200,000 "
        "layouts (about 15 min of one core before any simulation); narrow it (--fix), search fewer GPUs or a smaller "
        "global batch, or raise the limit (--max-layouts, search(max_layouts=...))\n")
