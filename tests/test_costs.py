"""Per-operation cost functions checked against hand calculations (issue 6, item 7)."""

import pytest

from simtrain.plan import costs, unfused_attention
from simtrain.plan.device import Device
from simtrain.spec.hardware import ComputeModel, GpuSpec

PEAK = 100e12        # FLOP/s, round numbers so the hand calculations below are easy to follow
HBM = 1e12           # bytes/s


def device(**compute) -> Device:
    gpu = GpuSpec(name="test", memory="80 GB", memory_bandwidth=HBM, peak_flops={"bf16": PEAK})
    return Device(gpu=gpu, compute=ComputeModel(**compute), dtype="bf16")


def test_large_gemm_is_flops_over_peak_times_efficiency_plus_overhead():
    """A compute-bound GEMM takes 2MNK / (peak x efficiency) + one launch overhead."""
    dev = device(gemm_efficiency=0.8, kernel_overhead=2e-6)
    m = n = k = 8192
    expected = 2 * 8192**3 / (100e12 * 0.8) + 2e-6          # 1.37439e-2 s + 2 us
    assert dev.gemm_time(m, n, k) == pytest.approx(expected, rel=1e-12)


def test_skinny_gemm_is_memory_bound():
    """With K = 8 a GEMM is bound by HBM: bytes (2 per element of A, B and C) / (bandwidth x efficiency)."""
    dev = device(memory_efficiency=0.5)
    m, n, k = 65536, 65536, 8
    nbytes = 2 * (m * k + k * n + m * n)                      # 8.59e9 bytes, dominated by C
    assert dev.gemm_time(m, n, k) == pytest.approx(nbytes / (1e12 * 0.5), rel=1e-12)


def test_gemm_curve_hits_its_points_and_interpolates_in_log_size():
    """A measured curve is reproduced at its points and is linear in log(size) between them."""
    dev = device(gemm_curve=[[1024, 0.2], [4096, 0.8]])
    assert dev.gemm_efficiency(1024, 1024, 1024) == pytest.approx(0.2)
    assert dev.gemm_efficiency(4096, 4096, 4096) == pytest.approx(0.8)
    # 2048 is half-way between 1024 and 4096 in log2: 0.2 + 0.5 x 0.6 = 0.5
    assert dev.gemm_efficiency(2048, 2048, 2048) == pytest.approx(0.5)
    assert dev.gemm_efficiency(16384, 16384, 16384) == pytest.approx(0.8)   # flat beyond the last point


def test_parametric_gemm_curve_is_half_at_half_size():
    """eff = best x g^3 / (g^3 + g_half^3): exactly half of the best at g = g_half."""
    dev = device(gemm_efficiency=0.8, gemm_half_size=1500)
    assert dev.gemm_efficiency(1500, 1500, 1500) == pytest.approx(0.4)


def gpt_shape(h=12288, s=2048, b=1, t=1, flash=True):
    return costs.LayerShape(tokens=b * s, seq=s, batch=b, hidden=h, ffn=4 * h, heads=96, kv_width=h,
                            mlp_matrices=2, tp=t, sequence_parallel=False, flash=flash)


def test_gpt_layer_forward_flops_match_narayanan_eq():
    """A GPT layer's forward is 24 b s h^2 + 4 b s^2 h FLOP (Narayanan et al. 2021, Sec. 5.1 derivation)."""
    sh = gpt_shape()
    lc = costs.layer_cost(sh, device(), "none")
    b, s, h = 1, 2048, 12288
    assert lc.model_flops == pytest.approx(24 * b * s * h**2 + 4 * b * s**2 * h, rel=1e-12)


def test_tensor_parallel_splits_the_gemms():
    """With TP = 8 each rank does 1/8 of the layer's FLOP (Megatron column/row split)."""
    full = costs.layer_cost(gpt_shape(t=1), device(), "none").model_flops
    shard = costs.layer_cost(gpt_shape(t=8), device(), "none").model_flops
    assert shard == pytest.approx(full / 8, rel=1e-12)


def test_backward_gemms_take_twice_the_forward():
    """Backward runs two GEMMs (data and weight gradient) per forward GEMM: 2x the time at flat efficiency."""
    sh = gpt_shape()
    dev = device(gemm_efficiency=0.5)
    fwd = sum(dev.gemm_time(*g) for g in costs.gemm_shapes(sh))
    bwd = sum(dev.gemm_time(m, k, n) + dev.gemm_time(k, n, m) for m, n, k in costs.gemm_shapes(sh))
    assert bwd == pytest.approx(2 * fwd, rel=1e-12)


