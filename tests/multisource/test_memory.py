"""Memory: the joined matrix built once per root dataset (one cache for the
estimators and the planner), bounded, freed with its dataset, never changing a
result."""

import gc

import numpy as np
import pytest
from sklearn.base import clone

from ilargi_sklearn.cluster import FactorizedKMeans
from ilargi_sklearn.linear_model import (
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
)
from ilargi_sklearn.multisource import FactorizedMatrix
from ilargi_sklearn.multisource._cache import (
    _CACHE,
    clear_materialization_cache,
    is_materialization_cached,
    set_materialization_cache,
)
from ilargi_sklearn.planner import AutoPlan
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import random_dataset


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_materialization_cache()
    yield
    set_materialization_cache()


@pytest.fixture
def joins(monkeypatch):
    """The number of joins built (calls of ``FactorizedMatrix.materialize``)."""
    calls = []
    original = FactorizedMatrix.materialize

    def counted(self, format="auto"):
        calls.append(self.shape)
        return original(self, format)

    monkeypatch.setattr(FactorizedMatrix, "materialize", counted)
    return calls


def _data(seed=0, n_rows=400, scenario="left"):
    ds = random_dataset(seed, n_rows=n_rows, scenario=scenario)
    return ds, ds @ np.random.default_rng(seed).standard_normal(ds.shape[1])


def test_materialized_fits_build_the_root_join_once(joins):
    ds, y = _data()
    folds = [np.arange(0, 300), np.arange(100, 400), np.arange(50, 350)]
    est = FactorizedLinearRegression(strategy="materialized")
    models = [clone(est).fit(ds[rows], y[rows]) for rows in folds]
    assert joins == [ds.shape]  # the root's join, once for the three folds
    assert is_materialization_cached(ds[folds[0]])
    # Another estimator on the same data reads the same cached join.
    FactorizedLogisticRegression(strategy="materialized").fit(ds, y > 0)
    assert len(joins) == 1
    # Never a different result: the same fits without the cache.
    set_materialization_cache(max_bytes=0)
    for rows, cached in zip(folds, models):
        plain = clone(est).fit(ds[rows], y[rows])
        np.testing.assert_array_equal(plain.coef_, cached.coef_)
        np.testing.assert_array_equal(plain.intercept_, cached.intercept_)
    assert len(joins) == 1 + len(folds)  # max_bytes=0: nothing is kept


def test_small_slices_join_themselves(joins):
    # A slice under half of its root builds its own (smaller) join, uncached.
    ds, y = _data(1)
    FactorizedLinearRegression(strategy="materialized").fit(ds[:100], y[:100])
    assert joins == [(100, ds.shape[1])]
    assert not is_materialization_cached(ds)


def test_cache_is_bounded_and_freed_with_its_dataset(joins):
    set_materialization_cache(max_entries=1)
    a, ya = _data(2)
    b, yb = _data(3)
    est = FactorizedLinearRegression(strategy="materialized")
    clone(est).fit(a, ya)
    clone(est).fit(b, yb)
    assert is_materialization_cached(b) and not is_materialization_cached(a)
    assert _CACHE.nbytes > 0
    # The entry goes when the last reference to its root's data goes.
    fold = b[np.arange(300)]
    del b
    gc.collect()
    assert _CACHE.nbytes > 0  # the fold still holds the root's sources
    del fold
    gc.collect()
    assert _CACHE.nbytes == 0


def test_planner_and_estimators_share_one_cache(joins):
    ds, _ = _data(4, n_rows=600)
    auto = AutoPlan(
        FactorizedKMeans(3, random_state=0),
        plans=["materialized"],
        cost_model="analytical",
    )
    auto.fit(ds[np.arange(0, 450)])
    assert len(joins) == 1 and not auto.materialization_cached_
    # The estimator itself, on another fold, takes its rows of the same join.
    FactorizedKMeans(3, random_state=0, strategy="materialized").fit(
        ds[np.arange(150, 600)]
    )
    assert len(joins) == 1


def test_scaled_datasets_share_the_join_of_their_root(joins):
    # A scaler's output keeps the sources (its scaling stays implicit): the
    # materialized fit joins the root once, the scaling applied on top.
    ds, y = _data(5, scenario="star")
    Z = FactorizedStandardScaler().fit_transform(ds)
    mat = FactorizedLinearRegression(strategy="materialized").fit(Z, y)
    FactorizedLinearRegression(strategy="materialized").fit(Z[np.arange(300)], y[:300])
    assert len(joins) == 1
    fact = FactorizedLinearRegression().fit(Z, y)
    np.testing.assert_allclose(mat.coef_, fact.coef_, rtol=1e-8, atol=1e-10)
