"""Each estimator declares the work of its fit; the planner reads the declaration."""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import pytest
from sklearn.base import BaseEstimator, RegressorMixin, clone, is_classifier

import ilargi_sklearn
from ilargi_sklearn.cluster import FactorizedKMeans
from ilargi_sklearn.datasets import make_multi_source
from ilargi_sklearn.ensemble import FactorizedHistGradientBoostingRegressor
from ilargi_sklearn.linear_model import (
    FactorizedLasso,
    FactorizedLassoCV,
    FactorizedLogisticRegression,
    FactorizedLogisticRegressionCV,
    FactorizedRidge,
    FactorizedRidgeCV,
)
from ilargi_sklearn.multisource import MultiSourceDataset
from ilargi_sklearn.planner import (
    PLANS,
    AutoPlan,
    clear_materialization_cache,
    model_inputs,
    plan_costs,
    plan_features,
)
from ilargi_sklearn.planner._features import with_iterations
from ilargi_sklearn.planner._work import Work

HW = {"cpu_cores": 2, "gemm_gflops": 20.0, "mem_bandwidth_gbs": 8.0}


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    """Hardware figures go to a temporary cache, never the user's."""
    monkeypatch.setenv("ILARGI_CACHE_DIR", str(tmp_path_factory.getbasetemp()))


def _public_estimators():
    """Every estimator class of ``ilargi_sklearn.__all__`` that fits a dataset
    (AutoPlan is the planner itself)."""
    out = []
    for name in ilargi_sklearn.__all__:
        obj = getattr(ilargi_sklearn, name)
        if inspect.isclass(obj) and hasattr(obj, "fit") and obj is not AutoPlan:
            out.append(obj)
    return out


@pytest.fixture(scope="module")
def data():
    return make_multi_source(2000, tuple_ratio=20, feature_ratio=4, random_state=0)


def _target(est, data):
    if is_classifier(est):
        return np.arange(len(data.dataset)) % 3
    return data.target


def test_the_public_estimators_are_found():
    names = {c.__name__ for c in _public_estimators()}
    assert len(names) >= 21, names
    assert "FactorizedHistGradientBoostingClassifier" in names
    assert "FactorizedLassoCV" in names