def test_flash_attention_executes_half_the_causal_flops():
    """Causal flash attention runs 4bs^2h/2 FLOP forward and 2.5x that backward (Dao 2023)."""
    dev = device(attention_efficiency=0.5)
    sh = gpt_shape(h=4096, s=4096)
    executed = 4 * 1 * 4096**2 * 4096 / 2
    assert dev.attention_time(executed, 4096) == pytest.approx(executed / (100e12 * 0.5), rel=1e-12)
    # the attention curve: best x s / (s + s_half): at s = s_half it is half the best
    dev2 = device(attention_efficiency=0.6, attention_half_seq=1024)
    assert dev2.attention_efficiency(1024) == pytest.approx(0.3)
    assert costs.attention_flops(sh) == pytest.approx(4 * 4096**2 * 4096)


def test_other_flash_kernels_scale_the_flashattention2_curve():
    """A FlashAttention-1-class kernel at 0.55 of FlashAttention-2 (a synthetic speed; the hardware files carry the
    measured 0.44 and 0.42) takes 1/0.55 of the time; the kernel's factor comes from the hardware file, the scenario
    picks it."""
    compute = ComputeModel(attention_efficiency=0.6, attention_half_seq=1024, attention_kernels={"flash1": 0.55})
    assert compute.attention_speed("flash1") == 0.55
    assert compute.attention_speed("flash2") == 1.0 and compute.attention_speed("none") == 1.0
    gpu = GpuSpec(name="test", memory="80 GB", memory_bandwidth=HBM, peak_flops={"bf16": PEAK})
    fa1 = Device(gpu=gpu, compute=compute, dtype="bf16", attention_speed=compute.attention_speed("flash1"))
    executed = 4 * 1 * 1024**2 * 4096 / 2   # causal forward, b=1, s=1024, h=4096
    # hand: 0.6 x 1024 / (1024 + 1024) = 0.3 of peak for FlashAttention-2; x 0.55 = 0.165 for flash1
    assert fa1.attention_time(executed, 1024) == pytest.approx(executed / (100e12 * 0.165), rel=1e-12)


def test_full_recompute_repeats_the_forward_and_selective_only_attention():
    """Full recompute adds one forward; selective adds only the attention core (Korthikanti et al. 2022)."""
    sh = gpt_shape(flash=True)
    dev = device(gemm_efficiency=0.7, attention_efficiency=0.4)
    none = costs.layer_cost(sh, dev, "none")
    full = costs.layer_cost(sh, dev, "full")
    sel = costs.layer_cost(sh, dev, "selective")
    assert full.recompute == pytest.approx(none.forward)
    executed = costs.attention_flops(sh) / 2
    assert sel.recompute == pytest.approx(executed / (100e12 * 0.4))
    assert full.hardware_flops == pytest.approx(4 * none.model_flops)   # HFU counts 4 forwards (PaLM App. B)


def test_adam_step_moves_28_bytes_per_parameter():
    """Mixed-precision Adam reads 14 B and writes 14 B per local parameter: memory-bound."""
    dev = device(memory_efficiency=0.8)
    assert costs.optimizer_time(1e9, "adam", dev) == pytest.approx(28e9 / (1e12 * 0.8), rel=1e-12)
    # fp32 gradients with bf16 weights (training.grad_dtype: fp32) are read at 4 bytes: 12 + 4 read, 12 + 2 written
    assert costs.optimizer_time(1e9, "adam", dev, 2.0) == pytest.approx(30e9 / (1e12 * 0.8), rel=1e-12)


def test_pure_fp32_adam_step_moves_28_bytes_per_parameter():
    """fp32 training, fp32 gradients: read w, g, m, v (16 B), write w, m, v (12 B) = 28 B, as the plan charges it."""
    from conftest import make_scenario

    from simtrain.plan.build import build_plan
    s = make_scenario(model="llama2-7b", training={"seq_len": 512, "global_batch": 1, "precision": "fp32"})
    n = s.model.params_total
    dev = Device(gpu=s.hardware.gpu, compute=s.hardware.compute, dtype="fp32")
    assert build_plan(s).optimizer_time[0] == pytest.approx(dev.memory_time(28.0 * n, kernels=4), rel=1e-12)


