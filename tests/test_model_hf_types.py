"""A config.json's model_type: the families simtrain reads load quietly, another decoder loads with a warning that
names it, and an encoder-only or encoder-decoder model is refused (exit 2), since simtrain simulates decoder-only
training.

Configs: Llama-2-7b as released (tests/data/core_hf_llama-2-7b, 6,738,415,616 weights, the safetensors index's
total_size / 2); bert-base-uncased and t5-small config.json values (huggingface.co google-bert/bert-base-uncased,
google-t5/t5-small).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DATA, REPO, json_key_line, make_scenario, run_cli, write_hf_config

from simtrain.spec.errors import InputError
from simtrain.spec.model_load import load_model

LLAMA2_7B = 6_738_415_616
SCENARIO = str(REPO / "scenarios" / "pp4_dp4.yaml")

BERT_BASE = {"architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
             "hidden_dropout_prob": 0.1, "hidden_size": 768, "intermediate_size": 3072,
             "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
             "num_hidden_layers": 12, "type_vocab_size": 2, "vocab_size": 30522}
T5_SMALL = {"architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 512,
            "is_encoder_decoder": True, "model_type": "t5", "num_decoder_layers": 6, "num_heads": 8,
            "num_layers": 6, "vocab_size": 32128}


def _llama(**changes) -> dict:
    config = json.loads((DATA / "core_hf_llama-2-7b" / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    return {k: v for k, v in config.items() if v is not ...}


def _type_warnings(path: Path) -> list[str]:
    sc = make_scenario(model=str(path), training={"seq_len": 4096, "global_batch": 1})
    return [w for w in sc.warnings if "decoder-only transformer" in w]


def test_a_known_family_loads_without_the_warning(tmp_path):
    """model_type llama is read as LlamaForCausalLM builds it: no warning."""
    path = write_hf_config(tmp_path, _llama())
    assert _type_warnings(path) == [] and load_model(str(path), base_dir=tmp_path, file="s.yaml").unmodelled == ()


def test_phi3_is_known_and_read_to_its_count(tmp_path):
    """Phi-3-mini (microsoft/Phi-3-mini-4k-instruct config.json; Phi3MLP's fused gate_up is 2 x 8192 wide):
    3,821,079,552 weights (safetensors total). By hand: per layer attention 4 x 3072 x 3072 = 37,748,736,
    MLP 3 x 3072 x 8192 = 75,497,472, two norms 6,144: 113,252,352, x 32 = 3,624,075,264; embedding and untied
    head 2 x 32064 x 3072 = 197,001,216; final norm 3072. No warning: phi3 is a family the reader knows."""
    config = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu", "hidden_size": 3072,
              "intermediate_size": 8192, "max_position_embeddings": 4096, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 32, "sliding_window": 2047,
              "tie_word_embeddings": False, "vocab_size": 32064}
    path = write_hf_config(tmp_path, config)
    assert 32 * (4 * 3072 * 3072 + 3 * 3072 * 8192 + 2 * 3072) + 2 * 32064 * 3072 + 3072 == 3_821_079_552
    assert load_model(str(path), base_dir=tmp_path, file="s.yaml").params_total == 3_821_079_552
    assert _type_warnings(path) == []


@pytest.mark.parametrize(("model_type", "named"), [("olmo", "model_type 'olmo' is not"),
                                                   (..., "no model_type names")])
def test_an_unknown_decoder_is_read_with_a_warning(tmp_path, model_type, named):
    """Another model_type (OLMo: its LayerNorms have no weights, which simtrain would count) or none at all is read as
    the dense decoder its keys describe, and the warning names it and the count to check (Llama-2-7b's keys:
    6,738,415,616)."""
    path = write_hf_config(tmp_path, _llama(model_type=model_type))
    warned = _type_warnings(path)
    assert len(warned) == 1
    assert warned[0].startswith(f"model m: {named} a family simtrain reads as its transformers class does (")
    assert warned[0].endswith("read as a dense decoder-only transformer of 6,738,415,616 parameters; check the "
                              "parameter count")
    assert load_model(str(path), base_dir=tmp_path, file="s.yaml").params_total == LLAMA2_7B


def test_an_unknown_decoder_warns_in_the_run_report(tmp_path, capsys):
    """`simtrain run ... --set model=config.json` prints the warning (exit 0)."""
    path = write_hf_config(tmp_path, _llama(model_type="olmo"))
    code, out, err = run_cli(["run", SCENARIO, "--set", f"model={path}"], capsys)
    assert code == 0, err
    assert "warning: model m: model_type 'olmo' is not a family simtrain reads" in out


@pytest.mark.parametrize(("config", "kind"), [(BERT_BASE, "an encoder-only model"),
                                              (T5_SMALL, "an encoder-decoder model"),
                                              ({**BERT_BASE, "model_type": "whisper"}, "an encoder-decoder model")])
def test_encoders_are_refused(tmp_path, capsys, config, kind):
    """BERT (encoder-only), T5 and Whisper (encoder-decoder): exit 2 at model_type, naming what is allowed."""
    path = write_hf_config(tmp_path, config)
    code, out, err = run_cli(["run", SCENARIO, "--set", f"model={path}"], capsys)
    assert code == 2 and out == ""
    line = json_key_line(path, "model_type")
    prefix = f"error: {path}:{line}: model_type: '{config['model_type']}' is {kind}, and " \
             "simtrain simulates decoder-only training (allowed: a decoder-only model_type, such as deepseek, "
    assert err.startswith(prefix) and err.count("\n") == 1 and "llama" in err


def test_is_encoder_decoder_is_refused_whatever_the_type(tmp_path):
    """is_encoder_decoder: true in a config of a type simtrain does not list (the Python loader raises)."""
    path = write_hf_config(tmp_path, {**T5_SMALL, "model_type": "my_seq2seq"})
    with pytest.raises(InputError) as exc:
        load_model(str(path), base_dir=tmp_path, file="s.yaml")
    assert (exc.value.field, exc.value.line) == ("is_encoder_decoder", json_key_line(path, "is_encoder_decoder"))
    assert exc.value.message.startswith("true makes this an encoder-decoder model, and simtrain simulates "
                                        "decoder-only training")


def test_a_long_model_type_is_quoted_short_in_its_warning(tmp_path):
    """A model_type of a million characters is quoted cut to a few dozen (errors.short_repr), so the warning stays a
    line, as every message does (it printed a 1,000,338-character warning; found by review)."""
    path = write_hf_config(tmp_path, _llama(model_type="x" * 1_000_000))
    warned = _type_warnings(path)
    assert len(warned) == 1 and len(warned[0]) < 600 and "'xxxx" in warned[0], warned[0][:200]
