"""The planner: plan features, baselines, cost model, AutoPlan and calibration."""

from __future__ import annotations

import json
import logging
import math
import pickle
import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.model_selection import (
    GridSearchCV,
    KFold,
    StratifiedKFold,
    check_cv,
    cross_val_score,
)
from sklearn.pipeline import make_pipeline

from ilargi_sklearn.cluster import FactorizedKMeans
from ilargi_sklearn.datasets import make_multi_source
from ilargi_sklearn.decomposition import (
    FactorizedGNMF,
    FactorizedPCA,
    FactorizedTruncatedSVD,
)
from ilargi_sklearn.linear_model import (
    FactorizedElasticNet,
    FactorizedGammaRegressor,
    FactorizedLasso,
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
    FactorizedPoissonRegressor,
    FactorizedRidge,
    FactorizedRidgeClassifier,
    FactorizedTweedieRegressor,
)
from ilargi_sklearn.multisource import FactorizedMatrix
from ilargi_sklearn.multisource._stats_cache import (
    clear_statistics_cache,
    statistics_cached,
)
from ilargi_sklearn.planner import (
    PLANS,
    AutoPlan,
    _auto,
    always_factorize,
    always_materialize,
    amalur_rule,
    calibrate,
    clear_materialization_cache,
    clear_plan_history,
    load_cost_model,
    materialized_dataset,
    model_inputs,
    morpheus_rule,
    plan_costs,
    plan_features,
    read_records,
    shipped_model_path,
    train_cost_model,
)
from ilargi_sklearn.preprocessing import (
    FactorizedPolynomialFeatures,
    FactorizedStandardScaler,
)
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

HW = {"cpu_cores": 2, "gemm_gflops": 20.0, "mem_bandwidth_gbs": 8.0}


@pytest.fixture(scope="session")
def _cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ilargi_cache")


@pytest.fixture(autouse=True)
def _cache_dir(_cache_root, monkeypatch):
    """Hardware figures and models go to a temporary cache, never the user's."""
    monkeypatch.setenv("ILARGI_CACHE_DIR", str(_cache_root))
    clear_materialization_cache()
    clear_statistics_cache()
    clear_plan_history()
    yield
    clear_materialization_cache()
    clear_statistics_cache()
    clear_plan_history()


@pytest.fixture(scope="module")
def reg():
    return make_multi_source(600, tuple_ratio=20, feature_ratio=4, random_state=0)


@pytest.fixture(scope="module")
def clf():
    return make_multi_source(
        600, tuple_ratio=10, task="classification", n_classes=3, random_state=1
    )


def _nonneg(ds):
    return ds**2


# ----------------------------------------------------------------- features
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_features_finite_for_every_scenario(scenario):
    ds = random_dataset(3, scenario=scenario)
    for est in (
        FactorizedLinearRegression(),
        FactorizedLogisticRegression(),
        FactorizedKMeans(3),
        FactorizedGNMF(2),
    ):
        f = plan_features(ds, est, np.arange(len(ds)) % 2, hardware=HW)
        numbers = {k: v for k, v in f.items() if not isinstance(v, str)}
        assert all(math.isfinite(float(v)) for v in numbers.values()), numbers
        assert f["n_rows"] == ds.shape[0] and f["n_features"] == ds.shape[1]
        assert f["nnz_joined"] == pytest.approx(ds.operator.nnz())
        for plan in PLANS:
            for cached in (False, True):
                x = model_inputs(f, plan, cached=cached)
                assert all(math.isfinite(v) for v in x.values()), (plan, x)
                assert plan_costs(f, plan, cached=cached)["seconds"] > 0


