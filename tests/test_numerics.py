"""Numerics as robust as scikit-learn's (DESIGN.md 17): columns and targets whose
mean is large against their spread, in the base table and in joined sources, under
inner and left joins, next to sparse one-hot sources.

Raw sums centered by subtraction keep ``eps (mean / spread)^2`` of their accuracy:
at 1e8 a column is lost. The statistics are formed of the design shifted by a pilot
value per column instead (``multisource._statistics``); every gram-based estimator must then
agree with scikit-learn on the joined table as closely as on well-scaled data.

scikit-learn itself centers with a mean that carries ``eps * mean`` of error, which
at a mean/spread of 1e12 moves its results by up to 1e-6 (its ``covariance_eigh``
PCA, the default for tall data, cancels like the raw sums). The reference is
therefore scikit-learn fitted on the joined table minus its column means taken in
extended precision (a constant shift per column, on which scikit-learn is exact),
with the intercepts and means shifted back; where scikit-learn is exact on the raw
table (mean/spread up to 1e8), it is compared on the raw table too.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.linalg
import scipy.sparse as sp
from _helpers import assert_close, dense, strict_namespace
from sklearn.decomposition import PCA
from sklearn.linear_model import (
    ElasticNet,
    ElasticNetCV,
    Lasso,
    LassoCV,
    LinearRegression,
    Ridge,
    RidgeClassifier,
    RidgeCV,
)
from sklearn.model_selection import GridSearchCV, KFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import ilargi_sklearn.multisource._operators as operators_module
import ilargi_sklearn.multisource._statistics as stats_module
from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.decomposition import FactorizedPCA, FactorizedTruncatedSVD
from ilargi_sklearn.linear_model import (
    FactorizedElasticNet,
    FactorizedElasticNetCV,
    FactorizedLasso,
    FactorizedLassoCV,
    FactorizedLinearRegression,
    FactorizedLogisticRegression,
    FactorizedRidge,
    FactorizedRidgeClassifier,
    FactorizedRidgeCV,
)
from ilargi_sklearn.multisource import Join, set_statistics_cache
from ilargi_sklearn.multisource._operators import (
    FactorizedMatrix,
    Term,
    shift_columns,
)
from ilargi_sklearn.multisource._statistics import (
    NO_SHIFT,
    FoldStatistics,
    centered_gram,
    choose_shift,
)
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset
from ilargi_sklearn.utils._validation import validate_X

# scikit-learn's ridge reference fits warn (SciPy's "An ill-conditioned matrix
# detected") where a left-joined column of large mean dwarfs the others; this
# package's equilibrated factorization does not need to (and its own warning,
# "Ill-conditioned matrix (rcond=...)", is tested below).
pytestmark = pytest.mark.filterwarnings(
    "ignore:An ill-conditioned matrix detected:scipy.linalg.LinAlgWarning"
)

RATIOS = [1e4, 1e8, 1e12]
N_ROWS = 2048
#: The one unmatched row of the "nearly all matched" layout: not among the rows
#: the pilots are chosen from, so the column is shifted and its unmatched cell
#: is the shifted design's one-row source.
_UNMATCHED_ROW = 5

# (where the large column is, join of the dimension table, one-hot source)
LAYOUTS = {
    "base": ("base", "inner", False),
    "base+left+onehot": ("base", "left", True),
    "dim+inner+onehot": ("dim", "inner", True),
    # 20% unmatched rows: the column's spread is the join's (0 against its
    # values), which raw sums keep; the rows it matches are what is tested.
    "dim+left": ("dim", "left", False),
    # One unmatched row: the column is shifted, the unmatched cell is -pilot.
    "dim+nearly-all-matched": ("dim", "almost", False),
}


@pytest.fixture(autouse=True)
def fresh_cache():
    set_statistics_cache()
    yield
    set_statistics_cache()


# ------------------------------------------------------------------------ data
def exact_mean(T, sample_weight=None):
    """Column means of ``T`` in extended precision, rounded to float64."""
    TL = np.asarray(T, dtype=np.longdouble)
    if sample_weight is None:
        return np.asarray(TL.mean(axis=0), dtype=np.float64)
    w = np.asarray(sample_weight, dtype=np.longdouble)
    return np.asarray((w @ TL) / w.sum(), dtype=np.float64)


def exact_centered_gram(T, sample_weight=None):
    """``(T - 1 mu^T)^T diag(s) (T - 1 mu^T)`` in extended precision."""
    TL = np.asarray(T, dtype=np.longdouble)
    w = np.ones(T.shape[0]) if sample_weight is None else sample_weight
    w = np.asarray(w, dtype=np.longdouble)
    Tc = TL - (w @ TL) / w.sum()
    return np.asarray(Tc.T @ (Tc * w[:, None]), dtype=np.float64)


def badly_scaled(ratio, layout, seed=0, target_mean=3.0):
    """``(ds, T, y)``: a dataset whose base or dimension table has a column of mean
    ``ratio`` and spread 1, its joined table, and a target linear in the
    standardized columns (every coefficient matters)."""
    where, join, onehot = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    n, r = N_ROWS, 40
    base = rng.standard_normal((n, 3)) * [1.0, 2.0, 0.5]
    dim = rng.standard_normal((r, 2)) * [1.5, 1.0]
    if where == "base":
        base[:, 1] += ratio
    else:
        dim[:, 0] += ratio
    fk = rng.integers(0, r, n)
    if join == "left":
        fk[rng.random(n) < 0.2] = -1
    elif join == "almost":
        fk[_UNMATCHED_ROW] = -1
    sources, indicators = [base, dim], [None, fk]
    if onehot:
        codes = rng.integers(0, 5, 30)
        sources.append(sp.csr_matrix(np.eye(5)[codes]))
        indicators.append(rng.integers(0, 30, n))
    ds = MultiSourceDataset.from_matrices(sources, indicators)
    T = ds.materialize("dense")
    sd = T.std(axis=0)
    Z = (T - exact_mean(T)) / np.where(sd > 0, sd, 1.0)
    y = Z @ rng.uniform(0.5, 2.0, T.shape[1]) + 0.1 * rng.standard_normal(n)
    return ds, T, y + target_mean


def centered_table(T):
    """``(T - m, m)`` with ``m`` the exact column means: the joined table shifted by
    a constant per column, on which scikit-learn centers exactly."""
    m = exact_mean(T)
    return np.asarray(np.asarray(T, np.longdouble) - m, dtype=np.float64), m


def assert_same_standardized_model(est, ref, T, m, kind="solver", y=None):
    """Coefficients (standardized: per unit of each column's spread) and
    intercepts of ``est`` (fitted on the dataset) and ``ref`` (fitted on ``T - m``),
    the reference's intercept shifted back by ``m``."""
    sd = np.where(T.std(axis=0) > 0, T.std(axis=0), 1.0)
    a = np.atleast_2d(est.coef_) * sd
    b = np.atleast_2d(ref.coef_) * sd
    assert_close(a, b, kind=kind, scale=float(np.max(np.abs(b))))
    ref_intercept = np.asarray(ref.intercept_) - np.atleast_2d(ref.coef_) @ m
    # The intercept is y_mean - mu^T coef: relative to the terms that form it.
    terms = np.abs(np.atleast_2d(ref.coef_)) @ np.abs(m) + np.abs(ref_intercept)
    assert_close(
        np.ravel(est.intercept_),
        np.ravel(ref_intercept),
        kind=kind,
        scale=float(np.max(terms)),
    )


REGRESSORS = [
    ("LinearRegression", FactorizedLinearRegression(), LinearRegression()),
    ("Ridge", FactorizedRidge(alpha=3.0), Ridge(alpha=3.0)),
    (
        "Lasso",
        FactorizedLasso(alpha=0.01, tol=1e-12, max_iter=100_000),
        Lasso(alpha=0.01, tol=1e-12, max_iter=100_000),
    ),
    (
        "ElasticNet",
        FactorizedElasticNet(alpha=0.02, l1_ratio=0.5, tol=1e-12, max_iter=100_000),
        ElasticNet(alpha=0.02, l1_ratio=0.5, tol=1e-12, max_iter=100_000),
    ),
    (
        "Scaler+Lasso",
        make_pipeline(
            FactorizedStandardScaler(),
            FactorizedLasso(alpha=0.01, tol=1e-12, max_iter=100_000),
        ),
        make_pipeline(StandardScaler(), Lasso(alpha=0.01, tol=1e-12, max_iter=100_000)),
    ),
]


# ------------------------------------------------- every gram-based estimator
# A left-joined column of large mean varies 1e16 times more than the others: the
# coordinate descent's duality gap (ours and scikit-learn's) then stalls above
# tol=1e-12 (a limit of the unscaled problem), at the same solution.
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name, est, ref", REGRESSORS, ids=[r[0] for r in REGRESSORS])
def test_regressors_agree_with_sklearn(name, est, ref, layout, ratio):
    ds, T, y = badly_scaled(ratio, layout)
    Tc, m = centered_table(T)
    est.fit(ds, y)
    ref.fit(Tc, y)
    if name.startswith("Scaler"):
        # The models of the standardized data: the coefficients compare directly.
        assert_close(
            est[-1].coef_,
            ref[-1].coef_,
            kind="solver",
            scale=np.abs(ref[-1].coef_).max(),
        )
        # The scaled columns' means are (mean - mean_) / scale_, exact up to the
        # rounding of mean_ (eps * mean): the intercept, relative to those terms.
        terms = np.abs(m / ref[0].scale_) @ np.abs(ref[-1].coef_)
        assert_close(
            est[-1].intercept_,
            ref[-1].intercept_,
            kind="solver",
            scale=float(terms + abs(ref[-1].intercept_)),
        )
        assert_close(est[0].var_, ref[0].var_, kind="compiled")
        return
    assert_same_standardized_model(est, ref, T, m)
    if ratio <= 1e8:
        # Where scikit-learn is exact on the raw table, against that too.
        raw = type(ref)(**ref.get_params()).fit(T, y)
        assert_same_standardized_model(est, raw, T, np.zeros(T.shape[1]))


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_ridge_classifier_agrees_with_sklearn(layout, ratio):
    ds, T, y = badly_scaled(ratio, layout)
    labels = np.digitize(y, np.quantile(y, [0.33, 0.66]))
    Tc, m = centered_table(T)
    est = FactorizedRidgeClassifier(alpha=2.0).fit(ds, labels)
    ref = RidgeClassifier(alpha=2.0).fit(Tc, labels)
    assert_same_standardized_model(est, ref, T, m)
    np.testing.assert_array_equal(est.predict(ds), ref.predict(Tc))


# Leave-one-out: a left join of a column of large mean varies it by ratio times
# the others (the split between its values and zero), where scikit-learn's own
# RidgeCV loses digits (see the next test); and the one unmatched row of
# "nearly-all-matched" has leverage 1 - 1e-13, whose error is a ratio of roundings.
LOO_CASES = [(None, lay) for lay in ("base", "base+left+onehot", "dim+inner+onehot")]


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize(
    "cv, layout",
    LOO_CASES + [(3, lay) for lay in LAYOUTS],
    ids=[f"loo-{lay}" for _, lay in LOO_CASES] + [f"kfold-{lay}" for lay in LAYOUTS],
)
def test_ridge_cv_agrees_with_sklearn(cv, layout, ratio):
    ds, T, y = badly_scaled(ratio, layout)
    Tc, m = centered_table(T)
    alphas = [0.01, 1.0, 100.0]
    folds = None if cv is None else KFold(cv)
    est = FactorizedRidgeCV(alphas=alphas, cv=folds).fit(ds, y)
    ref = RidgeCV(alphas=alphas, cv=folds).fit(Tc, y)
    assert est.alpha_ == ref.alpha_
    assert_close(est.best_score_, ref.best_score_, kind="solver")
    assert_same_standardized_model(est, ref, T, m)


@pytest.mark.parametrize("ratio", [1e8, 1e12], ids=lambda r: f"{r:.0e}")
def test_ridge_loo_of_a_left_joined_column_of_large_mean(ratio):
    # The column varies ratio times more than the others: one eigendecomposition
    # of the gram resolves the others' directions only to eps * ratio^2 (and
    # scikit-learn's RidgeCV is off by up to 2x here). The leave-one-out errors
    # equal those of refitting without each row (a sample of rows).
    ds, T, y = badly_scaled(ratio, "dim+left", seed=4)
    alphas = [0.01, 1.0]
    est = FactorizedRidgeCV(alphas=alphas, store_cv_results=True).fit(ds, y)
    rows = np.random.default_rng(0).choice(len(y), 25, replace=False)
    for k, alpha in enumerate(alphas):
        errors = []
        for i in rows:
            keep = np.arange(len(y)) != i
            Tc, m = centered_table(T[keep])
            fit = Ridge(alpha=alpha).fit(Tc, y[keep])
            errors.append((y[i] - fit.predict((T[i] - m)[None, :])[0]) ** 2)
        assert_close(est.cv_results_[rows, k], np.array(errors), kind="solver")


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("l1_ratio", [1.0, 0.5], ids=["lasso", "enet"])
def test_elastic_net_cv_agrees_with_sklearn(l1_ratio, layout, ratio):
    ds, T, y = badly_scaled(ratio, layout)
    Tc, m = centered_table(T)
    kw = {"alphas": 6, "cv": KFold(3), "tol": 1e-10, "max_iter": 100_000}
    if l1_ratio == 1.0:
        est, ref = FactorizedLassoCV(**kw).fit(ds, y), LassoCV(**kw).fit(Tc, y)
    else:
        est = FactorizedElasticNetCV(l1_ratio=l1_ratio, **kw).fit(ds, y)
        ref = ElasticNetCV(l1_ratio=l1_ratio, **kw).fit(Tc, y)
    # As the well-scaled paths compare (tests/linear_model/test_linear_cv.py): the grid to
    # the solvers' precision, the warm-started path to the iterations'.
    assert_close(est.alphas_, ref.alphas_, kind="solver")
    assert est.alpha_ == pytest.approx(ref.alpha_, rel=1e-10)
    assert_close(est.mse_path_, ref.mse_path_, kind="iterative")
    assert_same_standardized_model(est, ref, T, m, kind="iterative")


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_scaler_agrees_with_sklearn(layout, ratio):
    ds, T, _ = badly_scaled(ratio, layout)
    Tc, m = centered_table(T)
    sw = np.random.default_rng(1).uniform(0.5, 2.0, T.shape[0])
    for weights in (None, sw):
        est = FactorizedStandardScaler().fit(ds, sample_weight=weights)
        ref = StandardScaler().fit(Tc, sample_weight=weights)
        assert_close(est.var_, ref.var_, kind="compiled")
        assert_close(est.scale_, ref.scale_, kind="compiled")
        # The mean is the reference's plus the exact shift (relative to both).
        assert_close(est.mean_, ref.mean_ + m, kind="compiled", scale=1.0)
    # Standardized data (implicitly centered): unit variances, zero means.
    Z = FactorizedStandardScaler().fit_transform(ds)
    again = FactorizedStandardScaler().fit(Z)
    assert_close(again.var_, np.ones(T.shape[1]), kind="compiled")
    # Its means: the rounding of mean_ (eps * mean) over the scale, no more.
    ratio_terms = float(np.max(np.abs(m) / np.where(T.std(0) > 0, T.std(0), 1.0)))
    assert_close(
        again.mean_, np.zeros(T.shape[1]), kind="operator", scale=1.0 + ratio_terms
    )


# A left join gives its column of large mean a variance ratio^2 times the others'
# (the split between its values and the unmatched zeros): the covariance's
# eigenvectors then resolve the other directions only to eps * ratio^2 of the top
# eigenvalue, a limit of forming the covariance (scikit-learn's covariance_eigh
# alike), not of centering. PCA is compared where the large column's variance is
# that of its values.
PCA_LAYOUTS = ["base", "base+left+onehot", "dim+inner+onehot"]


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize("layout", PCA_LAYOUTS)
@pytest.mark.parametrize("solver", ["covariance_eigh", "randomized"])
def test_pca_agrees_with_sklearn(solver, layout, ratio):
    ds, T, _ = badly_scaled(ratio, layout)
    Tc, m = centered_table(T)
    k = 3
    est = FactorizedPCA(n_components=k, svd_solver=solver, random_state=0).fit(ds)
    # scikit-learn's exact solver: its covariance_eigh cancels as raw sums do.
    ref = PCA(n_components=k, svd_solver="full").fit(Tc)
    top = float(ref.explained_variance_.max())
    kind = "fit" if solver == "covariance_eigh" else "iterative"
    assert_close(est.explained_variance_, ref.explained_variance_, kind=kind, scale=top)
    assert_close(
        est.explained_variance_ratio_, ref.explained_variance_ratio_, kind=kind
    )
    assert_close(est.components_, ref.components_, kind=kind, scale=1.0)
    assert_close(est.mean_, ref.mean_ + m, kind="operator", scale=1.0)
    # The projections: exact up to a constant per component, the rounding of the
    # float64 mean_ (eps * mean, far below the spread only up to 1e8) that any
    # stored mean carries (scikit-learn's on the raw table alike).
    Z, Z_ref = est.transform(ds), ref.transform(Tc)
    offset = (Z - Z_ref).mean(axis=0)
    Z_scale = float(np.abs(Z_ref).max())
    assert_close(Z - offset, Z_ref, kind=kind, scale=Z_scale)
    mean_rounding = np.finfo(np.float64).eps * np.abs(m) @ np.abs(ref.components_.T)
    assert np.all(np.abs(offset) <= 2 * mean_rounding + 1e-8 * Z_scale)
    if solver == "covariance_eigh" and ratio <= 1e8:
        assert_close(
            est.score_samples(ds), ref.score_samples(Tc), kind="fit", scale=1.0
        )


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
def test_truncated_svd_total_variance(ratio):
    ds, T, _ = badly_scaled(ratio, "dim+inner+onehot")
    est = FactorizedTruncatedSVD(n_components=2, algorithm="arpack").fit(ds)
    total = float(np.sum(np.var(np.asarray(centered_table(T)[0], np.longdouble), 0)))
    assert_close(
        est.explained_variance_ratio_,
        np.asarray(est.explained_variance_) / total,
        kind="operator",
    )


# --------------------------------------------------------------------- targets
TARGET_MEANS = [1e4, 1e8, 1e12]


@pytest.mark.parametrize("target_mean", TARGET_MEANS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize("ratio", [1.0, 1e8], ids=["well-scaled X", "X 1e8"])
@pytest.mark.parametrize("name, est, ref", REGRESSORS, ids=[r[0] for r in REGRESSORS])
def test_targets_with_a_large_mean(name, est, ref, ratio, target_mean):
    ds, T, y = badly_scaled(ratio, "base+left+onehot", seed=2, target_mean=target_mean)
    Tc, m = centered_table(T)
    est.fit(ds, y)
    ref.fit(Tc, y)
    if name.startswith("Scaler"):
        est, ref = est[-1], ref[-1]
        assert_close(est.coef_, ref.coef_, kind="solver", scale=np.abs(ref.coef_).max())
        assert_close(est.intercept_, ref.intercept_, kind="solver")
        assert np.count_nonzero(est.coef_) == np.count_nonzero(ref.coef_) > 0
        return
    assert_same_standardized_model(est, ref, T, m)
    assert np.count_nonzero(est.coef_) == np.count_nonzero(ref.coef_) > 0


@pytest.mark.parametrize("target_mean", TARGET_MEANS, ids=lambda r: f"{r:.0e}")
def test_cv_searches_with_a_large_target_mean(target_mean):
    ds, T, y = badly_scaled(1e8, "base+left+onehot", seed=3, target_mean=target_mean)
    Tc, m = centered_table(T)
    kw = {"alphas": 6, "cv": KFold(3), "tol": 1e-10, "max_iter": 100_000}
    pairs = [
        (FactorizedLassoCV(**kw), LassoCV(**kw)),
        (FactorizedElasticNetCV(l1_ratio=0.5, **kw), ElasticNetCV(l1_ratio=0.5, **kw)),
        (FactorizedRidgeCV(alphas=[0.1, 10.0]), RidgeCV(alphas=[0.1, 10.0])),
        (
            FactorizedRidgeCV(alphas=[0.1, 10.0], cv=KFold(3)),
            RidgeCV(alphas=[0.1, 10.0], cv=KFold(3)),
        ),
    ]
    for est, ref in pairs:
        est.fit(ds, y)
        ref.fit(Tc, y)
        assert est.alpha_ == pytest.approx(ref.alpha_, rel=1e-10)
        assert_same_standardized_model(est, ref, T, m, kind="iterative")


# --------------------------------------------- the statistics and their folds
def _offset_operator(op, ratio, seed=0):
    """``op`` with every dense source offset by ``ratio`` times a per-column level
    (the sparse ones as they are)."""
    rng = np.random.default_rng(seed)
    terms, moved = [], {}
    for t in op.terms:
        S = t.S
        if not t.is_sparse:
            if id(S) not in moved:
                moved[id(S)] = S + ratio * rng.uniform(1.0, 3.0, S.shape[1])
            S = moved[id(S)]
        terms.append(Term(S, t.rows, t.cols, t.source))
    return FactorizedMatrix(terms, op.n_rows, op.n_cols, op.dtype)


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "float32"])
def test_centered_gram_of_every_join(scenario, ratio):
    # Every integration scenario (outer joins, overlapping columns, snowflakes,
    # unions, many-to-many) with large offsets in its dense sources: the centered
    # statistics equal the exact ones, entry by entry relative to their scale.
    ds = random_dataset(3, n_rows=400, scenario=scenario)
    op = _offset_operator(validate_X(FactorizedRidge(), ds, reset=True), ratio)
    T = op.materialize("dense")
    T = T.toarray() if sp.issparse(T) else T
    rng = np.random.default_rng(4)
    Y = (T - exact_mean(T)) @ rng.standard_normal((T.shape[1], 1)) / ratio
    Y = Y + 1e9
    sw = rng.uniform(0.5, 2.0, T.shape[0])
    for weights in (None, sw):
        stats = centered_gram(op, weights, True, Y)
        G = exact_centered_gram(T, weights)
        scale = np.sqrt(np.outer(np.diag(G), np.diag(G)))
        assert_close(stats.G, G, kind="operator", bound=scale)
        assert_close(stats.mu, exact_mean(T, weights), kind="operator", scale=0.0)
        joint = exact_centered_gram(np.column_stack([T, Y]), weights)
        assert_close(
            stats.rhs[:, 0],
            joint[:-1, -1],
            kind="operator",
            bound=np.sqrt(np.diag(G) * joint[-1, -1]),
        )
        assert_close(stats.y_var, joint[-1:, -1], kind="operator")


