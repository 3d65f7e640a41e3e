"""HuggingFace config.json files simtrain cannot model are refused, and a boolean is never a number.

Mixture-of-experts families simtrain reads (Mixtral, Qwen-MoE, DeepSeek, GPT-OSS) are in test_moe_models.py.

Supported configs must still import to the published parameter counts (HuggingFace safetensors
index ``total_size`` / 2 bytes, as in test_models.py): Llama-2-7b 6,738,415,616 and Meta-Llama-3-8B
8,030,261,248. Architecture keys and their values are those of the released configs (Mixtral-8x7B,
DeepSeek-V2-Lite, Gemma-7B, Falcon-7B).
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import pytest
from conftest import DATA, make_scenario
from pydantic import ValidationError

from simtrain.spec.errors import InputError
from simtrain.spec.model_hf import from_hf_config
from simtrain.spec.model_load import load_model
from simtrain.spec.schema import Closed

LLAMA2_7B = 6_738_415_616
LLAMA3_8B = 8_030_261_248


def _config(folder: str) -> dict:
    return json.loads((DATA / folder / "config.json").read_text(encoding="utf-8"))


def _load(tmp_path: Path, config: dict) -> tuple:
    """Write ``config`` as an indented config.json and load it; returns (spec, path, text)."""
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    text = json.dumps(config, indent=2)
    path.write_text(text, encoding="utf-8")
    return load_model(str(path), base_dir=tmp_path, file="s.yaml"), path, text


def _refusal(tmp_path: Path, config: dict) -> InputError:
    with pytest.raises(InputError) as exc:
        _load(tmp_path, config)
    return exc.value


def _line(text: str, key: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if f'"{key}":' in line)


# --- supported configs still load --------------------------------------------------------------

@pytest.mark.parametrize("extra", [
    {"num_local_experts": 1, "num_experts_per_tok": 1},      # one expert is a dense MLP
    {"q_lora_rank": None, "kv_lora_rank": None},              # MLA keys present but off
    {"parallel_attn": False, "new_decoder_architecture": False, "multi_query": False,
     "use_parallel_residual": False},
    {"head_dim": 128},                                        # = 4096 / 32, what simtrain assumes
    {"head_dim": None},
])
def test_supported_keys_keep_the_published_count(tmp_path, extra):
    """Llama-2-7b with architecture keys that describe its own dense block still has 6,738,415,616 weights."""
    spec, _, _ = _load(tmp_path, {**_config("core_hf_llama-2-7b"), **extra})
    assert spec.params_total == LLAMA2_7B


def test_llama3_with_its_head_dim_loads(tmp_path):
    """Meta-Llama-3-8B with head_dim 128 (4096 / 32 heads) imports to its published 8,030,261,248."""
    spec, _, _ = _load(tmp_path, {**_config("core_hf_meta-llama-3-8b"), "head_dim": 128})
    assert spec.params_total == LLAMA3_8B and spec.num_kv_heads == 8


# --- unsupported architectures ------------------------------------------------------------------

@pytest.mark.parametrize(("key", "value"), [
    ("num_local_experts", 8),        # Mixtral-8x7B
    ("num_experts", 60),             # Qwen1.5-MoE-A2.7B
    ("num_experts_per_tok", 2),      # Mixtral-8x7B top-2 routing
    ("n_routed_experts", 64),        # DeepSeek-V2-Lite
    ("moe_num_experts", 16),         # DBRX (top level here)
    ("moe_top_k", 4),
])
def test_mixture_of_experts_is_refused(tmp_path, key, value):
    """A key that counts more than one expert refuses the config, naming key, value and line."""
    err = _refusal(tmp_path, {**_config("core_hf_llama-2-7b"), key: value})
    path = tmp_path / "m" / "config.json"
    text = path.read_text(encoding="utf-8")
    assert err.field == key and err.line == _line(text, key)
    assert Path(err.file).resolve() == path.resolve()
    assert err.message.startswith(f"{value} makes this a mixture-of-experts model")
    assert "it supports dense decoder-only transformers" in err.message


def test_deepseek_mla_is_refused(tmp_path):
    """kv_lora_rank 512 (DeepSeek-V2-Lite) is latent attention: refused even though q_lora_rank is null."""
    config = {**_config("core_hf_llama-2-7b"), "q_lora_rank": None, "kv_lora_rank": 512}
    err = _refusal(tmp_path, config)
    assert (err.field, err.line) == ("kv_lora_rank", _line(json.dumps(config, indent=2), "kv_lora_rank"))
    assert err.message.startswith("512 means DeepSeek multi-head latent attention")


def test_gemma_head_dim_of_its_own_loads(tmp_path):
    """Gemma-7B: hidden 3072, 16 heads of head_dim 256 (not 3072 / 16 = 192) imports to its 8,537,680,896 weights.

    By hand (google/gemma-7b config.json; GeGLU: 3 matrices; RMSNorm; tied embeddings): attention
    3072 x (4096 + 2 x 4096) + 4096 x 3072 = 50,331,648; MLP 3 x 3072 x 24576 = 226,492,416; norms 2 x 3072;
    per layer 276,830,208, x 28 = 7,751,245,824; embedding 256000 x 3072 = 786,432,000; final norm 3072.
    """
    config = {"model_type": "gemma", "hidden_size": 3072, "num_attention_heads": 16, "head_dim": 256,
              "num_hidden_layers": 28, "intermediate_size": 24576, "vocab_size": 256000}
    spec, _, _ = _load(tmp_path, config)
    assert spec.head_dim == 256 and spec.q_width == 4096
    assert spec.params_total == 7_751_245_824 + 786_432_000 + 3072 == 8_537_680_896


def test_boolean_head_dim_is_refused(tmp_path):
    """head_dim: true is not a head width."""
    err = _refusal(tmp_path, {**_config("core_hf_llama-2-7b"), "head_dim": True})
    assert err.message.startswith("true is a boolean, not a whole number")


def test_falcon_7b_names_the_parallel_block_not_multi_query(tmp_path):
    """Falcon-7B lists multi_query before parallel_attn; the parallel block is what is reported."""
    config = {"model_type": "falcon", "hidden_size": 4544, "multi_query": True, "new_decoder_architecture": False,
              "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True, "vocab_size": 65024}
    err = _refusal(tmp_path, config)
    assert err.field == "parallel_attn"
    assert err.message.startswith("true means attention and the MLP side by side in one block")


def test_first_problem_in_file_order(tmp_path):
    """With MLA and experts (DeepSeek-V2), the key that comes first in the file is named."""
    config = {**_config("core_hf_llama-2-7b"), "n_routed_experts": 64, "kv_lora_rank": 512}
    assert _refusal(tmp_path, config).field == "n_routed_experts"


def test_nested_expert_count_is_found():
    """DBRX keeps its experts in ffn_config; the field is the dotted path, the line that of the key."""
    text = '{\n  "d_model": 64,\n  "ffn_config": {\n    "moe_num_experts": 16\n  }\n}\n'
    with pytest.raises(InputError) as exc:
        from_hf_config(json.loads(text), file="config.json", text=text)
    assert (exc.value.field, exc.value.line) == ("ffn_config.moe_num_experts", 4)


# --- booleans are not numbers ---------------------------------------------------------------------

def _closed_models() -> list[type]:
    import simtrain.spec.hardware  # noqa: F401  (registers the schemas)
    import simtrain.spec.scenario  # noqa: F401

    found, todo = [], [Closed]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def _whole_number_type(ann) -> bool:
    """int, PositiveInt, int | None, Literal[0, 1, 2, 3]: a type that takes whole numbers and no booleans."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _whole_number_type(args[0])
    if origin in (typing.Union, types.UnionType):
        return bool not in args and any(_whole_number_type(a) for a in args)
    if origin is typing.Literal:
        return all(isinstance(a, int) and not isinstance(a, bool) for a in args)
    return ann is int


