"""scikit-learn compatibility: the model-selection tools on MultiSourceDataset
input (the estimator checks are in test_common.py)."""

import pickle

import numpy as np
import pytest
from _helpers import classification_data, regression_data
from sklearn.base import clone
from sklearn.cluster import KMeans
from sklearn.decomposition import NMF
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.model_selection import (
    GridSearchCV,
    RandomizedSearchCV,
    cross_val_score,
    cross_validate,
    train_test_split,
)
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from ilargi_sklearn import (
    FactorizedGNMF,
    FactorizedKMeans,
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
)
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import random_dataset


def test_train_test_split_keeps_datasets():
    ds, y = regression_data()
    X_tr, X_te, y_tr, y_te = train_test_split(ds, y, test_size=0.25, random_state=0)
    assert type(X_tr) is type(ds) and type(X_te) is type(ds)
    assert len(X_tr) == len(y_tr) and len(X_te) == len(y_te)
    T = ds.materialize("dense")
    _, T_te = train_test_split(T, test_size=0.25, random_state=0)
    np.testing.assert_allclose(X_te.materialize("dense"), T_te)


def test_grid_search_matches_sklearn_on_materialized():
    ds, y = classification_data(seed=1, n_rows=150)
    T = ds.materialize("dense")
    grid = {"C": [0.01, 0.1, 1.0, 10.0]}
    ours = GridSearchCV(
        FactorizedLogisticRegression(tol=1e-10, max_iter=1000), grid, cv=3
    )
    ref = GridSearchCV(LogisticRegression(tol=1e-10, max_iter=1000), grid, cv=3)
    ours.fit(ds, y)
    ref.fit(T, y)
    assert ours.best_params_ == ref.best_params_
    np.testing.assert_allclose(
        ours.cv_results_["mean_test_score"],
        ref.cv_results_["mean_test_score"],
        atol=1e-6,
    )


def test_grid_search_parallel_and_pipeline():
    ds, y = regression_data(seed=2, n_rows=120)
    pipe = Pipeline(
        [("scale", FactorizedStandardScaler()), ("lr", FactorizedLinearRegression())]
    )
    grid = {"scale__with_std": [True, False], "lr__fit_intercept": [True, False]}
    serial = GridSearchCV(pipe, grid, cv=3).fit(ds, y)
    parallel = GridSearchCV(pipe, grid, cv=3, n_jobs=2).fit(ds, y)
    assert serial.best_params_ == parallel.best_params_
    np.testing.assert_allclose(
        serial.cv_results_["mean_test_score"], parallel.cv_results_["mean_test_score"]
    )
    T = ds.materialize("dense")
    ref = GridSearchCV(
        Pipeline([("scale", StandardScaler()), ("lr", LinearRegression())]), grid, cv=3
    ).fit(T, y)
    np.testing.assert_allclose(
        serial.cv_results_["mean_test_score"],
        ref.cv_results_["mean_test_score"],
        atol=1e-8,
    )


def test_scaled_logistic_pipeline_equals_sklearn():
    ds, y = classification_data(seed=3, n_rows=150, n_classes=3)
    ours = make_pipeline(
        FactorizedStandardScaler(),
        FactorizedLogisticRegression(tol=1e-10, max_iter=1000),
    ).fit(ds, y)
    ref = make_pipeline(
        StandardScaler(), LogisticRegression(tol=1e-10, max_iter=1000)
    ).fit(ds.materialize("dense"), y)
    np.testing.assert_allclose(
        ours.predict_proba(ds), ref.predict_proba(ds.materialize("dense")), atol=1e-4
    )


def test_randomized_search_and_cross_validate():
    ds, y = classification_data(seed=4, n_rows=150)
    search = RandomizedSearchCV(
        FactorizedLogisticRegression(max_iter=300),
        {"C": np.logspace(-2, 2, 20)},
        n_iter=4,
        cv=3,
        random_state=0,
    ).fit(ds, y)
    assert 0.5 <= search.best_score_ <= 1.0
    res = cross_validate(
        FactorizedLogisticRegression(max_iter=300), ds, y, cv=3, return_estimator=True
    )
    assert len(res["estimator"]) == 3
    assert all(hasattr(e, "coef_") for e in res["estimator"])


def neg_reconstruction_error(est, X, y=None):
    W = est.transform(X)
    return -float(np.linalg.norm(X.materialize("dense") - W @ est.components_))


def test_unsupervised_cross_val_and_pickled_search():
    ds = random_dataset(5, n_rows=90, scenario="sparse", nonneg=True)
    scores = cross_val_score(
        FactorizedKMeans(n_clusters=2, n_init=1, random_state=0), ds, cv=3
    )
    assert np.all(scores <= 0)  # negative inertia

    search = GridSearchCV(
        FactorizedGNMF(max_iter=30, random_state=0),
        {"n_components": [1, 2]},
        cv=2,
        scoring=neg_reconstruction_error,
    ).fit(ds)
    assert search.best_params_ == {"n_components": 2}
    restored = pickle.loads(pickle.dumps(search))
    np.testing.assert_allclose(
        restored.transform(ds), search.transform(ds), rtol=1e-10, atol=1e-12
    )


def test_stock_transformer_before_factorized_estimator_explains():
    ds, y = regression_data()
    pipe = make_pipeline(StandardScaler(), FactorizedLinearRegression())
    with pytest.raises(TypeError, match="materialize"):
        pipe.fit(ds, y)


def test_sklearn_reference_models_on_dataset_shapes():
    # The materialized path of each estimator is scikit-learn's counterpart.
    ds = random_dataset(6, n_rows=80, scenario="star", nonneg=True)
    T = ds.materialize("dense")
    centers = T[:3].copy()
    ours = FactorizedKMeans(n_clusters=3, init=centers, n_init=1).fit(ds)
    ref = KMeans(n_clusters=3, init=centers, n_init=1, algorithm="lloyd").fit(T)
    np.testing.assert_array_equal(ours.labels_, ref.labels_)
    W0 = np.full((len(ds), 2), 0.5)
    H0 = np.full((2, ds.shape[1]), 0.5)
    H0[0, 0] = 0.9
    g = FactorizedGNMF(n_components=2, init="custom", max_iter=20, tol=0)
    r = NMF(n_components=2, init="custom", solver="mu", max_iter=20, tol=0)
    np.testing.assert_allclose(
        g.fit_transform(ds, W=W0.copy(), H=H0.copy()),
        r.fit_transform(T, W=W0.copy(), H=H0.copy()),
        rtol=1e-6,
        atol=1e-9,
    )
    assert clone(g).get_params() == g.get_params()
