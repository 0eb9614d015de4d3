"""The statistics cache: a grid search computes each fold's statistics once.

``multisource._statistics.centered_gram`` keeps the raw sums of every (root dataset, rows,
weights, target) in ``multisource._stats_cache`` and, with the
``statistics_downdating`` setting on (as every test here opts in: it is off by
default), downdates a training fold's gram from its root's. These tests count the
operator's gram passes, compare cached searches with uncached ones and with
scikit-learn on the joined matrix, and check the guard, the key, the bound, the
release and pickling.
"""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest
from _helpers import assert_close, namespace_and_device
from joblib import parallel_backend
from sklearn.linear_model import Lasso, LinearRegression, Ridge
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import Pipeline

from ilargi_sklearn import FactorizedStandardScaler, MultiSourceDataset, set_config
from ilargi_sklearn.datasets import make_multi_source
from ilargi_sklearn.linear_model import (
    FactorizedLasso,
    FactorizedLassoCV,
    FactorizedLinearRegression,
    FactorizedRidge,
    FactorizedRidgeCV,
)
from ilargi_sklearn.multisource import (
    FactorizedMatrix,
    clear_statistics_cache,
    set_statistics_cache,
)
from ilargi_sklearn.multisource._slices import _SLICES
from ilargi_sklearn.multisource._statistics import FoldStatistics, centered_gram
from ilargi_sklearn.multisource._stats_cache import _STATS
from ilargi_sklearn.utils._validation import validate_X

N_FOLDS = 5


@pytest.fixture(autouse=True)
def fresh_cache():
    # The suite's own fixture (conftest.py) resets every cache and setting after
    # each test; these tests of the cache opt in to downdating.
    set_statistics_cache()
    set_config(statistics_downdating=True)
    yield
    set_statistics_cache()


@pytest.fixture
def gram_calls(monkeypatch):
    """The number of ``FactorizedMatrix.gram`` passes since the fixture started."""
    calls = [0]
    original = FactorizedMatrix.gram

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FactorizedMatrix, "gram", counting)
    return calls


def star(n_rows=3000, seed=0):
    bunch = make_multi_source(
        n_rows,
        n_sources=2,
        tuple_ratio=20,
        feature_ratio=4,
        n_base_features=4,
        random_state=seed,
    )
    return bunch.dataset, bunch.target


SEARCHES = [
    (
        FactorizedRidge(),
        Ridge(),
        {"alpha": [1e-3, 1e-1, 1.0, 10.0, 100.0]},
    ),
    (
        FactorizedLasso(tol=1e-10, max_iter=100_000),
        Lasso(tol=1e-10, max_iter=100_000),
        {"alpha": [1e-3, 1e-2, 1e-1]},
    ),
    (
        FactorizedLinearRegression(),
        LinearRegression(),
        {"fit_intercept": [True, False]},
    ),
]


def _assert_same_search(a, b, kind):
    assert a.best_params_ == b.best_params_
    assert_close(a.best_score_, b.best_score_, kind=kind)
    for k in range(N_FOLDS):
        name = f"split{k}_test_score"
        assert_close(a.cv_results_[name], b.cv_results_[name], kind=kind)
    assert_close(a.best_estimator_.coef_, b.best_estimator_.coef_, kind=kind)


