"""FP8 training (training.precision: fp8): the memory ledger and the speed-up against BF16, checked against hand
calculations from the model's dimensions and the hardware files' published figures."""

from __future__ import annotations

from pathlib import Path

import pytest

import simtrain
from simtrain.plan import device
from simtrain.plan.memory import stage_memory
from simtrain.spec.scenario import scenario_from_dict

# Llama 3 8B (meta-llama/Meta-Llama-3-8B config.json): h 4096, 8 KV heads of 128 (kv width 1024), SwiGLU ffn 14336
H, KV, FFN, LAYERS = 4096, 1024, 14336, 32
MATMUL_PER_LAYER = H * (H + 2 * KV) + H * H + 3 * H * FFN   # QKV, output, gate + up + down = 218,103,808
SEQ = 2048


def _scenario(hardware: str, precision: str, recipe: str = "tensorwise", **training):
    raw = {"hardware": hardware, "model": "llama3-8b",
           "training": {"seq_len": SEQ, "global_batch": 8, "micro_batch": 1, "precision": precision,
                        "dropout": False, **({"fp8_recipe": recipe} if precision == "fp8" else {}), **training},
           "parallel": {"dp": 8, "zero": 1}}
    return scenario_from_dict(raw)


def test_matmul_weights_per_layer_by_hand():
    """The hand count of a Llama 3 8B layer's matrix weights is 218,103,808 (the figure the ledger tests use)."""
    assert MATMUL_PER_LAYER == 218_103_808


@pytest.mark.parametrize(("hardware", "recipe", "bytes_per_weight"), [
    ("dgx-h100", "tensorwise", 2.0),              # Hopper: a rowwise copy and a physical transpose
    ("dgx-b200", "tensorwise", 1.0),              # Blackwell reads FP8 columnwise: one copy
    ("dgx-h100", "blockwise", 2 * (1 + 4 / 128)),  # rowwise and columnwise 1x128 blocks, FP32 scales
    ("dgx-b200", "mxfp8", 2 * (1 + 1 / 32)),       # rowwise and columnwise 32-blocks, E8M0 scales
])
def test_fp8_weight_copies_in_the_ledger(hardware, recipe, bytes_per_weight):
    """FP8 adds the recipe's FP8 copies of every layer's matrix weights to params; grads and optimizer do not move."""
    bf16 = stage_memory(_scenario(hardware, "bf16"), 0)
    fp8 = stage_memory(_scenario(hardware, "fp8", recipe), 0)
    expected = LAYERS * MATMUL_PER_LAYER * bytes_per_weight
    assert fp8.params - bf16.params == pytest.approx(expected, rel=1e-12)
    assert fp8.fp8_weights == pytest.approx(expected, rel=1e-12)
    assert (fp8.grads, fp8.optimizer) == (bf16.grads, bf16.optimizer)


@pytest.mark.parametrize(("recipe", "fp8_bytes"), [("tensorwise", 1.0), ("blockwise", 1 + 4 / 128)])
def test_fp8_saved_linear_inputs(recipe, fp8_bytes):
    """The four linears save their inputs in FP8: QKV and MLP inputs (s h each), the projection's (s h), FC2's (s f)."""
    bf16 = stage_memory(_scenario("dgx-h100", "bf16"), 0)
    fp8 = stage_memory(_scenario("dgx-h100", "fp8", recipe), 0)
    per_layer = (2.0 - fp8_bytes) * (2 * SEQ * H + SEQ * H + SEQ * FFN)   # micro-batch 1, tp 1, one micro-batch held
    assert bf16.activations - fp8.activations == pytest.approx(LAYERS * per_layer, rel=1e-12)


def test_fp8_gemm_speedup_from_the_hardware_file():
    """A large FP8 GEMM on H100 beats BF16 by the ratio of the measured rates: 1979 x 0.652 / (989.5 x 0.806)."""
    scenario = _scenario("dgx-h100", "fp8")
    hw = scenario.hardware
    bf16 = device.Device(gpu=hw.gpu, compute=hw.compute, dtype="bf16")
    fp8 = device.Device(gpu=hw.gpu, compute=hw.compute, dtype="fp8")
    n = 8192.0   # both curves have a measured point here (Azure cuBLASLt FP8; torch.mm BF16)
    expected = (1979e12 * 0.652) / (989.5e12 * 0.806)   # 1.618
    overhead = hw.compute.kernel_overhead
    assert (bf16.gemm_time(n, n, n) - overhead) / (fp8.linear_gemm_time(n, n, n) - overhead) == \
        pytest.approx(expected, rel=1e-9)


def test_fp8_step_faster_than_bf16_but_below_the_gemm_ratio():
    """A whole step gains less than the GEMM ratio: attention, norms, the loss and the optimizer stay in BF16."""
    bf16 = simtrain.simulate(_scenario("dgx-h100", "bf16"))
    fp8 = simtrain.simulate(_scenario("dgx-h100", "fp8"))
    speedup = bf16.step_time_s / fp8.step_time_s
    assert 1.15 < speedup < (1979 * 0.652) / (989.5 * 0.806)


