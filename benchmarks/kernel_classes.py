"""Per-kernel-class time of one transformer layer as simtrain prices it (docs/validation.md, "What fast
predictions miss").

    python benchmarks/kernel_classes.py SCENARIO.yaml [...]

For one micro-batch of one layer: GEMMs, attention, element-wise kernels and norms, forward + backward (+ the
recompute the scenario's policy repeats), in ms and as shares of the layer; then the step's optimizer time,
exposed communication and the rest of the step. The parts are the same cost functions the plan uses
(simtrain/plan/costs.py), called one class at a time.
"""

from __future__ import annotations

import sys

from simtrain import load_scenario, simulate
from simtrain.plan import costs
from simtrain.plan.layer_floor import layer_shapes, step_device


def layer_classes(sc) -> dict[str, float]:
    """Seconds per class for one layer and one micro-batch (forward, backward and recompute)."""
    tr, m, par, hw = sc.training, sc.model, sc.parallel, sc.hardware
    dev = step_device(hw, tr, tr.precision, m)   # the plan's kernel model (flash kernel speed at its head width)
    _, sh = layer_shapes(m, tr, tp=par.tp, sequence_parallel=par.sequence_parallel, cp=par.cp,
                         micro_batch=tr.micro_batch)   # the plan's own layer shape (kernel widths, layer kernels)
    # the whole layer with each class priced apart: zero one class's cost at a time by difference
    whole = costs.layer_cost(sh, dev, tr.recompute)
    total = whole.forward + whole.backward + whole.recompute
    gemms = costs.gemm_shapes(sh)
    gemm = sum(dev.gemm_time(a, b, c) + dev.gemm_time(a, c, b) + dev.gemm_time(c, b, a) for a, b, c in gemms)
    if tr.recompute == "full":
        gemm += sum(dev.gemm_time(a, b, c) for a, b, c in gemms)
    elif tr.recompute == "selective_op":
        gemm += sum(dev.gemm_time(a, b, c) for a, b, c in costs.op_sac_matmuls(sh)[1])
    elem = dev.element_bytes
    sbh = sh.tokens * m.hidden * elem / (par.tp if sh.sequence_parallel else 1)
    norm_f = dev.norm_time(2 * 2 * sbh, backward=False, kernels=2)
    norms = norm_f + dev.norm_time(2 * 3 * sbh, backward=True, kernels=4)
    if tr.recompute in ("full", "selective_op"):
        norms += norm_f
    executed = costs.attention_flops(sh) * costs.causal_fraction(sh) * sh.attn_pad   # as costs.layer_cost times it
    attention = dev.attention_time(executed, sh.seq) + dev.attention_time(2.5 * executed, sh.seq) if sh.flash else 0.0
    if sh.flash and tr.recompute in ("full", "selective"):
        attention += dev.attention_time(executed, sh.seq)
    elementwise = total - gemm - norms - attention
    return {"GEMMs": gemm, "attention": attention, "element-wise": elementwise, "norms": norms, "layer": total}


def main(paths: list[str]) -> None:
    for path in paths:
        sc = load_scenario(path)
        parts = layer_classes(sc)
        res = simulate(sc)
        print(f"{path}: MFU {res.mfu:.1%}, step {res.step_time_s:.3f} s")
        for name, seconds in parts.items():
            print(f"  {name:13s} {seconds * 1e3:8.2f} ms  {seconds / parts['layer']:6.1%} of the layer")
        layers_time = parts["layer"] * sc.model.layers * sc.microbatches / max(sc.parallel.pp, 1)
        print(f"  layers x micro-batches {layers_time:.3f} s = {layers_time / res.step_time_s:.1%} of the step")


if __name__ == "__main__":
    main(sys.argv[1:])
