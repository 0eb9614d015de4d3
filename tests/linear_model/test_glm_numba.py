"""The compiled pass of the logistic and log-link Tweedie objectives
(``linear_model/_glm_numba.py``): equal to NumPy."""

import gc
import warnings
import weakref

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, dense, glm_data, plant_compile_failure
from scipy.special import expit
from sklearn.linear_model import LogisticRegression

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn.linear_model import (
    FactorizedGammaRegressor,
    FactorizedLogisticRegression,
    FactorizedPoissonRegressor,
    FactorizedTweedieRegressor,
    _fused_loss,
    _glm_numba,
    _loss,
)
from ilargi_sklearn.linear_model._fused_loss import fused_objective_plan
from ilargi_sklearn.linear_model._loss import HalfTweedie, _loss_and_grad, _objective
from ilargi_sklearn.multisource import AffineOperator, MatrixOperator
from ilargi_sklearn.multisource._operators import fused_layout
from ilargi_sklearn.preprocessing import FactorizedStandardScaler
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

numba = pytest.importorskip("numba")


# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


@pytest.fixture
def spy_plan(monkeypatch):
    """Count the objective evaluations that ran compiled."""
    calls = []
    original = _fused_loss._FusedBinomial.sums

    def spy(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(_fused_loss._FusedBinomial, "sums", spy)
    return calls


def _operators(ds):
    ops = {"factorized": ds.operator, "materialized": ds.operator.materialized()}
    scaled = FactorizedStandardScaler(
        with_mean=not ds.operator.is_sparse
    ).fit_transform(ds)
    ops["scaled"] = scaled.operator
    return ops


def _compiled_objective(
    w, op, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept, n_outputs, loss
):
    """The objective of a fit on ``op`` (compiled where it applies) at ``w``: the
    arguments of ``_loss_and_grad``."""
    objective = _objective(op, loss)
    return objective(
        w, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept, n_outputs
    )


def _numpy_objective(monkeypatch, *args):
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        return _loss_and_grad(*args)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("block", [None, 37], ids=["one-block", "blocks-of-37"])
def test_objective_equals_numpy(scenario, weighted, block, monkeypatch, spy_plan):
    if block is not None:
        # Rows in blocks as on large data (several blocks, a shorter last one).
        monkeypatch.setattr(
            _fused_loss._FusedBinomial, "_block_rows", staticmethod(lambda n: block)
        )
    rng = np.random.default_rng(1)
    ds = random_dataset(2, n_rows=250, scenario=scenario)
    for name, op in _operators(ds).items():
        n, m = op.shape
        y = (rng.random(n) < 0.4).astype(float)
        sw = rng.random(n) + 0.5 if weighted else None
        sw_sum = float(n if sw is None else sw.sum())
        for scale in (0.1, 3.0):  # moderate and saturated predictors
            w = rng.standard_normal(m + 1) * scale
            args = (w, op, y, sw, sw_sum, 0.3, True, 1, "binomial")
            before = len(spy_plan)
            value, grad = _compiled_objective(*args)
            assert len(spy_plan) == before + 1, name
            ref_value, ref_grad = _numpy_objective(monkeypatch, *args)
            tol = 1e-5 if op.dtype == np.float32 else 1e-11
            np.testing.assert_allclose(value, ref_value, rtol=tol, err_msg=name)
            np.testing.assert_allclose(
                grad,
                ref_grad,
                rtol=tol,
                atol=tol * np.abs(ref_grad).max(),
                err_msg=name,
            )


def test_objective_without_intercept_and_penalty(monkeypatch):
    ds = random_dataset(4, n_rows=200, scenario="snowflake")
    rng = np.random.default_rng(0)
    y = (rng.random(200) < 0.5).astype(float)
    w = rng.standard_normal(ds.shape[1])
    args = (w, ds.operator, y, None, 200.0, 0.0, False, 1, "binomial")
    value, grad = _compiled_objective(*args)
    ref_value, ref_grad = _numpy_objective(monkeypatch, *args)
    np.testing.assert_allclose(value, ref_value, rtol=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-11, atol=1e-14)


def test_loss_is_accurate_for_extreme_predictors():
    # Far in the tails log(1 + exp(z)) is exp(z) (z << 0) or z (z >> 0): the
    # kernel keeps full relative accuracy there.
    z = np.array([-745.0, -700.0, -40.0, -1e-9, 0.0, 1e-9, 40.0, 700.0])
    y = np.zeros_like(z)
    none = np.zeros(0, dtype=np.int64)
    lsum, gsum, g, _ = _glm_numba.fused_binomial(
        z, [], np.zeros(0), none, none, y, None, 0.0
    )
    expected = np.logaddexp(0.0, z)
    np.testing.assert_allclose(lsum, expected.sum(), rtol=1e-15)
    lone, _, _, _ = _glm_numba.fused_binomial(
        z[:1], [], np.zeros(0), none, none, y[:1], None, 0.0
    )
    np.testing.assert_allclose(lone, np.exp(-745.0), rtol=1e-12)
    np.testing.assert_allclose(g, expit(z), rtol=1e-15, atol=1e-300)
    np.testing.assert_allclose(gsum, g.sum(), rtol=1e-15)


def test_unmatched_rows_and_bins():
    idx = np.array([0, -1, 2, 0, -1], dtype=np.int64)
    P = np.array([0.5, -1.0, 2.0, 0.0])  # the last entry: unmatched rows
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    sw = np.array([1.0, 2.0, 0.5, 1.0, 3.0])
    _, gsum, g, bins = _glm_numba.fused_binomial(
        None, [idx], P, np.zeros(1, dtype=np.int64), np.array([3]), y, sw, 0.25
    )
    z = 0.25 + np.where(idx >= 0, P[np.maximum(idx, 0)], 0.0)
    np.testing.assert_allclose(g, sw * (1 / (1 + np.exp(-z)) - y), rtol=1e-15)
    np.testing.assert_allclose(bins, [g[0] + g[3], 0.0, g[2], g[1] + g[4]], rtol=1e-15)
    np.testing.assert_allclose(gsum, g.sum(), rtol=1e-15)


def test_plan_covers_numpy_operators_only():
    ds = random_dataset(0, n_rows=50, scenario="sparse")
    assert fused_objective_plan(ds.operator) is not None
    A = ds.materialize("dense")
    assert fused_objective_plan(MatrixOperator(np.asarray(A))) is not None
    assert fused_objective_plan(MatrixOperator(sp.csr_matrix(A))) is not None
    # Centering a CSR source is left to the NumPy path.
    m = ds.shape[1]
    centered = AffineOperator(ds.operator, scale=np.ones(m), offset=np.ones(m))
    assert fused_objective_plan(centered) is None


@pytest.mark.parametrize("scenario", ["star", "left", "sparse", "float32", "overlap"])
def test_fit_equals_numpy_and_sklearn(scenario, monkeypatch, spy_plan):
    ds = random_dataset(6, n_rows=400, scenario=scenario)
    rng = np.random.default_rng(2)
    A = dense(ds)
    y = (A @ rng.standard_normal(A.shape[1]) + rng.standard_normal(400) > 0).astype(int)
    kw = dict(C=0.5, tol=1e-10, max_iter=500)
    est = FactorizedLogisticRegression(**kw).fit(ds, y)
    assert spy_plan
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedLogisticRegression(**kw).fit(ds, y)
    sk = LogisticRegression(**kw).fit(A.astype(np.float64), y)
    # float32 data: the two paths round the products differently (the compiled
    # one accumulates in float64), both within float32 accuracy of the optimum.
    rtol = 1e-4 if ds.dtype == np.float64 else 2e-3
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=rtol, atol=1e-6)
    np.testing.assert_allclose(est.coef_, sk.coef_, rtol=rtol, atol=1e-5)
    np.testing.assert_allclose(est.intercept_, sk.intercept_, rtol=rtol, atol=1e-5)
    np.testing.assert_allclose(
        est.predict_proba(ds), sk.predict_proba(A), rtol=rtol, atol=1e-6
    )


