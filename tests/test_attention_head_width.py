"""A flash-attention kernel's speed at the head width it computes (``compute.attention_head_width``): on H100,
FlashAttention-2 and -3 run head width 64 slower per FLOP than 128 (Shah et al. 2024, arXiv:2407.08608, Figs. 5-6);
on A100 FlashAttention-2 too, and flash-attn's CUDA FlashAttention-1 runs it faster on both (the flash-attn README's
FlashAttention-2 release figures). Expected values come from the published bars (docs/sources.md section 2) or are hand
calculations."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from conftest import gpt_model, hardware_variant, make_scenario, run_cli

from simtrain.plan.layer_floor import step_device

HARDWARE = Path(__file__).resolve().parents[1] / "hardware"

#: Shah et al. 2024 Figs. 5a-5d and 6a-6b, FA2 bars at 512, 1k, 2k, 4k, 8k, 16k tokens (TFLOP/s), as docs/sources.md
#: section 2 transcribes them: forward causal, forward non-causal, backward non-causal; head width 64 and 128
FA2 = {64: ([180, 229, 262, 284, 295, 299], [282, 306, 318, 321, 322, 324], [198, 238, 264, 279, 287, 291]),
       128: ([191, 260, 298, 319, 333, 335], [309, 350, 362, 368, 370, 370], [214, 260, 291, 310, 318, 322])}
#: the same panels' FlashAttention-3 and cuDNN bars
FA3 = {64: ([197, 265, 371, 420, 460, 473], [333, 392, 460, 476, 496, 497], [272, 363, 422, 453, 472, 474]),
       128: ([292, 423, 521, 579, 602, 616], [467, 565, 625, 638, 646, 648], [316, 424, 501, 542, 559, 561])}
CUDNN = {64: ([225, 288, 334, 363, 379, 388], [335, 373, 395, 408, 412, 413], [266, 348, 395, 417, 432, 433]),
         128: ([315, 410, 484, 518, 529, 539], [497, 574, 617, 609, 600, 595], [305, 408, 465, 499, 518, 516])}
#: the flash-attn README's FlashAttention-2 release figures (Dao-AILab/flash-attention @4f285b35,
#: assets/flash2_{a100,h100}_fwd_bwd_benchmark.png), forward + backward with the causal mask, panels c (head width 64)
#: and d (128), at 512, 1k, 2k, 4k, 8k, 16k tokens (TFLOP/s), as docs/sources.md section 2 transcribes them
RELEASE = {("a100", "flash2"): ([88, 119, 140, 156, 165, 171], [99, 133, 155, 173, 182, 189]),
           ("a100", "flash1"): ([58, 70, 77, 87, 92, 97], [55, 62, 69, 76, 80, 83]),
           ("a100", "triton"): ([59, 75, 79, 76, 79, 80], [50, 61, 68, 74, 78, 80]),
           ("h100", "flash2"): ([141, 192, 232, 257, 273, 284], [163, 221, 265, 294, 308, 328]),
           ("h100", "flash1"): ([104, 123, 136, 138, 149, 156], [98, 109, 108, 126, 135, 137])}
HOPPER = ("dgx-h100", "azure-nd-h100-v5", "coreweave-hgx-h100", "grand-teton-h100-96gb", "hgx-h200", "nebius-h200",
          "hgx-h800")


def _combined(fwd_causal, fwd_full, bwd_full):
    """Forward + backward of a causal call (the backward 2.5x the forward's FLOP), its causal backward estimated
    as the non-causal one times the forward's causal/non-causal ratio, as hardware/dgx-h100.yaml does."""
    return [3.5 / (1 / f + 2.5 / (b * f / n)) for f, n, b in zip(fwd_causal, fwd_full, bwd_full)]


def _device(hardware, heads, hidden=2048, kernel="flash2", **model):
    sc = make_scenario(hardware=hardware, model=gpt_model(layers=2, hidden=hidden, heads=heads, **model),
                       training={"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "flash_attention": kernel})
    return step_device(sc.hardware, sc.training, sc.training.precision, sc.model)


@pytest.mark.parametrize(("kernel", "bars", "mean"), [("flash2", FA2, 0.917), ("flash3", FA3, 0.789),
                                                      ("cudnn", CUDNN, 0.844)])
def test_the_hopper_files_carry_the_papers_ratio(kernel, bars, mean):
    """The mean over the six lengths of each kernel's combined rate at width 64 over width 128 is the value every
    Hopper file carries (cuDNN where the file runs it), with 1.0 at width 128."""
    ratios = [a / b for a, b in zip(_combined(*bars[64]), _combined(*bars[128]))]
    assert sum(ratios) / len(ratios) == pytest.approx(mean, abs=5e-4)
    from simtrain.spec.hardware import load_hardware
    for name in HOPPER:
        hw, _ = load_hardware(name, base_dir=HARDWARE, file=None)
        if kernel in hw.compute.attention_kernels or kernel == "flash2":
            assert hw.compute.attention_head_width[kernel] == ((64.0, mean), (128.0, 1.0)), name
    dev = _device(HARDWARE / "dgx-h100.yaml", heads=32, kernel=kernel if kernel != "flash2" else True)
    speed = {"flash2": 1.0, "flash3": 1.66, "cudnn": 1.66}[kernel]   # dgx-h100's attention_kernels
    assert dev.attention_speed == pytest.approx(speed * mean)


def test_dgx_a100_carries_the_release_figures_flash2_ratio():
    """FlashAttention-2 on A100: the mean over the six lengths of the width-64 over width-128 rate (fwd + bwd measured
    together, so no combination) is 0.900, dgx-a100's curve."""
    w64, w128 = RELEASE[("a100", "flash2")]
    ratios = [a / b for a, b in zip(w64, w128)]
    assert sum(ratios) / len(ratios) == pytest.approx(0.900, abs=5e-4)
    from simtrain.spec.hardware import load_hardware
    hw, _ = load_hardware("dgx-a100", base_dir=HARDWARE, file=None)
    assert hw.compute.attention_head_width["flash2"] == ((64.0, 0.900), (128.0, 1.0))


@pytest.mark.parametrize(("gpu", "mean", "files"), [("a100", 1.127, ("dgx-a100",)), ("h100", 1.131, HOPPER)])
def test_cuda_flash1_carries_the_release_figures_ratio(gpu, mean, files):
    """flash-attn's CUDA FlashAttention-1 runs width 64 faster per FLOP than 128: the mean over the six lengths of
    its bars' ratio is 1.127 on A100 (1.055 at 512 rising to 1.169 at 16k) and 1.131 on H100, the flash1 curve of
    dgx-a100 and of the Hopper files. At width 64 on dgx-h100 flash1 runs 0.42 x 1.131 = 0.475 of FA2's curve."""
    w64, w128 = RELEASE[(gpu, "flash1")]
    ratios = [a / b for a, b in zip(w64, w128)]
    assert sum(ratios) / len(ratios) == pytest.approx(mean, abs=5e-4)
    from simtrain.spec.hardware import load_hardware
    for name in files:
        hw, _ = load_hardware(name, base_dir=HARDWARE, file=None)
        assert hw.compute.attention_head_width["flash1"] == ((64.0, mean), (128.0, 1.0)), name
    if gpu == "h100":
        h100 = HARDWARE / "dgx-h100.yaml"
        assert _device(h100, heads=32, kernel="flash1").attention_speed == pytest.approx(0.42 * 1.131)
        assert _device(h100, heads=16, kernel="flash1").attention_speed == pytest.approx(0.42)


def test_the_triton_kernel_takes_flash1s_speed_but_not_its_width_curve():
    """On A100 the figure's Triton bars fall from 1.18-1.23x at 512-1k tokens to 1.00 at 16k while the CUDA kernel's
    rise, so the CUDA curve does not carry to a Triton kernel; and those bars are most likely Triton's own kernel, not
    flash-attn's flash_attn_triton.py (MPT's), which no figure times by width. flash1_triton runs every width at
    flash1's width-128 speed (dgx-h100: 0.42)."""
    cuda = [a / b for a, b in zip(*RELEASE[("a100", "flash1")])]
    triton = [a / b for a, b in zip(*RELEASE[("a100", "triton")])]
    assert cuda[-1] > cuda[0] + 0.1 and triton[-1] < triton[0] - 0.1
    h100 = HARDWARE / "dgx-h100.yaml"
    for heads, hidden in ((32, 2048), (16, 2048)):   # widths 64 and 128
        assert _device(h100, heads=heads, hidden=hidden, kernel="flash1_triton").attention_speed == pytest.approx(0.42)


@pytest.mark.parametrize(("gpu", "speed", "files"), [("a100", 0.44, ("dgx-a100",)), ("h100", 0.42, HOPPER)])
def test_flash1_speed_is_the_release_figures_ratio_at_16k(gpu, speed, files):
    """FlashAttention-1 over FlashAttention-2 at width 128, causal, 16k tokens (where attention_efficiency is taken):
    A100 83/189 = 0.439, H100 137/328 = 0.418, rounded to the files' 0.44 and 0.42."""
    fa1, fa2 = RELEASE[(gpu, "flash1")][1][-1], RELEASE[(gpu, "flash2")][1][-1]
    assert fa1 / fa2 == pytest.approx(speed, abs=0.005)
    from simtrain.spec.hardware import load_hardware
    for name in files:
        hw, _ = load_hardware(name, base_dir=HARDWARE, file=None)
        assert hw.compute.attention_kernels["flash1"] == speed, name


def test_latent_attention_runs_at_its_query_key_width():
    """Multi-head latent attention computes query-key heads nope + rope = 128 + 64 = 192 wide, beyond the curve's
    last point: flash3's full 1.66. Its hidden / heads (2,048 / 64 = 32) would read the width-64 speed, 1.66 x 0.789."""
    model = gpt_model(layers=2, hidden=2048, heads=64,
                      attention={"kind": "mla", "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 128,
                                 "qk_rope_head_dim": 64, "v_head_dim": 128})
    sc = make_scenario(hardware=HARDWARE / "dgx-h100.yaml", model=model,
                       training={"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "flash_attention": "flash3"})
    dev = step_device(sc.hardware, sc.training, sc.training.precision, sc.model)
    assert dev.attention_speed == pytest.approx(1.66)


def test_width_64_takes_longer_than_128_for_the_same_flop():
    """h 2,048 as 32 heads of 64 or 16 of 128: the same attention FLOP (4 s^2 h), so the kernel time net of the
    launch gap differs by exactly 1 / 0.917 on dgx-h100, 1 / 0.900 on dgx-a100, and not at all on dgx-b200, which has
    no head-width figure."""
    flop = 4 * 4096**2 * 2048 / 2
    for name, ratio in (("dgx-h100", 1 / 0.917), ("dgx-a100", 1 / 0.900), ("dgx-b200", 1.0)):
        hw = HARDWARE / f"{name}.yaml"
        d64, d128 = _device(hw, heads=32), _device(hw, heads=16)
        gap = d64.kernel_overhead
        assert (d64.attention_time(flop, 4096) - gap) / (d128.attention_time(flop, 4096) - gap) == \
            pytest.approx(ratio, rel=1e-12)


def test_between_and_beyond_the_measured_widths(tmp_path):
    """A curve [[64, 0.8], [128, 1.0]]: width 96 is halfway (0.9), 80 runs flash-attn 2's 96-wide kernel (0.9, not
    0.85), 32 holds the 64 value (0.8), 256 the 128 one (1.0); flash3's own curve times its 1.5 speed: 0.6 x 1.5."""
    hw = hardware_variant(tmp_path, {"compute.attention_kernels": {"flash3": 1.5}, "compute.attention_efficiency": 0.5,
                                     "compute.attention_head_width": {"flash2": [[64, 0.8], [128, 1.0]],
                                                                      "flash3": [[64, 0.6], [128, 1.0]]}})
    assert _device(hw, heads=16, hidden=1536).attention_speed == pytest.approx(0.9)     # 96
    assert _device(hw, heads=16, hidden=1280).attention_speed == pytest.approx(0.9)     # 80 -> 96-wide kernel
    assert _device(hw, heads=32, hidden=1024).attention_speed == pytest.approx(0.8)     # 32
    assert _device(hw, heads=8, hidden=2048).attention_speed == pytest.approx(1.0)      # 256
    assert _device(hw, heads=32, kernel="flash3").attention_speed == pytest.approx(0.9)


def test_a_step_of_a_width_64_model_grows_by_its_attention_share():
    """The Ultra-Scale Playbook's 1B layer (h 2,048, 32 heads of 64, 4,096 tokens, FA2) on dgx-h100: only the
    attention kernels change, by 1 / 0.917 of their time net of the launch gaps."""
    from simtrain.plan import costs
    from simtrain.plan.layer_floor import dense_layer_cost, layer_shapes
    sc = make_scenario(hardware=HARDWARE / "dgx-h100.yaml",
                       model=gpt_model(layers=2, hidden=2048, heads=32, ffn_hidden=8192, mlp="swiglu"),
                       training={"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "flash_attention": True})
    tr = sc.training
    _, shape = layer_shapes(sc.model, tr, tp=1, sequence_parallel=False, cp=1, micro_batch=1)
    dev = step_device(sc.hardware, tr, tr.precision, sc.model)
    flat = replace(dev, attention_speed=1.0)                     # the width-128 speed
    grown = dense_layer_cost(shape, dev, tr, "none")
    base = dense_layer_cost(shape, flat, tr, "none")
    executed = costs.attention_flops(shape) * 0.5
    attn = [flat.attention_time(f, 4096) - flat.kernel_overhead for f in (executed, 2.5 * executed)]
    assert grown.forward - base.forward == pytest.approx(attn[0] * (1 / 0.917 - 1), rel=1e-9)
    assert grown.backward - base.backward == pytest.approx(attn[1] * (1 / 0.917 - 1), rel=1e-9)


@pytest.mark.parametrize(("curve", "words"), [
    ({"flash9": [[64, 0.8], [128, 1.0]]}, ("flash9",)),
    ({"flash2": [[128, 1.0], [64, 0.8]]}, ("must increase", "64 follows 128")),
    ({"flash2": [[64, -0.8], [128, 1.0]]}, ("[64, -0.8]", "> 0")),
    ({"flash2": [[64, 0.8, 1], [128, 1.0]]}, ("[64, 0.8, 1]", "head width, relative speed")),
    ({"flash2": 0.9}, ("at least two", "not 0.9")),
    ({"flash2": [[128, 1.0], [256, 4.0]]}, ("flash2", "4 of the GPU's peak", "at most 1")),
])
def test_a_bad_curve_is_bad_input(tmp_path, capsys, curve, words):
    """Exit 2 and one sentence that names the field and the value."""
    hw = hardware_variant(tmp_path, {"compute.attention_head_width": curve})
    sc = tmp_path / "s.yaml"
    sc.write_text(f"hardware: {hw}\nmodel: {{layers: 2, hidden: 1024, heads: 16, vocab: 8}}\n"
                  "training: {seq_len: 512, global_batch: 1, micro_batch: 1}\n", encoding="utf-8")
    code, _, err = run_cli(["run", str(sc)], capsys)
    assert code == 2
    assert "attention_head_width" in err and all(w in err for w in words) and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_kernel_may_be_faster_at_another_width(tmp_path):
    """A relative speed above 1 is allowed (FlashAttention-3's causal forward at width 256 runs 0.98-1.06x its
    width-128 rate, Shah et al. 2024 Figs. 5d/5f), as long as no kernel would exceed the peak:
    [[128, 1.0], [256, 1.1]] at width 192 (16 heads of 192) gives 1.05."""
    hw = hardware_variant(tmp_path, {"compute.attention_efficiency": 0.5,
                                     "compute.attention_head_width": {"flash2": [[128, 1.0], [256, 1.1]]}})
    assert _device(hw, heads=16, hidden=3072).attention_speed == pytest.approx(1.05)


def test_the_search_floor_prices_the_same_width():
    """A search's per-layer floor (layer_floor) is the plan's own figure for a width-64 layer, which is above what
    the width-128 speed would give: the floor reads the head width as the plan does."""
    from simtrain.plan.build import build_plan
    from simtrain.plan.layer_floor import dense_layer_cost, layer_floor, layer_shapes
    sc = make_scenario(hardware=HARDWARE / "dgx-h100.yaml", nodes=1, gpus_per_node=1,
                       model=gpt_model(layers=2, hidden=2048, heads=32, ffn_hidden=8192, mlp="swiglu"),
                       training={"seq_len": 4096, "global_batch": 1, "micro_batch": 1, "flash_attention": True})
    chunk = build_plan(sc).chunks[0]
    lf = layer_floor(sc, micro_batch=1, precision="bf16", recompute="none")
    assert lf.compute == chunk.fwd_layer + chunk.bwd_layer + chunk.recompute_layer
    tr = sc.training
    _, shape = layer_shapes(sc.model, tr, tp=1, sequence_parallel=False, cp=1, micro_batch=1)
    flat = replace(step_device(sc.hardware, tr, tr.precision, sc.model), attention_speed=1.0)
    at_128 = dense_layer_cost(shape, flat, tr, "none")
    assert lf.compute > at_128.forward + at_128.backward


def test_flash3_runs_the_next_of_its_kernel_widths(tmp_path):
    """FlashAttention-3 has kernels 64, 96, 128, 192 and 256 wide (hopper/flash_api.cpp round_up_headdim): a width of
    80 runs the 96 kernel, so its speed is read at 96 (halfway on [[64, 0.6], [128, 1.0]]: 0.8, times flash3's 1.5)
    and its FLOP are padded by 96 / 80; 112 runs the 128 kernel (1.0 x 1.5)."""
    from simtrain.plan.layer_floor import attention_kernel_pad
    hw = hardware_variant(tmp_path, {"compute.attention_kernels": {"flash3": 1.5}, "compute.attention_efficiency": 0.5,
                                     "compute.attention_head_width": {"flash3": [[64, 0.6], [128, 1.0]]}})
    assert _device(hw, heads=16, hidden=1280, kernel="flash3").attention_speed == pytest.approx(1.2)
    assert _device(hw, heads=16, hidden=1792, kernel="flash3").attention_speed == pytest.approx(1.5)
    assert attention_kernel_pad("flash3", 80) == pytest.approx(96 / 80)
    assert attention_kernel_pad("flash3", 200) == pytest.approx(256 / 200)
