"""`simtrain validate` on the bundled published runs (issue 6)."""

import json
import subprocess
import sys

import pytest

from simtrain.decide import cases as case_files
from simtrain.decide import validate as v


@pytest.fixture(scope="module")
def results():
    return v.validate()


def test_bundled_cases_keep_every_source_line():
    """The bundled cases are the shared dev cases, every case with its source."""
    cases, _ = case_files.load_cases()
    assert len(cases) >= 90
    assert all(str(c.get("source", "")).strip() for c in cases)


def test_every_case_simulates(results):
    """Each bundled case is a valid scenario that simulates (none fails)."""
    assert [r.id for r in results if r.failure] == []


def test_error_is_prediction_over_measurement_minus_one(results):
    """error = predicted / measured - 1, so its sign says too fast (< 0) or too slow (> 0)."""
    r = results[0]
    assert r.error == pytest.approx(r.predicted_step_time_s / r.target_step_time_s - 1)


def test_summary_statistics_by_hand():
    """Mean |error|, worst and bias of three hand-made results."""
    mk = lambda i, e: v.CaseResult(id=str(i), source="s", gate=True, config="", target_step_time_s=1.0,  # noqa: E731
                                   predicted_step_time_s=1 + e, error=e)
    s = v.summarize([mk(1, -0.10), mk(2, 0.02), mk(3, -0.04)])
    assert s.mean_abs_error == pytest.approx(0.16 / 3)
    assert s.worst_abs_error == pytest.approx(0.10) and s.worst_case == "1"
    assert s.bias == pytest.approx(-0.04)
    assert s.within_10pct == 3


# Regression guard: the errors measured when this test was last updated (2026-11-29). The gated mean rose from
# 8.6 % to 12.3 % (worst 24.0 % -> 25.8 %) when the engine stopped slowing a whole compute op for a collective
# that overlaps only part of it (every ZeRO-3 layer op used to run 19 % slower because the next layer's
# gather was in flight at its start); the earlier figure leaned on that. With the layer norms at PyTorch's
# measured speed: 11.3 %, worst 24.4 %; with MPT's dropout off (its pdrops are 0): 12.7 %, worst 26.3 %; with
# FSDP's gathers and reduce-scatters on one stream (one process group): 13.0 %, worst 26.8 %; with fp32 gradient
# reduction (Composer's DEFAULT mixed precision, fourth session): 12.4 %, worst 26.6 %; with Composer's per-micro-batch
# train metrics: 11.8 %, worst 26.0 %; with PyTorch FSDP's flat-parameter gradient handling: 10.9 %, worst 24.9 %;
# with the backward prefetch read from FSDP's code (BACKWARD_POST + limit_all_gathers = simtrain's pre, not post):
# 13.0 %, worst 26.9 %; with the H100's sustained matmul rate (compute.sustained_fraction 0.880, the maximum
# sustainable over the maximum achievable matmul rate; fifth session): 8.7 %, worst 20.6 %; with Composer's Adam as
# PyTorch's element-wise kernels (training.optimizer_kernel: unfused): 8.5 %, worst 20.6 %; with the measured
# nccl-tests curve for the message-size ramp (sixth session): 8.5 %, worst 20.6 %; with PyTorch FSDP1's fixed cost
# per unit and micro-batch (1.875 ms, the measured gap between FSDP1 and YaFSDP): 4.7 %, worst 19.0 %; guards are
# today's output rounded up to 5 % / 20 % (the mean guard is also the target). A100 Megatron-LM Table 1
# cases: mean 6.9 %, worst 14.1 %. A change that makes them worse fails here. These record today's state; the
# issue's targets are test_targets_met below. Thirteenth session: FlashAttention-1's speed read from its measured
# bars (0.42 of FA2 on H100 where 0.55 came from an abstract; docs/validation.md) moves the MosaicML runs to 8.9 %,
# worst 33.0 % (its runs of 4k tokens and more predicted too slow; the cause is not established): guards 9 % / 34 %.
# Fourteenth session: MPT's Triton kernel as its own (flash1_triton: its forward 1.48x its backward's rate, Triton's
# own per-pass reference; docs/model.md §2.4) prices full recompute's repeated forward lower: 8.1 %, worst 26.5 %;
# guards 9 % / 27 %. Fifteenth session: that kernel's own per-pass timings (xformers#479, k = 1.955): 7.6 %, worst
# 22.8 %; guards 8 % / 23 %.
MOSAIC = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"