def test_mfu_stays_over_the_bf16_peak():
    """MFU divides by the dense BF16 peak; mfu_fp8 by the FP8 peak (twice it on H100), and is absent for BF16."""
    fp8 = simtrain.simulate(_scenario("dgx-h100", "fp8"))
    assert fp8.mfu / fp8.mfu_fp8 == pytest.approx(1979 / 989.5, rel=1e-12)
    assert "mfu_fp8" in fp8.to_dict() and "mfu_fp8" not in simtrain.simulate(_scenario("dgx-h100", "bf16")).to_dict()


def test_fp8_cast_bytes_per_recipe():
    """Quantizing one BF16 element moves 6 bytes tensorwise (amax + cast, two FP8 copies), 2 x (2 + copy) blockwise."""
    assert device.FP8_CAST_BYTES == {"tensorwise": 6.0, "blockwise": 2 * (3 + 4 / 128), "mxfp8": 2 * (3 + 1 / 32)}


def test_cuda_graphs_shorten_kernel_gaps():
    """Inside a CUDA graph a kernel's launch gap is 0.5 / 0.9 of the eager one (NVIDIA's CUDA Graphs blog)."""
    eager = simtrain.simulate(_scenario("dgx-b200", "fp8"))
    graphed = simtrain.simulate(_scenario("dgx-b200", "fp8", cuda_graphs="full"))
    assert device.GRAPH_GAP_FRACTION == pytest.approx(0.5 / 0.9)
    assert graphed.step_time_s < eager.step_time_s


def test_expert_gemms_run_at_the_fp8_rate():
    """Under fp8 a MoE layer's expert GEMMs (TE GroupedLinear) are linear GEMMs at the FP8 rate: the forward's
    change equals the two expert GEMMs' change from gemm_time to linear_gemm_time, by hand for 8 local experts, less
    the FP8-only work around them (quantizing the GEMM inputs, the per-expert padding copy; tests/
    test_moe_block_extras.py prices both by hand)."""
    from simtrain.plan.costs_moe import MoEShape, expert_fp8_cast, expert_fp8_padding, moe_cost

    hw = _scenario("dgx-h100", "fp8").hardware
    bf16 = device.Device(gpu=hw.gpu, compute=hw.compute, dtype="bf16")
    fp8 = device.Device(gpu=hw.gpu, compute=hw.compute, dtype="fp8")
    sh = MoEShape(tokens=8192, hidden=4096, experts=8, top_k=2, expert_ffn=8192, shared_ffn=0, mlp_matrices=3,
                  tp=1, ep=1, etp=1)
    m = 8192 * 2 / 8                     # tokens per expert: T k / E
    shapes = [(m, 2 * 8192, 4096), (m, 4096, 8192)]   # up (gate and up fused), down

    def experts(dev, gemm):
        return 8 * sum(gemm(dev)(a, b, c) for a, b, c in shapes)

    gain_bf16_to_fp8 = experts(bf16, lambda d: d.gemm_time) - experts(fp8, lambda d: d.linear_gemm_time)
    # the fp8 device's memory-bound kernels move 2-byte activations as bf16 does; besides the GEMMs only the FP8
    # quantization and padding differ
    fp8_only = expert_fp8_cast(sh, fp8)[0] + expert_fp8_padding(sh, fp8)[0]
    assert fp8_only > 0
    assert moe_cost(sh, bf16).forward - moe_cost(sh, fp8).forward == pytest.approx(gain_bf16_to_fp8 - fp8_only,
                                                                                   rel=1e-9)
    assert gain_bf16_to_fp8 > 0


def test_fp8_weight_copies_of_a_mixture_of_experts():
    """Qwen3-30B-A3B on H100 (tensorwise: 2 FP8 bytes per weight on Hopper, a copy and its transpose), ep 8: per
    layer the attention matrices 2048 x (4096 + 2 x 512) + 4096 x 2048 = 18,874,368 weights and the 128 / 8 = 16
    local experts of 3 x 2048 x 768 = 75,497,472; over 48 layers 4,529,848,320 weights = 9.0597 GB of copies."""
    from simtrain.plan.memory import stage_memory

    sc = simtrain.load_scenario(Path(__file__).resolve().parent.parent / "scenarios" / "pp4_dp4.yaml", {
        "model": "qwen3-30b-a3b", "parallel.pp": 1, "parallel.dp": 8, "nodes": 1, "parallel.ep": 8,
        "parallel.zero": 1, "training.global_batch": 16, "training.precision": "fp8"})
    per_layer = 2048 * (4096 + 2 * 512) + 4096 * 2048 + 16 * 3 * 2048 * 768
    assert stage_memory(sc, 0).fp8_weights == pytest.approx(48 * per_layer * 2.0, rel=1e-12)
