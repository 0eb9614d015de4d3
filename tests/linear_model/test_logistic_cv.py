"""Warm starts and the C path of FactorizedLogisticRegression, and
FactorizedLogisticRegressionCV: parity with scikit-learn's path and
LogisticRegressionCV on the joined matrix with the same folds, folds that keep the
factorized form, composition (Pipeline, cross_val_score, clone, pickle) and bad
input."""

import pickle

import numpy as np
import pytest
from _helpers import assert_close, classification_data
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV
from sklearn.linear_model._logistic import (
    _logistic_regression_path as sk_logistic_regression_path,
)
from sklearn.metrics import get_scorer
from sklearn.model_selection import ShuffleSplit, StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.linear_model import (
    FactorizedLogisticRegression,
    FactorizedLogisticRegressionCV,
)
from ilargi_sklearn.linear_model._logistic import (
    _logistic_regression_path,
    _loss_target,
)
from ilargi_sklearn.linear_model._loss import _loss_and_grad
from ilargi_sklearn.multisource import FactorizedMatrix
from ilargi_sklearn.preprocessing import FactorizedStandardScaler

# Tight solver settings: both sides converge to the optimum, so they agree to the
# tolerance table's "iterative" kind (L-BFGS stopped by a tolerance on two paths).
EXACT = dict(tol=1e-10, max_iter=10_000)


def _data(n_classes=2, seed=0, n_rows=240):
    ds, y = classification_data(seed=seed, n_rows=n_rows, n_classes=n_classes)
    return ds, y, ds.materialize("dense")


def _sk_cv(**kw):
    # scikit-learn 1.9's spelling of the L2 path with its 1.10 attributes, and
    # its default scoring (accuracy) without the warning of its change.
    kw.setdefault("scoring", None)
    return LogisticRegressionCV(l1_ratios=(0,), use_legacy_attributes=False, **kw)


def _flat(coef, intercept, fit_intercept):
    if not fit_intercept:
        return coef.ravel()
    return np.hstack([coef, np.reshape(intercept, (-1, 1))]).ravel()


# ------------------------------------------------------------------ the path
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_path_matches_sklearn_path(n_classes, fit_intercept, weighted):
    ds, y, T = _data(n_classes, seed=3)
    sw = np.random.default_rng(1).uniform(0.5, 2.0, len(y)) if weighted else None
    # Up to C=100: beyond it, the multinomial optimum is flat along the redundant
    # direction of the softmax, and two L-BFGS runs stop at different points of
    # it (same predictions, coefficients apart by more than the table allows).
    Cs = np.logspace(-3, 2, 6)
    ref, _, ref_iter = sk_logistic_regression_path(
        T,
        y,
        classes=np.unique(y),
        Cs=Cs,
        fit_intercept=fit_intercept,
        sample_weight=sw,
        **EXACT,
    )
    loss, n_outputs, target = _loss_target(y, n_classes, np)
    coefs, n_iter = _logistic_regression_path(
        ds.operator,
        target,
        sw,
        len(y) if sw is None else float(sw.sum()),
        Cs,
        fit_intercept=fit_intercept,
        loss=loss,
        w0=np.zeros(n_outputs * (ds.shape[1] + fit_intercept)),
        **EXACT,
    )
    assert coefs.shape == (Cs.size, n_outputs * (ds.shape[1] + fit_intercept))
    assert n_iter.shape == (Cs.size,) and n_iter.dtype == np.int32
    assert_close(coefs, ref.reshape(Cs.size, -1), kind="iterative", scale=1.0)
    # Warm started along the path: later Cs take few iterations (scikit-learn's
    # counts, to a step or two where the last digits of an iterate differ).
    assert np.all(np.abs(n_iter - ref_iter) <= 3), (n_iter, ref_iter)


