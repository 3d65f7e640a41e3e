"""The one exception type for bad input, and how it is shown to a person.

Every problem with a user's file becomes an :class:`InputError` that knows the
file, the line, the dotted field name and the offending value, so the CLI can
print a single located sentence (``scenarios/x.yaml:12: parallel.tp: ...``) and
exit with status 2 instead of a traceback.
"""

from __future__ import annotations

import difflib
import json
import os
import reprlib
from collections.abc import Iterable


class InputError(Exception):
    """A problem with user input: a file, a field or a value the rules forbid."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.field = field

    def located(self, *, file: str | None = None, line: int | None = None,
                field: str | None = None) -> InputError:
        """Fill in the location parts that are still unknown (innermost wins)."""
        self.file = self.file or file
        self.line = self.line or line
        self.field = self.field or field
        return self

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        field = f"{self.field}: " if self.field else ""
        text = one_line(f"{where}{field}{self.message}")
        return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 5] + " ..."


#: the longest message shown: every sentence simtrain writes is far shorter; a value quoted from a file is cut
#: (``short_repr``) and this bounds whatever else a file could smuggle into one
MAX_MESSAGE_CHARS = 2000

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 2, 4, 6, 6, 6
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 40


def short_repr(value: object) -> str:
    """A value from a file as a message quotes it: its repr, cut to a few items and characters however large the
    value is (a list of a million items is shown as its first few and '...')."""
    return _REPR.repr(value)


def file_value(value: object) -> str:
    """A value as a YAML or JSON file spells it (true, null, [true, null], 8), text quoted as short_repr quotes it
    ('big'); cut to 60 characters, as every value a message or warning quotes."""
    if isinstance(value, str):
        return short_repr(value)
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):     # a value JSON cannot spell (a cycle, a NaN key)
        return short_repr(value)
    return text if len(text) <= 60 else text[:56] + " ..."


class SimulationLimitError(InputError):
    """The scenario would need more work than a configured bound allows (``simulation.max_events``,
    ``simulation.max_gpus``); the message names the estimate and the way out. Exit status 2, like
    any other input error: the input asks for too much, the program is not broken."""


def one_line(text: str) -> str:
    """Control characters from a file (newlines, tabs, terminal escapes) shown escaped, so a message
    stays one line and cannot repaint the user's terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


#: names other tools use for simtrain's keys, so a key copied from a Megatron-LM command line
#: (--tensor-model-parallel-size, --num-layers, --seq-length, --global-batch-size, ...), a DeepSpeed
#: config (zero_optimization.stage) or a HuggingFace config is pointed at the right key, not at
#: the nearest spelling ('tensor_parallel' is closest to 'sequence_parallel')
SYNONYMS = {
    "tp": ("tensor_parallel", "tensor_model_parallel_size", "tensor_parallel_size", "tp_size", "mp"),
    "pp": ("pipeline_parallel", "pipeline_model_parallel_size", "pipeline_parallel_size", "pp_size"),
    "dp": ("data_parallel", "data_parallel_size", "dp_size"),
    "vpp": ("virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage", "virtual_stages",
            "interleave", "chunks"),
    "zero": ("zero_stage", "zero_optimization"),
    "seq_len": ("seq_length", "sequence_length", "max_seq_len", "max_position_embeddings", "context_length"),
    "global_batch": ("global_batch_size", "batch_size", "gbs"),
    "micro_batch": ("micro_batch_size", "mbs", "per_device_train_batch_size"),
    "recompute": ("activation_checkpointing", "gradient_checkpointing", "recompute_granularity", "checkpointing"),
    "layers": ("num_layers", "num_hidden_layers", "n_layer", "n_layers", "depth"),
    "hidden": ("hidden_size", "d_model", "n_embd", "dim", "width"),
    "heads": ("num_attention_heads", "n_head", "n_heads", "num_heads"),
    "kv_heads": ("num_key_value_heads", "num_query_groups", "n_kv_heads", "kv_groups"),
    "ffn_hidden": ("ffn_hidden_size", "intermediate_size", "n_inner", "ffn_dim", "mlp_hidden"),
    "vocab": ("vocab_size", "padded_vocab_size", "n_vocab"),
    "memory": ("hbm", "memory_size", "vram"),
    "peak_flops": ("flops", "tflops", "peak"),
}


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the valid choice another tool calls ``word``, else the closest
    spelling, or ''."""
    choices = list(choices)
    key = str(word).strip().lower().replace("-", "_").lstrip("_")
    for ours, names in SYNONYMS.items():
        if ours in choices and (key in names or key == ours):
            return f" (did you mean '{ours}'?)"
    match = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    if not match:   # another letter case: DGX-H100 for dgx-h100
        lowered = {str(c).lower(): c for c in choices}
        close = difflib.get_close_matches(str(word).lower(), list(lowered), n=1, cutoff=0.6)
        match = [lowered[close[0]]] if close else []
    return f" (did you mean '{match[0]}'?)" if match else ""


def allowed(choices: Iterable[object]) -> str:
    """'allowed: a, b, c' for a message that lists the valid choices."""
    return "allowed: " + ", ".join(str(c) for c in choices)


def display_path(path: object) -> str:
    """A file as a person finds it: relative to the working folder when inside it, else as given."""
    text = str(path)
    if not os.path.isabs(text):
        return text
    try:
        rel = os.path.relpath(text)
    except ValueError:          # another drive on Windows
        return text
    return text if rel.startswith("..") else rel
