"""What the package's caches hold for a dataset (``ds.cache_info()``), and the
operator a fit with a strategy computes with (``ds.operator_for``: the join cache's
for ``"materialized"``).

The functions here are methods of :class:`MultiSourceDataset` (assigned in its
class body): ``self`` is the dataset.
"""

from __future__ import annotations

from typing import Any

from ilargi_sklearn._backend._namespace import is_cupy_namespace, is_numpy_namespace
from ilargi_sklearn.multisource._operators import Operator

__all__ = ["cache_device", "cache_info", "operator_for"]


def operator_for(self: Any, strategy: str = "factorized") -> Operator:
    """The operator a fit with ``strategy`` computes with.

    ``"factorized"``: :attr:`operator`. ``"materialized"``: the operator over
    the joined matrix, under the same implicit scaling and centering; the join
    of the root dataset (the one row slices come from) is built once and
    cached for every fit on it and its slices (a grid search's folds), see
    :func:`~ilargi_sklearn.planner.set_materialization_cache`. This is the one
    place where the package decides to build the join.

    Parameters
    ----------
    strategy : {"factorized", "materialized"}

    Returns
    -------
    Operator
    """
    from ilargi_sklearn.multisource._cache import materialized_operator

    if strategy == "factorized":
        return self._op
    if strategy != "materialized":
        raise ValueError(
            f"strategy must be 'factorized' or 'materialized', got {strategy!r}."
        )
    return materialized_operator(self, self._cache_device())[0]


def cache_info(self: Any) -> dict[str, Any]:
    """What the package's caches hold for this dataset's root.

    A row slice (a cross-validation fold) shares its root's entries, so this
    reports the same for the root and every slice of it.

    Returns
    -------
    dict
        ``"materialized"``: the root's joined matrix (``devices`` it is cached
        for), the tables derived from the join (``tables``: ``(kind, device)``
        pairs, kind ``"trees"`` for the gradient-boosted trees' joined table of
        tree features) and the ``bytes`` of both, see
        :func:`~ilargi_sklearn.planner.set_materialization_cache`;
        ``"statistics"``: the gram-based fits' sufficient statistics
        (``entries``, ``bytes``, ``hits``, ``misses``, ``downdates`` and
        ``fallbacks`` of the downdating guard, the cache's ``budget_bytes`` and
        ``total_bytes`` over all datasets), see
        :func:`~ilargi_sklearn.multisource.set_statistics_cache`.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedRidge
    >>> rng = np.random.default_rng(0)
    >>> ds = MultiSourceDataset.from_matrices(
    ...     [rng.normal(size=(8, 2)), rng.normal(size=(3, 2))],
    ...     [None, np.array([0, 1, 2, 0, 1, 2, 0, 1])],
    ... )
    >>> _ = FactorizedRidge().fit(ds, rng.normal(size=8))
    >>> info = ds.cache_info()["statistics"]
    >>> info["entries"], info["misses"]
    (2, 2)
    """
    from ilargi_sklearn.multisource._cache import join_cache_info
    from ilargi_sklearn.multisource._stats_cache import statistics_cache_info

    return {
        "materialized": join_cache_info(self._root_token),
        "statistics": statistics_cache_info(self),
    }


def cache_device(self: Any) -> str:
    """The materialization cache's key for where the sources live (a plan's
    device name where it is one)."""
    if is_numpy_namespace(self._op.xp):
        return "cpu"
    return "gpu" if is_cupy_namespace(self._op.xp) else str(self.device)