def test_mfu_flops_per_token_match_narayanan_eq3_without_recompute():
    """6N + 12Lhs per token, N = GEMM weights, equals 72 l h^2 (1 + s/6h + V/12lh) exactly
    (Narayanan et al. 2021 Eq. 3 divided by the tokens of a batch, without the recompute factor)."""
    from simtrain import scenario_from_dict
    from simtrain.plan.flops import model_flops_per_token

    sc = scenario_from_dict({"hardware": "dgx-a100", "nodes": 128, "model": "gpt3-175b",
                             "training": {"seq_len": 2048, "global_batch": 1024},
                             "parallel": {"dp": 16, "tp": 8, "pp": 8}})
    l, h, s, v = 96, 12288, 2048, 50257
    eq3 = 72 * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert model_flops_per_token(sc) == pytest.approx(eq3, rel=1e-12)


@pytest.mark.parametrize("kernel, fwd_bytes, bwd_bytes", [
    # eager fp32 path: cast (2 + 4), log_softmax (4 + 4) | nll grad 4, log_softmax backward 4 + 4 + 4, cast back 4 + 2
    ("eager", 14, 22),
    # fused kernel: read the bf16 logits | read them again, write their bf16 gradient
    ("fused", 2, 4),
    # Megatron-LM's _VocabParallelCrossEntropy on output.float(): cast 2 + 4, max 4, subtract 4 + 4, exp 4 + 4,
    # sum 4, divide 4 + 4 | softmax x grad in place 4 + 4, cast back 4 + 2
    ("vocab_parallel", 38, 14),
])
def test_cross_entropy_moves_the_bytes_of_its_kernels(kernel, fwd_bytes, bwd_bytes):
    """The loss is memory-bound over tokens x vocab logits; the output GEMM and its two backward GEMMs are
    2 x tokens x vocab x hidden FLOP each. Numbers chosen so every term is a round figure (no overheads)."""
    dev = device(gemm_efficiency=0.5, memory_efficiency=1.0)
    tokens, hidden, vocab = 4096, 8192, 32768
    gemm = 2 * tokens * vocab * hidden / (100e12 * 0.5)       # 4.398e-2 s
    logits = tokens * vocab                                   # 1.342e8 logits
    edge = costs.edge_cost(tokens, hidden, vocab, 1, dev, kernel)
    assert edge.head_forward == pytest.approx(gemm + logits * fwd_bytes / 1e12, rel=1e-9)
    assert edge.head_backward == pytest.approx(2 * gemm + logits * bwd_bytes / 1e12, rel=1e-9)


def test_train_metrics_are_eager_loss_forwards_without_backward():
    """Each training metric is an eager fp32 cross entropy over the logits without a backward (Composer's
    LanguageCrossEntropy / LanguagePerplexity under autocast): cast 2 + 4, log_softmax 4 + 4 = 14 bytes per logit,
    3 kernels. 4096 tokens x 32768 logits x 14 B = 1.879e9 B -> 1.879 ms at 1 TB/s, + 3 x 1 us."""
    dev = device(memory_efficiency=1.0, kernel_overhead=1e-6)
    one = 4096 * 32768 * 14 / 1e12 + 3e-6
    assert costs.train_metrics_time(4096, 32768, 1, dev, 2) == pytest.approx(2 * one, rel=1e-12)
    assert costs.train_metrics_time(4096, 32768, 2, dev, 1) == pytest.approx(one / 2 + 1.5e-6, rel=1e-12)  # V/t
    assert costs.train_metrics_time(4096, 32768, 1, dev, 0) == 0.0


@pytest.mark.parametrize("w, g, compute, prep", [
    (2, 4, 4, 14),   # bf16 weights, fp32 reduce: cat 2 + 2 | cast 2 + 4, pre-divide 4 + 4
    (2, 2, 4, 4),    # reduce in bf16: no cast | pre-divide 2 + 2
])
def test_fsdp1_gradient_handling_bytes(w, g, compute, prep):
    """PyTorch FSDP (flat parameters): SplitWithSizesBackward concatenates the unit's gradients (read w, write w);
    the post-backward hook casts to the reduce dtype when it differs (read w, write g) and _reduce_grad pre-divides
    in place (read g, write g) before the reduce-scatter."""
    assert costs.fsdp1_grad_bytes(w, g) == (compute, prep)


