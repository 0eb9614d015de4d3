"""Factorized linear and logistic regression: parity with scikit-learn on the
materialized table, factorized == materialized over every integration scenario, the
paper's gradient-descent solvers and bad input."""

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from _helpers import assert_close, tolerance
from scipy.optimize import check_grad
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LinearRegression, LogisticRegression

import ilargi_sklearn.linear_model._least_squares as least_squares
from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.linear_model import (
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
)
from ilargi_sklearn.linear_model._loss import _loss_and_grad
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

# Tight solver settings for parity with scikit-learn at the optimum.
EXACT = dict(tol=1e-10, max_iter=10_000)


def _star(seed=0, n_rows=300, dim_rows=15, dim_cols=3, base_cols=2):
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n_rows, base_cols))
    dim = rng.standard_normal((dim_rows, dim_cols))
    fk = rng.integers(0, dim_rows, n_rows)
    return MultiSourceDataset.from_matrices([base, dim], [None, fk])


def _regression_data(seed=0, n=200, d=6, n_targets=None):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    shape = (d,) if n_targets is None else (d, n_targets)
    beta = rng.uniform(1, 3, shape) * rng.choice([-1, 1], shape)
    noise = 0.1 * rng.standard_normal((n,) if n_targets is None else (n, n_targets))
    return X, X @ beta + 3.0 + noise


def _classification_data(seed=0, n=300, d=5, n_classes=2):
    # Labels drawn from the model itself: not separable, so the unpenalized
    # optimum exists.
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    W = rng.standard_normal((n_classes, d))
    logits = X @ W.T + rng.standard_normal(n_classes)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = np.array([rng.choice(n_classes, p=row) for row in p])
    return X, y


def _sk_logistic(penalty, **kw):
    # scikit-learn 1.8+ spells "no penalty" as C=inf (penalty is deprecated).
    C = kw.pop("C", 1.0)
    return LogisticRegression(C=np.inf if penalty is None else C, **kw)


# --------------------------------------------------------------------- linear
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_linear_matches_sklearn(weighted, fit_intercept):
    X, y = _regression_data()
    sw = np.random.default_rng(1).uniform(0.2, 3.0, X.shape[0]) if weighted else None
    ref = LinearRegression(fit_intercept=fit_intercept).fit(X, y, sample_weight=sw)
    est = FactorizedLinearRegression(fit_intercept=fit_intercept).fit(
        X, y, sample_weight=sw
    )
    assert est.coef_.shape == ref.coef_.shape == (X.shape[1],)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-8)
    assert est.n_iter_ == 1


def test_linear_multi_output_matches_sklearn():
    X, Y = _regression_data(n_targets=3)
    sw = np.random.default_rng(2).uniform(0.5, 2.0, X.shape[0])
    ref = LinearRegression().fit(X, Y, sample_weight=sw)
    est = FactorizedLinearRegression().fit(X, Y, sample_weight=sw)
    assert est.coef_.shape == (3, X.shape[1])
    assert est.intercept_.shape == (3,)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-8)
    assert est.predict(X).shape == Y.shape
    # A 2-D y with one column keeps the 2-D shapes, like scikit-learn.
    one = FactorizedLinearRegression().fit(X, Y[:, :1])
    assert one.coef_.shape == (1, X.shape[1]) and one.intercept_.shape == (1,)


def test_linear_factorized_dataset_matches_sklearn():
    ds = _star()
    T = ds.materialize(format="dense")
    y = T @ np.array([1.0, -2.0, 0.5, 1.5, 3.0]) + 4.0
    y += 0.05 * np.random.default_rng(3).standard_normal(y.shape)
    ref = LinearRegression().fit(T, y)
    est = FactorizedLinearRegression().fit(ds, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-8)
    np.testing.assert_allclose(est.predict(ds), ref.predict(T), rtol=1e-8)
    np.testing.assert_array_equal(est.feature_names_in_, ds.feature_names)


@pytest.mark.parametrize("weighted", [False, True])
def test_linear_rank_deficient_matches_sklearn_predictions(weighted):
    rng = np.random.default_rng(4)
    X, y = _regression_data(seed=4, d=4)
    # A duplicated column and a linear combination: rank 4 of 6.
    X = np.column_stack([X, X[:, 0], X[:, 1] - 2 * X[:, 2]])
    sw = rng.uniform(0.5, 2.0, X.shape[0]) if weighted else None
    ref = LinearRegression().fit(X, y, sample_weight=sw)
    est = FactorizedLinearRegression().fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-8, atol=1e-8)
    # Both give the minimum-norm solution.
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("tol", [1e-6, 1e-3])
def test_linear_tol_is_lstsq_cond_on_dense_data(tol):
    # A direction whose singular value is about 1e-4 of the largest: kept at the
    # default tol=1e-6, cut at tol=1e-3, on both sides (scikit-learn passes tol
    # to lstsq as cond).
    rng = np.random.default_rng(24)
    X = rng.standard_normal((300, 4))
    X = np.column_stack([X, X[:, 0] + 1e-4 * rng.standard_normal(300)])
    y = X @ [1.0, 2.0, 0.0, -1.0, 0.0] + 1e3 * (X[:, 4] - X[:, 0])
    ref = LinearRegression(tol=tol).fit(X, y)
    est = FactorizedLinearRegression(tol=tol).fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-8, atol=1e-8)
    assert (est.score(X, y) > 0.999) == (tol < 1e-4)