def _path(ds, y, n_classes, Cs, tol):
    loss, n_outputs, target = _loss_target(y, n_classes, np)
    coefs, n_iter = _logistic_regression_path(
        ds.operator,
        target,
        None,
        float(len(y)),
        Cs,
        fit_intercept=True,
        loss=loss,
        w0=np.zeros(n_outputs * (ds.shape[1] + 1)),
        tol=tol,
        max_iter=10_000,
    )
    return coefs, n_iter, (loss, n_outputs, target)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_path_equals_cold_fits_within_tol(n_classes):
    """Each C of the warm-started path passes the cold fit's stopping test (the
    gradient within tol, where tol is L-BFGS's binding test), and at a tight tol
    it is the cold fit's optimum."""
    ds, y, _ = _data(n_classes, seed=4)
    # Up to C=10: see test_path_matches_sklearn_path (a cold and a warm start
    # reach the flat multinomial optimum of C=100 at points further apart).
    Cs = np.logspace(-2, 1, 4)
    coefs, _, (loss, n_outputs, target) = _path(ds, y, n_classes, Cs, tol=1e-6)
    for C, w in zip(Cs, coefs):
        args = (ds.operator, target, None, len(y), 1 / (C * len(y)), True)
        _, grad = _loss_and_grad(w, *args, n_outputs, loss)
        assert np.max(np.abs(grad)) <= 1e-6, C

    coefs, n_iter, _ = _path(ds, y, n_classes, Cs, tol=EXACT["tol"])
    cold_iter = 0
    for C, w in zip(Cs, coefs):
        cold = FactorizedLogisticRegression(C=C, **EXACT).fit(ds, y)
        cold_iter += int(cold.n_iter_[0])
        assert_close(
            w, _flat(cold.coef_, cold.intercept_, True), kind="iterative", scale=1.0
        )
    # The warm starts are the point of the path.
    assert n_iter.sum() < cold_iter


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_warm_start_refit_equals_cold_fit(n_classes, fit_intercept):
    ds, y, T = _data(n_classes, seed=5)
    est = FactorizedLogisticRegression(
        warm_start=True, C=0.1, fit_intercept=fit_intercept, **EXACT
    ).fit(ds, y)
    first = int(est.n_iter_[0])
    est.set_params(C=0.3).fit(ds, y)
    cold = FactorizedLogisticRegression(
        C=0.3, fit_intercept=fit_intercept, **EXACT
    ).fit(ds, y)
    assert_close(est.coef_, cold.coef_, kind="iterative", scale=1.0)
    assert_close(est.intercept_, cold.intercept_, kind="iterative", scale=1.0)
    # scikit-learn's warm start reaches the same optimum.
    ref = LogisticRegression(
        warm_start=True, C=0.1, fit_intercept=fit_intercept, **EXACT
    ).fit(T, y)
    ref.set_params(C=0.3).fit(T, y)
    assert_close(est.coef_, ref.coef_, kind="iterative", scale=1.0)
    # Started at its optimum, a refit stops at once (a cold one does not).
    assert first > 1
    assert int(est.fit(ds, y).n_iter_[0]) <= 1
    # Without warm_start the previous fit is ignored.
    est.set_params(warm_start=False).fit(ds, y)
    assert_close(est.coef_, cold.coef_, kind="iterative", scale=1.0)


def test_warm_start_with_the_gd_solver_and_a_new_shape():
    ds, y, _ = _data(2, seed=6)
    cold = FactorizedLogisticRegression(solver="gd", max_iter=20_000, tol=1e-9)
    cold.fit(ds, y)
    warm = clone(cold).set_params(warm_start=True).fit(ds, y)
    warm.fit(ds, y)
    assert warm.n_iter_[0] == 0  # already within tol
    assert_close(warm.coef_, cold.coef_, kind="iterative", scale=1.0)
    _, y3, _ = _data(3, seed=6)
    with pytest.raises(ValueError, match=r"warm_start=True needs the previous coef_"):
        warm.fit(ds, y3)


# ---------------------------------------------------------------- CV parity
def _assert_same_search(est, ref, scale=1.0):
    assert est.C_ == ref.C_
    np.testing.assert_array_equal(est.Cs_, ref.Cs_)
    assert est.scores_.shape == ref.scores_.shape
    assert est.coefs_paths_.shape == ref.coefs_paths_.shape
    assert est.n_iter_.shape == ref.n_iter_.shape
    assert est.l1_ratio_ == ref.l1_ratio_
    assert_close(est.scores_, ref.scores_, kind="iterative", scale=scale)
    assert_close(est.coefs_paths_, ref.coefs_paths_, kind="iterative", scale=scale)
    assert_close(est.coef_, ref.coef_, kind="iterative", scale=scale)
    assert_close(est.intercept_, ref.intercept_, kind="iterative", scale=scale)
    np.testing.assert_array_equal(est.classes_, ref.classes_)