def test_norms_move_their_bytes_at_their_own_fraction_of_the_bandwidth():
    """The two layer norms move 2·2·T·h·e bytes forward and 2·3·T·h·e backward (read x and dy, write dx) at the
    hardware file's norm efficiencies; the rest of the element-wise work stays at memory_efficiency. Memory-bound
    work is the only thing that differs between the two devices (GEMMs and attention are identical), so the
    layer times differ by exactly the norms' time at the two rates. T·h·e = 2048 x 12288 x 2 = 50,331,648 B."""
    sh = gpt_shape(flash=True)
    plain = device(memory_efficiency=0.8)
    norms = device(memory_efficiency=0.8, norm_forward_efficiency=0.5, norm_backward_efficiency=0.25)
    the = sh.tokens * sh.hidden * 2
    fwd_extra = 4 * the / (1e12 * 0.5) - 4 * the / (1e12 * 0.8)         # 402.7 us - 251.7 us
    bwd_extra = 6 * the / (1e12 * 0.25) - 6 * the / (1e12 * 0.8)        # 1208.0 us - 377.5 us
    a, b = costs.layer_cost(sh, plain, "none"), costs.layer_cost(sh, norms, "none")
    assert b.forward - a.forward == pytest.approx(fwd_extra, rel=1e-9)
    assert b.backward - a.backward == pytest.approx(bwd_extra, rel=1e-9)


def test_no_dropout_drops_its_bytes_and_kernels():
    """Without dropout the two dropouts' 2 x 2.5 sbh bytes (read, write, 1-byte mask) leave the forward and twice
    that the backward, with their launch gaps (2 forward, 2 backward). sbh = 2048 x 12288 x 2 = 50,331,648 B."""
    import dataclasses
    sh = gpt_shape(flash=True)
    dev = device(memory_efficiency=0.8, kernel_overhead=1e-6)
    sbh = sh.tokens * sh.hidden * 2
    with_d = costs.layer_cost(sh, dev, "none")
    without = costs.layer_cost(dataclasses.replace(sh, dropout=False), dev, "none")
    assert with_d.forward - without.forward == pytest.approx(5 * sbh / (1e12 * 0.8) + 2e-6, rel=1e-9)
    assert with_d.backward - without.backward == pytest.approx(10 * sbh / (1e12 * 0.8) + 2e-6, rel=1e-9)


def llama3_8b_shape(tokens=4096, t=1):
    """Llama 3.1 8B layer (h 4096, 8 KV heads of 128 = kv 1024, SwiGLU f 14336), s = tokens, b = 1."""
    return costs.LayerShape(tokens=tokens, seq=tokens, batch=1, hidden=4096, ffn=14336, heads=32, kv_width=1024,
                            mlp_matrices=3, tp=t, sequence_parallel=False, flash=True, dropout=False)


def test_torchtitan_op_policy_keeps_every_other_matmul():
    """torchtitan's op-level SAC counts the layer's mm calls and recomputes every second one; in Llama's order
    (wq, wk, wv, wo, w1, w3, w2) it keeps q, v, w1, w2 and recomputes k, o, w3. With GELU (fc1, fc2) it keeps q, v,
    fc1 and recomputes k and o: fc2, the layer's last matmul, is not needed by the backward, and PyTorch's
    non-reentrant checkpoint stops recomputing early."""
    T, h, kv, f = 4096, 4096, 1024, 14336
    kept, redo = costs.op_sac_matmuls(llama3_8b_shape())
    assert kept == [(T, h, h), (T, kv, h), (T, f, h), (T, h, f)]
    assert redo == [(T, kv, h), (T, h, h), (T, f, h)]
    gelu = costs.LayerShape(tokens=T, seq=T, batch=1, hidden=h, ffn=4 * h, heads=32, kv_width=h, mlp_matrices=2,
                            tp=1, sequence_parallel=False, flash=True)
    kept, redo = costs.op_sac_matmuls(gelu)
    assert kept == [(T, h, h), (T, h, h), (T, 4 * h, h)]
    assert redo == [(T, h, h), (T, h, h)]


