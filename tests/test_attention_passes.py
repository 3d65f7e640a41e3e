"""A flash kernel's forward and backward priced apart (plan.device ``attention_time``,
spec.attention_kernels ``ATTENTION_FORWARD_RATIO``).

The hardware files give one forward + backward rate per kernel. flash-attn's CUDA FlashAttention-1 runs both passes
at that rate: its paper's own timings put the backward at 2.5x the forward's time, the FLOP ratio FlashAttention
counts (Dao et al. 2022, arXiv 2205.14135, Tables 18-19, no dropout or mask, A100, 8 heads x 64, batch 16).
The Triton FlashAttention MPT runs (``flash1_triton``) keeps that combined rate but runs its forward faster than its
backward: xformers#479 times flash-attn's flash_attn_triton.py itself, causal, 160 heads of 128, forward and backward
apart (five rows at 4k and 8k tokens; the backward does 2.5x the forward's FLOP), forward rate over backward 1.955 on
average. Full recompute repeats the forward, which then takes 3.5 / (1 + 2.5 x 1.955) = 0.594 of the CUDA kernel's
forward at the same combined rate.
"""

from __future__ import annotations

import pytest

from simtrain.plan import costs
from simtrain.plan.device import Device
from simtrain.spec.hardware import ComputeModel, GpuSpec

PEAK = 100e12
#: Dao et al. 2022, Table 18 (forward) and Table 19 (backward), FlashAttention row, ms, at 16k, 32k and 64k tokens
FA1_FORWARD_MS = (134.03, 535.95, 2147.05)
FA1_BACKWARD_MS = (336.00, 1338.56, 5343.19)
#: xformers#479, its Triton op (flash_attn_triton.py), causal, H 160, K 128, microseconds: forward, backward, for
#: f16 B=1 M=4096, b16 B=1 M=4096, f16 B=2 M=4096, b16 B=2 M=4096, f16 B=1 M=8192
XFORMERS_US = ((5167.6, 25831.9), (5335.3, 25811.2), (10226.7, 51084.6), (10540.9, 51265.2), (19262.0, 91356.3))
#: by hand: 25831.9 / (2.5 x 5167.6) = 1.99953, 25811.2 / 13338.25 = 1.93513, 51084.6 / 25566.75 = 1.99808,
#: 51265.2 / 26352.25 = 1.94537, 91356.3 / 48155.0 = 1.89713; mean 9.77524 / 5 = 1.95505
TRITON_K = 1.95505


def _device(ratio: float) -> Device:
    gpu = GpuSpec(name="test", memory="80 GB", memory_bandwidth=1e12, peak_flops={"bf16": PEAK})
    compute = ComputeModel(attention_efficiency=0.5, attention_half_seq=0, kernel_overhead=0.0)
    return Device(gpu=gpu, compute=compute, dtype="bf16", attention_forward_ratio=ratio)


def test_cuda_flash1_backward_takes_2_5x_its_forward_so_one_rate_serves_both():
    """The FA1 paper's backward/forward time ratios are 2.49-2.51 at 16k-64k tokens: the FLOP ratio (2.5), one rate.
    simtrain's flash1 (no ratio entry, 1.0) prices a forward of F and a backward of 2.5 F at the same rate."""
    from simtrain.spec.attention_kernels import ATTENTION_FORWARD_RATIO
    for fwd, bwd in zip(FA1_FORWARD_MS, FA1_BACKWARD_MS):
        measured = (1.0 / fwd) / (2.5 / bwd)          # forward FLOP rate over backward: 1.003, 0.999, 0.995
        assert ATTENTION_FORWARD_RATIO.get("flash1", 1.0) == pytest.approx(measured, abs=0.01)
    dev = _device(1.0)
    f = 1e12
    # hand: 1e12 / (100e12 x 0.5) = 0.02 s forward, 2.5x that backward
    assert dev.attention_time(f, 4096) == pytest.approx(0.02, rel=1e-12)
    assert dev.attention_time(2.5 * f, 4096, backward=True) == pytest.approx(0.05, rel=1e-12)


