"""Gemma-2 and Gemma-3 config.json files: a gated (GeGLU) MLP of three matrices, Gemma-2's alternating sliding
windows, and a warning for each feature simtrain does not model.

Rules: GemmaMLP / Gemma2MLP / Gemma3MLP have gate_proj, up_proj and down_proj (transformers modeling_gemma*.py), so
the MLP is 3 x hidden x intermediate, as SwiGLU's. Gemma2DecoderLayer windows the even layers (is_sliding = not
bool(layer_idx % 2)). Gemma-2/3 layers have four RMSNorms (input, post_attention, pre_feedforward,
post_feedforward); simtrain counts two per layer (ModelSpec.params_per_layer: "two norms"), and says so in a warning.

Published counts: Gemma 2 report (Gemma Team 2024, arXiv 2408.00118, Table 2): 9B has 917,504,000 embedding and
8,324,201,984 non-embedding parameters, 2B 590,118,912 and 2,024,517,888 (its embedding row counts 256,128
tokens, the config's vocab_size 256,000). Gemma-3-1B: 999,885,952 (huggingface.co google/gemma-3-1b-it,
safetensors total). tests/data/hf_gemma/gemma-2-9b/config.json holds google/gemma-2-9b's config.json values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DATA, REPO, json_key_line, run_cli, write_hf_config

from simtrain.spec.errors import InputError
from simtrain.spec.model_load import load_model

GEMMA2_9B = DATA / "hf_gemma" / "gemma-2-9b" / "config.json"
SCENARIO = str(REPO / "scenarios" / "pp4_dp4.yaml")


def _load(path: Path):
    return load_model(str(path), base_dir=path.parent, file="s.yaml")


def _gemma2(**changes) -> dict:
    config = json.loads(GEMMA2_9B.read_text(encoding="utf-8"))
    config.update(changes)
    return {k: v for k, v in config.items() if v is not ...}


def _gemma2_hand_count(h: int, f: int, layers: int, heads: int, kv_heads: int, head_dim: int, vocab: int,
                       norms_per_layer: int) -> int:
    """Tied embedding, per layer q, k, v, o, the GeGLU MLP (gate, up, down) and the layer's RMSNorms; final norm."""
    q = h * heads * head_dim
    kv = 2 * h * kv_heads * head_dim
    o = heads * head_dim * h
    mlp = 3 * h * f
    return vocab * h + layers * (q + kv + o + mlp + norms_per_layer * h) + h


def test_gemma2_9b_counts_its_gated_mlp():
    """Gemma-2-9B: hidden 3584, 16 heads and 8 KV heads of 256, MLP 14336, 42 layers, 256,000 tokens, tied.

    By hand: embedding 256000 x 3584 = 917,504,000; per layer q 3584 x 4096 = 14,680,064, k and v
    2 x 3584 x 2048 = 14,680,064, o 4096 x 3584 = 14,680,064, MLP 3 x 3584 x 14336 = 154,140,672, four norms
    4 x 3584 = 14,336: 198,195,200, x 42 = 8,324,198,400; final norm 3584: 9,241,705,984, the report's
    917,504,000 + 8,324,201,984. simtrain counts two norms per layer, 42 x 2 x 3584 = 301,056 fewer:
    9,241,404,928. Read without its gate (the defect: 2 x 3584 x 14336 and LayerNorms) it was 7,083,740,160.
    """
    spec = _load(GEMMA2_9B)
    published = 917_504_000 + 8_324_201_984
    assert _gemma2_hand_count(3584, 14336, 42, 16, 8, 256, 256000, norms_per_layer=4) == published == 9_241_705_984
    assert spec.params_total == _gemma2_hand_count(3584, 14336, 42, 16, 8, 256, 256000, norms_per_layer=2) \
        == published - 2 * 3584 * 42 == 9_241_404_928
    assert (spec.mlp, spec.mlp_matrices, spec.norm_kind, spec.tied_embeddings) == ("swiglu", 3, "rmsnorm", True)


def test_gemma2_2b_counts_its_gated_mlp(tmp_path):
    """Gemma-2-2B (hidden 2304, 8 heads and 4 KV heads of 256, MLP 9216, 26 layers): non-embedding 2,024,517,888
    in the report with four norms per layer; simtrain's count is 256,000 x 2304 + that, less 26 x 2 x 2304."""
    path = write_hf_config(tmp_path, _gemma2(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                    num_attention_heads=8, num_key_value_heads=4))
    assert _gemma2_hand_count(2304, 9216, 26, 8, 4, 256, 256000, 4) - 256000 * 2304 == 2_024_517_888
    assert _load(path).params_total == 256000 * 2304 + 2_024_517_888 - 26 * 2 * 2304


def test_gemma2_windows_the_even_layers():
    """sliding_window 4096 on layers 0, 2, 4, ... and full attention on the odd ones (Gemma2DecoderLayer)."""
    at = _load(GEMMA2_9B).attention
    assert (at.sliding_window, at.sliding_window_every) == (4096, 2)
    assert [at.windowed(i) for i in range(4)] == [True, False, True, False]


