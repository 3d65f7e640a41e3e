"""The checks of a HuggingFace ``config.json`` that are not its dimensions (those go through ModelSpec's own): which
families are refused (encoders), which numbers and flags are in range and of their type, the one pattern of sliding
and full attention simtrain builds, and what a config describes that simtrain neither costs nor counts (warnings).
Split from :mod:`simtrain.spec.model_hf`, which calls them."""

from __future__ import annotations

import re
from typing import Any

from simtrain.spec.errors import InputError
from simtrain.spec.errors import file_value as json_value
from simtrain.spec.units import is_number

#: Gemma-2 and Gemma-3 layers: four RMSNorms (input, post_attention, pre_feedforward, post_feedforward; transformers
#: Gemma2DecoderLayer / Gemma3DecoderLayer); simtrain counts and times two per layer
_FOUR_NORMS = {"gemma2", "gemma3_text"}

#: encoder-only and encoder-decoder families (the model_type of their transformers configuration classes): simtrain
#: simulates decoder-only training, and their encoders (bidirectional, cross-attention) are nothing it builds
_NOT_DECODERS = {
    **dict.fromkeys(("bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "distilbert", "albert", "electra", "deberta",
                     "deberta-v2", "camembert", "mpnet", "modernbert", "megatron-bert", "big_bird", "longformer",
                     "ernie", "esm", "funnel", "mobilebert", "squeezebert", "roformer", "rembert", "convbert"),
                    "an encoder-only model"),
    **dict.fromkeys(("t5", "mt5", "umt5", "longt5", "switch_transformers", "bart", "mbart", "pegasus", "pegasus_x",
                     "marian", "m2m_100", "nllb-moe", "blenderbot", "blenderbot-small", "led", "fsmt", "prophetnet",
                     "bigbird_pegasus", "whisper", "speech_to_text", "seamless_m4t", "encoder-decoder"),
                    "an encoder-decoder model"),
}


