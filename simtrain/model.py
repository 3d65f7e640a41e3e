"""Decoder-only transformer descriptions: presets, YAML files, HuggingFace configs.

A :class:`ModelSpec` holds the dimensions; parameter counts follow from them
exactly (no rounding), so a preset's count can be checked against the number
its authors published.
"""

from __future__ import annotations

import json
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from simtrain.errors import InputError, allowed, suggest
from simtrain.schema import Closed, validate
from simtrain.yamlio import load_yaml


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

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        return self

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

    @cached_property
    def params_per_layer(self) -> int:
        """Weights of one block: attention, MLP, two norms (and biases if any)."""
        h, f, kv = self.hidden, self.ffn_hidden, self.kv_width
        attn = h * (h + 2 * kv) + h * h
        mlp = self.mlp_matrices * h * f
        biases = (h + 2 * kv) + h + (f * (self.mlp_matrices - 1)) + h if self.bias else 0
        return attn + mlp + 2 * self.norm_params + biases

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
    return sorted(p.name[:-5] for p in resources.files("simtrain.presets").iterdir() if p.name.endswith(".yaml"))


def _load_preset(name: str) -> ModelSpec:
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


def from_hf_config(config: dict[str, Any], *, file: str, name: str | None = None) -> ModelSpec:
    """Map a HuggingFace ``config.json`` (Llama, Mistral, Qwen2, GPT-2 style) to a ModelSpec."""
    out: dict[str, Any] = {"name": name or config.get("_name_or_path") or config.get("model_type", "hf-model")}
    for key, ours in _HF_KEYS.items():
        if key in config and config[key] is not None and ours not in out:
            out[ours] = config[key]
    act = str(config.get("hidden_act", config.get("activation_function", "gelu")))
    gated = config.get("model_type") in {"llama", "mistral", "qwen2", "qwen3", "gemma", "mixtral"} or act == "silu"
    out["mlp"] = "swiglu" if gated else "gelu"
    if "ffn_hidden" not in out and "hidden" in out:
        out["ffn_hidden"] = 4 * out["hidden"]
    if config.get("model_type") in {"gpt2"}:
        out["bias"] = True
        out["position_embeddings"] = config.get("n_positions", 0)
        out.setdefault("tied_embeddings", True)
    if config.get("attention_bias") or config.get("mlp_bias"):
        out["bias"] = True
    out.setdefault("tied_embeddings", False)
    return validate(ModelSpec, out, file=file)


def load_model(ref: Any, *, base_dir: Path, file: str | None, field: str = "model", root: Any = None) -> ModelSpec:
    """Resolve the scenario's ``model:`` value: preset name, file path, or inline mapping."""
    if isinstance(ref, dict):
        return validate(ModelSpec, ref, file=file, prefix=field, root=root)
    if not isinstance(ref, str):
        raise InputError(f"{ref!r} is neither a preset name, a file path nor a mapping", file=file, field=field)
    if ref in preset_names():
        return _load_preset(ref)
    looks_like_path = ref.endswith((".json", ".yaml", ".yml")) or "/" in ref
    if not looks_like_path:
        raise InputError(f"unknown model preset '{ref}'{suggest(ref, preset_names())} ({allowed(preset_names())}; "
                         "or a path to a model YAML or HuggingFace config.json)", file=file, field=field)
    path = (base_dir / ref).resolve()
    if not path.is_file():
        raise InputError(f"model file '{ref}' does not exist (looked at {path})", file=file, field=field)
    if path.suffix == ".json":
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise InputError(f"not valid JSON: {err}", file=str(path)) from None
        if not isinstance(config, dict):
            raise InputError("a config.json must hold a JSON object", file=str(path))
        return from_hf_config(config, file=str(path), name=path.parent.name if path.name == "config.json" else path.stem)
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise InputError("a model file must hold a mapping of model dimensions", file=str(path))
    data = dict(data)
    data.pop("source", None)
    data.pop("params_published", None)
    data.setdefault("name", path.stem)
    return validate(ModelSpec, data, file=str(path))
