"""Model presets and HuggingFace imports give the published parameter counts (issue 2, deliverable 4).

Expected counts come from outside the code: the HuggingFace model cards / safetensors index
``total_size`` (in bytes, divided by 2 for 16-bit weights) of each released checkpoint, and
Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (arXiv:2104.04473), Sec. 5.1 and Table 1 for GPT-3.
"""

from __future__ import annotations

import pytest
from conftest import DATA

from simtrain.spec.errors import InputError
from simtrain.spec.model import ModelSpec
from simtrain.spec.model_load import load_model

#: published totals (HF safetensors index total_size / 2 bytes per bf16/fp16 weight)
PUBLISHED = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
}


def _preset(name: str) -> ModelSpec:
    return load_model(name, base_dir=DATA, file="test.yaml")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_count_equals_published(name):
    """A preset's parameter count equals the released checkpoint's, to the parameter."""
    assert _preset(name).params_total == PUBLISHED[name]


def test_gpt3_175b_matches_narayanan_table1():
    """GPT-3 175B has 174.6B parameters within 0.1% (Narayanan et al. 2021, Table 1)."""
    assert _preset("gpt3-175b").params_total == pytest.approx(174.6e9, rel=1e-3)


@pytest.mark.parametrize("h", [1024, 4096, 12288])
def test_gpt_layer_has_12h2_plus_13h_parameters(h):
    """A GPT layer (4h MLP, biases, two LayerNorms) has 12h^2 + 13h parameters (Narayanan et al. 2021, Sec. 5.1)."""
    spec = ModelSpec(layers=1, hidden=h, heads=16, ffn_hidden=4 * h, vocab=1000, mlp="gelu", bias=True,
                     norm="layernorm", tied_embeddings=True)
    assert spec.params_per_layer == 12 * h * h + 13 * h


def test_gpt_model_total_follows_narayanan_formula():
    """P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)), plus the final LayerNorm's 2h (Narayanan et al. 2021, Sec. 5.1)."""
    l, h, V, s = 96, 12288, 51200, 2048   # Table 1 counts the padded vocabulary 51200
    spec = ModelSpec(layers=l, hidden=h, heads=96, ffn_hidden=4 * h, vocab=V, mlp="gelu", bias=True,
                     norm="layernorm", tied_embeddings=True, position_embeddings=s)
    formula = 12 * l * h * h + 13 * l * h + (V + s) * h   # the expanded form of the equation
    assert spec.params_total == formula + 2 * h
    assert formula == pytest.approx(174.6e9, rel=1e-3)


@pytest.mark.parametrize(("folder", "published"), [
    ("core_hf_llama-2-7b", 6_738_415_616),
    ("core_hf_meta-llama-3-8b", 8_030_261_248),
])
def test_hf_config_import_gives_published_count(folder, published):
    """A HuggingFace config.json (Llama-2-7b, Meta-Llama-3-8B) imports to the published parameter count."""
    spec = load_model(f"{folder}/config.json", base_dir=DATA, file="test.yaml")
    assert spec.params_total == published
    assert spec.mlp == "swiglu" and not spec.tied_embeddings


def test_hf_import_reads_gqa_heads():
    """num_key_value_heads becomes kv_heads (Meta-Llama-3-8B: 32 query heads, 8 KV heads)."""
    spec = load_model("core_hf_meta-llama-3-8b/config.json", base_dir=DATA, file="test.yaml")
    assert (spec.heads, spec.num_kv_heads, spec.layers, spec.hidden) == (32, 8, 32, 4096)


def test_hf_import_equals_preset():
    """The preset and the imported config.json describe the same Llama-2-7b."""
    spec = load_model("core_hf_llama-2-7b/config.json", base_dir=DATA, file="test.yaml")
    preset = _preset("llama2-7b")
    dims = ("layers", "hidden", "heads", "num_kv_heads", "ffn_hidden", "vocab", "mlp", "tied_embeddings")
    assert {d: getattr(spec, d) for d in dims} == {d: getattr(preset, d) for d in dims}


def test_inline_model_mapping():
    """A scenario may give the model inline; kv_heads defaults to heads."""
    spec = load_model({"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 100}, base_dir=DATA,
                      file="test.yaml")
    assert spec.num_kv_heads == 4


def test_hidden_not_divisible_by_heads_is_an_error():
    """hidden must be a multiple of heads (head_dim is an integer)."""
    with pytest.raises(InputError, match="hidden=100 is not divisible by heads=3"):
        load_model({"layers": 2, "hidden": 100, "heads": 3, "ffn_hidden": 256, "vocab": 100}, base_dir=DATA,
                   file="test.yaml")
