"""DualPipe's gradient sum between the two ranks that hold copies of a stage (DeepSeek-V3 report Sec. 3.2.1, Table 2;
deepseek-ai/DualPipe examples/example_dualpipe.py adds rank pp - 1 - r's copy's gradient to rank r's): a transfer
each way on the cluster graph after a rank's last backward, timed by hand here."""

from __future__ import annotations

import pytest
from conftest import gpt_model, hardware_variant, make_scenario

from simtrain.engine.simulation import simulate

H = 1024
LINK = 100e9   # bytes/s: the test's NVLink per GPU and direction, efficiency 1, no latency (core_ideal)


def _dualpipe(tmp_path, schedule="dualpipe", vpp=1):
    hw = hardware_variant(tmp_path, {"intra_node.bandwidth": "100 GB/s"})
    return make_scenario(hardware=hw, model=gpt_model(layers=8, hidden=H),
                         training={"seq_len": 512, "global_batch": 8, "micro_batch": 1},
                         parallel={"pp": 4, "vpp": vpp, "schedule": schedule})


def test_mirror_ranks_exchange_both_chunks_gradients(tmp_path):
    """A middle rank holds two chunks of 2 GPT layers (12 h^2 + 4 h weights each, 16-bit gradients) and sends
    them to its mirror: 4 x (12 h^2 + 4 h) x 2 bytes at 100 GB/s; both mirror ranks, both ways."""
    result = simulate(_dualpipe(tmp_path))
    nbytes = 4 * (12 * H * H + 4 * H) * 2
    for lane in result.timeline.lanes:
        sums = [r for r in result.timeline.records if r[0] == lane.index and r[2] == "mirror_grad_sum"]
        assert len(sums) == 1
        if lane.rank in (1, 2):
            assert sums[0][9] == nbytes
            assert sums[0][4] - sums[0][3] == pytest.approx(nbytes / LINK, rel=1e-9)
        assert lane.end >= sums[0][4]     # the optimizer step waits for the sum


def test_only_dualpipe_sums_mirror_gradients(tmp_path):
    """DualPipeV holds one copy (stages r and 2 pp - 1 - r are different stages): no gradient sum; and the warning
    that the sum is not timed is gone from DualPipe's run."""
    v = simulate(_dualpipe(tmp_path, "dualpipev", 2))
    assert not any(r[2] == "mirror_grad_sum" for r in v.timeline.records)
    assert not any("does not time" in w for w in simulate(_dualpipe(tmp_path)).warnings)
