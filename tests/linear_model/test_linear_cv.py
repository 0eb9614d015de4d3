"""Cross-validated ridge, lasso and elastic net: the choice and the model of
scikit-learn's RidgeCV, LassoCV and ElasticNetCV on the joined matrix over the
integration scenarios, warm-started paths against cold fits, the operator work
per fit, composition (Pipeline, cross_val_score) and bad input."""

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, regression_data, tolerance
from sklearn.base import clone
from sklearn.linear_model import ElasticNetCV, LassoCV, RidgeCV
from sklearn.model_selection import KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.validation import check_random_state

from ilargi_sklearn.linear_model import (
    FactorizedElasticNet,
    FactorizedElasticNetCV,
    FactorizedLassoCV,
    FactorizedRidgeCV,
    _coordinate_descent_cv,
    _ridge_cv,
)
from ilargi_sklearn.multisource import FactorizedMatrix, set_statistics_cache
from ilargi_sklearn.multisource._statistics import centered_gram
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import SCENARIOS

ALPHAS = np.logspace(-3, 3, 13)
# Paths converged far below the differences between neighbouring alphas, so the
# mean squared errors, and the choice, are those of the optimum of each alpha.
TIGHT = dict(tol=1e-10, max_iter=100_000)


def _weights(n, seed=1):
    return np.random.default_rng(seed).uniform(0.2, 3.0, n)


def _noisy(scenario="left", seed=0, noise=1.0):
    """A dataset and a target noisy enough that the search has an interior
    optimum (not the smallest alpha)."""
    ds, y = regression_data(seed, scenario)
    rng = np.random.default_rng(seed + 100)
    return ds, y + noise * np.std(y) * rng.standard_normal(y.shape[0])


def _assert_same_ridge(est, ref, dtype):
    assert np.all(np.asarray(est.alpha_) == np.asarray(ref.alpha_))
    assert_close(est.coef_, ref.coef_, dtype=dtype, kind="solver", scale=1.0)
    assert_close(est.intercept_, ref.intercept_, dtype=dtype, kind="solver", scale=1.0)
    assert_close(est.best_score_, ref.best_score_, dtype=dtype, kind="solver")


# ------------------------------------------------------------ RidgeCV (LOO)
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("weighted", [False, True])
def test_ridge_loo_matches_sklearn(scenario, weighted):
    ds, y = _noisy(scenario)
    T = ds.materialize()
    sw = _weights(len(ds)) if weighted else None
    est = FactorizedRidgeCV(alphas=ALPHAS, store_cv_results=True).fit(ds, y, sw)
    ref = RidgeCV(alphas=ALPHAS, store_cv_results=True).fit(T, y, sample_weight=sw)
    _assert_same_ridge(est, ref, ds.dtype)
    # The (weighted) squared leave-one-out errors of every row and alpha.
    scale = float(np.max(ref.cv_results_))
    assert_close(
        est.cv_results_, ref.cv_results_, dtype=ds.dtype, kind="solver", scale=scale
    )


@pytest.mark.parametrize(
    "params",
    [
        dict(fit_intercept=False),
        dict(scoring="r2"),
        dict(scoring="neg_mean_absolute_error", store_cv_results=True),
        dict(alphas=[1.0]),
        dict(alphas=5.0),
    ],
    ids=["no-intercept", "r2", "mae-stored", "one-alpha", "scalar-alpha"],
)
@pytest.mark.parametrize("weighted", [False, True])
def test_ridge_loo_options_match_sklearn(params, weighted):
    params = {"alphas": ALPHAS, **params}
    ds, y = _noisy("star")
    sw = _weights(len(ds)) if weighted else None
    est = FactorizedRidgeCV(**params).fit(ds, y, sw)
    ref = RidgeCV(**params).fit(ds.materialize(), y, sample_weight=sw)
    _assert_same_ridge(est, ref, ds.dtype)
    if params.get("store_cv_results"):
        # The leave-one-out predictions when a scorer is given.
        assert_close(
            est.cv_results_,
            ref.cv_results_,
            kind="solver",
            scale=float(np.abs(y).max()),
        )


