"""Distributed sweeps (issue 5, deliverable 2): a real Dask LocalCluster's executor runs the sweep
in its worker processes and returns the serial rows; Dask stays an optional import."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from conftest import make_scenario

from simtrain.decide.sweep import sweep

GRID = {"parallel.schedule": ["gpipe", "1f1b"], "training.global_batch": [4, 8, 12]}


def test_dask_local_cluster_runs_the_sweep_in_its_workers():
    """client.get_executor() of a 2-process LocalCluster gives the rows of workers=1, run as cluster tasks."""
    distributed = pytest.importorskip("distributed")
    sc = make_scenario(parallel={"pp": 2}, training={"global_batch": 4})
    serial = sweep(sc, GRID, workers=1, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client, distributed.get_task_stream(client) as stream:
        remote = sweep(sc, GRID, executor=client.get_executor(), progress=False)
        workers = set(client.scheduler_info()["workers"])
    pd.testing.assert_frame_equal(serial, remote)
    tasks = [t for t in stream.data if "evaluate_point" in t["key"]]
    assert len(tasks) == len(serial) == 6
    assert {t["worker"] for t in tasks} <= workers


def test_simtrain_does_not_import_dask():
    """Dask is an optional extra: importing the sweep module (and running a serial sweep) never loads it."""
    code = ("import sys, simtrain.decide.sweep, simtrain.decide.search, simtrain.cli.commands_decide; "
            "sys.exit(1 if any(m == 'dask' or m.startswith(('dask.', 'distributed')) for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
