"""Resolving a scenario's ``model:``: a bundled preset, a model YAML, a HuggingFace config.json, an inline mapping."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from simtrain.spec.errors import InputError, allowed, display_path, suggest
from simtrain.spec.model import ModelSpec
from simtrain.spec.model_hf import load_hf_json
from simtrain.spec.schema import validate
from simtrain.spec.yamlio import LineDict, load_yaml, looks_like_path, reference_path

#: documentation keys a model file may carry beside the dimensions
_NOTES = ("source", "params_published", "params_active_published")




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
    for key in _NOTES[1:]:
        data.pop(key, None)
    return validate(ModelSpec, {"name": name, **data}, file=str(path))


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
        return load_hf_json(path)
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
    out = LineDict((k, v) for k, v in data.items() if k not in _NOTES)
    out.key_lines = dict(data.key_lines)
    out.line = data.line
    return out