@pytest.mark.parametrize("alpha_per_target", [False, True])
@pytest.mark.parametrize("scoring", [None, "neg_mean_squared_error"])
def test_ridge_loo_multi_target(alpha_per_target, scoring):
    ds, y = _noisy("snowflake")
    rng = np.random.default_rng(3)
    # Targets that want different penalties: one clean, one very noisy.
    Y = np.c_[
        y,
        ds.materialize("dense")[:, 0] + 0.01 * rng.standard_normal(len(y)),
        rng.standard_normal(len(y)),
    ]
    params = dict(
        alphas=ALPHAS,
        alpha_per_target=alpha_per_target,
        scoring=scoring,
        store_cv_results=True,
    )
    est = FactorizedRidgeCV(**params).fit(ds, Y)
    ref = RidgeCV(**params).fit(ds.materialize(), Y)
    _assert_same_ridge(est, ref, ds.dtype)
    assert est.coef_.shape == ref.coef_.shape == (3, ds.shape[1])
    assert est.cv_results_.shape == ref.cv_results_.shape == (len(y), 3, ALPHAS.size)
    if alpha_per_target:
        assert np.unique(est.alpha_).size > 1  # the targets did choose apart


def test_ridge_loo_ties_keep_the_first_alpha():
    ds, y = _noisy("left")
    # Equal candidates score equally: scikit-learn keeps the first.
    est = FactorizedRidgeCV(alphas=[3.0, 1.0, 3.0, 1.0]).fit(ds, y)
    ref = RidgeCV(alphas=[3.0, 1.0, 3.0, 1.0]).fit(ds.materialize(), y)
    assert est.alpha_ == ref.alpha_


def test_ridge_loo_hat_diagonal_from_rowwise_quadratic():
    """The leverages come from the factorized quadratic forms: the errors equal
    the explicit leave-one-out refits on the joined matrix."""
    ds, y = _noisy("many_to_many", noise=0.3)
    T = ds.materialize("dense")
    sw = _weights(len(ds))
    op = ds.operator
    Y = y[:, None]
    stats = centered_gram(op, sw, True, Y)
    alphas = np.array([0.1, 10.0])
    looe, _, _ = _ridge_cv._ridge_loo(op, Y, sw, True, stats, alphas)
    from sklearn.linear_model import Ridge

    for i in (0, 7, len(y) - 1):
        keep = np.arange(len(y)) != i
        for k, a in enumerate(alphas):
            ridge = Ridge(alpha=a).fit(T[keep], y[keep], sample_weight=sw[keep])
            err = y[i] - ridge.predict(T[i : i + 1])[0]
            assert_close(
                looe[i, k, 0],
                np.sqrt(sw[i]) * err,
                kind="solver",
                scale=float(np.std(y)),
            )


# ---------------------------------------------------------- RidgeCV (folds)
@pytest.mark.parametrize("scenario", ["star", "snowflake", "sparse", "float32"])
@pytest.mark.parametrize("weighted", [False, True])
def test_ridge_folds_match_sklearn(scenario, weighted):
    ds, y = _noisy(scenario)
    sw = _weights(len(ds)) if weighted else None
    cv = KFold(4, shuffle=True, random_state=0)
    est = FactorizedRidgeCV(alphas=ALPHAS, cv=cv).fit(ds, y, sw)
    # On the dense join: on a sparse one scikit-learn's folds run sparse_cg at
    # tol=1e-4, which moves its scores by about 1e-4.
    T = ds.materialize("dense")
    ref = RidgeCV(alphas=ALPHAS, cv=cv).fit(T, y, sample_weight=sw)
    _assert_same_ridge(est, ref, ds.dtype)


def test_ridge_folds_scoring_and_multi_target():
    ds, y = _noisy("outer")
    Y = np.c_[y, -2 * y + np.random.default_rng(0).standard_normal(len(y))]
    params = dict(alphas=ALPHAS, cv=3, scoring="neg_mean_absolute_error")
    est = FactorizedRidgeCV(**params).fit(ds, Y)
    ref = RidgeCV(**params).fit(ds.materialize(), Y)
    _assert_same_ridge(est, ref, ds.dtype)


