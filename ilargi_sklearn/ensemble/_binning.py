"""Binning per source: the thresholds scikit-learn's ``_BinMapper`` computes on the
joined column, computed on the sources.

A tree feature lives in one source (a numeric column, or the one-hot columns of a
categorical column of a dataset built from frames, folded back into one categorical
feature). The joined column holds source row ``j`` once per target row that takes
it, so its quantiles are those of the source column with row ``j`` weighted by
that count: the bin thresholds come from the source's rows (``r_k`` values) and the
counts, never from the ``n`` joined values. scikit-learn draws its subsample of
200,000 rows for the quantiles as target-row indices; the same draw, counted per
source row, gives the same weights and so the same thresholds.

The binned sources are ``uint8`` matrices, one per group of tree features that
share a source and an index vector, each with one extra row of missing bins that
unmatched target rows (index -1 of a left or outer join) point at: the joined
binned matrix is never built. NaN inside a source is missing too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.lib.stride_tricks import sliding_window_view

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn._backend._namespace import to_numpy
from ilargi_sklearn.ensemble import _trees_numba  # noqa: F401 (the kernels)

__all__ = [
    "ALMOST_INF",
    "BinnedData",
    "BinMapper",
    "TreeLayout",
    "find_thresholds",
    "raw_groups",
]

#: Row indices of the trees (index vectors, partitions): int32 halves the bytes
#: a node's passes read against int64.
ROW_DTYPE = np.int32

#: Thresholds are clipped here (scikit-learn's and LightGBM's ``AvoidInf``).
ALMOST_INF = 1e300


def find_thresholds(
    values: np.ndarray, weights: np.ndarray, max_bins: int, weighted: bool
) -> np.ndarray:
    """Bin thresholds of a column whose value ``values[j]`` occurs ``weights[j]``
    times: those ``_find_binning_thresholds`` returns on the expanded column.

    Parameters
    ----------
    values : ndarray of float64 of shape (m,)
        Distinct or repeated values (NaN: missing, ignored).
    weights : ndarray of float64 of shape (m,) or None
        Occurrences (integers) of each value, or its sample weight when
        ``weighted``; entries of weight 0 are ignored. None: each value once.
    max_bins : int
        Bins for non-missing values.
    weighted : bool
        Quantiles by weight (scikit-learn's ``_weighted_percentile`` with
        ``average=True``) instead of by count (``np.percentile`` with the
        ``"averaged_inverted_cdf"`` method).

    Returns
    -------
    ndarray of float64
        Increasing thresholds: value ``x`` falls in bin ``i`` when
        ``thresholds[i - 1] < x <= thresholds[i]``.
    """
    if weights is None:
        # Every value once (a base table without subsample).
        v = np.asarray(values, dtype=np.float64)
        v = v[~np.isnan(v)]
        distinct, counts = np.unique(v, return_counts=True)
        inverse = None
    else:
        keep = (weights > 0) & ~np.isnan(values)
        v = np.asarray(values[keep], dtype=np.float64)
        w = np.asarray(weights[keep], dtype=np.float64)
        distinct, inverse = np.unique(v, return_inverse=True)
    if distinct.shape[0] <= 1:
        return np.asarray([], dtype=np.float64)
    if distinct.shape[0] <= max_bins:
        # The same expression as scikit-learn's, for the same rounding.
        thresholds = sliding_window_view(distinct, 2).mean(axis=1)
    else:
        percentiles = np.linspace(0, 100, num=max_bins + 1)[1:-1]
        if inverse is None:
            agg = counts.astype(np.float64)
        else:
            agg = np.bincount(inverse, weights=w, minlength=distinct.shape[0])
        if not weighted:
            # The expanded column has at most the subsample's 200,000 values (or
            # the training rows when fewer): the counts are exact integers, and
            # np.percentile on the same multiset gives the same thresholds.
            expanded = np.repeat(distinct, np.rint(agg).astype(np.int64))
            thresholds = np.percentile(
                expanded, percentiles, method="averaged_inverted_cdf"
            )
        else:
            thresholds = _weighted_percentiles(distinct, agg, percentiles)
    unique = np.unique(thresholds)
    if unique.shape[0] != thresholds.shape[0]:
        thresholds = unique
    np.clip(thresholds, a_min=None, a_max=ALMOST_INF, out=thresholds)
    return thresholds


def _weighted_percentiles(
    distinct: np.ndarray, weights: np.ndarray, percentiles: np.ndarray
) -> np.ndarray:
    """scikit-learn's weighted "averaged inverted CDF" on sorted distinct values
    with aggregated (positive) weights.

    The percentile is the first value whose cumulative weight reaches the rank;
    where the rank ends exactly on a value's cumulative weight, the mean of it and
    the next value. Aggregating equal values does not change which value that is.
    """
    cdf = np.cumsum(weights)
    last = distinct.shape[0] - 1
    eps = np.finfo(np.float64).eps
    out = np.empty(percentiles.shape[0])
    for p_idx, p in enumerate(percentiles):
        rank = p / 100 * cdf[-1]
        if rank == 0:
            rank = np.nextafter(rank, rank + 1)
        i = min(int(np.searchsorted(cdf, rank)), last)
        if cdf[i] - rank > eps:
            out[p_idx] = distinct[i]
        else:
            out[p_idx] = (distinct[i] + distinct[min(i + 1, last)]) / 2
    return out


# --------------------------------------------------------------------- layout
@dataclass
class TreeLayout:
    """The features the trees split on, in the trees' own order.

    scikit-learn's ``HistGradientBoosting*`` moves the categorical features to the
    front (its ``ColumnTransformer`` output): the trees here use that order too,
    so that ties between features and ``max_features`` draws resolve alike.

    Attributes
    ----------
    names : list of str
        Name of each tree feature (a categorical column of a dataset built from
        frames is named after the column, ``"{source}__{column}"``).
    columns : list of ndarray of int
        The input columns each tree feature reads: one for a numeric feature (or
        a categorical one given as a number), the one-hot columns of a category.
    is_categorical : ndarray of bool
        Categorical tree features.
    natural : ndarray of int
        Tree feature index of each feature in input order (categories at the
        position of their first one-hot column).
    """

    names: list[str]
    columns: list[np.ndarray]
    is_categorical: np.ndarray
    natural: np.ndarray
    onehot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @property
    def n_features(self) -> int:
        return len(self.names)

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        columns: Sequence[np.ndarray],
        is_categorical: Sequence[bool],
        onehot: Sequence[bool],
    ) -> TreeLayout:
        """A layout from features in input order (reordered categorical first)."""
        is_cat = np.asarray(is_categorical, dtype=bool)
        order = np.concatenate([np.flatnonzero(is_cat), np.flatnonzero(~is_cat)])
        natural = np.empty(order.shape[0], dtype=np.int64)
        natural[order] = np.arange(order.shape[0])
        return cls(
            names=[names[i] for i in order],
            columns=[np.asarray(columns[i], dtype=np.int64) for i in order],
            is_categorical=is_cat[order],
            natural=natural,
            onehot=np.asarray(onehot, dtype=bool)[order],
        )


@dataclass
class RawGroup:
    """Raw tree values of some tree features that share a source and row map.

    ``values`` has one row per source row (float64: numbers, or the position of a
    category among its one-hot columns; NaN: missing); ``idx`` maps target rows
    to source rows (-1: unmatched, missing), None for the identity.
    """

    values: np.ndarray
    idx: np.ndarray | None
    features: np.ndarray


def _onehot_codes(S: Any, cols: np.ndarray) -> np.ndarray:
    """Position of the non-zero among ``cols`` per row of ``S``; NaN for none."""
    if sp.issparse(S):
        sub = sp.csr_matrix(S[:, cols])
        sub.eliminate_zeros()
        counts = np.diff(sub.indptr)
        out = np.full(sub.shape[0], np.nan)
        has = counts > 0
        out[has] = sub.indices[sub.indptr[:-1][has]]
        return out
    sub = np.asarray(S[:, cols])
    nz = sub != 0
    out = np.argmax(nz, axis=1).astype(np.float64)
    out[~nz.any(axis=1)] = np.nan
    return out


def _column(S: Any, j: int) -> np.ndarray:
    if sp.issparse(S):
        return np.asarray(S[:, [j]].toarray()[:, 0], dtype=np.float64)
    return np.asarray(S[:, j], dtype=np.float64)


def _term_values(S: Any, specs: list[tuple[int, np.ndarray]], layout) -> np.ndarray:
    """Raw values of the tree features ``specs`` = ``(feature, source columns)``.

    A dense source whose columns are all numeric features, in order, is used as it
    is (the base table is not copied: it has a row per target row).
    """
    if (
        isinstance(S, np.ndarray)
        and S.ndim == 2
        and S.dtype.kind == "f"
        and len(specs) == S.shape[1]
        and all(
            not layout.onehot[f] and cols.shape[0] == 1 and int(cols[0]) == c
            for c, (f, cols) in enumerate(specs)
        )
    ):
        return S
    out = np.empty((S.shape[0], len(specs)), dtype=np.float64)
    for c, (f, cols) in enumerate(specs):
        if layout.onehot[f]:
            out[:, c] = _onehot_codes(S, cols)
        else:
            out[:, c] = _column(S, int(cols[0]))
    return out


def raw_groups(op: Any, layout: TreeLayout) -> list[RawGroup]:
    """The raw tree values of the operator ``op``, one group per source term.

    A plain matrix is one identity group. A factorized one gives one group per
    term (source and row map); a feature whose columns several terms supply (a
    coalesced column, owned row by row) is gathered into an identity group of
    target rows, NaN where no owner matched.
    """
    from ilargi_sklearn.multisource._operators import FactorizedMatrix

    if not isinstance(op, FactorizedMatrix):
        A = to_numpy(op.A) if hasattr(op, "A") else to_numpy(op)
        specs = [(f, layout.columns[f]) for f in range(layout.n_features)]
        return [
            RawGroup(_term_values(A, specs, layout), None, np.arange(layout.n_features))
        ]
    n = op.n_rows
    owners: dict[int, list[tuple[int, int]]] = {}
    for t_idx, t in enumerate(op.terms):
        for j, c in enumerate(np.asarray(t.cols)):
            owners.setdefault(int(c), []).append((t_idx, j))
    per_term: dict[int, list[tuple[int, np.ndarray]]] = {}
    derived: list[int] = []
    for f in range(layout.n_features):
        cols = layout.columns[f]
        holders = [owners.get(int(c), []) for c in cols]
        terms = {t for h in holders for t, _ in h}
        if len(terms) == 1 and all(len(h) == 1 for h in holders):
            t_idx = terms.pop()
            per_term.setdefault(t_idx, []).append(
                (f, np.asarray([h[0][1] for h in holders], dtype=np.int64))
            )
        else:
            derived.append(f)
    groups = []
    for t_idx, specs in per_term.items():
        t = op.terms[t_idx]
        S = to_numpy(t.S)
        idx = (
            None
            if t.rows.is_identity
            else to_numpy(t.rows.idx).astype(np.int64, copy=False)
        )
        groups.append(
            RawGroup(
                _term_values(S, specs, layout),
                idx,
                np.asarray([f for f, _ in specs], dtype=np.int64),
            )
        )
    if derived:
        values = np.full((n, len(derived)), np.nan)
        for c, f in enumerate(derived):
            # Each target cell has at most one owner (the ownership rule).
            for t_idx, t in enumerate(op.terms):
                sel = [
                    (k, j)
                    for k, col in enumerate(layout.columns[f])
                    for t2, j in owners.get(int(col), [])
                    if t2 == t_idx
                ]
                if not sel:
                    continue
                S = to_numpy(t.S)
                idx = np.arange(n) if t.rows.is_identity else to_numpy(t.rows.idx)
                hit = idx >= 0
                if layout.onehot[f]:
                    # A category split over terms: positions of the feature's
                    # columns that this term owns.
                    pos = np.asarray([k for k, _ in sel], dtype=np.float64)
                    code = _onehot_codes(S, np.asarray([j for _, j in sel]))
                    ok = ~np.isnan(code)
                    part = np.full(S.shape[0], np.nan)
                    part[ok] = pos[code[ok].astype(np.int64)]
                else:
                    part = _column(S, sel[0][1])
                vals = part[idx[hit]]
                take = ~np.isnan(vals)
                rows = np.flatnonzero(hit)[take]
                values[rows, c] = vals[take]
        groups.append(RawGroup(values, None, np.asarray(derived, dtype=np.int64)))
    return groups


# ------------------------------------------------------------------ binned data
@dataclass
class BinnedData:
    """Binned sources and their index vectors: the trees' view of the data.

    Attributes
    ----------
    bins : tuple of ndarray of uint8 of shape (r_g + 1, c_g)
        Binned values of each group's tree features, C-contiguous; the last row
        is all missing bins (where unmatched target rows point).
    idx : tuple of ndarray of int32
        Row of ``bins[g]`` of each target row (unmatched: the last row); an empty
        array for an identity group (target row ``i`` is row ``i``).
    feature_group, feature_col : ndarray of int64 of shape (n_features,)
        Group and column of each tree feature.
    n_rows : int
    """

    bins: tuple
    idx: tuple
    feature_group: np.ndarray
    feature_col: np.ndarray
    n_rows: int

    @property
    def n_groups(self) -> int:
        return len(self.bins)

    def group_features(self, g: int) -> np.ndarray:
        """Tree features of group ``g``, in its column order."""
        feats = np.flatnonzero(self.feature_group == g)
        return feats[np.argsort(self.feature_col[feats])]

    def rows_of(self, g: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Row of ``bins[g]`` of target rows ``rows`` (all when None)."""
        ix = self.idx[g]
        if ix.shape[0] == 0:
            return np.arange(self.n_rows) if rows is None else np.asarray(rows)
        return ix if rows is None else ix[rows]

    def take(self, rows: np.ndarray) -> BinnedData:
        """The target rows ``rows`` (sources shared, index vectors composed)."""
        rows = np.asarray(rows, dtype=ROW_DTYPE)
        idx = tuple(rows.copy() if ix.shape[0] == 0 else ix[rows] for ix in self.idx)
        return BinnedData(
            self.bins, idx, self.feature_group, self.feature_col, rows.shape[0]
        )

    def column(self, f: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Binned values of tree feature ``f`` on target rows ``rows``."""
        g = int(self.feature_group[f])
        return self.bins[g][self.rows_of(g, rows), int(self.feature_col[f])]

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.bins) + sum(i.nbytes for i in self.idx))


def group_weights(
    group: RawGroup,
    rows: np.ndarray | None,
    weights: np.ndarray | None = None,
) -> np.ndarray | None:
    """Per source row of ``group``: how often target rows ``rows`` (all ``n_rows``
    when None) take it, summing ``weights`` instead of counting when given.
    Rows may repeat."""
    r = group.values.shape[0]
    if group.idx is None:
        if rows is None:
            # Each row once: None, no n-length vector of ones.
            return None if weights is None else np.asarray(weights, float)
        return np.bincount(rows, weights=weights, minlength=r).astype(np.float64)
    src = group.idx if rows is None else group.idx[rows]
    hit = src >= 0
    w = None if weights is None else weights[hit]
    return np.bincount(src[hit], weights=w, minlength=r).astype(np.float64)


class BinMapper:
    """Thresholds per tree feature, fitted on source rows with their join weights.

    Parameters
    ----------
    n_bins : int
        Bins including the missing-value bin (``max_bins + 1``).
    """

    def __init__(self, n_bins: int) -> None:
        self.n_bins = int(n_bins)
        self.missing_values_bin_idx_ = self.n_bins - 1

    def fit(
        self,
        groups: list[RawGroup],
        layout: TreeLayout,
        weights: list[np.ndarray],
        weighted: bool,
        known: list[np.ndarray],
    ) -> BinMapper:
        """Thresholds from per-group row ``weights`` (counts of the subsample or
        sample weights); categories from ``known`` (counts over every row of X).
        """
        max_bins = self.n_bins - 1
        F = layout.n_features
        self.bin_thresholds_: list[np.ndarray] = [np.empty(0)] * F
        self.is_categorical_ = layout.is_categorical.astype(np.uint8)
        n_non_missing = np.zeros(F, dtype=np.uint32)
        numeric = []
        for grp, w, kn in zip(groups, weights, known):
            for c, f in enumerate(grp.features):
                col = grp.values[:, c]
                if not layout.is_categorical[f]:
                    numeric.append((f, col, w))
                    continue
                present = ~np.isnan(col) if kn is None else (kn > 0) & ~np.isnan(col)
                cats = np.unique(col[present])
                if cats.shape[0] > max_bins:
                    raise ValueError(
                        f"Categorical feature {layout.names[f]!r} is expected to "
                        f"have a cardinality <= {max_bins} but actually has a "
                        f"cardinality of {cats.shape[0]}."
                    )
                self.bin_thresholds_[f] = cats
                n_non_missing[f] = cats.shape[0]

        def task(t: int) -> None:
            # Each feature's own slots: the same thresholds on any thread
            # (NumPy's sorts release the GIL, so features sort in parallel).
            f, col, w = numeric[t]
            thresholds = find_thresholds(col, w, max_bins, weighted)
            self.bin_thresholds_[f] = thresholds
            n_non_missing[f] = thresholds.shape[0] + 1

        _launcher.run_tasks(task, len(numeric), _launcher.n_threads())
        self.n_bins_non_missing_ = n_non_missing
        return self

    def _bin_column(self, col: np.ndarray, f: int, out: np.ndarray) -> None:
        """Bins of ``col`` into ``out``, in blocks of rows (bounded temporaries)."""
        if (
            not self.is_categorical_[f]
            and col.dtype == np.float64
            and numba_available()
        ):
            # A binary search per value, compiled: NumPy's searchsorted on
            # unsorted values costs several times more per value.
            n = col.shape[0]
            threads = _launcher.n_threads()
            n_chunks = _launcher.chunks(
                n, _launcher.MIN_CHUNK_ROWS["tree_bin"], threads
            )
            # The kernel's table: the thresholds (at most 254) padded with +inf.
            padded = np.full(256, np.inf)
            t = self.bin_thresholds_[f]
            padded[: t.shape[0]] = t
            head = (col, padded, self.missing_values_bin_idx_, out)
            try:
                _launcher.launch("tree_bin", head, n, max(n_chunks, 1), threads)
                return
            except CompiledUnavailable:
                pass
        step = 1 << 16
        for start in range(0, col.shape[0], step):
            sl = slice(start, start + step)
            out[sl] = self._bin_block(np.asarray(col[sl], dtype=np.float64), f)

    def _bin_block(self, col: np.ndarray, f: int) -> np.ndarray:
        t = self.bin_thresholds_[f]
        missing = np.isnan(col)
        if self.is_categorical_[f]:
            pos = np.searchsorted(t, col)
            ok = ~missing & (pos < t.shape[0])
            ok[ok] = t[pos[ok]] == col[ok]
            out = np.where(ok, pos, self.missing_values_bin_idx_)
        else:
            out = np.searchsorted(t, col, side="left")
            out[missing] = self.missing_values_bin_idx_
        return out.astype(np.uint8)

    def transform(
        self, groups: list[RawGroup], n_rows: int, n_features: int
    ) -> BinnedData:
        """The binned groups (a pad row of missing bins each) and index vectors."""
        bins, idx = [], []
        feature_group = np.zeros(n_features, dtype=np.int64)
        feature_col = np.zeros(n_features, dtype=np.int64)
        for g, grp in enumerate(groups):
            r, c = grp.values.shape
            B = np.full((r + 1, c), self.missing_values_bin_idx_, dtype=np.uint8)
            for j, f in enumerate(grp.features):
                self._bin_column(grp.values[:, j], int(f), B[:r, j])
                feature_group[f] = g
                feature_col[f] = j
            bins.append(B)
            if grp.idx is None:
                idx.append(np.zeros(0, dtype=ROW_DTYPE))
            else:
                ix = grp.idx.astype(ROW_DTYPE)
                ix[ix < 0] = r
                idx.append(ix)
        return BinnedData(tuple(bins), tuple(idx), feature_group, feature_col, n_rows)