@pytest.mark.parametrize(
    "n_classes, scoring, refit",
    [
        (n_classes, scoring, True)
        for n_classes in (2, 3)
        for scoring in (None, "neg_log_loss", "roc_auc_ovr")
    ]
    + [(2, "neg_log_loss", False), (3, None, False)],
)
def test_cv_matches_sklearn(n_classes, scoring, refit):
    ds, y, T = _data(n_classes, seed=7)
    folds = list(StratifiedKFold(4, shuffle=True, random_state=0).split(T, y))
    kw = dict(Cs=np.logspace(-3, 2, 6), cv=folds, scoring=scoring, refit=refit)
    ref = _sk_cv(**kw, **EXACT).fit(T, y)
    est = FactorizedLogisticRegressionCV(**kw, **EXACT).fit(ds, y)
    _assert_same_search(est, ref)
    assert_close(
        est.predict_proba(ds), ref.predict_proba(T), kind="iterative", scale=1.0
    )
    assert isinstance(est.C_, float)
    assert est.n_iter_.dtype == np.int32


def test_cv_int_folds_and_log_grid_match_sklearn():
    """cv=int and Cs=int: scikit-learn's stratified folds and log grid."""
    ds, y, T = _data(2, seed=8)
    ref = _sk_cv(Cs=5, cv=3, **EXACT).fit(T, y)
    est = FactorizedLogisticRegressionCV(Cs=5, cv=3, **EXACT).fit(ds, y)
    _assert_same_search(est, ref)
    np.testing.assert_array_equal(est.n_iter_, ref.n_iter_)


@pytest.mark.parametrize("class_weight", [None, "balanced", {0: 2.0, 2: 0.5}])
def test_cv_weights_match_sklearn(class_weight):
    ds, y, T = _data(3, seed=9)
    sw = np.random.default_rng(2).uniform(0.2, 3.0, len(y))
    kw = dict(Cs=4, cv=3, class_weight=class_weight, scoring="neg_log_loss")
    ref = _sk_cv(**kw, **EXACT).fit(T, y, sample_weight=sw)
    est = FactorizedLogisticRegressionCV(**kw, **EXACT).fit(ds, y, sample_weight=sw)
    _assert_same_search(est, ref)


def test_cv_without_intercept_or_penalty_matches_sklearn():
    ds, _, T = _data(2, seed=10)
    # Labels drawn from a logistic model: not separable, so that the unpenalized
    # optimum (C=inf) exists.
    rng = np.random.default_rng(10)
    y = T @ rng.standard_normal(T.shape[1]) + rng.logistic(size=len(T)) > 0
    y = y.astype(int)
    kw = dict(Cs=[0.01, 1.0, np.inf], cv=3, fit_intercept=False)
    ref = _sk_cv(**kw, **EXACT).fit(T, y)
    est = FactorizedLogisticRegressionCV(**kw, **EXACT).fit(ds, y)
    _assert_same_search(est, ref)
    np.testing.assert_array_equal(est.intercept_, [0.0])


@pytest.mark.parametrize("strategy", ["factorized", "materialized"])
def test_small_training_folds_are_row_slices(strategy, monkeypatch):
    """Folds of under half the rows are fitted on a row slice of the operator,
    folds of more on all rows with zero weights on the others: both give
    scikit-learn's search, and the factorized one never builds the join."""
    ds, y, T = _data(2, seed=11, n_rows=300)
    cv = list(ShuffleSplit(3, train_size=0.3, random_state=0).split(T, y))
    cv += list(StratifiedKFold(2).split(T, y))
    # Cs up to 10: 90 training rows are close to separable, where a weaker
    # penalty makes the optimum ill-conditioned.
    Cs = np.logspace(-3, 1, 4)
    ref = _sk_cv(Cs=Cs, cv=cv, **EXACT).fit(T, y)
    if strategy == "factorized":

        def refuse(*args, **kwargs):
            raise AssertionError("the join was built")

        monkeypatch.setattr(FactorizedMatrix, "materialize", refuse)
        monkeypatch.setattr(FactorizedMatrix, "materialized", refuse)
    est = FactorizedLogisticRegressionCV(Cs=Cs, cv=cv, strategy=strategy, **EXACT)
    _assert_same_search(est.fit(ds, y), ref)


