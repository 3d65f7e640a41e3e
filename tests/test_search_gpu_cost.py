"""A search's layouts count against max_layouts by what their screening costs: beyond SCREEN_GPUS (4,096) GPUs a
layout's collectives span the cluster, so one counts GPUs / 4,096 layouts. A search of 200,000 GPUs is refused
before it screens, instead of running for hours (measured: 189 of 102,952 layouts in 50 s, 1.2 GB and growing)."""

from __future__ import annotations

import subprocess

import pytest

import simtrain
from simtrain.decide.search_space import enumerate_layouts
from simtrain.spec.errors import SimulationLimitError


def test_a_layout_of_8192_gpus_counts_twice_against_max_layouts():
    """8,192 / 4,096 = 2: the L layouts of pp4_dp4 on 8,192 GPUs cost 2 L; refused at max_layouts 2 L - 1, taken at
    2 L (each layout still counts once on 4,096 GPUs: taken at L there)."""
    sc = simtrain.load_scenario("pp4_dp4", {"training.global_batch": 8192})
    count = len(enumerate_layouts(sc, 8192))
    assert len(enumerate_layouts(sc, 8192, max_layouts=2 * count)) == count
    with pytest.raises(SimulationLimitError) as refused:
        enumerate_layouts(sc, 8192, max_layouts=2 * count - 1)
    assert refused.value.field == "max_layouts"
    assert "layouts of 8,192 GPUs, each costing about 2 times a layout of 4,096 GPUs or fewer" in refused.value.message
    small = simtrain.load_scenario("pp4_dp4", {"training.global_batch": 4096})
    small_count = len(enumerate_layouts(small, 4096))
    assert len(enumerate_layouts(small, 4096, max_layouts=small_count)) == small_count


def test_cli_search_of_200000_gpus_is_refused_at_once_naming_what_to_narrow(simtrain_exe):
    """200,000 / 4,096 = 48.8 (shown 49): more than 200,000 / 48.8 = 4,096 layouts pass the default limit; exit 2,
    one sentence, within seconds (the old search ran for hours)."""
    done = subprocess.run([*simtrain_exe, "search", "pp4_dp4", "--gpus", "200000", "--workers", "1", "--set",
                           "training.global_batch=200000"], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: this search would screen more than 4,096 layouts of 200,000 GPUs, each costing about 49 times a "
        "layout of 4,096 GPUs or fewer (its collectives span the cluster): the work of more than max_layouts=200,000 "
        "layouts (about 15 min of one core before any simulation); narrow it (--fix), search fewer GPUs or a smaller "
        "global batch, or raise the limit (--max-layouts, search(max_layouts=...))\n")