def test_features_do_not_materialize(reg, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("plan features must not build the join")

    monkeypatch.setattr(FactorizedMatrix, "materialize", boom)
    ds = make_multi_source(50_000, tuple_ratio=50, feature_ratio=8, random_state=0)
    ds.dataset.describe()  # warm caches (dtype conversions) outside the timing
    t0 = time.perf_counter()
    f = plan_features(ds.dataset, FactorizedKMeans(8), hardware=HW)
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.5, elapsed  # one pass over the index vectors
    # Two dimension tables of 1000 rows each: 50 per table, 25 over both.
    assert f["tuple_ratio_max"] == pytest.approx(50.0, rel=0.05)
    assert f["tuple_ratio"] == pytest.approx(25.0, rel=0.05)
    assert f["feature_ratio"] == pytest.approx(8.0)
    assert 0.05 < f["unmatched"] < 0.15  # left joins leave 10% unmatched


def test_features_describe_agree(reg):
    f = plan_features(reg.dataset, FactorizedLinearRegression(), hardware=HW)
    summary = reg.dataset.describe().summary
    assert f["nnz_joined"] == summary["nnz_joined"]
    assert f["nnz_sources"] == summary["nnz_sources"]


def test_algorithm_features_scale_with_parameters(reg):
    ds = reg.dataset
    small = plan_features(ds, FactorizedKMeans(2, max_iter=10), hardware=HW)
    big = plan_features(ds, FactorizedKMeans(20, max_iter=10), hardware=HW)
    assert big["m"] == 20 and small["m"] == 2
    for plan in ("factorized-cpu", "materialized-cpu"):
        assert plan_costs(big, plan)["flops"] > 5 * plan_costs(small, plan)["flops"]
    y3 = np.arange(len(ds)) % 3
    f = plan_features(ds, FactorizedLogisticRegression(), y3, hardware=HW)
    assert f["m"] == 3
    f = plan_features(ds, FactorizedLogisticRegression(), y3 % 2, hardware=HW)
    assert f["m"] == 1


@pytest.mark.parametrize(
    "estimator, kind, solver, grams",
    [
        (FactorizedRidge(), "ridge", "normal", 1),
        (FactorizedRidge(solver="lsqr"), "ridge", "lsqr", 0),
        (FactorizedRidgeClassifier(), "ridge", "normal", 1),
        (FactorizedLasso(), "lasso", "cd", 1),
        (FactorizedElasticNet(), "lasso", "cd", 1),
        (FactorizedPoissonRegressor(), "glm", "lbfgs", 0),
        (FactorizedGammaRegressor(), "glm", "lbfgs", 0),
        (FactorizedTweedieRegressor(), "glm", "lbfgs", 0),
        (FactorizedPCA(), "pca", "eigh", 1),
        (FactorizedTruncatedSVD(), "svd", "randomized", 0),
        (FactorizedTruncatedSVD(algorithm="arpack"), "svd", "arpack", 0),
    ],
)
def test_family_work_is_counted(reg, estimator, kind, solver, grams):
    """Every estimator of the family has its own kind of work: the solver that runs,
    whether a gram is formed, and finite plan costs and model inputs."""
    y = reg.target if is_regressor(estimator) else np.arange(len(reg.dataset)) % 3
    if kind in ("pca", "svd"):
        y = None
    f = plan_features(reg.dataset, estimator, y, hardware=HW)
    assert (f["estimator"], f["solver"], f["grams"]) == (kind, solver, grams)
    for plan in ("factorized-cpu", "materialized-cpu"):
        assert math.isfinite(plan_costs(f, plan)["seconds"])
        assert all(math.isfinite(v) for v in model_inputs(f, plan).values())
    if isinstance(estimator, FactorizedRidgeClassifier):
        assert f["m"] == 3


def test_interaction_features_are_counted_from_the_base(reg):
    """Implicit degree-2 features: the expansion's width, and products that cost
    about d base products; the materialized plan pays for the n x p matrix."""
    ds = reg.dataset
    base = plan_features(ds, FactorizedRidge(), reg.target, hardware=HW)
    poly = FactorizedPolynomialFeatures().fit_transform(ds)
    f = plan_features(poly, FactorizedRidge(), reg.target, hardware=HW)
    d, p = ds.shape[1], poly.shape[1]
    assert f["n_features"] == p
    assert f["cells_terms_dense"] == pytest.approx(base["cells_terms_dense"] * d)
    assert f["bytes_joined"] == pytest.approx(len(ds) * p * f["itemsize"])
    assert AutoPlan(FactorizedRidge()).fit(poly, reg.target).plan_ in PLANS


# --------------------------------------------------------------- heuristics
@pytest.mark.parametrize(
    "features, expected",
    [
        ({"tuple_ratio": 10.0, "feature_ratio": 2.0}, "factorized"),
        ({"tuple_ratio": 5.0, "feature_ratio": 2.0}, "materialized"),  # not > 5
        ({"tuple_ratio": 100.0, "feature_ratio": 1.0}, "materialized"),  # not > 1
        ({"tuple_ratio": 2.0, "feature_ratio": 0.5}, "materialized"),
        ({"tuple_ratio": 5.01, "feature_ratio": 1.01}, "factorized"),
    ],
)
def test_morpheus_rule(features, expected):
    assert morpheus_rule(features) == expected
    assert always_factorize(features) == "factorized"
    assert always_materialize(features) == "materialized"


@pytest.mark.parametrize(
    "fm, ff, expected",
    [
        (3e9, 1e9, "factorized"),
        (1.5e9, 1e9, "materialized"),  # not > 1.5
        (1.6e9, 1e9, "factorized"),
        (0.5e9, 1e9, "materialized"),
    ],
)
def test_amalur_rule(fm, ff, expected):
    assert amalur_rule({"flops_materialized": fm, "flops_factorized": ff}) == expected


def test_amalur_rule_from_raw_features():
    redundant = make_multi_source(4000, tuple_ratio=100, feature_ratio=16).dataset
    flat = make_multi_source(4000, tuple_ratio=1.0, feature_ratio=0.5).dataset
    est = FactorizedLinearRegression(solver="gd")
    assert amalur_rule(plan_features(redundant, est, hardware=HW)) == "factorized"
    assert amalur_rule(plan_features(flat, est, hardware=HW)) == "materialized"


# ------------------------------------------------------------------ AutoPlan
def test_autoplan_picks_fits_records(reg, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="ilargi_sklearn.planner"):
        auto = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
        auto.fit(reg.dataset, reg.target)
    assert set(auto.predicted_seconds_) == {"factorized-cpu", "materialized-cpu"}
    best = min(auto.predicted_seconds_, key=auto.predicted_seconds_.get)
    assert auto.plan_ == best
    assert auto.fallback_reason_ is None
    assert auto.estimator_.strategy == auto.plan_.split("-")[0]
    assert auto.features_["n_rows"] == 600 and auto.features_["estimator"] == "linear"
    assert auto.fit_seconds_ > 0
    assert auto.n_features_in_ == reg.dataset.shape[1]
    assert list(auto.feature_names_in_) == list(reg.dataset.feature_names)
    assert any("AutoPlan" in r.getMessage() for r in caplog.records)
    assert capsys.readouterr().out == ""


def _fitted_attributes(est):
    for name in ("coef_", "intercept_", "cluster_centers_", "components_"):
        if hasattr(est, name):
            yield name, np.asarray(getattr(est, name))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("plan", ["factorized", "materialized"])
@pytest.mark.parametrize(
    "make",
    [
        lambda: FactorizedLinearRegression(),
        lambda: FactorizedLogisticRegression(C=10.0),
        lambda: FactorizedKMeans(3, random_state=0, n_init=1),
        lambda: FactorizedGNMF(3, random_state=0, max_iter=50),
    ],
    ids=["linear", "logistic", "kmeans", "gnmf"],
)
def test_fitted_model_equals_direct_fit(plan, make, reg, clf):
    est = make()
    if isinstance(est, FactorizedLogisticRegression):
        X, y = clf.dataset, clf.target
    elif isinstance(est, FactorizedGNMF):
        X, y = _nonneg(reg.dataset), None
    else:
        X, y = reg.dataset, reg.target
    Xs = X[np.arange(0, len(X), 2)]  # a slice: the cached root join is reused
    ys = None if y is None else y[::2]
    auto = AutoPlan(make(), plans=[plan], cost_model="analytical").fit(Xs, ys)
    direct = clone(est).set_params(strategy=plan).fit(Xs, ys)
    assert auto.plan_ == f"{plan}-cpu"
    attrs = dict(_fitted_attributes(direct))
    assert attrs
    for name, value in _fitted_attributes(auto.estimator_):
        np.testing.assert_allclose(value, attrs[name], rtol=1e-7, atol=1e-9)
    assert auto.estimator_.get_params() == direct.get_params()


def test_delegation_only_available_methods(reg, clf):
    lin = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    assert not hasattr(lin, "predict_proba") and not hasattr(lin, "transform")
    lin.fit(reg.dataset, reg.target)
    assert not hasattr(lin, "predict_proba") and not hasattr(lin, "decision_function")
    np.testing.assert_allclose(
        lin.predict(reg.dataset), lin.estimator_.predict(reg.dataset)
    )
    assert lin.score(reg.dataset, reg.target) > 0.9

    log = AutoPlan(FactorizedLogisticRegression(), cost_model="analytical")
    log.fit(clf.dataset, clf.target)
    assert not hasattr(log, "transform")
    proba = log.predict_proba(clf.dataset)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert log.decision_function(clf.dataset).shape == (600, 3)
    np.testing.assert_array_equal(log.classes_, np.unique(clf.target))

    km = AutoPlan(FactorizedKMeans(3, random_state=0), cost_model="analytical")
    labels = km.fit_predict(reg.dataset)
    np.testing.assert_array_equal(labels, km.estimator_.labels_)
    assert km.transform(reg.dataset).shape == (600, 3)
    assert not hasattr(km, "predict_proba")

    nmf = AutoPlan(FactorizedGNMF(2, random_state=0), cost_model="analytical")
    W = nmf.fit_transform(_nonneg(reg.dataset))
    assert W.shape == (600, 2) and not hasattr(nmf, "predict")


def test_classifier_tags_make_grid_search_stratify(clf):
    auto = AutoPlan(FactorizedLogisticRegression(), cost_model="analytical")
    assert is_classifier(auto)
    cv = check_cv(3, clf.target, classifier=is_classifier(auto))
    assert isinstance(cv, StratifiedKFold)
    reg_auto = AutoPlan(FactorizedLinearRegression())
    assert not is_classifier(reg_auto)
    assert isinstance(check_cv(3, None, classifier=is_classifier(reg_auto)), KFold)


def test_pipeline_and_cross_val_score(clf):
    pipe = make_pipeline(
        FactorizedStandardScaler(),
        AutoPlan(FactorizedLogisticRegression(), cost_model="analytical"),
    )
    scores = cross_val_score(pipe, clf.dataset, clf.target, cv=3)
    assert scores.shape == (3,) and scores.mean() > 0.5
    pipe.fit(clf.dataset, clf.target)
    assert pipe[-1].plan_ in pipe[-1].predicted_seconds_


def test_grid_search_parallel(reg):
    auto = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    search = GridSearchCV(
        auto, {"estimator__fit_intercept": [True, False]}, cv=2, n_jobs=2
    )
    search.fit(reg.dataset, reg.target)
    assert search.best_params_ == {"estimator__fit_intercept": True}
    assert search.best_estimator_.plan_ in ("factorized-cpu", "materialized-cpu")
    assert search.best_score_ > 0.9


def test_materialization_paid_once_per_root(reg):
    auto = AutoPlan(FactorizedKMeans(3, random_state=0), plans=["materialized"])
    auto.set_params(cost_model="analytical")
    folds = [np.arange(0, 450), np.arange(150, 600)]
    first = clone(auto).fit(reg.dataset[folds[0]])
    second = clone(auto).fit(reg.dataset[folds[1]])
    assert not first.materialization_cached_ and second.materialization_cached_
    assert first.features_["root_fraction"] == pytest.approx(0.75)
    # The cost model is told: the cached plan is predicted cheaper.
    f = second.features_
    assert (
        plan_costs(f, "materialized-cpu", cached=True)["seconds"]
        < plan_costs(f, "materialized-cpu", cached=False)["seconds"]
    )
    view, hit = materialized_dataset(reg.dataset[folds[1]])
    assert hit
    np.testing.assert_allclose(
        view.operator.materialize(), reg.dataset[folds[1]].materialize()
    )
    # Unrelated datasets never share a cached join.
    other = make_multi_source(600, tuple_ratio=20, feature_ratio=4, random_state=5)
    assert not materialized_dataset(other.dataset)[1]


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_delegated_methods_read_the_cached_join(reg, monkeypatch):
    """After a materialized plan, scoring a test fold takes its rows of the cached
    join of the root instead of building the fold's own join."""
    ds = _nonneg(reg.dataset)
    train, test = np.arange(0, 400), np.arange(400, 600)
    km = AutoPlan(FactorizedKMeans(3, random_state=0), plans=["materialized"])
    km.set_params(cost_model="analytical").fit(ds[train])
    nmf = AutoPlan(FactorizedGNMF(2, max_iter=20, random_state=0))
    nmf.set_params(plans=["materialized"], cost_model="analytical").fit(ds[train])
    direct_km = FactorizedKMeans(3, random_state=0).fit(ds[train])
    direct_nmf = FactorizedGNMF(2, max_iter=20, random_state=0).fit(ds[train])
    calls = []
    original = FactorizedMatrix.materialize

    def counting(self, *args, **kwargs):
        calls.append(self.shape)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FactorizedMatrix, "materialize", counting)
    score = km.score(ds[test])
    labels = km.predict(ds[test])
    W = nmf.transform(ds[test])
    assert calls == []
    np.testing.assert_allclose(score, direct_km.score(ds[test]), rtol=1e-9)
    np.testing.assert_array_equal(labels, direct_km.predict(ds[test]))
    np.testing.assert_allclose(W, direct_nmf.transform(ds[test]), rtol=1e-6, atol=1e-9)
    # Without a cached join the estimator reads the dataset as it is.
    clear_materialization_cache()
    np.testing.assert_allclose(km.score(ds[test]), score, rtol=1e-9)
    assert calls, "the estimator builds the fold's join itself when nothing is cached"


