"""The trees' materialized plan: scikit-learn's ``HistGradientBoosting*`` itself,
fitted on the joined table of tree features (NaN for unmatched rows, categorical
columns as codes) that the join cache builds once per root dataset."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
)
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import Pipeline
from test_hist_gradient_boosting import (
    compare_trees,
    encoded,
    nan_table,
    new_star_frames,
    star_frames,
)

from ilargi_sklearn import (
    FactorizedHistGradientBoostingClassifier,
    FactorizedHistGradientBoostingRegressor,
    MultiSourceDataset,
    clear_caches,
)
from ilargi_sklearn.ensemble import _gradient_boosting

Reg = FactorizedHistGradientBoostingRegressor
Clf = FactorizedHistGradientBoostingClassifier

NO_ES = dict(early_stopping=False, random_state=0)


@pytest.fixture
def sklearn_fits(monkeypatch):
    """The tables scikit-learn's estimators are fitted on, in order."""
    seen = []
    for cls in (HistGradientBoostingRegressor, HistGradientBoostingClassifier):
        original = cls.fit

        def fit(self, X, y, *args, _original=original, **kwargs):
            seen.append(np.array(X, dtype=np.float64, copy=True))
            return _original(self, X, y, *args, **kwargs)

        monkeypatch.setattr(cls, "fit", fit)
    return seen


@pytest.fixture
def table_builds(monkeypatch):
    """How many times a dataset's tree table is built from the sources."""
    calls = []
    original = _gradient_boosting._natural_table

    def counted(*args, **kwargs):
        calls.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(_gradient_boosting, "_natural_table", counted)
    clear_caches()
    yield calls
    clear_caches()


def labels_of(y, n_classes):
    edges = np.quantile(y, np.linspace(0, 1, n_classes + 1)[1:-1])
    labels = np.asarray(["lo", "mid", "hi"])[np.digitize(y, edges)]
    flip = np.random.default_rng(0).random(len(labels)) < 0.15
    labels[flip] = labels[np.roll(np.flatnonzero(flip), 1)]
    return labels


# --------------------------------------------------------- it is scikit-learn's
@pytest.mark.parametrize("how", ["left", "inner"])
@pytest.mark.parametrize("loss", ["squared_error", "poisson"])
def test_regressor_is_sklearn_on_the_join(how, loss, sklearn_fits):
    ds, joined, y = star_frames(0, how=how)
    if loss == "poisson":
        y = np.exp(0.3 * y)
    X, is_cat = encoded(joined)
    params = dict(loss=loss, max_iter=12, max_leaf_nodes=15, **NO_ES)
    mat = Reg(strategy="materialized", **params).fit(ds, y)
    # scikit-learn fitted the joined table itself: NaN where the left join did
    # not match, the categorical column as its codes.
    assert len(sklearn_fits) == 1
    np.testing.assert_array_equal(sklearn_fits[0], X)
    if how == "left":
        assert np.isnan(X).any()
    ref = HistGradientBoostingRegressor(categorical_features=is_cat, **params)
    ref.fit(X, y)
    np.testing.assert_array_equal(mat.predict(ds), ref.predict(X))
    for a, b in zip(mat.staged_predict(ds), ref.staged_predict(X)):
        np.testing.assert_array_equal(a, b)
    assert mat.n_iter_ == ref.n_iter_ == 12
    np.testing.assert_array_equal(mat.is_categorical_, is_cat)
    assert mat.tree_feature_names_.tolist() == [
        "base__a",
        "base__b",
        "dim1__c",
        "dim1__d",
        "dim1__colour",
        "dim2__e",
    ]
    # And the factorized fit grows the same trees (no tie on this schema).
    fact = Reg(strategy="factorized", **params).fit(ds, y)
    assert compare_trees(fact, mat._hgb) == fact.n_iter_ == mat.n_iter_
    np.testing.assert_allclose(fact.predict(ds), mat.predict(ds), rtol=1e-9)
    for name in ("n_trees_per_iteration_", "do_early_stopping_", "n_features_in_"):
        assert getattr(fact, name) == getattr(mat, name)
    np.testing.assert_array_equal(fact.feature_names_in_, mat.feature_names_in_)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifier_is_sklearn_on_the_join(n_classes, sklearn_fits):
    ds, joined, y = star_frames(4, n=1200)
    X, is_cat = encoded(joined)
    labels = labels_of(y, n_classes)
    params = dict(max_iter=6, max_leaf_nodes=8, min_samples_leaf=30, **NO_ES)
    mat = Clf(strategy="materialized", **params).fit(ds, labels)
    assert len(sklearn_fits) == 1
    ref = HistGradientBoostingClassifier(categorical_features=is_cat, **params)
    ref.fit(X, labels)
    np.testing.assert_array_equal(mat.classes_, ref.classes_)
    assert mat.n_trees_per_iteration_ == ref.n_trees_per_iteration_
    np.testing.assert_array_equal(mat.predict(ds), ref.predict(X))
    np.testing.assert_array_equal(mat.predict_proba(ds), ref.predict_proba(X))
    np.testing.assert_array_equal(mat.decision_function(ds), ref.decision_function(X))
    staged = zip(
        mat.staged_predict_proba(ds),
        mat.staged_decision_function(ds),
        mat.staged_predict(ds),
        ref.staged_predict_proba(X),
        ref.staged_decision_function(X),
        ref.staged_predict(X),
    )
    for a, b, c, ra, rb, rc in staged:
        np.testing.assert_array_equal(a, ra)
        np.testing.assert_array_equal(b, rb)
        np.testing.assert_array_equal(c, rc)
    fact = Clf(**params).fit(ds, labels)
    np.testing.assert_array_equal(fact.classes_, mat.classes_)
    same = compare_trees(fact, mat._hgb)
    assert same == fact.n_iter_ * fact.n_trees_per_iteration_
    np.testing.assert_allclose(
        fact.predict_proba(ds), mat.predict_proba(ds), rtol=1e-8, atol=1e-12
    )