def test_repeated_training_rows_count_as_often_as_given():
    ds, y, T = _data(2, seed=12)
    rng = np.random.default_rng(0)
    cv = [(rng.integers(0, len(y), len(y)), np.arange(40)) for _ in range(2)]
    ref = _sk_cv(Cs=3, cv=cv, **EXACT).fit(T, y)
    est = FactorizedLogisticRegressionCV(Cs=3, cv=cv, **EXACT).fit(ds, y)
    _assert_same_search(est, ref)


def test_folds_given_as_masks_or_negative_indices():
    ds, y, _ = _data(2, seed=12)
    n = len(y)
    mask = np.arange(n) % 3 == 0
    as_index = [(np.flatnonzero(~mask), np.flatnonzero(mask))]
    est = FactorizedLogisticRegressionCV(Cs=3, cv=as_index, **EXACT).fit(ds, y)
    for cv in ([(~mask, mask)], [(np.flatnonzero(~mask) - n, np.flatnonzero(mask))]):
        other = FactorizedLogisticRegressionCV(Cs=3, cv=cv, **EXACT).fit(ds, y)
        np.testing.assert_array_equal(other.scores_, est.scores_)
        np.testing.assert_array_equal(other.coefs_paths_, est.coefs_paths_)


def test_callable_scorer_gets_the_fold_rows():
    ds, y, T = _data(2, seed=13)
    seen = []

    def scorer(est, X, y_test):
        seen.append((type(X), X.shape[0], y_test.shape[0]))
        return float(np.mean(est.predict(X) == y_test))

    est = FactorizedLogisticRegressionCV(Cs=3, cv=3, scoring=scorer, **EXACT)
    est.fit(ds, y)
    accuracy = FactorizedLogisticRegressionCV(Cs=3, cv=3, **EXACT).fit(ds, y)
    np.testing.assert_array_equal(est.scores_, accuracy.scores_)
    assert len(seen) == 9
    assert all(t is MultiSourceDataset and n == m for t, n, m in seen)
    assert sum(n for _, n, _ in seen) == 3 * len(y)


def test_score_uses_scoring():
    ds, y, _ = _data(3, seed=14)
    est = FactorizedLogisticRegressionCV(Cs=3, cv=3, scoring="neg_log_loss")
    est.fit(ds, y)
    assert est.score(ds, y) == pytest.approx(get_scorer("neg_log_loss")(est, ds, y))
    assert est.score(ds, y) < 0
    est.set_params(scoring=None)
    assert est.score(ds, y) == pytest.approx(np.mean(est.predict(ds) == y))


# --------------------------------------------------------------- composition
def test_pipeline_after_scaler_matches_sklearn():
    ds, y, T = _data(2, seed=15)
    kw = dict(Cs=5, cv=3, **EXACT)
    pipe = make_pipeline(
        FactorizedStandardScaler(), FactorizedLogisticRegressionCV(**kw)
    )
    ref = make_pipeline(StandardScaler(), _sk_cv(**kw))
    pipe.fit(ds, y)
    ref.fit(T, y)
    _assert_same_search(pipe[-1], ref[-1])
    assert_close(pipe.predict_proba(ds), ref.predict_proba(T), kind="iterative")
    scores = cross_val_score(pipe, ds, y, cv=3)
    np.testing.assert_allclose(scores, cross_val_score(ref, T, y, cv=3))

    restored = pickle.loads(pickle.dumps(pipe))
    np.testing.assert_array_equal(restored.predict(ds), pipe.predict(ds))
    fresh = clone(pipe[-1])
    assert fresh.get_params() == pipe[-1].get_params() | {"cv": 3}
    assert not hasattr(fresh, "coef_")


