"""Decoder-only transformer descriptions: dense or mixture-of-experts, multi-head or latent attention.

A :class:`ModelSpec` holds the dimensions; parameter counts follow from them
exactly (no rounding), so a preset's count can be checked against the number
its authors published. Loading (presets, YAML files, HuggingFace configs) is in
:mod:`simtrain.spec.model_load` and :mod:`simtrain.spec.model_hf`.

Counting conventions (every matrix in x out; /work/research/moe.md section 1.2): a SwiGLU MLP is 3 h f, a GELU
MLP 2 h f; each layer has two norms; the router is E h (+ E with a bias); multi-head latent attention (DeepSeek-V2/V3)
counts its down and up projections and the two latent RMSNorms; ``qkv_bias`` (Qwen2, Qwen2-MoE) adds q_width +
2 kv_width biases per layer, ``bias`` those and the attention output's and the MLP's.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, ValidationInfo, field_validator, model_validator

from simtrain.spec.schema import Closed, FieldError


class MoESpec(Closed):
    """Routed experts replacing the MLP of every layer past ``dense_layers`` (Mixtral, Qwen3-MoE, DeepSeek, GPT-OSS)."""

    experts: PositiveInt = Field(description="routed experts per MoE layer")
    top_k: PositiveInt = Field(description="experts each token is routed to")
    expert_ffn_hidden: PositiveInt = Field(description="inner width of one expert MLP")
    shared_experts: NonNegativeInt = Field(0, description="always-active experts per MoE layer (DeepSeek: 1)")
    shared_ffn_hidden: PositiveInt | None = Field(None, description="inner width of one shared expert; default "
                                                                    "expert_ffn_hidden")
    dense_layers: NonNegativeInt = Field(0, description="leading layers with a dense MLP of ffn_hidden "
                                                        "(DeepSeek-V3: 3)")
    capacity_factor: float | None = Field(None, description="null = dropless; a number = tokens per expert capped "
                                                            "and padded at that factor times the mean")
    imbalance: float = Field(1.0, ge=1.0, description="max over mean tokens per expert rank (1.0: force-balanced "
                                                      "routing, as the published benchmarks run)")
    router_bias: bool = Field(False, description="the router carries a bias of E values (DeepSeek-V3's "
                                                 "e_score_correction_bias, GPT-OSS's gate bias)")
    n_group: PositiveInt | None = Field(None, description="group-limited routing: the experts form n_group equal "
                                                          "groups of consecutive experts (DeepSeek-V3: 8; HF n_group, "
                                                          "Megatron-Core moe_router_num_groups); null = none")
    topk_group: PositiveInt | None = Field(None, description="group-limited routing: groups each token may use, its "
                                                             "top_k experts taken within them (DeepSeek-V3: 4; HF "
                                                             "topk_group, Megatron-Core moe_router_group_topk)")

    @field_validator("top_k")
    @classmethod
    def _top_k_within_experts(cls, top_k: int, info: ValidationInfo) -> int:
        experts = info.data.get("experts")
        if experts is not None and top_k > experts:
            raise ValueError(f"{top_k} is more than experts={experts} (each token picks top_k distinct experts)")
        return top_k

    @field_validator("capacity_factor")
    @classmethod
    def _positive_capacity(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"{value:g} is not a capacity: give a number > 0 (tokens per expert capped at that "
                             "factor times the mean) or null for dropless routing")
        return value

    @field_validator("n_group")
    @classmethod
    def _groups_divide_experts(cls, n_group: int | None, info: ValidationInfo) -> int | None:
        experts = info.data.get("experts")
        if n_group is not None and experts is not None and experts % n_group:
            raise ValueError(f"{n_group} does not divide experts={experts} (group-limited routing splits the experts "
                             "into equal groups)")
        return n_group

    @field_validator("topk_group")
    @classmethod
    def _topk_group_fits(cls, topk_group: int | None, info: ValidationInfo) -> int | None:
        n_group, experts, top_k = info.data.get("n_group"), info.data.get("experts"), info.data.get("top_k")
        if topk_group is None:      # given as null: no group-limited routing (n_group alone is refused below)
            return None
        if n_group is None:
            raise ValueError(f"{topk_group} needs n_group (the number of expert groups)")
        if topk_group > n_group:
            raise ValueError(f"{topk_group} is more than n_group={n_group}")
        if experts is not None and top_k is not None and top_k > topk_group * (experts // n_group):
            raise ValueError(f"{topk_group} x {experts // n_group} experts per group is fewer than top_k={top_k} "
                             f"(allowed: topk_group x experts / n_group >= top_k)")
        return topk_group

    @model_validator(mode="after")
    def _groups_need_topk_group(self) -> MoESpec:
        if self.n_group is not None and self.topk_group is None:
            raise FieldError(f"{self.n_group} needs topk_group (the groups each token may use; Megatron-Core refuses "
                             "moe_router_num_groups without moe_router_group_topk)", "n_group")
        return self

    @property
    def shared_width(self) -> int:
        return self.shared_ffn_hidden or self.expert_ffn_hidden


class AttentionSpec(Closed):
    """How a layer attends: multi-head (MHA/GQA/MQA through kv_heads) or DeepSeek's multi-head latent attention."""

    kind: Literal["mha", "mla"] = Field("mha", description="mha = multi-head (grouped-query via kv_heads); mla = "
                                                           "multi-head latent attention (DeepSeek-V2/V3)")
    q_lora_rank: PositiveInt | None = Field(None, description="MLA: query latent width (null: no query compression)")
    kv_lora_rank: PositiveInt | None = Field(None, description="MLA: key/value latent width (what the KV cache keeps)")
    qk_nope_head_dim: PositiveInt | None = Field(None, description="MLA: per-head query/key width without RoPE")
    qk_rope_head_dim: PositiveInt | None = Field(None, description="MLA: per-head RoPE width (the key part shared "
                                                                   "by the heads)")
    v_head_dim: PositiveInt | None = Field(None, description="MLA: per-head value width")
    sliding_window: PositiveInt | None = Field(None, description="tokens a windowed layer attends to")
    sliding_window_every: PositiveInt = Field(1, description="every n-th layer is windowed, from layer 0 "
                                                             "(GPT-OSS: 2, the even layers)")
    sinks: bool = Field(False, description="one learned attention-sink logit per head (GPT-OSS)")

    @model_validator(mode="after")
    def _mla_needs_its_widths(self) -> AttentionSpec:
        if self.kind == "mla":
            for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, key) is None:
                    raise FieldError("is required with kind: mla (multi-head latent attention projects keys and "
                                     "values through a latent of this width)" if key == "kv_lora_rank" else
                                     "is required with kind: mla", key)
        else:
            for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, key) is not None:
                    raise FieldError("describes multi-head latent attention: set kind: mla, or leave it out", key)
        return self

    def windowed(self, layer: int) -> bool:
        return self.sliding_window is not None and layer % self.sliding_window_every == 0