def test_gemma2_without_the_keys_takes_its_class_defaults(tmp_path):
    """Gemma2Config defaults: sliding_window 4096, attn_logit_softcapping 50.0, final_logit_softcapping 30.0."""
    spec = _load(write_hf_config(tmp_path, _gemma2(sliding_window=..., attn_logit_softcapping=...,
                                          final_logit_softcapping=...)))
    assert spec.attention.sliding_window == 4096
    assert [n.split(":")[0] for n in spec.unmodelled][:2] == ["attn_logit_softcapping 50", "final_logit_softcapping 30"]


def test_gemma2_with_null_window_and_caps_has_none(tmp_path):
    """null means none: no window, and no capping warning (the warning follows the config, not the family)."""
    spec = _load(write_hf_config(tmp_path, _gemma2(sliding_window=None, attn_logit_softcapping=None,
                                          final_logit_softcapping=None)))
    assert spec.attention.sliding_window is None
    assert not [n for n in spec.unmodelled if "softcapping" in n]


def test_gemma2_warns_what_simtrain_does_not_model(capsys):
    """`simtrain run` with the Gemma-2-9B config names logit softcapping (attention 50, output 30) and the two
    uncounted norms per layer (2 x 3584 x 42 = 301,056 weights). PP 2: 42 layers do not split over 4 stages."""
    code, out, err = run_cli(["run", SCENARIO, "--set", f"model={GEMMA2_9B}", "--set", "parallel.pp=2",
                              "--set", "parallel.dp=8"], capsys)
    assert code == 0, err
    assert "model gemma-2-9b (9.24 B)" in out
    warned = [line for line in out.splitlines() if line.startswith("warning: model gemma-2-9b: ")]
    assert len(warned) == 3
    assert "attn_logit_softcapping 50: the attention scores are capped" in warned[0]
    assert "final_logit_softcapping 30: the output logits are capped" in warned[1]
    assert "post_attention_layernorm and post_feedforward_layernorm" in warned[2] and "301,056 weights" in warned[2]


def test_gemma2_other_window_pattern_is_refused(tmp_path, capsys):
    """A layer_types list other than sliding-on-even-layers is not what simtrain builds: exit 2 at the key."""
    config = _gemma2(layer_types=["full_attention"] * 42)
    path = write_hf_config(tmp_path, config)
    code, _, err = run_cli(["run", SCENARIO, "--set", f"model={path}"], capsys)
    line = json_key_line(path, "layer_types")
    assert code == 2
    assert err.strip() == (f"error: {path}:{line}: layer_types: lists a pattern of sliding and full attention other "
                           "than the alternating one (sliding on even layers), which simtrain does not model")


#: google/gemma-3-1b-it config.json (model_type gemma3_text); sliding_window_pattern 6: five windowed layers of six
GEMMA3_1B = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
             "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 256, "vocab_size": 262144, "hidden_activation": "gelu_pytorch_tanh",
             "max_position_embeddings": 32768, "sliding_window": 512, "sliding_window_pattern": 6,
             "query_pre_attn_scalar": 256, "final_logit_softcapping": None, "attn_logit_softcapping": None}


def test_gemma3_1b_counts_its_gated_mlp_and_qk_norms(tmp_path):
    """Gemma-3-1B, 999,885,952 weights: embedding 262144 x 1152 = 301,989,888 (tied); per layer q 1152 x 1024
    = 1,179,648, k and v 2 x 1152 x 256 = 589,824, o 1,179,648, MLP 3 x 1152 x 6912 = 23,887,872, four norms
    4 x 1152 = 4,608, q and k norms 2 x 256 = 512: 26,842,112, x 26 = 697,894,912; final norm 1152.
    simtrain counts two norms per layer: 26 x 2 x 1152 = 59,904 fewer. Its 5-local-1-global windows warn."""
    spec = _load(write_hf_config(tmp_path, GEMMA3_1B))
    per_layer = 1152 * 1024 + 2 * 1152 * 256 + 1024 * 1152 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256
    assert 262144 * 1152 + 26 * per_layer + 1152 == 999_885_952
    assert spec.params_total == 999_885_952 - 26 * 2 * 1152
    assert spec.qk_norm and spec.attention.sliding_window is None and spec.attention_window is None
    assert any(n.startswith("sliding_window 512: Gemma-3 windows five layers of every six") for n in spec.unmodelled)


def test_gemma_hidden_activation_must_be_text(tmp_path):
    """hidden_activation is a name, like hidden_act: a number there is refused at its key."""
    with pytest.raises(InputError) as exc:
        _load(write_hf_config(tmp_path, _gemma2(hidden_activation=5)))
    assert exc.value.field == "hidden_activation" and exc.value.message.startswith("5 is not text")