def test_gated_error_does_not_regress(results):
    """The gated MosaicML cases' mean |error| stays at or below 8% and the worst at or below 23% (today's state,
    rounded up: 7.6% and 22.8%)."""
    s = v.summarize([r for r in results if r.gate and r.source_name == MOSAIC])
    assert s.cases == 70
    assert s.mean_abs_error <= 0.08
    assert s.worst_abs_error <= 0.23


def test_megatron_a100_cases_stay_within_17_percent(results):
    """The Megatron-LM A100 PTD-P runs (Narayanan et al. 2021 Table 1) stay within 17% each."""
    sel = [r for r in results if r.id.startswith("narayanan21_t1")]
    assert len(sel) == 10
    assert max(abs(r.error) for r in sel) <= 0.17


@pytest.mark.xfail(strict=True, reason="fidelity targets not met yet: the gated cases do not come from six sources "
                                       "(docs/validation.md)")
def test_targets_met(results):
    """Issue target: per source, gated mean |error| <= 5% and >= 90% of gated cases within 10%, on >= 6 sources,
    none holding more than 40% of the gated cases."""
    assert v.check_targets(results).met


def _case(source, error, gate=True, gpu="H100", i=[0]):   # noqa: B006  (a counter for unique ids)
    i[0] += 1
    return v.CaseResult(id=f"c{i[0]}", source=source, gate=gate, config="", target_step_time_s=1.0,
                        predicted_step_time_s=1 + error, error=error, gpu=gpu)


def test_a_source_is_named_without_commit_or_table():
    """Both Narayanan tables are one source; a commit after ' @' is not part of the name; GPU family from the
    hardware's GPU name."""
    assert v.source_name("Narayanan et al. 2021 (SC21), arXiv:2104.04473, Sec 5.1 Table 1") == \
        v.source_name("Narayanan et al. 2021 (SC21), arXiv:2104.04473, Sec 5.2 Table 2") == \
        "Narayanan et al. 2021 (SC21)"
    named = v.source_name("mosaicml/llm-foundry x/README.md @495218376830 (2024-04-22)")
    assert named == "mosaicml/llm-foundry x/README.md"
    assert v.gpu_family("H100-SXM5-80GB") == "H100" and v.gpu_family("A100-SXM4-80GB") == "A100"


def test_per_source_targets_by_hand():
    """Six sources of 10 cases, each 9 within 10% at a mean of (9 x 0.02 + 0.12) / 10 = 3.0%: met. One source with
    two cases over 10% (80% within) fails its own target; a source holding 45% of the cases fails the share rule;
    five sources are too few."""
    good = [_case(f"src{k}", 0.02) for k in range(6) for _ in range(9)] + [_case(f"src{k}", -0.12) for k in range(6)]
    check = v.check_targets(good)
    assert check.met and len(check.sources) == 6
    assert check.sources["src0"].mean_abs_error == pytest.approx(0.03)
    assert check.sources["src0"].within_fraction == pytest.approx(0.9)
    two_misses = good + [_case("src0", -0.15)]   # src0: 9 of 11 within 10% = 82%
    assert not v.check_targets(two_misses).met
    assert v.check_targets(two_misses).sources_met == [f"src{k}" for k in range(1, 6)]
    dominant = good + [_case("src0", 0.0) for _ in range(40)]   # src0: 50 of 100 cases
    assert not v.check_targets(dominant).met and v.check_targets(dominant).largest_share == pytest.approx(0.5)
    five = [c for c in good if c.source != "src5"]
    assert not v.check_targets(five).met
    ungated = good + [_case("other", 0.5, gate=False)]
    assert v.check_targets(ungated).met   # an ungated case counts for no target