@pytest.mark.parametrize(
    "est, ref, grid", SEARCHES, ids=[type(s[0]).__name__ for s in SEARCHES]
)
def test_grid_search_computes_each_fold_once(est, ref, grid, gram_calls):
    ds, y = star()
    cached = GridSearchCV(est, grid, cv=N_FOLDS).fit(ds, y)
    # Fold 1 directly; fold 2 (the second large slice of the root) computes the
    # root and its test rows; folds 3-5 their test rows; every other candidate and
    # the refit on all rows hit.
    assert gram_calls[0] == N_FOLDS + 1
    info = ds.cache_info()["statistics"]
    assert info["downdates"] == N_FOLDS - 1 and info["fallbacks"] == 0
    assert info["hits"] > 0 and info["entries"] > 0 and info["bytes"] > 0

    set_statistics_cache(0)
    gram_calls[0] = 0
    uncached = GridSearchCV(est, grid, cv=N_FOLDS).fit(ds, y)
    n_candidates = len(next(iter(grid.values())))
    assert gram_calls[0] == N_FOLDS * n_candidates + 1
    _assert_same_search(cached, uncached, kind="fit")

    joined = GridSearchCV(ref, grid, cv=KFold(N_FOLDS)).fit(ds.materialize(), y)
    _assert_same_search(cached, joined, kind="fit")


def test_pipeline_with_scaler_shares_fold_statistics(gram_calls):
    ds, y = star(seed=15)
    pipe = Pipeline(
        [("scale", FactorizedStandardScaler()), ("ridge", FactorizedRidge())]
    )
    grid = {"ridge__alpha": [1e-2, 1.0, 100.0]}
    cached = GridSearchCV(pipe, grid, cv=N_FOLDS).fit(ds, y)
    # Each candidate's scaler gives the same scale and offset on a fold: the
    # scaled fold is keyed by them, so each fold's gram is computed once (no
    # downdating: every fold has its own scaling).
    assert gram_calls[0] == N_FOLDS + 1
    set_statistics_cache(0)
    uncached = GridSearchCV(pipe, grid, cv=N_FOLDS).fit(ds, y)
    assert cached.best_params_ == uncached.best_params_
    for k in range(N_FOLDS):
        name = f"split{k}_test_score"
        np.testing.assert_array_equal(
            cached.cv_results_[name], uncached.cv_results_[name]
        )


def test_threaded_search_equals_sequential(gram_calls):
    ds, y = star(seed=1)
    grid = {"alpha": [1e-2, 1.0, 100.0]}
    sequential = GridSearchCV(FactorizedRidge(), grid, cv=N_FOLDS).fit(ds, y)
    clear_statistics_cache()
    gram_calls[0] = 0
    with parallel_backend("threading", n_jobs=2):
        threaded = GridSearchCV(FactorizedRidge(), grid, cv=N_FOLDS, n_jobs=2)
        threaded.fit(ds, y)
    # Concurrent candidates of a fold wait for one computation; which folds
    # downdate depends on the order the threads reach them.
    assert gram_calls[0] <= 2 * N_FOLDS + 1
    _assert_same_search(threaded, sequential, kind="fit")


def test_process_search_equals_sequential():
    ds, y = star(n_rows=600, seed=2)
    grid = {"alpha": [1e-2, 1.0]}
    sequential = GridSearchCV(FactorizedRidge(), grid, cv=3).fit(ds, y)
    # Each worker unpickles its own dataset and starts with an empty cache.
    workers = GridSearchCV(FactorizedRidge(), grid, cv=3, n_jobs=2).fit(ds, y)
    assert workers.best_params_ == sequential.best_params_
    assert_close(
        workers.cv_results_["mean_test_score"],
        sequential.cv_results_["mean_test_score"],
        kind="fit",
    )


def _stats(ds):
    op, lineage = validate_X(FactorizedRidge(), ds, reset=True, return_lineage=True)
    return centered_gram(op, None, True, lineage=lineage)


