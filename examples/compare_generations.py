"""Llama-3-70B on 1T tokens: H100 vs B200 vs GB200 NVL72 -- days, dollars, MWh.

The same training on 64 GPUs of each generation: 8 DGX H100 nodes, 8 DGX B200 nodes, and 16 compute trays of one
GB200 NVL72 rack. Sequence 8192, global batch 128, and the layout NVIDIA publishes for Llama-3-70B on 64 H100s in
Megatron-Bridge (TP 4 with sequence parallelism and TP communication overlap, PP 8 with 5 virtual stages, DP 2,
distributed optimizer; simtrain's bundled case mbridge_2511_h100_llama3_70b_fp8cs_64gpu, predicted within 4%). Each
trains in the FP8 its generation is published with: tensorwise current scaling on Hopper, MXFP8 on Blackwell, with
cuDNN attention as Transformer Engine picks it. Prices and board powers come from the hardware files (each with its
source and date: hardware/README.md); energy is GPU board power x time only.

    python examples/compare_generations.py [OUT.html | OUT_DIR]

One dense model keeps the comparison like for like; mixtures of experts are modelled too (the qwen3-235b-a22b
preset, say, with parallel.ep) and compare the same way.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from simtrain.decide.compare import compare, compare_figure, compare_text
from simtrain.report.charts import write_figure
from simtrain.spec.scenario import scenario_from_dict

TOKENS = "1T"
MACHINES = [("H100", "dgx-h100", 8, "tensorwise"), ("B200", "dgx-b200", 8, "mxfp8"),
            ("GB200-NVL72", "gb200-nvl72", 16, "mxfp8")]


def scenario(label: str, hardware: str, nodes: int, recipe: str):
    return scenario_from_dict({
        "name": label, "hardware": hardware, "nodes": nodes, "model": "llama3-70b",
        "training": {"seq_len": 8192, "global_batch": 128, "micro_batch": 1, "precision": "fp8", "fp8_recipe": recipe,
                     "flash_attention": "cudnn", "dropout": False, "cross_entropy": "fused", "grad_dtype": "bf16"},
        "parallel": {"dp": 2, "tp": 4, "pp": 8, "vpp": 5, "schedule": "interleaved-1f1b", "zero": 1,
                     "sequence_parallel": True, "tp_comm_overlap": True}})


def output_path(argv: list[str]) -> Path:
    if not argv:
        return Path(tempfile.mkdtemp(prefix="simtrain-example-")) / "compare_generations.html"
    given = Path(argv[0])
    return given / "compare_generations.html" if given.is_dir() else given


def main(argv: list[str]) -> None:
    rows = compare([scenario(*m) for m in MACHINES], tokens=TOKENS)
    print(compare_text(rows))
    for r in rows:
        print(f"{r['scenario']:<12} {r['time_to_train_s'] / 86400:6.1f} days  ${r['cost_usd']:>12,.0f}  "
              f"{r['energy_j'] / 3.6e9:6.1f} MWh")
    out = write_figure(output_path(argv), "Llama-3-70B on 1T tokens", [compare_figure(rows)])
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