# ---------------------------------------------------------------- bad input
def test_bad_input():
    ds, y, _ = _data(2, seed=16)
    with pytest.raises(ValueError, match="penalty='l1' is not supported"):
        FactorizedLogisticRegressionCV(penalty="l1").fit(ds, y)
    with pytest.raises(InvalidParameterError):
        FactorizedLogisticRegressionCV(solver="saga").fit(ds, y)
    with pytest.raises(InvalidParameterError):
        FactorizedLogisticRegressionCV(Cs=0).fit(ds, y)
    with pytest.raises(ValueError, match=r"Cs must be .*\[0.1, -1.0\]"):
        FactorizedLogisticRegressionCV(Cs=[0.1, -1.0]).fit(ds, y)
    with pytest.raises(ValueError, match="at least 2 classes"):
        FactorizedLogisticRegressionCV(cv=2).fit(ds, np.zeros(len(y)))
    with pytest.raises(ValueError, match="class_weight dict must have the class"):
        FactorizedLogisticRegressionCV(class_weight={7: 1.0}).fit(ds, y)
    sw = np.ones(len(y))
    sw[: len(y) // 2] = 0.0
    cv = [(np.arange(len(y) // 2), np.arange(len(y) // 2, len(y)))]
    with pytest.raises(ValueError, match="training rows have a total weight of 0"):
        FactorizedLogisticRegressionCV(cv=cv).fit(ds, y, sample_weight=sw)
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        FactorizedLogisticRegressionCV().fit(ds, np.linspace(0, 1, len(y)))


# -------------------------------------------------------------- other arrays
@pytest.mark.slow
def test_dask_dataset_gives_the_in_memory_search(dask_client):
    da = pytest.importorskip("dask.array", reason="the [dask] extra is not installed")
    from ilargi_sklearn.distributed import dask_dataset

    rng = np.random.default_rng(17)
    n = 400
    base, S1 = rng.standard_normal((n, 3)), rng.standard_normal((20, 4))
    idx1 = rng.integers(-1, 20, n)  # a left join: -1 are unmatched rows
    mem = MultiSourceDataset.from_matrices([base, S1], [None, idx1])
    dds = dask_dataset(
        [da.from_array(base, chunks=(100, 3)), S1],
        [None, da.from_array(idx1, chunks=100)],
    )
    y = (mem @ rng.standard_normal(7) + rng.logistic(size=n) > 0).astype(int)
    # Few evaluations: each one runs a Dask graph. Both fits take the same steps
    # (their objectives differ in the order of reductions only).
    kw = dict(Cs=[0.1, 10.0], cv=2, tol=1e-6)
    ref = FactorizedLogisticRegressionCV(**kw).fit(mem, y)
    got = FactorizedLogisticRegressionCV(**kw).fit(dds, y)
    assert got.C_ == ref.C_
    assert_close(got.scores_, ref.scores_, kind="device", scale=1.0)
    assert_close(got.coef_, ref.coef_, kind="iterative", scale=1.0)


# ---------------------------------------------------------- the identity models
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize(
    "scoring", [None, "neg_log_loss", "roc_auc_ovr", "accuracy", "f1_macro"]
)
def test_identity_classifier_scores_as_the_model(n_classes, scoring):
    # The searches score the decision values of many candidates at once through
    # an identity model: every scorer gives what it gives the fitted model.
    from ilargi_sklearn.linear_model._scoring import _IdentityClassifier

    if scoring == "roc_auc_ovr" and n_classes == 2:
        scoring = "roc_auc"
    ds, y, _ = _data(n_classes, seed=5)
    y = np.asarray(["a", "b", "c"])[y]  # labels that are not numbers
    model = FactorizedLogisticRegression(C=0.5).fit(ds, y)
    raw = np.reshape(model.decision_function(ds), (len(y), -1))
    identity = _IdentityClassifier(model.classes_)
    np.testing.assert_array_equal(identity.predict(raw), model.predict(ds))
    np.testing.assert_array_equal(identity.predict_proba(raw), model.predict_proba(ds))
    np.testing.assert_array_equal(
        identity.predict_log_proba(raw), model.predict_log_proba(ds)
    )
    scorer = get_scorer(scoring or "accuracy")
    sw = np.random.default_rng(0).random(len(y))
    assert scorer(identity, raw, y, sample_weight=sw) == pytest.approx(
        scorer(model, ds, y, sample_weight=sw), rel=1e-12
    )
