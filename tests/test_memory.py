"""The memory ledger (issue 2, deliverable 7) against published figures and formulas.

Sources of the expected values:
- the reference article (../shared/reference/README.md), rules 2 and 16;
- Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
  Models" (arXiv:1910.02054), Figure 1 and Sec. 5: Psi = 7.5B, Nd = 64, K = 12;
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv:2205.05198), Sec. 4.1-4.3 and Table 2, evaluated on a GPT-3 175B layer.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO, make_scenario, run_cli

from simtrain.plan.activations import activation_bytes_per_layer
from simtrain.plan.memory import (
    inflight_microbatches,
    local_params,
    stage_memory,
    state_bytes_per_param,
)

PP4_DP4 = str(REPO / "scenarios" / "pp4_dp4.yaml")

# GPT-3 175B layer (Brown et al. 2020, Table 2.1) with the Korthikanti setting s=2048, b=1, t=8
S, B, H, A, T = 2048, 1, 12288, 96, 8
SBH = S * B * H


def _static(st) -> float:
    return st.params + st.grads + st.optimizer


# --- static state: reference article and ZeRO paper --------------------------------------------

def test_mixed_precision_adam_is_16_bytes_per_parameter():
    """Mixed-precision Adam: 2 (weights) + 2 (grads) + 12 (fp32 master, m, v) bytes (ZeRO Sec. 3.1)."""
    sb = state_bytes_per_param("bf16", "adam")
    assert (sb.weights, sb.grads, sb.optimizer) == (2, 2, 12)
    assert sb.weights + sb.grads + sb.optimizer == 16


def test_7b_parameters_need_112_gb_static():
    """Reference article rule 2: 7e9 parameters x 16 bytes = 112 GB before activations."""
    sb = state_bytes_per_param("bf16", "adam")
    assert 7e9 * (sb.weights + sb.grads + sb.optimizer) == pytest.approx(112e9)


@pytest.mark.parametrize(("preset", "gb"), [("llama2-7b", 107.8), ("llama2-13b", 208.3)])
def test_single_device_static_is_16_bytes_per_parameter(preset, gb):
    """Unsharded, one device holds 16 bytes per model parameter (reference article rules 2 and 16: 13B -> 208 GB)."""
    s = make_scenario(model=preset, training={"seq_len": 1024, "global_batch": 1})
    st = stage_memory(s, 0)
    assert _static(st) == 16 * s.model.params_total
    assert _static(st) / 1e9 == pytest.approx(gb, abs=0.05)


def test_13b_over_four_stages_is_about_52_gb_each():
    """Reference article rule 16: 13B over PP=4 holds about 208/4 = 52 GB static per stage."""
    s = make_scenario(model="llama2-13b", training={"seq_len": 1024, "global_batch": 4}, parallel={"pp": 4})
    stages = [stage_memory(s, p) for p in range(4)]
    assert sum(_static(st) for st in stages) == 16 * s.model.params_total   # nothing lost, nothing doubled
    for st in stages:
        assert _static(st) / 1e9 == pytest.approx(52, rel=0.05)


# Psi = 7,500,075,008: a Llama-shaped model sized to the ZeRO paper's 7.5B (within 0.002%)
ZERO_MODEL = {"layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 12945, "vocab": 32000, "mlp": "swiglu"}


@pytest.mark.parametrize(("zero", "paper_gb", "bytes_per_param"), [
    (0, 120.0, 2 + 2 + 12),             # baseline (2 + 2 + K) Psi
    (1, 31.4, 2 + 2 + 12 / 64),         # P_os: 2 Psi + 2 Psi + K Psi / Nd
    (2, 16.6, 2 + (2 + 12) / 64),       # P_os+g: 2 Psi + (2 + K) Psi / Nd
    (3, 1.9, (2 + 2 + 12) / 64),        # P_os+g+p: (2 + 2 + K) Psi / Nd
])
def test_zero_paper_figure_1(zero, paper_gb, bytes_per_param):
    """ZeRO Figure 1: Psi = 7.5B, Nd = 64 -> 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per device."""
    s = make_scenario(nodes=8, model=ZERO_MODEL, training={"seq_len": 512, "global_batch": 64},
                      parallel={"dp": 64, "zero": zero})
    psi = s.model.params_total
    assert psi == pytest.approx(7.5e9, rel=2e-5)
    st = stage_memory(s, 0)
    assert _static(st) == pytest.approx(bytes_per_param * psi, rel=1e-12)
    assert round(_static(st) / 1e9, 1) == paper_gb


@pytest.mark.parametrize(("zero", "bytes_per_param"), [
    (0, 18),                # "bf16 param, fp32 grads", non-distributed optimizer: 18
    (1, 6 + 12 / 64),       # distributed optimizer (optimizer state sharded): 6 + 12/d
])
def test_fp32_gradients_megatron_table(zero, bytes_per_param):
    """bf16 weights with fp32 gradients (Megatron-LM's bf16 default, FSDP reduce_dtype=float32): Megatron-LM
    README, distributed optimizer table, "bf16 param, fp32 grads": 18 bytes per parameter, 6 + 12/d sharded."""
    s = make_scenario(nodes=8, model=ZERO_MODEL, training={"seq_len": 512, "global_batch": 64, "grad_dtype": "fp32"},
                      parallel={"dp": 64, "zero": zero})
    st = stage_memory(s, 0)
    assert _static(st) == pytest.approx(bytes_per_param * s.model.params_total, rel=1e-12)


@pytest.mark.parametrize("grad_dtype", ["auto", "fp32"])
def test_fsdp1_zero3_keeps_full_precision_shards(grad_dtype):
    """PyTorch FSDP FULL_SHARD with bf16 compute keeps the sharded parameter in fp32 (it is the optimizer's master)
    and upcasts the gradient shard to fp32 (MixedPrecision docs): 4 + 4 + 8 (Adam m, v) = 16 bytes per parameter
    over d, whatever the reduce dtype; the generic ledger with fp32 gradients holds 2 + 4 + 12 = 18 over d."""
    kw = dict(nodes=8, model=ZERO_MODEL, training={"seq_len": 512, "global_batch": 64, "grad_dtype": grad_dtype})
    fsdp1 = stage_memory(make_scenario(**kw, parallel={"dp": 64, "zero": 3, "zero_impl": "fsdp1"}), 0)
    psi = 7_500_075_008
    assert _static(fsdp1) == pytest.approx(16 * psi / 64, rel=1e-12)
    assert (fsdp1.params, fsdp1.grads, fsdp1.optimizer) == pytest.approx((4 * psi / 64, 4 * psi / 64, 8 * psi / 64))


# --- activations: Korthikanti et al. 2022 --------------------------------------------------------

def _act(**kw) -> float:
    return activation_bytes_per_layer(S, B, H, A, **kw)


def test_activations_no_parallelism():
    """Korthikanti Eq. 1: sbh(34 + 5as/h) bytes per layer without parallelism."""
    assert _act(t=1) == pytest.approx(SBH * (34 + 5 * A * S / H), rel=1e-12)


def test_activations_tensor_parallel():
    """Korthikanti Eq. 2: sbh(10 + 24/t + 5as/(ht)) with TP alone (norms and dropouts replicated)."""
    assert _act(t=T) == pytest.approx(SBH * (10 + 24 / T + 5 * A * S / (H * T)), rel=1e-12)


def test_activations_tensor_and_sequence_parallel():
    """Korthikanti Eq. 4: sbh(34 + 5as/h)/t with TP and sequence parallelism."""
    assert _act(t=T, sequence_parallel=True) == pytest.approx(SBH * (34 + 5 * A * S / H) / T, rel=1e-12)


@pytest.mark.parametrize("how", ["flash", "selective"])
def test_activations_without_attention_scores(how):
    """Korthikanti Table 2: selective recompute (or flash attention) drops the 5as/h term: sbh(10 + 24/t), sbh 34/t."""
    kw = {"attention_scores": False} if how == "flash" else {"recompute": "selective"}
    assert _act(t=T, **kw) == pytest.approx(SBH * (10 + 24 / T), rel=1e-12)
    assert _act(t=T, sequence_parallel=True, **kw) == pytest.approx(SBH * 34 / T, rel=1e-12)
    assert _act(t=1, **kw) == pytest.approx(SBH * 34, rel=1e-12)


def test_activations_without_dropout():
    """Without dropout (p = 0: PyTorch's dropout returns its input, no mask is made) Korthikanti's terms lose the
    two 1-byte masks, 2sbh of the replicated 10sbh, and the scores keep only the softmax output, 2as^2b of 5as^2b:
    sbh(32 + 2as/h) with no parallelism, sbh(8 + 24/t + 2as/(ht)) with TP alone."""
    assert _act(t=1, dropout=False) == pytest.approx(SBH * (32 + 2 * A * S / H), rel=1e-12)
    assert _act(t=T, dropout=False) == pytest.approx(SBH * (8 + 24 / T + 2 * A * S / (H * T)), rel=1e-12)
    assert _act(t=T, dropout=False, attention_scores=False) == pytest.approx(SBH * (8 + 24 / T), rel=1e-12)


def test_activations_full_recompute():
    """Korthikanti Table 2: full recompute keeps only each layer's input, 2sbh."""
    assert _act(t=T, recompute="full") == pytest.approx(2 * SBH, rel=1e-12)
    assert _act(t=1, recompute="full") == pytest.approx(2 * SBH, rel=1e-12)


def test_gpt3_layer_activation_figure():
    """On the GPT-3 layer, TP=8 without SP keeps 10 + 3 + 40 = 53 sbh (5as/(ht) = 5*96*2048/(12288*8) = 10)."""
    assert 5 * A * S / (H * T) == 10
    assert _act(t=T) / SBH == pytest.approx(10 + 3 + 10)


def _gpt3_stage_scenario(**training):
    """A 6-layer GPT-3-shaped model on pp=3 x tp=8 (24 GPUs): stage 1 holds two plain layers."""
    model = {"layers": 6, "hidden": H, "heads": A, "ffn_hidden": 4 * H, "vocab": 51200, "mlp": "gelu"}
    tr = {"seq_len": S, "micro_batch": B, "global_batch": 3, "flash_attention": False, **training}
    return model, tr


@pytest.mark.parametrize(("sp", "training", "per_layer"), [
    (False, {}, 10 + 24 / T + 5 * A * S / (H * T)),
    (True, {}, (34 + 5 * A * S / H) / T),
    (False, {"flash_attention": True}, 10 + 24 / T),
    (True, {"recompute": "selective"}, 34 / T),
])
def test_stage_uses_korthikanti_per_layer(sp, training, per_layer):
    """A middle stage's activations per micro-batch are its layers x the Korthikanti per-layer formula."""
    model, tr = _gpt3_stage_scenario(**training)
    s = make_scenario(nodes=3, model=model, training=tr, parallel={"tp": T, "pp": 3, "sequence_parallel": sp})
    st = stage_memory(s, 1)
    assert st.layers == 2
    assert st.activation_per_microbatch == pytest.approx(2 * SBH * per_layer, rel=1e-12)


def test_first_and_last_stage_extra_activations():
    """Korthikanti Sec. 4.3 (with SP): embedding dropout sbh/t on stage 0; output layer and loss 4sbh/t (1 + v/h)
    last."""
    model, tr = _gpt3_stage_scenario()
    s = make_scenario(nodes=3, model=model, training=tr, parallel={"tp": T, "pp": 3, "sequence_parallel": True})
    first, middle, last = (stage_memory(s, p).activation_per_microbatch for p in range(3))
    v = model["vocab"]
    assert first - middle == pytest.approx(SBH / T, rel=1e-9)
    assert last - middle == pytest.approx(4 * SBH / T * (1 + v / H), rel=1e-9)


# --- micro-batches in flight --------------------------------------------------------------------

@pytest.mark.parametrize(("m", "p"), [(8, 4), (2, 4), (16, 8)])
def test_inflight_gpipe_and_1f1b(m, p):
    """GPipe holds all m micro-batches; 1F1B holds min(m, p - stage) (Narayanan et al. 2021, Sec. 2.2.1)."""
    for stage in range(p):
        assert inflight_microbatches("gpipe", m, p, stage) == m
        assert inflight_microbatches("1f1b", m, p, stage) == min(m, p - stage)


@pytest.mark.parametrize(("p", "v"), [(4, 2), (8, 4), (2, 3)])
def test_inflight_interleaved_stage0(p, v):
    """Interleaved 1F1B: stage 0 holds p x (1 + (p-1)/(p v)) micro-batches' worth (Korthikanti Sec. 4.2.3)."""
    assert inflight_microbatches("interleaved-1f1b", 4 * p, p, 0, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_stage_activations_scale_with_inflight():
    """A stage's activation total is its per-micro-batch activations x micro-batches in flight."""
    for schedule, expected in (("gpipe", 8), ("1f1b", 4)):
        s = make_scenario(model="llama2-7b", training={"seq_len": 1024, "global_batch": 8},
                          parallel={"pp": 4, "schedule": schedule})
        st = stage_memory(s, 0)
        assert st.inflight == expected
        assert st.activations == pytest.approx(expected * st.activation_per_microbatch)


# --- where the parameters live ------------------------------------------------------------------

def test_stage0_holds_embedding_last_holds_output_layer():
    """Stage 0 adds the V x h embedding; the last stage the V x h output layer and the final norm (h)."""
    s = make_scenario(model="llama2-13b", training={"seq_len": 1024, "global_batch": 4}, parallel={"pp": 4})
    v, h, f = 32000, 5120, 13824
    per_layer = 4 * h * h + 3 * h * f + 2 * h     # attention + SwiGLU MLP + two RMSNorms
    counts = [local_params(s, p)[0] for p in range(4)]
    assert counts[1] == counts[2] == 10 * per_layer
    assert counts[0] == 10 * per_layer + v * h
    assert counts[3] == 10 * per_layer + v * h + h


# --- the command -------------------------------------------------------------------------------

def test_memory_command_prints_a_table(capsys):
    """`simtrain memory scenarios/pp4_dp4.yaml` prints one row per stage and the verdict."""
    code, out, err = run_cli(["memory", PP4_DP4], capsys)
    assert code == 0
    rows = [ln for ln in out.splitlines() if ln.split()[:1] in (["0"], ["1"], ["2"], ["3"])]
    assert len(rows) == 4
    assert "stage" in out and ("fits" in out.lower())


def test_memory_json_report(tmp_path, capsys):
    """--json writes params_total, gpus, fits_in_memory, peak_memory_bytes_max and one device entry per GPU."""
    path = tmp_path / "mem.json"
    code, _, _ = run_cli(["memory", PP4_DP4, "--json", str(path)], capsys)
    assert code == 0
    d = json.loads(path.read_text())
    assert d["params_total"] == 13_015_864_320   # llama2-13b, published
    assert d["gpus"] == 16 and isinstance(d["fits_in_memory"], bool)
    assert len(d["devices"]) == 16
    for dev in d["devices"]:
        r = dev["rank"]
        assert (dev["tp"], dev["dp"], dev["pp"]) == (0, r % 4, r // 4)   # tp=1: rank = dp + 4 pp
        assert dev["node"] == r // 8
        assert set(dev["memory"]) == {"params", "grads", "optimizer", "activations", "other"}
        assert dev["peak_memory_bytes"] == pytest.approx(sum(dev["memory"].values()), abs=5)
    assert d["peak_memory_bytes_max"] == max(dev["peak_memory_bytes"] for dev in d["devices"])


def test_not_fitting_is_an_answer(tmp_path, capsys):
    """A layout that does not fit exits 0 with fits_in_memory false and names the dominant part."""
    path = tmp_path / "mem.json"
    code, out, _ = run_cli(["memory", PP4_DP4, "--set", "parallel.pp=1", "--set", "parallel.dp=16",
                            "--set", "parallel.zero=0", "--json", str(path)], capsys)
    assert code == 0
    d = json.loads(path.read_text())
    assert d["fits_in_memory"] is False
    # unsharded Adam state: 12 x 13.0e9 = 156 GB, the largest part of a 208 GB static ledger
    assert "optimizer" in out and "NOT FIT" in out.upper()
    assert d["advice"], "a non-fitting report says what would relieve it"


def _llama13b_loss_activations(cross_entropy: str) -> float:
    """Activation bytes of llama2-13b's single stage on dgx-h100 (4,096 tokens, one micro-batch, ZeRO-3 over 8)."""
    from simtrain import scenario_from_dict
    from simtrain.plan.memory import stage_memory

    sc = {"name": "ce", "hardware": "dgx-h100", "model": "llama2-13b",
          "training": {"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "cross_entropy": cross_entropy},
          "parallel": {"dp": 8, "zero": 3}}
    return stage_memory(scenario_from_dict(sc), 0).activations


def test_fused_loss_keeps_16bit_logits_instead_of_fp32_log_softmax():
    """The last stage keeps 4·s·b·V/t bytes for the eager loss (its fp32 log_softmax output) and 2·s·b·V/t for
    the fused kernel (the bf16 logits), and the loss's peak adds 8·s·b·V/t (eager: the fp32 gradients of the
    log-probabilities and of the logits) or 2·s·b·V/t (fused: the bf16 gradient of the logits): the difference is
    (4 + 8 - 2 - 2)·s·b·V/t = 8 x 4096 x 1 x 32000 = 1,048,576,000 B for llama2-13b at t = 1, one micro-batch in
    flight (p = 1)."""
    assert _llama13b_loss_activations("eager") - _llama13b_loss_activations("fused") \
        == 8 * 4096 * 1 * 32000 == 1_048_576_000


def test_vocab_parallel_loss_keeps_fp32_softmax_and_peaks_e_plus_4_above_it():
    """Megatron-LM's and nanotron's vocab-parallel loss keeps its fp32 softmax (4·s·b·V/t, as the eager loss keeps its
    log-softmax) and peaks (e + 4)·s·b·V/t above it (the zero-bubble fork's forward: the bf16 logits, their fp32 copy
    and the out-of-place max-subtracted copy that becomes the softmax), against the eager loss's 8: the difference is
    (8 - 2 - 4)·s·b·V/t = 2 x 4096 x 32000 = 262,144,000 B for llama2-13b at t = 1, one micro-batch in flight."""
    assert _llama13b_loss_activations("eager") - _llama13b_loss_activations("vocab_parallel") \
        == 2 * 4096 * 1 * 32000 == 262_144_000


# --- torchtitan's op-level selective checkpointing (training.recompute: selective_op) ---------------------------

def test_op_policy_keeps_63616_bytes_per_token_of_a_llama3_8b_layer():
    """torchtitan's op SAC keeps the layer input, q, v, w1 and w2 outputs, the flash attention output and its fp32
    log-sum-exp: 2(4h + kv + f) + 4a bytes per token. Llama 3.1 8B (h 4096, kv 1024, f 14336, a 32):
    2 x (16384 + 1024 + 14336) + 128 = 63,616 B, against 12h + 4kv + 6f = 139,264 B with Megatron's selective
    recompute (no dropout)."""
    s, b, h, a, kv, f = 8192, 2, 4096, 32, 1024, 14336
    op = activation_bytes_per_layer(s, b, h, a, ffn=f, kv=kv, mlp="swiglu", attention_scores=False,
                                    recompute="selective_op", dropout=False)
    sel = activation_bytes_per_layer(s, b, h, a, ffn=f, kv=kv, mlp="swiglu", attention_scores=False,
                                     recompute="selective", dropout=False)
    assert op == pytest.approx(63616 * s * b, rel=1e-12)
    assert sel == pytest.approx(139264 * s * b, rel=1e-12)


def test_op_policy_stage_holds_every_layer_kept_plus_one_layer_recomputed():
    """At the peak a rank holds what every layer kept, the final-norm and output-layer inputs (4 s b h) and the
    eager loss's fp32 log-softmax output (4 s b V), plus the larger of two short-lived peaks: the rest of one layer's
    activations while it is recomputed (full - kept) and the loss's own peak (8 s b V). Here s b = 1024, h = 1024,
    V = 1000: full - kept > 8 s b V = 8,192,000 B."""
    model = {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 2, "ffn_hidden": 3584, "vocab": 1000,
             "mlp": "swiglu"}
    training = {"seq_len": 512, "micro_batch": 2, "global_batch": 2, "recompute": "selective_op", "dropout": False}
    st = stage_memory(make_scenario(model=model, training=training), 0)
    kw = dict(ffn=3584, kv=256, mlp="swiglu", attention_scores=False, dropout=False)
    kept = activation_bytes_per_layer(512, 2, 1024, 8, recompute="selective_op", **kw)
    full = activation_bytes_per_layer(512, 2, 1024, 8, **kw)
    edge = 4 * 1024 * 1024 + 4 * 1024 * 1000                 # by hand: 8,290,304 B
    assert full - kept > 8 * 1024 * 1000
    assert st.activations == pytest.approx(4 * kept + edge + (full - kept), rel=1e-12)


def test_eager_loss_peak_of_llama3_8b_at_16k_tokens():
    """PyTorch's composite cross entropy on fp32 logits: at its backward the log-softmax output, the gradient of the
    log-probabilities and the gradient of the logits, 4 + 4 + 4 = 12 bytes per logit, of which the 4 kept are
    already in the ledger. Llama 3.1 8B, s = 8192, b = 2, V = 128,256, t = 1: 8 x 16384 x 128256 = 16.81 GB above
    the kept terms, on the last stage only."""
    from simtrain.plan.activations import loss_transient_bytes_per_logit
    assert loss_transient_bytes_per_logit("eager", 2.0) == 8.0
    assert loss_transient_bytes_per_logit("fused", 2.0) == 2.0
    model = {"layers": 2, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "vocab": 128256,
             "mlp": "swiglu"}
    sc = make_scenario(model=model, training={"seq_len": 8192, "micro_batch": 2, "global_batch": 2, "dropout": False},
                       parallel={"pp": 2})
    first, last = stage_memory(sc, 0), stage_memory(sc, 1)
    kept_last = last.activation_per_microbatch * last.inflight
    assert last.activations - kept_last == pytest.approx(8 * 16384 * 128256, rel=1e-12)
    assert 8 * 16384 * 128256 == pytest.approx(16.81e9, rel=1e-3)
    assert first.activations == pytest.approx(first.activation_per_microbatch * first.inflight, rel=1e-12)


def test_gpipe_out_of_memory_advice_names_1f1b(capsys):
    """GPipe keeps all m micro-batches' activations until the backward, 1F1B at most p on the first stage
    (Narayanan et al. 2021, Sec. 2.2.1): pp4_dp4 under GPipe with m = 256 / (1 x 4) = 64 micro-batches holds
    64 x 10 layers x 717.2 MB (docs/model.md 10.1, by hand) = 459 GB of activations on a stage, far beyond
    85.5 GB; the advice names the schedule first, and the same run under 1F1B fits."""
    code, out, _ = run_cli(["memory", PP4_DP4, "--set", "parallel.schedule=gpipe",
                            "--set", "training.global_batch=256"], capsys)
    assert code == 0 and "NOT FIT" in out.upper()
    assert "switch to 1F1B (parallel.schedule: 1f1b)" in out
    code, out, _ = run_cli(["memory", PP4_DP4, "--set", "training.global_batch=256"], capsys)
    assert code == 0 and "NOT FIT" not in out.upper()


def test_memory_report_says_what_other_is_and_times_nothing(capsys):
    """`simtrain memory --json`: a stage has no compute or bubble time (nothing was simulated), and its
    other_detail parts add up to its 'other'; the text names the parts on the peak stage."""
    from conftest import REPO, run_cli

    code, out, _ = run_cli(["memory", str(REPO / "scenarios" / "tp8_llama3_70b.yaml"), "--json", "-"], capsys)
    assert code == 0
    report = json.loads(out)
    for stage in report["stages"]:
        assert "compute_s" not in stage and "bubble_s" not in stage
        assert abs(sum(stage["other_detail"].values()) - stage["memory"]["other"]) <= len(stage["other_detail"])
    code, out, _ = run_cli(["memory", str(REPO / "scenarios" / "tp8_llama3_70b.yaml")], capsys)
    assert "other (stage 0): allocator fragmentation" in out
