"""Costs of the MoE block beyond its GEMMs (plan/costs_moe), priced by hand from the DGX H100 hardware file's
figures: FP8 quantization of the experts' GEMM operands (expert_fp8_cast, shared_fp8_cast: the dense linears' rule,
each GEMM quantizes its input before the forward and its output gradient before the backward; TE's GroupedLinear one
quantizer per expert GEMM) and the biased experts' bias path (expert_bias_time)."""

from dataclasses import replace
from pathlib import Path

import pytest

from simtrain.plan import costs_moe, device
from simtrain.plan.costs_moe import MoEShape, expert_fp8_cast, moe_cost, shared_fp8_cast
from simtrain.spec.hardware import load_hardware

# DGX H100 hardware file: HBM 3.35 TB/s at 0.89 of it, 1 us per kernel launched eagerly
BANDWIDTH = 3.35e12 * 0.89
LAUNCH = 1e-6


@pytest.fixture(scope="module")
def fp8_dev():
    hw = load_hardware("dgx-h100", base_dir=Path(__file__).parent, file="test.yaml")[0]
    return device.Device(gpu=hw.gpu, compute=hw.compute, dtype="fp8", fp8_recipe="tensorwise")


def qwen3_235b_shape(**kw) -> MoEShape:
    """Qwen3-235B-A22B's MoE block at EP 32, TP 2 (sequence parallel), one micro-batch of 4,096 tokens."""
    base = dict(tokens=4096, hidden=4096, experts=128, top_k=8, expert_ffn=1536, shared_ffn=0, mlp_matrices=3,
                tp=2, ep=32, etp=1)
    base.update(kw)
    return MoEShape(**base)


def test_routed_expert_cast_by_hand(fp8_dev):
    """Tensorwise current scaling moves 6 bytes per element quantized, 2 kernels per expert GEMM operand."""
    sh = qwen3_235b_shape()
    # rows per local expert: T k etp ep / E = 2048 x 8 x 1 x 32 / 128 = 4096; 4 local experts: 16,384 rows
    rows = 4 * 4096
    kernels = 2 * (2 * 4)        # amax + cast, for fc1 and fc2 of 4 experts
    fwd_elements = rows * (4096 + 1536)          # fc1 input (rows x h), fc2 input (rows x f)
    bwd_elements = rows * (2 * 1536 + 4096)      # fc1 output gradient (rows x 2f), fc2 output gradient (rows x h)
    fwd, bwd = expert_fp8_cast(sh, fp8_dev)
    assert fwd == pytest.approx(6 * fwd_elements / BANDWIDTH + kernels * LAUNCH, rel=1e-12)
    assert bwd == pytest.approx(6 * bwd_elements / BANDWIDTH + kernels * LAUNCH, rel=1e-12)
    assert fwd == pytest.approx(201.7e-6, rel=1e-3)      # 553.6 MB at 2.98 TB/s: 185.7 us, + 16 launches


def test_shared_expert_cast_by_hand(fp8_dev):
    """The shared experts quantize like a dense MLP over the TP group's tokens, split over tp."""
    sh = qwen3_235b_shape(shared_ffn=2048)
    fwd, bwd = shared_fp8_cast(sh, fp8_dev)
    assert fwd == pytest.approx(6 * 4096 * (4096 + 1024) / BANDWIDTH + 4 * LAUNCH, rel=1e-12)
    assert bwd == pytest.approx(6 * 4096 * (2 * 1024 + 4096) / BANDWIDTH + 4 * LAUNCH, rel=1e-12)


def test_no_cast_in_bf16(fp8_dev):
    """BF16 training quantizes nothing: the MoE block's time is its GEMMs, permutation and router alone."""
    bf16 = replace(fp8_dev, dtype="bf16")
    sh = qwen3_235b_shape(shared_ffn=2048)
    assert expert_fp8_cast(sh, bf16) == (0.0, 0.0)
    assert shared_fp8_cast(sh, bf16) == (0.0, 0.0)


def test_the_block_carries_the_cast(fp8_dev, monkeypatch):
    """The MoE block's forward and backward under fp8 include the routed experts' casts once, and the shared
    experts' share carries theirs (a recomputed shared expert quantizes again)."""
    sh = qwen3_235b_shape(shared_ffn=2048)
    routed_f, routed_b = expert_fp8_cast(sh, fp8_dev)
    shared_f, shared_b = shared_fp8_cast(sh, fp8_dev)
    cost = moe_cost(sh, fp8_dev)
    monkeypatch.setattr(costs_moe, "expert_fp8_cast", lambda *_: (0.0, 0.0))
    monkeypatch.setattr(costs_moe, "shared_fp8_cast", lambda *_: (0.0, 0.0))
    bare = moe_cost(sh, fp8_dev)
    assert cost.forward - bare.forward == pytest.approx(routed_f + shared_f, rel=1e-9)
    assert cost.backward - bare.backward == pytest.approx(routed_b + shared_b, rel=1e-9)
    assert cost.shared_forward - bare.shared_forward == pytest.approx(shared_f, rel=1e-9)
    assert cost.backward_weight == bare.backward_weight   # the casts precede the GEMMs; W is the GEMMs alone