def test_downdating_equals_direct():
    ds, y = star(seed=3)
    folds = [train for train, _ in KFold(N_FOLDS).split(np.zeros(len(ds)))]
    FactorizedRidge().fit(ds[folds[0]], y[folds[0]])
    downdated = _stats(ds[folds[1]])
    assert ds.cache_info()["statistics"]["downdates"] == 1
    set_statistics_cache(0)
    direct = _stats(ds[folds[1]])
    scale = float(direct.D.max())
    assert_close(downdated.G, direct.G, kind="operator", scale=scale)
    assert_close(downdated.mu, direct.mu, kind="operator", scale=1.0)
    assert downdated.sw_sum == direct.sw_sum
    # And the fits agree to the estimators' tolerance.
    set_statistics_cache()
    clear_statistics_cache()
    FactorizedRidge().fit(ds[folds[0]], y[folds[0]])
    est = FactorizedRidge(alpha=0.1).fit(ds[folds[1]], y[folds[1]])
    set_statistics_cache(0)
    ref = FactorizedRidge(alpha=0.1).fit(ds[folds[1]], y[folds[1]])
    assert_close(est.coef_, ref.coef_, kind="fit", scale=1.0)
    assert_close(est.intercept_, ref.intercept_, kind="fit", scale=1.0)


def _guarded_dataset(base):
    dim = np.random.default_rng(5).standard_normal((10, 2))
    fk = np.arange(base.shape[0]) % 10
    return MultiSourceDataset.from_matrices([base, dim], [None, fk])


@pytest.mark.parametrize("case", ["mass", "condition"])
def test_guard_falls_back_to_direct(case):
    rng = np.random.default_rng(4)
    n = 200
    base = rng.standard_normal((n, 3))
    if case == "mass":
        # The first 40 rows (the second fold's test rows) carry most of column 0.
        base[:40, 0] *= 1e3
    else:
        # Nearly collinear columns: the centered gram's condition is about 1e16.
        base[:, 1] = base[:, 0] + 1e-8 * rng.standard_normal(n)
    ds = _guarded_dataset(base)
    y = rng.standard_normal(n)
    first, second = np.arange(n - 40), np.arange(40, n)
    FactorizedLinearRegression().fit(ds[first], y[first])
    est = FactorizedLinearRegression().fit(ds[second], y[second])
    info = ds.cache_info()["statistics"]
    assert info["fallbacks"] == 1 and info["downdates"] == 0
    set_statistics_cache(0)
    ref = FactorizedLinearRegression().fit(ds[second], y[second])
    # Computed directly: bit for bit the uncached fit.
    np.testing.assert_array_equal(est.coef_, ref.coef_)
    np.testing.assert_array_equal(est.intercept_, ref.intercept_)


def test_weights_and_intercept_are_in_the_key(gram_calls):
    ds, y = star(n_rows=500, seed=6)
    rng = np.random.default_rng(6)
    w1, w2 = rng.uniform(0.5, 2.0, len(ds)), rng.uniform(0.5, 2.0, len(ds))
    fits = [
        dict(sample_weight=None, fit_intercept=True),
        dict(sample_weight=w1, fit_intercept=True),
        dict(sample_weight=w2, fit_intercept=True),
        dict(sample_weight=w1, fit_intercept=False),
        dict(sample_weight=None, fit_intercept=False),
    ]

    def fit_all():
        return [
            FactorizedRidge(alpha=0.5, fit_intercept=f["fit_intercept"]).fit(
                ds, y, sample_weight=f["sample_weight"]
            )
            for f in fits
        ]

    cached = fit_all()
    # One gram per weighting: a fit without an intercept reuses its weights' entry.
    assert gram_calls[0] == 3
    again = fit_all()
    assert gram_calls[0] == 3
    set_statistics_cache(0)
    uncached = fit_all()
    for a, b, c in zip(cached, again, uncached):
        # No downdating on the root: a hit is bit for bit the direct result.
        np.testing.assert_array_equal(a.coef_, c.coef_)
        np.testing.assert_array_equal(b.coef_, c.coef_)
        np.testing.assert_array_equal(a.intercept_, c.intercept_)
    # Different weights and intercepts give different models: the key told them apart.
    assert not np.allclose(cached[0].coef_, cached[1].coef_)
    assert not np.allclose(cached[1].coef_, cached[2].coef_)
    assert not np.allclose(cached[1].coef_, cached[3].coef_)


