"""Ridge after implicit polynomial features reaches scikit-learn's default accuracy.

Over more than 1000 implicit degree-2 features the gram is not formed up front. LSQR
at ``tol=1e-4`` (the former default) stopped half the coefficients' norm away from
the solution on badly scaled features, where scikit-learn's default on the
materialized matrix (Cholesky on dense data, conjugate gradients on sparse) is
exact or close.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import Ridge
from sklearn.preprocessing import PolynomialFeatures

from ilargi_sklearn import (
    FactorizedPolynomialFeatures,
    FactorizedRidge,
    FactorizedStandardScaler,
    MultiSourceDataset,
)


def _star(scaled: bool, sparse: bool = False, seed: int = 0):
    """45 joined features (1081 degree-2 columns), badly scaled unless
    ``scaled``; the dimension one-hot encoded (CSR) when ``sparse``."""
    rng = np.random.default_rng(seed)
    n, d0, m = 400, 15, 40
    S = rng.standard_normal((n, d0)) * np.logspace(0, 1.5, d0)
    if sparse:
        R = sp.csr_matrix(np.eye(m)[:, :30] * rng.uniform(1, 5, (m, 1)))
    else:
        R = rng.standard_normal((m, 30)) + 3.0
    fk = rng.integers(0, m, n)
    ds = MultiSourceDataset.from_matrices([S, R], [None, fk])
    if scaled:
        ds = FactorizedStandardScaler(with_mean=not sparse).fit_transform(ds)
    T = ds.materialize()
    Td = T.toarray() if sp.issparse(T) else T
    y = Td[:, 0] * Td[:, 20] + Td[:, 3] + rng.normal(0, 1, n)
    return ds, T, y


def _rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize(
    "scaled, sparse", [(False, False), (True, False), (False, True)]
)
def test_default_ridge_on_implicit_interactions_is_as_accurate_as_sklearn(
    scaled, sparse
):
    ds, T, y = _star(scaled, sparse)
    P = FactorizedPolynomialFeatures(2).fit_transform(ds)
    assert P.shape[1] > 1000  # past the width where the gram is formed up front
    M = PolynomialFeatures(2).fit_transform(T)
    Md = M.toarray() if sp.issparse(M) else M
    exact = Ridge(alpha=1.0, solver="cholesky").fit(Md, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scikit-learn's sparse_cg may not converge
        sklearn_default = Ridge(alpha=1.0).fit(M, y)
    ours = FactorizedRidge(alpha=1.0).fit(P, y)
    sk_err = _rel(sklearn_default.coef_, exact.coef_)
    our_err = _rel(ours.coef_, exact.coef_)
    assert our_err <= max(1.5 * sk_err, 1e-6), (our_err, sk_err, ours.solver_)
    assert ours.solver_ in ("sparse_cg", "cholesky")
    pred = P @ ours.coef_ + ours.intercept_
    np.testing.assert_allclose(
        pred, exact.predict(Md), rtol=0, atol=max(1.5 * sk_err, 1e-6) * np.ptp(y)
    )


def test_well_conditioned_interactions_stay_iterative():
    """Standard normal features converge in tens of conjugate-gradient
    iterations, far below the gram's cost: no gram is formed, and the answer is
    the exact solve's (scikit-learn's default on the dense materialized matrix)."""
    rng = np.random.default_rng(1)
    n = 5000
    S = rng.standard_normal((n, 15))
    R = rng.standard_normal((1000, 30))
    ds = MultiSourceDataset.from_matrices([S, R], [None, rng.integers(0, 1000, n)])
    T = ds.materialize()
    y = T[:, 0] * T[:, 20] + T[:, 3] + rng.normal(0, 0.5, n)
    P = FactorizedPolynomialFeatures(2).fit_transform(ds)
    ours = FactorizedRidge(alpha=1.0).fit(P, y)
    assert ours.solver_ == "sparse_cg" and ours.n_iter_[0] < 120
    ref = Ridge(alpha=1.0).fit(PolynomialFeatures(2).fit_transform(T), y)
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-7, atol=1e-9)