def test_flash1_triton_forward_runs_1_955x_its_backward_at_the_same_combined_rate():
    """k = 1.95505 (xformers#479, by hand above). Forward rate = (1 + 2.5 k) / 3.5 = 5.887625 / 3.5 = 1.682179 of the
    combined rate; a forward of 1e12 FLOP then takes 1e12 / (50e12 x 1.682179) = 0.0118893 s, and it and its 2.5e12
    backward still take 3.5e12 / 50e12 = 0.07 s, so the backward 0.0581107 s."""
    from simtrain.spec.attention_kernels import ATTENTION_FORWARD_RATIO
    k = ATTENTION_FORWARD_RATIO["flash1_triton"]
    assert k == pytest.approx(TRITON_K, abs=1e-5)
    mean = sum(b / (2.5 * f) for f, b in XFORMERS_US) / len(XFORMERS_US)
    assert k == pytest.approx(mean, rel=1e-12)
    dev = _device(k)
    fwd = dev.attention_time(1e12, 4096)
    bwd = dev.attention_time(2.5e12, 4096, backward=True)
    assert fwd == pytest.approx(0.0118893, rel=1e-5)
    assert bwd == pytest.approx(0.0581107, rel=1e-5)
    assert fwd + bwd == pytest.approx(0.07, rel=1e-12)
    assert (1e12 / fwd) / (2.5e12 / bwd) == pytest.approx(k, rel=1e-12)


def test_full_recompute_under_flash1_triton_repeats_the_faster_forward():
    """Same layer, same combined rate: without recompute flash1 and flash1_triton take the same time; with full
    recompute flash1_triton's recompute is shorter by the attention forward x (1 - 3.5 / 5.887625) = x 0.405532."""
    sh = costs.LayerShape(tokens=16384, seq=16384, batch=1, hidden=4096, ffn=16384, heads=32, kv_width=4096,
                          mlp_matrices=2, tp=1, sequence_parallel=False, flash=True)
    cuda, triton = _device(1.0), _device(TRITON_K)
    none_c, none_t = costs.layer_cost(sh, cuda, "none"), costs.layer_cost(sh, triton, "none")
    assert none_c.forward + none_c.backward == pytest.approx(none_t.forward + none_t.backward, rel=1e-12)
    full_c, full_t = costs.layer_cost(sh, cuda, "full"), costs.layer_cost(sh, triton, "full")
    # hand: causal forward FLOP 4 b s^2 h / 2 = 2 x 16384^2 x 4096 = 2.199e12 at 0.5 x 100e12 FLOP/s = 0.04398 s (the
    # test device has no length ramp); the saving is that forward's time x (1 - 3.5 / 4.7)
    attn_fwd = 2 * 16384**2 * 4096 / 50e12
    assert full_c.recompute - full_t.recompute == pytest.approx(attn_fwd * 0.405532, rel=1e-5)


def test_flash1_triton_runs_at_the_hardware_files_flash1_speed():
    """No hardware file lists the Triton kernel apart: its author measured it 'slightly slower' than the CUDA kernel
    forward + backward, unsized, so it takes flash1's entry (dgx-h100: 0.42 = 137/328)."""
    from conftest import make_scenario

    from simtrain.plan.layer_floor import step_device
    s = make_scenario(hardware="dgx-h100", nodes=1, model={"layers": 2, "hidden": 4096, "heads": 32,
                                                            "ffn_hidden": 16384, "vocab": 128},
                      training={"flash_attention": "flash1_triton"}, parallel={"dp": 8})
    dev = step_device(s.hardware, s.training, "bf16", s.model)
    assert dev.attention_speed == pytest.approx(0.42)
    assert dev.attention_forward_ratio == pytest.approx(TRITON_K, abs=1e-5)