def json_line(text: str | None, key: str | None) -> int | None:
    """Line of the first ``"key":`` in a JSON text (config.json files are flat)."""
    if not text or not key:
        return None
    m = re.search(rf'"{re.escape(key)}"\s*:', text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def refuse_encoders(config: dict[str, Any], file: str, text: str | None, known: set[str]) -> None:
    """Encoder-only and encoder-decoder configs: simtrain simulates decoder-only training."""
    model_type = config.get("model_type")
    kind = _NOT_DECODERS.get(model_type) if isinstance(model_type, str) else None
    if kind is None and config.get("is_encoder_decoder") is True:
        kind, model_type = "an encoder-decoder model", None
    if kind is not None:
        key = "model_type" if model_type is not None else "is_encoder_decoder"
        what = f"{json_value(model_type)} is" if model_type is not None else "true makes this"
        raise InputError(f"{what} {kind}, and simtrain simulates decoder-only training (allowed: a decoder-only "
                         f"model_type, such as {', '.join(sorted(known))})", file=file, line=json_line(text, key),
                         field=key)


def unmodelled(config: dict[str, Any], model_type: str, out: dict[str, Any]) -> list[str]:
    """What a config describes that simtrain neither costs nor counts, one phrase each (warnings, not errors)."""
    notes = []
    for key, what in (("attn_logit_softcapping", "the attention scores"),
                      ("final_logit_softcapping", "the output logits")):
        if config.get(key) is not None:
            notes.append(f"{key} {config[key]:g}: {what} are capped (c x tanh(x / c), as in Gemma-2), which simtrain "
                         "does not cost")
    if model_type in _FOUR_NORMS and is_number(out.get("hidden")) and is_number(out.get("layers")):
        extra = 2 * out["hidden"] * out["layers"]
        notes.append(f"post_attention_layernorm and post_feedforward_layernorm: two more RMSNorms per layer (four in "
                     f"all) are neither counted ({extra:,.0f} weights) nor timed; simtrain builds two per layer")
    return notes


def check_alternating(config: dict[str, Any], out: dict[str, Any], file: str, text: str | None) -> None:
    """A ``layer_types`` list must be the alternation simtrain builds: sliding on the even layers, full on the odd."""
    layer_types = config.get("layer_types")
    alternate = [("sliding_attention" if i % 2 == 0 else "full_attention") for i in range(out["layers"])] \
        if isinstance(out.get("layers"), int) else None
    if layer_types is not None and layer_types != alternate:
        raise InputError("lists a pattern of sliding and full attention other than the alternating one "
                         "(sliding on even layers), which simtrain does not model", file=file,
                         line=json_line(text, "layer_types"), field="layer_types")


#: the numbers the reader takes besides model_hf's _HF_KEYS (those go through ModelSpec's own checks): key -> (least
#: value, null allowed, what the number is); the MoE keys only in the families that read them
_COUNTS: dict[str, tuple[int, bool, str]] = {
    "sliding_window": (1, True, "the tokens a sliding-window layer attends to; null for none"),
    "max_position_embeddings": (1, False, "the longest sequence the model was built for"),
    "n_positions": (1, False, "the rows of GPT-2's learned position table"),
}
_MOE_COUNTS: dict[str, tuple[int, bool, str]] = {
    "num_local_experts": (1, True, "routed experts per layer"),
    "num_experts": (1, True, "routed experts per layer"),
    "n_routed_experts": (1, True, "routed experts per layer"),
    "num_experts_per_tok": (1, True, "the experts each token is routed to"),
    "moe_intermediate_size": (1, True, "the inner width of one expert"),
    "shared_expert_intermediate_size": (0, True, "the inner width of the shared expert; 0 for none"),
    "n_shared_experts": (0, True, "always-active experts per layer"),
    "first_k_dense_replace": (0, True, "leading layers with a dense MLP"),
    "num_nextn_predict_layers": (0, True, "multi-token-prediction modules"),
    "n_group": (1, True, "expert groups"),
    "topk_group": (1, True, "the expert groups each token may use"),
    "kv_lora_rank": (1, True, "the key/value latent width"),
    "q_lora_rank": (1, True, "the query latent width; null for none"),
    "qk_nope_head_dim": (1, True, "the per-head query/key width without RoPE"),
    "qk_rope_head_dim": (1, True, "the per-head RoPE width"),
    "v_head_dim": (1, True, "the per-head value width"),
}
#: booleans the reader takes besides tie_word_embeddings
_FLAGS = ("attention_bias", "mlp_bias", "use_sliding_window", "is_encoder_decoder")
#: families whose transformers classes ignore attention_bias / mlp_bias, their projections built with hard-wired
#: biases or none (modeling_mistral.py, modeling_phi3.py, modeling_qwen2.py, modeling_qwen3.py, modeling_gemma*.py...);
#: GPT-OSS reads attention_bias, and model_hf's MoE fields read it there (bias: true, or refused when false)
NO_ATTENTION_BIAS_KEY = frozenset({"gpt2", "mistral", "mixtral", "phi3", "qwen2", "qwen2_moe", "gpt_oss"})
NO_MLP_BIAS_KEY = NO_ATTENTION_BIAS_KEY | {"qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "deepseek_v3"}
#: booleans the reader takes from a mixture-of-experts family's config only (Qwen2MoeConfig's qkv_bias)
_MOE_FLAGS = ("qkv_bias",)
#: numbers the reader only warns about: positive, or null for none
_CAPS = ("attn_logit_softcapping", "final_logit_softcapping")


def check_values(config: dict[str, Any], moe: bool, file: str, text: str | None) -> None:
    """Each number and boolean the reader takes outside model_hf's _HF_KEYS, in range and of its type; else the key
    is named."""
    counts = {**_COUNTS, **(_MOE_COUNTS if moe else {})}
    flags = _FLAGS + (_MOE_FLAGS if moe else ())
    for key, value in config.items():
        problem = None
        if key in counts:
            least, nullable, what = counts[key]
            if value is None and nullable:
                continue
            if not is_number(value) or value != int(value) or value < least:
                kind = "a positive whole number" if least == 1 else "a whole number >= 0"
                problem = f"{json_value(value)} is not {kind}{' or null' if nullable else ''} ({what})"
        elif key in flags and value is not None and not isinstance(value, bool):
            problem = f"{json_value(value)} is not true or false"
        elif key in _CAPS and value is not None and (not is_number(value) or value <= 0):
            problem = f"{json_value(value)} is not a positive number or null (the cap c of c x tanh(x / c))"
        if problem:
            raise InputError(problem, file=file, line=json_line(text, key), field=key)