@pytest.mark.parametrize("layout", ["base", "dim+left"])
@pytest.mark.parametrize("weighted", [False, True])
def test_fold_statistics_downdate_badly_scaled_columns(weighted, layout):
    # One shift (all rows') for the training and test rows: their sums stay
    # additive, and the guard judges the downdated gram at its own scales.
    set_statistics_cache(0)
    ds, T, y = badly_scaled(1e10, layout, seed=5)
    op = validate_X(FactorizedRidge(), ds, reset=True)
    sw = np.random.default_rng(1).uniform(0.5, 2.0, len(ds)) if weighted else None
    statistics = FoldStatistics(op, sw, y[:, None], True)
    # (A left join's zeros give the column its spread: it needs no shift.)
    assert statistics.all_rows.shift.trivial == (layout == "dim+left")
    for train, test in KFold(4, shuffle=True, random_state=0).split(T):
        fold = statistics.fold(train, test)
        w = None if sw is None else sw[train]
        G = exact_centered_gram(T[train], w)
        scale = np.sqrt(np.outer(np.diag(G), np.diag(G)))
        assert_close(fold.train.G, G, kind="operator", bound=scale)
        assert_close(fold.train.mu, exact_mean(T[train], w), kind="operator")
    assert statistics.fallbacks == 0