# ------------------------------------------------------ LassoCV / ElasticNetCV
def _assert_same_path(est, ref, dtype):
    # The same grid point (a float32 grid is scikit-learn's in float32).
    assert est.alpha_ == pytest.approx(ref.alpha_, rel=tolerance(dtype, "operator"))
    assert getattr(est, "l1_ratio_", None) == getattr(ref, "l1_ratio_", None)
    assert est.mse_path_.shape == ref.mse_path_.shape
    assert est.alphas_.shape == ref.alphas_.shape
    assert_close(est.alphas_, ref.alphas_, dtype=dtype, kind="solver")
    assert_close(est.mse_path_, ref.mse_path_, dtype=dtype, kind="iterative")
    assert_close(est.coef_, ref.coef_, dtype=dtype, kind="iterative", scale=1.0)
    assert_close(
        est.intercept_, ref.intercept_, dtype=dtype, kind="iterative", scale=1.0
    )


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lasso_cv_matches_sklearn(scenario):
    ds, y = _noisy(scenario)
    T = ds.materialize()
    tight = TIGHT if ds.dtype == np.float64 else dict(tol=1e-6, max_iter=100_000)
    est = FactorizedLassoCV(cv=3, alphas=30, **tight).fit(ds, y)
    ref = LassoCV(cv=3, alphas=30, **tight).fit(T, y)
    _assert_same_path(est, ref, ds.dtype)
    assert not hasattr(est, "l1_ratio_")  # as scikit-learn's LassoCV


@pytest.mark.parametrize(
    "params",
    [
        dict(l1_ratio=[0.1, 0.5, 0.9, 1.0]),
        dict(l1_ratio=0.3, alphas=[0.5, 0.001, 0.05, 0.01]),
        dict(l1_ratio=0.7, positive=True),
        dict(l1_ratio=0.7, fit_intercept=False),
        dict(l1_ratio=[0.4, 1.0], selection="random", random_state=0),
        dict(l1_ratio=0.5, cv=KFold(4, shuffle=True, random_state=1), eps=1e-2),
    ],
    ids=["ratios", "given-alphas", "positive", "no-intercept", "random", "kfold"],
)
@pytest.mark.parametrize("weighted", [False, True])
def test_enet_cv_matches_sklearn(params, weighted):
    params = {"cv": 3, "alphas": 20, **TIGHT, **params}
    ds, y = _noisy("star")
    sw = _weights(len(ds)) if weighted else None
    est = FactorizedElasticNetCV(**params).fit(ds, y, sw)
    ref = ElasticNetCV(**params).fit(ds.materialize(), y, sample_weight=sw)
    _assert_same_path(est, ref, ds.dtype)
    assert est.n_iter_ > 0 and est.dual_gap_ <= 1e-8


def test_enet_cv_default_tol_same_choice():
    """At the default tol scikit-learn's paths (gram coordinate descent, as
    precompute="auto" takes for n_samples > n_features) are the same sweeps."""
    ds, y = _noisy("left")
    est = FactorizedElasticNetCV(l1_ratio=[0.5, 1.0]).fit(ds, y)
    ref = ElasticNetCV(l1_ratio=[0.5, 1.0]).fit(ds.materialize(), y)
    assert est.alpha_ == ref.alpha_ and est.l1_ratio_ == ref.l1_ratio_
    assert_close(est.mse_path_, ref.mse_path_, kind="iterative")


def _enet_objective(T, y, w, b, alpha, l1_ratio):
    """scikit-learn's elastic-net objective on the joined matrix."""
    r = y - T @ w - b
    return (
        0.5 * np.mean(r**2)
        + alpha * l1_ratio * np.abs(w).sum()
        + 0.5 * alpha * (1 - l1_ratio) * (w @ w)
    )


