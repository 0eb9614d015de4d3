"""FactorizedStandardScaler: statistics and implicit transform vs scikit-learn."""

import numpy as np
import pytest
from _helpers import assert_close, tolerance
from sklearn.preprocessing import StandardScaler

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("weighted", [False, True])
def test_scaler_matches_sklearn(scenario, weighted):
    ds = random_dataset(3, scenario=scenario)
    T = ds.materialize("dense").astype(np.float64)
    w = np.random.default_rng(0).random(len(ds)) + 0.1 if weighted else None
    ours = FactorizedStandardScaler().fit(ds, sample_weight=w)
    ref = StandardScaler().fit(T, sample_weight=w)
    tol = tolerance(ds.dtype, "compiled")
    assert_close(ours.mean_, ref.mean_, dtype=ds.dtype, kind="compiled")
    np.testing.assert_allclose(ours.var_, ref.var_, rtol=tol * 10, atol=tol)
    np.testing.assert_allclose(ours.scale_, ref.scale_, rtol=tol * 10, atol=tol)

    Z = ours.transform(ds)
    assert isinstance(Z, MultiSourceDataset)
    assert Z.dtype == ds.dtype
    np.testing.assert_allclose(
        Z.materialize("dense"), ref.transform(T), rtol=tol * 100, atol=tol * 100
    )


@pytest.mark.parametrize("scenario", ["left", "sparse", "overlap", "union"])
def test_scaled_operators_equal_materialized(scenario):
    ds = random_dataset(5, scenario=scenario)
    Z = FactorizedStandardScaler().fit_transform(ds)
    M = Z.materialize("dense")
    rng = np.random.default_rng(1)
    W = rng.standard_normal((Z.shape[1], 3))
    Y = rng.standard_normal((len(Z), 2))
    d = rng.random(len(Z))
    np.testing.assert_allclose(Z @ W, M @ W, atol=1e-10)
    np.testing.assert_allclose(Z.T @ Y, M.T @ Y, atol=1e-10)
    np.testing.assert_allclose(Z.gram(format="dense"), M.T @ M, atol=1e-9)
    np.testing.assert_allclose(
        Z.gram(d, format="dense"), M.T @ (d[:, None] * M), atol=1e-9
    )
    np.testing.assert_allclose(Z.row_norms(), (M * M).sum(axis=1), atol=1e-9)
    np.testing.assert_allclose(Z.sum(axis=0), M.sum(axis=0), atol=1e-9)
    np.testing.assert_allclose(Z.sum(axis=1), M.sum(axis=1), atol=1e-9)
    sub = Z[np.arange(0, len(Z), 3)]
    np.testing.assert_allclose(sub.materialize("dense"), M[::3], atol=1e-12)


def test_sources_untouched_and_sparse():
    ds = random_dataset(2, scenario="sparse")
    before = [t.S.copy() for t in ds.operator.terms]
    Z = FactorizedStandardScaler().fit_transform(ds)
    # The scaled dataset shares the very same source objects: nothing was densified.
    base_terms = Z.operator.base.terms
    assert all(a.S is b.S for a, b in zip(base_terms, ds.operator.terms))
    assert any(t.is_sparse for t in base_terms)
    for S0, t in zip(before, ds.operator.terms):
        diff = S0 - t.S
        assert abs(diff).max() == 0


def test_with_mean_false_and_with_std_false():
    ds = random_dataset(4, scenario="star")
    T = ds.materialize("dense")
    for kw in ({"with_mean": False}, {"with_std": False}):
        Z = FactorizedStandardScaler(**kw).fit_transform(ds)
        np.testing.assert_allclose(
            Z.materialize("dense"), StandardScaler(**kw).fit_transform(T), atol=1e-10
        )


def test_array_input_matches_sklearn_and_inverse():
    X = np.random.default_rng(0).standard_normal((30, 4)) * 3 + 1
    ours = FactorizedStandardScaler().fit(X)
    Z = ours.transform(X)
    np.testing.assert_allclose(Z, StandardScaler().fit_transform(X), atol=1e-12)
    np.testing.assert_allclose(ours.inverse_transform(Z), X, atol=1e-12)


def test_stock_scaler_on_dataset_names_the_alternative():
    ds = random_dataset(0)
    with pytest.raises(TypeError, match="FactorizedStandardScaler"):
        StandardScaler().fit(ds)


def test_schema_mismatch_on_transform():
    ds = random_dataset(0, scenario="star")
    other = random_dataset(1, scenario="left")
    sc = FactorizedStandardScaler().fit(ds)
    if other.shape[1] != ds.shape[1]:
        with pytest.raises(ValueError, match="features"):
            sc.transform(other)
    renamed = MultiSourceDataset.from_matrices(
        [t.S for t in ds.operator.terms],
        [t.rows.idx for t in ds.operator.terms],
        [t.cols for t in ds.operator.terms],
        [f"other{j}" for j in range(ds.shape[1])],
    )
    with pytest.raises(ValueError, match="feature names"):
        sc.transform(renamed)