def test_per_gpu_family_summary_by_hand():
    """by_group summarises each GPU family apart: A100 errors -0.10 and +0.04 give mean 7%, bias -3%."""
    groups = v.by_group([_case("s", -0.10, gpu="A100"), _case("s", 0.04, gpu="A100"), _case("s", 0.01)],
                        lambda r: r.gpu)
    assert list(groups) == ["A100", "H100"]
    assert groups["A100"].mean_abs_error == pytest.approx(0.07) and groups["A100"].bias == pytest.approx(-0.03)
    assert groups["H100"].cases == 1


def test_the_dev_set_leaves_the_companions_out():
    """`simtrain validate` without CASES runs every bundled file but llm_foundry_a100 and llm_foundry_sweeps."""
    dev = case_files.dev_case_files()
    assert list(dev)[0] == "cases"
    assert not set(dev) & {"llm_foundry_a100", "llm_foundry_sweeps"}
    assert set(dev) | set(case_files.COMPANIONS) == set(case_files.bundled_case_files())


def test_cli_json(tmp_path):
    """`simtrain validate --only ... --json` writes summaries and per-case results."""
    out = tmp_path / "v.json"
    proc = subprocess.run([sys.executable, "-c", "from simtrain.cli import main; main()", "validate", "--only",
                           "zb_1.5b_p8_m24_zb1p", "--json", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["cases"][0]["id"] == "zb_1.5b_p8_m24_zb1p"    # not gated: ZB-1p runs as the ZB-H1 stand-in
    assert "assumed by the case" in proc.stdout
    assert data["targets"]["mean"] == 0.05
    assert data["by_source"] == {} and list(data["by_source_all"]) == [
        "Qi et al. 2024 Zero Bubble Pipeline Parallelism (ICLR 2024) arXiv:2401.10241v1"]


def test_cases_that_do_not_fit_say_so(tmp_path):
    """A case whose predicted peak exceeds the GPU's memory is flagged (the measured run fit, so the ledger is
    wrong there): 7B parameters unsharded on one H100 need 16 x 7e9 = 112 GB of static state alone (reference
    article, rule 2) against the GPU's 85.5 GB (81,559 MiB); sharded over 8 GPUs with ZeRO-3 (14 GB each) they fit."""
    cases = tmp_path / "c.yaml"
    cases.write_text(
        "- id: too_big\n  target_step_time_s: 1.0\n  scenario:\n    hardware: dgx-h100\n    nodes: 1\n"
        "    gpus_per_node: 1\n    model: llama2-7b\n    training: {seq_len: 512, global_batch: 1}\n"
        "    parallel: {dp: 1}\n"
        "- id: fits\n  target_step_time_s: 1.0\n  scenario:\n    hardware: dgx-h100\n    nodes: 1\n"
        "    model: llama2-7b\n    training: {seq_len: 512, global_batch: 8}\n    parallel: {dp: 8, zero: 3}\n")
    proc = subprocess.run([sys.executable, "-c", "from simtrain.cli import main; main()", "validate", str(cases)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    flagged = [ln for ln in proc.stdout.splitlines() if "the memory ledger overestimates" in ln]
    assert len(flagged) == 1
    big = proc.stdout.split("too_big", 1)[1].split("\nfits", 1)[0]
    assert "the memory ledger overestimates" in big and "of the GPU's 85.5 GB" in big


def test_bundled_cases_files_by_name(tmp_path, monkeypatch):
    """`simtrain validate llm_foundry_a100` names a bundled file; an unknown bare name is an input error that
    lists the bundled ones; an existing path is used as given."""
    from simtrain.spec.errors import InputError

    monkeypatch.chdir(tmp_path)
    assert case_files.resolve_cases("llm_foundry_a100").name == "llm_foundry_a100.yaml"
    assert case_files.resolve_cases(None) == case_files.bundled_cases_path()
    with pytest.raises(InputError, match=r"bundled: (.*, )?cases, .*llm_foundry_a100"):
        case_files.resolve_cases("no_such_cases")
    own = tmp_path / "llm_foundry_a100.yaml"
    own.write_text("[]\n")
    assert case_files.resolve_cases("llm_foundry_a100.yaml") == own.relative_to(tmp_path)


def test_configuration_names_non_default_kernels(results):
    """The printed configuration says which attention kernel a case runs when it is not FlashAttention-2
    and which loss kernel when it is not the eager one: the MosaicML cases run flash1_triton (their MPT yamls:
    attn_impl triton), the fused cross entropy (llm-foundry's default loss_fn) and no dropout (MPT's pdrops are
    0) with fp32 gradients (Composer's DEFAULT mixed precision) and Composer's two per-micro-batch train metrics,
    the 2021 Megatron runs no flash, Megatron-LM's vocab-parallel loss,
    dropout and gradients in the training precision, accumulated by PyTorch's autograd (acc=autograd); nanotron's
    runs name their layer kernels."""
    by_id = {r.id: r for r in results}
    assert by_id["mosaic_h100_80gb_13b_s2048_8gpu_33"].config.endswith(
        " attn=flash1_triton ce=fused nodrop grad=fp32 metrics=2")
    assert by_id["narayanan21_t1_1.7B"].config.endswith(" attn=none ce=vocab_parallel acc=autograd")
    assert by_id["usp_1b_1n_dp8_tp1_pp1_mbs1_z0"].config.endswith(
        " ce=vocab_parallel kernels=nanotron nodrop grad=fp32 acc=unfused")
    assert "attn=" not in by_id["torchtitan_h100_t1_8B_0"].config
    assert "ce=" not in by_id["torchtitan_h100_t1_8B_0"].config


@pytest.mark.parametrize("error, shown", [(-0.1003, "-10.03%"), (0.0996, "+9.96%"), (0.1, "+10.0%"),
                                          (-0.10004, "-10.004%"), (0.09996, "+9.996%"),
                                          (-0.1234, "-12.3%"), (0.0449, "+4.5%")])
def test_an_error_next_to_the_target_is_not_rounded_onto_it(error, shown):
    """-10.03% misses the 10% target and must not print as '-10.0%' beside 'NOT met'."""
    from simtrain.cli.commands_validate import _pct

    assert _pct(error).strip() == shown


def test_plot_draws_one_point_per_case_coloured_by_source(tmp_path):
    """`simtrain validate --plot` writes a log-log chart: one marker per simulated case, one trace per source and
    gating, plus the diagonal and the +/-10% lines; the JSON lands beside it."""
    from simtrain.report.charts_validation import validation_figure

    rows = [_case("A", 0.05).to_dict(), _case("A", -0.02, gate=False).to_dict(), _case("B", 0.2).to_dict()]
    fig = validation_figure(rows)
    markers = [t for t in fig.data if t.mode == "markers"]
    assert [t.name for t in markers] == ["A", "A (not gated)", "B"]
    assert sum(len(t.x) for t in markers) == 3
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    b = markers[2]
    assert b.x[0] == pytest.approx(1.0) and b.y[0] == pytest.approx(1.2)
    plot, out = tmp_path / "v.html", tmp_path / "v.json"
    proc = subprocess.run([sys.executable, "-c", "from simtrain.cli import main; main()", "validate", "--only",
                           "narayanan21_t1_1.7B", "--plot", str(plot), "--json", str(out)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert plot.read_text().count("narayanan21_t1_1.7B") >= 1 and json.loads(out.read_text())["cases"]


def test_the_bands_error_table_is_this_validation(results):
    """The errors `simtrain run` draws its band from are the dev set's as validated now."""
    from conftest import assert_error_table_matches

    for name in case_files.dev_case_files():
        assert_error_table_matches([r for r in results if r.file == name], name)


def test_an_assumed_entry_that_yaml_reads_as_a_mapping_is_named(tmp_path):
    """`assumed: [parallel.vpp: 2]` (an unquoted ': ') is exit 2 at its line, not an internal error."""
    cases = tmp_path / "c.yaml"
    cases.write_text("- id: x\n  target_step_time_s: 1.0\n  assumed: [parallel.vpp: 2]\n  scenario: {hardware: "
                     "dgx-h100, nodes: 1, model: llama2-7b, training: {seq_len: 512, global_batch: 8}, "
                     "parallel: {dp: 8}}\n")
    proc = subprocess.run([sys.executable, "-c", "from simtrain.cli import main; main()", "validate", str(cases)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == (f"error: {cases}:3: assumed: case x: assumed must be a list of texts (the scenario keys "
                           "the source does not state); quote an entry that holds ': '\n")
