"""Costs that many layouts of one search share, computed once per search.

A layout search screens tens of thousands of layouts of one model on one cluster. Most of what a layout costs
depends on a few of its keys only: a rank's parameter count on (tp, pp, vpp, schedule, split, ep, etp), the
activations a schedule keeps in flight on (schedule, pp, micro-batches, vpp, EP overlap, rank, chunk shares).
Inside ``with shared_costs():`` the functions that compute such a figure keep it under a key made of exactly the
inputs it reads, so the next layout with the same inputs gets the same float back; outside the block every call
computes afresh, as before.

The key must name everything the computation reads, or a layout would get another's figure:
``tests/test_search_scale.py`` compares cached and uncached screening over a sample of layouts.

Objects that are loaded once and shared by every layout (the hardware, the cluster) enter a key by identity
(:class:`Same`), which holds them so that their identity cannot be reused while the cache lives; the model by its
contents (:func:`by_value`: a model written inline is parsed again for every layout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

#: the cache of the search running in this context (None: no search, nothing is kept)
_CACHE: ContextVar[dict | None] = ContextVar("simtrain_shared_costs", default=None)
_MISSING = object()


class Same:
    """A key part that is equal only to the very same object (hashed by identity, held while the key lives)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Same) and other.obj is self.obj


@contextmanager
def shared_costs(keep: dict | None = None) -> Iterator[dict]:
    """Keep shared figures for the duration of the block (nested blocks use the outer one's cache); ``keep``: a
    cache to continue (a search's worker screens many chunks of one search)."""
    cache = _CACHE.get()
    if cache is not None:
        yield cache
        return
    cache = {} if keep is None else keep
    token = _CACHE.set(cache)
    try:
        yield cache
    finally:
        _CACHE.reset(token)


def shared(key: tuple, compute: Callable[[], T]) -> T:
    """``compute()``, or the value kept under ``key`` by an earlier call in the same :func:`shared_costs` block.
    ``key`` starts with the name of the figure and lists every input ``compute`` reads."""
    cache = _CACHE.get()
    if cache is None:
        return compute()
    hit = cache.get(key, _MISSING)
    if hit is _MISSING:
        hit = cache[key] = compute()
    return hit


def by_value(model) -> Any:
    """A pydantic model (a ModelSpec) as a key part equal for equal contents: a model written inline in a scenario
    is parsed again for every layout, so its identity would never repeat. Its JSON is taken once per object and
    cache (the cache holds the object, so its identity cannot be reused meanwhile); outside a cache, the object."""
    cache = _CACHE.get()
    if cache is None:
        return Same(model)
    seen = cache.setdefault(("by_value",), {})
    hit = seen.get(id(model))
    if hit is None or hit[0] is not model:
        hit = seen[id(model)] = (model, (type(model).__qualname__, model.model_dump_json()))
    return hit[1]
