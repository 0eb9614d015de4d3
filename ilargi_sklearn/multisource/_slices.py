"""The gathered rows of the index arrays a search slices with again and again.

scikit-learn's searches draw their folds once and hand the same index arrays to
every candidate (``X[train]``, ``X[test]``). ``ds[idx]`` for an integer index
array gathers the base rows once per (dataset, index array) and keeps them here
with the digest of the rows (the statistics cache's key,
:mod:`~ilargi_sklearn.multisource._lineage`); every ``ds[idx]`` wraps them in a
new dataset, so that changing one slice's attributes is never seen through the
next. An entry is used only while its dataset and index array are alive and the
array equals a copy taken when it was stored (a changed array misses). Bounded by
the ``slice_memo_entries`` and ``slice_memo_bytes`` settings
(:func:`~ilargi_sklearn.set_config`; 0 turns it off), in the bytes a slice holds
of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ilargi_sklearn._backend._ops import nbytes
from ilargi_sklearn._config import cache_budget, get_config
from ilargi_sklearn.multisource._bounded import BoundedCache

__all__ = ["gathered_rows"]

_SLICES = BoundedCache(
    "slice",
    max_entries=lambda: get_config()["slice_memo_entries"],
    max_bytes=lambda: cache_budget("slice_memo_bytes"),
)


def _memoizable(key: Any) -> bool:
    # What the splitters hand over: 1-D integer arrays (masks and slices are cheap
    # to recognize but rarer; lists cannot be weakly referenced).
    return isinstance(key, np.ndarray) and key.ndim == 1 and key.dtype.kind in "iu"


def gathered_rows(ds: Any, key: Any, gather: Callable[[], tuple]) -> tuple:
    """``gather()`` for ``ds[key]``: what the slice is made of (its operator, its
    rows in the root, the memo of the rows' digest), kept for this dataset and
    index array when ``key`` is an integer array and the memo is on."""
    if not (_memoizable(key) and _SLICES.enabled):
        return gather()
    k = (id(ds), id(key))
    entry = _SLICES.get(k, count=False)
    # Outside the lock: one pass over the indices, far below a gather's.
    if entry is not None and np.array_equal(entry[0], key):
        return entry[1]
    parts = gather()
    # The entry goes with its dataset or its index array (ids are reused after a
    # collection: the watch drops the entry before that can happen).
    _SLICES.watch(ds, key=k)
    _SLICES.watch(key, key=k)
    _SLICES.put(k, (key.copy(), parts), _own_bytes(parts[0], ds))
    return parts


def _own_bytes(op: Any, ds: Any) -> int:
    """Bytes a slice's operator holds of its own: its operator's, less the
    sources it shares with its root (a factorized slice's joined sources; what is
    left is its base rows and index vectors, or a matrix slice's rows)."""
    total = int(op.nbytes)
    mine, root = _factorized(op), _factorized(getattr(ds, "_root_operator", None))
    if mine is None or root is None:
        return total
    shared = {id(t.S) for t in root.terms}
    seen: set[int] = set()
    for t in mine.terms:
        if id(t.S) in shared and id(t.S) not in seen:
            seen.add(id(t.S))
            total -= nbytes(t.S)
    return total


def _factorized(op: Any) -> Any:
    """The factorized matrix under ``op``'s implicit layers (None: there is none)."""
    while op is not None and not hasattr(op, "terms"):
        op = getattr(op, "base", None)
    return op
