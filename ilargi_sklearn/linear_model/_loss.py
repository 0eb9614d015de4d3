"""Loss, gradient and first-order solver kernels of the factorized linear models.

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
log-link Tweedie losses, a compiled row pass (:func:`_fast_objective`).

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

import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import scipy.sparse as sp
from scipy.special import expit, log_expit, log_softmax, logsumexp, softmax
from sklearn.exceptions import ConvergenceWarning

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable, numba_available
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    is_numpy_namespace,
    namespace_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn.linear_model._glm_numba import fused_glm
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FusedLayout,
    MatrixOperator,
    fused_layout,
)

__all__ = [
    "LOSSES",
    "HalfTweedie",
    "_gradient_descent",
    "_lipschitz_constant",
    "_loss_and_grad",
    "_minimize_lbfgs",
    "_split_coef",
    "release_binomial_plan",
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
    fast = _fast_objective(op, loss)
    if fast is not None:
        try:
            return fast(w, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept)
        except CompiledUnavailable:
            pass  # numba cannot compile here: the array code below runs
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


def _fast_objective(op, loss):
    """The compiled objective of ``op`` for ``loss``, or None (the array code runs).

    The binary logistic loss and the log-link :class:`HalfTweedie` losses of a
    NumPy operator have one (:class:`_FusedBinomial`): its gradient sums are
    accumulated in the same row pass as the predictions, where the array code
    makes four n-length passes. The identity link stays on the array code.
    """
    if isinstance(loss, HalfTweedie) and loss.link == "log":
        power = float(loss.power)
    elif isinstance(loss, str) and loss == "binomial":
        power = None
    else:
        return None
    if not numba_available():
        return None
    plan = _fused_binomial_plan(op)
    if plan is None:
        return None
    if power is None:
        return plan.loss_and_grad
    return lambda *args: plan.loss_and_grad(*args, power)


# ------------------------------- the compiled binomial and log-link GLM objectives
def _glm_layout(op):
    """A :class:`FusedLayout` of a NumPy operator for the compiled pass, or None.

    Factorized matrices (:func:`fused_layout`) and plain dense or CSR matrices (a
    layout with the matrix as its identity source and no row groups), under
    scaling/centering layers.
    """
    if isinstance(op, AffineOperator):
        if op._xp is not None:
            return None
        inner = _glm_layout(op.base)
        return None if inner is None else inner.with_affine(op.scale, op.offset)
    if isinstance(op, MatrixOperator):
        A = op.A
        if op._xp is not None or not (
            isinstance(A, np.ndarray) or (sp.issparse(A) and A.format == "csr")
        ):
            return None
        m = A.shape[1]
        return FusedLayout(
            A.shape,
            np.dtype(op.dtype),
            A,
            np.arange(m, dtype=np.int64),
            (),
            None,
            None,
            np.ones(m, dtype=np.int64),
        )
    return fused_layout(op)


#: The plans of the operators being fitted (one per operator, not one per
#: evaluation: L-BFGS evaluates the objective 10-100 times). A plan may hold a
#: column-major copy of the identity source: the fit releases it at its end
#: (:func:`release_binomial_plan`).
_binomial_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def release_binomial_plan(op):
    """Drop the plan (and its copies) that :func:`_fused_binomial_plan` kept."""
    _binomial_plans.pop(op, None)


#: Identity sources up to this many columns get a column-major copy in the plan.
_COLUMN_MAJOR_MAX_COLS = 12


def _fused_binomial_plan(op):
    """A :class:`_FusedBinomial` for ``op``, or None (the array code of
    :func:`_loss_and_grad` then runs)."""
    plan = _binomial_plans.get(op, False)
    if plan is False:
        layout = _glm_layout(op)
        plan = None if layout is None else _FusedBinomial(layout)
        _binomial_plans[op] = plan
    return plan


class _FusedBinomial:
    """The binary logistic objective of one operator in compiled row passes, and
    the log-link Tweedie objectives (the same passes with another pointwise loss,
    :func:`~ilargi_sklearn.linear_model._glm_numba.fused_glm`).

    With ``T' = (T - 1 o^T) diag(s)`` and coefficients ``c`` in the coordinates
    of ``T'``, the predictor is ``T' c + b = T e + (b - o . e)`` with ``e = s * c``,
    and ``T = X0 M0^T + sum_g I_g S_g M_g^T`` is read as the identity source's rows
    plus, per row group, one entry of the table ``S_g e_g`` (see
    :func:`~ilargi_sklearn.linear_model._glm_numba.fused_glm`). The gradient
    ``T'^T g = s * (T^T g - o sum(g))`` is assembled from the pass's sums:
    ``X0^T g`` and, per row group, ``S_g^T`` times the sums per source row.
    Unmatched rows (index -1) have zeros in ``T``: they add nothing.

    The rows go through in blocks (:meth:`_block_rows`), each block's products,
    passes and n-length temporaries while they are in the cache.
    """

    def __init__(self, layout):
        n, m = layout.shape
        self.n_cols = m
        self.offset = (
            None if layout.offset is None else np.asarray(layout.offset, float)
        )
        self.scale = None if layout.scale is None else np.asarray(layout.scale, float)
        self.base, self.cols0 = layout.base, layout.base_cols
        X0 = self.base
        if (
            isinstance(X0, np.ndarray)
            and 0 < X0.shape[1] <= _COLUMN_MAJOR_MAX_COLS
            and n >= 2 * self._block_rows(n)
        ):
            # The products X0_b e0 and X0_b^T g of a narrow row-major X0 run as
            # dot products of a few elements per row; on a column-major copy
            # they stream whole columns, faster up to about a dozen columns
            # (beyond, the row-major products win). The copy is made once per
            # fit.
            self.base = np.asfortranarray(X0)
        self.groups = [(g.idx, g.S, g.cols) for g in layout.groups]
        # Each group's entries, then one zero entry for its unmatched rows.
        self.pads = np.asarray([S.shape[0] for _, S, _ in self.groups], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.pads + 1)[:-1]])
        self.offsets = self.offsets.astype(np.int64)
        self.total = int(np.sum(self.pads + 1))

    @staticmethod
    def _block_rows(n):
        """Rows per block: 32,768 (measured best of 8,192-65,536 on one thread),
        all rows when fewer than two blocks' worth."""
        block = 32768
        return n if n < 2 * block else block

    def loss_and_grad(
        self, w, y, sample_weight, sw_sum, l2_reg_strength, fit_intercept, power=None
    ):
        """:func:`_loss_and_grad` for ``loss="binomial"`` (``power`` None) or
        ``HalfTweedie(power, "log")`` (one output)."""
        m = self.n_cols
        coef, intercept = _split_coef(w, m, 1, fit_intercept)
        c = coef[0]
        e = c if self.scale is None else c * self.scale
        bias = float(intercept[0]) if fit_intercept else 0.0
        if self.offset is not None:
            bias -= float(self.offset @ e)
        P = np.zeros(self.total)
        for (_, S, cols), start in zip(self.groups, self.offsets):
            P[start : start + S.shape[0]] = S @ e[cols]
        X0 = self.base
        # In the source's dtype: a float32 source is not copied to float64.
        e0 = None if X0 is None else e[self.cols0].astype(X0.dtype)
        y = np.ascontiguousarray(y, dtype=np.float64)
        sw = (
            None
            if sample_weight is None
            else np.ascontiguousarray(sample_weight, dtype=np.float64)
        )
        idxs = [idx for idx, _, _ in self.groups]
        n = y.shape[0]
        block = self._block_rows(n)
        starts = np.arange(0, n, block)
        # Threads take whole blocks (each block's kernels, BLAS products and NumPy
        # passes on one thread, the GIL released in all three): one hand-out per
        # evaluation, where splitting each block's passes over the threads cost
        # more than it gained. A task sums into its own arrays (summed in task
        # order below): at least 3 blocks and as many rows as its sums have
        # entries, two tasks per thread (two threads: 1.26x at 4e5 rows, 1.33x at
        # 1e6; with tasks of single blocks 0.94x at 1e5, benchmarks/README.md).
        threads = _launcher.n_threads()
        min_rows = max(_launcher.MIN_CHUNK_ROWS["logistic"], self.total)
        min_blocks = -(-min_rows // block)
        n_tasks = _launcher.chunks(starts.size, min_blocks, threads, per_thread=2)
        groups = np.array_split(starts, n_tasks)
        parts = [None] * n_tasks

        def task(t):
            lsum = gsum = 0.0
            bins = np.zeros(self.total)
            g0 = None if X0 is None else np.zeros(e0.shape[0])
            for lo in groups[t]:
                hi = min(n, lo + block)
                Xb = None if X0 is None else X0[lo:hi]
                ls, gs, g, bins_b = fused_glm(
                    None if Xb is None else np.asarray(Xb @ e0, dtype=np.float64),
                    [idx[lo:hi] for idx in idxs],
                    P,
                    self.offsets,
                    self.pads,
                    y[lo:hi],
                    None if sw is None else sw[lo:hi],
                    bias,
                    1,
                    power,
                )
                lsum += ls
                gsum += gs
                bins += bins_b
                if Xb is not None:
                    g0 += Xb.T @ g.astype(X0.dtype, copy=False)
            parts[t] = lsum, gsum, bins, g0

        _launcher.run_tasks(task, n_tasks, threads)
        lsum, gsum, bins, g0 = parts[0]
        for ls, gs, bins_t, g0_t in parts[1:]:
            lsum += ls
            gsum += gs
            bins += bins_t
            if g0 is not None:
                g0 += g0_t
        g_t = np.zeros(m)
        if X0 is not None:
            g_t[self.cols0] += g0
        for (_, S, cols), start in zip(self.groups, self.offsets):
            # Columns may repeat across the terms of one group: add.at sums them.
            np.add.at(g_t, cols, S.T @ bins[start : start + S.shape[0]])
        if self.offset is not None:
            g_t -= self.offset * gsum
        if self.scale is not None:
            g_t *= self.scale
        value = lsum / sw_sum
        grad = np.empty_like(w, dtype=np.float64)
        g_coef, g_intercept = _split_coef(grad, m, 1, fit_intercept)
        g_coef[0] = g_t / sw_sum
        value += _l2_penalty(coef, g_coef, l2_reg_strength)
        if fit_intercept:
            g_intercept[:] = gsum / sw_sum
        return value, grad


def _lipschitz_constant(
    op, sample_weight, sw_sum, l2_reg_strength, fit_intercept, loss, n_power_iter=10
):
    """Estimate of the Lipschitz constant of the gradient of the objective.

    ``L = c * lambda_max(A^T diag(s) A) / s_sum + l2_reg_strength`` with
    ``A = [T, 1]`` (``[T]`` without intercept) and ``c`` the curvature bound of the
    pointwise loss. ``lambda_max`` comes from power iteration on ``A^T diag(s) A``
    (one ``matmul`` and one ``rmatmul`` per step), started from a fixed
    pseudo-random vector so that fits are reproducible.

    Power iteration approaches ``lambda_max`` from below; a step size ``1 / L`` stays
    stable as long as the estimate is above ``lambda_max / 2``; ten steps gave at
    least 0.87 ``lambda_max`` on every test schema and on anisotropic data.
    """
    n_features = op.n_cols
    n_params = n_features + int(fit_intercept)
    # n-length products stay where the operator is; the power-iteration vector is
    # parameter-sized and lives on the host.
    xp, device, dtype = op.xp, op.device, op.dtype
    op_dtype = namespace_dtype(xp, dtype)
    v = np.random.default_rng(0).standard_normal(n_params)
    lam = 0.0
    for _ in range(n_power_iter):
        norm = np.linalg.norm(v)
        if norm == 0:
            break
        v /= norm
        Av = op.matmul(asarray_on(v[:n_features], xp, device, dtype))
        Av = xp.astype(Av, xp.float64, copy=False)
        if fit_intercept:
            Av = Av + float(v[n_features])
        if sample_weight is not None:
            Av = Av * sample_weight
        u = np.empty(n_params)
        u[:n_features] = to_numpy(op.rmatmul(xp.astype(Av, op_dtype, copy=False)))
        if fit_intercept:
            u[n_features] = float(xp.sum(Av))
        lam = float(v @ u)
        v = u
    return _CURVATURE[loss] * lam / sw_sum + l2_reg_strength


def _gradient_descent(loss_and_grad, w0, args, learning_rate, max_iter, tol):
    """Fixed-step gradient descent ``w <- w - learning_rate * grad(w)``.

    Parameters
    ----------
    loss_and_grad : callable
        ``loss_and_grad(w, *args) -> (value, grad)``.
    w0 : ndarray
        Initial parameters (not modified).
    args : tuple
        Extra arguments of ``loss_and_grad``.
    learning_rate : float
        Step size.
    max_iter : int
        Number of steps when ``tol`` is None (the paper's fixed-iteration solver),
        otherwise the most steps.
    tol : float or None
        Stop before a step once ``max |grad| <= tol``.

    Returns
    -------
    w : ndarray
        Final parameters.
    n_iter : int
        Steps taken.
    converged : bool
        Whether the gradient fell below ``tol`` (False when ``tol`` is None).
    """
    w = np.array(w0, dtype=np.float64, copy=True)
    for it in range(max_iter):
        _, grad = loss_and_grad(w, *args)
        if tol is not None and np.max(np.abs(grad), initial=0.0) <= tol:
            return w, it, True
        w -= learning_rate * grad
    if tol is not None:
        _, grad = loss_and_grad(w, *args)
        return w, max_iter, bool(np.max(np.abs(grad), initial=0.0) <= tol)
    return w, max_iter, False


def _minimize_lbfgs(fun, w0, args, max_iter, tol, *, stacklevel=2, context=""):
    """L-BFGS-B on ``fun(w, *args) -> (value, grad)`` with scikit-learn's options.

    ``maxiter=max_iter``, ``maxls=50`` (scipy's default is 20), ``gtol=tol`` and
    ``ftol = 64 eps``, as scikit-learn's ``LogisticRegression`` and GLMs pass them,
    so that both libraries take the same steps to the same optimum.

    Returns
    -------
    w : ndarray
        Final parameters.
    n_iter : int
        Iterations run, at most ``max_iter``.

    Warns
    -----
    ConvergenceWarning
        When L-BFGS stopped before its gradient test passed; ``stacklevel`` points
        the warning at the caller's caller, ``context`` (" for C=0.1") names the
        fit in its message.
    """
    result = scipy.optimize.minimize(
        fun,
        w0,
        method="L-BFGS-B",
        jac=True,
        args=args,
        options={
            "maxiter": max_iter,
            "maxls": 50,
            "gtol": tol,
            "ftol": 64 * np.finfo(float).eps,
        },
    )
    if result.status != 0:
        warnings.warn(
            f"L-BFGS failed to converge{context} after {result.nit} iteration(s) "
            f"(status={result.status}: {result.message}). Increase max_iter="
            f"{max_iter}, or scale the features (for example with "
            "ilargi_sklearn's FactorizedStandardScaler).",
            ConvergenceWarning,
            stacklevel=stacklevel + 1,
        )
    return result.x, min(int(result.nit), max_iter)