def test_warm_path_equals_cold_fits():
    """Each alpha of a warm-started path is the cold fit of that alpha within the
    estimator's tol: both objectives lie within the gap tolerance of the
    optimum, and at a tight tol the coefficients agree."""
    ds, y = _noisy("snowflake")
    T = ds.materialize("dense")
    op, Y = ds.operator, y[:, None]
    stats = centered_gram(op, None, True, Y)
    grid = _coordinate_descent_cv._alpha_grid(stats, 0.5, 1e-3, 15, False)
    for tol in (1e-4, 1e-10):
        coefs, failed = _coordinate_descent_cv._enet_path(
            stats,
            grid,
            0.5,
            max_iter=100_000,
            tol=tol,
            rng=check_random_state(0),
            selection="cyclic",
            positive=False,
            dtype=op.dtype,
        )
        assert failed == 0
        gap_tol = tol * float(stats.y_var[0]) / stats.sw_sum
        for k, alpha in enumerate(grid):
            cold = FactorizedElasticNet(
                alpha=alpha, l1_ratio=0.5, tol=tol, max_iter=100_000
            ).fit(ds, y)
            warm = coefs[k, :, 0]
            b = stats.y_mean[0] - stats.mu @ warm

            f_warm = _enet_objective(T, y, warm, b, alpha, 0.5)
            f_cold = _enet_objective(T, y, cold.coef_, cold.intercept_, alpha, 0.5)
            assert abs(f_warm - f_cold) <= gap_tol * (1 + 1e-9)
            if tol == 1e-10:
                assert_close(warm, cold.coef_, kind="iterative", scale=1.0)


# ----------------------------------------------------- work per fit
class _Counter:
    """Counts the operator calls of FactorizedMatrix (and its fold subsets)."""

    def __init__(self, monkeypatch):
        self.calls = {"gram": 0, "matmul": 0, "rmatmul": 0}
        for name in self.calls:
            original = getattr(FactorizedMatrix, name)

            def counted(op, *args, _name=name, _original=original, **kwargs):
                self.calls[_name] += 1
                return _original(op, *args, **kwargs)

            monkeypatch.setattr(FactorizedMatrix, name, counted)


@pytest.fixture
def no_stats_cache():
    """The statistics cache off: the counting tests count the estimators' own
    requests, some of which the shared cache would serve."""
    set_statistics_cache(0)
    yield
    set_statistics_cache()


@pytest.mark.parametrize("n_alphas", [5, 40])
def test_path_work_does_not_grow_with_alphas(monkeypatch, no_stats_cache, n_alphas):
    """One gram of all rows (the grid, the refit, and every training fold as it
    minus the fold's test rows) and per fold one of the test rows (the test
    errors of every alpha are quadratic forms of its statistics): nothing per
    alpha, no product of the rows. (The estimator's own requests: the shared
    statistics cache, which would serve some of them, is off.)"""
    ds, y = _noisy("star")
    counter = _Counter(monkeypatch)
    FactorizedElasticNetCV(l1_ratio=[0.5, 1.0], alphas=n_alphas, cv=4).fit(ds, y)
    assert counter.calls == {"gram": 5, "matmul": 0, "rmatmul": 5}
    # Where the statistics could not resolve the errors: one test product per
    # fold for every alpha and l1_ratio.
    monkeypatch.setattr(_coordinate_descent_cv, "_MSE_FROM_STATS_ERROR", 0.0)
    counter.calls.update(gram=0, matmul=0, rmatmul=0)
    FactorizedElasticNetCV(l1_ratio=[0.5, 1.0], alphas=n_alphas, cv=4).fit(ds, y)
    assert counter.calls == {"gram": 5, "matmul": 4, "rmatmul": 5}


@pytest.mark.parametrize("scenario", ["star", "sparse", "union"])
def test_test_errors_from_statistics_equal_residuals(scenario):
    """The test errors from the test rows' statistics equal those of the
    residuals (and a target fitted exactly falls back to the residuals)."""
    ds, y = _noisy(scenario)
    op, Y = ds.operator, y[:, None]
    train, test = np.arange(0, len(y), 2), np.arange(1, len(y), 2)
    stats = centered_gram(op.take_rows(train), None, True, Y[train])
    grid = _coordinate_descent_cv._alpha_grid(stats, 1.0, 1e-3, 12, False)
    coefs, _ = _coordinate_descent_cv._enet_path(
        stats,
        grid,
        1.0,
        max_iter=1000,
        tol=1e-6,
        rng=check_random_state(0),
        selection="cyclic",
        positive=False,
        dtype=op.dtype,
    )
    intercepts = stats.y_mean[None, :] - np.einsum("i,kit->kt", stats.mu, coefs)
    sw = _weights(len(y))[test]
    for w in (None, sw):
        args = (op.take_rows(test), Y[test], w, coefs, intercepts)
        assert_close(
            _coordinate_descent_cv._path_mse(*args),
            _coordinate_descent_cv._path_mse_by_product(*args),
            kind="solver",
        )
    # An exact fit: the statistics' rounding is above the error, residuals used.
    exact = ds.materialize("dense") @ np.arange(ds.shape[1], dtype=float)
    args = (
        op.take_rows(test),
        exact[test, None],
        None,
        np.arange(ds.shape[1], dtype=float)[None, :, None],
        np.zeros((1, 1)),
    )
    mse = _coordinate_descent_cv._path_mse(*args)
    assert mse[0] == _coordinate_descent_cv._path_mse_by_product(*args)[0]
    assert mse[0] < 1e-20


