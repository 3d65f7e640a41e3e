"""Where a token's experts live: the expected number of distinct places (EP ranks, nodes) its top-k experts fall
in, with or without group-limited routing.

Placement of experts (NVIDIA/Megatron-LM megatron/core/transformer/moe/moe_layer.py @d98e8a6,
``local_expert_indices_offset = ep_rank * num_local_experts``): EP rank e holds the E/ep consecutive experts
e x E/ep .. (e + 1) x E/ep - 1, so a *part* (an EP rank, or the EP ranks of one node) is a set of expert indices.

Routing (force-balanced, as the published benchmarks run: Megatron-Core's ``moe_router_force_load_balancing``
replaces the router's logits by independent normal draws, moe_utils.py ``RandomSTE``):

- without groups a token's k experts are k distinct experts drawn uniformly from E; a part of n experts is missed
  with probability C(E - n, k) / C(E, k) (hypergeometric);
- group-limited routing (DeepSeek-V3 arXiv:2412.19437 Sec. 2.1.2 and 3.2.2, "each token will be sent to at most
  M nodes", M = 4; HF ``n_group``/``topk_group``; Megatron-Core ``moe_router_num_groups``/``moe_router_group_topk``,
  moe_utils.py ``group_limited_topk`` @d98e8a6): the E experts form G groups of g = E/G consecutive experts; a token
  picks M of the G groups, then its k experts among the M x g experts of those groups. simtrain takes both choices
  uniform: the M groups a uniform M-subset, the k experts a uniform k-subset of the chosen groups' experts. A part
  whose experts in the chosen groups S number n_S is then missed with probability C(Mg - n_S, k) / C(Mg, k), and
  P(hit) = 1 - sum_S C(Mg - n_S, k) / (C(G, M) C(Mg, k)) (the sum over the C(G, M) subsets, counted by n_S).

The expected number of distinct parts a token reaches is the sum of the parts' hit probabilities. Groups map onto
EP ranks and nodes only through this arithmetic: a node holding whole groups (DeepSeek-V3 at EP 64 on 8-GPU nodes:
node = group) is reached by at most M of a token's experts' nodes; groups that straddle nodes are counted as the
overlaps fall. Megatron-Core picks the groups by the sum of each group's top k/M scores, not uniformly among the
experts of the chosen groups, so a chosen group almost always receives experts; with random logits that puts a
token on more of its chosen groups than the uniform choice does (docs/model.md gives the size).
"""

from __future__ import annotations

from functools import lru_cache
from math import comb


def uniform_miss(experts: int, top_k: int, part: int) -> float:
    """Probability that a token's top-k experts, uniform over all experts, miss a part of ``part`` experts."""
    return comb(experts - part, top_k) / comb(experts, top_k)


@lru_cache(maxsize=4096)
def part_hit(overlaps: tuple[int, ...], group_size: int, top_k: int, topk_group: int) -> float:
    """Probability that a token reaches a part whose experts in group g number ``overlaps[g]``, under group-limited
    routing (``len(overlaps)`` groups of ``group_size`` experts, ``topk_group`` of them chosen uniformly, then
    top_k experts uniformly among the chosen groups' experts)."""
    n_groups = len(overlaps)
    pool = topk_group * group_size
    touched = [o for o in overlaps if o]
    untouched = n_groups - len(touched)
    # ways[j][n]: subsets of j touched groups whose overlaps sum to n
    ways: list[dict[int, int]] = [dict() for _ in range(topk_group + 1)]
    ways[0][0] = 1
    for o in touched:
        for j in range(min(topk_group, len(touched)), 0, -1):
            for n, count in ways[j - 1].items():
                ways[j][n + o] = ways[j].get(n + o, 0) + count
    missed = 0
    for j in range(topk_group + 1):
        fill = comb(untouched, topk_group - j)    # the other chosen groups hold none of the part's experts
        for n, count in ways[j].items():
            missed += count * fill * comb(pool - n, top_k)
    return 1.0 - missed / (comb(n_groups, topk_group) * comb(pool, top_k))


def expected_parts(experts: int, top_k: int, parts: tuple[tuple[int, ...], ...], n_group: int | None,
                   topk_group: int | None) -> float:
    """Expected distinct parts (each a tuple of expert indices) that one token's top-k experts fall in."""
    if n_group is None:
        return sum(1.0 - uniform_miss(experts, top_k, len(p)) for p in parts)
    size = experts // n_group
    total = 0.0
    for p in parts:
        overlaps = [0] * n_group
        for x in p:
            overlaps[x // size] += 1
        total += part_hit(tuple(overlaps), size, top_k, topk_group)
    return total


def rank_parts(experts: int, ep: int, ranks: list[list[int]] | None = None) -> tuple[tuple[int, ...], ...]:
    """The experts of each part: one part per list of EP indices in ``ranks`` (default: each EP rank alone)."""
    per = experts // ep
    ranks = ranks if ranks is not None else [[e] for e in range(ep)]
    return tuple(tuple(x for e in sorted(r) for x in range(e * per, (e + 1) * per)) for r in ranks)