@pytest.mark.parametrize("scenario", ["star", "float32"])
def test_narrow_base_column_major_copy_lives_for_the_fit(scenario, monkeypatch):
    # On data of several row blocks a narrow dense identity source is copied
    # column-major for the products; the fit is the same, and the copy is
    # released with the plan when the fit ends.
    monkeypatch.setattr(
        _fused_loss._FusedBinomial, "_block_rows", staticmethod(lambda n: 37)
    )
    ds = random_dataset(5, n_rows=300, scenario=scenario)
    op = ds.operator
    y = (ds.materialize("dense")[:, 0] > 0).astype(int)
    seen, plans = [], []
    original = _fused_loss._FusedBinomial.sums

    def spy(self, *args):
        seen.append(self.base)
        plans.append(weakref.ref(self))
        return original(self, *args)

    monkeypatch.setattr(_fused_loss._FusedBinomial, "sums", spy)
    kw = dict(C=0.5, tol=1e-10, max_iter=500)
    est = FactorizedLogisticRegression(**kw).fit(ds, y)
    X0 = fused_layout(op).base
    assert isinstance(X0, np.ndarray) and X0.flags.c_contiguous
    assert seen and all(b.flags.f_contiguous and b.dtype == X0.dtype for b in seen)
    np.testing.assert_array_equal(seen[0], X0)
    # The plan (and its copy) went with the fit's objective.
    gc.collect()
    assert plans and all(plan() is None for plan in plans)
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedLogisticRegression(**kw).fit(ds, y)
    rtol = 1e-6 if ds.dtype == np.float64 else 2e-3
    atol = rtol * np.abs(ref.coef_).max()
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=rtol, atol=atol)