def test_scaled_dataset_materialized_plan(reg):
    ds = FactorizedStandardScaler().fit_transform(reg.dataset)
    auto = AutoPlan(FactorizedLinearRegression(), plans=["materialized"])
    auto.set_params(cost_model="analytical").fit(ds[:400], reg.target[:400])
    direct = FactorizedLinearRegression(strategy="materialized")
    direct.fit(ds[:400], reg.target[:400])
    np.testing.assert_allclose(auto.estimator_.coef_, direct.coef_, rtol=1e-7)


def test_arrays_are_fitted_as_they_are(reg):
    A = reg.dataset.materialize()
    auto = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    auto.fit(A, reg.target)
    assert auto.plan_ == "materialized-cpu" and auto.predicted_seconds_ == {}
    np.testing.assert_allclose(auto.predict(A), auto.estimator_.predict(A))


def test_estimator_without_strategy_is_rejected(reg):
    from sklearn.linear_model import Ridge

    with pytest.raises(TypeError, match="strategy"):
        AutoPlan(Ridge(), cost_model="analytical").fit(reg.dataset, reg.target)


def test_unknown_plan_is_rejected(reg):
    with pytest.raises(ValueError, match="unknown plan 'fast'"):
        AutoPlan(FactorizedLinearRegression(), plans=["fast"]).fit(
            reg.dataset, reg.target
        )