def test_linear_rank_deficient_factorized_dataset():
    # A dimension table with 3 rows and 4 columns: after centering its columns span
    # at most 2 directions, so the joined matrix is rank deficient by design.
    ds = _star(seed=5, dim_rows=3, dim_cols=4)
    T = ds.materialize(format="dense")
    y = np.random.default_rng(5).standard_normal(T.shape[0]) + T[:, 3]
    ref = LinearRegression().fit(T, y)
    for strategy in ("factorized", "materialized"):
        est = FactorizedLinearRegression(strategy=strategy).fit(ds, y)
        np.testing.assert_allclose(
            est.predict(ds), ref.predict(T), rtol=1e-8, atol=1e-8
        )


def test_linear_sparse_input_and_lsqr_path(monkeypatch):
    rng = np.random.default_rng(6)
    X = sp.random(300, 40, density=0.2, random_state=rng, format="csr")
    y = X @ rng.standard_normal(40) + 1.0 + 0.01 * rng.standard_normal(300)
    sw = rng.uniform(0.5, 2.0, 300)
    ref = LinearRegression().fit(X.toarray(), y, sample_weight=sw)
    dense_gram = FactorizedLinearRegression().fit(X, y, sample_weight=sw)
    np.testing.assert_allclose(dense_gram.coef_, ref.coef_, rtol=1e-8)
    assert dense_gram.n_iter_ == 1
    # Force the large-sparse path: LSQR on the implicitly centered operator.
    monkeypatch.setattr(least_squares, "_MAX_DENSE_GRAM_FEATURES", 10)
    # At the default tol=1e-6 both libraries run the same LSQR on sparse input:
    # the same iterations, the same (1e-6-precise) solution.
    sk_sparse = LinearRegression().fit(X, y, sample_weight=sw)
    est = FactorizedLinearRegression().fit(X, y, sample_weight=sw)
    assert est.n_iter_ > 1
    np.testing.assert_allclose(est.coef_, sk_sparse.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(est.intercept_, sk_sparse.intercept_, rtol=1e-10)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-4, atol=1e-5)
    # A smaller tol is the stricter mode: more iterations, the exact solution.
    strict = FactorizedLinearRegression(tol=1e-12).fit(X, y, sample_weight=sw)
    assert strict.n_iter_ > est.n_iter_
    np.testing.assert_allclose(strict.coef_, ref.coef_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(strict.intercept_, ref.intercept_, rtol=1e-7)
    Y = np.column_stack([y, -2 * y + 1])
    multi = FactorizedLinearRegression(tol=1e-12).fit(X, Y)
    np.testing.assert_allclose(
        multi.predict(X), LinearRegression().fit(X.toarray(), Y).predict(X), rtol=1e-7
    )


@pytest.mark.parametrize(
    "shape, tol, iter_lim",
    [
        ((300, 40), 1e-6, None),
        ((200, 500), 1e-10, None),
        ((300, 40), 0.0, None),
        ((300, 40), 1e-12, 3),
    ],
)
def test_lsqr_is_scipys_with_the_residual_updated_in_place(shape, tol, iter_lim):
    # scikit-learn's sparse LinearRegression calls scipy's lsqr: ours runs the same
    # iterations to the same solution, but updates its one n-length vector in
    # place (every call of rmatvec sees the same array), where scipy's loop
    # allocates three n-length temporaries per iteration.
    from scipy.sparse.linalg import lsqr

    rng = np.random.default_rng(sum(shape))
    A = sp.random(*shape, density=0.05, random_state=rng, format="csc")
    A = sp.hstack([A, A[:, :1]], format="csr")  # rank deficient
    b = rng.standard_normal(shape[0])
    ref = lsqr(A, b, atol=tol, btol=tol, iter_lim=iter_lim)
    seen = []

    def rmatvec(u):
        seen.append(u)
        return A.T @ u

    x, n_iter = least_squares._lsqr(
        lambda v: A @ v, rmatvec, b.copy(), A.shape[1], tol, tol, iter_lim=iter_lim
    )
    assert n_iter == ref[2]
    np.testing.assert_allclose(x, ref[0], rtol=1e-9, atol=1e-12)
    assert len(seen) == n_iter + 1 and all(u is seen[0] for u in seen)


def test_linear_gd_paper_solver():
    X, y = _regression_data(seed=7)
    ref = LinearRegression().fit(X, y)
    # The paper's fixed-iteration solver (tol=0) runs exactly max_iter steps,
    # without a convergence test, and lowers the loss monotonically with the
    # default step size 1/L.
    losses = []
    for n_iter in (1, 5, 20):
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            est = FactorizedLinearRegression(solver="gd", max_iter=n_iter, tol=0)
            est.fit(X, y)
        assert est.n_iter_ == n_iter
        losses.append(np.mean((est.predict(X) - y) ** 2))
    assert losses[0] > losses[1] > losses[2]
    # At the default tol=1e-6 the same 20 steps are not converged, and say so.
    with pytest.warns(ConvergenceWarning, match="tol=0 for the fixed-iteration"):
        est = FactorizedLinearRegression(solver="gd", max_iter=20).fit(X, y)
    assert est.n_iter_ == 20
    # Run to convergence it reaches the least-squares solution.
    est = FactorizedLinearRegression(solver="gd", max_iter=5000, tol=1e-12).fit(X, y)
    assert est.n_iter_ < 5000
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-8)