def test_op_policy_recomputes_three_matmuls_and_the_elementwise_work_not_attention():
    """selective_op adds, before each layer's backward, the k, o and w3 matmuls, 2 T h (kv + h + f) FLOP, plus the
    forward's element-wise work and norms; the flash attention output is kept, so no attention runs again.
    Hand: 2 x 4096 x 4096 x (1024 + 4096 + 14336) = 6.5284e11 FLOP at 100 TFLOP/s x 0.5 = 13.057 ms. The forward's
    element-wise share is what remains of the forward after its matmuls, 2 T h (2h + 2kv + 3f) FLOP, and its
    causal flash attention, 4 s^2 h / 2 FLOP at 0.4 of peak; by hand it is two residual adds (3 T h x 2 B each),
    SwiGLU (3 T f x 2 B) and two norms (2 T h x 2 B each) at 1 TB/s: (12 T h + 6 T f + 8 T h) B = 687.9 us."""
    sh = llama3_8b_shape()
    dev = device(gemm_efficiency=0.5, attention_efficiency=0.4)
    T, h, kv, f = 4096, 4096, 1024, 14336
    lc = costs.layer_cost(sh, dev, "selective_op")
    none = costs.layer_cost(sh, dev, "none")
    redo_flops = 2 * T * h * (kv + h + f)
    assert redo_flops == pytest.approx(6.5284e11, rel=1e-4)
    gemm_fwd = 2 * T * h * (2 * h + 2 * kv + 3 * f) / (100e12 * 0.5)
    attn_fwd = 4 * T * T * h / 2 / (100e12 * 0.4)
    elementwise = (12 * T * h + 6 * T * f + 8 * T * h) / 1e12
    assert elementwise == pytest.approx(687.865856e-6, rel=1e-12)
    assert none.forward == pytest.approx(gemm_fwd + attn_fwd + elementwise, rel=1e-9)
    assert lc.recompute == pytest.approx(redo_flops / (100e12 * 0.5) + elementwise, rel=1e-9)
    assert lc.hardware_flops == pytest.approx(3 * lc.model_flops + redo_flops, rel=1e-12)
    assert (lc.forward, lc.backward) == (none.forward, none.backward)


@pytest.mark.parametrize("recompute, factor", [("none", 1.0), ("selective", 1.0), ("selective_op", 1.5),
                                               ("full", 2.0)])
def test_backward_tp_collectives_per_recompute_mode(recompute, factor):
    """A layer's forward has two TP all-reduces (Shoeybi et al. 2019, Fig. 3); its backward two more. Full recompute
    re-runs the forward's two; torchtitan's op policy re-runs the one after the attention output (the MLP output is
    kept), so the backward carries 1.5 forward-collectives' worth. As Megatron-LM before 2021-09, without the
    asynchronous all-reduce (tests/test_tp_async.py has the overlapped backward)."""
    from conftest import make_scenario

    from simtrain.plan.build import build_plan
    s = make_scenario(training={"recompute": recompute}, parallel={"tp": 2, "tp_async_allreduce": False})
    c = build_plan(s).chunks[0]
    assert c.tp_fwd_layer > 0
    assert c.tp_bwd_layer == pytest.approx(factor * c.tp_fwd_layer, rel=1e-12)


def test_sustained_fraction_scales_every_gemm_but_not_attention_or_memory_kernels():
    """compute.sustained_fraction multiplies the benchmarked GEMM efficiency (a saturated GPU runs below its boost
    clock); flash attention and memory-bound kernels keep their figures. Hand: curve point 0.8 x 0.879 = 0.7032."""
    burst = device(gemm_curve=[[1024, 0.2], [4096, 0.8]], attention_efficiency=0.4, memory_efficiency=0.9)
    held = device(gemm_curve=[[1024, 0.2], [4096, 0.8]], attention_efficiency=0.4, memory_efficiency=0.9,
                  sustained_fraction=0.879)
    assert held.gemm_efficiency(4096, 4096, 4096) == pytest.approx(0.7032, rel=1e-12)
    assert held.gemm_efficiency(1024, 1024, 1024) == pytest.approx(0.2 * 0.879, rel=1e-12)
    assert held.gemm_time(8192, 8192, 8192) == pytest.approx(2 * 8192**3 / (100e12 * 0.7032), rel=1e-12)
    assert held.attention_time(1e12, 4096) == burst.attention_time(1e12, 4096)
    assert held.memory_time(1e9) == burst.memory_time(1e9)