# ------------------------------------------------------------------ fallback
def test_memory_error_falls_back_to_next_plan(reg, monkeypatch):
    probe = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    first = probe.fit(reg.dataset, reg.target).plan_
    failing = first.split("-")[0]
    original = FactorizedLinearRegression.fit

    def fit(self, X, y, sample_weight=None):
        if self.strategy == failing:
            raise MemoryError("simulated: cannot allocate 12.0 GiB")
        return original(self, X, y, sample_weight)

    monkeypatch.setattr(FactorizedLinearRegression, "fit", fit)
    auto = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    auto.fit(reg.dataset, reg.target)
    assert auto.plan_ != first
    assert first in auto.fallback_reason_ and "MemoryError" in auto.fallback_reason_
    # Only the plan changed, never the model's parameters.
    expected = FactorizedLinearRegression(strategy=auto.plan_.split("-")[0])
    assert auto.estimator_.get_params() == expected.get_params()

    def broken(self, X, y, sample_weight=None):
        raise ValueError("a bug, not a resource problem")

    monkeypatch.setattr(FactorizedLinearRegression, "fit", broken)
    with pytest.raises(ValueError, match="a bug"):
        AutoPlan(FactorizedLinearRegression(), cost_model="analytical").fit(
            reg.dataset, reg.target
        )


