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

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ilargi_sklearn._backend._ops import nbytes
from ilargi_sklearn._config import cache_budget, get_config, set_config
from ilargi_sklearn.multisource._bounded import BoundedCache
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
    Operator,
)

if TYPE_CHECKING:  # the container stands above its caches
    from ilargi_sklearn.multisource._multi_source import MultiSourceDataset

__all__ = [
    "cached_table",
    "clear_materialization_cache",
    "is_materialization_cached",
    "is_table_cached",
    "materialized_dataset",
    "materialized_operator",
    "set_materialization_cache",
]

# The join cache: (root token, device) -> (joined matrix, seconds its join took
# to build), and (root token, device, key) -> (a table derived from the join,
# seconds): the trees' joined table of tree features, see :func:`cached_table`.
# Bounded by the ``materialization_cache_*`` settings; a root's entries go when
# its operator is collected.


_CACHE = BoundedCache(
    "join",
    max_entries=lambda: get_config()["materialization_cache_entries"],
    max_bytes=lambda: cache_budget("materialization_cache_bytes"),
)


def set_materialization_cache(max_entries: int = 4, max_bytes: int | None = None):
    """Bound the cache of joined matrices that materialized fits share.

    The older name of ``set_config(materialization_cache_entries=max_entries,
    materialization_cache_bytes=max_bytes)`` (see :func:`~ilargi_sklearn.set_config`),
    followed by a clear of the cache.

    Parameters
    ----------
    max_entries : int, default=4
        Most root datasets (times devices) kept.
    max_bytes : int, optional
        Most bytes kept; default a quarter of the machine's memory. A joined matrix
        larger than this is never cached. ``max_bytes=0`` turns caching off.
    """
    set_config(
        materialization_cache_entries=int(max_entries),
        materialization_cache_bytes="auto" if max_bytes is None else int(max_bytes),
    )
    _CACHE.clear()


def clear_materialization_cache() -> None:
    """Drop every cached joined matrix (frees their memory)."""
    _CACHE.clear()


def join_cache_info(token: Any) -> dict[str, Any]:
    """Devices and bytes of ``token``'s joined matrices."""
    keys = _CACHE.keys(token)
    return {
        "devices": [k[1] for k in keys if len(k) == 2],
        # Derived tables (the trees' joined table: kind "trees"), per device.
        "tables": [(k[2][0], k[1]) for k in keys if len(k) == 3],
        "bytes": _CACHE.info(token)["bytes"],
    }


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
    return info is not None and _CACHE.holds((info[0], device))


def materialization_seconds(
    ds: Any, device: str = "cpu", key: tuple | None = None
) -> float | None:
    """How long the cached join of ``ds``'s root took to build (with ``key``: its
    table of :func:`cached_table`); None: not cached."""
    info = _root_info(ds)
    if info is None:
        return None
    full = (info[0], device) if key is None else (info[0], device, key)
    entry = _CACHE.get(full, count=False, touch=False)
    return None if entry is None else entry[1]


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
    entry = _CACHE.get((token, device))
    M = None if entry is None else entry[0]
    hit = M is not None
    # Build the root's join only when the slice is most of it (a CV fold); for a
    # small slice its own join is cheaper.
    if M is None and (rows is None or 2 * rows.shape[0] >= root.n_rows):
        t0 = time.perf_counter()
        M = root.materialize()
        seconds = time.perf_counter() - t0
        # (the matrix, and how long its join took to build: the planner
        # subtracts it from a materialized fit's time)
        if _CACHE.put((token, device), (M, seconds), nbytes(M)):
            _CACHE.watch(root, group=token)
    base, layers = _unwrap_affine(ds.operator)
    A = base.materialize() if M is None else (M if rows is None else M[rows])
    op: Operator = MatrixOperator(A)
    for scale, offset in reversed(layers):
        op = AffineOperator(op, scale, offset)
    return op, hit


def cached_table(
    ds: MultiSourceDataset,
    key: tuple,
    build: Callable[[FactorizedMatrix], np.ndarray],
    device: str = "cpu",
) -> tuple[np.ndarray, bool]:
    """A dense table derived row by row from ``ds``'s join, built once per root
    dataset and ``key`` and kept beside its joined matrix.

    ``build(op)`` computes the table of a factorized operator: one row per row
    of ``op``, each computed from that row alone (the trees' joined table of
    tree features, NaN where a join did not match). That is what makes a row
    slice's rows of its root's table the table of the slice itself, so a hit
    never changes a result. As :func:`materialized_operator`, the root's table is
    built only when the slice is most of it; the table is read-only.

    Parameters
    ----------
    ds : MultiSourceDataset
    key : tuple
        Hashable, naming the table (its kind first: ``("trees", ...)``) and
        everything ``build`` depends on besides the data.
    build : callable
    device : str, default="cpu"

    Returns
    -------
    table : ndarray
    hit : bool
        Whether the table came from the cache.
    """
    info = _root_info(ds)
    if info is None or not isinstance(ds.operator, FactorizedMatrix):
        return build(ds.operator), False
    token, rows, root = info
    full = (token, device, key)
    entry = _CACHE.get(full)
    T = None if entry is None else entry[0]
    hit = T is not None
    if T is None and (rows is None or 2 * rows.shape[0] >= root.n_rows):
        t0 = time.perf_counter()
        T = build(root)
        seconds = time.perf_counter() - t0
        T.flags.writeable = False
        if _CACHE.put(full, (T, seconds), nbytes(T)):
            _CACHE.watch(root, group=token)
    if T is None:
        return build(ds.operator), False
    return (T if rows is None else T[rows]), hit


def is_table_cached(ds: Any, key: tuple, device: str = "cpu") -> bool:
    """Whether :func:`cached_table` would find ``ds``'s table ``key`` (its
    root's) in the cache; looked up, never built."""
    info = _root_info(ds)
    return info is not None and _CACHE.holds((info[0], device, key))


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
