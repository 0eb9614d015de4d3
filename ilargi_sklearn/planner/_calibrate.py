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
import statistics
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.utils import check_random_state

from ilargi_sklearn.planner._features import plan_features
from ilargi_sklearn.planner._hardware import cache_dir, hardware_info, machine_id

__all__ = [
    "balanced_schemas",
    "calibrate",
    "default_workloads",
    "make_estimator",
    "time_workload",
]

logger = logging.getLogger(__name__)

RECORD_VERSION = 1
ESTIMATORS = ("linear", "logistic", "kmeans", "gnmf")

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
    "linear": ({"solver": "normal", "tol": 1e-4}, {"solver": "gd", "max_iter": 10}),
    "logistic": ({"max_iter": 8, "tol": 0.0},),
    "kmeans": tuple(
        {"n_clusters": k, "max_iter": 5, "tol": 0.0, "n_init": 1, "random_state": 0}
        for k in (4, 8, 16)
    ),
    "gnmf": tuple(
        {"n_components": r, "max_iter": 6, "tol": 0.0, "random_state": 0}
        for r in (4, 8, 12)
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
    "linear": {"solver": "gd", "max_iter": 3},
    "logistic": {"max_iter": 3, "tol": 0.0},
    "kmeans": {"n_clusters": 8, "max_iter": 3, "tol": 0.0, "n_init": 1},
    "gnmf": {
        "n_components": 4,
        "max_iter": 3,
        "tol": 0.0,
        "init": "random",
        "random_state": 0,
    },
}
# Schemas whose joined matrix would exceed this many bytes are not generated.
_MAX_JOINED_BYTES = 300e6


def make_estimator(kind: str, params: dict[str, Any] | None = None):
    """An estimator of kind ``"linear"``, ``"logistic"``, ``"kmeans"`` or ``"gnmf"``."""
    from ilargi_sklearn.cluster import FactorizedKMeans
    from ilargi_sklearn.decomposition import FactorizedGNMF
    from ilargi_sklearn.linear_model import (
        FactorizedLinearRegression,
        FactorizedLogisticRegression,
    )

    classes = {
        "linear": FactorizedLinearRegression,
        "logistic": FactorizedLogisticRegression,
        "kmeans": FactorizedKMeans,
        "gnmf": FactorizedGNMF,
    }
    if kind not in classes:
        raise ValueError(f"estimator must be one of {list(classes)}, got {kind!r}.")
    return classes[kind](**(params or {}))


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
        Estimator kinds.
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
            if kind == "logistic":
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
        from ilargi_sklearn.datasets import make_multi_source

        b = make_multi_source(**data, random_state=0)
        return b.dataset, np.asarray(b.target, dtype=np.float64)


def _targets(w: dict[str, Any], ds, y):
    kind = w["estimator"]
    if kind == "linear":
        return ds, np.asarray(y, dtype=np.float64)
    if kind == "logistic":
        k = w.get("classes")
        if k is None:  # Hamlet: the dataset's own labels
            return ds, np.asarray(y)
        edges = np.quantile(y, np.linspace(0, 1, k + 1)[1:-1])
        return ds, np.digitize(y, edges)
    if kind == "gnmf" and "hamlet" not in w["data"]:
        return ds**2, None  # non-negative, same sparsity
    return ds, None


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
) -> dict[str, Any]:
    """Time the CPU plans of one fit, interleaved, after a discarded warm-up.

    The materialized plan is timed in two parts: building the joined matrix and
    fitting on it (``strategy="materialized"`` over the built matrix), so that both
    the uncached time (their sum) and the cached time are known.

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
    from ilargi_sklearn.dataset import MatrixOperator, MultiSourceDataset

    times: dict[str, list[float]] = {"factorized": [], "materialize": [], "fit": []}
    n_iter = None

    def run_once():
        nonlocal n_iter
        est = clone(estimator).set_params(strategy="factorized")
        t0 = time.perf_counter()
        est.fit(X, y)
        tf = time.perf_counter() - t0
        n_iter = _n_iter(est)
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
    from ilargi_sklearn.planner._cost_model import read_records

    me = machine_id()
    return {r["workload"] for r in read_records(path) if r.get("machine") == me}


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
) -> Path | None:
    """Time every plan on a grid of workloads and train the cost model.

    Runs the workloads of :func:`default_workloads` (synthetic star schemas that
    vary target rows, tuple ratio, feature ratio, sparsity, number of sources and
    join type, and the Hamlet datasets when ``hamlet_path`` is given) with every
    estimator, times each CPU plan (warm-up discarded, median of ``repeats``; the
    materialized plan both with and without building the join), appends the
    records to ``records_path`` as it goes, and trains the CatBoost model on all
    records of the file. Workloads already in the file (on this machine) are
    skipped, so an interrupted run resumes.

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
    estimators : list of str, default=("linear", "logistic", "kmeans", "gnmf")
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
        Train and save the model after timing.

    Returns
    -------
    model_path : pathlib.Path or None
        The trained model (None when ``train=False``).

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
    reserve = min(30.0, 0.1 * budget_seconds) if train else 0.0
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
                timings = time_workload(est, X, yy, repeats=repeats)
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
    from ilargi_sklearn.planner._cost_model import train_cost_model

    return train_cost_model(path, model_path)