def test_compile_failure_falls_back_to_numpy(monkeypatch, caplog):
    ds = random_dataset(3, scenario="star", n_rows=300)
    y = np.arange(300) % 2
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedLogisticRegression().fit(ds, y)

    def broken(*args):
        raise numba.core.errors.TypingError("planted compile failure")

    monkeypatch.setitem(_launcher._state, "numba", _launcher._import_numba())
    monkeypatch.setattr(_launcher, "_kernel", lambda name: broken)
    with caplog.at_level("WARNING", logger=_launcher.__name__):
        est = FactorizedLogisticRegression().fit(ds, y)
    assert "could not compile" in caplog.text
    assert not _launcher.numba_available()
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-10)


# ------------------------------------------------ the log-link Tweedie losses
TWEEDIE_POWERS = [1.0, 1.5, 2.0, 3.0]


def _tweedie_target(rng, n, power):
    """Positive draws, with zeros where the power's domain has them (p < 2)."""
    y = rng.gamma(2.0, 1.0, n)
    if power < 2:
        y[rng.random(n) < 0.3] = 0.0
    return y


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("power", TWEEDIE_POWERS)
@pytest.mark.parametrize(
    "variant", ["plain", "weighted", "no-intercept", "blocks-of-37"]
)
def test_tweedie_objective_equals_numpy(scenario, power, variant, monkeypatch):
    calls = []
    original = _fused_loss._FusedBinomial.sums

    def spy(self, *args):
        calls.append(self.power)
        return original(self, *args)

    monkeypatch.setattr(_fused_loss._FusedBinomial, "sums", spy)
    if variant == "blocks-of-37":
        monkeypatch.setattr(
            _fused_loss._FusedBinomial, "_block_rows", staticmethod(lambda n: 37)
        )
    rng = np.random.default_rng(3)
    ds = random_dataset(2, n_rows=250, scenario=scenario)
    fit_intercept = variant != "no-intercept"
    loss = HalfTweedie(power)
    for name, op in _operators(ds).items():
        n, m = op.shape
        y = _tweedie_target(rng, n, power)
        sw = rng.random(n) + 0.5 if variant == "weighted" else None
        sw_sum = float(n if sw is None else sw.sum())
        for scale in (0.1, 1.0):  # near the intercept-only start, and far
            w = rng.standard_normal(m + int(fit_intercept)) * scale / np.sqrt(m)
            args = (w, op, y, sw, sw_sum, 0.3, fit_intercept, 1, loss)
            before = len(calls)
            value, grad = _compiled_objective(*args)
            assert calls[before:] == [power], name
            ref_value, ref_grad = _numpy_objective(monkeypatch, *args)
            assert_close(
                value, ref_value, dtype=op.dtype, kind="compiled", err_msg=name
            )
            assert_close(
                grad,
                ref_grad,
                dtype=op.dtype,
                kind="compiled",
                scale=np.abs(ref_grad).max(),
                err_msg=name,
            )


@pytest.mark.parametrize("power", [0.0, *TWEEDIE_POWERS])
def test_tweedie_pointwise_equals_half_tweedie(power):
    # From small to large predictors, and targets at the domain's edge (y = 0);
    # the exact values of HalfTweedie's losses and derivatives, weighted.
    rng = np.random.default_rng(4)
    z = np.concatenate([np.linspace(-30.0, 30.0, 61), rng.standard_normal(40)])
    y = _tweedie_target(rng, z.size, power)
    sw = rng.random(z.size) + 0.5
    none = np.zeros(0, dtype=np.int64)
    lsum, gsum, g, _ = _glm_numba.fused_glm(
        z, [], np.zeros(0), none, none, y, sw, 0.0, power=power
    )
    values, grad = HalfTweedie(power).pointwise(np, z, y)
    assert_close(g, sw * grad, kind="compiled", scale=1e-300)
    assert_close(lsum, np.sum(sw * values), kind="compiled")
    assert_close(
        gsum, np.sum(sw * grad), kind="compiled", scale=np.abs(sw * grad).max()
    )


