"""Losses and the objective of the factorized linear models fitted by a
first-order solver (:mod:`._optimize`).

Every function here is a pure function over the operator protocol
(:class:`~ilargi_sklearn.multisource.Operator`): the data enter only through
``op.matmul`` (``T @ W``) and ``op.rmatmul`` (``T.T @ G``), so one kernel serves the
factorized plan (a normalized matrix over several sources) and the materialized
plan (a plain matrix) alike, in any array namespace: ``xp`` is the operator's
(NumPy, CuPy, ``array_api_strict``, Dask). The n-length arrays (raw predictions,
pointwise losses and gradients, targets, weights) live where the operator does; the
flat parameters (host, float64, what scipy's L-BFGS works on) cross once per
evaluation. NumPy gets two faster variants, each chosen in one place: the elementwise
functions of SciPy (:func:`_special`) and, for the binary logistic loss and the
log-link Tweedie losses, a compiled row pass (:mod:`._fused_loss`), chosen once per
fit by :func:`_objective`.

The objective is scikit-learn's ``LinearModelLoss``::

    loss(w) = 1 / s_sum * sum_i s_i l(y_i, T_i W^T + b) + l2_reg_strength / 2 ||W||^2

with sample weights ``s`` (ones by default), ``s_sum = sum_i s_i`` and the intercept
``b`` not penalized. The pointwise losses ``l`` are

* ``"squared"``: ``1/2 ||raw - y||^2`` (least squares, one column per target);
* ``"binomial"``: ``log(1 + exp(raw)) - y raw`` with ``y`` in {0, 1} (scikit-learn's
  ``HalfBinomialLoss``);
* ``"multinomial"``: ``logsumexp(raw) - raw_y`` over ``n_classes`` columns
  (``HalfMultinomialLoss``, softmax link);
* a :class:`HalfTweedie` instance: half the Tweedie deviance of power ``p`` with a
  log or identity link (scikit-learn's ``HalfTweedieLoss`` and
  ``HalfTweedieLossIdentity``; ``p=1`` with the log link is ``HalfPoissonLoss``,
  ``p=2`` ``HalfGammaLoss``), the losses of the generalized linear models.

Parameters are a flat float64 vector, the ravelled C-order array of shape
``(n_outputs, n_features + fit_intercept)``: row ``k`` holds the coefficients of
output ``k`` followed by its intercept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import expit, log_expit, log_softmax, logsumexp, softmax

from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    is_numpy_namespace,
    namespace_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn.linear_model._fused_loss import fused_objective_plan

__all__ = [
    "LOSSES",
    "HalfTweedie",
    "_loss_and_grad",
    "_objective",
    "_split_coef",
]

LOSSES = ("squared", "binomial", "multinomial")

# Upper bounds of the second derivative of each pointwise loss with respect to the
# raw prediction: 1 for the squared loss, 1/4 for the logistic loss, 1/2 for the
# softmax cross-entropy (the largest eigenvalue of diag(p) - p p^T).
_CURVATURE = {"squared": 1.0, "binomial": 0.25, "multinomial": 0.5}


def _split_coef(w, n_features, n_outputs, fit_intercept):
    """Split flat parameters into ``coef`` (n_outputs, n_features) and intercept.

    Returns
    -------
    coef : ndarray of shape (n_outputs, n_features)
        A view on ``w``.
    intercept : ndarray of shape (n_outputs,) or None
        A view on ``w``; None without an intercept.
    """
    W = w.reshape(n_outputs, n_features + int(fit_intercept))
    if fit_intercept:
        return W[:, :n_features], W[:, n_features]
    return W, None


def _l2_penalty(coef, g_coef, l2_reg_strength):
    """``l2_reg_strength / 2 ||coef||^2``; adds its gradient to ``g_coef`` in place."""
    if l2_reg_strength <= 0:
        return 0.0
    g_coef += l2_reg_strength * coef
    return 0.5 * l2_reg_strength * float(np.sum(coef * coef))


class _StandardSpecial:
    """The elementwise functions of the losses in any array-API namespace.

    Written with the standard's functions only, each stable for large ``|z|``.
    """

    def __init__(self, xp):
        self.xp = xp

    def log1pexp(self, z):
        """``log(1 + exp(z))``."""
        return self.xp.logaddexp(self.xp.zeros_like(z), z)

    def expit(self, z):
        """The logistic sigmoid, as ``exp(-log(1 + exp(-z)))`` (no overflow)."""
        return self.xp.exp(-self.log1pexp(-z))

    def log_expit(self, z):
        """``log(expit(z)) = -log(1 + exp(-z))``."""
        return -self.log1pexp(-z)

    def logsumexp(self, raw):
        """``log(sum(exp(raw), axis=1))``, shifted by the row maxima."""
        xp = self.xp
        top = xp.max(raw, axis=1)
        return top + xp.log(xp.sum(xp.exp(raw - top[:, None]), axis=1))

    def log_softmax(self, raw):
        return raw - self.logsumexp(raw)[:, None]

    def softmax(self, raw):
        return self.xp.exp(self.log_softmax(raw))

    def rowdot(self, a, b):
        """``sum(a * b, axis=1)``."""
        return self.xp.sum(a * b, axis=1)


class _NumpySpecial:
    """:class:`_StandardSpecial` on NumPy, by SciPy's and NumPy's own kernels.

    One pass each without temporaries (``expit``, ``logsumexp`` and the row dot
    products of ``einsum``), and the same functions as scikit-learn's losses, so
    NumPy results round as scikit-learn's do.
    """

    @staticmethod
    def log1pexp(z):
        return np.logaddexp(0.0, z)

    expit = staticmethod(expit)
    log_expit = staticmethod(log_expit)

    @staticmethod
    def logsumexp(raw):
        return logsumexp(raw, axis=1)

    @staticmethod
    def log_softmax(raw):
        return log_softmax(raw, axis=1)

    @staticmethod
    def softmax(raw):
        return softmax(raw, axis=1)

    @staticmethod
    def rowdot(a, b):
        return np.einsum("ij,ij->i", a, b)


def _special(xp):
    """The elementwise functions of the losses for namespace ``xp``: SciPy's on
    NumPy (the standard has no ``expit`` or ``logsumexp``), standard-only elsewhere.
    """
    if is_numpy_namespace(xp):
        return _NumpySpecial
    return _StandardSpecial(xp)


def _class_probabilities(scores, xp, log=False):
    """The class probabilities (``log``: their logarithms, computed stably) of a
    linear classifier's decision values: the inverse link of ``"binomial"``
    (1-D ``scores``, the score of the second class: two columns) and of
    ``"multinomial"`` (2-D, softmax)."""
    f = _special(xp)
    if scores.ndim == 1:
        if log:
            return xp.stack([f.log_expit(-scores), f.log_expit(scores)], axis=1)
        p = f.expit(scores)
        return xp.stack([1.0 - p, p], axis=1)
    return f.log_softmax(scores) if log else f.softmax(scores)


def _raw_prediction(op, coef, intercept):
    """``T @ coef.T + intercept`` as float64 of shape (n_samples, n_outputs).

    The product runs in the operator's dtype (a float32 operator stays float32:
    mixing dtypes would make NumPy upcast a copy of the whole matrix on each call);
    the cheap per-sample arithmetic after it runs in float64. The parameters
    (host arrays) go to the operator's device.
    """
    xp, device = op.xp, op.device
    coef = asarray_on(coef, xp, device, op.dtype)
    if coef.shape[0] == 1:
        # One output: a 1-D right-hand side takes the faster gather path.
        raw = op.matmul(coef[0, :])[:, None]
    else:
        raw = op.matmul(xp.matrix_transpose(coef))
    raw = xp.astype(raw, xp.float64, copy=False)
    if intercept is not None:
        raw = raw + asarray_on(intercept, xp, device, np.float64)
    return raw


@dataclass(frozen=True)
class HalfTweedie:
    """Half the Tweedie deviance of power ``power``, with a log or identity link.

    The pointwise losses and their derivatives with respect to the raw prediction
    ``r`` are scikit-learn's, constant terms dropped alike (so that fits and scores
    agree with its GLMs): with the log link (``HalfTweedieLoss``, mean
    ``exp(r)``), ``p=0``: ``(exp(r) - y)^2 / 2``; ``p=1``: ``exp(r) - y r``
    (``HalfPoissonLoss``); ``p=2``: ``r + y exp(-r)`` (``HalfGammaLoss``); other
    ``p``: ``exp((2-p) r) / (2-p) - y exp((1-p) r) / (1-p)``. With the identity
    link (``HalfTweedieLossIdentity``, mean ``r``) the full half deviance, whose
    minimum is zero.

    Parameters
    ----------
    power : float
        Tweedie power ``p``.
    link : {"log", "identity"}, default="log"
        Link function.
    """

    power: float
    link: str = "log"

    def y_domain(self):
        """``(low, closed)``: ``y`` must be ``>= low`` (``closed``) or ``> low``;
        ``low=None`` for any real ``y``."""
        p = self.power
        if p <= 0:
            return None, False
        return 0.0, p < 2

    def in_y_range(self, xp, y):
        """Whether every target is in the loss' domain (``y`` finite already)."""
        low, closed = self.y_domain()
        if low is None:
            return True
        return bool(xp.all(y >= low) if closed else xp.all(y > low))

    def link_fn(self, xp, mean):
        """The link: the raw prediction of a mean."""
        return xp.log(mean) if self.link == "log" else mean

    def inverse(self, xp, raw):
        """The inverse link: the mean of a raw prediction."""
        return xp.exp(raw) if self.link == "log" else raw

    def pointwise(self, xp, raw, y):
        """Pointwise losses and their derivatives, both of shape (n_samples,)."""
        # Trial steps of L-BFGS' line search may leave the mean's domain (r <= 0
        # for the identity link) or overflow exp: they get NaN or inf and are
        # rejected, as in scikit-learn (whose compiled losses do not warn), without
        # NumPy's warnings on the way.
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            if self.link == "log":
                return self._log_pointwise(xp, raw, y, float(self.power))
            return self._identity_pointwise(xp, raw, y, float(self.power))

    @staticmethod
    def _log_pointwise(xp, raw, y, p):
        if p == 0:
            mean = xp.exp(raw)
            return 0.5 * (mean - y) ** 2, mean * (mean - y)
        if p == 1:
            mean = xp.exp(raw)
            return mean - y * raw, mean - y
        if p == 2:
            inv = xp.exp(-raw)
            return raw + y * inv, 1.0 - y * inv
        e1 = xp.exp((1.0 - p) * raw)
        e2 = xp.exp((2.0 - p) * raw)
        return e2 / (2.0 - p) - y * e1 / (1.0 - p), e2 - y * e1

    @staticmethod
    def _identity_pointwise(xp, raw, y, p):
        if p == 0:
            residual = raw - y
            return 0.5 * residual * residual, residual
        positive = y > 0
        if p == 1:
            # y log(y / r) is 0 at y = 0 (scikit-learn's loss is then r).
            ylog = xp.where(positive, y * xp.log(xp.where(positive, y, 1.0) / raw), 0.0)
            return ylog + raw - y, 1.0 - y / raw
        if p == 2:
            return xp.log(raw / y) + y / raw - 1.0, (raw - y) / (raw * raw)
        tmp = raw ** (1.0 - p)
        values = raw * tmp / (2.0 - p) - y * tmp / (1.0 - p)
        y_pos = xp.where(positive, y, 0.0)
        values = values + xp.where(
            positive, y_pos ** (2.0 - p) / ((1.0 - p) * (2.0 - p)), 0.0
        )
        return values, tmp * (1.0 - y / raw)

    def constant(self, xp, y):
        """The dropped terms (scikit-learn's ``constant_to_optimal_zero``): with
        them added, a perfect prediction has zero loss."""
        p = float(self.power)
        if self.link != "log" or p == 0:
            return xp.zeros_like(y)
        if p == 1:
            positive = y > 0
            return xp.where(positive, y * xp.log(xp.where(positive, y, 1.0)), 0.0) - y
        if p == 2:
            return -xp.log(y) - 1.0
        y_pos = xp.where(y > 0, y, 0.0)
        return y_pos ** (2.0 - p) / ((1.0 - p) * (2.0 - p))


