"""Mixture-of-experts presets and HuggingFace imports: total and active parameter counts equal the model cards'.

Every expected number is worked out by hand below from the published config.json dimensions (the arithmetic of
/work/research/moe.md section 1.3, every matrix in x out, SwiGLU = 3 h f, two RMSNorms per layer, untied heads),
then compared with the cards' rounded figures. Configs under tests/data/hf_moe were written from the published
config.json files' values (Mixtral-8x7B-v0.1, Qwen3-30B-A3B, DeepSeek-V3, gpt-oss-120b).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DATA

from simtrain.spec.errors import InputError
from simtrain.spec.model_load import load_model


def _preset(name: str):
    return load_model(name, base_dir=DATA, file="test.yaml")


def _hf(folder: str):
    return load_model(str(DATA / "hf_moe" / folder / "config.json"), base_dir=DATA, file="test.yaml")


def _mixtral_8x7b() -> tuple[int, int]:
    h, f, layers, vocab = 4096, 14336, 32, 32000
    attention = h * 4096 + h * 1024 + h * 1024 + 4096 * h          # q, k, v (8 kv heads x 128), o = 41,943,040
    expert = 3 * h * f                                              # 176,160,768
    router, norms = 8 * h, 2 * h
    total = layers * (attention + 8 * expert + router + norms) + 2 * vocab * h + h
    active = layers * (attention + 2 * expert + router + norms) + 2 * vocab * h + h
    return total, active


def _qwen3_30b() -> tuple[int, int]:
    h, layers, vocab = 2048, 48, 151936
    attention = h * 4096 + 2 * h * 512 + 4096 * h + 2 * 128        # 32 x 128 queries, 4 x 128 kv, q/k norms
    expert = 3 * h * 768
    router, norms = 128 * h, 2 * h
    total = layers * (attention + 128 * expert + router + norms) + 2 * vocab * h + h
    active = layers * (attention + 8 * expert + router + norms) + 2 * vocab * h + h
    return total, active


def _gpt_oss_120b() -> tuple[int, int]:
    h, layers, vocab = 2880, 36, 201088
    attention = h * (4096 + 2 * 512) + (4096 + 2 * 512) + 4096 * h + h + 64   # qkv + bias, out + bias, 64 sinks
    expert = h * 5760 + 5760 + 2880 * h + h                                     # mlp1 + bias, mlp2 + bias
    router, norms = 128 * h + 128, 2 * h
    total = layers * (attention + 128 * expert + router + norms) + 2 * vocab * h + h
    active_without_embedding = layers * (attention + 4 * expert + router + norms) + vocab * h + h
    return total, active_without_embedding


def _deepseek_v3() -> tuple[int, int, int]:
    h, vocab = 7168, 129280
    mla = (h * 1536 + 1536 + 1536 * 128 * 192          # wq_a, q_norm, wq_b
           + h * 576 + 512 + 512 * 128 * 256            # wkv_a (latent + rope key), kv_norm, wkv_b
           + 128 * 128 * h)                             # wo: 187,107,328
    expert = 3 * h * 2048
    moe_total = 257 * expert + 256 * h + 256            # 256 routed + 1 shared, router + e_score_correction_bias
    moe_active = 9 * expert + 256 * h + 256
    dense = 3 * h * 18432
    norms = 2 * h
    main = 3 * (mla + dense + norms) + 58 * (mla + moe_total + norms) + 2 * vocab * h + h
    active = 3 * (mla + dense + norms) + 58 * (mla + moe_active + norms) + 2 * vocab * h + h
    mtp = 2 * h + 2 * h * h + (mla + moe_total + norms) + h     # enorm, hnorm, eh_proj, one MoE layer, its norm
    return main, active, mtp


def test_mixtral_8x7b_counts():
    """Mixtral-8x7B: 46.7B total, 12.9B active (embedding and head included), as in the Mixtral paper."""
    total, active = _mixtral_8x7b()
    m = _preset("mixtral-8x7b")
    assert (m.params_total, m.params_active) == (total, active) == (46_702_792_704, 12_879_925_248)
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9


def test_mixtral_8x22b_counts():
    """Mixtral-8x22B (vocab 32768): 141B total, 39B active."""
    h, f, layers, vocab = 6144, 16384, 56, 32768
    attention = h * (6144 + 2 * 1024) + 6144 * h
    layer_total = attention + 8 * 3 * h * f + 8 * h + 2 * h
    layer_active = attention + 2 * 3 * h * f + 8 * h + 2 * h
    m = _preset("mixtral-8x22b")
    assert m.params_total == layers * layer_total + 2 * vocab * h + h == 140_630_071_296
    assert m.params_active == layers * layer_active + 2 * vocab * h + h == 39_161_468_928
    assert round(m.params_total / 1e9) == 141 and round(m.params_active / 1e9) == 39


def test_qwen3_30b_a3b_counts():
    """Qwen3-30B-A3B: 30.5B total, 3.3B activated; heads x head_dim (4096) differs from hidden (2048)."""
    total, active = _qwen3_30b()
    m = _preset("qwen3-30b-a3b")
    assert (m.params_total, m.params_active) == (total, active) == (30_532_122_624, 3_353_032_704)
    assert round(total / 1e9, 1) == 30.5 and int(active / 1e8) / 10 == 3.3   # the card truncates 3.35


def test_qwen3_235b_a22b_counts():
    """Qwen3-235B-A22B: 235B total, 22B activated."""
    h, layers, vocab = 4096, 94, 151936
    attention = h * 8192 + 2 * h * 512 + 8192 * h + 256
    expert = 3 * h * 1536
    m = _preset("qwen3-235b-a22b")
    assert m.params_total == layers * (attention + 128 * expert + 128 * h + 2 * h) + 2 * vocab * h + h \
        == 235_093_634_560
    assert m.params_active == layers * (attention + 8 * expert + 128 * h + 2 * h) + 2 * vocab * h + h \
        == 22_190_763_520
    assert round(m.params_total / 1e9) == 235 and round(m.params_active / 1e9) == 22


def test_gpt_oss_120b_counts():
    """GPT-OSS-120B: 116.83B total, 5.13B active counted as its card does (without the embedding table)."""
    total, active_without_embedding = _gpt_oss_120b()
    m = _preset("gpt-oss-120b")
    assert m.params_total == total == 116_829_156_672
    assert m.params_active - m.vocab * m.hidden == active_without_embedding == 5_132_849_472
    assert round(total / 1e9) == 117 and round(active_without_embedding / 1e9, 1) == 5.1


def test_deepseek_v3_counts():
    """DeepSeek-V3: 671B main model, 37B activated; the MTP module adds 11.6B unique weights (14B with the
    embedding and head copies its checkpoint stores)."""
    main, active, mtp = _deepseek_v3()
    m = _preset("deepseek-v3")
    assert m.params_main == main == 671_026_419_200
    assert m.params_active == active == 37_552_297_472
    assert m.mtp_module_params == mtp == 11_610_068_224
    # README: "685B = 671B + 14B"; the stored MTP module with its embedding and head copies is 13.46B
    assert mtp + 2 * 129280 * 7168 == 13_463_426_304
    assert m.params_total == main + mtp


@pytest.mark.parametrize(("folder", "preset"), [
    ("mixtral-8x7b", "mixtral-8x7b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
    ("deepseek-v3", "deepseek-v3"), ("gpt-oss-120b", "gpt-oss-120b"),
])
def test_hf_config_imports_equal_the_preset(folder, preset):
    """Each family's published config.json imports to the preset's dimensions and counts."""
    got, want = _hf(folder), _preset(preset)
    assert (got.params_total, got.params_active) == (want.params_total, want.params_active)
    assert got.moe.model_dump() == want.moe.model_dump()
    assert got.attention.model_dump() == want.attention.model_dump()
    assert got.mtp_layers == want.mtp_layers


@pytest.mark.parametrize("folder", ["small_moe_mixtral", "small_moe_qwen2", "small_moe_deepseek",
                                    "small_mla_deepseek_v2", "small_head_dim_gemma"])
def test_configs_refused_before_now_load(folder):
    """The MoE, MLA and head_dim configs the bad-input corpus used to refuse are valid inputs."""
    spec = _hf(folder)
    assert spec.params_total > 0


def test_small_qwen2_moe_counts():
    """Qwen2-MoE (60 experts of 32, top-4, one shared expert of 128): the count by hand, with the q, k and v
    biases of Qwen2MoeAttention (3 x 64; no output bias)."""
    h, layers, vocab = 64, 4, 128
    layer = (h * 64 * 4) + 3 * 64 + 60 * 3 * h * 32 + 3 * h * 128 + 60 * h + 2 * h
    assert _hf("small_moe_qwen2").params_total == layers * layer + 2 * vocab * h + h


def test_dbrx_is_still_refused(tmp_path: Path):
    """DBRX keeps its fused experts in ffn_config, which simtrain does not read: refused, naming the key."""
    (tmp_path / "config.json").write_text('{\n  "model_type": "dbrx",\n  "d_model": 64,\n  "ffn_config": {\n'
                                          '    "moe_num_experts": 16\n  }\n}\n', encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_model(str(tmp_path / "config.json"), base_dir=tmp_path, file="s.yaml")
    assert exc.value.field == "ffn_config.moe_num_experts"
    assert "mixture-of-experts families Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek and GPT-OSS" in exc.value.message


@pytest.mark.parametrize(("moe", "field", "says"), [
    ({"experts": 8, "top_k": 9, "expert_ffn_hidden": 64}, "model.moe.top_k", "9 is more than experts=8"),
    ({"experts": 8, "top_k": 2, "expert_ffn_hidden": 64, "capacity_factor": 0}, "model.moe.capacity_factor",
     "0 is not a capacity"),
])
def test_bad_moe_keys_are_refused(moe, field, says):
    """top_k above the expert count and a capacity factor <= 0 are refused, naming the key."""
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 100, "moe": moe}
    with pytest.raises(InputError) as exc:
        load_model(model, base_dir=DATA, file="s.yaml")
    assert exc.value.field == field and exc.value.message.startswith(says)


def test_mla_without_kv_lora_rank_is_refused():
    """Multi-head latent attention without kv_lora_rank cannot be built: refused, naming the key."""
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 100,
             "attention": {"kind": "mla", "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}}
    with pytest.raises(InputError) as exc:
        load_model(model, base_dir=DATA, file="s.yaml")
    assert exc.value.field == "model.attention.kv_lora_rank"
    assert exc.value.message.startswith("is required with kind: mla")