@pytest.mark.parametrize("cls", _public_estimators(), ids=lambda c: c.__name__)
def test_every_public_estimator_declares_its_work(cls, data):
    """A public estimator without a declaration, or one that says "other", would
    be planned blind: the test names it."""
    est = cls()
    assert callable(getattr(est, "_plan_work", None)), (
        f"{cls.__name__} has no _plan_work: define it (planner/_work.py)."
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "declares nothing" warning
        f = plan_features(data.dataset, est, _target(est, data), hardware=HW)
    assert f["estimator"] != "other", cls.__name__
    for plan in ("factorized-cpu", "materialized-cpu"):
        seconds = plan_costs(f, plan)["seconds"]
        assert math.isfinite(seconds) and seconds > 0
        assert all(math.isfinite(v) for v in model_inputs(f, plan).values())


class _CountingRegressor(RegressorMixin, BaseEstimator):
    """An estimator the planner has never heard of: it declares its work."""

    def __init__(self, *, passes=7, strategy="factorized"):
        self.passes = passes
        self.strategy = strategy

    def fit(self, X, y):
        op = X.operator_for(self.strategy) if hasattr(X, "operator_for") else X
        self.coef_ = np.zeros(X.shape[1])
        self.n_features_in_ = X.shape[1]
        for _ in range(self.passes):
            op.rmatmul(op.matmul(np.ones(X.shape[1])))
        return self

    def predict(self, X):
        return np.zeros(X.shape[0])

    def _plan_work(self, data, y):
        return Work(
            "counting",
            "passes",
            iterations=self.passes,
            passes=float(self.passes),
            passes_per_iteration=1.0,
        )


def test_a_new_estimator_is_planned_without_touching_the_planner(data):
    auto = AutoPlan(_CountingRegressor(passes=7), cost_model="analytical")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto.fit(data.dataset, data.target)
    assert auto.features_["estimator"] == "counting"
    assert auto.features_["passes"] == 7.0
    assert set(auto.predicted_seconds_) <= set(PLANS)
    # Its own count drives the cost: ten times the passes, more seconds.
    f7 = plan_features(data.dataset, _CountingRegressor(passes=7), hardware=HW)
    f70 = plan_features(data.dataset, _CountingRegressor(passes=70), hardware=HW)
    for plan in ("factorized-cpu", "materialized-cpu"):
        assert (
            plan_costs(f70, plan, cached=True)["seconds"]
            > 5 * (plan_costs(f7, plan, cached=True)["seconds"])
        )
    # The learned model takes a kind it never saw (its code is a hash of the name).
    auto = AutoPlan(_CountingRegressor(passes=3)).fit(data.dataset, data.target)
    assert all(math.isfinite(s) for s in auto.predicted_seconds_.values())


def test_an_estimator_without_declaration_is_named_in_a_warning(data):
    class Undeclared(_CountingRegressor):
        _plan_work = None

    with pytest.warns(UserWarning, match="Undeclared does not declare"):
        f = plan_features(data.dataset, Undeclared(), data.target, hardware=HW)
    assert f["estimator"] == "other"


def test_work_is_checked():
    with pytest.raises(ValueError, match=r"plan_work\[.factorized.\] names components"):
        Work("x", plan_work={"factorized": {"flops": 1.0}})
    with pytest.raises(ValueError, match="representation"):
        Work("x", plan_work={"fused": {"calls": 1.0}})
    with pytest.raises(ValueError, match="non-empty"):
        Work("")

    class Wrong(_CountingRegressor):
        def _plan_work(self, data, y):
            return {"kind": "x"}

    with pytest.raises(TypeError, match="must return a Work"):
        plan_features(make_multi_source(50).dataset, Wrong(), hardware=HW)


# ------------------------------------------------- the searches and K-Means
def test_cv_estimators_cost_their_folds_and_candidates(data):
    ds, y = data.dataset, data.target
    one = plan_features(ds, FactorizedLogisticRegression(), y % 2 > 0, hardware=HW)
    cv = plan_features(
        ds, FactorizedLogisticRegressionCV(Cs=4, cv=3), y % 2 > 0, hardware=HW
    )
    # Per fold, 4 fits on 2/3 of the rows; then the refit: 9 fits' passes.
    assert cv["fits"] == 3 * 4 + 1
    assert cv["passes"] == pytest.approx(9 * one["passes"])
    assert cv["estimator"] == one["estimator"]

    lasso = plan_features(ds, FactorizedLasso(), y, hardware=HW)
    lasso_cv = plan_features(ds, FactorizedLassoCV(alphas=10, cv=4), y, hardware=HW)
    assert lasso_cv["fits"] == 4 * 10 + 1
    assert lasso_cv["grams"] == 2  # the fold statistics: all rows, test folds
    assert lasso_cv["passes"] == 2.0  # not max_iter passes: sweeps read the gram
    assert lasso_cv["common_flops"] > 10 * lasso["common_flops"] / 50 * 5

    ridge = plan_features(ds, FactorizedRidge(), y, hardware=HW)
    loo = plan_features(ds, FactorizedRidgeCV(), y, hardware=HW)
    assert loo["grams"] == 1 and loo["matmul_m"] == ds.shape[1]
    kfold = plan_features(ds, FactorizedRidgeCV(cv=5), y, hardware=HW)
    assert kfold["fits"] == 5 * 3 + 1 and kfold["grams"] == 2
    for plan in ("factorized-cpu", "materialized-cpu"):
        assert plan_costs(kfold, plan)["seconds"] > plan_costs(ridge, plan)["seconds"]


def test_kmeans_expects_the_iterations_it_converges_in(data):
    f = plan_features(data.dataset, FactorizedKMeans(8), hardware=HW)
    assert f["iterations"] == 20  # not max_iter=300
    f = plan_features(data.dataset, FactorizedKMeans(8, tol=0.0), hardware=HW)
    assert f["iterations"] == 300  # no tolerance: every iteration runs
    f = plan_features(data.dataset, FactorizedKMeans(8, max_iter=5), hardware=HW)
    assert f["iterations"] == 5


def test_iterations_run_rescale_the_declared_work(data):
    f = plan_features(data.dataset, FactorizedKMeans(8, max_iter=10), hardware=HW)
    g = with_iterations(f, 30)
    assert g["passes"] == pytest.approx(30.0)
    assert g["common_bytes"] > 2.5 * f["common_bytes"]
    # A record written before the declarations (no passes_per_iteration) is
    # rescaled as its solver was then.
    legacy = {k: v for k, v in f.items() if k != "passes_per_iteration"}
    assert with_iterations(legacy, 30)["passes"] == pytest.approx(30.0)


# ------------------------------------------------------------------ trees
def _star(n, r, c, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, 2))
    dim = rng.normal(size=(r, c))
    return MultiSourceDataset.from_matrices([base, dim], [None, rng.integers(0, r, n)])