def test_unfused_adam_moves_72_plus_3g_bytes_per_parameter():
    """PyTorch's element-wise AdamW (and Composer's DecoupledAdamW): weight decay 8, lerp 8 + g, v *= beta2 8,
    addcmul 8 + 2g, sqrt / bias correction + eps 24, addcdiv 16 = 72 + 3g bytes in 8 kernels. With the fp32
    gradient shard of FSDP (g = 4): 84 bytes, against 30 for the fused kernel with fp32 gradients."""
    dev = device(memory_efficiency=0.8)
    assert costs.optimizer_time(1e9, "adam", dev, kernel="unfused", grad_bytes=4.0) == \
        pytest.approx(84e9 / (1e12 * 0.8), rel=1e-12)
    assert costs.optimizer_time(1e9, "adam", dev, kernel="unfused", grad_bytes=2.0) == \
        pytest.approx(78e9 / (1e12 * 0.8), rel=1e-12)
    assert costs.optimizer_time(1e9, "adam", dev, 2.0, kernel="fused", grad_bytes=4.0) == \
        pytest.approx(30e9 / (1e12 * 0.8), rel=1e-12)
    # SGD has one figure, fused or not
    assert costs.optimizer_time(1e9, "sgd", dev, kernel="unfused") == costs.optimizer_time(1e9, "sgd", dev)


@pytest.mark.parametrize("grad_bytes, loss_scaling, zero_buffer, per_param", [
    (2.0, True, True, 54.0),    # fp16, 16-bit contiguous buffer (Korthikanti, the zero-bubble fork)
    (2.0, True, False, 52.0),   # fp16, PyTorch .grad (torch DDP: Narayanan's smaller models)
    (4.0, False, True, 42.0),   # bf16 with fp32 accumulation: no cast, no unscaling, a 4-byte buffer zeroed
])
def test_megatron_mixed_precision_optimizer_passes(grad_bytes, loss_scaling, zero_buffer, per_param):
    """Megatron-LM's MixedPrecisionOptimizer.step (megatron/optimizer/optimizer.py @2755bcb8), per parameter: the
    16-bit gradient cast to fp32 main gradients (read 2, write 4), fp16 unscaling in place (read 4, write 4), the
    gradient norm (read 4), apex FusedAdam on fp32 (read w, g, m, v 16, write w, m, v 12), the copy back to the
    16-bit weights (read 4, write 2), and the contiguous buffer zeroed (write 2 or 4). By hand: 6 + 8 + 4 + 28 + 6 +
    2 = 54; without zeroing 52; with an fp32 buffer and bf16 0 + 0 + 4 + 28 + 6 + 4 = 42; six kernels of 1 us."""
    dev = device(memory_efficiency=0.8, kernel_overhead=1e-6)
    got = costs.optimizer_time(1e9, "adam", dev, kernel="megatron", grad_bytes=grad_bytes,
                               loss_scaling=loss_scaling, zero_buffer=zero_buffer)
    assert got == pytest.approx(per_param * 1e9 / (1e12 * 0.8) + 6e-6, rel=1e-12)


def test_the_plan_charges_the_megatron_optimizer_its_bytes():
    """An fp16 scenario with the default fused accumulation (a contiguous 16-bit buffer): 54 bytes per parameter."""
    from conftest import make_scenario

    from simtrain.plan.build import build_plan
    s = make_scenario(model="llama2-7b", training={"seq_len": 512, "global_batch": 1, "precision": "fp16",
                                                    "optimizer_kernel": "megatron"})
    n = s.model.params_total
    dev = Device(gpu=s.hardware.gpu, compute=s.hardware.compute, dtype="fp16")
    assert build_plan(s).optimizer_time[0] == pytest.approx(dev.memory_time(54.0 * n, kernels=6), rel=1e-12)


#: the share of a 1,024-token score row Megatron's causal softmax loads: row i loads i + 1 scores, (s + 1) / 2s
CAUSAL_1024 = 1025 / 2048