@pytest.mark.parametrize("n_alphas", [3, 30])
def test_ridge_work_does_not_grow_with_alphas(
    monkeypatch, caplog, no_stats_cache, n_alphas
):
    ds, y = _noisy("star")
    alphas = np.logspace(-2, 2, n_alphas)
    counter = _Counter(monkeypatch)
    FactorizedRidgeCV(alphas=alphas).fit(ds, y)
    # Leave-one-out: one gram, one product for all residuals; the quadratic
    # forms go per pair of sources, not through these calls.
    assert counter.calls == {"gram": 1, "matmul": 1, "rmatmul": 1}
    counter.calls.update(gram=0, matmul=0, rmatmul=0)
    with caplog.at_level("DEBUG", logger="ilargi_sklearn.multisource._statistics"):
        FactorizedRidgeCV(alphas=alphas, cv=3).fit(ds, y)
    # All rows and the three test folds (their training folds are the
    # difference, except where the guard computed one directly: on these 90 rows
    # a test fold carries most of a column's mass); the refit solves from the
    # statistics of all rows, cache or not (its refinement may add products).
    direct = sum("no downdating" in r.getMessage() for r in caplog.records)
    assert counter.calls["gram"] == 4 + direct
    assert 3 <= counter.calls["matmul"] <= 3 + 5


# --------------------------------------------------------- composition
@pytest.mark.parametrize(
    "est",
    [
        FactorizedRidgeCV(alphas=ALPHAS),
        FactorizedRidgeCV(alphas=ALPHAS, cv=3),
        FactorizedLassoCV(cv=3, **TIGHT),
        FactorizedElasticNetCV(l1_ratio=[0.5, 1.0], cv=3, **TIGHT),
    ],
    ids=["ridge-loo", "ridge-folds", "lasso", "enet"],
)
def test_pipeline_after_scaler_matches_sklearn(est):
    """After FactorizedStandardScaler (an affine operator over the sources: the
    quadratic forms and the fold statistics go through it) the search is
    scikit-learn's on the standardized join."""
    from sklearn.preprocessing import StandardScaler

    ds, y = _noisy("star")
    pipe = make_pipeline(FactorizedStandardScaler(), clone(est)).fit(ds, y)
    ref_cls = {
        "FactorizedRidgeCV": RidgeCV,
        "FactorizedLassoCV": LassoCV,
        "FactorizedElasticNetCV": ElasticNetCV,
    }[type(est).__name__]
    params = {
        k: v for k, v in est.get_params().items() if k not in ("strategy", "device")
    }
    ref = make_pipeline(StandardScaler(), ref_cls(**params)).fit(ds.materialize(), y)
    assert pipe[-1].alpha_ == pytest.approx(ref[-1].alpha_, rel=1e-12)
    assert_close(
        pipe.predict(ds),
        ref.predict(ds.materialize()),
        kind="iterative",
        scale=float(np.std(y)),
    )


def test_cross_val_score_on_dataset_equals_joined():
    ds, y = _noisy("inner")
    for est in (FactorizedRidgeCV(alphas=ALPHAS), FactorizedLassoCV(cv=3, **TIGHT)):
        on_ds = cross_val_score(est, ds, y, cv=3)
        on_T = cross_val_score(est, ds.materialize(), y, cv=3)
        assert_close(on_ds, on_T, kind="iterative")