def test_expert_bias_by_hand():
    """Biased experts (GPT-OSS) add fc2's bias x routing probability per local expert: 12 bytes per element of the
    rows x h output forward (b*p written, the add, the cat), 12 backward (two multiplies, two reductions), 2 and 4
    kernels per expert, in BF16 on the DGX H100 figures."""
    hw = load_hardware("dgx-h100", base_dir=Path(__file__).parent, file="test.yaml")[0]
    bf16 = device.Device(gpu=hw.gpu, compute=hw.compute, dtype="bf16")
    # GPT-OSS-120B at EP 8, TP 1, one micro-batch of 4,096 tokens: 4096 x 4 x 8 / 128 = 1,024 rows per expert,
    # 16 local experts: 16,384 rows of 2,880
    sh = MoEShape(tokens=4096, hidden=2880, experts=128, top_k=4, expert_ffn=2880, shared_ffn=0, mlp_matrices=3,
                  tp=1, ep=8, etp=1, expert_bias=True)
    elements = 16384 * 2880
    fwd, bwd = costs_moe.expert_bias_time(sh, bf16)
    assert fwd == pytest.approx(12 * elements / BANDWIDTH + (2 * 16 + 1) * LAUNCH, rel=1e-12)
    assert bwd == pytest.approx(12 * elements / BANDWIDTH + 4 * 16 * LAUNCH, rel=1e-12)
    assert fwd == pytest.approx(223.0e-6, rel=1e-3)   # 566.2 MB at 2.98 TB/s: 189.9 us, + 33 launches
    assert costs_moe.expert_bias_time(replace(sh, expert_bias=False), bf16) == (0.0, 0.0)
    with_bias, without = moe_cost(sh, bf16), moe_cost(replace(sh, expert_bias=False), bf16)
    assert with_bias.forward - without.forward == pytest.approx(fwd, rel=1e-9)
    assert with_bias.backward - without.backward == pytest.approx(bwd, rel=1e-9)


def test_fp8_padding_copy_by_hand(fp8_dev):
    """Dropless fp8 experts copy their rows into padded buffers: the input padded and the output unpadded forward,
    both gradients backward, each a read and a write of rows x h BF16 values, plus the fp32 probabilities' pad."""
    sh = qwen3_235b_shape()
    rows = 4 * 4096
    nbytes = 4 * 2 * rows * 4096 + 2 * 4 * rows      # 536.9 MB of activations + 131 kB of probabilities
    fwd, bwd = costs_moe.expert_fp8_padding(sh, fp8_dev)
    assert fwd == pytest.approx(nbytes / BANDWIDTH + 3 * LAUNCH, rel=1e-12)
    assert bwd == fwd
    assert fwd == pytest.approx(183.1e-6, rel=1e-3)      # 537.0 MB at 2.98 TB/s: 180.1 us, + 3 launches


def test_fp8_padding_only_when_unaligned(fp8_dev):
    """With a capacity factor every expert holds the same padded count: no copy when it is a multiple of the FP8
    alignment (16 rows tensorwise, 32 MXFP8), a copy when it is not; BF16 never pads."""
    mx = replace(fp8_dev, fp8_recipe="mxfp8")
    # EP 8: rows per expert = ceil(2048 x 8 / 128 x c) per source rank x 8 ranks
    aligned = qwen3_235b_shape(ep=8, capacity_factor=1.0)      # 128 x 8 = 1,024: a multiple of 16 and of 32
    assert aligned.rows_per_expert == 1024
    assert costs_moe.expert_fp8_padding(aligned, fp8_dev) == (0.0, 0.0)
    assert costs_moe.expert_fp8_padding(aligned, mx) == (0.0, 0.0)
    sixteen = qwen3_235b_shape(ep=8, capacity_factor=1.01)     # ceil(129.28) = 130, x 8 = 1,040 = 16 x 65
    assert sixteen.rows_per_expert == 1040
    assert costs_moe.expert_fp8_padding(sixteen, fp8_dev) == (0.0, 0.0)
    assert costs_moe.expert_fp8_padding(sixteen, mx)[0] > 0.0
    eight = qwen3_235b_shape(ep=8, capacity_factor=1.005)      # ceil(128.64) = 129, x 8 = 1,032 = 16 x 64.5
    assert eight.rows_per_expert == 1032
    assert costs_moe.expert_fp8_padding(eight, fp8_dev)[0] > 0.0
    assert costs_moe.expert_fp8_padding(qwen3_235b_shape(), replace(fp8_dev, dtype="bf16")) == (0.0, 0.0)