def _int_fields() -> list[tuple[type, str]]:
    return [(model, name) for model in _closed_models() for name, info in model.model_fields.items()
            if _whole_number_type(info.annotation)]


def test_the_schemas_have_integer_fields_to_check():
    """The walk below sees the count fields the audit named (a guard against checking nothing)."""
    names = {f"{m.__name__}.{n}" for m, n in _int_fields()}
    assert {"Training.micro_batch", "Parallel.zero", "Parallel.pp", "ModelSpec.layers", "HardwareSpec.nodes",
            "HardwareSpec.gpus_per_node", "InterNode.nics_per_node", "Simulation.seed"} <= names


@pytest.mark.parametrize(("model", "name"), _int_fields(), ids=lambda x: getattr(x, "__name__", x))
@pytest.mark.parametrize("value", [True, False])
def test_every_integer_field_refuses_a_boolean(model, name, value):
    """Each integer field of every closed schema says '<value> is a boolean, not a whole number'."""
    with pytest.raises(ValidationError) as exc:
        model.model_validate({name: value})
    errors = [e for e in exc.value.errors() if e["loc"] == (name,)]
    assert errors and f"{str(value).lower()} is a boolean, not a whole number" in errors[0]["msg"]


def test_whole_floats_still_count_and_booleans_stay_booleans():
    """micro_batch: 2.0 is 2 and zero: 1.0 is stage 1, as before; true/false fields still take booleans."""
    sc = make_scenario(training={"global_batch": 8, "micro_batch": 2.0, "flash_attention": False},
                       parallel={"dp": 2, "zero": 1.0, "sequence_parallel": True})
    assert (sc.training.micro_batch, sc.parallel.zero, sc.training.flash_attention) == (2, 1, False)
    assert sc.parallel.sequence_parallel is True


