"""Agreement with scikit-learn on badly scaled data: columns and targets whose mean
is large against their spread.

Usage::

    python benchmarks/bench_numerics.py [--rows 2048] [--out FILE]
    PYTHONPATH=/path/to/other/tree python benchmarks/bench_numerics.py  # another tree

A base table (3 columns) and a dimension table (2 columns) joined on a key, one
column of mean ``ratio`` and spread 1 (in the base table, or in the dimension
table under an inner or a left join with 20% unmatched rows), a target linear in
the standardized columns (plus ``target_mean``). Per estimator, the largest
relative error of the factorized fit against scikit-learn's fit on the joined
table: standardized coefficients (per unit of each column's spread, relative to
the largest), the scaler's ``var_`` and PCA's ``explained_variance_``
(relative per entry). The reference is scikit-learn on the joined table minus its
column means taken in extended precision: a constant shift per column, on which
scikit-learn centers exactly (on the raw table it carries ``eps * mean`` in its
means, up to 2e-6 at 1e12; its ``covariance_eigh`` PCA cancels like raw sums, so
PCA is compared with its ``"full"`` solver). Prints one table; appends JSON lines
to ``--out`` (default ``benchmarks/results/numerics.jsonl``).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RATIOS = (1.0, 1e4, 1e8, 1e10, 1e12)
LAYOUTS = ("base", "dim inner", "dim left")


def make_data(ratio, layout, n, target_mean=3.0, seed=0):
    from ilargi_sklearn import MultiSourceDataset

    rng = np.random.default_rng(seed)
    r = 40
    base = rng.standard_normal((n, 3)) * [1.0, 2.0, 0.5]
    dim = rng.standard_normal((r, 2)) * [1.5, 1.0]
    if layout == "base":
        base[:, 1] += ratio
    else:
        dim[:, 0] += ratio
    fk = rng.integers(0, r, n)
    if layout == "dim left":
        fk[rng.random(n) < 0.2] = -1
    ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    T = ds.materialize("dense")
    TL = np.asarray(T, dtype=np.longdouble)
    m = np.asarray(TL.mean(axis=0), dtype=np.float64)
    Tc = np.asarray(TL - m, dtype=np.float64)
    sd = T.std(axis=0)
    y = (Tc / sd) @ rng.uniform(0.5, 2.0, T.shape[1])
    y = y + 0.1 * rng.standard_normal(n) + target_mean
    return ds, T, Tc, y


def coef_error(a, b, sd):
    a, b = np.atleast_2d(a) * sd, np.atleast_2d(b) * sd
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def entry_error(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def pairs():
    from sklearn import linear_model as sk
    from sklearn.model_selection import KFold

    import ilargi_sklearn.linear_model as fl

    tight = {"tol": 1e-10, "max_iter": 100_000}
    cv = {"alphas": 6, "cv": KFold(3), **tight}
    return {
        "LinearRegression": (fl.FactorizedLinearRegression(), sk.LinearRegression()),
        "Ridge": (fl.FactorizedRidge(alpha=3.0), sk.Ridge(alpha=3.0)),
        "Lasso": (
            fl.FactorizedLasso(alpha=0.01, **tight),
            sk.Lasso(alpha=0.01, **tight),
        ),
        "ElasticNet": (
            fl.FactorizedElasticNet(alpha=0.02, l1_ratio=0.5, **tight),
            sk.ElasticNet(alpha=0.02, l1_ratio=0.5, **tight),
        ),
        "RidgeCV(loo)": (
            fl.FactorizedRidgeCV(alphas=[0.01, 1.0, 100.0]),
            sk.RidgeCV(alphas=[0.01, 1.0, 100.0]),
        ),
        "LassoCV": (fl.FactorizedLassoCV(**cv), sk.LassoCV(**cv)),
    }


def measure(ratio, layout, n, target_mean):
    from sklearn.decomposition import PCA
    from sklearn.preprocessing import StandardScaler

    from ilargi_sklearn.decomposition import FactorizedPCA
    from ilargi_sklearn.preprocessing import FactorizedStandardScaler

    ds, T, Tc, y = make_data(ratio, layout, n, target_mean)
    sd = T.std(axis=0)
    out = {}
    for name, (est, ref) in pairs().items():
        try:
            est.fit(ds, y)
            ref.fit(Tc, y)
            out[name] = coef_error(est.coef_, ref.coef_, sd)
        except Exception as exc:  # an error is a result here
            out[name] = f"error: {type(exc).__name__}"
    if target_mean == 3.0:
        var = FactorizedStandardScaler().fit(ds).var_
        out["scaler var_"] = entry_error(var, StandardScaler().fit(Tc).var_)
        if layout != "dim left":
            ev = FactorizedPCA(n_components=3).fit(ds).explained_variance_
            ref = PCA(n_components=3, svd_solver="full").fit(Tc).explained_variance_
            out["PCA variances"] = entry_error(ev, ref)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--out", default=os.path.join(HERE, "results", "numerics.jsonl"))
    args = p.parse_args()
    sys.path.insert(0, HERE)
    from _common import write_records

    import ilargi_sklearn

    where = os.path.dirname(os.path.abspath(ilargi_sklearn.__file__))
    print(f"package: {where}; {args.rows} rows")
    warnings.simplefilter("ignore")
    records = []
    cases = [(r, lay, 3.0) for lay in LAYOUTS for r in RATIOS]
    cases += [(1.0, "base", t) for t in (1e4, 1e8, 1e10, 1e12)]
    for ratio, layout, target_mean in cases:
        errors = measure(ratio, layout, args.rows, target_mean)
        label = f"X {ratio:.0e} {layout}" + (
            f", y mean {target_mean:.0e}" if target_mean != 3.0 else ""
        )
        cells = "  ".join(
            f"{k}={v:.1e}" if isinstance(v, float) else f"{k}={v}"
            for k, v in errors.items()
        )
        print(f"{label:28s} {cells}")
        records.append(
            {
                "benchmark": "numerics",
                "package": where,
                "ratio": ratio,
                "layout": layout,
                "target_mean": target_mean,
                "n_rows": args.rows,
                "errors": errors,
            }
        )
    write_records(args.out, records)


if __name__ == "__main__":
    main()
