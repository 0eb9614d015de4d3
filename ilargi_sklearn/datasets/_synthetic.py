"""Synthetic star schemas with a planted model (regression, classification, clustering).

The generator controls the quantities that decide whether factorized learning pays
(DESIGN.md 3): the tuple ratio (target rows per dimension row), the feature ratio
(dimension columns per base column), sparsity, the join type and overlapping columns.
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.utils import Bunch, check_random_state

from ilargi_sklearn.multisource import Join, MultiSourceDataset

__all__ = ["make_multi_source"]

_JOINS = ("left", "inner", "many_to_many")
_TASKS = ("regression", "classification", "clustering")
# Fraction of target rows without a match (left joins) or of dimension rows that no
# target row references (inner joins).
_UNMATCHED = 0.1


def _check_int(name, value, low):
    if (
        not isinstance(value, numbers.Integral)
        or isinstance(value, bool)
        or value < low
    ):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    return int(value)


def _check_real(name, value, low, high=np.inf, *, low_open=False):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    ok = ok and np.isfinite(value) and (value > low if low_open else value >= low)
    if not ok or value > high:
        bracket = "(" if low_open else "["
        raise ValueError(
            f"{name} must be a number in {bracket}{low}, {high}], got {value!r}."
        )
    return float(value)


def _split(total, parts):
    """``total`` columns over ``parts`` tables, as evenly as possible, each >= 1."""
    base = np.full(parts, total // parts)
    base[: total % parts] += 1
    return np.maximum(base, 1)


def _dimension(rs, r, c, sparsity, dtype):
    """A standard-normal ``r x c`` table with a fraction ``sparsity`` of zeros."""
    if sparsity >= 0.5:
        # Positional: the sixth parameter is random_state on old SciPy and rng (with
        # the same legacy meaning when positional) on SciPy >= 1.15.
        return sp.random(r, c, 1.0 - sparsity, "csr", dtype, rs, rs.standard_normal)
    S = rs.standard_normal((r, c))
    if sparsity > 0:
        S[rs.random_sample((r, c)) < sparsity] = 0.0
    return S.astype(dtype)


def make_multi_source(
    n_rows=10_000,
    *,
    n_sources=2,
    tuple_ratio=10.0,
    feature_ratio=2.0,
    n_base_features=5,
    sparsity=0.0,
    join="left",
    overlap=0,
    noise=0.1,
    task="regression",
    n_classes=2,
    random_state=None,
    return_frames=False,
    dtype=np.float64,
):
    """Generate a synthetic star schema with a planted model.

    A base (fact) table of ``n_rows`` rows and ``n_base_features`` columns references
    ``n_sources`` dimension tables through foreign keys. Each dimension table has
    ``r_k = n_rows / tuple_ratio`` rows; together they have
    ``feature_ratio * n_base_features`` columns, split as evenly as possible. The
    target follows a planted model of the joined matrix ``T``, so that it is
    learnable: linear for regression, logistic (softmax) for classification, and
    planted centroids for clustering.

    Parameters
    ----------
    n_rows : int, default=10_000
        Target (joined) rows, the rows of the base table.
    n_sources : int, default=2
        Number of dimension tables (the base table is not counted).
    tuple_ratio : float, default=10.0
        Target rows per dimension row: each dimension table has
        ``max(1, round(n_rows / tuple_ratio))`` rows. The redundancy that
        factorization saves grows with it.
    feature_ratio : float, default=2.0
        Columns of all dimension tables together per base column:
        ``max(n_sources, round(feature_ratio * n_base_features))`` dimension columns
        in all (at least one per table). With ``join="many_to_many"`` there are no
        base columns and ``n_base_features`` only sets this count.
    n_base_features : int, default=5
        Columns of the base table (standard normal, dense).
    sparsity : float in [0, 1), default=0.0
        Fraction of zero entries in the dimension tables (whose non-zeros are
        standard normal). Tables with ``sparsity >= 0.5`` are stored as CSR.
    join : {"left", "inner", "many_to_many"}, default="left"
        ``"left"``: every dimension table leaves about 10% of the target rows
        unmatched (foreign key -1, zeros in ``T``). ``"inner"``: every target row
        matches, and about 10% of each dimension table's rows are referenced by no
        target row (the rows an inner join drops). ``"many_to_many"``: the base table
        holds foreign keys only (a relationship table, no base features), every key
        matches.
    overlap : int, default=0
        Number of target columns that every dimension table supplies (the last
        ``overlap`` columns of each table, named ``shared_{j}``). Per target row the
        first dimension table that matched owns them (the ownership rule of
        DESIGN.md 2.1), so values are never added up. Needs ``n_sources >= 2``.
    noise : float, default=0.1
        Noise level, relative to the signal. Regression: Gaussian noise of standard
        deviation ``noise * std(T @ coef)`` (the planted model's R^2 is about
        ``1 / (1 + noise**2)``). Classification: labels are drawn from
        ``softmax((T @ coef + intercept) / noise)`` with standardized logits (the
        label is the arg-max when ``noise=0``). Clustering: each table's values are
        the planted centroid's plus Gaussian noise of standard deviation ``noise``.
    task : {"regression", "classification", "clustering"}, default="regression"
        The planted model.
    n_classes : int, default=2
        Classes (classification) or clusters (clustering).
    random_state : int, RandomState instance or None, default=None
        Seed for reproducible output.
    return_frames : bool, default=False
        Also return the tables as pandas DataFrames with :class:`~ilargi_sklearn.Join`
        specifications that rebuild the same dataset (see Returns).
    dtype : {np.float64, np.float32}, default=np.float64
        Dtype of the sources.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``dataset`` (MultiSourceDataset with sources ``"base"`` (when it has
        features), ``"dim1"``, ``"dim2"``, ...), ``target`` (float64 values for
        regression, int64 labels otherwise), ``coef`` (regression and binary
        classification: shape ``(n_features,)``; multiclass: ``(n_features,
        n_classes)``; clustering: the planted centroids, ``(n_classes,
        n_features)``), ``intercept``, ``indices`` (one index vector per dimension
        table, -1 for no match), ``feature_names`` and ``DESCR``. With
        ``return_frames=True`` also ``frames`` (dict of DataFrames: ``"base"`` with
        features ``x{j}``, foreign keys ``fk{k}`` and the target ``y``;
        ``"dim{k}"`` with key ``key`` and features ``d{k}_{j}`` and ``shared_{j}``),
        ``base_features``, ``joins`` and ``coalesce``, such that
        ``MultiSourceDataset.from_frames(frames["base"], base_features, joins,
        coalesce=coalesce)`` gives the same matrix.

    See Also
    --------
    sklearn.datasets.make_regression : single-table counterpart.
    sklearn.datasets.make_classification : single-table counterpart.
    sklearn.datasets.make_blobs : single-table counterpart for clustering.

    Notes
    -----
    Regression: ``y = T @ coef + intercept + e``. Classification:
    ``y = argmax_k (T @ coef + intercept)_k / noise + g_k`` with Gumbel noise ``g``
    (sampling from the softmax; binary: ``coef`` is the difference of the two
    classes' columns). Clustering: each target row gets a cluster ``c`` and joins
    dimension rows of cluster ``c`` only, so that the joined row is centroid ``c`` plus
    noise (apart from zeros of unmatched left-join rows and of ``sparsity``).

    Examples
    --------
    >>> from ilargi_sklearn.datasets import make_multi_source
    >>> data = make_multi_source(1000, tuple_ratio=20, random_state=0)
    >>> data.dataset.shape
    (1000, 15)
    >>> data.dataset.describe().sources["rows"].tolist()
    [1000, 50, 50]
    >>> r = data.target - data.dataset @ data.coef - data.intercept
    >>> bool(r.std() < 0.2 * data.target.std())
    True
    """
    n_rows = _check_int("n_rows", n_rows, 1)
    n_sources = _check_int("n_sources", n_sources, 1)
    n_base_features = _check_int("n_base_features", n_base_features, 1)
    n_classes = _check_int("n_classes", n_classes, 1)
    overlap = _check_int("overlap", overlap, 0)
    tuple_ratio = _check_real("tuple_ratio", tuple_ratio, 1.0)
    feature_ratio = _check_real("feature_ratio", feature_ratio, 0.0, low_open=True)
    sparsity = _check_real("sparsity", sparsity, 0.0, 1.0)
    noise = _check_real("noise", noise, 0.0)
    if sparsity >= 1.0:
        raise ValueError(f"sparsity must be < 1 (some non-zeros), got {sparsity!r}.")
    if join not in _JOINS:
        raise ValueError(f"join must be one of {_JOINS}, got {join!r}.")
    if task not in _TASKS:
        raise ValueError(f"task must be one of {_TASKS}, got {task!r}.")
    if task != "regression" and n_classes < 2:
        raise ValueError(f"n_classes must be >= 2 for task={task!r}, got {n_classes}.")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    rs = check_random_state(random_state)

    has_base = join != "many_to_many"
    d_base = n_base_features if has_base else 0
    r_dim = max(1, int(round(n_rows / tuple_ratio)))
    total = max(n_sources, int(round(feature_ratio * n_base_features)))
    widths = _split(total, n_sources)
    if overlap:
        if n_sources < 2:
            raise ValueError(
                f"overlap={overlap} needs n_sources >= 2, got {n_sources}."
            )
        if overlap > widths.min():
            raise ValueError(
                f"overlap={overlap} exceeds the narrowest dimension table "
                f"({int(widths.min())} columns); raise feature_ratio or lower overlap."
            )
    if task == "clustering" and r_dim < n_classes:
        raise ValueError(
            f"clustering needs at least n_classes={n_classes} rows per dimension table, "
            f"got {r_dim} (n_rows / tuple_ratio); lower tuple_ratio."
        )

    # Target columns: base, then each table's own columns; the shared columns sit
    # after dim1's own ones (where from_frames puts a coalesced column: at its
    # first occurrence).
    names = [f"base__x{j}" for j in range(d_base)]
    mappings, own_names = [], []
    shared_at = None
    for k, c in enumerate(widths, start=1):
        own = [f"d{k}_{j}" for j in range(c - overlap)]
        own_names.append(own)
        cols = list(range(len(names), len(names) + len(own)))
        names += [f"dim{k}__{n}" for n in own]
        if overlap:
            if shared_at is None:
                shared_at = len(names)
                names += [f"dim1__shared_{j}" for j in range(overlap)]
            cols += list(range(shared_at, shared_at + overlap))
        mappings.append(np.asarray(cols, dtype=np.int64))
    n_features = len(names)

    # Foreign keys (and, for clustering, the planted cluster of every row).
    y_cluster = rs.randint(n_classes, size=n_rows) if task == "clustering" else None
    indices, dim_cluster = [], []
    for _ in range(n_sources):
        pool = np.arange(r_dim)
        if join == "inner" and r_dim > 1:
            n_keep = max(1, int(round((1.0 - _UNMATCHED) * r_dim)))
            if task == "clustering":
                n_keep = max(n_keep, n_classes)
            pool = np.sort(rs.permutation(r_dim)[:n_keep])
        if task == "clustering":
            lab = np.empty(r_dim, dtype=np.int64)
            # Every cluster gets rows of the referenced pool.
            lab[pool] = rs.permutation(np.arange(pool.shape[0]) % n_classes)
            rest = np.setdiff1d(np.arange(r_dim), pool)
            lab[rest] = rs.randint(n_classes, size=rest.shape[0])
            dim_cluster.append(lab)
            idx = np.empty(n_rows, dtype=np.int64)
            pool_lab = lab[pool]
            for c in range(n_classes):
                members = pool[pool_lab == c]
                rows = np.flatnonzero(y_cluster == c)
                idx[rows] = members[rs.randint(members.shape[0], size=rows.shape[0])]
        else:
            idx = pool[rs.randint(pool.shape[0], size=n_rows)]
        if join == "left":
            idx[rs.random_sample(n_rows) < _UNMATCHED] = -1
        indices.append(idx)

    # Source tables.
    centers = None
    if task == "clustering":
        centers = rs.standard_normal((n_classes, n_features))
    if has_base:
        if task == "clustering":
            base = centers[y_cluster, :d_base] + noise * rs.standard_normal(
                (n_rows, d_base)
            )
        else:
            base = rs.standard_normal((n_rows, d_base))
        base = base.astype(dtype)
    dims = []
    for k in range(n_sources):
        if task == "clustering":
            C = centers[dim_cluster[k]][:, mappings[k]]
            D = C + noise * rs.standard_normal(C.shape)
            if sparsity > 0:
                D[rs.random_sample(D.shape) < sparsity] = 0.0
            D = sp.csr_matrix(D, dtype=dtype) if sparsity >= 0.5 else D.astype(dtype)
        else:
            D = _dimension(rs, r_dim, int(widths[k]), sparsity, dtype)
        dims.append(D)

    sources = ([base] if has_base else []) + dims
    indicators = ([None] if has_base else []) + indices
    source_names = (["base"] if has_base else []) + [
        f"dim{k}" for k in range(1, n_sources + 1)
    ]
    all_maps = ([np.arange(d_base)] if has_base else []) + mappings
    ds = MultiSourceDataset.from_matrices(
        sources, indicators, all_maps, names, source_names=source_names, dtype=dtype
    )

    # Planted model.
    if task == "regression":
        coef = rs.standard_normal(n_features)
        intercept = float(rs.standard_normal())
        signal = np.asarray(ds @ coef.astype(dtype), dtype=np.float64)
        scale = float(signal.std()) or 1.0
        y = signal + intercept + noise * scale * rs.standard_normal(n_rows)
    elif task == "classification":
        W = rs.standard_normal((n_features, n_classes))
        logits = np.asarray(ds @ W.astype(dtype), dtype=np.float64)
        if n_classes == 2:
            # Only the difference of the two columns matters: keep one vector.
            W = W[:, 1] - W[:, 0]
            logits = logits[:, 1] - logits[:, 0]
        mu, sd = logits.mean(axis=0), logits.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        coef, intercept = W / sd, -mu / sd
        z = (logits - mu) / sd
        if n_classes == 2:
            g = rs.logistic(size=n_rows) if noise > 0 else np.zeros(n_rows)
            y = (z + noise * g > 0).astype(np.int64)
        else:
            g = rs.gumbel(size=z.shape) if noise > 0 else np.zeros(z.shape)
            y = np.argmax(z + noise * g, axis=1).astype(np.int64)
        intercept = float(intercept) if n_classes == 2 else intercept
    else:
        coef, intercept, y = centers, None, y_cluster.astype(np.int64)

    out = Bunch(
        dataset=ds,
        target=y,
        coef=coef,
        intercept=intercept,
        indices=indices,
        feature_names=ds.feature_names,
        DESCR=make_multi_source.__doc__,
    )
    if return_frames:
        out.update(
            _frames(
                base if has_base else None, dims, indices, own_names, overlap, y, join
            )
        )
    return out


def _frames(base, dims, indices, own_names, overlap, y, join):
    """DataFrames and Join specifications that rebuild the generated dataset."""
    cols = {}
    base_features = []
    if base is not None:
        base_features = [f"x{j}" for j in range(base.shape[1])]
        cols.update({n: base[:, j] for j, n in enumerate(base_features)})
    cols.update({f"fk{k}": idx for k, idx in enumerate(indices, start=1)})
    cols["y"] = y
    frames = {"base": pd.DataFrame(cols)}
    shared = [f"shared_{j}" for j in range(overlap)]
    joins = []
    for k, (D, own) in enumerate(zip(dims, own_names), start=1):
        D = D.toarray() if sp.issparse(D) else D
        feats = own + shared
        frame = pd.DataFrame(D, columns=feats)
        frame.insert(0, "key", np.arange(D.shape[0], dtype=np.int64))
        frames[f"dim{k}"] = frame
        joins.append(
            Join(
                frame,
                left_on=f"fk{k}",
                right_on="key",
                features=feats,
                how="left" if join == "left" else "inner",
                name=f"dim{k}",
            )
        )
    return {
        "frames": frames,
        "base_features": base_features,
        "joins": joins,
        "coalesce": shared,
    }
