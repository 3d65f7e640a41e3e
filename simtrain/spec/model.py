"""Decoder-only transformer descriptions: presets, YAML files, HuggingFace configs.

A :class:`ModelSpec` holds the dimensions; parameter counts follow from them
exactly (no rounding), so a preset's count can be checked against the number
its authors published.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, ValidationInfo, field_validator

from simtrain.spec.errors import InputError, allowed, display_path, suggest
from simtrain.spec.schema import Closed, validate
from simtrain.spec.units import is_number
from simtrain.spec.yamlio import (
    LineDict,
    load_yaml,
    looks_like_path,
    read_text,
    reference_path,
)


class ModelSpec(Closed):
    """A decoder-only transformer: the dimensions that set FLOPs, bytes and memory."""

    name: str = Field("custom", description="display name")
    layers: PositiveInt = Field(description="number of transformer blocks")
    hidden: PositiveInt = Field(description="model width d_model")
    heads: PositiveInt = Field(description="attention (query) heads")
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (GQA); default = heads")
    ffn_hidden: PositiveInt = Field(description="MLP inner width")
    vocab: PositiveInt = Field(description="vocabulary size")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="gelu: 2 matrices; swiglu: 3 (gate, up, down)")
    tied_embeddings: bool = Field(False, description="output layer shares the input embedding")
    bias: bool = Field(False, description="linear layers carry biases (GPT-2/3 style)")
    norm: Literal["layernorm", "rmsnorm"] | None = Field(
        None, description="layernorm has weight+bias (2h), rmsnorm weight only (h); default rmsnorm for swiglu")
    position_embeddings: int = Field(0, ge=0, description="learned position table rows (GPT-3: 2048); 0 for RoPE/ALiBi")
    max_positions: PositiveInt | None = Field(
        None, description="longest sequence the model was built for (HF max_position_embeddings or n_positions); "
                          "informational: a longer training.seq_len warns")
    attention_window: PositiveInt | None = Field(
        None, description="sliding-window attention width (HF sliding_window); informational: simtrain costs full "
                          "causal attention, so a longer training.seq_len warns")

    # Field validators (not one model validator) so that an error names the field and its line.
    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, heads: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")
        if hidden is not None and hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads} (head size = hidden / heads)")
        return heads

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, kv_heads: int | None, info: ValidationInfo) -> int | None:
        heads = info.data.get("heads")
        if kv_heads is not None and heads is not None and heads % kv_heads:
            raise ValueError(f"heads={heads} is not divisible by kv_heads={kv_heads} (each KV head serves "
                             "heads / kv_heads query heads)")
        return kv_heads

    # --- derived sizes -------------------------------------------------
    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def norm_kind(self) -> str:
        return self.norm or ("rmsnorm" if self.mlp == "swiglu" else "layernorm")

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @property
    def kv_width(self) -> int:
        """Width of the K (or V) projection output: kv_heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm_kind == "layernorm" else 1)

    @property
    def matmul_params_per_layer(self) -> int:
        """Weights of one block's matrix multiplies: QKV, attention output, the MLP matrices."""
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_width
        return h * (h + 2 * kv) + h * h + self.mlp_matrices * h * f

    @cached_property
    def params_per_layer(self) -> int:
        """Weights of one block: attention, MLP, two norms (and biases if any)."""
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_width
        biases = (h + 2 * kv) + h + (f * (self.mlp_matrices - 1)) + h if self.bias else 0
        return self.matmul_params_per_layer + 2 * self.norm_params + biases

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.position_embeddings * self.hidden

    @property
    def output_params(self) -> int:
        """Final norm plus the output projection (absent when tied)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def params_total(self) -> int:
        return self.layers * self.params_per_layer + self.embedding_params + self.output_params


# --- loading -----------------------------------------------------------

def preset_names() -> list[str]:
    return list(_preset_names())


@lru_cache(maxsize=1)
def _preset_names() -> tuple[str, ...]:
    return tuple(sorted(p.name[:-5] for p in resources.files("simtrain.presets").iterdir() if p.name.endswith(".yaml")))


@lru_cache(maxsize=32)
def _load_preset(name: str) -> ModelSpec:
    """A bundled preset, parsed once (specs are immutable)."""
    return _load_preset_uncached(name)


def _load_preset_uncached(name: str) -> ModelSpec:
    path = resources.files("simtrain.presets") / f"{name}.yaml"
    data = load_yaml(str(path))
    data.pop("source", None)
    data.pop("params_published", None)
    return validate(ModelSpec, {"name": name, **data}, file=str(path))


_HF_KEYS = {
    "num_hidden_layers": "layers", "n_layer": "layers", "num_layers": "layers",
    "hidden_size": "hidden", "n_embd": "hidden", "d_model": "hidden",
    "num_attention_heads": "heads", "n_head": "heads",
    "num_key_value_heads": "kv_heads",
    "intermediate_size": "ffn_hidden", "n_inner": "ffn_hidden", "ffn_hidden_size": "ffn_hidden",
    "vocab_size": "vocab",
    "tie_word_embeddings": "tied_embeddings",
}


def from_hf_config(config: dict[str, Any], *, file: str, name: str | None = None, text: str | None = None) -> ModelSpec:
    """Map a HuggingFace ``config.json`` (Llama, Mistral, Qwen2, GPT-2 style) to a ModelSpec.

    Errors name the config's own key (``num_attention_heads``) and, given the file ``text``, its line.
    A config that describes a block simtrain does not build (experts, latent attention, a parallel
    block, a head width of its own) is refused rather than read as the nearest dense model.
    """
    for key in ("model_type", "hidden_act", "activation_function", "_name_or_path"):   # names: text, or absent
        if config.get(key) is not None and not isinstance(config[key], str):
            raise InputError(f"{_json_value(config[key])} is not text (a name, e.g. \"llama\")", file=file,
                             line=_json_line(text, key), field=key)
    # multi_query last: in a Falcon config the parallel block is the news, not the missing mapping
    for key, message in sorted(_unsupported(config), key=lambda problem: problem[0] == "multi_query"):
        raise InputError(message, file=file, line=_json_line(text, key.rsplit(".", 1)[-1]), field=key)
    out: dict[str, Any] = {"name": name or config.get("_name_or_path") or config.get("model_type", "hf-model")}
    source: dict[str, str] = {}
    for key, ours in _HF_KEYS.items():
        if key in config and config[key] is not None and ours not in out:
            value = config[key]
            # transformers writes these as JSON numbers and booleans; text here is a hand edit gone wrong
            wanted = "true or false" if ours == "tied_embeddings" else "a whole number"
            if isinstance(value, str) or (ours == "tied_embeddings" and not isinstance(value, bool)):
                raise InputError(f"{_json_value(value)} is not {wanted} (HuggingFace key for simtrain's '{ours}')",
                                 file=file, line=_json_line(text, key), field=key)
            out[ours] = value
            source[ours] = key
    act = str(config.get("hidden_act", config.get("activation_function", "gelu")))
    gated = config.get("model_type") in {"llama", "mistral", "qwen2", "qwen3", "gemma", "mixtral"} or act == "silu"
    out["mlp"] = "swiglu" if gated else "gelu"
    if "ffn_hidden" not in out and "hidden" in out:
        if gated:   # each config class has its own default width, tied to its own default hidden size
            raise InputError(f"is required but missing: a gated ({act}) MLP has no standard width "
                             "(LlamaConfig's default 11008 goes with its hidden_size 4096; "
                             "4 x hidden_size is GPT-2's)",
                             file=file, line=None, field="intermediate_size")
        out["ffn_hidden"] = 4 * out["hidden"]          # GPT2Config: n_inner None means 4 x n_embd
        source["ffn_hidden"] = source.get("hidden", "hidden_size")
    if config.get("model_type") in {"gpt2"}:
        out["bias"] = True
        out["position_embeddings"] = config.get("n_positions", 0)
        source["position_embeddings"] = "n_positions"
    if config.get("attention_bias") or config.get("mlp_bias"):
        out["bias"] = True
    # a config.json without tie_word_embeddings means its class's default (transformers' PreTrainedConfig: True;
    # LlamaConfig, MistralConfig, Qwen2Config...: False; GemmaConfig: True)
    out.setdefault("tied_embeddings", _TIED_BY_DEFAULT.get(str(config.get("model_type")), True))
    positions = config.get("max_position_embeddings", config.get("n_positions"))
    if is_number(positions) and not isinstance(positions, bool) and positions > 0:
        out["max_positions"] = int(positions)
    window = config.get("sliding_window")
    # Qwen2/Qwen3 configs window only with use_sliding_window (default False in Qwen2Config/Qwen3Config)
    windowed = config.get("use_sliding_window", False) if config.get("model_type") in {"qwen2", "qwen3"} else True
    if windowed and is_number(window) and not isinstance(window, bool) and window > 0:
        out["attention_window"] = int(window)
    try:
        return validate(ModelSpec, out, file=file)
    except InputError as err:
        ours = (err.field or "").split(".")[0]
        missing = err.message == "is required but missing"
        hf_key = source.get(ours) or " or ".join(k for k, v in _HF_KEYS.items() if v == ours) or ours
        message = f"{err.message} (HuggingFace key for simtrain's '{ours}')" if ours else err.message
        raise InputError(message, file=file, line=None if missing else _json_line(text, source.get(ours)),
                         field=hf_key if ours else None) from None


#: tie_word_embeddings when a config.json leaves it out: its config class's default (transformers
#: src/transformers/models/*/configuration_*.py; PreTrainedConfig's own default, True, for the others)
_TIED_BY_DEFAULT = {"llama": False, "mistral": False, "mixtral": False, "qwen2": False, "qwen3": False,
                    "phi3": False, "gemma": True, "gemma2": True, "gpt2": True}

_DENSE = "it supports dense decoder-only transformers (Llama, Mistral, Qwen2, GPT-2 style)"
_SEQUENTIAL = ("which simtrain does not model; it supports blocks that run attention, then the MLP (Llama, Mistral, "
               "Qwen2, GPT-2 style)")

#: keys that count experts or the experts each token is routed to: Mixtral's num_local_experts,
#: Qwen2-MoE's num_experts, DeepSeek's n_routed_experts / n_shared_experts, everyone's
#: num_experts_per_tok, DBRX's ffn_config.moe_num_experts / moe_top_k, ERNIE's moe_k
_EXPERT_COUNT = re.compile(r"(?:num|n)_\w*experts(?:_per_tok(?:en)?)?|experts_per_tok(?:en)?"
                           r"|moe_(?:\w*experts|top_k|k)")

#: DeepSeek-V2/V3 multi-head latent attention: keys and values (and queries) through low-rank latents
_MLA_KEYS = ("kv_lora_rank", "q_lora_rank")

#: block layouts other than attention-then-MLP, each true when the block differs
_BLOCK_KEYS = {
    "parallel_attn": f"means attention and the MLP side by side in one block (Falcon's parallel block), {_SEQUENTIAL}",
    "use_parallel_residual": f"means attention and the MLP side by side in one block (GPT-NeoX's parallel residual), "
                             f"{_SEQUENTIAL}",
    "new_decoder_architecture": f"means Falcon's new decoder (parallel attention and MLP with their own norms, grouped "
                                f"KV heads in num_kv_heads), {_SEQUENTIAL}",
    # Falcon and GPT-BigCode carry multi-query attention; mapping it to kv_heads=1 alone would still
    # miss what else those families default to (biases from 'bias', tied embeddings, Falcon's
    # parallel block, GPT-BigCode's learned position table), so the config is refused instead.
    "multi_query": "means multi-query attention in a Falcon or GPT-BigCode config, whose biases, tied embeddings and "
                   "position tables simtrain does not read; it supports Llama, Mistral, Qwen2 and GPT-2 style "
                   "configs (multi-query attention there is num_key_value_heads: 1)",
}


def _json_value(value: Any) -> str:
    """A config value as the JSON file spells it (true, null, 8), text quoted as elsewhere ('big')."""
    return repr(value) if isinstance(value, str) else json.dumps(value)


def _unsupported(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(key, message) for each key, in file order, that describes a model simtrain does not build.

    Nested sections are searched too (DBRX keeps its experts in ``ffn_config``).
    """
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _unsupported(value, f"{path}.")
        elif _EXPERT_COUNT.fullmatch(key) and is_number(value) and value > 1:
            yield path, (f"{_json_value(value)} makes this a mixture-of-experts model (more than one expert MLP per "
                         f"layer), which simtrain does not model; {_DENSE}, one MLP per layer")
        elif key in _MLA_KEYS and value is not None:
            yield path, (f"{_json_value(value)} means DeepSeek multi-head latent attention (keys and values through "
                         "a low-rank latent), which simtrain does not model; it supports multi-head, grouped-query "
                         "and multi-query attention (num_key_value_heads)")
        elif key in _BLOCK_KEYS and value is True:
            yield path, f"true {_BLOCK_KEYS[key]}"
        elif key == "head_dim" and not prefix and value is not None:
            message = _head_dim_problem(config, value)
            if message:
                yield path, message