def test_linear_gd_default_step_is_stable_on_badly_scaled_data():
    X, y = _regression_data(seed=8)
    X = X * np.array([1000.0, 1.0, 0.01, 1.0, 50.0, 1.0])
    est = FactorizedLinearRegression(solver="gd", max_iter=50, tol=0).fit(X, y)
    mse0 = np.mean((y - y.mean()) ** 2 + y.mean() ** 2)
    assert np.all(np.isfinite(est.coef_))
    assert np.mean((est.predict(X) - y) ** 2) < mse0
    with pytest.warns(ConvergenceWarning, match="tol="):
        FactorizedLinearRegression(solver="gd", max_iter=2, tol=1e-12).fit(X, y)


# ------------------------------------------------------------------- logistic
@pytest.mark.parametrize("n_classes", [2, 4])
@pytest.mark.parametrize("penalty", ["l2", None])
@pytest.mark.parametrize("weighted", [False, True])
def test_logistic_matches_sklearn(n_classes, penalty, weighted):
    X, y = _classification_data(seed=n_classes, n_classes=n_classes)
    sw = np.random.default_rng(9).uniform(0.2, 3.0, X.shape[0]) if weighted else None
    ref = _sk_logistic(penalty, C=0.5, **EXACT).fit(X, y, sample_weight=sw)
    est = FactorizedLogisticRegression(penalty=penalty, C=0.5, **EXACT).fit(
        X, y, sample_weight=sw
    )
    n_rows = 1 if n_classes == 2 else n_classes
    assert est.coef_.shape == ref.coef_.shape == (n_rows, X.shape[1])
    assert est.intercept_.shape == ref.intercept_.shape == (n_rows,)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        est.predict_proba(X), ref.predict_proba(X), rtol=1e-4, atol=1e-6
    )
    np.testing.assert_allclose(
        est.decision_function(X), ref.decision_function(X), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_array_equal(est.classes_, ref.classes_)
    assert est.n_iter_.shape == (1,) and est.n_iter_.dtype == np.int32


def test_logistic_no_intercept_and_dataset_matches_sklearn():
    ds = _star(seed=10)
    T = ds.materialize(format="dense")
    rng = np.random.default_rng(10)
    y = (T @ rng.standard_normal(5) + rng.logistic(size=T.shape[0]) > 0).astype(int)
    ref = LogisticRegression(fit_intercept=False, **EXACT).fit(T, y)
    est = FactorizedLogisticRegression(fit_intercept=False, **EXACT).fit(ds, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(est.intercept_, [0.0])
    np.testing.assert_allclose(est.predict_proba(ds), ref.predict_proba(T), atol=1e-6)


def test_logistic_outputs_and_string_labels():
    X, y_int = _classification_data(seed=11, n_classes=3)
    labels = np.array(["cat", "dog", "emu"])
    y = labels[y_int]
    est = FactorizedLogisticRegression().fit(X, y)
    np.testing.assert_array_equal(est.classes_, labels)
    proba = est.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(est.predict_log_proba(X), np.log(proba), rtol=1e-10)
    np.testing.assert_array_equal(est.predict(X), labels[proba.argmax(axis=1)])
    assert est.decision_function(X).shape == (X.shape[0], 3)
    # Binary: 1-D decision function whose sign picks classes_[1].
    binary = FactorizedLogisticRegression().fit(X, y_int > 0)
    scores = binary.decision_function(X)
    assert scores.shape == (X.shape[0],)
    np.testing.assert_array_equal(binary.predict(X), scores > 0)
    np.testing.assert_allclose(
        binary.predict_log_proba(X), np.log(binary.predict_proba(X)), rtol=1e-10
    )


def test_logistic_convergence_warning():
    X, y = _classification_data(seed=12)
    with pytest.warns(ConvergenceWarning, match="max_iter"):
        est = FactorizedLogisticRegression(max_iter=1).fit(X, y)
    assert est.n_iter_[0] == 1


@pytest.mark.parametrize("n_classes", [2, 3])
def test_logistic_gd_reaches_lbfgs_optimum(n_classes):
    X, y = _classification_data(seed=13, n_classes=n_classes)
    lbfgs = FactorizedLogisticRegression(**EXACT).fit(X, y)
    gd = FactorizedLogisticRegression(solver="gd", max_iter=20_000, tol=1e-9).fit(X, y)
    assert gd.n_iter_[0] < 20_000
    np.testing.assert_allclose(gd.coef_, lbfgs.coef_, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gd.intercept_, lbfgs.intercept_, rtol=1e-6, atol=1e-7)
    # Ten steps at the default tol are not converged, and say so.
    with pytest.warns(ConvergenceWarning):
        short = FactorizedLogisticRegression(solver="gd", max_iter=10).fit(X, y)
    assert short.n_iter_[0] == 10
    assert short.score(X, y) > 1.0 / n_classes
    # The fixed-iteration paper mode (tol=0): the same ten steps, no test.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        fixed = FactorizedLogisticRegression(solver="gd", max_iter=10, tol=0)
        fixed.fit(X, y)
    assert fixed.n_iter_[0] == 10
    np.testing.assert_allclose(fixed.coef_, short.coef_, rtol=1e-12)


@pytest.mark.parametrize("loss", ["squared", "binomial", "multinomial"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_loss_gradient_is_the_true_gradient(loss, fit_intercept):
    # Pitfall 3 of DESIGN.md: a published update was not the log-loss gradient.
    rng = np.random.default_rng(14)
    ds = _star(seed=14, n_rows=50)
    op = ds.operator
    n, d = op.shape
    k = {"squared": 2, "binomial": 1, "multinomial": 3}[loss]
    if loss == "squared":
        y = rng.standard_normal((n, k))
    elif loss == "binomial":
        y = rng.integers(0, 2, n).astype(float)
    else:
        y = np.eye(k)[rng.integers(0, k, n)]
    sw = rng.uniform(0.5, 2.0, n)
    args = (op, y, sw, sw.sum(), 0.3, fit_intercept, k, loss)
    w = 0.3 * rng.standard_normal(k * (d + fit_intercept))

    def f(w):
        return _loss_and_grad(w, *args)[0]

    def g(w):
        return _loss_and_grad(w, *args)[1]

    assert check_grad(f, g, w) < 1e-6 * max(1.0, np.linalg.norm(g(w)))


# ------------------------------------------------ factorized == materialized
def _scenario_targets(ds, seed):
    T = ds.materialize(format="dense").astype(np.float64)
    rng = np.random.default_rng(seed)
    beta = rng.standard_normal((T.shape[1], 3))
    raw = T @ beta
    y_reg = raw[:, 0] + 1.0 + 0.1 * rng.standard_normal(T.shape[0])
    y_bin = (raw[:, 1] + rng.logistic(size=T.shape[0]) > 0).astype(int)
    y_multi = (raw[:, :3] + rng.gumbel(size=raw[:, :3].shape)).argmax(axis=1)
    return y_reg, y_bin, y_multi


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_factorized_equals_materialized(scenario):
    ds = random_dataset(3, scenario=scenario, n_rows=80)
    dtype = ds.dtype
    rtol = tolerance(dtype, "solver")
    y_reg, y_bin, y_multi = _scenario_targets(ds, seed=3)
    sw = np.random.default_rng(4).uniform(0.5, 2.0, len(ds))

    def both(est, y, **fit_kw):
        fact = est.set_params(strategy="factorized").fit(ds, y, **fit_kw)
        coef, intercept = fact.coef_.copy(), np.copy(fact.intercept_)
        mat = est.set_params(strategy="materialized").fit(ds, y, **fit_kw)
        assert mat.coef_.dtype == dtype and coef.dtype == dtype
        np.testing.assert_allclose(coef, mat.coef_, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(intercept, mat.intercept_, rtol=rtol, atol=rtol)

    both(FactorizedLinearRegression(), y_reg)
    both(
        FactorizedLinearRegression(), np.column_stack([y_reg, y_bin]), sample_weight=sw
    )
    both(FactorizedLinearRegression(solver="gd", tol=0), y_reg, sample_weight=sw)
    # float32 L-BFGS cannot reach 1e-10 gradients: the tolerance follows the dtype.
    tol = 1e-6 if dtype == np.float32 else 1e-10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        both(FactorizedLogisticRegression(tol=tol, max_iter=10_000), y_bin)
        both(
            FactorizedLogisticRegression(tol=tol, max_iter=10_000),
            y_multi,
            sample_weight=sw,
        )
        both(FactorizedLogisticRegression(solver="gd", max_iter=30), y_multi)


def test_float32_follows_data_dtype_and_matches_float64():
    ds = random_dataset(5, scenario="star", n_rows=120)
    y_reg, y_bin, _ = _scenario_targets(ds, seed=5)
    ds32 = ds.astype(np.float32)
    for est, y in (
        (FactorizedLinearRegression(), y_reg),
        (FactorizedLogisticRegression(tol=1e-6, max_iter=10_000), y_bin),
    ):
        m64 = est.fit(ds, y)
        coef64, intercept64 = m64.coef_.copy(), np.copy(m64.intercept_)
        m32 = est.fit(ds32, y)
        assert m32.coef_.dtype == np.float32
        np.testing.assert_allclose(m32.coef_, coef64, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(m32.intercept_, intercept64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "est", [FactorizedLinearRegression(), FactorizedLogisticRegression()]
)
def test_dense_and_sparse_arrays_give_the_same_model(est):
    X, y = _classification_data(seed=15)
    X[np.abs(X) < 0.5] = 0.0
    dense = est.fit(X, y)
    coef = dense.coef_.copy()
    sparse = est.fit(sp.csr_matrix(X), y)
    np.testing.assert_allclose(sparse.coef_, coef, rtol=1e-7, atol=1e-10)
    assert not hasattr(sparse, "feature_names_in_")


@pytest.mark.parametrize(
    "est", [FactorizedLinearRegression(), FactorizedLogisticRegression()]
)
def test_array_inputs_unchanged(est):
    X, y = _classification_data(seed=16)
    sw = np.linspace(0.5, 2.0, X.shape[0])
    copies = [a.copy() for a in (X, y, sw)]
    est.fit(X, y, sample_weight=sw)
    est.predict(X)
    for a, b in zip((X, y, sw), copies):
        np.testing.assert_array_equal(a, b)


def test_dataframe_feature_names():
    X, y = _regression_data(seed=17, d=3)
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    est = FactorizedLinearRegression().fit(df, y)
    np.testing.assert_array_equal(est.feature_names_in_, ["a", "b", "c"])
    np.testing.assert_allclose(
        est.predict(df), X @ est.coef_ + est.intercept_, rtol=1e-12
    )


# ------------------------------------------------------------------ bad input
ESTIMATORS = [FactorizedLinearRegression, FactorizedLogisticRegression]


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_nan_in_y(Est):
    ds = _star()
    y = np.arange(len(ds)) % 2 * 1.0
    y[3] = np.nan
    with pytest.raises(ValueError, match="Input y contains NaN"):
        Est().fit(ds, y)


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_y_of_wrong_length(Est):
    ds = _star(n_rows=50)
    with pytest.raises(ValueError, match="X has 50 samples but y has 49"):
        Est().fit(ds, np.arange(49) % 2)


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_y_none(Est):
    with pytest.raises(ValueError, match="requires y to be passed"):
        Est().fit(_star(), None)


def test_single_class():
    with pytest.raises(ValueError, match="only one class: 'a'"):
        FactorizedLogisticRegression().fit(_star(n_rows=20), ["a"] * 20)


def test_continuous_target_for_classifier():
    with pytest.raises(ValueError, match="Unknown label type"):
        FactorizedLogisticRegression().fit(_star(n_rows=20), np.linspace(0, 1, 20))


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_predict_before_fit(Est):
    with pytest.raises(NotFittedError):
        Est().predict(_star())


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_predict_with_other_schema(Est):
    ds = _star(dim_cols=3)
    y = np.arange(len(ds)) % 2
    est = Est().fit(ds, y)
    with pytest.raises(ValueError, match="X has 6 features, but .* is expecting 5"):
        est.predict(_star(dim_cols=4))
    renamed = MultiSourceDataset.from_matrices(
        [np.ones((4, 2)), np.ones((2, 3))],
        [None, np.array([0, 1, 0, 1])],
        feature_names=["p", "q", "r", "s", "t"],
    )
    with pytest.raises(ValueError, match="feature names"):
        est.predict(renamed)


@pytest.mark.parametrize("Est", ESTIMATORS)
def test_bad_sample_weight(Est):
    ds = _star(n_rows=30)
    y = np.arange(30) % 2
    with pytest.raises(ValueError, match="sample_weight"):
        Est().fit(ds, y, sample_weight=np.ones(29))


def test_invalid_parameters():
    ds = _star(n_rows=20)
    y = np.arange(20) % 2
    with pytest.raises(ValueError, match="solver"):
        FactorizedLinearRegression(solver="svd").fit(ds, y)
    with pytest.raises(ValueError, match="strategy"):
        FactorizedLogisticRegression(strategy="lazy").fit(ds, y)
    with pytest.raises(ValueError, match="'C' parameter"):
        FactorizedLogisticRegression(C=0.0).fit(ds, y)


def test_linear_ill_conditioned_with_large_means_matches_sklearn():
    # Condition number 1e3 and column means far from the spread: the implicitly
    # centered gram loses digits, the refinement through the operator recovers them.
    rng = np.random.default_rng(19)
    U, _ = np.linalg.qr(rng.standard_normal((400, 5)))
    V, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    X = (U * np.logspace(0, -3, 5)) @ V.T + np.array([5.0, -3.0, 10.0, 0.0, 7.0])
    # A constant column (exactly collinear with the intercept), like a year column.
    X = np.column_stack([X, np.full(400, 2013.0)])
    y = X[:, :5] @ rng.standard_normal(5) + 0.01 * rng.standard_normal(400)
    ref = LinearRegression().fit(X, y)
    est = FactorizedLinearRegression().fit(X, y)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-10)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8, atol=1e-8)


def test_linear_wide_sparse_dataset_uses_lsqr_like_sklearn():
    # A wide, rank-deficient one-hot dimension source (more columns than rows):
    # above the threshold a sparse problem goes to LSQR, which scikit-learn's
    # LinearRegression also uses for sparse input; the predictions agree.
    rng = np.random.default_rng(23)
    n_rows, dim_rows = 2000, 60
    n_dim_cols = least_squares._MAX_DENSE_GRAM_FEATURES + 5
    base = sp.csr_matrix(rng.standard_normal((n_rows, 3)))
    hot = rng.integers(0, n_dim_cols, (dim_rows, 2))
    dim = sp.csr_matrix(
        (np.ones(2 * dim_rows), (np.repeat(np.arange(dim_rows), 2), hot.ravel())),
        shape=(dim_rows, n_dim_cols),
    )
    fk = rng.integers(0, dim_rows, n_rows)
    ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    T = sp.csr_matrix(ds.materialize())
    y = T @ rng.standard_normal(T.shape[1]) + 0.1 * rng.standard_normal(n_rows)
    # Defaults against defaults: the same LSQR at the same tol=1e-6. Both stop
    # 1e-6 from the exact solution; products summed in another order (the
    # compiled ones) move the stopping iterate by about 1e-9.
    est = FactorizedLinearRegression().fit(ds, y)
    assert est.n_iter_ > 1
    ref = LinearRegression().fit(T, y)
    np.testing.assert_allclose(est.predict(ds), ref.predict(T), rtol=1e-8, atol=1e-9)
    # And in the stricter mode, on both sides.
    strict = FactorizedLinearRegression(tol=1e-12).fit(ds, y)
    assert strict.n_iter_ > est.n_iter_
    ref = LinearRegression(tol=1e-12).fit(T, y)
    np.testing.assert_allclose(strict.predict(ds), ref.predict(T), rtol=1e-7, atol=1e-8)
    assert strict.score(ds, y) == pytest.approx(ref.score(T, y), abs=1e-8)


def test_linear_dense_data_keep_the_exact_path_above_the_sparse_threshold(
    monkeypatch,
):
    # The LSQR switch is for sparse data only: dense data of any width keep the
    # normal equations (scikit-learn parity, minimum-norm on rank deficiency).
    monkeypatch.setattr(least_squares, "_MAX_DENSE_GRAM_FEATURES", 3)
    rng = np.random.default_rng(29)
    X = rng.standard_normal((200, 6))
    X = np.column_stack([X, X[:, 0] + X[:, 1]])  # rank-deficient
    y = X @ rng.standard_normal(7) + 2.0
    est = FactorizedLinearRegression().fit(X, y)
    assert est.n_iter_ == 1
    ref = LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-8, atol=1e-8)


def test_blocked_padded_gather_and_cached_column_index(monkeypatch):
    # Small row blocks, left joins (-1 entries), row slices: the blocked matmul with
    # the once-padded source products and the per-term cached column index equals
    # the materialized product.
    import ilargi_sklearn.multisource._operators as operators_module
    from ilargi_sklearn._backend import RowMap

    monkeypatch.setattr(operators_module, "_BLOCK_BYTES", 64)
    ds = random_dataset(31, n_rows=3000, scenario="left")
    op = ds.operator
    assert any(t.rows.has_missing for t in op.terms)
    rng = np.random.default_rng(31)
    for W in (rng.standard_normal(ds.shape[1]), rng.standard_normal((ds.shape[1], 3))):
        np.testing.assert_allclose(
            op.matmul(W), ds.materialize() @ W, rtol=1e-12, atol=1e-12
        )
    rows = rng.permutation(3000)[:1500]
    sub = op.take_rows(rows)
    for t, s in zip(op.terms, sub.terms):
        assert type(s.col_index) is type(t.col_index)
        np.testing.assert_array_equal(np.arange(ds.shape[1])[s.col_index], s.cols)
    W = rng.standard_normal((ds.shape[1], 2))
    np.testing.assert_allclose(
        sub.matmul(W), ds.materialize()[rows] @ W, rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(
        sub.materialize("dense"), ds.materialize()[rows], rtol=0, atol=0
    )
    # RowMap: a padded blocked gather equals the unpadded and the full one.
    rm = RowMap(np.array([2, -1, 0, -1, 1, 2, -1]), 3)
    Z = rng.standard_normal((3, 2))
    full = rm.gather(Z)
    np.testing.assert_array_equal(full[[1, 3, 6]], 0.0)
    padded = rm.pad(Z)
    assert padded.shape == (4, 2)
    for sel in (slice(0, 2), slice(2, 7), slice(5, 7)):
        np.testing.assert_array_equal(rm.gather(padded, sel, padded=True), full[sel])
        np.testing.assert_array_equal(rm.gather(Z, sel), full[sel])
    # Nothing to pad without missing entries: the same array back.
    Z2 = Z[:2]
    assert RowMap(np.array([0, 1, 1]), 2).pad(Z2) is Z2


@pytest.mark.parametrize(
    "y",
    [
        np.array([5, -3, 5, 7, -3, 100]),
        np.array([2, 1, 2, 1], dtype=np.uint8),
        np.array([0, 10**12, 0]),  # too wide a range: LabelEncoder
        np.array([1.0, 0.0, 1.0]),
        np.array(["b", "a", "b"]),
    ],
)
def test_encode_labels_equals_label_encoder(y):
    from sklearn.preprocessing import LabelEncoder

    from ilargi_sklearn.linear_model._logistic import _encode_labels

    classes, codes = _encode_labels(y)
    enc = LabelEncoder().fit(y)
    np.testing.assert_array_equal(classes, enc.classes_)
    assert classes.dtype == enc.classes_.dtype
    np.testing.assert_array_equal(codes, enc.transform(y))


@pytest.mark.parametrize(
    "case, refines",
    [
        ("well-conditioned", False),
        # Shifted by a pilot value before any sum is formed: nothing cancels.
        ("large column means", False),
        ("nearly collinear", True),
        ("large target mean", False),
    ],
)
def test_refinement_runs_only_where_it_can_matter(case, refines, monkeypatch):
    # The first solve's error bound decides: refinement steps (one matmul and one
    # rmatmul each) are skipped only where they cannot change the result.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 5))
    if case == "large column means":
        X += 1e5
    if case == "nearly collinear":
        X[:, 4] = X[:, 3] + 1e-6 * rng.standard_normal(2000)
    y = X @ np.arange(1.0, 6.0) + rng.standard_normal(2000)
    if case == "large target mean":
        y += 1e7
    calls = []
    predict = least_squares._predict64
    monkeypatch.setattr(
        least_squares,
        "_predict64",
        lambda op, coef: calls.append(1) or predict(op, coef),
    )
    est = FactorizedLinearRegression().fit(X, y)
    assert bool(calls) == refines
    ref = LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-9)
    np.testing.assert_allclose(est.intercept_, ref.intercept_, rtol=1e-9)


# ----------------------------------------------- the family's base and kernels
#: Module-level functions of linear_model that take an estimator, and why: the
#: ``target`` callbacks of ``validate_fit_inputs`` (scikit-learn's messages name
#: the estimator), the decision function of a fitted model, and the setters of
#: fitted attributes. No solver is among them.
_TAKES_AN_ESTIMATOR = {
    "_regression_target",
    "_single_target",
    "_glm_target",
    "_classification_target",
    "_class_codes_target",
    "_linear_decision",
    "_set_linear_fitted",
    "_set_logistic_fitted",
}


def test_no_solver_takes_an_estimator():
    # Kernels take explicit arguments, as scikit-learn's (_ridge_regression(op,
    # Y, *, alpha, solver, ...)): a function of the family that is handed an
    # estimator (or a model to read parameters from) is one of the listed kinds.
    import ast
    import pathlib

    import ilargi_sklearn.linear_model as lm

    names = {"estimator", "self", "model", "est", "reg", "clf"}
    found = {}
    for path in sorted(pathlib.Path(lm.__file__).parent.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                params = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if params & names:
                    found[node.name] = path.name
    assert set(found) == _TAKES_AN_ESTIMATOR, found


class _Fitted:
    """What _set_linear_fitted sets attributes on."""


@pytest.mark.parametrize(
    "n_outputs, y_ndim, ravel_single, coef_shape, intercept_shape",
    [
        (1, 1, False, (4,), ()),  # LinearRegression, 1-D y
        (1, 2, False, (1, 4), (1,)),  # LinearRegression, a column y
        (1, 2, True, (4,), (1,)),  # Ridge / ElasticNet, a column y
        (3, 2, True, (3, 4), (3,)),  # several targets
        (1, 2, False, (1, 4), (1,)),  # a binary classifier (y_ndim=2 always)
    ],
)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fitted_attributes_follow_scikit_learns_shapes(
    n_outputs, y_ndim, ravel_single, coef_shape, intercept_shape, dtype
):
    from ilargi_sklearn.linear_model._base import _set_linear_fitted
    from ilargi_sklearn.multisource import MatrixOperator

    op = MatrixOperator(np.ones((5, 4), dtype=dtype))
    coef = np.arange(4.0 * n_outputs).reshape(n_outputs, 4) / 3
    intercept = np.arange(1.0, n_outputs + 1) / 7
    est = _Fitted()
    _set_linear_fitted(
        est, op, coef, intercept, y_ndim=y_ndim, ravel_single=ravel_single, n_iter=3
    )
    assert np.shape(est.coef_) == coef_shape and est.coef_.dtype == dtype
    assert np.shape(est.intercept_) == intercept_shape
    assert np.asarray(est.intercept_).dtype == dtype and est.n_iter_ == 3
    np.testing.assert_array_equal(np.ravel(est.coef_), coef.ravel().astype(dtype))
    np.testing.assert_array_equal(np.ravel(est.intercept_), intercept.astype(dtype))
    # Without an intercept, scikit-learn's regressors' 0.0; cuML's flat coef_.
    _set_linear_fitted(
        est, op, coef.ravel(), None, y_ndim=y_ndim, ravel_single=ravel_single
    )
    assert est.intercept_ == 0.0 and np.shape(est.coef_) == coef_shape


def test_fitted_attributes_stay_on_the_device():
    from _helpers import strict_namespace

    from ilargi_sklearn._backend._namespace import get_namespace
    from ilargi_sklearn.linear_model._base import _set_linear_fitted

    xps, device = strict_namespace()
    ds = _star().to_device(device, namespace=xps)
    est = _Fitted()
    coef, intercept = np.ones((1, ds.shape[1])), np.ones(1)
    _set_linear_fitted(est, ds.operator, coef, intercept, y_ndim=1, ravel_single=True)
    assert get_namespace(est.coef_) is get_namespace(est.intercept_)
    assert est.coef_.device == device and est.intercept_.device == device
    assert est.coef_.shape == (ds.shape[1],) and est.intercept_.shape == ()


@pytest.mark.parametrize("solver", ["normal", "gd"])
def test_linear_regression_kernel_takes_explicit_arguments(solver):
    from ilargi_sklearn.linear_model._linear import _linear_regression

    X, y = _regression_data(5, n_targets=2)
    sw = np.random.default_rng(0).random(X.shape[0]) + 0.5
    from ilargi_sklearn.multisource import MatrixOperator

    kw = dict(tol=1e-10, max_iter=5000, learning_rate=None)
    coef, intercept, n_iter = _linear_regression(
        MatrixOperator(X),
        y,
        sample_weight=sw,
        sw_sum=float(sw.sum()),
        solver=solver,
        fit_intercept=True,
        **kw,
    )
    ref = LinearRegression().fit(X, y, sample_weight=sw)
    kind = "solver" if solver == "normal" else "iterative"
    assert_close(coef, ref.coef_, dtype=np.float64, kind=kind)
    assert_close(intercept, ref.intercept_, dtype=np.float64, kind=kind)
    assert n_iter == 1 if solver == "normal" else n_iter > 1


def test_logistic_gradient_descent_kernel_takes_explicit_arguments():
    from ilargi_sklearn.linear_model._logistic import (
        _logistic_regression_gd,
        _loss_target,
    )

    X, y = _classification_data(7, n_classes=3)
    from ilargi_sklearn.multisource import MatrixOperator

    C, n = 2.0, X.shape[0]
    loss, n_outputs, target = _loss_target(y, 3, np)
    w, n_iter = _logistic_regression_gd(
        MatrixOperator(X),
        target,
        sample_weight=None,
        sw_sum=float(n),
        loss=loss,
        w0=np.zeros(n_outputs * (X.shape[1] + 1)),
        l2_reg_strength=1.0 / (C * n),
        fit_intercept=True,
        learning_rate=None,
        max_iter=20_000,
        tol=1e-7,
    )
    ref = LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(X, y)
    W = w.reshape(n_outputs, -1)
    # Softmax coefficients are defined up to a common shift: compare centered.
    # A gradient within 1e-7 leaves them about 1e-7 / (smallest curvature) off
    # the optimum: within 5e-6 here, of coefficients up to 2.
    coef = W[:, :-1] - W[:, :-1].mean(axis=0)
    ref_coef = ref.coef_ - ref.coef_.mean(axis=0)
    np.testing.assert_allclose(coef, ref_coef, rtol=0, atol=2e-5)
    assert 1 < n_iter < 20_000


@pytest.mark.parametrize("cached", [True, False])
def test_no_intercept_with_a_target_of_large_mean_matches_sklearn(cached):
    # The target is shifted by its pilot mean for the statistics; without an
    # intercept its shift needs the column sums (T^T S Y = T^T S Y~ + T^T s c_y),
    # which a fit without a cached entry formed only with an intercept.
    from sklearn.linear_model import Ridge

    from ilargi_sklearn.linear_model import FactorizedRidge
    from ilargi_sklearn.multisource import set_statistics_cache

    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 3)) + 0.5
    y = X @ [1.0, 2.0, 3.0] + 1000.0 + rng.standard_normal(200)
    ds = MultiSourceDataset.from_matrices([X], [None])
    tol = tolerance(np.float64, "solver")
    if not cached:
        set_statistics_cache(0)
    try:
        for data in (X, ds):
            for ours, ref in (
                (FactorizedLinearRegression, LinearRegression),
                (FactorizedRidge, Ridge),
            ):
                est = ours(fit_intercept=False).fit(data, y)
                sk = ref(fit_intercept=False).fit(X, y)
                np.testing.assert_allclose(est.coef_, sk.coef_, rtol=tol)
    finally:
        set_statistics_cache()