def test_target_is_in_the_key_and_gram_is_shared(gram_calls):
    ds, y = star(n_rows=500, seed=7)
    a = FactorizedRidge().fit(ds, y)
    b = FactorizedRidge().fit(ds, 2.0 * y + 1.0)
    assert gram_calls[0] == 1
    assert_close(b.coef_, 2.0 * a.coef_, kind="fit", scale=1.0)


def test_eviction_at_the_budget():
    ds1, y1 = star(n_rows=500, seed=8)
    ds2, y2 = star(n_rows=500, seed=9)
    FactorizedRidge().fit(ds1, y1)
    one_fit = ds1.cache_info()["statistics"]["bytes"]
    set_statistics_cache(max_bytes=one_fit + one_fit // 2)
    FactorizedRidge().fit(ds1, y1)
    FactorizedRidge().fit(ds2, y2)
    info1, info2 = ds1.cache_info()["statistics"], ds2.cache_info()["statistics"]
    # ds1's gram was the least recently used: evicted for ds2's.
    assert info2["entries"] == 2 and info2["bytes"] == one_fit
    assert info1["bytes"] < one_fit
    assert info2["total_bytes"] <= info2["budget_bytes"]
    set_statistics_cache(max_bytes=0)
    FactorizedRidge().fit(ds1, y1)
    assert ds1.cache_info()["statistics"]["entries"] == 0


# A slice object, and an index array: the slice memo keeps that slice (which
# holds the root's operator) and must not keep the dataset's entries alive.
@pytest.mark.parametrize(
    "rows", [slice(0, 450), np.arange(450)], ids=["slice", "array"]
)
def test_released_with_the_dataset(rows):
    ds, y = star(n_rows=500, seed=10)
    FactorizedRidge().fit(ds[rows], y[rows])
    FactorizedRidge().fit(ds, y)
    token = ds._root_token
    assert _STATS.keys(token)
    del ds
    gc.collect()
    assert not _STATS.keys(token)
    assert token not in _STATS._groups


def test_cache_info_is_shared_by_slices():
    ds, y = star(n_rows=500, seed=11)
    before = ds.cache_info()
    assert before["statistics"]["entries"] == 0
    assert before["materialized"] == {"devices": [], "tables": [], "bytes": 0}
    FactorizedRidge().fit(ds, y)
    FactorizedRidge(alpha=3.0).fit(ds, y)
    info = ds.cache_info()
    assert info == ds[:10].cache_info()
    assert info["statistics"]["misses"] == 2 and info["statistics"]["hits"] == 2
    FactorizedRidge(strategy="materialized").fit(ds, y)
    info = ds.cache_info()
    assert info["materialized"]["devices"] == ["cpu"]
    assert info["materialized"]["bytes"] > 0
    # The materialized operator sums in another order: entries of their own.
    assert info["statistics"]["misses"] == 4


def test_single_fit_pays_no_root_pass(gram_calls):
    ds, y = star(n_rows=500, seed=12)
    rows = np.arange(400)
    FactorizedRidge().fit(ds[rows], y[rows])
    FactorizedRidge(alpha=2.0).fit(ds[rows], y[rows])
    assert gram_calls[0] == 1
    info = ds.cache_info()["statistics"]
    assert info["downdates"] == 0 and info["fallbacks"] == 0
    # A small slice never triggers the root either.
    FactorizedRidge().fit(ds[:100], y[:100])
    FactorizedRidge().fit(ds[100:200], y[100:200])
    assert gram_calls[0] == 3
    # Nor do the folds of a nested search (0.6 of the root): the root's pass would
    # not pay for itself.
    FactorizedRidge().fit(ds[:300], y[:300])
    FactorizedRidge().fit(ds[200:], y[200:])
    assert gram_calls[0] == 5
    assert ds.cache_info()["statistics"]["downdates"] == 0
    # Once the root's sums are there (a fit on all rows), such a slice downdates.
    FactorizedRidge().fit(ds, y)
    FactorizedRidge().fit(ds[100:400], y[100:400])
    assert gram_calls[0] == 7
    assert ds.cache_info()["statistics"]["downdates"] == 1


def test_pickled_dataset_leaves_the_cache_behind():
    ds, y = star(n_rows=500, seed=13)
    empty = len(pickle.dumps(ds))
    est = FactorizedRidge().fit(ds, y)
    assert ds.cache_info()["statistics"]["entries"] == 2
    blob = pickle.dumps(ds)
    assert len(blob) == empty
    loaded = pickle.loads(blob)
    assert loaded.cache_info()["statistics"]["entries"] == 0
    again = FactorizedRidge().fit(loaded, y)
    np.testing.assert_array_equal(again.coef_, est.coef_)
    assert loaded.cache_info()["statistics"]["misses"] == 2


def test_results_are_not_shared_arrays():
    ds, y = star(n_rows=300, seed=14)
    a = _stats(ds)
    a.G[:] = 0.0
    a.mu[:] = 0.0
    b = _stats(ds)
    assert ds.cache_info()["statistics"]["hits"] == 1
    assert np.abs(b.G).max() > 0 and np.abs(b.mu).max() > 0


@pytest.mark.parametrize("name", ["array_api_strict", "cupy"])
def test_folds_on_a_device(name):
    xp, device = namespace_and_device(name)
    ds, y = star(n_rows=1000, seed=16)
    dsd = ds.to_device(device, namespace=None if isinstance(device, str) else xp)
    folds = [train for train, _ in KFold(N_FOLDS).split(y)]
    # The candidates of each fold, in GridSearchCV's order (scoring on a device
    # is outside this test: the fits are what the cache serves).
    on_device = [
        FactorizedRidge(alpha=alpha).fit(dsd[rows], y[rows])
        for alpha in (1e-2, 1.0)
        for rows in folds
    ]
    info = dsd.cache_info()["statistics"]
    assert info["downdates"] == N_FOLDS - 1 and info["hits"] == 2 * N_FOLDS
    # The device's entries are its own: the host dataset has none.
    assert ds.cache_info()["statistics"]["entries"] == 0
    set_statistics_cache(0)
    host = [
        FactorizedRidge(alpha=alpha).fit(ds[rows], y[rows])
        for alpha in (1e-2, 1.0)
        for rows in folds
    ]
    for a, b in zip(on_device, host):
        assert_close(a.coef_, b.coef_, dtype=np.float64, kind="device_fit", scale=1.0)


def test_debug_log_per_hit_miss_and_downdate(caplog):
    ds, y = star(n_rows=500, seed=17)
    folds = [train for train, _ in KFold(N_FOLDS).split(y)]
    with caplog.at_level("DEBUG", logger="ilargi_sklearn"):
        FactorizedRidge().fit(ds[folds[0]], y[folds[0]])
        FactorizedRidge().fit(ds[folds[1]], y[folds[1]])
        FactorizedRidge(alpha=2.0).fit(ds[folds[1]], y[folds[1]])
    text = caplog.text
    assert "statistics cache miss" in text and "statistics cache hit" in text
    assert "statistics cache downdate: 400 rows = 500 root rows - 100 test rows" in text


# ------------------------------------------------ the CV estimators' folds
def _direct(op, rows, sw, Y, fit_intercept):
    sw = None if sw is None else sw[rows]
    return centered_gram(op.take_rows(rows), sw, fit_intercept, Y[rows])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_fold_statistics_downdate_to_the_direct_ones(weighted, fit_intercept):
    set_statistics_cache(0)  # the class's own arithmetic, not the cache's
    ds, y = star(seed=6)
    op = validate_X(FactorizedRidge(), ds, reset=True)
    sw = np.random.default_rng(1).uniform(0.5, 2.0, len(ds)) if weighted else None
    Y = y[:, None]
    statistics = FoldStatistics(op, sw, Y, fit_intercept)
    for train, test in KFold(4, shuffle=True, random_state=0).split(Y):
        fold = statistics.fold(train, test)
        direct = _direct(op, train, sw, Y, fit_intercept)
        scale = float(direct.D.max())
        assert_close(fold.train.G, direct.G, kind="operator", scale=scale)
        assert_close(fold.train.rhs, direct.rhs, kind="operator", scale=scale)
        assert_close(fold.train.mu, direct.mu, kind="operator", scale=1.0)
        assert_close(fold.train.sw_sum, direct.sw_sum, kind="operator", scale=1.0)
        test_direct = _direct(op, test, sw, Y, True)
        np.testing.assert_array_equal(fold.test.G, test_direct.G)
        np.testing.assert_array_equal(fold.test.rhs, test_direct.rhs)
    assert statistics.fallbacks == 0


@pytest.mark.parametrize("case", ["mass", "condition", "not a partition"])
def test_fold_statistics_guard_computes_directly(case):
    set_statistics_cache(0)
    rng = np.random.default_rng(4)
    n = 200
    base = rng.standard_normal((n, 3))
    test = np.arange(40)
    train = np.arange(40, n)
    if case == "mass":
        base[:40, 0] *= 1e3  # the test rows carry most of column 0
    elif case == "condition":
        base[:, 1] = base[:, 0] + 1e-8 * rng.standard_normal(n)
    else:
        train = np.arange(60, n)  # rows 40-59 in neither part
    op = validate_X(FactorizedRidge(), _guarded_dataset(base), reset=True)
    Y = rng.standard_normal((n, 1))
    statistics = FoldStatistics(op, None, Y, True)
    fold = statistics.fold(train, test)
    assert statistics.fallbacks == (case != "not a partition")
    direct = _direct(op, train, None, Y, True)
    # Computed directly: bit for bit.
    np.testing.assert_array_equal(fold.train.G, direct.G)
    np.testing.assert_array_equal(fold.train.rhs, direct.rhs)


def test_cv_estimators_pass_over_all_rows_once_and_each_test_fold(gram_calls):
    set_statistics_cache(0)
    ds, y = star(seed=7)
    FactorizedLassoCV(alphas=[1e-3, 1e-2], cv=KFold(N_FOLDS)).fit(ds, y)
    # All rows (the refit's statistics too) and each fold's test rows; no
    # training fold's own pass.
    assert gram_calls[0] == 1 + N_FOLDS
    gram_calls[0] = 0
    FactorizedRidgeCV(alphas=[1e-3, 1e-2], cv=KFold(N_FOLDS)).fit(ds, y)
    # Ridge's refit solves from the statistics of all rows too (the cache is off
    # here: it is the search that hands them over).
    assert gram_calls[0] == 1 + N_FOLDS


# ------------------------------------------------------------ the slice memo
def test_a_search_slices_each_fold_once():
    ds, _ = star(seed=8)
    rows = np.arange(0, len(ds), 3)
    first = ds[rows]
    # The same index array (what a search hands every candidate): a new dataset
    # over the same gathered rows.
    for again in (ds[rows], ds[rows, ...]):
        assert again is not first and again.operator is first.operator
    # An equal array elsewhere, or the array changed in place: sliced afresh.
    assert ds[rows.copy()].operator is not first.operator
    rows[0] = 1
    again = ds[rows]
    assert again.operator is not first.operator
    np.testing.assert_array_equal(
        again.materialize("dense"), ds.materialize("dense")[rows]
    )
    # A kept slice counts its own bytes: its operator's less the joined sources
    # it shares with its root.
    shared = sum(t.S.nbytes for t in ds.operator.terms if not t.rows.is_identity)
    assert _SLICES.nbytes >= again.operator.nbytes - shared > 0
    # Off with the statistics cache (the old knob bounds the memo too): nothing
    # is kept.
    set_statistics_cache(0)
    assert ds[rows].operator is not ds[rows].operator
    assert len(_SLICES) == 0 and _SLICES.nbytes == 0