def _head_dim_problem(config: dict[str, Any], head_dim: Any) -> str | None:
    """Why a config's ``head_dim`` cannot be modelled: simtrain's heads are hidden / heads wide."""
    if isinstance(head_dim, bool):
        return f"{_json_value(head_dim)} is a boolean, not a whole number (the width of one attention head)"
    if not is_number(head_dim):
        return f"{_json_value(head_dim)} is not a whole number (the width of one attention head)"
    hidden_key = next((k for k, v in _HF_KEYS.items() if v == "hidden" and config.get(k) is not None), None)
    heads_key = next((k for k, v in _HF_KEYS.items() if v == "heads" and config.get(k) is not None), None)
    if hidden_key is None or heads_key is None:
        return None                      # the missing width or head count is reported by the schema
    hidden, heads = config[hidden_key], config[heads_key]
    if not (is_number(hidden) and is_number(heads) and heads > 0) or head_dim * heads == hidden:
        return None
    return (f"{head_dim} differs from {hidden_key} / {heads_key} = {hidden} / {heads} = {hidden / heads:g}, which "
            "simtrain does not model; it assumes head_dim = hidden / heads (query, key, value and output projections "
            "as wide as the model)")


def _json_line(text: str | None, key: str | None) -> int | None:
    """Line of the first ``"key":`` in a JSON text (config.json files are flat)."""
    if not text or not key:
        return None
    m = re.search(rf'"{re.escape(key)}"\s*:', text)
    return text.count("\n", 0, m.start()) + 1 if m else None


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: json.loads keeps the last of two, silently; YAML files refuse them."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _NotFinite(ValueError):
    """Infinity, NaN or a number beyond floating point in a config.json (json.loads reads them as inf and nan)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _no_constant(text: str) -> float:
    raise _NotFinite(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _load_hf_json(path: Path) -> ModelSpec:
    text, shown = read_text(path, "JSON file")
    try:
        config = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant,
                            parse_float=_finite_float)
    except _NotFinite as bad:
        at = text.find(bad.text)
        raise InputError(f"{bad.text} is not a finite number (JSON has none; Python's json reader would accept it)",
                         file=shown, line=text.count("\n", 0, at) + 1 if at >= 0 else None) from None
    except _DuplicateKey as dup:
        line = [m.start() for m in re.finditer(rf'"{re.escape(dup.key)}"\s*:', text)]
        raise InputError(f"key '{dup.key}' appears twice in the same object", file=shown,
                         line=text.count("\n", 0, line[1]) + 1 if len(line) > 1 else None, field=dup.key) from None
    except json.JSONDecodeError as err:
        raise InputError(f"JSON syntax error, column {err.colno}: {err.msg}", file=shown, line=err.lineno) from None
    except (ValueError, RecursionError) as err:
        raise InputError(f"cannot read this JSON: {str(err).split(';')[0]}", file=shown) from None
    if not isinstance(config, dict):
        raise InputError("a config.json must hold a JSON object ({...})", file=shown, line=1)
    name = path.parent.name if path.name == "config.json" else path.stem
    return from_hf_config(config, file=shown, name=name, text=text)


_MODEL_SUFFIXES = (".yaml", ".yml", ".json")


def load_model(ref: Any, *, base_dir: Path, file: str | None, field: str = "model", root: Any = None) -> ModelSpec:
    """Resolve the scenario's ``model:`` value: preset name, file path, or inline mapping.

    A path is the user's own, resolved against ``base_dir`` (the scenario's folder); it must be an
    existing ``.yaml``/``.yml`` model file or a HuggingFace ``.json`` config. Errors inside the file
    name that file and its line.
    """
    if isinstance(ref, dict):
        return validate(ModelSpec, ref, file=file, prefix=field, root=root)
    if not isinstance(ref, str) or not ref.strip():
        shown = "a list" if isinstance(ref, list) else "an empty value (null)" if ref is None else repr(ref)
        raise InputError(f"{shown} is neither a preset name, a file path nor a mapping", file=file, field=field)
    if ref in preset_names():
        return _load_preset(ref)
    if not looks_like_path(ref, base_dir=base_dir, suffixes=_MODEL_SUFFIXES):
        raise InputError(f"unknown model preset '{ref}'{suggest(ref, preset_names())} ({allowed(preset_names())}; "
                         "or a path to a model YAML or HuggingFace config.json)", file=file, field=field)
    try:
        path = reference_path(ref, base_dir=base_dir, what="model", suffixes=_MODEL_SUFFIXES)
    except InputError as err:
        raise err.located(file=file, field=field) from None
    if path.suffix.lower() == ".json":
        return _load_hf_json(path)
    data = load_yaml(path)
    shown = display_path(path)
    if not isinstance(data, dict):
        raise InputError("a model file must hold a mapping of model dimensions (layers, hidden, heads, ...)",
                         file=shown, line=getattr(data, "line", 1))
    data = _without_notes(data)
    data.setdefault("name", path.stem)
    return validate(ModelSpec, data, file=shown)


def _without_notes(data: LineDict) -> LineDict:
    """A copy without the documentation keys a model file may carry (``source``, ``params_published``);
    it keeps the key lines, so errors still point at the file's lines."""
    out = LineDict((k, v) for k, v in data.items() if k not in ("source", "params_published"))
    out.key_lines = dict(data.key_lines)
    out.line = data.line
    return out