def test_a_boolean_inside_a_list_is_located():
    """layers_per_stage: [4, true, ...] names the entry."""
    with pytest.raises(InputError) as exc:
        make_scenario(parallel={"pp": 2, "layers_per_stage": [4, True]})
    assert exc.value.field == "parallel.layers_per_stage.1"
    assert exc.value.message.startswith("true is a boolean, not a whole number")


def test_a_boolean_is_not_a_fraction_either():
    """A straggler's slowdown: true is not 1.0."""
    with pytest.raises(InputError) as exc:
        make_scenario(simulation={"stragglers": [{"rank": 0, "slowdown": True}]})
    assert exc.value.field == "simulation.stragglers.0.slowdown"
    assert exc.value.message == "true is a boolean, not a number"


def test_boolean_from_set_names_the_override(capsys):
    """--set parallel.zero=true is refused like the file's value, without a line."""
    from conftest import run_cli

    base = Path(__file__).resolve().parent / "bad_inputs" / "good" / "base.yaml"
    code, _, err = run_cli(["run", str(base), "--set", "parallel.zero=true"], capsys)
    assert code == 2
    assert err.strip() == (f"error: {base}: parallel.zero: true is a boolean, not a whole number (allowed: 0, 1, 2 "
                           "or 3) (value set by an override such as --set, not by the file)")


# Gemma-2B's released config.json (google/gemma-2b) has no tie_word_embeddings: GemmaConfig's default, True,
# applies. Gemma report (Gemma Team 2024, Table 2): 1,981,884,416 non-embedding parameters for 2B; its embedding
# counts a 256,128-row table, the config's vocab_size is 256,000, so the config's model has 256,000 x 2,048 more.
GEMMA_2B = {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 2048, "head_dim": 256,
            "intermediate_size": 16384, "num_attention_heads": 8, "num_hidden_layers": 18,
            "num_key_value_heads": 1, "vocab_size": 256000, "hidden_act": "gelu", "max_position_embeddings": 8192}


