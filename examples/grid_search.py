"""Grid search over a factorized pipeline: scaler + logistic regression.

Run with ``python examples/grid_search.py`` (about 30 s on 2 cores). Set
``ILARGI_EXAMPLE_SMALL=1`` for a quick run on 5,000 flights.

``GridSearchCV`` treats the :class:`~ilargi_sklearn.MultiSourceDataset` like any
``X``: it slices rows for every fold (which slices the index vectors only: the
tables are shared by all folds) and clones the pipeline per candidate. The
:class:`~ilargi_sklearn.FactorizedStandardScaler` keeps centering and scaling
inside the operators, so the one-hot sources stay sparse and the join is never
built.
"""

import os
import time

import pandas as pd
from sklearn.model_selection import GridSearchCV, StratifiedKFold
from sklearn.pipeline import Pipeline

from ilargi_sklearn import FactorizedLogisticRegression, FactorizedStandardScaler
from ilargi_sklearn.datasets import load_flights

SMALL = os.environ.get("ILARGI_EXAMPLE_SMALL") == "1"


def main() -> None:
    data = load_flights(n_rows=5_000 if SMALL else 100_000)
    ds, y = data.dataset, data.target_late
    print(f"{ds!r}\n")

    pipe = Pipeline(
        [
            ("scale", FactorizedStandardScaler()),
            ("clf", FactorizedLogisticRegression(max_iter=200)),
        ]
    )
    grid = {
        "clf__C": [0.001, 0.01, 0.1, 1.0] if not SMALL else [0.01, 1.0],
        "clf__fit_intercept": [True, False],
    }
    folds = 2 if SMALL else 3
    search = GridSearchCV(
        pipe,
        grid,
        cv=StratifiedKFold(folds, shuffle=True, random_state=0),
        scoring="roc_auc",
    )
    t0 = time.perf_counter()
    search.fit(ds, y)
    n_fits = len(search.cv_results_["params"]) * folds + 1
    print(f"{n_fits} fits in {time.perf_counter() - t0:.1f} s\n")

    results = pd.DataFrame(search.cv_results_)
    cols = [
        "param_clf__C",
        "param_clf__fit_intercept",
        "mean_test_score",
        "mean_fit_time",
    ]
    print(
        results[cols]
        .sort_values("mean_test_score", ascending=False)
        .to_string(index=False)
    )
    print(f"\nbest: {search.best_params_}, ROC AUC {search.best_score_:.4f}")


if __name__ == "__main__":
    main()
