"""HuggingFace ``config.json`` files as :class:`~simtrain.spec.model.ModelSpec`: Llama, Mistral, Qwen2, Qwen3,
Phi-3, Gemma (1-3), GPT-2 style dense models, and the mixture-of-experts families Mixtral, Qwen2-MoE, Qwen3-MoE,
DeepSeek (V1-V3) and GPT-OSS. Another decoder's model_type is read as a dense decoder-only transformer with a warning;
encoder-only and encoder-decoder models are refused.

Field names and class defaults are transformers' configuration classes (configuration_mixtral.py,
configuration_qwen2_moe.py, configuration_qwen3_moe.py, configuration_deepseek_v2.py / _v3.py,
configuration_gpt_oss.py; the table in /work/research/moe.md section 7). A key missing from a config.json takes
its class default. A config that describes a block simtrain does not build is refused, naming the key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from simtrain.spec.errors import InputError
from simtrain.spec.errors import file_value as json_value
from simtrain.spec.model import ModelSpec
from simtrain.spec.model_hf_checks import (
    NO_ATTENTION_BIAS_KEY,
    NO_MLP_BIAS_KEY,
    check_alternating,
    check_values,
    json_line,
    refuse_encoders,
    unmodelled,
)
from simtrain.spec.schema import validate
from simtrain.spec.units import is_number
from simtrain.spec.yamlio import read_text

_HF_KEYS = {
    "num_hidden_layers": "layers", "n_layer": "layers", "num_layers": "layers",
    "hidden_size": "hidden", "n_embd": "hidden", "d_model": "hidden",
    "num_attention_heads": "heads", "n_head": "heads",
    "num_key_value_heads": "kv_heads",
    "intermediate_size": "ffn_hidden", "n_inner": "ffn_hidden", "ffn_hidden_size": "ffn_hidden",
    "vocab_size": "vocab",
    "tie_word_embeddings": "tied_embeddings",
}

#: model_type -> (experts key, class default experts, top-k default, expert width key or None = intermediate_size)
_MOE_FAMILIES = {
    "mixtral": ("num_local_experts", 8, 2, None),
    "qwen2_moe": ("num_experts", 60, 4, "moe_intermediate_size"),
    "qwen3_moe": ("num_experts", 128, 8, "moe_intermediate_size"),
    "deepseek": ("n_routed_experts", None, None, "moe_intermediate_size"),
    "deepseek_v2": ("n_routed_experts", 64, None, "moe_intermediate_size"),
    "deepseek_v3": ("n_routed_experts", 256, 8, "moe_intermediate_size"),
    "gpt_oss": ("num_local_experts", 128, 4, None),
}

#: families whose MLP is gated, 3 matrices (gate, up, down): LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP, Phi3MLP (gate_up
#: fused, 2 f x h), and GemmaMLP / Gemma2MLP / Gemma3MLP (gate_proj, up_proj, down_proj with gelu_pytorch_tanh: GeGLU,
#: the same matrices as SwiGLU) in transformers' modeling_*.py
_GATED = {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", *_MOE_FAMILIES}

#: the model types this reader builds as their transformers classes do (counts checked against published totals or
#: hand counts in tests/test_hf_config.py, test_moe_models.py, test_model_hf_gemma.py); any other decoder is read as
#: the dense decoder its keys describe, with a warning
_KNOWN = {"gpt2", *_GATED}

#: class defaults of the keys Gemma adds (transformers Gemma2Config: sliding_window 4096, attn_logit_softcapping
#: 50.0, final_logit_softcapping 30.0; Gemma3TextConfig: sliding_window 4096, no capping)
_GEMMA_DEFAULTS = {
    "gemma2": {"sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma3_text": {"sliding_window": 4096},
}

#: a config's dropout probabilities (transformers: LlamaConfig/MistralConfig/Qwen2Config attention_dropout,
#: GPT2Config resid_pdrop/embd_pdrop/attn_pdrop, BertConfig-style hidden_dropout_prob...)
_HF_DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                    "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout")
#: families that train without dropout when their config states no probability: Meta's Llama reference code
#: (meta-llama/llama model.py) has no dropout layer, and transformers' LlamaConfig, MistralConfig, MixtralConfig,
#: Qwen2Config, Qwen3Config and DeepseekV3Config default attention_dropout to 0.0
_NO_DROPOUT_FAMILIES = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v2",
                        "deepseek_v3"}


def hf_dropout(config: dict[str, Any]) -> bool | None:
    """Whether a HuggingFace config's model trains with dropout: from its dropout probabilities when it states any
    (any above 0), else False for the families in :data:`_NO_DROPOUT_FAMILIES`, else unknown (None)."""
    stated = [config[k] for k in _HF_DROPOUT_KEYS if is_number(config.get(k)) and not isinstance(config.get(k), bool)]
    if stated:
        return any(p > 0 for p in stated)
    return False if config.get("model_type") in _NO_DROPOUT_FAMILIES else None


def from_hf_config(config: dict[str, Any], *, file: str, name: str | None = None, text: str | None = None) -> ModelSpec:
    """Map a HuggingFace ``config.json`` to a ModelSpec.

    Errors name the config's own key (``num_attention_heads``) and, given the file ``text``, its line.
    A config that describes a block simtrain does not build (DBRX's fused experts, a parallel block,
    experts in a family whose routing keys simtrain does not read) is refused rather than read as the
    nearest model it does build.
    """
    for key in ("model_type", "hidden_act", "hidden_activation", "activation_function", "_name_or_path"):  # text
        if config.get(key) is not None and not isinstance(config[key], str):
            raise InputError(f"{json_value(config[key])} is not text (a name, e.g. \"llama\")", file=file,
                             line=json_line(text, key), field=key)
    refuse_encoders(config, file, text, _KNOWN)
    # multi_query last: in a Falcon config the parallel block is the news, not the missing mapping
    for key, message in sorted(_unsupported(config), key=lambda problem: problem[0] == "multi_query"):
        raise InputError(message, file=file, line=json_line(text, key.rsplit(".", 1)[-1]), field=key)
    model_type = str(config.get("model_type"))
    check_values(config, model_type in _MOE_FAMILIES, file, text)
    config = {**_GEMMA_DEFAULTS.get(model_type, {}), **config}      # a key left out takes its class default
    notes: list[str] = []
    out: dict[str, Any] = {"name": name or config.get("_name_or_path") or config.get("model_type", "hf-model")}
    source: dict[str, str] = {}
    for key, ours in _HF_KEYS.items():
        if key in config and config[key] is not None and ours not in out:
            value = config[key]
            # transformers writes these as JSON numbers and booleans; text here is a hand edit gone wrong
            wanted = "true or false" if ours == "tied_embeddings" else "a whole number"
            if isinstance(value, str) or (ours == "tied_embeddings" and not isinstance(value, bool)):
                raise InputError(f"{json_value(value)} is not {wanted} (HuggingFace key for simtrain's '{ours}')",
                                 file=file, line=json_line(text, key), field=key)
            out[ours] = value
            source[ours] = key
    # Gemma-2/3 name the MLP's activation hidden_activation (GemmaConfig: hidden_activation over hidden_act)
    act = str(config.get("hidden_activation") or config.get("hidden_act") or config.get("activation_function")
              or "gelu")
    gated = model_type in _GATED or act == "silu"
    out["mlp"] = "swiglu" if gated else "gelu"
    if "ffn_hidden" not in out and "hidden" in out:
        if gated:   # each config class has its own default width, tied to its own default hidden size
            raise InputError(f"is required but missing: a gated ({act}) MLP has no standard width "
                             "(LlamaConfig's default 11008 goes with its hidden_size 4096; "
                             "4 x hidden_size is GPT-2's)",
                             file=file, line=None, field="intermediate_size")
        out["ffn_hidden"] = 4 * out["hidden"]          # GPT2Config: n_inner None means 4 x n_embd
        source["ffn_hidden"] = source.get("hidden", "hidden_size")
    if model_type in {"gpt2"}:
        out["bias"] = True
        out["position_embeddings"] = config.get("n_positions", 0)
        source["position_embeddings"] = "n_positions"
    # attention_bias: q, k, v and o_proj biased (LlamaAttention, Qwen3, Gemma 1-3; DeepSeek's latent projections,
    # which simtrain refuses); mlp_bias: gate, up, down biased (LlamaMLP, DeepseekV2MLP); the other families read
    # neither key (transformers modeling_*.py)
    if config.get("attention_bias") and model_type not in NO_ATTENTION_BIAS_KEY:
        out["attention_bias"] = True
    if config.get("mlp_bias") and model_type not in NO_MLP_BIAS_KEY:
        out["mlp_bias"] = True
    # Qwen2Attention: q, k, v projections bias=True, o_proj bias=False, hard-wired (transformers modeling_qwen2.py);
    # Qwen2MoeAttention bias=config.qkv_bias where Qwen2MoeConfig has it (default True; null builds none)
    if model_type == "qwen2" or (model_type == "qwen2_moe" and config.get("qkv_bias", True)):
        out["qkv_bias"] = True
    # a config.json without tie_word_embeddings means its class's default (transformers' PreTrainedConfig: True;
    # LlamaConfig, MistralConfig, Qwen2Config...: False; GemmaConfig: True)
    out.setdefault("tied_embeddings", _TIED_BY_DEFAULT.get(model_type, True))
    positions_key = "max_position_embeddings" if "max_position_embeddings" in config else "n_positions"
    if config.get(positions_key) is not None:           # a positive whole number (model_hf_checks.check_values)
        out["max_positions"] = int(config[positions_key])
        source["max_positions"] = positions_key
    head_dim = config.get("head_dim")
    if head_dim is not None and "hidden" in out and "heads" in out and is_number(out["heads"]) and \
            head_dim * out["heads"] != out["hidden"]:
        out["head_dim"] = head_dim      # only when it differs: a model with hidden / heads heads stays as it was
        source["head_dim"] = "head_dim"
    if model_type in {"qwen3", "qwen3_moe", "gemma3_text"}:
        out["qk_norm"] = True   # RMSNorm(head_dim) on q and k (transformers modeling_qwen3*.py, Gemma3Attention)
    if model_type in _MOE_FAMILIES:
        _moe_fields(config, model_type, out, source, file, text)
    elif model_type == "gemma2" and config["sliding_window"] is not None:
        # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2), a window on the even layers, full attention on
        # the odd ones: simtrain's sliding_window_every 2, as GPT-OSS
        check_alternating(config, out, file, text)
        out["attention"] = {"sliding_window": int(config["sliding_window"]), "sliding_window_every": 2}
        source["attention.sliding_window"] = "sliding_window"
    elif model_type == "gemma3_text" and config["sliding_window"] is not None:
        notes.append(f"sliding_window {config['sliding_window']}: Gemma-3 windows five layers of every six (sliding_"
                     "window_pattern, layer_types), which simtrain does not model: it costs full causal attention on "
                     "every layer, so attention time and memory are overestimated")
    else:
        window = config.get("sliding_window")
        # Qwen2/Qwen3 configs window only with use_sliding_window (default False in Qwen2Config/Qwen3Config)
        windowed = config.get("use_sliding_window", False) if model_type in {"qwen2", "qwen3"} else True
        if windowed and window is not None:              # a positive whole number (model_hf_checks.check_values)
            out["attention_window"] = int(window)
            source["attention_window"] = "sliding_window"
    notes += unmodelled(config, model_type, out)
    if notes:
        out["unmodelled"] = notes
    dropout = hf_dropout(config)
    if dropout is not None:
        out["dropout"] = dropout
    try:
        spec = validate(ModelSpec, out, file=file)
    except InputError as err:
        field = err.field or ""
        ours = field.split(".")[0]
        missing = err.message == "is required but missing"
        hf_key = source.get(field) or source.get(ours) or " or ".join(
            k for k, v in _HF_KEYS.items() if v == ours) or field
        message = f"{err.message} (HuggingFace key for simtrain's '{field}')" if field else err.message
        raise InputError(message, file=file, line=None if missing else json_line(text, source.get(field, hf_key)),
                         field=hf_key if field else None) from None
    if model_type not in _KNOWN:
        shown = f"model_type {json_value(config['model_type'])} is not" if "model_type" in config else \
            "no model_type names"
        note = (f"{shown} a family simtrain reads as its transformers class does ({', '.join(sorted(_KNOWN))}): read "
                f"as a dense decoder-only transformer of {spec.params_total:,} parameters; check the parameter count")
        spec = spec.model_copy(update={"unmodelled": (note, *spec.unmodelled)})
    return spec


def _moe_fields(config: dict[str, Any], model_type: str, out: dict[str, Any], source: dict[str, str],
                file: str, text: str | None) -> None:
    """The experts, MLA and MTP keys of the MoE families (class defaults from transformers, moe.md section 7)."""
    experts_key, experts_default, top_k_default, width_key = _MOE_FAMILIES[model_type]

    def get(key: str, default: Any = None) -> Any:
        value = config.get(key, default)
        return default if value is None else value

    experts = get(experts_key, get("num_local_experts", get("num_experts", experts_default)))
    moe: dict[str, Any] = {"experts": experts, "top_k": get("num_experts_per_tok", top_k_default),
                           "expert_ffn_hidden": get(width_key) if width_key else out.get("ffn_hidden")}
    source.update({"moe.experts": experts_key, "moe.top_k": "num_experts_per_tok",
                   "moe.expert_ffn_hidden": width_key or "intermediate_size"})
    if model_type == "qwen2_moe" and get("shared_expert_intermediate_size"):
        # one shared expert of that width (Qwen2MoeSparseMoeBlock), gated by a sigmoid Linear(h, 1) not counted
        moe.update(shared_experts=1, shared_ffn_hidden=get("shared_expert_intermediate_size"))
    if model_type.startswith("deepseek"):
        shared = get("n_shared_experts", 0)
        if shared:   # DeepseekV3MoE: one MLP of n_shared_experts x moe_intermediate_size, counted as that many
            moe["shared_experts"] = shared
        moe["dense_layers"] = get("first_k_dense_replace", 0)
        if moe["dense_layers"] and moe["dense_layers"] >= out.get("layers", 0):
            moe["experts"] = None
        source["moe.dense_layers"] = "first_k_dense_replace"
        moe["router_bias"] = get("topk_method") == "noaux_tc" or model_type == "deepseek_v3"   # e_score_correction_bias
        # group-limited routing: DeepseekV3TopkRouter always (transformers modeling_deepseek_v3.py, class defaults
        # n_group 8, topk_group 4); DeepSeek-V2 only with topk_method group_limited_greedy (modeling_deepseek_v2.py)
        if model_type == "deepseek_v3" or get("topk_method") == "group_limited_greedy":
            groups = get("n_group", 8 if model_type == "deepseek_v3" else None)
            if groups is not None and groups != 1:
                moe.update(n_group=groups, topk_group=get("topk_group", 4 if model_type == "deepseek_v3" else None))
                source.update({"moe.n_group": "n_group", "moe.topk_group": "topk_group"})
        if config.get("kv_lora_rank") is not None:
            out["attention"] = {"kind": "mla", "q_lora_rank": config.get("q_lora_rank"),
                                "kv_lora_rank": config["kv_lora_rank"],
                                "qk_nope_head_dim": get("qk_nope_head_dim", 128),
                                "qk_rope_head_dim": get("qk_rope_head_dim", 64), "v_head_dim": get("v_head_dim", 128)}
            out.pop("kv_heads", None)        # MLA: every head has its own keys and values from the latent
            out.pop("head_dim", None)
        mtp = get("num_nextn_predict_layers", 0)
        if mtp:
            out["mtp_layers"] = mtp
    if moe["experts"] is None or moe["top_k"] is None or (is_number(moe["experts"]) and moe["experts"] <= 1):
        return      # DeepseekV2Config without experts: every layer keeps its dense MLP (MLA alone)
    if model_type == "gpt_oss":
        if "attention_bias" in config and not config["attention_bias"]:   # GptOssAttention: bias=attention_bias
            raise InputError(f"{json_value(config['attention_bias'])} builds GPT-OSS's experts with biases and its "
                             "attention without, which simtrain does not build (allowed: true, GptOssConfig's "
                             "default)", file=file,
                             line=json_line(text, "attention_bias"), field="attention_bias")
        out["bias"] = True          # q, k, v, o biases (attention_bias, default true), expert biases (always)
        moe["router_bias"] = True   # the gate is nn.Linear with bias
        attention: dict[str, Any] = {"sinks": True}
        window = get("sliding_window", 128)
        if window:
            check_alternating(config, out, file, text)
            attention.update(sliding_window=window, sliding_window_every=2)
            source["attention.sliding_window"] = "sliding_window"
        out["attention"] = attention
    out["moe"] = moe


#: tie_word_embeddings when a config.json leaves it out: its config class's default (transformers
#: src/transformers/models/*/configuration_*.py; PreTrainedConfig's own default, True, for the others)
_TIED_BY_DEFAULT = {"llama": False, "mistral": False, "mixtral": False, "qwen2": False, "qwen3": False,
                    "phi3": False, "gemma": True, "gemma2": True, "gpt2": True, "qwen2_moe": False,
                    "qwen3_moe": False, "deepseek": False, "deepseek_v2": False, "deepseek_v3": False,
                    "gpt_oss": False}

_SUPPORTED = "it supports dense decoder-only transformers (Llama, Mistral, Qwen2, GPT-2 style) and the " \
             "mixture-of-experts families Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek and GPT-OSS"
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


def _unsupported(config: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(key, message) for each key, in file order, that describes a model simtrain does not build.

    Nested sections are searched too (DBRX keeps its experts in ``ffn_config``).
    """
    model_type = str(config.get("model_type")) if not prefix else ""
    family = model_type in _MOE_FAMILIES
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _unsupported(value, f"{path}.")
        elif _EXPERT_COUNT.fullmatch(key) and is_number(value) and value > 1 and not family:
            yield path, (f"{json_value(value)} makes this a mixture-of-experts model of a family whose routing keys "
                         f"simtrain does not read (model_type {json_value(config.get('model_type'))}); {_SUPPORTED}")
        elif key in _MLA_KEYS and value is not None and not model_type.startswith("deepseek"):
            yield path, (f"{json_value(value)} means DeepSeek multi-head latent attention in a config whose "
                         f"model_type is {json_value(config.get('model_type'))}; simtrain reads latent attention "
                         "from DeepSeek configs (model_type deepseek_v2 or deepseek_v3)")
        elif key in _BLOCK_KEYS and value is True:
            yield path, f"true {_BLOCK_KEYS[key]}"
        elif key == "head_dim" and not prefix and value is not None:
            message = _head_dim_problem(value)
            if message:
                yield path, message
        elif family and key == "moe_layer_freq" and value != 1:
            yield path, (f"{json_value(value)} puts experts on every n-th layer only, which simtrain does not model; "
                         "it builds dense_layers leading dense layers and experts on all the others")
        elif family and key == "decoder_sparse_step" and value != 1:
            yield path, (f"{json_value(value)} puts experts on every n-th layer only, which simtrain does not model; "
                         "it builds experts on every layer past the leading dense ones")
        elif family and key == "mlp_only_layers" and value:
            yield path, (f"{json_value(value)} lists dense layers among the expert layers, which simtrain does not "
                         "model; it builds experts on every layer past the leading dense ones")


def _head_dim_problem(head_dim: Any) -> str | None:
    """Why a config's ``head_dim`` cannot be read: it must be a whole number."""
    if isinstance(head_dim, bool):
        return f"{json_value(head_dim)} is a boolean, not a whole number (the width of one attention head)"
    if not is_number(head_dim) or head_dim != int(head_dim) or head_dim <= 0:
        return f"{json_value(head_dim)} is not a whole number (the width of one attention head)"
    return None


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


def load_hf_json(path: Path) -> ModelSpec:
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
