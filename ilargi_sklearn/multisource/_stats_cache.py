"""The store of sufficient statistics that gram-based fits share.

The fits of a hyper-parameter search share their statistics: every candidate of a
cross-validation fold needs the same gram ``T^T S T`` and ``T^T S Y`` of the fold's
training rows. :func:`~ilargi_sklearn.multisource._statistics.centered_gram` keeps
the additive raw sums of each (root dataset, row subset, weights, target) here,
keyed by the lineage its caller computed at the estimator's boundary
(:func:`~ilargi_sklearn.multisource._lineage.lineage_of`), so a search computes
each fold's statistics once and derives the centered figures from them.

This module is the storage: a :class:`~ilargi_sklearn.multisource._bounded.BoundedCache`
of host arrays bounded by the ``statistics_cache_bytes`` setting
(:func:`~ilargi_sklearn.set_config`), whose entries of a root dataset go when its
operator is garbage collected, and the counters that
:meth:`~ilargi_sklearn.MultiSourceDataset.cache_info` reports. Nothing here is
pickled with a dataset: a worker process starts with its own, empty cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ilargi_sklearn._config import cache_budget, get_config, set_config
from ilargi_sklearn.multisource._bounded import BoundedCache
from ilargi_sklearn.multisource._lineage import ROOT, UNIT, array_key, lineage_of
from ilargi_sklearn.multisource._operators import AffineOperator

__all__ = [
    "clear_statistics_cache",
    "set_statistics_cache",
    "statistics_cache_info",
    "statistics_cached",
]

_STATS = BoundedCache(
    "statistics", max_bytes=lambda: cache_budget("statistics_cache_bytes")
)

# The counters reported per root dataset besides hits and misses.
_COUNTERS = ("downdates", "fallbacks")


def set_statistics_cache(max_bytes: int | None = None) -> None:
    """Bound the cache of sufficient statistics that gram-based fits share.

    The older name of ``set_config(statistics_cache_bytes=max_bytes,
    slice_memo_bytes=max_bytes)`` (``"auto"`` for None, see
    :func:`~ilargi_sklearn.set_config`), followed by a clear of both caches.

    Every fit of a gram-based estimator (least squares, ridge, the elastic net,
    PCA) on a :class:`~ilargi_sklearn.MultiSourceDataset` or one of its row slices
    keeps the raw sums of its rows here (``T^T S T``, ``s^T T``, ``T^T S Y``, ...),
    so that the candidates of a grid search compute each fold's statistics once.

    Parameters
    ----------
    max_bytes : int, optional
        Most bytes kept (least recently used entries go first); default a
        sixteenth of the machine's memory. ``max_bytes=0`` turns caching off.
    """
    budget = "auto" if max_bytes is None else int(max_bytes)
    set_config(statistics_cache_bytes=budget, slice_memo_bytes=budget)
    clear_statistics_cache()


def clear_statistics_cache() -> None:
    """Drop every cached statistic and memoized slice (frees their memory;
    results do not change)."""
    from ilargi_sklearn.multisource._slices import _SLICES

    _STATS.clear()
    _SLICES.clear()


def statistics_cache_info(ds: Any) -> dict[str, Any]:
    """What the statistics cache holds for ``ds``'s root dataset (see
    :meth:`~ilargi_sklearn.MultiSourceDataset.cache_info`)."""
    token = getattr(ds, "_root_token", None)
    info = _STATS.info(token) if token is not None else _STATS.info(object())
    out = {
        "entries": info["entries"],
        "bytes": info["bytes"],
        "hits": info["hits"],
        "misses": info["misses"],
    }
    for name in _COUNTERS:
        out[name] = info.get(name, 0)
    out["budget_bytes"] = int(cache_budget("statistics_cache_bytes"))
    out["total_bytes"] = _STATS.nbytes
    return out


def has_gram_entry(sums: Any) -> bool:
    """Whether an X-sums entry (``_statistics._XSums``) holds the gram."""
    return getattr(sums, "gram", None) is not None


def statistics_cached(ds: Any, strategy: str, sample_weight: Any = None) -> str | None:
    """Whether a gram-based fit of ``ds`` with ``strategy`` would find its gram here.

    What :func:`~ilargi_sklearn.multisource._statistics.centered_gram` would look
    up, asked without computing anything: the key is built by the fit's own key
    function (:func:`~ilargi_sklearn.multisource._lineage.lineage_of`; the sources
    are not read), and the entries are only looked at (no hit is counted, the LRU
    order does not change).

    Parameters
    ----------
    ds : MultiSourceDataset
        The dataset (or row slice) a fit would be given.
    strategy : {"factorized", "materialized"}
        The operator the fit computes with (their sums are kept apart).
    sample_weight : array-like, optional

    Returns
    -------
    str or None
        ``"fold"``: the slice's own gram is cached; ``"root"``: its root's is, and
        the slice's would be downdated from it (with ``statistics_downdating`` on:
        a factorized slice of at least half the root, unit weights, no implicit
        scaling; the test rows' gram is then one pass over the other rows, which
        the caller counts); None: the fit computes its gram (also whenever the
        key cannot be known for sure: an implicitly scaled materialized operator,
        a device other than the data's).
    """
    op = getattr(ds, "operator", None)
    if not _STATS.enabled or op is None:
        return None
    if isinstance(op, AffineOperator) and strategy != "factorized":
        return None  # the materialized operator's key is known only when built
    lineage = lineage_of(ds, op, strategy)
    if lineage is None:
        return None
    w_key = UNIT if sample_weight is None else weights_key(sample_weight, op)
    if _STATS.holds(lineage.key() + ("X", w_key), has_gram_entry):
        return "fold"
    rows = lineage.rows
    if (
        get_config()["statistics_downdating"]
        and strategy == "factorized"
        and sample_weight is None
        and rows is not None
        and not lineage.variant
        and 2 * rows.shape[0] >= lineage.n_root
    ):
        root_key = lineage.key(ROOT) + ("X", UNIT)
        if _STATS.holds(root_key, has_gram_entry):
            return "root"
    return None


def weights_key(sample_weight: Any, op: Any) -> str:
    """The key of weights as a fit validates them (float64 where ``op`` lives):
    a planner asking with the user's list keys what the fit will."""
    if isinstance(sample_weight, np.ndarray) or not hasattr(sample_weight, "shape"):
        sample_weight = np.asarray(sample_weight, dtype=np.float64)
    return array_key(sample_weight)
