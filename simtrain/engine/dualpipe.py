"""DualPipe's gradient sum between mirror ranks, on the cluster graph.

DualPipe (``parallel.schedule: dualpipe``) keeps two copies of the model: rank r holds stage r of the copy fed from
rank 0 and stage pp - 1 - r of the copy fed from rank pp - 1, so every stage's weights live on ranks r and
pp - 1 - r (DeepSeek-V3 Technical Report, arXiv:2412.19437, Sec. 3.2.1 and Table 2: "Parameter 2x"). Before the
optimizer step the two copies' gradients are summed: deepseek-ai/DualPipe ``examples/example_dualpipe.py`` (at
3da1bbea) adds to each module's gradient the other copy's, taken from rank pp - 1 - r. simtrain times the least
traffic that does it: the two mirror ranks exchange the gradients of both their chunks at once (each TP rank and DP
replica with its counterpart), as two pipeline flows, one each way, after the rank's last backward.
"""

from __future__ import annotations

from simtrain.engine.finalize import exchange
from simtrain.engine.lane import Lane


def mirror_gradient_sum(engine, lane: Lane):
    """Send this rank's gradients to its mirror and wait for the mirror's; waiting for the mirror's backward to end
    counts as bubble, the transfer after it as exposed PP time (as a pipeline receive)."""
    plan = engine.plan
    mirror = engine.pp - 1 - lane.rank
    nbytes = sum(plan.chunks[v].grad_bytes_layers + plan.chunks[v].grad_bytes_edge
                 for v in plan.layout.stages_of(lane.rank))
    if plan.has_experts:
        nbytes += plan.expert_grad_bytes[lane.rank]
    yield from exchange(engine, lane, mirror, nbytes, "mirror", "mirror_grad_sum")