@pytest.mark.parametrize("power", TWEEDIE_POWERS)
def test_tweedie_overflow_is_not_finite_as_in_numpy(power):
    # A trial step of the line search far out: exp overflows, the value is inf or
    # NaN in both paths (L-BFGS rejects it), and nothing warns.
    z = np.array([-2000.0, 2000.0, 0.5])
    y = np.array([0.0 if power < 2 else 1.0, 2.0, 1.0])
    none = np.zeros(0, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lsum, _, g, _ = _glm_numba.fused_glm(
            z, [], np.zeros(0), none, none, y, None, 0.0, power=power
        )
        values, grad = HalfTweedie(power).pointwise(np, z, y)
    assert not np.isfinite(lsum) and not np.isfinite(values.sum())
    np.testing.assert_array_equal(g, grad)


def test_identity_link_and_other_losses_stay_on_the_array_code(monkeypatch):
    op = random_dataset(0, n_rows=50, scenario="star").operator
    powers = []

    def plan(op, power=None):
        powers.append(power)
        return fused_objective_plan(op, power)

    monkeypatch.setattr(_loss, "fused_objective_plan", plan)
    for loss in (HalfTweedie(1.5, "identity"), HalfTweedie(0.0, "identity")):
        _objective(op, loss)
    _objective(op, "squared")
    _objective(op, "multinomial")
    assert powers == []
    _objective(op, HalfTweedie(1.5))
    _objective(op, "binomial")
    assert powers == [1.5, None]


GLM_FITS = [
    (FactorizedPoissonRegressor, {}, "poisson", 1.0),
    (FactorizedGammaRegressor, {}, "gamma", 2.0),
    (FactorizedTweedieRegressor, {"power": 1.5}, "poisson", 1.5),
    (FactorizedTweedieRegressor, {"power": 3.0}, "gamma", 3.0),
]


@pytest.mark.parametrize("Est, params, family, power", GLM_FITS)
@pytest.mark.parametrize("scenario", ["star", "sparse", "float32"])
def test_glm_fit_runs_compiled_and_equals_numpy(
    Est, params, family, power, scenario, monkeypatch
):
    calls = []
    original = _fused_loss._FusedBinomial.sums

    def spy(self, *args):
        calls.append(self.power)
        return original(self, *args)

    monkeypatch.setattr(_fused_loss._FusedBinomial, "sums", spy)
    ds, y = glm_data(7, scenario=scenario, n_rows=300, family=family)
    kw = dict(alpha=1e-3, tol=1e-10, max_iter=1000, **params)
    est = Est(**kw).fit(ds, y)
    assert calls and set(calls) == {power}
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = Est(**kw).fit(ds, y)
    assert_close(
        est.coef_,
        ref.coef_,
        kind="fit" if ds.dtype == np.float64 else "iterative",
        scale=np.abs(ref.coef_).max(),
    )


def test_glm_compile_failure_falls_back_to_numpy(monkeypatch, caplog):
    ds, y = glm_data(3, scenario="star", n_rows=300, family="poisson")
    with monkeypatch.context() as m:
        m.setenv(_launcher.NO_NUMBA_ENV, "1")
        ref = FactorizedPoissonRegressor(alpha=1e-3).fit(ds, y)
    plant_compile_failure(monkeypatch, "binomial_derivative")
    with caplog.at_level("WARNING", logger=_launcher.__name__):
        est = FactorizedPoissonRegressor(alpha=1e-3).fit(ds, y)
    assert "could not compile" in caplog.text
    assert not _launcher.numba_available()
    np.testing.assert_allclose(est.coef_, ref.coef_, rtol=1e-10)


def test_a_fit_makes_its_compiled_objective_once(monkeypatch, spy_plan):
    # Chosen once per fit (not looked up per evaluation), made once per path of
    # Cs, and gone with the fit.
    made = []
    original = _fused_loss._FusedBinomial.__init__

    def init(self, *args, **kwargs):
        made.append(weakref.ref(self))
        original(self, *args, **kwargs)

    monkeypatch.setattr(_fused_loss._FusedBinomial, "__init__", init)
    ds = random_dataset(6, n_rows=400, scenario="star")
    y = dense(ds)[:, 0] + 0.5 * np.random.default_rng(0).random(400) > 0.5
    FactorizedLogisticRegression(C=0.5, tol=1e-10, max_iter=500).fit(ds, y)
    assert len(made) == 1 and len(spy_plan) > 5
    FactorizedPoissonRegressor(alpha=1e-3).fit(ds, np.exp(dense(ds)[:, 0] / 4))
    assert len(made) == 2
    gc.collect()
    assert all(plan() is None for plan in made)
