"""The joined matrix of a dataset, built once per root dataset and shared.

Every ``strategy="materialized"`` fit (an estimator's own, or one that
:class:`~ilargi_sklearn.planner.AutoPlan` chose) reads its joined matrix through
:func:`materialized_operator`. A dataset remembers the root it was sliced from
(``_root_token``, ``_root_rows``, ``_root_operator``), so the join of the root is
built once and a row slice (a cross-validation fold, a grid-search candidate's
training rows) takes its rows of it. The cache is bounded (entries and bytes), an
entry is dropped when its root dataset is garbage collected, and a hit gives the
same matrix that building the slice's own join would (the same entries, in the same
order), so it never changes a result.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from ilargi_sklearn._backend._ops import nbytes
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
    Operator,
)

if TYPE_CHECKING:  # the container stands above its caches
    from ilargi_sklearn.multisource._multi_source import MultiSourceDataset

__all__ = [
    "clear_materialization_cache",
    "is_materialization_cached",
    "materialized_dataset",
    "materialized_operator",
    "set_materialization_cache",
]


def _total_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
        return 8 * 2**30


class _MaterializedCache:
    """LRU of joined matrices, keyed by (root token, device).

    ``max_entries`` root datasets and ``max_bytes`` at most; an entry whose root
    operator is garbage collected is dropped by a finalizer.
    """

    def __init__(self, max_entries: int = 4, max_bytes: int | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes if max_bytes is not None else _total_memory() // 4
        # (matrix, bytes, seconds its join took to build)
        self._entries: OrderedDict[tuple[Any, str], tuple[Any, int, float]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        # Tokens of collected roots whose entries could not be dropped at once (the
        # finalizer ran while the lock was held): dropped by the next call.
        self._dead: list[Any] = []

    def _purge(self) -> None:
        while self._dead:
            token = self._dead.pop()
            for key in [k for k in self._entries if k[0] is token]:
                del self._entries[key]

    def get(self, token: Any, device: str) -> Any:
        with self._lock:
            self._purge()
            entry = self._entries.get((token, device))
            if entry is None:
                return None
            self._entries.move_to_end((token, device))
            return entry[0]

    def build_seconds(self, token: Any, device: str) -> float | None:
        """How long the cached join of ``token`` took to build (None: not cached)."""
        with self._lock:
            self._purge()
            entry = self._entries.get((token, device))
            return None if entry is None else entry[2]

    def __contains__(self, key: tuple[Any, str]) -> bool:
        with self._lock:
            self._purge()
            return key in self._entries

    def put(
        self,
        token: Any,
        device: str,
        matrix: Any,
        nbytes: int,
        root: Any,
        seconds: float = 0.0,
    ) -> None:
        if nbytes > self.max_bytes:
            return
        with self._lock:
            self._purge()
            self._entries[(token, device)] = (matrix, nbytes, float(seconds))
            self._entries.move_to_end((token, device))
            while len(self._entries) > self.max_entries or (
                sum(e[1] for e in self._entries.values()) > self.max_bytes
            ):
                self._entries.popitem(last=False)
        weakref.finalize(root, self.discard, token)

    def discard(self, token: Any) -> None:
        """Drop the entries of ``token`` (now, or at the next call if busy)."""
        self._dead.append(token)
        if self._lock.acquire(blocking=False):
            try:
                self._purge()
            finally:
                self._lock.release()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._dead.clear()

    def info(self, token: Any) -> dict[str, Any]:
        """Devices and bytes of ``token``'s joined matrices."""
        with self._lock:
            self._purge()
            mine = [(k[1], e[1]) for k, e in self._entries.items() if k[0] is token]
        return {"devices": [d for d, _ in mine], "bytes": int(sum(n for _, n in mine))}

    @property
    def nbytes(self) -> int:
        """Bytes of the matrices held."""
        with self._lock:
            self._purge()
            return sum(e[1] for e in self._entries.values())


_CACHE = _MaterializedCache()


def set_materialization_cache(max_entries: int = 4, max_bytes: int | None = None):
    """Bound the cache of joined matrices that materialized fits share.

    Parameters
    ----------
    max_entries : int, default=4
        Most root datasets (times devices) kept.
    max_bytes : int, optional
        Most bytes kept; default a quarter of the machine's memory. A joined matrix
        larger than this is never cached. ``max_bytes=0`` turns caching off.
    """
    _CACHE.max_entries = int(max_entries)
    _CACHE.max_bytes = _total_memory() // 4 if max_bytes is None else int(max_bytes)
    _CACHE.clear()