def test_trees_count_the_grouped_histograms():
    """A wide dimension whose rows repeat: the factorized histograms are many
    times cheaper than the row-wise ones; binning runs on the sources."""
    ds = _star(20_000, 200, 40)
    y = np.zeros(len(ds))
    f = plan_features(ds, FactorizedHistGradientBoostingRegressor(), y, hardware=HW)
    assert (f["estimator"], f["solver"], f["joins"]) == ("trees", "hist", False)
    assert f["passes"] == 0.0
    fact, mat = f["plan_factorized_gather_bytes"], f["plan_materialized_gather_bytes"]
    assert mat > 5 * fact
    assert f["plan_materialized_setup_bytes"] > 10 * f["plan_factorized_setup_bytes"]
    # The materialized trees build their own table: no join cache in their cost.
    cached = plan_costs(f, "materialized-cpu", cached=True)["seconds"]
    assert cached == plan_costs(f, "materialized-cpu", cached=False)["seconds"]
    # Distinct rows as many as the rows: the grouped build saves nothing.
    ds = _star(2_000, 2_000, 3)
    f = plan_features(ds, FactorizedHistGradientBoostingRegressor(), y[:2000])
    assert f["plan_factorized_gather_bytes"] == pytest.approx(
        f["plan_materialized_gather_bytes"], rel=0.05
    )


def test_trees_work_follows_iterations_and_leaves():
    ds = _star(5_000, 100, 10)
    y = np.zeros(len(ds))
    small = FactorizedHistGradientBoostingRegressor(max_iter=10, max_leaf_nodes=7)
    big = clone(small).set_params(max_iter=40, max_leaf_nodes=31)
    fs = plan_features(ds, small, y, hardware=HW)
    fb = plan_features(ds, big, y, hardware=HW)
    for plan in ("factorized-cpu", "materialized-cpu"):
        assert plan_costs(fb, plan)["seconds"] > 4 * plan_costs(fs, plan)["seconds"]
    # A record's iterations (early stopping) rescale the trees' work, not the
    # binning.
    g = with_iterations(fb, 20)
    assert g["plan_factorized_gather_bytes"] == pytest.approx(
        fb["plan_factorized_gather_bytes"] / 2
    )
    assert g["plan_factorized_setup_bytes"] == fb["plan_factorized_setup_bytes"]


def test_autoplan_fits_the_trees_with_either_plan():
    ds = _star(3_000, 50, 6, seed=1)
    y = ds.materialize()[:, 3] + 0.1 * np.random.default_rng(0).normal(size=len(ds))
    est = FactorizedHistGradientBoostingRegressor(max_iter=5, random_state=0)
    preds = {}
    for plan in ("factorized", "materialized"):
        clear_materialization_cache()
        auto = AutoPlan(est, plans=[plan], devices="cpu").fit(ds, y)
        assert auto.plan_ == f"{plan}-cpu"
        preds[plan] = auto.predict(ds)
    np.testing.assert_allclose(preds["factorized"], preds["materialized"], rtol=1e-10)