def test_gpu_plans_absent_when_probe_says_no(reg, monkeypatch):
    monkeypatch.setattr(_auto, "probe_gpu", lambda: (False, "no CUDA device (test)"))
    auto = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    auto.fit(reg.dataset, reg.target)
    assert all(p.endswith("-cpu") for p in auto.predicted_seconds_)
    only_gpu = AutoPlan(
        FactorizedLinearRegression(), devices="gpu", cost_model="analytical"
    ).fit(reg.dataset, reg.target)
    assert only_gpu.plan_.endswith("-cpu")
    assert "no CUDA device (test)" in only_gpu.fallback_reason_


class _DeviceLinear(FactorizedLinearRegression):
    """An estimator whose GPU fits run out of memory."""

    def fit(self, X, y, sample_weight=None):
        if self.device == "gpu":
            raise MemoryError("simulated GPU out of memory")
        return super().fit(X, y, sample_weight)


class _HostOnlyLinear(FactorizedLinearRegression):
    """An estimator without a ``device`` parameter (no GPU implementation)."""

    def __init__(self, *, fit_intercept=True, strategy="factorized"):
        super().__init__(fit_intercept=fit_intercept, strategy=strategy)


def test_gpu_plans_predicted_when_usable(reg, monkeypatch):
    monkeypatch.setattr(_auto, "probe_gpu", lambda: (True, "Fake GPU"))
    auto = AutoPlan(_DeviceLinear(), cost_model="analytical").fit(
        reg.dataset, reg.target
    )
    assert set(auto.predicted_seconds_) == set(PLANS)
    # Without a device parameter there is no GPU plan even with a GPU.
    plain = AutoPlan(_HostOnlyLinear(), cost_model="analytical")
    plain.fit(reg.dataset, reg.target)
    assert all(p.endswith("-cpu") for p in plain.predicted_seconds_)
    # A GPU plan that runs out of memory falls back to the next plan.
    gpu_first = AutoPlan(_DeviceLinear(), plans=["factorized-gpu"])
    gpu_first.set_params(devices="gpu", cost_model="analytical")
    with pytest.raises(MemoryError):  # no other plan to fall back to
        gpu_first.fit(reg.dataset, reg.target)
    both = AutoPlan(_DeviceLinear(), plans=["factorized"], cost_model="analytical")
    monkeypatch.setattr(
        _auto, "load_cost_model", lambda name: _Fixed({"factorized-gpu": 1.0})
    )
    both.fit(reg.dataset, reg.target)
    assert both.plan_ == "factorized-cpu"
    assert "factorized-gpu failed (out of memory" in both.fallback_reason_
    assert both.estimator_.device in ("auto", "cpu")


class _Fixed:
    """A cost model with fixed predictions (2 s for unnamed plans)."""

    is_learned = False

    def __init__(self, seconds):
        self.seconds = seconds

    def predict(self, features, plans, cached=None, stats_cached=None):
        return {p: self.seconds.get(p, 2.0) for p in plans}