class ModelSpec(Closed):
    """A decoder-only transformer: the dimensions that set FLOPs, bytes and memory."""

    name: str = Field("custom", description="display name")
    layers: PositiveInt = Field(description="number of transformer blocks")
    hidden: PositiveInt = Field(description="model width d_model")
    heads: PositiveInt = Field(description="attention (query) heads")
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (GQA); default = heads")
    head_dim: PositiveInt | None = Field(None, description="width of one attention head; default hidden / heads "
                                                           "(Qwen3, GPT-OSS: heads x head_dim differs from hidden)")
    ffn_hidden: PositiveInt = Field(description="MLP inner width (of the dense layers in a mixture-of-experts model)")
    vocab: PositiveInt = Field(description="vocabulary size")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="gelu: 2 matrices; swiglu: 3 (gate, up, down)")
    tied_embeddings: bool = Field(False, description="output layer shares the input embedding")
    bias: bool = Field(False, description="linear layers carry biases (GPT-2/3 style; GPT-OSS's attention and experts)")
    qkv_bias: bool = Field(False, description="the query, key and value projections carry biases and nothing else "
                                              "does (Qwen2, Qwen2-MoE: q_proj, k_proj, v_proj with bias=True, o_proj "
                                              "and the MLP without, transformers modeling_qwen2.py / "
                                              "modeling_qwen2_moe.py); implied by bias")
    attention_bias: bool = Field(False, description="the attention's query, key, value and output projections carry "
                                                    "biases and the MLP's do not (LlamaAttention, Qwen3, Gemma with "
                                                    "attention_bias: true in transformers); implied by bias")
    mlp_bias: bool = Field(False, description="the dense MLP's linears carry biases (LlamaMLP with mlp_bias: true in "
                                              "transformers); implied by bias")
    norm: Literal["layernorm", "rmsnorm"] | None = Field(
        None, description="layernorm has weight+bias (2h), rmsnorm weight only (h); default rmsnorm for swiglu")
    qk_norm: bool = Field(False, description="RMSNorm of head_dim on queries and keys (Qwen3)")
    position_embeddings: int = Field(0, ge=0, description="learned position table rows (GPT-3: 2048); 0 for RoPE/ALiBi")
    max_positions: PositiveInt | None = Field(
        None, description="longest sequence the model was built for (HF max_position_embeddings or n_positions); "
                          "informational: a longer training.seq_len warns")
    attention_window: PositiveInt | None = Field(
        None, description="sliding-window attention width (HF sliding_window) on every layer; informational: "
                          "simtrain costs full causal attention, so a longer training.seq_len warns")
    attention: AttentionSpec = Field(AttentionSpec(), description="attention kind (mha, mla), sliding windows, sinks")
    unmodelled: tuple[str, ...] = Field(
        (), description="what the source model has that simtrain does not cost or count, one phrase each (the "
                        "HuggingFace config reader fills it: Gemma-2's logit softcapping, an unknown model_type...); "
                        "informational: each is a warning")
    moe: MoESpec | None = Field(None, description="mixture of experts; null = dense")
    mtp_layers: NonNegativeInt = Field(0, description="DeepSeek-V3 multi-token-prediction modules (one layer plus a "
                                                      "projection each), run on the last pipeline stage")
    dropout: bool | None = Field(
        None, description="whether the model family trains with dropout: the default of the scenario's "
                          "training.dropout when the scenario does not set it (None: not known, training.dropout's "
                          "own default applies)")

    # Field validators where one field is at fault, so that an error names the field and its line.
    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, kv_heads: int | None, info: ValidationInfo) -> int | None:
        heads = info.data.get("heads")
        if kv_heads is not None and heads is not None and heads % kv_heads:
            raise ValueError(f"heads={heads} is not divisible by kv_heads={kv_heads} (each KV head serves "
                             "heads / kv_heads query heads)")
        return kv_heads

    @model_validator(mode="after")
    def _heads_fit(self) -> ModelSpec:
        if self.head_dim is None and self.attention.kind == "mha" and self.hidden % self.heads:
            raise FieldError(f"hidden={self.hidden} is not divisible by heads={self.heads} (head size = hidden / "
                             "heads; give head_dim for heads of their own width)", "heads")
        for key in ("qkv_bias", "attention_bias"):
            if getattr(self, key) and self.attention.kind == "mla":
                raise FieldError("describes biases on multi-head attention's projections; latent attention "
                                 "(attention.kind: mla) has none in simtrain: leave it out", key)
        if self.mlp_bias and self.moe is not None:
            raise FieldError("describes biases on a dense MLP's linears; with a mixture of experts simtrain builds "
                             "biases only with bias: true (GPT-OSS's): leave it out", "mlp_bias")
        if self.moe is not None and self.moe.dense_layers >= self.layers:
            raise FieldError(f"{self.moe.dense_layers} leaves no MoE layer among the model's {self.layers} "
                             "(dense_layers counts the leading layers with a dense MLP)", "moe", "dense_layers")
        return self

    # --- derived sizes -------------------------------------------------
    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_size(self) -> int:
        """Width of one query head: head_dim, or hidden / heads."""
        return self.head_dim or self.hidden // self.heads

    @property
    def layers_differ(self) -> bool:
        """True when the model's layers are not all one dense Llama-style layer: experts, latent or sliding-window
        attention, or MTP modules (what auto splits do not cost yet)."""
        return self.moe is not None or self.attention.kind == "mla" or self.attention.sliding_window is not None \
            or self.mtp_layers > 0

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def norm_kind(self) -> str:
        return self.norm or ("rmsnorm" if self.mlp == "swiglu" else "layernorm")

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @property
    def q_width(self) -> int:
        """Width of the query projection output (and the attention output's input): heads x head width."""
        return self.heads * self.head_size

    @property
    def kv_width(self) -> int:
        """Width of the K (or V) projection output: kv_heads x head_dim."""
        return self.num_kv_heads * self.head_size

    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm_kind == "layernorm" else 1)

    @property
    def dense_layer_count(self) -> int:
        """Layers with a dense MLP: all of a dense model, the leading ``moe.dense_layers`` of a MoE one."""
        return self.layers if self.moe is None else self.moe.dense_layers

    @property
    def moe_layer_count(self) -> int:
        return self.layers - self.dense_layer_count

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.dense_layers

    # attention -----------------------------------------------------------
    @property
    def attention_matmul_params(self) -> int:
        """Weights of one layer's attention matrix multiplies (MHA/GQA: QKV and output; MLA: down, up, output)."""
        h, at = self.hidden, self.attention
        if at.kind == "mla":
            qk = at.qk_nope_head_dim + at.qk_rope_head_dim
            q = (h * at.q_lora_rank + at.q_lora_rank * self.heads * qk) if at.q_lora_rank else h * self.heads * qk
            kv = h * (at.kv_lora_rank + at.qk_rope_head_dim) + \
                at.kv_lora_rank * self.heads * (at.qk_nope_head_dim + at.v_head_dim)
            return q + kv + self.heads * at.v_head_dim * h
        return h * (self.q_width + 2 * self.kv_width) + self.q_width * h

    @property
    def qkv_bias_params(self) -> int:
        """Biases of one layer's query, key and value projections (column-parallel: split by tp): q_width + 2 kv_width
        with ``bias``, ``qkv_bias`` or ``attention_bias`` in multi-head attention, else 0."""
        biased = self.bias or self.qkv_bias or self.attention_bias
        return self.q_width + 2 * self.kv_width if biased and self.attention.kind == "mha" else 0

    @property
    def out_bias_params(self) -> int:
        """The attention output projection's bias (row-parallel: replicated over tp): hidden with ``bias`` or
        ``attention_bias`` in multi-head attention, else 0."""
        return self.hidden if (self.bias or self.attention_bias) and self.attention.kind == "mha" else 0

    @property
    def mlp_biased(self) -> bool:
        """The MLP's linears (a dense layer's, or GPT-OSS's experts') carry biases: ``bias`` or ``mlp_bias``."""
        return self.bias or self.mlp_bias

    @property
    def attention_other_params(self) -> int:
        """Attention weights that do no matrix multiply: biases, QK-norms, MLA's latent norms, sinks."""
        at = self.attention
        n = self.qkv_bias_params + self.out_bias_params
        if self.qk_norm:
            n += 2 * self.head_size
        if at.kind == "mla":
            n += (at.q_lora_rank or 0) + at.kv_lora_rank
        if at.sinks:
            n += self.heads
        return n

    # MLPs ----------------------------------------------------------------
    def _mlp_params(self, width: int) -> int:
        return self.mlp_matrices * self.hidden * width

    def _mlp_bias(self, width: int) -> int:
        return width * (self.mlp_matrices - 1) + self.hidden if self.mlp_biased else 0

    @property
    def expert_params(self) -> int:
        """One routed expert: its matrices (and biases, GPT-OSS)."""
        f = self.moe.expert_ffn_hidden
        return self._mlp_params(f) + self._mlp_bias(f)

    @property
    def router_params(self) -> int:
        moe = self.moe
        return moe.experts * self.hidden + (moe.experts if moe.router_bias else 0)

    @property
    def shared_expert_params(self) -> int:
        """All shared experts of one MoE layer (no biases in the families that have them: DeepSeek, Qwen2-MoE)."""
        return self.moe.shared_experts * self._mlp_params(self.moe.shared_width)

    @property
    def matmul_params_per_layer(self) -> int:
        """Weights of one dense block's matrix multiplies: QKV, attention output, the MLP matrices."""
        return self.attention_matmul_params + self._mlp_params(self.ffn_hidden)

    def model_copy(self, *, update=None, deep: bool = False) -> ModelSpec:
        """pydantic's copy, without the cached per-layer count: an update of a size field would keep the old one."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("params_per_layer", None)
        return copy

    @cached_property
    def params_per_layer(self) -> int:
        """Weights of one dense block: attention, MLP, two norms (and biases if any)."""
        return self.matmul_params_per_layer + 2 * self.norm_params + self.attention_other_params + \
            self._mlp_bias(self.ffn_hidden)

    @property
    def moe_layer_params_dense_part(self) -> int:
        """Weights of one MoE block outside the routed experts: attention, norms, router, shared experts."""
        return self.attention_matmul_params + self.attention_other_params + 2 * self.norm_params + \
            self.router_params + self.shared_expert_params

    @property
    def moe_layer_params(self) -> int:
        return self.moe_layer_params_dense_part + self.moe.experts * self.expert_params

    @property
    def moe_layer_active_params(self) -> int:
        return self.moe_layer_params_dense_part + self.moe.top_k * self.expert_params

    # whole model ---------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden + self.position_embeddings * self.hidden

    @property
    def output_params(self) -> int:
        """Final norm plus the output projection (absent when tied)."""
        return self.norm_params + (0 if self.tied_embeddings else self.vocab * self.hidden)

    @property
    def mtp_module_params(self) -> int:
        """One DeepSeek-V3 multi-token-prediction module without the embedding and head it shares with the main
        model: two norms (enorm, hnorm), the projection of the concatenation [2h -> h], one layer of the kind
        the main model ends with, its output norm (DeepSeek-V3 README_WEIGHTS.md; moe.md section 1.3)."""
        h = self.hidden
        last = self.moe_layer_params if self.moe is not None else self.params_per_layer
        return 2 * self.norm_params + 2 * h * h + last + self.norm_params

    @property
    def params_main(self) -> int:
        """Weights of the main model, without multi-token-prediction modules."""
        body = self.dense_layer_count * self.params_per_layer
        if self.moe is not None:
            body += self.moe_layer_count * self.moe_layer_params
        return body + self.embedding_params + self.output_params

    @property
    def params_total(self) -> int:
        """Every weight trained: the main model plus its MTP modules."""
        return self.params_main + self.mtp_layers * self.mtp_module_params

    @property
    def params_active(self) -> int:
        """Weights one token passes through in the main model: all but the routed experts it is not sent to,
        embedding table and output layer included (the Mixtral and Qwen3 cards' convention)."""
        if self.moe is None:
            return self.params_main
        return self.params_main - self.moe_layer_count * (self.moe.experts - self.moe.top_k) * self.expert_params

    @property
    def expert_params_total(self) -> int:
        """Routed-expert weights of the whole model (MTP modules included)."""
        if self.moe is None:
            return 0
        return (self.moe_layer_count + self.mtp_layers) * self.moe.experts * self.expert_params
