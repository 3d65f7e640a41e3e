"""Biases on the attention's four projections (``model.attention_bias``) and on the MLP's linears
(``model.mlp_bias``), as transformers builds them from a config.json's keys of those names.

transformers' LlamaAttention, Qwen3Attention and GemmaAttention build q_proj, k_proj, v_proj and o_proj with
``bias=config.attention_bias``; LlamaMLP builds gate_proj, up_proj and down_proj with ``bias=config.mlp_bias``;
Qwen3 and Gemma's MLPs, and every projection of Mistral and Phi-3, are built with ``bias=False`` whatever the config
says (modeling_llama.py, modeling_qwen3.py, modeling_gemma.py, modeling_mistral.py, modeling_phi3.py, transformers
5.25). simtrain read either key as ``bias: true``, which also counts the MLP's biases: 2 f + h too many per layer for
a Llama config with ``attention_bias: true``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import DATA, make_scenario, write_hf_config

from simtrain.decide.sweep_files import sweep_identity
from simtrain.plan.memory import local_params
from simtrain.spec.errors import InputError
from simtrain.spec.model_load import load_model

#: a small Llama config.json: hidden 256, 4 heads of 64, 2 key/value heads (k and v 128 wide), MLP 512, 2 layers
LLAMA = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 256, "intermediate_size": 512,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
         "tie_word_embeddings": False}

# By hand, without biases:
#   embedding and output layer 2 x 1000 x 256                                     = 512,000
#   one layer: q 256 x 256 = 65,536; k, v 2 x 256 x 128 = 65,536; o 256 x 256 = 65,536
#              MLP 3 x 256 x 512 = 393,216; two RMSNorms 2 x 256 = 512            = 590,336
#   2 layers 1,180,672; final norm 256; total                                     = 1,692,928
PLAIN = 1_692_928
# attention_bias: q 256 + k 128 + v 128 + o 256 = 768 a layer, 1,536 for two
ATTENTION_BIASES = 2 * (256 + 128 + 128 + 256)
# mlp_bias: gate 512 + up 512 + down 256 = 1,280 a layer, 2,560 for two
MLP_BIASES = 2 * (512 + 512 + 256)


def _load(tmp_path: Path, config: dict):
    return load_model(str(write_hf_config(tmp_path, config)), base_dir=tmp_path, file="s.yaml")


def test_hand_counts_add_up():
    layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 512 + 2 * 256
    assert layer == 590_336
    assert 2 * 1000 * 256 + 2 * layer + 256 == PLAIN
    assert (ATTENTION_BIASES, MLP_BIASES) == (1_536, 2_560)


@pytest.mark.parametrize("keys, extra", [
    ({}, 0),
    ({"attention_bias": True}, ATTENTION_BIASES),                       # was + ATTENTION_BIASES + MLP_BIASES
    ({"mlp_bias": True}, MLP_BIASES),                                   # was the same over-count
    ({"attention_bias": True, "mlp_bias": True}, ATTENTION_BIASES + MLP_BIASES),
    ({"attention_bias": False, "mlp_bias": False}, 0),
])
def test_llama_reads_its_two_bias_keys_apart(tmp_path, keys, extra):
    """attention_bias biases q, k, v and o; mlp_bias gate, up and down; neither implies the other."""
    m = _load(tmp_path, {**LLAMA, **keys})
    assert m.params_total == PLAIN + extra
    assert (m.attention_bias, m.mlp_bias, m.bias) == (bool(keys.get("attention_bias")), bool(keys.get("mlp_bias")),
                                                      False)


@pytest.mark.parametrize("model_type, keys", [
    ("mistral", {"attention_bias": True, "mlp_bias": True}),   # MistralAttention and MistralMLP: bias=False
    ("phi3", {"attention_bias": True, "mlp_bias": True}),      # Phi3: bias=False
    ("gemma", {"mlp_bias": True}),                             # GemmaMLP: bias=False
])
def test_families_that_do_not_read_the_keys_build_no_biases(tmp_path, model_type, keys):
    assert _load(tmp_path, {**LLAMA, "model_type": model_type, **keys}).params_total == PLAIN
    assert _load(tmp_path, {**LLAMA, "model_type": "qwen3", "mlp_bias": True}).params_total == \
        PLAIN + 2 * 2 * 64   # Qwen3MLP: bias=False; Qwen3's QK-norms, 2 x 64 a layer


def test_qwen3_reads_attention_bias(tmp_path):
    """Qwen3Attention: bias=config.attention_bias on q, k, v and o (it adds QK-norms of the head width, 2 x 64)."""
    plain = _load(tmp_path, {**LLAMA, "model_type": "qwen3"}).params_total
    assert plain == PLAIN + 2 * 2 * 64
    assert _load(tmp_path, {**LLAMA, "model_type": "qwen3", "attention_bias": True}).params_total == \
        plain + ATTENTION_BIASES


def test_a_bias_key_that_is_not_a_boolean_is_refused(tmp_path):
    with pytest.raises(InputError) as exc:
        _load(tmp_path, {**LLAMA, "attention_bias": "yes"})
    assert exc.value.field == "attention_bias" and exc.value.message.endswith("is not true or false")


def test_latent_attention_with_attention_bias_is_refused(tmp_path):
    """DeepSeek-V2/V3 put attention_bias on their latent down projections and o_proj, which simtrain builds
    without biases: refused at the config's key, not counted wrong (a scenario's own model with attention_bias and
    latent attention: test_qkv_bias.py, beside qkv_bias)."""
    config = json.loads((DATA / "hf_moe" / "small_mla_deepseek_v2" / "config.json").read_text(encoding="utf-8"))
    with pytest.raises(InputError) as exc:
        _load(tmp_path, {**config, "attention_bias": True})
    assert exc.value.field == "attention_bias"


def test_mlp_bias_with_experts_is_refused():
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 100, "mlp": "swiglu",
             "mlp_bias": True, "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 32}}
    with pytest.raises(InputError) as exc:
        load_model(model, base_dir=DATA, file="s.yaml")
    assert exc.value.field == "model.mlp_bias" and "mixture of experts" in exc.value.message


@pytest.mark.parametrize("tp", [1, 2])
def test_memory_splits_column_parallel_biases_and_replicates_row_parallel_ones(tmp_path, tp):
    """Per layer: q, k, v (512) and gate, up (1,024) are column-parallel, split by tp; o's and down's biases (256
    each) are row-parallel, whole on every rank. At tp 1 a GPU holds every weight."""
    training = {"seq_len": 256, "global_batch": 8}
    par = {"tp": tp, "sequence_parallel": tp > 1}
    m = _load(tmp_path, LLAMA).model_dump()

    def held(**flags):
        return local_params(make_scenario(model={**m, **flags}, training=training, parallel=par), 0)[0]

    plain = held()
    assert held(attention_bias=True) - plain == 2 * (512 // tp + 256)
    assert held(mlp_bias=True) - plain == 2 * (1024 // tp + 256)
    assert held(bias=True) - plain == 2 * ((512 + 1024) // tp + 2 * 256)
    if tp == 1:
        assert held(attention_bias=True, mlp_bias=True) == PLAIN + ATTENTION_BIASES + MLP_BIASES


def test_sweep_records_leave_false_bias_flags_out():
    """A sweep table written before these flags existed resumes: the record names them only where true."""
    scenario = make_scenario()
    record = sweep_identity(scenario, {"training.micro_batch": [1]})["model"]
    assert not {"attention_bias", "mlp_bias", "qkv_bias"} & set(record)
    biased = dataclasses.replace(scenario, model=scenario.model.model_copy(update={"attention_bias": True}))
    assert sweep_identity(biased, {"training.micro_batch": [1]})["model"]["attention_bias"] is True


@pytest.mark.parametrize("flags, row_parallel_biases", [
    ({}, 0), ({"attention_bias": True}, 256), ({"mlp_bias": True}, 256), ({"bias": True}, 2 * 256)])
def test_sequence_parallel_sums_the_row_parallel_biases_it_holds_whole(tmp_path, flags, row_parallel_biases):
    """Under sequence parallelism each TP rank holds whole, and sums over its group, the two RMSNorms (2 x 256) and
    the row-parallel biases it has: o_proj's (attention_bias) and down_proj's (mlp_bias), 256 each a layer (bias
    had both counted whatever the key, 2 x 256)."""
    from simtrain.plan.grad_finalize import replicated_grad_elements

    m = _load(tmp_path, {**LLAMA, **{k: v for k, v in flags.items() if k != "bias"}}).model_dump()
    s = make_scenario(model={**m, **flags}, training={"seq_len": 256, "global_batch": 8},
                      parallel={"tp": 2, "sequence_parallel": True})
    assert replicated_grad_elements(s.model, [0, 1], False, True) == 2 * (2 * 256 + row_parallel_biases)


def test_a_copy_with_new_sizes_counts_its_own_layer():
    """ModelSpec caches its per-layer count; a model_copy that changes a size or a bias flag counts afresh (it
    kept the original's count before). hidden 64, 4 heads, MLP 128 (GELU, 2 matrices), LayerNorm: a layer holds
    4 x 64^2 + 2 x 64 x 128 + 2 x 2 x 64 = 32,768 + 256 = 33,024; at hidden 128, 4 x 128^2 + 2 x 128 x 128 + 4 x 128
    = 98,816; attention_bias adds 4 x 128."""
    from simtrain.spec.model import ModelSpec

    m = ModelSpec(layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=100)
    assert m.params_per_layer == 33_024
    wider = m.model_copy(update={"hidden": 128})
    assert wider.params_per_layer == 98_816
    assert wider.model_copy(update={"attention_bias": True}).params_per_layer == 98_816 + 4 * 128


def test_gpt_oss_reads_attention_bias_and_refuses_false(tmp_path):
    """GptOssAttention builds q, k, v and o with bias=config.attention_bias (modeling_gpt_oss.py, transformers
    5.25; GptOssConfig's default true) and its experts always with biases: true reads as bias: true, unchanged;
    false, attention without biases beside biased experts, is refused at the key (it read as biased before,
    36 layers x (64 x 64 + 2 x 8 x 64 + 2,880) = 288,000 weights too many on gpt-oss-120b)."""
    config = json.loads((DATA / "hf_moe" / "gpt-oss-120b" / "config.json").read_text(encoding="utf-8"))
    assert config["attention_bias"] is True
    biased = _load(tmp_path, config)
    assert biased.bias and biased.qkv_bias_params + biased.out_bias_params == 64 * 64 + 2 * 8 * 64 + 2880
    for off in (False, None):       # nn.Linear(bias=None) builds no bias either
        with pytest.raises(InputError) as exc:
            _load(tmp_path, {**config, "attention_bias": off})
        assert exc.value.field == "attention_bias"
        assert "experts with biases and its attention without" in exc.value.message