def test_parameters_map_one_to_one(sklearn_fits):
    """Weights, class weights, constraints by name and by position (scikit-learn
    reads interaction positions after moving the categorical features first:
    ours are of tree_feature_names_), feature subsampling."""
    ds, joined, y = star_frames(5, n=1000)
    X, is_cat = encoded(joined)
    rng = np.random.default_rng(1)
    labels = ((y > np.quantile(y, 0.7)) ^ (rng.random(len(y)) < 0.2)).astype(int)
    w = rng.integers(1, 4, len(labels)).astype(float)
    params = dict(
        max_iter=5,
        class_weight="balanced",
        min_samples_leaf=40,
        max_leaf_nodes=8,
        max_features=0.8,
        l2_regularization=1.0,
        monotonic_cst={"base__a": 1, "dim1__d": -1},
        **NO_ES,
    )
    mat = Clf(strategy="materialized", **params).fit(ds, labels, sample_weight=w)
    ref_params = {**params, "monotonic_cst": [1, 0, 0, -1, 0, 0]}
    ref = HistGradientBoostingClassifier(categorical_features=is_cat, **ref_params)
    ref.fit(X, labels, sample_weight=w)
    np.testing.assert_array_equal(mat.predict_proba(ds), ref.predict_proba(X))
    # dim1__colour (position 4) and dim1__c (2) may interact, nothing else does
    # with them: scikit-learn is given the positions of its own order.
    cst = [[2, 4], [0, 1, 3, 5]]
    mat = Reg(strategy="materialized", max_iter=5, interaction_cst=cst, **NO_ES)
    mat.fit(ds, y)
    assert sorted(map(sorted, mat._hgb.interaction_cst)) == [[0, 3], [1, 2, 4, 5]]
    fact = Reg(max_iter=5, interaction_cst=cst, **NO_ES).fit(ds, y)
    assert compare_trees(fact, mat._hgb) == 5
    np.testing.assert_allclose(fact.predict(ds), mat.predict(ds), rtol=1e-9)


def test_unmatched_rows_are_missing_values(sklearn_fits):
    rng = np.random.default_rng(3)
    n, r = 2000, 80
    dim = rng.normal(size=(r, 1))
    dim[:10] = 0.0
    idx = rng.integers(0, r, n)
    idx[rng.random(n) < 0.3] = -1
    ds = MultiSourceDataset.from_matrices([rng.normal(size=(n, 1)), dim], [None, idx])
    y = np.where(idx < 0, 5.0, 0.0) + rng.normal(size=n) * 0.1
    X = nan_table(ds)
    mat = Reg(strategy="materialized", max_iter=5, **NO_ES).fit(ds, y)
    # scikit-learn saw NaN, not the zeros of materialize(), where rows did not
    # match.
    assert len(sklearn_fits) == 1
    np.testing.assert_array_equal(sklearn_fits[0], X)
    assert np.isnan(X[idx < 0, 1]).all()
    ref = HistGradientBoostingRegressor(max_iter=5, **NO_ES).fit(X, y)
    np.testing.assert_array_equal(mat.predict(ds), ref.predict(X))
    pred = mat.predict(ds)
    assert pred[idx < 0].mean() - pred[idx >= 0].mean() > 1.5