def test_flash1_triton_needs_a_flash1_entry_and_a_head_width_up_to_128():
    """dgx-b200 lists no flash1 (no Blackwell FA1 figure): refused, naming the missing entry. A head width of 256 is
    refused too (flash_attn_triton.py asserts d <= 128)."""
    from conftest import make_scenario

    from simtrain.spec.errors import InputError
    model = {"layers": 2, "hidden": 2048, "heads": 16, "ffn_hidden": 8192, "vocab": 128}
    with pytest.raises(InputError, match="'flash1_triton' is not available.*compute.attention_kernels.flash1 "):
        make_scenario(hardware="dgx-b200", nodes=1, model=model, training={"flash_attention": "flash1_triton"},
                      parallel={"dp": 8})
    with pytest.raises(InputError, match="runs head widths up to 128.*this model's is 256"):
        make_scenario(hardware="dgx-a100", nodes=1, model=dict(model, heads=8),
                      training={"flash_attention": "flash1_triton"}, parallel={"dp": 8})


@pytest.mark.parametrize(("head", "pad"), [(16, 1.0), (24, 32 / 24), (80, 128 / 80), (128, 1.0)])
def test_flash1_triton_pads_the_head_width_to_a_power_of_two(head, pad):
    """BLOCK_HEADDIM = max(next_power_of_2(d), 16) in flash_attn_triton.py: 16 stays 16 (flash1's CUDA kernels start
    at 32), 24 -> 32, 80 -> 128."""
    from simtrain.plan.layer_floor import attention_kernel_pad
    assert attention_kernel_pad("flash1_triton", head) == pytest.approx(pad)


def test_every_mosaicml_case_runs_the_triton_kernel():
    """The MPT yamls the MosaicML cases cite set attn_impl: triton: every llm-foundry case runs flash1_triton."""
    from simtrain.decide import cases as case_files
    seen = 0
    for name in ("cases", "llm_foundry_a100", "llm_foundry_sweeps"):
        for case in case_files.load_cases(name)[0]:
            if "llm-foundry" in case["source"]:
                seen += 1
                assert case["scenario"]["training"]["flash_attention"] == "flash1_triton", case["id"]
    assert seen == 70 + 61 + 30


def test_a_flash1_entry_whose_triton_forward_would_pass_the_peak_is_bad_input(tmp_path, capsys):
    """On the ideal test GPU (attention_efficiency 1) a flash1 entry of 0.8 is within the peak for flash1 but would
    run flash1_triton's forward at 0.8 x (1 + 2.5 x 1.95505) / 3.5 = 0.8 x 1.682179 = 1.35 of it: exit 2, one sentence
    naming the entry."""
    from conftest import hardware_variant, run_cli
    hw = hardware_variant(tmp_path, {"compute.attention_kernels": {"flash1": 0.8}})
    sc = tmp_path / "s.yaml"
    sc.write_text(f"hardware: {hw}\nmodel: {{layers: 2, hidden: 1024, heads: 16, ffn_hidden: 4096, vocab: 8}}\n"
                  "training: {seq_len: 512, global_batch: 1, micro_batch: 1}\n", encoding="utf-8")
    code, _, err = run_cli(["run", str(sc)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "attention_kernels" in err and "flash1_triton" in err and "1.35 of the GPU's peak" in err, err
    ok = hardware_variant(tmp_path, {"compute.attention_kernels": {"flash1": 0.55}}, name="ok")   # 0.93: accepted
    sc.write_text(f"hardware: {ok}\nmodel: {{layers: 2, hidden: 1024, heads: 16, ffn_hidden: 4096, vocab: 8}}\n"
                  "training: {seq_len: 512, global_batch: 8, micro_batch: 1}\nparallel: {dp: 8}\n", encoding="utf-8")
    assert run_cli(["run", str(sc)], capsys)[0] == 0
