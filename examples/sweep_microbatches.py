"""How many micro-batches should the reference layout use? A sweep from Python.

Sweeps the micro-batch count of scenarios/pp4_dp4.yaml (PP=4 x DP=4, 1F1B) through the
global batch (global = micro-batch x count x DP, reference article rule 12), plots step
time and bubble fraction against the count, with the 1F1B bubble formula
(p - 1) / (m + p - 1) (Narayanan et al. 2021, Sec. 2.2.1) for reference, and prints the
best choice.

    python examples/sweep_microbatches.py [OUT.html | OUT_DIR]

The chart goes to OUT.html, to OUT_DIR/sweep_microbatches.html, or to a new temporary folder.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import simtrain
from simtrain.decide.sweep import sweep
from simtrain.report.charts import sweep_figure, write_figure

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "pp4_dp4.yaml"
COUNTS = [4, 8, 16, 32, 64]          # micro-batches per step per pipeline
WITHIN = 0.05                        # "good enough": throughput within 5% of the best


def output_path(argv: list[str]) -> Path:
    if not argv:
        return Path(tempfile.mkdtemp(prefix="simtrain-example-")) / "sweep_microbatches.html"
    path = Path(argv[0])
    return path / "sweep_microbatches.html" if path.is_dir() else path


def main(argv: list[str]) -> None:
    out = output_path(argv)
    sc = simtrain.load_scenario(SCENARIO)
    per_count = sc.training.micro_batch * sc.parallel.dp        # sequences per micro-batch count step
    table = sweep(sc, {"training.global_batch": [m * per_count for m in COUNTS]})
    table.insert(0, "microbatches", table["training_global_batch"] // per_count)

    p = sc.parallel.pp
    print(f"{sc.name}: pp={p}, dp={sc.parallel.dp}, micro_batch={sc.training.micro_batch}, {sc.parallel.schedule}")
    print("micro-batches  global batch  step time  tokens/s  bubble  (p-1)/(m+p-1)  fits")
    for row in table.itertuples(index=False):
        m = row.microbatches
        print(f"{m:13d}  {m * per_count:12d}  {row.step_time_s:7.3f} s  {row.tokens_per_s:8,.0f}  "
              f"{row.bubble_fraction:6.1%}  {(p - 1) / (m + p - 1):13.1%}  {'yes' if row.fits_in_memory else 'no'}")

    ok = table[table["error"].isna() & table["fits_in_memory"].astype(bool)]
    best = ok.loc[ok["tokens_per_s"].idxmax()]
    enough = ok[ok["tokens_per_s"] >= (1 - WITHIN) * best["tokens_per_s"]].iloc[0]
    print(f"best throughput: {best['microbatches']} micro-batches (global batch {best['training_global_batch']}): "
          f"{best['tokens_per_s']:,.0f} tokens/s, bubble {best['bubble_fraction']:.1%}")
    print(f"smallest count within {WITHIN:.0%} of it: {enough['microbatches']} micro-batches "
          f"(global batch {enough['training_global_batch']}, {enough['tokens_per_s']:,.0f} tokens/s); "
          "the global batch is also a training hyperparameter, so take the smallest that is fast enough")

    import plotly.graph_objects as go

    fig = sweep_figure(table, "microbatches", metrics=("step_time_s", "bubble_fraction"))
    fig.data[-1].update(name="simulated", showlegend=True)
    fig.add_trace(go.Scatter(x=COUNTS, y=[100 * (p - 1) / (m + p - 1) for m in COUNTS],
                             name="1F1B formula (p-1)/(m+p-1)", mode="lines", line=dict(dash="dot", color="gray")),
                  row=2, col=1)
    fig.update_xaxes(type="log", tickvals=COUNTS)          # counts double from point to point
    write_figure(out, f"{sc.name}: micro-batch sweep", [fig])
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