# ------------------------------------------------------------ calibration
def test_calibration_times_an_estimator_named_by_its_class(tmp_path, monkeypatch):
    """Calibration takes any public estimator by its class name and reads what
    it needs (target, plans) from the estimator, not from a table of kinds."""
    from ilargi_sklearn.planner import calibrate, read_records
    from ilargi_sklearn.planner._calibrate import make_estimator

    monkeypatch.setenv("ILARGI_CACHE_DIR", str(tmp_path / "cache"))
    data = {"n_rows": 600, "tuple_ratio": 10.0}
    work = [
        {
            "group": "synthetic",
            "estimator": "FactorizedHistGradientBoostingClassifier",
            "params": {"max_iter": 2, "early_stopping": False},
            "data": data,
            "classes": 3,
        },
        {
            "group": "synthetic",
            "estimator": "FactorizedLassoCV",
            "params": {"alphas": 3, "cv": 2},
            "data": data,
        },
    ]
    path = tmp_path / "records.jsonl"
    calibrate(path, workloads=work, repeats=1, progress=False, train=False)
    records = read_records(path)
    assert len(records) == 6
    trees = [r for r in records if r["features"]["estimator"] == "trees"]
    assert len(trees) == 3 and trees[0]["features"]["m"] == 3  # one tree per class
    # The trees' materialized plan builds its own table: no join is timed.
    assert all(r["materialize_seconds"] == 0.0 for r in trees)
    lasso = [r for r in records if r["estimator"] == "FactorizedLassoCV"]
    assert lasso[0]["features"]["fits"] == 2 * 3 + 1
    with pytest.raises(ValueError, match="public estimator"):
        make_estimator("FactorizedNothing")


def test_a_cached_join_does_not_count_for_the_trees():
    """The materialized trees fit scikit-learn on a table of their own (NaN for
    unmatched rows, categories as codes): a join cached by another estimator
    changes neither their prediction nor what AutoPlan records."""
    ds = _star(3_000, 50, 6, seed=2)
    y = np.random.default_rng(0).normal(size=len(ds))
    clear_materialization_cache()
    trees = FactorizedHistGradientBoostingRegressor(max_iter=3)
    before = plan_costs(plan_features(ds, trees, y), "materialized-cpu")["seconds"]
    AutoPlan(FactorizedRidge(), plans=["materialized"]).fit(ds, y)  # caches the join
    assert ds.cache_info()["materialized"]["tables"] == []
    auto = AutoPlan(trees, plans=["materialized"], cost_model="analytical")
    auto.fit(ds, y)
    assert auto.predicted_seconds_["materialized-cpu"] == pytest.approx(before)
    assert auto.materialization_cached_ is False
    clear_materialization_cache()


