"""Numbers and booleans a config.json reader takes outside the dimensions: a value out of range or of the wrong type
is refused (exit 2, one sentence naming the file, the line, the key, the value and what is allowed), never skipped.

Rules: sliding_window is a positive whole number or null (transformers' MistralConfig / Qwen2Config / Gemma2Config:
null for no window); max_position_embeddings and n_positions are positive whole numbers; the expert, latent and MTP
counts of the MoE families are whole numbers, positive where a zero means nothing (experts, top-k, widths), 0 or more
where 0 means none (shared experts, leading dense layers, MTP modules); attention_bias, mlp_bias, use_sliding_window
are true or false. Before, -5, "big" and 4096.5 windows and -1 positions were skipped or truncated, an expert count
of -2 made a dense model and first_k_dense_replace "x" ended in a traceback.
"""

from __future__ import annotations

import json

import pytest
from conftest import DATA, REPO, json_key_line, run_cli, write_hf_config

from simtrain.spec.errors import InputError
from simtrain.spec.model_load import load_model

SCENARIO = str(REPO / "scenarios" / "pp4_dp4.yaml")
WINDOW = "(the tokens a sliding-window layer attends to; null for none)"
POSITIONS = "(the longest sequence the model was built for)"


def _config(folder: str, **changes) -> dict:
    config = json.loads((DATA / folder / "config.json").read_text(encoding="utf-8"))
    config.update(changes)
    return config


@pytest.mark.parametrize(("key", "value", "says"), [
    ("sliding_window", -5, f"-5 is not a positive whole number or null {WINDOW}"),
    ("sliding_window", "big", f"'big' is not a positive whole number or null {WINDOW}"),
    ("sliding_window", 0, f"0 is not a positive whole number or null {WINDOW}"),
    ("sliding_window", 4096.5, f"4096.5 is not a positive whole number or null {WINDOW}"),
    ("sliding_window", True, f"true is not a positive whole number or null {WINDOW}"),
    ("max_position_embeddings", -1, f"-1 is not a positive whole number {POSITIONS}"),
    ("max_position_embeddings", 0, f"0 is not a positive whole number {POSITIONS}"),
    ("max_position_embeddings", None, f"null is not a positive whole number {POSITIONS}"),
    ("max_position_embeddings", "4k", f"'4k' is not a positive whole number {POSITIONS}"),
    ("attention_bias", "false", "'false' is not true or false"),
    ("mlp_bias", 1, "1 is not true or false"),
    ("use_sliding_window", "yes", "'yes' is not true or false"),
])
def test_bad_value_is_exit_2_at_its_key(tmp_path, capsys, key, value, says):
    """`simtrain run scenarios/pp4_dp4.yaml --set model=config.json` with one bad value in Llama-2-7b's config."""
    path = write_hf_config(tmp_path, _config("core_hf_llama-2-7b", **{key: value}))
    code, out, err = run_cli(["run", SCENARIO, "--set", f"model={path}"], capsys)
    assert (code, out) == (2, "")
    assert err == f"error: {path}:{json_key_line(path, key)}: {key}: {says}\n"


@pytest.mark.parametrize(("folder", "key", "value", "says"), [
    ("hf_moe/gpt-oss-120b", "sliding_window", -5, f"-5 is not a positive whole number or null {WINDOW}"),
    ("hf_moe/gpt-oss-120b", "num_local_experts", -2, "-2 is not a positive whole number or null (routed experts "
                                                      "per layer)"),
    ("hf_moe/gpt-oss-120b", "num_experts_per_tok", 0, "0 is not a positive whole number or null (the experts each "
                                                      "token is routed to)"),
    ("hf_moe/deepseek-v3", "first_k_dense_replace", "x", "'x' is not a whole number >= 0 or null (leading layers "
                                                         "with a dense MLP)"),
    ("hf_moe/deepseek-v3", "n_shared_experts", -1, "-1 is not a whole number >= 0 or null (always-active experts "
                                                   "per layer)"),
    ("hf_moe/deepseek-v3", "num_nextn_predict_layers", True, "true is not a whole number >= 0 or null "
                                                             "(multi-token-prediction modules)"),
    ("hf_moe/deepseek-v3", "kv_lora_rank", -1, "-1 is not a positive whole number or null (the key/value latent "
                                               "width)"),
    ("hf_moe/deepseek-v3", "max_position_embeddings", -1, f"-1 is not a positive whole number {POSITIONS}"),
])
def test_moe_family_values_are_checked_too(tmp_path, folder, key, value, says):
    """The Python loader raises InputError at the key and its line (the CLI turns it into exit 2)."""
    path = write_hf_config(tmp_path, _config(folder, **{key: value}))
    with pytest.raises(InputError) as exc:
        load_model(str(path), base_dir=tmp_path, file="s.yaml")
    assert (exc.value.field, exc.value.line, exc.value.message) == (key, json_key_line(path, key), says)


def test_gpt2_positions_are_checked(tmp_path):
    """n_positions -3 in a GPT-2 config (GPT2Config: the learned table's rows) is refused, not ignored."""
    config = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
              "n_positions": -3}
    path = write_hf_config(tmp_path, config)
    with pytest.raises(InputError) as exc:
        load_model(str(path), base_dir=tmp_path, file="s.yaml")
    assert (exc.value.field, exc.value.line) == ("n_positions", json_key_line(path, "n_positions"))
    assert exc.value.message == "-3 is not a positive whole number (the rows of GPT-2's learned position table)"


def test_a_window_too_large_names_the_hf_key(tmp_path):
    """A whole number beyond simtrain's bounds is refused by the schema, under the config's own key and line."""
    path = write_hf_config(tmp_path, _config("core_hf_llama-2-7b", sliding_window=1e30))
    with pytest.raises(InputError) as exc:
        load_model(str(path), base_dir=tmp_path, file="s.yaml")
    assert (exc.value.field, exc.value.line) == ("sliding_window", json_key_line(path, "sliding_window"))
    assert "outside the range simtrain accepts" in exc.value.message


@pytest.mark.parametrize(("changes", "window", "positions"), [
    ({"sliding_window": None}, None, 4096),                  # Mistral-7B-v0.2 style: no window
    ({"sliding_window": 4096.0, "max_position_embeddings": 32768.0}, 4096, 32768),   # whole numbers written as floats
    ({"use_sliding_window": False, "model_type": "qwen2", "sliding_window": 4096}, None, 4096),
])
def test_good_values_still_load(tmp_path, changes, window, positions):
    """Allowed values keep loading: null windows, whole floats, a Qwen2 window switched off."""
    spec = load_model(str(write_hf_config(tmp_path, _config("core_hf_llama-2-7b", **changes))), base_dir=tmp_path,
                      file="s.yaml")
    assert (spec.attention_window, spec.max_positions) == (window, positions)