def test_sparse_input_lasso_cv_matches_sklearn():
    """On a sparse matrix scikit-learn's LassoCV runs its sparse solver (no
    gram); at a tight tol both reach the same path."""
    ds, y = _noisy("sparse")
    T = sp.csr_matrix(ds.materialize())
    est = FactorizedLassoCV(cv=3, alphas=15, **TIGHT).fit(T, y)
    ref = LassoCV(cv=3, alphas=15, **TIGHT).fit(T, y)
    _assert_same_path(est, ref, np.float64)


# ------------------------------------------------------------ bad input
def test_bad_input_raises_like_sklearn():
    ds, y = _noisy("left")
    with pytest.raises(ValueError, match=r"alphas\[1\] == 0.0, must be > 0.0"):
        FactorizedRidgeCV(alphas=[1.0, 0.0]).fit(ds, y)
    with pytest.raises(ValueError, match=r"alphas\[0\] == -1.0, must be >= 0.0"):
        FactorizedRidgeCV(alphas=[-1.0, 1.0], cv=3).fit(ds, y)
    with pytest.raises(ValueError, match="store_cv_results=True are incompatible"):
        FactorizedRidgeCV(cv=3, store_cv_results=True).fit(ds, y)
    with pytest.raises(ValueError, match="alpha_per_target=True are incompatible"):
        FactorizedRidgeCV(cv=3, alpha_per_target=True).fit(ds, y)
    with pytest.raises(ValueError, match="For multi-task outputs, use MultiTask"):
        FactorizedLassoCV().fit(ds, np.c_[y, y])
    with pytest.raises(ValueError, match="not supported for l1_ratio=0"):
        FactorizedElasticNetCV(l1_ratio=[0.0, 0.5]).fit(ds, y)
    with pytest.raises(ValueError, match="l1_ratio must be in"):
        FactorizedElasticNetCV(l1_ratio=[0.5, 1.5]).fit(ds, y)
    with pytest.raises(ValueError, match=r"alphas\[0\] == -0.1"):
        FactorizedLassoCV(alphas=[-0.1, 1.0]).fit(ds, y)
    with pytest.raises(ValueError, match="Cannot have number of splits"):
        FactorizedLassoCV(cv=5).fit(ds[:3], y[:3])


# ------------------------------------------------------------- devices
@pytest.mark.parametrize(
    "est",
    [
        FactorizedRidgeCV(alphas=[1.0]),  # quadratic forms through the operator
        FactorizedRidgeCV(alphas=ALPHAS, store_cv_results=True),  # eigenbasis rows
        FactorizedRidgeCV(alphas=ALPHAS, cv=3),
        FactorizedElasticNetCV(l1_ratio=[0.5, 1.0], alphas=10, cv=3, **TIGHT),
    ],
    ids=["ridge-loo-quadratic", "ridge-loo-rotated", "ridge-folds", "enet"],
)
def test_fit_on_another_namespace_equals_host(est, namespace):
    """A dataset on another namespace and device gives the host's search, with
    weights; the predictions stay on that device."""
    from ilargi_sklearn._backend._namespace import get_namespace

    xp, device = namespace
    ds, y = _noisy("star")
    sw = _weights(len(ds))
    ref = clone(est).fit(ds, y, sw)
    Xd = ds.to_device(device, namespace=None if isinstance(device, str) else xp)
    got = clone(est).fit(Xd, y, sw)
    assert np.all(np.asarray(got.alpha_) == np.asarray(ref.alpha_))
    for name in ("coef_", "best_score_", "mse_path_", "cv_results_"):
        if hasattr(ref, name):
            assert_close(
                getattr(got, name),
                getattr(ref, name),
                kind="device_fit",
                dtype=np.float64,
                scale=1.0,
                err_msg=name,
            )
    pred = got.predict(Xd)
    assert get_namespace(pred) is get_namespace(xp.asarray(0))
    assert_close(
        pred,
        ref.predict(ds),
        dtype=np.float64,
        kind="device_fit",
        scale=float(np.std(y)),
    )