def test_cached_search_downdates_badly_scaled_columns():
    # A grid search over the folds of a dataset with a column of mean 1e10: the
    # training folds' grams come from the root's minus the test rows' (one shift
    # for all, fixed by the root; downdating is an opt-in setting), and the
    # search equals scikit-learn's.
    from ilargi_sklearn import set_config

    set_config(statistics_downdating=True)
    ds, T, y = badly_scaled(1e10, "dim+left", seed=6)
    Tc, _ = centered_table(T)
    grid = {"alpha": [0.01, 1.0, 100.0]}
    est = GridSearchCV(FactorizedRidge(), grid, cv=KFold(5)).fit(ds, y)
    ref = GridSearchCV(Ridge(), grid, cv=KFold(5)).fit(Tc, y)
    assert ds.cache_info()["statistics"]["downdates"] > 0
    assert est.best_params_ == ref.best_params_
    for k in range(5):
        name = f"split{k}_test_score"
        assert_close(est.cv_results_[name], ref.cv_results_[name], kind="solver")


# ------------------------------------------------- the shifted design itself
@pytest.mark.parametrize("copy_whole", [False, True], ids=["split", "whole"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_shifted_matrix_is_the_design_minus_its_pilots(
    scenario, copy_whole, monkeypatch
):
    # Both layouts: the shifted columns copied into terms of their own (the
    # source's own columns hidden), or the whole source's shifted copy.
    monkeypatch.setattr(
        operators_module, "_copy_whole", lambda *args, copy_whole=copy_whole: copy_whole
    )
    ds = random_dataset(7, n_rows=80, scenario=scenario)
    op = validate_X(FactorizedRidge(), ds, reset=True)
    T = ds.materialize("dense")
    dense = np.zeros(op.n_cols, dtype=bool)
    for t in op.terms:
        dense[t.cols] |= not t.is_sparse
    for t in op.terms:
        if t.is_sparse:
            dense[t.cols] = False
    cols = np.flatnonzero(dense)
    values = np.round(np.linspace(-3.0, 5.0, cols.size), 2).astype(op.dtype)
    W = shift_columns(op, cols, values)
    c = np.zeros(op.n_cols)
    c[cols] = values
    expected = T - c
    kind = "operator"
    assert_close(W.materialize("dense"), expected, kind=kind, scale=8.0)
    rng = np.random.default_rng(0)
    v = rng.standard_normal((op.n_cols, 2)).astype(op.dtype)
    u = rng.standard_normal((op.n_rows, 2)).astype(op.dtype)
    sw = rng.uniform(0.5, 2.0, op.n_rows).astype(op.dtype)
    E = np.abs(expected)
    assert_close(W.matmul(v), expected @ v, kind=kind, bound=E @ np.abs(v))
    assert_close(W.rmatmul(u), expected.T @ u, kind=kind, bound=E.T @ np.abs(u))
    assert_close(
        W.gram(sw, "dense"),
        expected.T @ (sw[:, None] * expected),
        kind=kind,
        bound=E.T @ (sw[:, None] * E),
    )
    assert_close(W.col_sums(sw), sw @ expected, kind=kind, bound=sw @ E)
    assert_close(W.col_sq_sums(), (expected**2).sum(0), kind=kind, bound=(E**2).sum(0))
    assert_close(W.row_sq_norms(), (expected**2).sum(1), kind=kind, bound=(E**2).sum(1))
    rows = rng.permutation(op.n_rows)[: op.n_rows // 2]
    assert_close(
        W.take_rows(rows).materialize("dense"), expected[rows], kind=kind, scale=8.0
    )


@pytest.mark.parametrize("layout", ["base", "dim+nearly-all-matched"])
def test_shifted_matrix_on_a_device(layout):
    # The shifted copies and the unmatched rows' one-row source on another
    # namespace and device (array_api_strict stands in for a GPU).
    xps, device = strict_namespace()
    ds, T, y = badly_scaled(1e9, layout, seed=8)
    est = FactorizedRidge(alpha=1.0).fit(ds, y)
    on_device = FactorizedRidge(alpha=1.0).fit(ds.to_device(device, namespace=xps), y)
    assert_close(dense(on_device.coef_), est.coef_, kind="device_fit", scale=1.0)
    Tc, m = centered_table(T)
    assert_same_standardized_model(est, Ridge(alpha=1.0).fit(Tc, y), T, m)
    scaler = FactorizedStandardScaler().fit(ds.to_device(device, namespace=xps))
    assert_close(dense(scaler.var_), StandardScaler().fit(Tc).var_, kind="device_fit")


def test_nearly_all_matched_layout_is_shifted():
    # The layouts above exercise the shifted design where they mean to: the
    # column of large mean is shifted, with a term for its unmatched cell.
    ds, T, _ = badly_scaled(1e8, "dim+nearly-all-matched")
    op = validate_X(FactorizedRidge(), ds, reset=True)
    shift = choose_shift(op)
    assert shift.cols.tolist() == [3]
    W = shift_columns(op, shift.cols, shift.values)
    one_row = [t for t in W.inner.terms if t.rows.n_source_rows == 1]
    assert len(one_row) == 1 and one_row[0].cols.tolist() == [3]
    assert_close(W.materialize("dense")[_UNMATCHED_ROW, 3], -shift.values[0])


def test_well_scaled_data_are_not_shifted(monkeypatch):
    # No copy, no second design: well-scaled data are summed as they are.
    def refuse(*args, **kwargs):
        raise AssertionError("a well-scaled design was shifted")

    monkeypatch.setattr(stats_module, "shift_columns", refuse)
    for scenario in SCENARIOS:
        ds = random_dataset(9, n_rows=300, scenario=scenario)
        op = validate_X(FactorizedRidge(), ds, reset=True)
        assert choose_shift(op) is NO_SHIFT
        y = np.random.default_rng(0).standard_normal(len(ds)) + 5.0
        FactorizedLinearRegression().fit(ds, y)
        FactorizedStandardScaler().fit(ds)
        FactorizedPCA(n_components=1).fit(ds)


# ----------------------------------------------------- where digits are lost
def test_ridge_penalty_below_the_rounding_warns():
    # Exactly collinear columns: the penalized gram's smallest eigenvalue is the
    # penalty, here far below the gram's rounding: scikit-learn's solve warns
    # that the result may not be accurate; so does this one.
    rng = np.random.default_rng(10)
    X = rng.standard_normal((200, 3))
    X = np.column_stack([X, X[:, 0] + X[:, 1]])
    y = X @ [1.0, 2.0, 3.0, 0.0] + rng.standard_normal(200)
    with pytest.warns(scipy.linalg.LinAlgWarning, match="penalty is below"):
        FactorizedRidge(alpha=1e-25).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FactorizedRidge(alpha=1e-3).fit(X, y)


def test_directions_below_the_rounding_warn():
    # A direction whose eigenvalue lstsq keeps (cond=tol) but the gram cannot
    # resolve: the minimum-norm solution drops it, and says so.
    rng = np.random.default_rng(11)
    X = rng.standard_normal((300, 3))
    X = np.column_stack([X, X[:, 0] + 1e-7 * rng.standard_normal(300)])
    y = X @ [1.0, 2.0, 0.0, -1.0] + 1e6 * (X[:, 3] - X[:, 0])
    with pytest.warns(scipy.linalg.LinAlgWarning, match="rounding"):
        FactorizedLinearRegression(tol=1e-10).fit(X, y)


def test_sparse_column_with_a_large_mean_warns():
    # A sparse source is never shifted: a column it stores densely with a mean of
    # 1e9 against a spread of 1 loses its variance, and a warning names it.
    rng = np.random.default_rng(12)
    n = 500
    base = rng.standard_normal((n, 2))
    big = sp.csr_matrix(1e9 + rng.standard_normal((20, 1)))
    ds = MultiSourceDataset.from_matrices([base, big], [None, rng.integers(0, 20, n)])
    y = base @ [1.0, 2.0] + rng.standard_normal(n)
    with pytest.warns(UserWarning, match=r"Feature\(s\) \[2\] .* sparse source"):
        FactorizedLinearRegression().fit(ds, y)
    with pytest.warns(UserWarning, match=r"Feature\(s\) \[2\] .* sparse source"):
        FactorizedStandardScaler().fit(ds)
    # One-hot columns, even one present in every row, are no such case.
    onehot = np.eye(3)[rng.integers(0, 3, 20)]
    onehot[:, 0] = 1.0
    onehot = sp.csr_matrix(onehot)
    ds = MultiSourceDataset.from_matrices(
        [base, onehot], [None, rng.integers(0, 20, n)]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FactorizedLinearRegression().fit(ds, y)


# ------------------------------------------------------------------ inputs
NEGATIVE_REFUSED = [
    FactorizedLinearRegression(),
    FactorizedRidge(),
    FactorizedRidgeCV(),
    FactorizedRidgeCV(cv=3),
    FactorizedLassoCV(cv=3),
    FactorizedElasticNetCV(cv=3),
]


@pytest.mark.parametrize("est", NEGATIVE_REFUSED, ids=lambda e: repr(e))
def test_negative_sample_weight_is_refused(est):
    # scikit-learn's LinearRegression refuses them (ensure_non_negative=True); its
    # ridge and CV fits fail on them with NaN deep inside: refused here, by name.
    rng = np.random.default_rng(13)
    X, y = rng.standard_normal((60, 3)), rng.standard_normal(60)
    sw = np.ones(60)
    sw[7] = -0.5
    with pytest.raises(ValueError, match="Negative values in data passed to"):
        est.fit(X, y, sample_weight=sw)
    ds = MultiSourceDataset.from_matrices([X], [None])
    with pytest.raises(ValueError, match="Negative values in data passed to"):
        est.fit(ds, y, sample_weight=sw)


def test_negative_sample_weight_is_refused_by_the_ridge_classifier():
    rng = np.random.default_rng(13)
    X, y = rng.standard_normal((60, 3)), rng.integers(0, 2, 60)
    sw = np.ones(60)
    sw[7] = -0.5
    with pytest.raises(ValueError, match="Negative values in data passed to"):
        FactorizedRidgeClassifier().fit(X, y, sample_weight=sw)


@pytest.mark.parametrize(
    "est",
    [FactorizedLasso(alpha=0.01), FactorizedElasticNet(alpha=0.01)],
    ids=lambda e: type(e).__name__,
)
def test_negative_sample_weight_accepted_where_sklearn_accepts_it(est):
    rng = np.random.default_rng(13)
    X, y = rng.standard_normal((60, 3)), rng.standard_normal(60)
    sw = np.ones(60)
    sw[7] = -0.5
    ref = type(est)(**est.get_params(deep=False)).fit(X, y)
    assert np.all(np.isfinite(est.fit(X, y, sample_weight=sw).coef_))
    assert not np.allclose(est.coef_, ref.coef_)


def test_complex_input_is_refused():
    rng = np.random.default_rng(14)
    X, y = rng.standard_normal((30, 2)), rng.standard_normal(30)
    match = "Complex data not supported"
    with pytest.raises(ValueError, match=match):
        FactorizedLinearRegression().fit(X + 1j, y)
    with pytest.raises(ValueError, match=match):
        FactorizedRidge().fit(X, y + 1j)
    with pytest.raises(ValueError, match=rf"{match}.*column\(s\) \['a'\]"):
        FactorizedStandardScaler().fit(pd.DataFrame({"a": X[:, 0] + 1j, "b": X[:, 1]}))
    with pytest.raises(ValueError, match=rf"{match}: source 's1'"):
        MultiSourceDataset.from_matrices([X, X + 1j], [None, np.arange(30)])
    with pytest.raises(ValueError, match=rf"{match}: source 's0'"):
        MultiSourceDataset.from_matrices([sp.csr_matrix(X + 1j)], [None])
    base = pd.DataFrame({"k": np.arange(30), "a": X[:, 0], "c": X[:, 1] + 2j})
    table = pd.DataFrame({"k": np.arange(30), "z": X[:, 1] * 1j})
    with pytest.raises(ValueError, match=rf"{match}: source 'base', column 'c'"):
        MultiSourceDataset.from_frames(base, ["c"])
    with pytest.raises(ValueError, match=rf"{match}: source 'join0', column 'z'"):
        MultiSourceDataset.from_frames(
            base, ["a"], [Join(table, on="k", features=["z"])]
        )


def test_complex_device_input_is_refused():
    xps, device = strict_namespace()
    X = xps.asarray(np.ones((10, 2)) + 1j, device=device)
    with pytest.raises(ValueError, match="Complex data not supported"):
        FactorizedLinearRegression().fit(X, np.ones(10))


def test_float32_overflow_is_reported_as_an_overflow():
    rng = np.random.default_rng(15)
    n = 20_000  # large enough for the frames' one-block copy
    base = pd.DataFrame(
        {"k": np.arange(n), "a": rng.standard_normal(n), "big": np.full(n, 1e39)}
    )
    table = pd.DataFrame({"k": np.arange(n), "big": np.full(n, -2e39)})
    match = r"values up to .*, beyond the range of float32 .* dtype=np.float64"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "overflow encountered in cast"
        with pytest.raises(
            ValueError, match=rf"source 'base', column 'big' has {match}"
        ):
            MultiSourceDataset.from_frames(base, ["a", "big"], dtype=np.float32)
        with pytest.raises(ValueError, match=rf"column 'big' has {match}"):
            MultiSourceDataset.from_frames(
                base[["k", "a"]],
                ["a"],
                [Join(table, on="k", features=["big"])],
                dtype=np.float32,
            )
        for S in (np.full((5, 2), 1e39), sp.csr_matrix(np.full((5, 2), 1e39))):
            with pytest.raises(ValueError, match=rf"source 's0', column 0 has {match}"):
                MultiSourceDataset.from_matrices([S], [None], dtype=np.float32)
    # Values within float32's range whose squares are not: the gram overflows,
    # and the error says so (not a NaN coefficient, not a solver's crash).
    X = np.column_stack([rng.standard_normal(50) * 1e25, rng.standard_normal(50)])
    ds = MultiSourceDataset.from_matrices([X], [None], dtype=np.float32)
    with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match="overflowed"):
        FactorizedLinearRegression().fit(ds, rng.standard_normal(50))
    with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match="overflowed"):
        FactorizedStandardScaler().fit(ds)
    # A finite dataset in float64 is untouched by the check.
    FactorizedLogisticRegression().fit(
        MultiSourceDataset.from_matrices([X / 1e25], [None]), rng.integers(0, 2, 50)
    )


@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"{r:.0e}")
def test_kmeans_tolerance_scales_by_the_true_variances(ratio):
    # K-Means scales tol by the mean column variance, as scikit-learn does.
    from sklearn.cluster._kmeans import _tolerance as sklearn_tolerance

    from ilargi_sklearn.cluster._kmeans import _tolerance

    ds, T, _ = badly_scaled(ratio, "dim+inner+onehot")
    op = validate_X(FactorizedRidge(), ds, reset=True)
    assert_close(_tolerance(op, 1e-4), sklearn_tolerance(centered_table(T)[0], 1e-4))
