"""The simulated timeline as plain data: for charts, traces and saved reports.

``timeline_dict(result)`` turns the engine's records into JSON-ready lists
(times in seconds). ``simtrain plot`` reads it back from a saved report, so
charts never need a second simulation.
"""

from __future__ import annotations

from typing import Any

from simtrain.spec.units import report_float

FIELDS = ("lane", "stream", "kind", "start_s", "end_s", "microbatch", "vstage", "layer_lo", "layer_hi", "bytes")


def timeline_dict(result) -> dict[str, Any] | None:
    tl = result.timeline
    if tl is None:
        return None
    sc_pp = result.config.get("parallel", {}).get("pp", 1)
    tp = result.config.get("parallel", {}).get("tp", 1)
    lanes = []
    for lane in tl.lanes:
        lanes.append({"index": lane.index, "dp": lane.dp, "pp": lane.rank, "end_s": report_float(lane.end),
                      "memory_activations": [[report_float(t), round(b)] for t, b in lane.mem_events],
                      "memory_buffers": [[report_float(t), round(b)] for t, b in lane.buf_events]})
    records = [[r[0], r[1], r[2], report_float(r[3]), report_float(r[4]), r[5], r[6], r[7], r[8], round(r[9])]
               for r in tl.records]
    out = {"fields": list(FIELDS), "step_time_s": report_float(tl.step_time), "full": tl.full, "pp": sc_pp, "tp": tp,
           "lanes": lanes, "records": records}
    classes = getattr(tl, "classes", None)
    if classes is not None:   # symmetry classes: the replicas each lane's dp stands for (first of each class)
        out["classes"] = [list(c) for c in classes]
    return out
