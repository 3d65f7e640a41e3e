"""Biases on the query, key and value projections only (``model.qkv_bias``): Qwen2 and Qwen2-MoE.

transformers' Qwen2Attention builds q_proj, k_proj and v_proj with ``bias=True`` and o_proj with ``bias=False``,
hard-wired (modeling_qwen2.py; Qwen2Config has no key for it); Qwen2MoeAttention the same, ``bias=config.qkv_bias``
in the versions whose Qwen2MoeConfig has that key (default True). The MLPs have no biases. Qwen3 has none (QK-norm
instead). The counts below are by hand from the released config.json files (Qwen/Qwen2-0.5B, Qwen/Qwen2.5-7B) and
agree with the model cards' rounded figures: Qwen2(.5)-0.5B 0.49B (0.36B non-embedding), Qwen2.5-7B 7.61B (6.53B
non-embedding).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DATA, make_scenario, write_hf_config

from simtrain.plan.memory import local_params, stage_memory
from simtrain.spec.errors import InputError
from simtrain.spec.model import ModelSpec
from simtrain.spec.model_load import load_model

#: Qwen/Qwen2-0.5B config.json (the keys simtrain reads)
QWEN2_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "sliding_window": 131072, "use_sliding_window": False, "attention_dropout": 0.0,
}
#: Qwen/Qwen2.5-7B config.json (the keys simtrain reads)
QWEN2_5_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "vocab_size": 152064, "tie_word_embeddings": False, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
    "sliding_window": 131072, "use_sliding_window": False, "attention_dropout": 0.0,
}

# Qwen2-0.5B: head width 896 / 14 = 64, so k and v are 2 x 64 = 128 wide.
#   embedding (tied with the output layer)   151936 x 896                          = 136,134,656
#   one layer: q   896 x 896 + 896 (bias)                                         =     803,712
#              k   896 x 128 + 128 (bias)                                         =     114,816
#              v   896 x 128 + 128 (bias)                                         =     114,816
#              o   896 x 896 (no bias)                                            =     802,816
#              MLP 3 x 896 x 4864 (gate, up, down; no biases)                     =  13,074,432
#              two RMSNorms 2 x 896                                               =       1,792
#              layer total                                                        =  14,912,384
#   24 layers                                                                     = 357,897,216
#   final norm                                                                    =         896
#   total: 136,134,656 + 357,897,216 + 896                                        = 494,032,768
# The q, k, v biases are 24 x (896 + 128 + 128) = 27,648 of them, what simtrain missed before qkv_bias.
QWEN2_0_5B_PARAMS = 494_032_768
QWEN2_0_5B_QKV_BIASES = 24 * (896 + 2 * 128)

# Qwen2.5-7B: head width 3584 / 28 = 128, k and v 4 x 128 = 512 wide; untied embeddings.
#   embedding 152064 x 3584 = 544,997,376, and the output layer as much             = 1,089,994,752
#   one layer: q   3584 x 3584 + 3584                                             =    12,848,640
#              k   3584 x 512 + 512                                               =     1,835,520
#              v   3584 x 512 + 512                                               =     1,835,520
#              o   3584 x 3584                                                    =    12,845,056
#              MLP 3 x 3584 x 18944                                               =   203,685,888
#              two RMSNorms 2 x 3584                                              =         7,168
#              layer total                                                        =   233,057,792
#   28 layers                                                                     = 6,525,618,176
#   final norm                                                                    =         3,584
#   total: 1,089,994,752 + 6,525,618,176 + 3,584                                  = 7,615,616,512
# (Qwen2-7B has the same dimensions, so the same count.)
QWEN2_5_7B_PARAMS = 7_615_616_512


def _load(tmp_path: Path, config: dict):
    return load_model(str(write_hf_config(tmp_path, config)), base_dir=tmp_path, file="s.yaml")


def test_hand_counts_add_up():
    """The sums in the comments above, term by term."""
    layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    assert layer == 14_912_384
    assert 151936 * 896 + 24 * layer + 896 == QWEN2_0_5B_PARAMS
    layer = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    assert layer == 233_057_792
    assert 2 * 152064 * 3584 + 28 * layer + 3584 == QWEN2_5_7B_PARAMS


def test_qwen2_0_5b_config_gives_its_published_count(tmp_path):
    """Qwen/Qwen2-0.5B's config.json reads as 494,032,768 weights, its q, k and v biases included."""
    m = _load(tmp_path, QWEN2_0_5B)
    assert m.qkv_bias and not m.bias
    assert m.params_total == QWEN2_0_5B_PARAMS
    assert ModelSpec(**{**m.model_dump(), "qkv_bias": False}).params_total == QWEN2_0_5B_PARAMS - QWEN2_0_5B_QKV_BIASES


def test_qwen2_5_7b_config_gives_its_hand_count(tmp_path):
    """Qwen/Qwen2.5-7B's config.json (untied) reads as 7,615,616,512 weights."""
    m = _load(tmp_path, QWEN2_5_7B)
    assert m.qkv_bias and not m.bias and not m.tied_embeddings
    assert m.params_total == QWEN2_5_7B_PARAMS


