"""One-command GPU check: GPU-vs-CPU agreement, then factorized vs materialized timings.

Usage (repository root, a machine with one NVIDIA GPU, CuPy, NumPy, SciPy,
scikit-learn, pandas; no internet needed)::

    python benchmarks/gpu_check.py [--rows 1e6 1e7] [--out results/gpu_check.jsonl]

1. runs ``tests/gpu`` (every operator and the device-ready estimators against CPU);
2. times each operator and the estimators (linear and logistic regression,
   k-means, GNMF, the scaler), factorized and materialized,
   on GPU and on CPU, over synthetic star schemas (device synchronized, one warm-up
   discarded, median of ``--repeats``), writing one JSON line per measurement;
3. prints a short table last.

On a machine without a usable GPU it prints ``no GPU: <reason>`` and exits 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

OPS = ("matmul", "rmatmul", "gram", "col_sums", "row_sq_norms")


def _star(
    n_rows, n_dims=2, dim_rows=10_000, base_cols=4, dim_cols=8, seed=0, nonneg=False
):
    from ilargi_sklearn import MultiSourceDataset

    rng = np.random.default_rng(seed)
    draw = rng.random if nonneg else rng.standard_normal
    sources = [draw((n_rows, base_cols))]
    indicators = [None]
    for _ in range(n_dims):
        sources.append(draw((dim_rows, dim_cols)))
        indicators.append(rng.integers(0, dim_rows, n_rows))
    return MultiSourceDataset.from_matrices(sources, indicators)


def _timed(fn, sync, repeats):
    fn()  # warm-up, discarded
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _op_calls(op, xp, device):
    from ilargi_sklearn._backend._namespace import asarray_on

    rng = np.random.default_rng(1)
    X = asarray_on(rng.standard_normal((op.n_cols, 4)), xp, device)
    Y = asarray_on(rng.standard_normal((op.n_rows, 4)), xp, device)
    return {
        "matmul": lambda: op.matmul(X),
        "rmatmul": lambda: op.rmatmul(Y),
        "gram": lambda: op.gram(format="dense"),
        "col_sums": lambda: op.col_sums(),
        "row_sq_norms": lambda: op.row_sq_norms(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, nargs="+", default=[1e6, 1e7])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/gpu_check.jsonl")
    parser.add_argument("--skip-tests", action="store_true")
    args = parser.parse_args(argv)

    from ilargi_sklearn._backend._gpu import probe_gpu

    usable, reason = probe_gpu()
    if not usable:
        print(f"no GPU: {reason}")
        return 0
    print(f"GPU: {reason}")
    if not args.skip_tests:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "tests/gpu",
                "-q",
                "-p",
                "no:cacheprovider",
            ]
        )
        print(f"GPU tests: exit code {res.returncode}")

    import cupy

    from ilargi_sklearn.cluster import FactorizedKMeans
    from ilargi_sklearn.decomposition import FactorizedGNMF
    from ilargi_sklearn.linear_model import (
        FactorizedLinearRegression,
        FactorizedLogisticRegression,
    )
    from ilargi_sklearn.preprocessing import FactorizedStandardScaler

    # (name, estimator factory, target): fixed iteration counts so that the
    # timings compare plans, not convergence.
    estimators = (
        ("linear_regression", lambda **kw: FactorizedLinearRegression(**kw), "y"),
        (
            "logistic_regression",
            lambda **kw: FactorizedLogisticRegression(max_iter=20, tol=0.0, **kw),
            "labels",
        ),
        (
            "kmeans",
            lambda **kw: FactorizedKMeans(
                n_clusters=8, n_init=1, max_iter=10, tol=0.0, random_state=0, **kw
            ),
            None,
        ),
        (
            "gnmf",
            lambda **kw: FactorizedGNMF(
                n_components=8,
                init="random",
                max_iter=10,
                tol=0.0,
                random_state=0,
                **kw,
            ),
            None,
        ),
        ("standard_scaler", lambda **kw: FactorizedStandardScaler(**kw), None),
    )

    def gpu_sync():
        cupy.cuda.Device().synchronize()

    def no_sync():
        return None

    records = []
    for n in (int(r) for r in args.rows):
        ds_cpu = _star(n)
        # GNMF needs non-negative data: a second star schema of the same shape.
        ds_nonneg = _star(n, nonneg=True)
        y = np.random.default_rng(2).standard_normal(n)
        targets = {"y": y, "labels": (y > 0).astype(np.int64), None: None}
        for device in ("cpu", "gpu"):
            ds = ds_cpu if device == "cpu" else ds_cpu.to_device("gpu")
            sync = gpu_sync if device == "gpu" else no_sync
            fact = ds.operator
            mat = fact.materialized()
            for plan, op in (("factorized", fact), ("materialized", mat)):
                for name, fn in _op_calls(op, op.xp, op.device).items():
                    t = _timed(fn, sync, args.repeats)
                    records.append(
                        dict(
                            kind="operator",
                            name=name,
                            plan=plan,
                            device=device,
                            n_rows=n,
                            n_cols=ds.shape[1],
                            seconds=t,
                        )
                    )
                for name, make, target in estimators:
                    # The scaler has no strategy: its fit is column sums either way.
                    kw = {"device": device}
                    if name != "standard_scaler":
                        kw["strategy"] = plan
                    elif plan == "materialized":
                        continue
                    est = make(**kw)
                    yt = targets[target]
                    X_fit = ds_nonneg if name == "gnmf" else ds_cpu
                    t = _timed(
                        lambda est=est, X=X_fit, y=yt: est.fit(X, y),
                        sync,
                        # Fits are long: one timed run after the warm-up keeps the
                        # whole check under its 5-minute budget.
                        max(1, args.repeats // 3),
                    )
                    records.append(
                        dict(
                            kind="estimator",
                            name=name,
                            plan=plan,
                            device=device,
                            n_rows=n,
                            n_cols=ds.shape[1],
                            seconds=t,
                        )
                    )
            del mat
        del ds_nonneg
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    print(
        f"{'name':<20}{'device':<6}{'rows':>10}{'factorized':>12}{'materialized':>14}"
    )
    keyed = {
        (r["name"], r["device"], r["n_rows"], r["plan"]): r["seconds"] for r in records
    }
    for (name, device, n, plan), t in keyed.items():
        if plan == "factorized":
            m = keyed.get((name, device, n, "materialized"), float("nan"))
            print(f"{name:<20}{device:<6}{n:>10}{t:>12.4f}{m:>14.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