# ---------------------------------------------------- what the batch has cached
def test_statistics_cache_is_looked_up_not_computed(reg, monkeypatch):
    """The planner asks the statistics cache what a fit would find, and a fold
    whose gram is cached is predicted without the gram pass."""
    ds = reg.dataset
    train = np.arange(0, 400)
    auto = AutoPlan(FactorizedRidge(), cost_model="analytical", plans=["factorized"])
    first = clone(auto).fit(ds[train], reg.target[train])
    assert first.statistics_cached_ is None
    before = ds.cache_info()["statistics"]

    def no_gram(*args, **kwargs):
        raise AssertionError("the cache query computed a gram")

    monkeypatch.setattr(FactorizedMatrix, "gram", no_gram)
    # A new slice object with the same rows (what a grid search's next candidate
    # gets) finds the fold's gram; other rows and the other operator do not.
    assert statistics_cached(ds[train], "factorized") == "fold"
    assert statistics_cached(ds[train], "materialized") is None
    assert statistics_cached(ds[np.arange(100, 500)], "factorized") is None
    assert statistics_cached(ds[train], "factorized", np.ones(400)) is None
    after = ds.cache_info()["statistics"]
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])

    second = clone(auto).fit(ds[train], reg.target[train])  # gram never called
    assert second.statistics_cached_ == "fold"
    assert (
        second.predicted_seconds_["factorized-cpu"]
        < (first.predicted_seconds_["factorized-cpu"])
    )
    f = second.features_
    full = plan_costs(f, "factorized-cpu")
    solve = plan_costs(f, "factorized-cpu", stats_cached="fold")
    assert solve["dense_flops"] == pytest.approx(
        full["dense_flops"] - f["gram_flops_factorized"]
    )
    # The pass for the target (T^T S y) is still made.
    assert solve["stream_bytes"] == pytest.approx(
        full["stream_bytes"] - f["gram_bytes_factorized"]
    )
    assert solve["stream_bytes"] > 0
    # Without a gram (an iterative solver) the flag changes nothing.
    lsqr = plan_features(ds, FactorizedRidge(solver="lsqr"), reg.target, hardware=HW)
    assert lsqr["grams"] == 0
    assert plan_costs(lsqr, "factorized-cpu", stats_cached="fold") == (
        plan_costs(lsqr, "factorized-cpu")
    )


def test_root_statistics_predict_the_downdate(reg):
    """With the root's gram cached, a large fold is predicted at the cost of the
    gram of the rows it leaves out (with downdating on: off by default)."""
    from ilargi_sklearn import set_config

    set_config(statistics_downdating=True)
    ds, y = reg.dataset, reg.target
    FactorizedRidge().fit(ds, y)  # the root's statistics
    train = np.arange(0, 450)
    assert statistics_cached(ds[train], "factorized") == "root"
    # A slice of less than half the root is never downdated.
    assert statistics_cached(ds[np.arange(0, 200)], "factorized") is None
    auto = AutoPlan(FactorizedRidge(), cost_model="analytical", plans=["factorized"])
    auto.fit(ds[train], y[train])
    assert auto.statistics_cached_ == "root"
    f = auto.features_
    costs = {
        s: plan_costs(f, "factorized-cpu", stats_cached=s)["dense_flops"]
        for s in (None, "root", "fold")
    }
    assert costs["fold"] < costs["root"] < costs[None]
    # 150 of 600 rows left out: a third of the fold's gram.
    assert costs[None] - costs["root"] == pytest.approx(
        (2 / 3) * f["gram_flops_factorized"]
    )
    assert ds.cache_info()["statistics"]["downdates"] == 1