@pytest.mark.parametrize("dropout,softmax,fwd_bytes,bwd_bytes", [
    (True, "megatron", 2 * (CAUSAL_1024 + 1) + 5, 5 + 2 * (2 * CAUSAL_1024 + 1)),
    (False, "megatron", 2 * (CAUSAL_1024 + 1), 2 * (2 * CAUSAL_1024 + 1)),
    (True, "full_row", 2 * 2 + 5, 5 + 2 * 3),
    (False, "full_row", 2 * 2, 2 * 3),
])
def test_unfused_attention_moves_its_score_bytes(dropout, softmax, fwd_bytes, bwd_bytes):
    """Unfused attention (Megatron-LM's causal fused softmax, then dropout) = the score GEMMs (forward 2, backward 4)
    plus, per bf16 score element: the forward softmax loads the lower triangle (1025/2048 of a 1,024-token row) and
    stores the whole row, 2 x (0.50049 + 1) B; the dropout 2 + 2 + 1-byte mask (5 B); backward the dropout 2 + 1 + 2
    and the softmax loading the gradient and the probabilities of the lower triangle and storing the whole row,
    2 x (2 x 0.50049 + 1) B; a softmax over whole rows (full_row) 2 x 2 and 2 x 3 B. Zero-bubble 1.5B layer: b 6,
    24 heads of 96, s 1024: 6 x 24 x 1024^2 = 150,994,944 score elements; the GEMMs are memory-bound:
    2 x (6 x 24 x 1024 x 96 + 96 x 1024 + 6 x 24 x 1024^2) = 330,498,048 B each, at 1e12 x 0.5 B/s plus the 1 us gap.
    Kernels over the scores: forward the softmax and the dropout (2, the softmax alone without dropout), backward
    their two backwards (2, or 1): 1 us gap each."""
    dev = device(memory_efficiency=0.5, kernel_overhead=1e-6, gemm_efficiency=0.8)
    sh = costs.LayerShape(tokens=6 * 1024, seq=1024, batch=6, hidden=2304, ffn=9216, heads=24, kv_width=2304,
                          mlp_matrices=2, tp=1, sequence_parallel=False, flash=False, dropout=dropout,
                          unfused_softmax=softmax)
    gemm = 330_498_048 / 0.5e12 + 1e-6
    kernels = 2 if dropout else 1
    fwd, bwd = unfused_attention.unfused_attention_time(sh, dev)
    assert fwd == pytest.approx(2 * gemm + 150_994_944 * fwd_bytes / 0.5e12 + kernels * 1e-6, rel=1e-9)
    assert bwd == pytest.approx(4 * gemm + 150_994_944 * bwd_bytes / 0.5e12 + kernels * 1e-6, rel=1e-9)


def test_unfused_attention_runs_its_scores_at_the_measured_fraction():
    """With the hardware's measured unfused-attention fractions (forward 0.4, backward 0.3 here) the score GEMMs' bytes
    and the softmax's move at them and the dropout at the streaming 0.5. The zero-bubble 1.5B shape of the test above:
    each score GEMM 330,498,048 B; forward 2 GEMMs + the causal softmax 2 x (1025/2048 + 1) B + dropout 5 B per score
    element (150,994,944), each kernel 1 us; backward 4 GEMMs + softmax 2 x (2 x 1025/2048 + 1) B + dropout 5 B."""
    dev = device(memory_efficiency=0.5, kernel_overhead=1e-6, gemm_efficiency=0.8,
                 unfused_attention_forward_efficiency=0.4, unfused_attention_backward_efficiency=0.3)
    sh = costs.LayerShape(tokens=6 * 1024, seq=1024, batch=6, hidden=2304, ffn=9216, heads=24, kv_width=2304,
                          mlp_matrices=2, tp=1, sequence_parallel=False, flash=False, dropout=True)
    e = 150_994_944
    soft_f, soft_b = 2 * (CAUSAL_1024 + 1), 2 * (2 * CAUSAL_1024 + 1)
    fwd, bwd = unfused_attention.unfused_attention_time(sh, dev)
    assert fwd == pytest.approx(2 * (330_498_048 / 0.4e12 + 1e-6) + (e * soft_f / 0.4e12 + 1e-6)
                                + (e * 5 / 0.5e12 + 1e-6), rel=1e-9)
    assert bwd == pytest.approx(4 * (330_498_048 / 0.3e12 + 1e-6) + (e * soft_b / 0.3e12 + 1e-6)
                                + (e * 5 / 0.5e12 + 1e-6), rel=1e-9)


#: Dao et al. 2022 (FlashAttention, arXiv:2205.14135) App. E.5, "Megatron" rows, ms: one A100 40GB (1,555 GB/s),
#: fp16, batch 16, 8 heads of 64, no mask; (sequence 2,048, sequence 128) for forward and backward, without dropout
#: (Tables 18, 19) and with it (Tables 15, 16)
FLASH_TABLES = {False: ((4.28, 0.24), (8.86, 0.29)), True: ((6.56, 0.27), (10.80, 0.28))}


