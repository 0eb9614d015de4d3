"""Degree-2 interactions over joins: implicit polynomial features + ridge regression.

Usage::

    python benchmarks/bench_interactions.py [--grid TR:FR[:BASE],...] [--rows N]
        [--repeat N] [--threads N] [--big ROWS] [--out FILE]

For each synthetic star schema (``make_multi_source`` DataFrames, as in
``bench_estimators.py``) two plans fit the same model from the same DataFrames:

* ``factorized``: build the dataset (``from_frames``),
  :class:`~ilargi_sklearn.preprocessing.FactorizedPolynomialFeatures` (degree 2,
  nothing computed: the interactions stay implicit), then
  :class:`~ilargi_sklearn.linear_model.FactorizedRidge` (``solver="auto"``, which
  iterates on products for the implicit operator, whose gram is quartic);
* ``merge+sklearn``: ``pandas.merge``, ``PolynomialFeatures(2)`` on the joined
  matrix, then ``Ridge`` with scikit-learn's default solver (Cholesky on the dense
  matrix), which is what a user writes;
* ``merge+sklearn-lsqr``: the same with ``Ridge(solver="lsqr")``, the algorithm the
  factorized plan runs, to separate the representation's gain from the solver's.

Timing interleaves the plans in one child process, after a warm-up on 2,000 rows
(median of ``--repeat`` rounds); peak
memory is the growth of the resident set of a fresh child per plan (see
``_common.py``). Predictions on the training rows are compared between the plans.

``--big ROWS`` adds one case with ``ROWS`` rows whose materialized interaction
matrix does not fit in memory: only the factorized plan runs, and the record says how
large the materialized matrix would have been.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_estimators as be  # noqa: E402
from _common import (  # noqa: E402
    RSS_CHILD_ENV,
    format_bytes,
    hardware_info,
    peak_rss_call,
    print_table,
    run_json_child,
    write_records,
)
from sklearn.linear_model import Ridge  # noqa: E402
from sklearn.preprocessing import PolynomialFeatures  # noqa: E402

from ilargi_sklearn.linear_model import FactorizedRidge  # noqa: E402
from ilargi_sklearn.preprocessing import FactorizedPolynomialFeatures  # noqa: E402

PLANS = ("factorized", "merge+sklearn", "merge+sklearn-lsqr")
ALPHA = 1.0
# Ridge's LSQR tolerance (scikit-learn's default), the same on both sides.
TOL = 1e-4
GOAL_SPEEDUP, GOAL_MEMORY = 10.0, 0.1


def _fit(plan: str, inp: be.Inputs) -> Any:
    if plan == "factorized":
        X = FactorizedPolynomialFeatures(degree=2).fit_transform(be.build_dataset(inp))
        return X, FactorizedRidge(alpha=ALPHA, tol=TOL).fit(X, inp.y)
    X = PolynomialFeatures(degree=2).fit_transform(be.join_baseline(inp))
    solver = "lsqr" if plan.endswith("lsqr") else "auto"
    return X, Ridge(alpha=ALPHA, tol=TOL, solver=solver).fit(X, inp.y)


def _n_poly(d: int) -> int:
    return 1 + d + d * (d + 1) // 2


def child(case: dict[str, Any], mode: str, repeat: int, plans: list[str]) -> None:
    inp = be.synthetic_inputs(case)
    d = len(be.build_dataset(inp).feature_names)
    out: dict[str, Any] = {"n_features": d, "n_poly_features": _n_poly(d)}
    if mode == "memory":
        plan = plans[0]
        out["peak_bytes"] = peak_rss_call(lambda: _fit(plan, inp))
    else:
        tiny = inp.head(be.WARMUP_ROWS)
        for plan in plans:
            _fit(plan, tiny)
        times: dict[str, list[float]] = {p: [] for p in plans}
        preds: dict[str, np.ndarray] = {}
        for _ in range(repeat):
            for plan in plans:  # interleaved
                gc.collect()
                t0 = time.perf_counter()
                X, model = _fit(plan, inp)
                times[plan].append(time.perf_counter() - t0)
                preds[plan] = np.asarray(model.predict(X), dtype=np.float64)
                out.setdefault("n_iter", {})[plan] = np.ravel(
                    getattr(model, "n_iter_", None) or [0]
                ).tolist()
                del X, model
        out["seconds"] = {p: statistics.median(t) for p, t in times.items()}
        ref = preds.get("merge+sklearn-lsqr", preds.get("merge+sklearn"))
        if ref is not None:
            scale = max(float(np.max(np.abs(ref))), 1e-12)
            out["pred_max_rel_diff"] = {
                p: float(np.max(np.abs(v - ref)) / scale) for p, v in preds.items()
            }
    print(json.dumps(out))


def _cases(grid: str | None, rows: int) -> list[dict[str, Any]]:
    cases = be.synthetic_cases(False, grid or "20:2,20:5,50:2,50:5")
    for c in cases:
        c["n_rows"] = rows
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--grid", default=None, help="TR:FR[:BASE],... (default 20/50 x 2/5)"
    )
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--big", type=int, default=None, help="rows of the no-fit case")
    p.add_argument(
        "--out", default=os.path.join("benchmarks", "results", "interactions.jsonl")
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-mode", default="time", help=argparse.SUPPRESS)
    p.add_argument("--plans", default=",".join(PLANS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(
            json.loads(args.child), args.child_mode, args.repeat, args.plans.split(",")
        )
        return 0
    env = {}
    if args.threads:
        # Set before the child imports NumPy: OpenBLAS and OpenMP read them at load
        # (and the package's kernels follow OMP_NUM_THREADS).
        env = {v: str(args.threads) for v in be.THREAD_VARS}
    script = os.path.abspath(__file__)
    common = {"hardware": hardware_info(), "threads": args.threads or "default"}
    records, rows = [], []
    cases = [(c, list(PLANS)) for c in _cases(args.grid, args.rows)]
    if args.big:
        big = dict(_cases("20:5:10", args.big)[0])
        cases.append((big, ["factorized"]))
    for case, plans in cases:
        label = be.case_label(case)
        argv_ = [script, "--child", json.dumps(case), "--plans", ",".join(plans)]
        t0 = time.perf_counter()
        timed = run_json_child(
            [*argv_, "--repeat", str(args.repeat)], env=env, timeout=3600
        )
        peaks = {}
        for plan in plans:
            res = run_json_child(
                [
                    script,
                    "--child",
                    json.dumps(case),
                    "--plans",
                    plan,
                    "--child-mode",
                    "memory",
                ],
                env={**RSS_CHILD_ENV, **env},
                timeout=3600,
            )
            peaks[plan] = res["peak_bytes"]
        n, pp = case["n_rows"], timed["n_poly_features"]
        rec = {
            **common,
            "benchmark": "interactions",
            "dataset": label,
            "case": case,
            "n_features": timed["n_features"],
            "n_poly_features": pp,
            "materialized_poly_bytes": 8.0 * n * pp,
            "seconds": timed["seconds"],
            "peak_bytes": peaks,
            "n_iter": timed.get("n_iter"),
            "pred_max_rel_diff": timed.get("pred_max_rel_diff"),
            "wall_seconds": time.perf_counter() - t0,
        }
        records.append(rec)
        s, f = rec["seconds"], rec["seconds"]["factorized"]
        rows.append(
            {
                "case": label,
                "d": timed["n_features"],
                "poly cols": pp,
                "poly matrix": format_bytes(8.0 * n * pp),
                "fact s": f"{f:.2f}",
                "sk s": f"{s['merge+sklearn']:.2f}" if "merge+sklearn" in s else "-",
                "sk/fact": f"{s['merge+sklearn'] / f:.1f}x"
                if "merge+sklearn" in s
                else "-",
                "sk-lsqr/fact": f"{s['merge+sklearn-lsqr'] / f:.1f}x"
                if "merge+sklearn-lsqr" in s
                else "-",
                "peak fact": format_bytes(peaks["factorized"]),
                "peak sk": format_bytes(peaks.get("merge+sklearn")),
                "mem fact/sk": f"{peaks['factorized'] / peaks['merge+sklearn']:.3f}"
                if "merge+sklearn" in peaks
                else "-",
            }
        )
        print(json.dumps(rec), flush=True)
    write_records(args.out, records)
    print_table(rows, list(rows[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