def test_grid_search_reuses_measured_times(reg, monkeypatch, caplog):
    """Within a grid search, fits of the same work choose by the measured times
    of the earlier ones: the model predicts factorized, the measurements say
    materialized is ten times faster, and the search follows them."""
    monkeypatch.setattr(
        _auto,
        "load_cost_model",
        lambda name: _Fixed({"factorized-cpu": 0.5, "materialized-cpu": 0.6}),
    )
    measured = {"factorized-cpu": 1.0, "materialized-cpu": 0.1}
    fit_plan = AutoPlan._fit_plan
    fitted = []

    def timed(self, plan, X, y, method, fit_params):
        est, result, _, hit = fit_plan(self, plan, X, y, method, fit_params)
        fitted.append(plan)
        return est, result, measured[plan], hit

    monkeypatch.setattr(AutoPlan, "_fit_plan", timed)
    auto = AutoPlan(FactorizedKMeans(3, max_iter=5, n_init=1), plans="auto")
    # random_state does not change the work: all candidates share the measurements.
    grid = {"estimator__random_state": [0, 1]}
    with caplog.at_level(logging.INFO, logger="ilargi_sklearn.planner"):
        search = GridSearchCV(auto, grid, cv=3, scoring=lambda e, X, y=None: 0.0)
        search.fit(reg.dataset)
    reasons = [
        re.search(r" model[^)]*\); (\w+)", r.getMessage()).group(1)
        for r in caplog.records
        if "): predicted" in r.getMessage()
    ]
    assert len(fitted) == len(reasons) == 7  # 3 folds x 2 candidates + refit
    # Predicted first; the unmeasured materialized plan, rescaled by the measured
    # factorized plan's measured / predicted (2), is estimated at 1.2 s, within
    # 1.25x of the measured 1 s: explored once, without the join cached; that
    # fit less the join's build time also measures the state with the join cached
    # (no second exploration); from then on the measurements decide.
    assert fitted == ["factorized-cpu"] + ["materialized-cpu"] * 6
    assert reasons == ["predicted", "explore"] + ["measured"] * 5
    best = search.best_estimator_
    assert best.choice_reason_.startswith("measured")
    # Measured per row, scaled to the refit's 600 rows from the folds' 400.
    assert best.measured_seconds_ == pytest.approx(
        {"factorized-cpu": 1.5, "materialized-cpu": 0.15}
    )
    # Other work (more iterations) is decided afresh.
    other = clone(auto).set_params(estimator__max_iter=6).fit(reg.dataset)
    assert other.choice_reason_ == "predicted" and other.plan_ == "factorized-cpu"
    clear_plan_history()
    assert clone(auto).fit(reg.dataset).choice_reason_ == "predicted"


def test_one_measurement_keeps_the_predicted_order(reg, monkeypatch):
    """A single measured plan is ranked against the other's prediction rescaled
    by measured / predicted: a machine that got slower for every plan does not
    make the unmeasured one look cheap."""
    monkeypatch.setattr(
        _auto,
        "load_cost_model",
        lambda name: _Fixed({"factorized-cpu": 0.5, "materialized-cpu": 3.0}),
    )
    seconds = {"factorized-cpu": 0.4}
    fit_plan = AutoPlan._fit_plan

    def timed(self, plan, X, y, method, fit_params):
        est, result, _, hit = fit_plan(self, plan, X, y, method, fit_params)
        return est, result, seconds.get(plan, 0.2), hit

    monkeypatch.setattr(AutoPlan, "_fit_plan", timed)
    # Gradient descent forms no gram: the statistics cache does not change the
    # plans' states between the fits.
    auto = AutoPlan(FactorizedLinearRegression(solver="gd", max_iter=5))
    ds, y = reg.dataset, reg.target
    assert auto.fit(ds, y).choice_reason_ == "predicted"
    again = clone(auto).fit(ds, y)
    assert again.plan_ == "factorized-cpu"
    assert again.choice_reason_.startswith("measured")
    assert again.measured_seconds_ == {"factorized-cpu": pytest.approx(0.4)}
    # Ten times slower than before, eight times slower than predicted: the
    # materialized plan is estimated at 8 x 3.0 s, far above the measured 4 s.
    seconds["factorized-cpu"] = 4.0
    clone(auto).fit(ds, y)
    slow = clone(auto).fit(ds, y)
    assert slow.plan_ == "factorized-cpu"
    assert slow.measured_seconds_ == {"factorized-cpu": pytest.approx(4.0)}
    assert "materialized-cpu 24 s (estimated)" in slow.choice_reason_


# --------------------------------------------------------------- cost model
def test_clone_and_pickle_do_not_copy_a_model(reg, tmp_path):
    records = tmp_path / "rec.jsonl"
    model = _tiny_model(reg, records, tmp_path / "m.cbm")
    auto = AutoPlan(FactorizedLinearRegression(), cost_model=str(model))
    auto.fit(reg.dataset, reg.target)
    assert clone(auto).get_params()["cost_model"] == str(model)
    assert load_cost_model(str(model)) is load_cost_model(str(model))  # cached
    assert load_cost_model(str(model)).is_learned
    blob = pickle.dumps(auto)
    assert b"catboost" not in blob.lower()
    assert len(blob) < 200_000


def _tiny_model(reg, records, model_path):
    work = [
        {
            "group": "synthetic",
            "estimator": kind,
            "params": {"max_iter": 3} if kind != "linear" else {},
            "data": {"n_rows": 300, "tuple_ratio": tr, "feature_ratio": 2.0},
        }
        for kind in ("linear", "kmeans")
        for tr in (2.0, 20.0)
    ]
    calibrate(records, workloads=work, repeats=1, progress=False, train=False)
    return train_cost_model(records, model_path, iterations=20, thread_count=1)