@pytest.mark.parametrize("dropout,tolerance", [(False, 0.005), (True, 0.035)])
def test_dgx_a100_unfused_rates_reproduce_flashattentions_megatron_rows(dropout, tolerance):
    """dgx-a100's unfused-attention fractions, carried back to the A100 40GB's 1,555 GB/s, time the paper's
    full-row (unmasked: ``unfused_softmax: full_row``) attention at sequence 2,048 as measured there less the
    128-token row (the call's fixed cost): the GEMMs' bytes, 2 x (262,144 x 64 + 64 x 2,048 + 262,144 x 2,048) each
    (2 forward, 4 backward), and the softmax's 4 (forward) and 6 (backward) B per score element (16 x 8 x 2,048^2 =
    536,870,912), at those fractions; the dropout's 5 B at memory_efficiency. Within 0.5% of the rows the fractions
    were read from, 3.5% of the dropout rows, which derived nothing."""
    from pathlib import Path

    from simtrain.spec.hardware import load_hardware

    hw = load_hardware("dgx-a100", base_dir=Path(__file__).parent, file="test.yaml")[0]
    gpu = hw.gpu.model_copy(update={"memory_bandwidth": 1555e9})
    dev = Device(gpu=gpu, compute=hw.compute, dtype="fp16")
    sh = costs.LayerShape(tokens=16 * 2048, seq=2048, batch=16, hidden=512, ffn=2048, heads=8, kv_width=512,
                          mlp_matrices=2, tp=1, sequence_parallel=False, flash=False, dropout=dropout,
                          unfused_softmax="full_row")
    got = unfused_attention.unfused_attention_time(sh, dev)
    for t, (at_2048, at_128) in zip(got, FLASH_TABLES[dropout]):
        assert t == pytest.approx((at_2048 - at_128) * 1e-3, rel=tolerance)


def test_megatron_optimizer_with_bf16_accumulates_gradients_in_fp32():
    """Megatron-LM forces accumulate_allreduce_grads_in_fp32 for bf16 (arguments.py @2755bcb8): grad_dtype auto
    becomes fp32, says so, and an explicit value wins."""
    from conftest import make_scenario

    s = make_scenario(training={"precision": "bf16", "optimizer_kernel": "megatron"})
    assert s.training.grad_dtype == "fp32"
    assert any("grad_dtype: fp32, Megatron-LM's for bf16" in a for a in s.assumed)
    assert make_scenario(training={"precision": "bf16", "optimizer_kernel": "megatron",
                                   "grad_dtype": "bf16"}).training.grad_dtype == "bf16"
    assert make_scenario(training={"precision": "fp16", "optimizer_kernel": "megatron"}).training.grad_dtype == "auto"


def test_megatron_optimizer_zeroes_the_whole_buffer_under_the_distributed_optimizer():
    """zero 1 over 4 replicas: the passes run over the quarter shard (cast 6 + unscale 8 + norm 4 + Adam 28 + copy
    6 = 52 B x n / 4, fp16), the contiguous 16-bit buffer is zeroed whole (2 B x n): the plan's step is the sum."""
    from conftest import make_scenario

    from simtrain.plan.build import build_plan
    s = make_scenario(model="llama2-7b", training={"seq_len": 512, "global_batch": 4, "precision": "fp16",
                                                    "optimizer_kernel": "megatron"},
                      parallel={"dp": 4, "zero": 1})
    n = s.model.params_total
    dev = Device(gpu=s.hardware.gpu, compute=s.hardware.compute, dtype="fp16")
    want = dev.memory_time(52.0 * n / 4, kernels=6) + dev.memory_time(2.0 * n, kernels=1)
    assert build_plan(s).optimizer_time[0] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("parallel", [{"dp": 2, "zero": 2}, {"dp": 2, "zero": 3, "zero_impl": "fsdp1"}])
def test_megatron_optimizer_refuses_sharded_gradients(parallel):
    from conftest import make_scenario

    from simtrain.spec.errors import InputError
    with pytest.raises(InputError, match="'megatron' is Megatron-LM's optimizer, which shards only its state"):
        make_scenario(training={"optimizer_kernel": "megatron"}, parallel=parallel)