def test_early_stopping_is_sklearns(sklearn_fits):
    ds, joined, y = star_frames(6, n=11_000, categorical=False)
    X, _ = encoded(joined)
    params = dict(
        max_iter=60,
        learning_rate=0.5,
        max_leaf_nodes=8,
        random_state=3,
        n_iter_no_change=3,
    )
    for scoring in ("loss", "r2"):
        before = len(sklearn_fits)
        mat = Reg(strategy="materialized", scoring=scoring, **params).fit(ds, y)
        assert len(sklearn_fits) == before + 1
        ref = HistGradientBoostingRegressor(scoring=scoring, **params).fit(X, y)
        assert mat.do_early_stopping_ and ref.do_early_stopping_
        assert mat.n_iter_ == ref.n_iter_ < 60
        np.testing.assert_array_equal(mat.train_score_, ref.train_score_)
        np.testing.assert_array_equal(mat.validation_score_, ref.validation_score_)
        np.testing.assert_array_equal(mat.predict(ds), ref.predict(X))
    # Validation rows given as a dataset built alike.
    tr, va = np.arange(8000), np.arange(8000, 11_000)
    mat = Reg(strategy="materialized", **params).fit(
        ds[tr], y[tr], X_val=ds[va], y_val=y[va]
    )
    ref = HistGradientBoostingRegressor(**params).fit(
        X[tr], y[tr], X_val=X[va], y_val=y[va]
    )
    np.testing.assert_array_equal(mat.validation_score_, ref.validation_score_)


def test_new_data_through_the_training_schema(sklearn_fits):
    ds, joined, y = star_frames(9, n=1200)
    X, is_cat = encoded(joined)
    mat = Reg(strategy="materialized", max_iter=8, **NO_ES).fit(ds, y)
    assert len(sklearn_fits) == 1
    ref = HistGradientBoostingRegressor(
        max_iter=8, categorical_features=is_cat, **NO_ES
    ).fit(X, y)
    base, dim1, dim2 = new_star_frames("green")
    new = mat.dataset_schema_.build(base, {"dim1": dim1, "dim2": dim2})
    frame = base.merge(dim1, on="k1").merge(dim2, on="k2")
    colour = np.where(frame["colour"] == "red", 3.0, 1.0)  # blue green grey red
    Xnew = np.column_stack([frame[["a", "b", "c", "d"]], colour, frame["e"]])
    np.testing.assert_array_equal(mat.predict(new), ref.predict(Xnew))


def test_an_array_is_fitted_by_sklearn(sklearn_fits):
    ds, joined, y = star_frames(2, n=800, categorical=False)
    X, _ = encoded(joined)
    mat = Reg(strategy="materialized", max_iter=5, **NO_ES).fit(X, y)
    assert len(sklearn_fits) == 1
    ref = HistGradientBoostingRegressor(max_iter=5, **NO_ES).fit(X, y)
    np.testing.assert_array_equal(mat.predict(X), ref.predict(X))
    assert mat.is_categorical_ is None and mat.n_features_in_ == X.shape[1]


# --------------------------------------------------------------- the join cache
def test_the_tree_table_is_built_once_and_never_changes_a_result(table_builds):
    ds, joined, y = star_frames(3, n=900, categorical=True)
    first = Reg(strategy="materialized", max_iter=4, **NO_ES).fit(ds, y)
    assert len(table_builds) == 1
    info = ds.cache_info()["materialized"]
    assert info["tables"] == [("trees", "cpu")]
    assert info["bytes"] >= len(ds) * 6 * 8
    pred = first.predict(ds)  # the training table again: a hit
    second = Reg(strategy="materialized", max_iter=4, **NO_ES).fit(ds, y)
    assert len(table_builds) == 1
    np.testing.assert_array_equal(second.predict(ds), pred)
    # A fold (most of the root) takes its rows of the root's table.
    rows = np.arange(0, 900, 3)
    fold = np.setdiff1d(np.arange(900), rows)
    on_fold = Reg(strategy="materialized", max_iter=4, **NO_ES).fit(ds[fold], y[fold])
    assert len(table_builds) == 1
    clear_caches()
    assert ds.cache_info()["materialized"] == {"devices": [], "tables": [], "bytes": 0}
    # Built anew from the sources: the same table, the same model.
    again = Reg(strategy="materialized", max_iter=4, **NO_ES).fit(ds[fold], y[fold])
    assert len(table_builds) == 2
    np.testing.assert_array_equal(again.predict(ds), on_fold.predict(ds))
    # A table kept by the cache is read-only: no fit can change it.
    X, _ = encoded(joined)
    np.testing.assert_array_equal(
        _gradient_boosting.cached_table(ds, ("probe",), lambda op: X.copy())[0], X
    )
    assert not _gradient_boosting.cached_table(ds, ("probe",), None)[0].flags.writeable