@pytest.mark.parametrize("content", [None, b"not a catboost model"])
def test_missing_or_corrupt_model_warns_once(reg, tmp_path, content):
    path = tmp_path / "model.cbm"
    if content is not None:
        path.write_bytes(content)
    auto = AutoPlan(FactorizedLinearRegression(), cost_model=str(path))
    with pytest.warns(UserWarning, match="analytical") as record:
        auto.fit(reg.dataset, reg.target)
    assert len(record) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto.fit(reg.dataset, reg.target)  # no second warning
    roofline = AutoPlan(FactorizedLinearRegression(), cost_model="analytical")
    roofline.fit(reg.dataset, reg.target)
    for plan, seconds in auto.predicted_seconds_.items():
        assert seconds == pytest.approx(roofline.predicted_seconds_[plan], rel=1e-9)


def test_shipped_model_is_the_default(reg):
    if not shipped_model_path().is_file():
        pytest.skip("no shipped model yet")
    pytest.importorskip("catboost")
    model = load_cost_model("default")  # no calibration in the temporary cache
    assert model.is_learned and model.source == str(shipped_model_path())
    assert shipped_model_path().stat().st_size < 2_000_000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto = AutoPlan(FactorizedKMeans(3, random_state=0)).fit(reg.dataset)
    assert all(0 < s < 60 for s in auto.predicted_seconds_.values())


def test_import_does_not_import_catboost():
    code = (
        "import sys, ilargi_sklearn, ilargi_sklearn.planner\n"
        "assert 'catboost' not in sys.modules, 'catboost imported'\n"
        "assert 'cupy' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# --------------------------------------------------------------- calibration
def test_default_workloads_cover_the_grid_early():
    """A budget cut after a few dozen schemas still sees every grid value about
    equally often, and only schemas that can be built."""
    from ilargi_sklearn.planner._calibrate import GRID, default_workloads

    work = default_workloads(estimators=("linear",))
    assert len({json.dumps(w["data"], sort_keys=True) for w in work}) == len(work)
    first = [w["data"] for w in work[:48]]
    for key, values in GRID.items():
        counts = [sum(d[key] == v for d in first) for v in values]
        assert min(counts) >= 48 // len(values) - 2, (key, counts)
    assert not any(d["join"] == "many_to_many" and d["n_sources"] < 2 for d in first)


def test_calibrate_resumes_from_partial_file(tmp_path, monkeypatch):
    from ilargi_sklearn.planner import _calibrate

    work = [
        {
            "group": "synthetic",
            "estimator": "linear",
            "params": {},
            "data": {"n_rows": 300 + 100 * i, "tuple_ratio": 5.0},
        }
        for i in range(3)
    ]
    path = tmp_path / "records.jsonl"
    calibrate(path, workloads=work[:2], repeats=1, progress=False, train=False)
    lines = path.read_text().splitlines()
    assert len(lines) == 6  # 3 records (plans x cache states) per workload
    # An interruption in the middle of a write leaves a cut last line.
    with open(path, "a") as fh:
        fh.write(lines[0][: len(lines[0]) // 2])
    timed = []
    original = _calibrate.time_workload

    def spy(est, X, y, **kw):
        timed.append(X.shape[0])
        return original(est, X, y, **kw)

    monkeypatch.setattr(_calibrate, "time_workload", spy)
    calibrate(path, workloads=work, repeats=1, progress=False, train=False)
    assert timed == [500]  # only the new workload
    records = read_records(path)
    assert len(records) == 9
    ids = [r["workload"] for r in records if r["plan"] == "factorized-cpu"]
    assert len(set(ids)) == 3
    r = records[-1]
    assert r["seconds"] > 0 and json.loads(r["workload"])["data"]["n_rows"] == 500
    mat = [x for x in records if x["plan"] == "materialized-cpu"]
    assert {x["cached"] for x in mat} == {True, False}
    # The uncached materialized time includes building the join.
    by = {(x["workload"], x["cached"]): x for x in mat}
    for (wid, cached), x in by.items():
        if not cached:
            assert x["seconds"] >= 0.5 * by[(wid, True)]["seconds"]


def test_calibrate_budget_and_progress(tmp_path, capsys):
    work = [
        {
            "group": "synthetic",
            "estimator": "kmeans",
            "params": {"n_clusters": 2, "max_iter": 2},
            "data": {"n_rows": 400, "tuple_ratio": float(tr)},
        }
        for tr in (2, 4, 8, 16, 32, 64)
    ]
    path = tmp_path / "r.jsonl"
    t0 = time.perf_counter()
    calibrate(path, workloads=work, budget_seconds=0.01, repeats=1, train=False)
    assert time.perf_counter() - t0 < 5
    assert len(read_records(path)) == 3  # one workload runs, whatever the budget
    assert "calibrate [" in capsys.readouterr().err