def test_the_trees_materialized_work_is_sklearns_on_the_cached_table():
    """scikit-learn's histograms over every joined column, its binning on the
    join; the table's build counts until the join cache holds it (a search's
    later fits), then a fold's copy of its rows only."""
    ds = _star(20_000, 200, 40)
    y = np.random.default_rng(0).normal(size=len(ds))
    trees = FactorizedHistGradientBoostingRegressor(max_iter=2, early_stopping=False)
    n, F = len(ds), 2 + 40
    clear_materialization_cache()
    cold = plan_features(ds, trees, y, hardware=HW)
    trees.set_params(strategy="materialized").fit(ds, y)
    assert ds.cache_info()["materialized"]["tables"] == [("trees", "cpu")]
    warm = plan_features(ds, trees, y, hardware=HW)
    drop = cold["plan_materialized_setup_bytes"] - warm["plan_materialized_setup_bytes"]
    assert drop == pytest.approx(3.0 * 8.0 * n * F)
    for key in ("plan_factorized_setup_bytes", "plan_materialized_gather_bytes"):
        assert warm[key] == cold[key]
    # A fold (three quarters of the root) copies its rows of the cached table;
    # without the cache it builds the root's table.
    fold = ds[np.arange(n // 4, n)]
    m = len(fold)
    f_warm = plan_features(fold, trees, y[n // 4 :], hardware=HW)
    clear_materialization_cache()
    f_cold = plan_features(fold, trees, y[n // 4 :], hardware=HW)
    assert f_cold["plan_materialized_setup_bytes"] - f_warm[
        "plan_materialized_setup_bytes"
    ] == pytest.approx((3.0 - 2.0) * 8.0 * m * F)
    # Early stopping: scikit-learn's split copies the table's rows.
    es = plan_features(ds, clone(trees).set_params(early_stopping=True), y, hardware=HW)
    assert es["plan_materialized_setup_bytes"] - cold[
        "plan_materialized_setup_bytes"
    ] == pytest.approx(2.0 * 8.0 * n * F)
    # Histograms: every joined column per node, as scikit-learn builds them.
    assert (
        cold["plan_materialized_gather_bytes"]
        > 5 * cold["plan_factorized_gather_bytes"]
    )


def test_calibration_times_sklearns_fit_on_a_table_built_each_time(monkeypatch):
    """The trees' materialized record is scikit-learn's fit on the joined tree
    table, the table built at every timed fit (the state the record states: not
    cached), never a cache hit of the repeats before."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    from ilargi_sklearn.ensemble import _gradient_boosting
    from ilargi_sklearn.planner._calibrate import time_workload

    calls = {"sklearn": 0, "table": 0}
    fit, table = HistGradientBoostingRegressor.fit, _gradient_boosting._natural_table

    def counted_fit(self, *args, **kwargs):
        calls["sklearn"] += 1
        return fit(self, *args, **kwargs)

    def counted_table(*args, **kwargs):
        calls["table"] += 1
        return table(*args, **kwargs)

    monkeypatch.setattr(HistGradientBoostingRegressor, "fit", counted_fit)
    monkeypatch.setattr(_gradient_boosting, "_natural_table", counted_table)
    ds = _star(2_000, 50, 5, seed=3)
    y = np.random.default_rng(0).normal(size=len(ds))
    trees = FactorizedHistGradientBoostingRegressor(max_iter=2, early_stopping=False)
    timings = time_workload(trees, ds, y, repeats=2, joins=False)
    assert not timings["warmup_only"]
    runs = 1 + len(timings["materialized_fit"])  # the warm-up and the repeats
    assert calls == {"sklearn": runs, "table": runs}
    assert timings["materialize"] == [0.0] * (runs - 1)
    clear_materialization_cache()


def test_autoplan_sees_the_trees_cached_table():
    """The trees' materialized plan finds its table in the join cache after a
    first fit: AutoPlan predicts and records that state (as the joined matrix
    of the other estimators), and says so."""
    from ilargi_sklearn.planner import _auto

    ds = _star(3_000, 50, 6, seed=4)
    y = np.random.default_rng(0).normal(size=len(ds))
    clear_materialization_cache()
    _auto.clear_plan_history()
    trees = FactorizedHistGradientBoostingRegressor(max_iter=3, early_stopping=False)
    first = AutoPlan(trees, plans=["materialized"], cost_model="analytical")
    first.fit(ds, y)
    assert first.materialization_cached_ is False
    second = AutoPlan(trees, plans=["materialized"], cost_model="analytical")
    second.fit(ds, y)
    assert second.materialization_cached_ is True
    cold = first.predicted_seconds_["materialized-cpu"]
    assert second.predicted_seconds_["materialized-cpu"] < cold
    # The first fit built the table: its time less the build is the cached
    # state's measurement, which the second fit read.
    assert "materialized-cpu" in second.measured_seconds_
    np.testing.assert_array_equal(first.predict(ds), second.predict(ds))
    clear_materialization_cache()
    _auto.clear_plan_history()