def test_gemma_without_tie_key_is_tied_as_its_config_class_says(tmp_path):
    """A missing tie_word_embeddings means the config class's default (GemmaConfig: True), not untied."""
    spec, _, _ = _load(tmp_path, GEMMA_2B)
    assert spec.tied_embeddings
    assert spec.params_total == 1_981_884_416 + 256_000 * 2048


def test_llama_without_tie_key_stays_untied(tmp_path):
    """LlamaConfig's default is False: Llama-2-7b without the key keeps its published count."""
    config = {k: v for k, v in _config("core_hf_llama-2-7b").items() if k != "tie_word_embeddings"}
    spec, _, _ = _load(tmp_path, config)
    assert not spec.tied_embeddings and spec.params_total == LLAMA2_7B


@pytest.mark.parametrize("extra, seq, warned", [
    ({"sliding_window": 4096, "max_position_embeddings": 32768}, 32768, "sliding window of 4096 tokens"),
    ({"sliding_window": 4096}, 4096, None),
    ({"max_position_embeddings": 4096}, 8192, "longer than the model was built for (max_position_embeddings 4096)"),
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False, "max_position_embeddings": 32768},
     32768, None),
    ({"model_type": "qwen2", "sliding_window": 4096, "max_position_embeddings": 32768},
     32768, None),  # Qwen2Config: off
])
def test_what_simtrain_does_not_cost_is_said(tmp_path, extra, seq, warned):
    """Sliding-window attention (costed as full attention) and a sequence beyond the model's positions warn."""
    config = {**_config("core_hf_llama-2-7b"), **extra}
    _, path, _ = _load(tmp_path, config)
    sc = make_scenario(model=str(path), training={"seq_len": seq, "global_batch": 1})
    found = [w for w in sc.warnings if "sliding window" in w or "built for" in w]
    assert (found == []) if warned is None else (len(found) == 1 and warned in found[0])


def test_sequence_beyond_a_learned_position_table_warns():
    """GPT-2 style: 1,024 learned positions cannot index a 2,048-token sequence."""
    from conftest import gpt_model

    sc = make_scenario(model={**gpt_model(), "position_embeddings": 1024}, training={"seq_len": 2048})
    assert any("learned position table (1024 rows)" in w for w in sc.warnings)


def test_a_gated_mlp_without_its_width_is_refused(tmp_path):
    """Llama-2-7b without intermediate_size: a SwiGLU width has no standard (LlamaConfig's 11008 goes with its
    default hidden 4096; 4 x 4096 = 16384 would make the model 8.85e9 instead of 6.74e9), so the import stops
    at the key, rather than read it as GPT-2's 4 x hidden."""
    config = _config("core_hf_llama-2-7b")
    del config["intermediate_size"]
    with pytest.raises(InputError, match="is required but missing: a gated") as err:
        _load(tmp_path, config)
    assert err.value.field == "intermediate_size"


def test_gpt2_without_n_inner_takes_four_times_hidden(tmp_path):
    """GPT2Config: n_inner None means 4 x n_embd (GPT-2 small: 768 -> 3072)."""
    config = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257,
              "n_positions": 1024, "activation_function": "gelu_new", "n_inner": None}
    spec, _, _ = _load(tmp_path, config)
    assert (spec.mlp, spec.ffn_hidden) == ("gelu", 3072)


@pytest.mark.parametrize("key, value, wanted", [("hidden_size", "4096", "a whole number"),
                                                ("tie_word_embeddings", "yes", "true or false"),
                                                ("tie_word_embeddings", 1, "true or false")])
def test_text_where_a_config_has_a_number_or_boolean_is_refused(tmp_path, key, value, wanted):
    """transformers writes sizes as JSON numbers and tie_word_embeddings as a boolean; "4096" or "yes" is a hand
    edit that pydantic's lax mode would read as 4096 or true: refused at the key and its line."""
    config = _config("core_hf_llama-2-7b")
    config[key] = value
    with pytest.raises(InputError, match=f"is not {wanted}") as err:
        _load(tmp_path, config)
    assert err.value.field == key and err.value.line is not None
