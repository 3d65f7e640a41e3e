"""DataFrames of the decision tools, with dtypes that do not drift.

``sweep``, ``search(...).table``, ``compare`` and ``validate`` return pandas DataFrames whose column names are plain
identifiers (a swept scenario key ``parallel.vpp`` is the column ``parallel_vpp``) and whose dtypes are fixed per
column, not inferred from the values: metrics are ``float64`` (NaN where a point failed), booleans that can be
unknown are pandas' nullable ``boolean``, text is pandas' ``string`` (``<NA>`` where absent). So a failed point
does not turn ``step_time_s`` into ``object``, and a table written by simtrain and read back with
:func:`simtrain.decide.sweep_files.read_table` (CSV, JSON lines or Parquet) has the dtypes it had.
"""

from __future__ import annotations

from typing import Any

#: the dtype of every result column simtrain writes (sweeps, search, compare, validate)
DTYPES: dict[str, str] = {
    # sweep and search metrics (SI units)
    "step_time_s": "float64", "tokens_per_s": "float64", "mfu": "float64", "hfu": "float64",
    "bubble_fraction": "float64", "peak_memory_bytes_max": "float64", "fits_in_memory": "boolean",
    "error": "string",
    # search
    "tp": "int64", "pp": "int64", "dp": "int64", "vpp": "int64", "micro_batch": "int64", "zero": "int64",
    "recompute": "string", "schedule": "string", "sequence_parallel": "bool", "precision": "string",
    "layers_per_stage": "string", "status": "string", "ep_overlap": "bool",
    "estimate_s": "float64", "lower_bound_s": "float64", "compute_s": "float64", "recompute_s": "float64",
    "exposed_tp_s": "float64", "exposed_pp_s": "float64", "exposed_dp_s": "float64", "exposed_ep_s": "float64",
    "reason": "string",
    "peak_memory_fraction": "float64",
    "recompute_layers": "int64", "recompute_modules": "string", "activation_offload_layers": "int64",
    "offload": "boolean", "partial": "boolean", "modules": "boolean",
    # compare
    "scenario": "string", "file": "string", "hardware": "string", "gpu": "string", "gpus": "int64",
    "model": "string", "global_batch": "int64", "seq_len": "int64", "layout": "string",
    "step_time_band_low_s": "float64", "step_time_band_high_s": "float64",
    "memory_capacity_bytes": "float64", "tokens": "float64", "goodput": "float64", "time_to_train_s": "float64",
    "days": "float64", "gpu_hours": "float64", "price_per_gpu_hour": "float64", "price_source": "string",
    "cost_usd": "float64", "gpu_power_w": "float64", "energy_j": "float64", "energy_mwh": "float64",
    # validate
    "id": "string", "source": "string", "source_name": "string", "gate": "bool", "config": "string",
    "target_step_time_s": "float64",
    "predicted_step_time_s": "float64", "step_time_error": "float64", "predicted_peak_memory_bytes": "float64",
    "measured_memory_bytes": "float64", "failure": "string",
}

#: the columns that count bytes: whole numbers (float64, for the NaN of a failed point), as in the JSON reports
BYTE_COLUMNS = frozenset(c for c in DTYPES if "bytes" in c)


def column_name(key: str) -> str:
    """The column of a swept scenario key: ``parallel.vpp`` -> ``parallel_vpp`` (an identifier, so that
    ``df.parallel_vpp`` and ``df.query`` work)."""
    return str(key).replace(".", "_")


def typed(frame, dtypes: dict[str, str] | None = None):
    """``frame`` with the fixed dtype of each known column, and text columns (all values str) as ``string``.
    Other columns (swept values) keep what pandas inferred from them: ints stay int64, floats float64."""
    import pandas as pd

    dtypes = DTYPES if dtypes is None else dtypes
    frame = frame.copy()
    for col in frame.columns:
        want = dtypes.get(str(col))
        series = frame[col]
        if want is None:
            values = [v for v in series.tolist() if not _missing(v)]
            if series.dtype == object and values and all(isinstance(v, str) for v in values):
                frame[col] = series.astype("string")
            continue
        if want == "boolean":
            frame[col] = pd.array([pd.NA if _missing(v) else _truth(v) for v in series.tolist()], dtype="boolean")
        elif want == "bool":
            frame[col] = pd.array([_truth(v) for v in series.tolist()], dtype="bool")
        elif want == "string":
            # a list (a searched layout's recompute_modules) as its items joined by commas
            frame[col] = pd.array([pd.NA if _missing(v) or v == "" else
                                   ",".join(map(str, v)) if isinstance(v, list) else str(v)
                                   for v in series.tolist()], dtype="string")
        elif want == "int64" and series.isna().any():
            frame[col] = pd.to_numeric(series).astype("float64")   # a missing count cannot be an int64
        else:
            frame[col] = pd.to_numeric(series, errors="coerce").astype(want)
        if str(col) in BYTE_COLUMNS:
            frame[col] = frame[col].round()     # whole bytes, as every --json writes them (NaN stays NaN)
    return frame


def frame_of(rows: list[dict[str, Any]], columns: list[str] | None = None):
    """A typed DataFrame of plain row dicts (the column order of ``columns``, else of the first row)."""
    import pandas as pd

    return typed(pd.DataFrame(rows, columns=columns))


def _missing(value: Any) -> bool:
    if value is None or type(value).__name__ == "NAType":
        return True
    return isinstance(value, float) and value != value


def _truth(value: Any) -> bool:
    """A boolean cell, also as CSV text ('True', 'false', '1')."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "1.0", "yes")
    return bool(value)
