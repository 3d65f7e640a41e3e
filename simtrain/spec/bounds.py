"""The ranges every number from a file, an override or a Python caller must fall in: one table, checked at the
door (the quantity types of simtrain.spec.quantity, and a check that every closed schema runs over its plain number
fields, simtrain.spec.schema.Closed), so a field added later is covered without a line of its own.

A number is refused when it is infinite or NaN, or outside its range. The ranges are wide: they refuse what no
hardware, model or run can be (a bandwidth of 1e-300 B/s, a fragmentation of 1e300, a 30-digit layer count), never
a value someone might mean; each says why it is where it is. docs/errors.md lists them.
"""

from __future__ import annotations

import math

#: quantity kind -> (smallest non-zero value, largest value, unit shown, why). Zero stays allowed where the
#: field's own check allows it (a latency of 0).
QUANTITY_RANGES: dict[str, tuple[float, float, str, str]] = {
    # 1 B up to 1 EB: the largest GPU memory is 288 GB (B300) and a node's host memory a few TB
    "bytes": (1.0, 1e18, "B", "1 B to 1 EB"),
    # 1 kB/s up to 1 EB/s: HBM3e is 8 TB/s and NVLink 5 1.8 TB/s per GPU; an "ideal" link in a test file is written
    # as 1 EB/s; a 1 kB/s link would take hours per step
    "bandwidth": (1e3, 1e18, "B/s", "1 kB/s to 1 EB/s"),
    # 1 GFLOP/s up to 1 ZFLOP/s: a B200 peaks near 1e16 FLOP/s (fp4, sparse); room for an "ideal" test GPU
    "flops": (1e9, 1e21, "FLOP/s", "1 GFLOP/s to 1 ZFLOP/s"),
    # 1 ps up to 1 day: no latency or fixed cost is below a picosecond, and a step of a day is not a training step
    "time": (1e-12, 86_400.0, "s", "1 ps to 1 day"),
    # 1 W up to 10 MW (a whole data hall, never one GPU)
    "power": (1.0, 1e7, "W", "1 W to 10 MW"),
    # efficiencies and fractions: below one part in a million no link or kernel still runs
    "fraction": (1e-6, 1.0, "", "1e-6 to 1"),
    # plain numbers (factors, sizes, prices): beyond a million they are typos
    "number": (1e-9, 1e6, "", "1e-9 to 1e6"),
}

#: a whole number's largest magnitude unless the table below says otherwise: 2**40 (about 1.1e12) is beyond any
#: count simtrain reads (layers, widths, GPUs, batches), and products of a few such stay exact in a float
WHOLE_MAX = 2**40
#: a plain float (not a quantity) anywhere in a schema: finite, and 0 or between these magnitudes
FLOAT_RANGE = (1e-12, 1e12)

#: why an overlap_slowdown is at least 1 (docs/model.md section 7)
_OVERLAP_WHY = "it multiplies compute time while a collective runs; below 1 overlapped compute would run faster"

#: "Class.field" -> (low, high, why): plain numbers whose meaning gives a tighter range
FIELD_RANGES: dict[str, tuple[float, float, str]] = {
    "MemoryOverheads.fragmentation": (0.0, 1.0, "a fraction of the allocated memory"),
    "Simulation.jitter": (0.0, 10.0, "a coefficient of variation; 10 already means kernel times spread 100-fold"),
    "Simulation.seed": (0, 2**63 - 1, "numpy's seeds are non-negative"),
    "Straggler.slowdown": (0.0, 1000.0, "a GPU 1000 times slower is a failed GPU"),
    # compute shares its GPU with a collective: never faster than alone; 1000, as for a straggler, is a failed GPU
    "ComputeModel.overlap_slowdown": (1.0, 1000.0, _OVERLAP_WHY),
    "IntraNode.overlap_slowdown": (1.0, 1000.0, _OVERLAP_WHY),
    "InterNode.overlap_slowdown": (1.0, 1000.0, _OVERLAP_WHY),
    "Training.seq_len": (1, 2**27, "134 million tokens, ten times the longest context trained"),
    "Training.global_batch": (1, 2**30, "sequences per step"),
    "Training.micro_batch": (1, 2**30, "sequences per micro-batch"),
    "ModelSpec.layers": (1, 2**14, "16 times the deepest transformer trained, DeepNet's 1,000 layers (Wang et al. "
                         "2022, arXiv:2203.00555); the plan is built layer by layer, so deeper models only cost time"),
    "ModelSpec.hidden": (1, 2**24, "16 million; the widest models have 2**14 to 2**15"),
    "ModelSpec.ffn_hidden": (1, 2**26, "64 million"),
    "ModelSpec.heads": (1, 2**20, "a million heads"),
    "ModelSpec.kv_heads": (1, 2**20, "a million heads"),
    "ModelSpec.vocab": (1, 2**30, "a billion tokens; the largest vocabularies have 2**18"),
}


def float_range(owner: str, field: str) -> tuple[float, float]:
    """(smallest non-zero magnitude, largest) of the plain float field ``owner.field``, as :func:`number_problem`
    checks it: its :data:`FIELD_RANGES` rule, else :data:`FLOAT_RANGE` (for an option or argument that stands for the
    field, e.g. ``compare --price`` for ``ScenarioCost.price_per_gpu_hour``)."""
    rule = FIELD_RANGES.get(f"{owner}.{field}")
    return (rule[0], rule[1]) if rule is not None else FLOAT_RANGE


def _shown(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        text = f"{abs(value)}"
        if len(text) > 24:     # beyond a float (10**400): the first digits and the exponent, never float(value)
            tail = text[1:3].rstrip("0")
            text = f"{text[0]}{'.' + tail if tail else ''}e+{len(text) - 1}"      # as f"{x:.3g}" shows a float
        return ("-" if value < 0 else "") + text
    return f"{value:g}"


def quantity_problem(kind: str, x: float) -> str | None:
    """Why SI value ``x`` of quantity ``kind`` is refused, or None (zero is left to the field's own check)."""
    if kind not in QUANTITY_RANGES:
        return None
    low, high, unit, words = QUANTITY_RANGES[kind]
    if not math.isfinite(x):
        return f"{x} is not a finite number"
    if x == 0 or low <= abs(x) <= high:
        return None
    return f"{_shown(x)}{' ' + unit if unit else ''} is outside the range simtrain accepts ({words})"


def number_problem(owner: str, field: str, value: object) -> str | None:
    """Why a plain number (int or float, not a bool) of field ``owner.field`` is refused, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number"
    rule = FIELD_RANGES.get(f"{owner}.{field}")
    if rule is not None:
        low, high, why = rule
        if not low <= value <= high:
            return f"{_shown(value)} is outside the range simtrain accepts ({_shown(low)} to {_shown(high)}: {why})"
        return None
    if isinstance(value, int):
        if abs(value) > WHOLE_MAX:
            return f"{_shown(value)} is outside the range simtrain accepts (magnitude at most 2**40 = {WHOLE_MAX:,})"
        return None
    if value != 0 and not FLOAT_RANGE[0] <= abs(value) <= FLOAT_RANGE[1]:
        return (f"{_shown(value)} is outside the range simtrain accepts (0, or a magnitude from "
                f"{FLOAT_RANGE[0]:g} to {FLOAT_RANGE[1]:g})")
    return None