def test_qwen2_moe_reads_qkv_bias(tmp_path):
    """Qwen2-MoE: biases on q, k, v by default (hard-wired, or Qwen2MoeConfig's qkv_bias: true); qkv_bias false in
    its config.json drops them; a value that is not a boolean is refused at its key."""
    config = json.loads((DATA / "hf_moe" / "small_moe_qwen2" / "config.json").read_text(encoding="utf-8"))
    with_bias = _load(tmp_path, config)
    assert with_bias.qkv_bias and not with_bias.bias
    without = _load(tmp_path, {**config, "qkv_bias": False})
    assert not without.qkv_bias
    assert with_bias.params_total - without.params_total == 4 * (64 + 2 * 64)    # 4 layers, q 64, k 64, v 64 wide
    assert _load(tmp_path, {**config, "qkv_bias": True}).params_total == with_bias.params_total
    with pytest.raises(InputError) as exc:
        _load(tmp_path, {**config, "qkv_bias": "yes"})
    assert exc.value.field == "qkv_bias" and exc.value.message.endswith("is not true or false")


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen3"])
def test_other_families_have_no_qkv_bias(tmp_path, model_type):
    """Llama, Mistral and Qwen3 read the same dimensions without q, k, v biases (Qwen3 has QK-norm instead)."""
    m = _load(tmp_path, {**QWEN2_0_5B, "model_type": model_type})
    assert not m.qkv_bias


def test_explicit_model_takes_qkv_bias():
    """A scenario's inline model accepts qkv_bias: q_width + 2 kv_width more weights per layer, no output bias;
    with bias: true it adds nothing more (bias already has them)."""
    base = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 2, "ffn_hidden": 512, "vocab": 1000,
            "mlp": "swiglu"}
    plain = make_scenario(model=base).model
    qkv = make_scenario(model={**base, "qkv_bias": True}).model
    assert qkv.qkv_bias
    assert qkv.params_total - plain.params_total == 4 * (256 + 2 * 64)
    both = make_scenario(model={**base, "qkv_bias": True, "bias": True}).model
    assert both.params_total == make_scenario(model={**base, "bias": True}).model.params_total


@pytest.mark.parametrize("key", ["qkv_bias", "attention_bias"])
def test_qkv_bias_with_latent_attention_is_refused(key):
    """Multi-head latent attention has no q, k, v (or o) projections of its own to bias: qkv_bias and
    attention_bias (test_attention_bias.py) are refused, naming the key."""
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 100, key: True,
             "attention": {"kind": "mla", "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                           "v_head_dim": 16}}
    with pytest.raises(InputError) as exc:
        load_model(model, base_dir=DATA, file="s.yaml")
    assert exc.value.field == f"model.{key}" and "latent attention" in exc.value.message


@pytest.mark.parametrize("tp", [1, 2])
def test_memory_holds_the_qkv_biases(tmp_path, tp):
    """The weights, gradients and optimizer state one GPU holds grow by its share of the q, k, v biases
    (column-parallel: split by tp); at tp 1, pp 1 it holds every weight of the model."""
    m = _load(tmp_path, QWEN2_0_5B)
    training = {"seq_len": 1024, "global_batch": 8}
    with_bias = make_scenario(model=m.model_dump(), training=training, parallel={"tp": tp})
    without = make_scenario(model={**m.model_dump(), "qkv_bias": False}, training=training, parallel={"tp": tp})
    n_with, n_without = local_params(with_bias, 0)[0], local_params(without, 0)[0]
    assert n_with - n_without == QWEN2_0_5B_QKV_BIASES // tp
    if tp == 1:
        assert n_with == QWEN2_0_5B_PARAMS
    a, b = stage_memory(with_bias, 0), stage_memory(without, 0)
    for part in ("params", "grads", "optimizer"):
        per_param = getattr(b, part) / n_without
        assert getattr(a, part) == pytest.approx(getattr(b, part) + per_param * QWEN2_0_5B_QKV_BIASES // tp)


def test_qwen2_moe_qkv_bias_null_builds_none(tmp_path):
    """Qwen2MoeAttention passes config.qkv_bias to nn.Linear's bias: null builds no bias, as false does (the review
    found null read as true)."""
    config = json.loads((DATA / "hf_moe" / "small_moe_qwen2" / "config.json").read_text(encoding="utf-8"))
    assert not _load(tmp_path, {**config, "qkv_bias": None}).qkv_bias


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_moe_memory_splits_the_qkv_biases_by_tp(tmp_path, tp):
    """In an MoE layer too the q, k, v biases are column-parallel: one GPU holds 1/tp of the small Qwen2-MoE
    fixture's 4 x (64 + 2 x 64) = 768 (the review found 768 at every tp)."""
    config = json.loads((DATA / "hf_moe" / "small_moe_qwen2" / "config.json").read_text(encoding="utf-8"))
    with_bias = _load(tmp_path, config)
    training = {"seq_len": 256, "global_batch": 8}
    n = [local_params(make_scenario(model={**with_bias.model_dump(), "qkv_bias": q}, training=training,
                                    parallel={"tp": tp, "sequence_parallel": tp > 1}), 0)[0] for q in (True, False)]
    assert n[0] - n[1] == 768 // tp