def clear_materialization_cache() -> None:
    """Drop every cached joined matrix (frees their memory)."""
    _CACHE.clear()


def _unwrap_affine(op: Operator) -> tuple[Operator, list[tuple[Any, Any]]]:
    layers = []
    while isinstance(op, AffineOperator):
        layers.append((op.scale, op.offset))
        op = op.base
    return op, layers


def _root_info(ds: MultiSourceDataset) -> tuple[Any, Any, FactorizedMatrix] | None:
    """(token, rows in the root or None, the root's factorized operator), when the
    dataset's root is known and consistent with it; else None (no caching)."""
    token = getattr(ds, "_root_token", None)
    if token is None:
        return None
    rows = getattr(ds, "_root_rows", None)
    root_op = getattr(ds, "_root_operator", None)
    base, _ = _unwrap_affine(ds.operator)
    root = base if rows is None else _unwrap_affine(root_op)[0]
    if not isinstance(base, FactorizedMatrix) or not isinstance(root, FactorizedMatrix):
        return None
    if (
        root.n_cols != base.n_cols
        or root.dtype != base.dtype
        or len(root.terms) != len(base.terms)
        or any(
            root.source_of_term(i) is not base.source_of_term(i)
            for i in range(len(root.terms))
        )
    ):
        return None
    if rows is not None:
        rows = np.asarray(rows)
        if rows.shape != (base.n_rows,):
            return None
    return token, rows, root


def is_materialization_cached(ds: Any, device: str = "cpu") -> bool:
    """Whether the joined matrix of ``ds``'s root is in the cache."""
    info = _root_info(ds)
    return info is not None and (info[0], device) in _CACHE


def materialization_seconds(ds: Any, device: str = "cpu") -> float | None:
    """How long the cached join of ``ds``'s root took to build (None: not cached)."""
    info = _root_info(ds)
    return None if info is None else _CACHE.build_seconds(info[0], device)


def materialized_operator(
    ds: MultiSourceDataset, device: str = "cpu"
) -> tuple[Operator, bool]:
    """The operator of ``ds`` over its joined matrix, built once per root dataset.

    The result computes what ``ds.operator.materialized()`` does (the same matrix
    under the same implicit scaling and centering), but the join of the root
    dataset is built once and cached (see :func:`set_materialization_cache`), and a
    row slice takes its rows of it. Operators that are not factorized (a Dask
    dataset, a matrix already) give ``ds.operator.materialized()``.

    Returns
    -------
    operator : Operator
    hit : bool
        Whether the joined matrix came from the cache.
    """
    info = _root_info(ds)
    if info is None:
        return ds.operator.materialized(), False
    token, rows, root = info
    M = _CACHE.get(token, device)
    hit = M is not None
    # Build the root's join only when the slice is most of it (a CV fold); for a
    # small slice its own join is cheaper.
    if M is None and (rows is None or 2 * rows.shape[0] >= root.n_rows):
        t0 = time.perf_counter()
        M = root.materialize()
        _CACHE.put(token, device, M, nbytes(M), root, time.perf_counter() - t0)
    base, layers = _unwrap_affine(ds.operator)
    A = base.materialize() if M is None else (M if rows is None else M[rows])
    op: Operator = MatrixOperator(A)
    for scale, offset in reversed(layers):
        op = AffineOperator(op, scale, offset)
    return op, hit


def materialized_dataset(
    ds: MultiSourceDataset, device: str = "cpu"
) -> tuple[MultiSourceDataset, bool]:
    """The dataset over its joined matrix, built once per root dataset.

    The result is a :class:`~ilargi_sklearn.MultiSourceDataset` whose operator is
    :func:`materialized_operator`'s, with the same feature names: an estimator
    fitted on it with ``strategy="materialized"`` computes exactly what it computes
    on ``ds`` itself.

    Parameters
    ----------
    ds : MultiSourceDataset
    device : str, default="cpu"

    Returns
    -------
    dataset : MultiSourceDataset
    hit : bool
        Whether the joined matrix came from the cache.
    """
    op, hit = materialized_operator(ds, device)
    return type(ds)(op, ds.feature_names, ds.source_names), hit