def test_grid_search_pipeline_and_pickle(table_builds):
    ds, joined, y = star_frames(15, n=600, categorical=False)
    X, _ = encoded(joined)
    cv = KFold(3)
    pipe = Pipeline([("hgb", Reg(strategy="materialized", max_iter=5, **NO_ES))])
    scores = cross_val_score(pipe, ds, y, cv=cv)
    ref = cross_val_score(
        HistGradientBoostingRegressor(max_iter=5, **NO_ES), X, y, cv=cv
    )
    np.testing.assert_array_equal(scores, ref)
    builds = len(table_builds)
    assert builds == 1  # the root's table, each fold's rows taken of it
    search = GridSearchCV(
        Reg(strategy="materialized", **NO_ES),
        {"max_iter": [2, 5], "max_leaf_nodes": [4, 8]},
        cv=cv,
    )
    search.fit(ds, y)
    ref_search = GridSearchCV(
        HistGradientBoostingRegressor(**NO_ES),
        {"max_iter": [2, 5], "max_leaf_nodes": [4, 8]},
        cv=cv,
    ).fit(X, y)
    np.testing.assert_array_equal(
        search.cv_results_["mean_test_score"], ref_search.cv_results_["mean_test_score"]
    )
    assert len(table_builds) == builds  # twelve fits and their scores: no build
    model = search.best_estimator_
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict(ds), model.predict(ds))
    assert restored.n_iter_ == model.n_iter_


# ------------------------------------------------------------------ warm start
def test_warm_start_continues_sklearns_fit_and_refuses_a_new_strategy():
    ds, joined, y = star_frames(14, n=800)
    X, is_cat = encoded(joined)
    warm = Reg(strategy="materialized", max_iter=3, warm_start=True, **NO_ES)
    warm.fit(ds, y)
    warm.set_params(max_iter=6).fit(ds, y)
    ref = HistGradientBoostingRegressor(
        max_iter=6, categorical_features=is_cat, **NO_ES
    ).fit(X, y)
    assert warm.n_iter_ == 6
    np.testing.assert_array_equal(warm.predict(ds), ref.predict(X))
    with pytest.raises(ValueError, match="strategy='materialized'.*warm_start=False"):
        warm.set_params(strategy="factorized", max_iter=8).fit(ds, y)
    fact = Reg(max_iter=3, warm_start=True, **NO_ES).fit(ds, y)
    with pytest.raises(ValueError, match="strategy='factorized'"):
        fact.set_params(strategy="materialized", max_iter=8).fit(ds, y)
    # Without warm start a new strategy fits anew.
    fact.set_params(warm_start=False, max_iter=6).fit(ds, y)
    assert fact.n_iter_ == 6 and not hasattr(fact, "_predictors")
    np.testing.assert_array_equal(fact.predict(ds), ref.predict(X))
    fact.set_params(strategy="factorized").fit(ds, y)
    assert not hasattr(fact, "_hgb")
    np.testing.assert_allclose(fact.predict(ds), ref.predict(X), rtol=1e-9)


def test_a_parameter_the_installed_sklearn_lacks(monkeypatch):
    """Only the parameters the installed scikit-learn has are passed: one it
    lacks is left out at its default, and an error names it when set."""
    ds, joined, y = star_frames(8, n=400, categorical=False)
    names = HistGradientBoostingRegressor._get_param_names()
    monkeypatch.setattr(
        HistGradientBoostingRegressor,
        "_get_param_names",
        classmethod(lambda cls: [n for n in names if n != "max_features"]),
    )
    model = Reg(strategy="materialized", max_iter=3, **NO_ES).fit(ds, y)
    cls, params = model._sklearn_estimator_params()
    assert cls is HistGradientBoostingRegressor
    assert "max_features" not in params and params["max_iter"] == 3
    with pytest.raises(ValueError, match=r"no parameter \['max_features'\]"):
        Reg(strategy="materialized", max_features=0.5, **NO_ES).fit(ds, y)