def _pointwise(xp, raw, y, loss):
    """Pointwise losses (n_samples,) and their gradients (n_samples, n_outputs)."""
    if isinstance(loss, HalfTweedie):
        values, grad = loss.pointwise(xp, raw[:, 0], y)
        return values, grad[:, None]
    f = _special(xp)
    if loss == "squared":
        residual = raw - y
        return 0.5 * f.rowdot(residual, residual), residual
    if loss == "binomial":
        z = raw[:, 0]
        # log(1 + exp(z)) - y z, stable for large |z|.
        values = f.log1pexp(z) - y * z
        return values, (f.expit(z) - y)[:, None]
    if loss == "multinomial":
        lse = f.logsumexp(raw)
        values = lse - f.rowdot(y, raw)
        proba = xp.exp(raw - lse[:, None])
        return values, proba - y
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}.")


def _loss_and_grad(
    w, op, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept, n_outputs, loss
):
    """Objective value and gradient, with the data touched only by two products.

    Parameters
    ----------
    w : ndarray of shape (n_outputs * (n_features + fit_intercept),)
        Flat parameters (see the module docstring for the layout), on the host.
    op : Operator
        The design matrix ``T`` of shape (n_samples, n_features).
    y : array
        Targets in the loss' encoding, where ``op`` lives: shape (n_samples,) with
        values in {0, 1} for ``"binomial"``, one-hot (n_samples, n_classes) for
        ``"multinomial"``, (n_samples, n_outputs) for ``"squared"``, (n_samples,)
        in the loss' domain for a :class:`HalfTweedie` loss.
    sample_weight : array of shape (n_samples,) or None
        Sample weights where ``op`` lives; None for unit weights.
    sw_sum : float
        ``sum(sample_weight)`` (``n_samples`` for unit weights).
    l2_reg_strength : float
        Strength of the L2 penalty on the coefficients (not on the intercept).
    fit_intercept : bool
        Whether the last parameter of each output is an intercept.
    n_outputs : int
        Number of outputs (1 for binomial and the Tweedie losses, n_classes for
        multinomial).
    loss : {"squared", "binomial", "multinomial"} or HalfTweedie
        Pointwise loss.

    Returns
    -------
    value : float
        ``loss(w)``.
    grad : ndarray of the shape of ``w``, float64
        Its gradient, on the host. The coefficient part is
        ``T^T (s * dloss/draw) / s_sum + l2_reg_strength * W``: one ``rmatmul``.
    """
    xp = op.xp
    n_features = op.n_cols
    coef, intercept = _split_coef(w, n_features, n_outputs, fit_intercept)
    raw = _raw_prediction(op, coef, intercept)
    values, grad_raw = _pointwise(xp, raw, y, loss)
    if sample_weight is not None:
        values = values * sample_weight
        grad_raw = grad_raw * sample_weight[:, None]
    grad_raw /= sw_sum
    value = float(xp.sum(values)) / sw_sum

    grad = np.empty_like(w, dtype=np.float64)
    g_coef, g_intercept = _split_coef(grad, n_features, n_outputs, fit_intercept)
    rhs = xp.astype(grad_raw, namespace_dtype(xp, op.dtype), copy=False)
    if n_outputs == 1:
        g_coef[0] = to_numpy(op.rmatmul(rhs[:, 0]))
    else:
        g_coef[:] = to_numpy(op.rmatmul(rhs)).T
    value += _l2_penalty(coef, g_coef, l2_reg_strength)
    if fit_intercept:
        g_intercept[:] = to_numpy(sum_axis0(grad_raw, xp))
    return value, grad