def test_ridge_loo_wide_and_zero_weights_match_sklearn():
    """Fewer rows than features (scikit-learn's n x n kernel mode: the same
    leave-one-out errors from the d x d eigendecomposition here), and rows of
    zero weight."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20, 30))
    y = X[:, 0] + rng.standard_normal(20)
    for params in (dict(), dict(scoring="r2"), dict(store_cv_results=True)):
        est = FactorizedRidgeCV(alphas=ALPHAS, **params).fit(X, y)
        ref = RidgeCV(alphas=ALPHAS, **params).fit(X, y)
        _assert_same_ridge(est, ref, np.float64)
    X = rng.standard_normal((50, 5))
    y = X @ rng.standard_normal(5) + rng.standard_normal(50)
    sw = _weights(50)
    sw[:5] = 0.0
    est = FactorizedRidgeCV(alphas=ALPHAS, store_cv_results=True).fit(X, y, sw)
    ref = RidgeCV(alphas=ALPHAS, store_cv_results=True).fit(X, y, sample_weight=sw)
    _assert_same_ridge(est, ref, np.float64)
    assert_close(est.cv_results_, ref.cv_results_, kind="solver", scale=1.0)
    est = FactorizedLassoCV(**TIGHT).fit(X, y, sw)
    ref = LassoCV(**TIGHT).fit(X, y, sample_weight=sw)
    _assert_same_path(est, ref, np.float64)


# ------------------------------------------------------------ the refit's solver
def test_ridge_folds_refit_with_the_solver_that_scored_the_candidates(monkeypatch):
    # The folds' candidates are exact solves of the penalized gram; the refit is
    # one too (FactorizedRidge's "cholesky"), also where FactorizedRidge's
    # "auto" would iterate (wide sparse data: LSQR stopped at its tol).
    import ilargi_sklearn.linear_model._least_squares as least_squares
    from ilargi_sklearn.linear_model import FactorizedRidge

    monkeypatch.setattr(least_squares, "_MAX_DENSE_GRAM_FEATURES", 4)
    rng = np.random.default_rng(3)
    X = sp.random(300, 12, density=0.3, random_state=rng, format="csr")
    y = X @ rng.standard_normal(12) + 0.5 * rng.standard_normal(300)
    est = FactorizedRidgeCV(alphas=[0.01, 0.1, 1.0], cv=3).fit(X, y)
    assert FactorizedRidge(alpha=est.alpha_).fit(X, y).solver_ == "lsqr"
    exact = FactorizedRidge(alpha=est.alpha_, solver="cholesky").fit(X, y)
    np.testing.assert_allclose(est.coef_, exact.coef_, rtol=1e-12, atol=1e-14)
    ref = RidgeCV(alphas=[0.01, 0.1, 1.0], cv=3).fit(X.toarray(), y)
    assert est.alpha_ == ref.alpha_
    assert_close(est.coef_, ref.coef_, kind="solver", scale=1.0)


# -------------------------------------------------------- pickles of old paths
@pytest.mark.parametrize(
    "est, new",
    [
        (FactorizedRidgeCV(alphas=ALPHAS), "_ridge_cv"),
        (FactorizedLassoCV(cv=3), "_coordinate_descent_cv"),
        (FactorizedElasticNetCV(cv=3), "_coordinate_descent_cv"),
    ],
    ids=["ridge", "lasso", "enet"],
)
def test_models_pickled_before_the_cv_split_load(est, new):
    # A pickle of a model fitted before the CV estimators moved names their old
    # module, linear_model._cv: it loads (with a FutureWarning), as the model.
    import pickle
    import subprocess
    import sys

    ds, y = _noisy("star")
    est.fit(ds, y)
    old = pickle.dumps(est, protocol=0).replace(
        f"ilargi_sklearn.linear_model.{new}\n".encode(),
        b"ilargi_sklearn.linear_model._cv\n",
    )
    assert b"ilargi_sklearn.linear_model._cv\n" in old
    with pytest.warns(FutureWarning, match="moved to ilargi_sklearn.linear_model"):
        back = pickle.loads(old)
    assert type(back) is type(est)
    np.testing.assert_array_equal(back.predict(ds), est.predict(ds))
    # In a fresh process, unpickling alone (no import of ilargi_sklearn first).
    code = (
        "import pickle, sys, warnings; warnings.simplefilter('ignore');"
        "obj = pickle.loads(sys.stdin.buffer.read()); print(type(obj).__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=old, capture_output=True, check=True
    )
    assert out.stdout.decode().strip() == f"ilargi_sklearn.linear_model.{new}"
