"""Write examples/plan_a_run.ipynb (outputs stripped) from the cells below: `python examples/make_plan_a_run.py`.

The notebook is generated so that its text stays reviewable as Python; tests/test_example_notebook.py runs it.
"""

from pathlib import Path

import nbformat

CELLS = [
    ("markdown", """# Plan a run: Llama 3 70B on H100s

Which layout, which machine, how many days and dollars, in a few cells. Every number comes from simtrain's
simulation of one training step (`docs/model.md` says how it is computed and how far it has been off on
published runs)."""),
    ("code", """import simtrain

simtrain.charts.notebook_renderer()      # figures that survive nbconvert --to html and nbviewer (docs/visualization.md)
print("scenarios:", simtrain.scenarios())
print("hardware: ", simtrain.hardware())"""),
    ("markdown", """## 1. Does it fit?

The bundled `tp8_llama3_70b` scenario trains Llama 3 70B on 4 DGX H100 nodes. Set DP to follow the cluster
(`parallel.dp: auto`) and a global batch of 128 sequences of 4,096 tokens (0.5 M tokens per step)."""),
    ("code", """sc = simtrain.load_scenario("tp8_llama3_70b", {"parallel.dp": "auto", "training.global_batch": 128})
simtrain.memory(sc)"""),
    ("markdown", """## 2. Which layout? A search narrowed to ZeRO-1, TP 4 or 8 and BF16, on 64 GPUs

BF16, so that the comparison with the A100 below (which has no FP8) trains the same way.
The default memory margin (`max_memory=0.92`) keeps the memory ledger's measured error (7.8%) free."""),
    ("code", """found = simtrain.search(sc, gpus=64, fix={"parallel.zero": 1, "parallel.tp": [4, 8],
                                                "training.precision": "bf16"}, top=5)
found"""),
    ("code", """found.table.query("status == 'simulated'").sort_values("tokens_per_s", ascending=False).head()"""),
    ("markdown", """## 3. How does the winner scale? A sweep over nodes on a Dask LocalCluster

`parallel.dp: auto` lets DP follow `nodes`; the global batch grows with it (paired with `zip=`), so each GPU keeps
its share."""),
    ("code", """from dask.distributed import Client, LocalCluster

best = found.best.scenario.with_overrides({"parallel.dp": "auto"})
with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
    scaling = simtrain.sweep(best, {"nodes": [4, 8, 16], "training.global_batch": [64, 128, 256]},
                             zip=["nodes", "training.global_batch"], executor=client.get_executor())
scaling"""),
    ("code", """simtrain.charts.plot_sweep(scaling, "nodes", metrics=("tokens_per_s", "mfu"))"""),
    ("markdown", """## 4. Which machine? 512 H100 or 512 A100, at market prices

The winning layout on 64 nodes (DP 32, a global batch of 1,024 sequences: 4 M tokens per step). Prices per GPU-hour
replace the hardware files' list prices; a goodput of 90% counts restarts and checkpoints (without it, the days
are steady-state)."""),
    ("code", """h100 = best.with_overrides({"nodes": 64, "training.global_batch": 1024, "name": "512 H100"})
a100 = h100.with_overrides({"hardware": "dgx-a100", "name": "512 A100"})
cost = simtrain.compare([h100, a100], tokens="2T",
                        price_per_gpu_hour={"dgx-h100": 2.50, "dgx-a100": 1.30}, goodput=0.9)
cost[["scenario", "gpus", "layout", "tokens_per_s", "fits_in_memory", "days", "gpu_hours", "cost_usd",
      "energy_mwh"]]"""),
    ("code", """print(cost.attrs["time_note"])
for warning in cost.attrs["warnings"]:
    print("warning:", warning)
simtrain.charts.plot_compare(cost)"""),
    ("markdown", """## 5. Where does the time go? The winner's step"""),
    ("code", """result = simtrain.simulate(found.best.scenario)
result"""),
    ("code", """result.gantt()"""),
]


def main() -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
                for kind, text in CELLS]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"        # fixed ids: the same file every time
    nbformat.write(nb, Path(__file__).with_name("plan_a_run.ipynb"))


if __name__ == "__main__":
    main()