# ------------------------------------------------------ the objective of a fit
def _objective(op, loss):
    """The objective of one fit on ``op``: ``fun(w, y, sample_weight, sw_sum,
    l2_reg_strength, fit_intercept, n_outputs) -> (value, grad)``, the arguments
    and results of :func:`_loss_and_grad`.

    The one place where the compiled variant is chosen, once per fit (as
    :func:`~ilargi_sklearn.cluster._kmeans._lloyd_steps` chooses the Lloyd
    steps): the binary logistic loss and the log-link :class:`HalfTweedie`
    losses of a NumPy operator get a compiled row pass
    (:func:`~ilargi_sklearn.linear_model._fused_loss.fused_objective_plan`) where
    numba runs, which accumulates the gradient's sums in the same pass as the
    predictions; every other loss, operator and namespace the array code of
    :func:`_loss_and_grad`, which is also what runs for the rest of the fit when
    the compiled pass cannot compile here. The plan (per-fit tables, a
    column-major copy of a narrow identity source) lives as long as the returned
    function: dropping it at the end of the fit releases them.
    """
    plan = None
    if isinstance(loss, HalfTweedie):
        power = float(loss.power) if loss.link == "log" else False
    else:
        power = None if (isinstance(loss, str) and loss == "binomial") else False
    if power is not False and numba_available():
        plan = fused_objective_plan(op, power)

    def fun(w, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept, n_outputs):
        nonlocal plan
        if plan is not None:
            try:
                return _fused_loss_and_grad(
                    plan, w, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept
                )
            except CompiledUnavailable:
                plan = None  # numba cannot compile here: the array code from now on
        return _loss_and_grad(
            w,
            op,
            y,
            sample_weight,
            sw_sum,
            l2_reg_strength,
            fit_intercept,
            n_outputs,
            loss,
        )

    return fun


def _fused_loss_and_grad(
    plan, w, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept
):
    """:func:`_loss_and_grad` (one output) from the sums of a compiled row pass
    (:class:`~ilargi_sklearn.linear_model._fused_loss._FusedBinomial`)."""
    n_features = plan.n_cols
    coef, intercept = _split_coef(w, n_features, 1, fit_intercept)
    b = float(intercept[0]) if fit_intercept else 0.0
    lsum, g_t, gsum = plan.sums(coef[0], b, y, sample_weight)
    value = lsum / sw_sum
    grad = np.empty_like(w, dtype=np.float64)
    g_coef, g_intercept = _split_coef(grad, n_features, 1, fit_intercept)
    g_coef[0] = g_t / sw_sum
    value += _l2_penalty(coef, g_coef, l2_reg_strength)
    if fit_intercept:
        g_intercept[:] = gsum / sw_sum
    return value, grad
