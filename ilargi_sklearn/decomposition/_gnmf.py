"""Gaussian NMF (Frobenius loss, multiplicative updates) on the operator protocol.

One kernel, :func:`_fit_multiplicative_update`, a function of an
:class:`~ilargi_sklearn.multisource.Operator` and its array namespace ``xp``, runs the
fit on NumPy, CuPy, ``array_api_strict`` and Dask operators alike. It follows
scikit-learn's ``_fit_multiplicative_update`` for ``beta_loss="frobenius"`` step by
step (update order W then H, ``EPSILON`` replacing zero denominators, the loss
checked every ten iterations), with the only products that touch the data being
``T H^T`` (``matmul``) and ``T^T W`` (``rmatmul``). The Frobenius loss is assembled
from ``||T||_F^2`` and small matrices, so the joined matrix is never built.

The W update, the step that reads the data, comes from one helper,
:func:`_w_update`: the namespace-generic :class:`_ProductNumerator` (one
``matmul`` per ``H``, whole-array operations) by default and, on NumPy, an in-place
pass over row blocks with a compiled element-wise step; on a NumPy factorized
operator (:func:`~ilargi_sklearn.multisource._operators.fused_layout`) ``T H^T`` is
not built at all: :class:`~ilargi_sklearn.decomposition._gnmf_fused._BlockedNumerator`
assembles it block by block from per-source tables inside the pass (numba's
``mu_rows`` where it applies), which takes one n x k array off the peak memory.
The NumPy passes and their compiled steps are in :mod:`._gnmf_fused`.

The initializations (:func:`_initialize_gnmf`, with the randomized SVD of
:mod:`~ilargi_sklearn.decomposition._svd` for NNDSVD) are namespace-generic too;
the random draws always come from scikit-learn's host stream.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from math import sqrt
from numbers import Integral, Real

import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_array, check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, check_non_negative

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_numpy_namespace,
    namespace_dtype,
    numpy_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._plan import DEVICE_OPTIONS, STRATEGIES
from ilargi_sklearn.decomposition._gnmf_fused import (
    _BlockedNumerator,
    _multiplicative_update_w,
)
from ilargi_sklearn.decomposition._svd import _randomized_svd
from ilargi_sklearn.multisource._operators import fused_layout
from ilargi_sklearn.utils._validation import (
    Caller,
    DeviceMixin,
    input_namespace,
    validate_X,
)

__all__ = ["FactorizedGNMF"]

logger = logging.getLogger(__name__)

# scikit-learn's NMF replaces zero denominators by the float32 machine epsilon.
EPSILON = np.finfo(np.float32).eps


# --------------------------------------------------------------------------- kernels
def _trace_dot(xp, X, Y):
    """``trace(X @ Y.T)``: one dot product of the flattened arrays."""
    return float(xp.reshape(X, (-1,)) @ xp.reshape(Y, (-1,)))


def _gram(xp, W):
    """``W^T W``."""
    return xp.matrix_transpose(W) @ W


def _data_mean(op):
    """Mean of all entries of ``T``, from its column sums."""
    n_samples, n_features = op.shape
    return float(np.asarray(to_numpy(op.col_sums()), dtype=np.float64).sum()) / (
        n_samples * n_features
    )


def _norm_sq(op):
    """``||T||_F^2``, from the column sums of squares."""
    return float(np.asarray(to_numpy(op.col_sq_sums()), dtype=np.float64).sum())


def _frobenius_error(norm_X, W, H, XHt, WtW=None):
    """``||T - W H||_F`` without forming ``W H``.

    ``||T - WH||^2 = ||T||^2 + trace(W^T W H H^T) - 2 trace(W^T (T H^T))``, with
    ``XHt = T H^T`` from the latest ``matmul``.

    Parameters
    ----------
    norm_X : float
        ``||T||_F^2``.
    W : array of shape (n_samples, n_components)
    H : array of shape (n_components, n_features)
    XHt : array of shape (n_samples, n_components)
        ``T @ H.T``.
    WtW : array of shape (n_components, n_components), default=None
        ``W.T @ W`` when already known.

    Returns
    -------
    float
    """
    xp = get_namespace(W)
    if WtW is None:
        WtW = _gram(xp, W)
    return _frobenius_error_from_cross(xp, norm_X, WtW, H, _trace_dot(xp, XHt, W))


def _frobenius_error_from_cross(xp, norm_X, WtW, H, cross_prod):
    """:func:`_frobenius_error` from ``W^T W`` and ``cross_prod = trace(W^T T H^T)``."""
    norm_WH = _trace_dot(xp, WtW @ H, H)
    res = (norm_X + norm_WH - 2.0 * cross_prod) / 2.0
    # The expanded form can go a rounding error below zero at a perfect fit.
    return sqrt(2.0 * max(res, 0.0))


def _guard(xp, denominator, eps):
    """``denominator`` with its zeros replaced by ``eps`` (scikit-learn's guard)."""
    return xp.where(denominator == 0, eps, denominator)


def _t_ht(op, xp, H, dtype):
    """``T @ H.T`` in ``dtype`` (one ``matmul``)."""
    XHt = op.matmul(xp.matrix_transpose(H))
    return XHt if XHt.dtype == dtype else xp.astype(XHt, dtype)


# ------------------------------------------------------------ the W update (numerator)
# The kernel reads the data only through a W-update object, made by _w_update:
#
#   use(H)                     H changed: products of the old H are stale
#   update_w(W, HHt, gram, tw) W <- W o (T H^T) / (W H H^T); returns (W, W^T W or None)
#   rmatmul(W)                 T^T W for the W of the latest update (tw=True)
#   cross(W)                   trace(W^T T H^T) for the current H
#   context()                  held around the whole fit
class _ProductNumerator:
    """The namespace-generic W update: ``T H^T`` from one ``matmul`` per ``H``,
    kept until ``H`` changes, and whole-array operations on ``op``'s device.

    On a device ``W`` (the n-length factor) and every n-length product
    (``T H^T``, ``W H H^T``) stay there, and so do ``H`` and the small products, so
    an iteration transfers nothing; only the loss (every ten iterations) crosses,
    as scalars. ``op.hold`` settles a lazy (Dask) ``W`` once per iteration.
    """

    def __init__(self, op, W):
        self.op = op
        self.xp = op.xp
        self.dtype = W.dtype
        self.eps = self.xp.asarray(float(EPSILON), dtype=W.dtype, device=device_of(W))
        self.H = None
        self.XHt = None

    def context(self):
        return contextlib.nullcontext()

    def use(self, H):
        self.H = H
        self.XHt = None

    def _product(self):
        if self.XHt is None:
            self.XHt = _t_ht(self.op, self.xp, self.H, self.dtype)
        return self.XHt

    def update_w(self, W, HHt, gram, tw):
        xp = self.xp
        W = self.op.hold(W * (self._product() / _guard(xp, W @ HHt, self.eps)))
        return W, (_gram(xp, W) if gram else None)

    def rmatmul(self, W):
        return self.op.rmatmul(W)

    def cross(self, W):
        return _trace_dot(self.xp, self._product(), W)


class _HostProductNumerator(_ProductNumerator):
    """:class:`_ProductNumerator` for NumPy: ``W`` updated in place in one pass
    over row blocks (:func:`_multiplicative_update_w`: the element-wise step
    compiled where numba runs, block-sized temporaries only), ``W^T W`` summed in
    the same pass."""

    def __init__(self, op, W):
        super().__init__(op, W)
        n_components = W.shape[1]
        self.WtW = np.empty((n_components, n_components), dtype=W.dtype)
        self.buffers = None

    def _product(self):
        if self.XHt is None:
            # A C-ordered right-hand side, as the row blocks are read.
            XHt = self.op.matmul(np.ascontiguousarray(self.H.T))
            self.XHt = np.asarray(XHt, dtype=self.dtype)
        return self.XHt

    def update_w(self, W, HHt, gram, tw):
        WtW = self.WtW if gram else None
        self.buffers = _multiplicative_update_w(
            self._product(), W, HHt, WtW, self.buffers, eps=EPSILON
        )
        return W, WtW


def _w_update(op, W):
    """The W update of :func:`_fit_multiplicative_update` for ``op`` (and ``W``'s
    dtype).

    The one place where the NumPy fast variants are chosen: a NumPy factorized
    operator whose layout has ``W``'s dtype gets :class:`_BlockedNumerator` (no
    n x k ``T H^T``; numba's fused row update), another NumPy operator the in-place
    row-block pass :class:`_HostProductNumerator`; every other namespace the
    generic :class:`_ProductNumerator`. The NumPy variants update ``W`` in place
    with block-sized work arrays, which other namespaces (immutable arrays, lazy
    graphs, device kernels per operation) do not allow.
    """
    if not is_numpy_namespace(op.xp):
        return _ProductNumerator(op, W)
    layout = fused_layout(op)
    if layout is not None and np.dtype(layout.dtype) == W.dtype:
        return _BlockedNumerator(layout, W.shape[1], W.dtype, EPSILON)
    return _HostProductNumerator(op, W)


def _multiplicative_update_h(xp, op, H, WtW, TtW, eps):
    """``H <- H o (W^T T) / ((W^T W) H)``, with ``TtW = T^T W`` and ``WtW = W^T W``
    of the updated ``W`` (both from the W update)."""
    numerator = xp.matrix_transpose(TtW)
    if numerator.dtype != H.dtype:
        numerator = xp.astype(numerator, H.dtype)
    return op.hold(H * (numerator / _guard(xp, WtW @ H, eps)))


def _fit_multiplicative_update(
    op, W, H, max_iter=200, tol=1e-4, update_H=True, return_error=False, norm_X=None
):
    """Multiplicative updates for the Frobenius loss, as scikit-learn's ``mu`` solver.

    Updates W then H each iteration (W only when ``update_H`` is False) and every
    ten iterations stops when the relative decrease of ``||T - WH||_F`` since the
    last check, divided by the initial error, is below ``tol``. The W update, which
    also gives ``W^T W`` and (for the H update) ``T^T W``, and the loss's cross term
    ``trace(W^T T H^T)`` come from :func:`_w_update`; everything else is products
    of small matrices in ``op.xp``. With ``tol=0`` no loss is computed during the
    iterations.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
        Non-negative data.
    W : array of shape (n_samples, n_components)
        Initial W, in ``op``'s namespace and on its device (NumPy: updated in
        place).
    H : array of shape (n_components, n_features)
        Initial H (not modified).
    max_iter : int, default=200
        Maximum number of iterations.
    tol : float, default=1e-4
        Tolerance of the stopping condition (0 runs ``max_iter`` iterations).
    update_H : bool, default=True
        False solves for W with H fixed (``transform``).
    return_error : bool, default=False
        Compute the loss of the returned factors when the last check did not.
    norm_X : float, default=None
        ``||T||_F^2`` when already known (computed when a loss is needed).

    Returns
    -------
    W, H : arrays
    n_iter : int
    error : float or None
        ``||T - WH||_F`` of the returned factors when the last check computed it
        or ``return_error`` is set.
    """
    xp = op.xp
    check = tol > 0
    if norm_X is None and (check or return_error):
        norm_X = _norm_sq(op)
    step = _w_update(op, W)
    eps = xp.asarray(float(EPSILON), dtype=H.dtype, device=device_of(H))
    with step.context():
        step.use(H)
        error_at_init = None
        if check:
            error_at_init = _frobenius_error_from_cross(
                xp, norm_X, _gram(xp, W), H, step.cross(W)
            )
        previous_error = error_at_init
        error = None
        HHt = None
        WtW = None
        for n_iter in range(1, max_iter + 1):
            if HHt is None:
                HHt = H @ xp.matrix_transpose(H)
            # W^T W: for the H update, or (H fixed) for this iteration's loss check.
            gram = update_H or (check and n_iter % 10 == 0)
            W, WtW = step.update_w(W, HHt, gram=gram, tw=update_H)
            error = None
            if update_H:
                H = _multiplicative_update_h(xp, op, H, WtW, step.rmatmul(W), eps)
                step.use(H)
                HHt = None
            if check and n_iter % 10 == 0:
                error = _frobenius_error_from_cross(xp, norm_X, WtW, H, step.cross(W))
                logger.debug("Epoch %02d, error: %f", n_iter, error)
                # An exact initial fit stays exact (the updates are then
                # identities); scikit-learn divides by zero here and iterates on
                # with NaNs.
                if error_at_init == 0 or (previous_error - error) / error_at_init < tol:
                    break
                previous_error = error
        if error is None and return_error:
            WtW = _gram(xp, W) if WtW is None else WtW
            error = _frobenius_error_from_cross(xp, norm_X, WtW, H, step.cross(W))
    return W, H, n_iter, error


# ---------------------------------------------------------------- initialization
def _fill_zeros(xp, A, values):
    """``A[A == 0] = values`` (row-major order of the zeros) without fancy
    indexing, which not every namespace has: the k-th zero takes ``values[k]``."""
    mask = xp.reshape(A == 0, (-1,))
    rank = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    rank = xp.clip(rank, min=0)
    vals = asarray_on(values, xp, device_of(A), values.dtype)
    flat = xp.where(mask, xp.take(vals, rank, axis=0), xp.reshape(A, (-1,)))
    return xp.reshape(flat, A.shape)


def _initialize_gnmf(op, n_components, init=None, eps=1e-6, random_state=None):
    """Initial W and H on ``op``'s device, as scikit-learn's ``_initialize_nmf``.

    "random" scales half-normal entries by ``sqrt(mean(T) / n_components)`` (the mean
    from the column sums); the NNDSVD variants use :func:`_randomized_svd` on the
    operator. The random draws come from scikit-learn's host stream in its order
    (uploaded once), so that seeded initializations are the same on every device.

    Returns
    -------
    W : array of shape (n_samples, n_components)
    H : array of shape (n_components, n_features)
    """
    n_samples, n_features = op.shape
    xp = op.xp
    dtype = op.dtype
    if (
        init is not None
        and init != "random"
        and n_components > min(n_samples, n_features)
    ):
        raise ValueError(
            f"init = '{init}' can only be used when n_components <= "
            f"min(n_samples, n_features); got n_components={n_components} and "
            f"shape {op.shape}."
        )
    if init is None:
        init = "nndsvda" if n_components <= min(n_samples, n_features) else "random"

    if init == "random":
        avg = np.sqrt(_data_mean(op) / n_components)
        rng = check_random_state(random_state)
        H = avg * rng.standard_normal(size=(n_components, n_features)).astype(
            dtype, copy=False
        )
        W = avg * rng.standard_normal(size=(n_samples, n_components)).astype(
            dtype, copy=False
        )
        np.abs(H, out=H)
        np.abs(W, out=W)
        return asarray_on(W, xp, op.device, dtype), asarray_on(H, xp, op.device, dtype)

    U, S, V = _randomized_svd(op, n_components, random_state)
    S = to_numpy(S)
    zero = xp.zeros_like(U[:, 0])
    w_cols = [float(np.sqrt(S[0])) * xp.abs(U[:, 0])]
    h_rows = [float(np.sqrt(S[0])) * xp.abs(V[0, :])]
    for j in range(1, n_components):
        x, y = U[:, j], V[j, :]
        x_p, y_p = xp.maximum(x, zero), xp.maximum(y, xp.zeros_like(y))
        x_n, y_n = xp.abs(xp.minimum(x, zero)), xp.abs(xp.minimum(y, xp.zeros_like(y)))
        x_p_nrm, y_p_nrm = sqrt(float(x_p @ x_p)), sqrt(float(y_p @ y_p))
        x_n_nrm, y_n_nrm = sqrt(float(x_n @ x_n)), sqrt(float(y_n @ y_n))
        m_p, m_n = x_p_nrm * y_p_nrm, x_n_nrm * y_n_nrm
        if m_p > m_n:
            u, v, sigma = x_p / x_p_nrm, y_p / y_p_nrm, m_p
        else:
            u, v, sigma = x_n / x_n_nrm, y_n / y_n_nrm, m_n
        lbd = float(np.sqrt(S[j] * sigma))
        w_cols.append(lbd * u)
        h_rows.append(lbd * v)
    W = xp.stack(w_cols, axis=1)
    H = xp.stack(h_rows, axis=0)
    W = xp.where(W < eps, xp.zeros_like(W), W)
    H = xp.where(H < eps, xp.zeros_like(H), H)
    if init == "nndsvda":
        avg = _data_mean(op)
        W = xp.where(W == 0, xp.full_like(W, avg), W)
        H = xp.where(H == 0, xp.full_like(H, avg), H)
    elif init == "nndsvdar":
        rng = check_random_state(random_state)
        avg = _data_mean(op)
        # W's draws first, then H's, in the row-major order of their zeros.
        W, H = (_fill_random_zeros(xp, A, avg, rng) for A in (W, H))
    dtype = namespace_dtype(xp, dtype)
    W = W if W.dtype == dtype else xp.astype(W, dtype)
    return W, (H if H.dtype == dtype else xp.astype(H, dtype))


def _fill_random_zeros(xp, A, avg, rng):
    """NNDSVDar's fill: the zeros of ``A`` take ``|avg * N(0, 1) / 100|``."""
    n_zeros = int(xp.sum(xp.astype(A == 0, xp.int64)))
    if not n_zeros:
        return A
    vals = np.abs(avg * rng.standard_normal(size=n_zeros) / 100)
    return _fill_zeros(xp, A, vals.astype(numpy_dtype(A.dtype)))


def _check_init(A, shape, whom):
    """Validate a user-given W or H (shape, non-negative, not all zeros)."""
    A = check_array(A)
    if shape[0] != "auto" and A.shape[0] != shape[0]:
        raise ValueError(
            f"Array with wrong first dimension passed to {whom}. Expected {shape[0]}, "
            f"but got {A.shape[0]}."
        )
    if shape[1] != "auto" and A.shape[1] != shape[1]:
        raise ValueError(
            f"Array with wrong second dimension passed to {whom}. Expected "
            f"{shape[1]}, but got {A.shape[1]}."
        )
    check_non_negative(A, whom)
    if np.max(A) == 0:
        raise ValueError(f"Array passed to {whom} is full of zeros.")
    return A


# ------------------------------------------------------------------------ estimator
class FactorizedGNMF(
    DeviceMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator
):
    """Gaussian NMF (Frobenius loss) on a multi-source dataset without the join.

    Finds non-negative ``W`` (n_samples x n_components) and ``H`` (n_components x
    n_features) minimizing ``0.5 ||T - W H||_F^2`` by multiplicative updates.

    Parameters
    ----------
    n_components : int, "auto" or None, default="auto"
        Rank of the factorization, with scikit-learn's meaning: "auto" is the
        number of rows of a custom ``H`` (``init="custom"``), else ``n_features``;
        None is ``n_features``. On wide one-hot data ``n_features`` makes ``W``
        as wide as the data: give a rank.
    init : {"random", "nndsvd", "nndsvda", "nndsvdar", "custom"} or None, \
            default=None
        Initialization, as scikit-learn's ``NMF``: None is "nndsvda" when
        ``n_components <= min(n_samples, n_features)``, else "random"; "custom"
        takes ``W`` and ``H`` given to :meth:`fit_transform`.
    max_iter : int, default=200
        Maximum number of iterations.
    tol : float, default=1e-4
        Tolerance of the stopping condition, checked every 10 iterations on the
        relative decrease of the loss.
    random_state : int, RandomState instance or None, default=None
        Seeds the "random", "nndsvd*" initializations.
    strategy : {"factorized", "materialized"}, default="factorized"
        For a :class:`~ilargi_sklearn.MultiSourceDataset`: compute on the sources
        ("factorized") or on the joined matrix built once ("materialized"). Arrays
        are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and ``transform`` compute: "auto" where the data lives,
        "cpu", or "gpu" (CuPy; a dataset is moved once and its device copy
        cached). On a device ``W`` (the n-length factor) and every n-length
        product stay there, and so do ``H`` and the small products, so an
        iteration transfers nothing; the "random" initialization is drawn on the
        host (the CPU's random stream) and uploaded once, and the "nndsvd*"
        randomized SVD runs on the device (QR-normalized power iterations, equal
        to the CPU's LU-normalized ones up to rounding). ``components_`` stays
        where the fit ran; ``fit_transform``/``transform`` return ``W`` in the
        caller's array type; pickles hold NumPy arrays. "gpu" without a usable
        GPU raises a
        :class:`~ilargi_sklearn._backend._plan.DeviceUnavailableError` (a
        ``RuntimeError``) with the probe's reason.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        The factor ``H`` (on the device the fit ran on).
    n_components_ : int
        The rank.
    reconstruction_err_ : float
        ``||T - W H||_F`` of the training data at the end of fit.
    n_iter_ : int
        Iterations run.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of the features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.decomposition.NMF : The scikit-learn estimator this one reproduces
        (``solver="mu"``, ``beta_loss="frobenius"``).
    FactorizedKMeans : Factorized K-Means clustering.

    Notes
    -----
    With ``T = sum_k I_k S_k M_k^T`` the joined matrix, the updates are

    * ``W <- W o (T H^T) / (W (H H^T))``, ``T H^T`` one factorized ``matmul``;
    * ``H <- H o (T^T W)^T / ((W^T W) H)``, ``T^T W`` one factorized ``rmatmul``;

    every other product is between small dense matrices. The loss is
    ``||T||_F^2 + trace(W^T W H H^T) - 2 trace(W^T T H^T)`` with ``||T||_F^2`` the sum
    of the factorized column sums of squares and ``T H^T`` shared with the next W
    update. The "nndsvd*" initializations take a randomized SVD of ``T`` (Halko et
    al., the same algorithm and defaults as scikit-learn), which also needs only
    these two products.

    On the CPU the W update runs over blocks of rows and builds ``T H^T`` one
    block at a time: per source the table ``S_k (H M_k)^T`` (source rows x
    n_components) is computed once per iteration and gathered into the block, so
    the n x n_components product never exists; the loss's cross term is summed
    over the same blocks. ``T^T W`` is the identity source's ``X_0^T W``, summed
    block by block in the same pass, plus one segment sum ``I_k^T W`` per
    dimension table after it.

    For the same initial W and H and the same number of iterations the factors
    equal those of ``sklearn.decomposition.NMF(solver="mu",
    beta_loss="frobenius", init="custom")`` on the joined matrix up to rounding.
    Unlike scikit-learn, the W and H passed to :meth:`fit_transform` are not
    modified.

    References
    ----------
    Lee, D. D. and Seung, H. S., "Algorithms for Non-negative Matrix
    Factorization", NIPS 2001.

    Sun, Hai et al., "Ilargi: a GPU compatible factorized ML model training
    framework", 2025.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.decomposition import FactorizedGNMF
    >>> base = np.array([[1.0], [2.0], [1.0], [2.0]])
    >>> dim = np.array([[1.0, 0.5], [0.2, 2.0]])
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, np.array([0, 1, 0, 1])])
    >>> gnmf = FactorizedGNMF(n_components=2, random_state=0, max_iter=1000, tol=1e-8)
    >>> W = gnmf.fit_transform(ds)
    >>> W.shape, gnmf.components_.shape
    ((4, 2), (2, 3))
    >>> (W @ gnmf.components_).round(3)
    array([[1. , 1. , 0.5],
           [2. , 0.2, 2. ],
           [1. , 1. , 0.5],
           [2. , 0.2, 2. ]])
    >>> round(gnmf.reconstruction_err_, 6)
    0.0
    """

    _parameter_constraints: dict = {
        "n_components": [
            Interval(Integral, 1, None, closed="left"),
            None,
            StrOptions({"auto"}),
        ],
        "init": [
            StrOptions({"random", "nndsvd", "nndsvda", "nndsvdar", "custom"}),
            None,
        ],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "random_state": ["random_state"],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        n_components="auto",
        *,
        init=None,
        max_iter=200,
        tol=1e-4,
        random_state=None,
        strategy="factorized",
        device="auto",
    ):
        self.n_components = n_components
        self.init = init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.strategy = strategy
        self.device = device

    def _check_w_h(self, op, W, H):
        n_samples, n_features = op.shape
        n_components = self.n_components
        if n_components is None:
            n_components = n_features
        if self.init == "custom":
            name = type(self).__name__
            # Checked on the host (a copy when they came from a device).
            W, H = to_numpy(W), to_numpy(H)
            H = _check_init(H, (n_components, n_features), f"{name} (input H)")
            W = _check_init(W, (n_samples, n_components), f"{name} (input W)")
            if H.dtype != op.dtype or W.dtype != op.dtype:
                raise TypeError(
                    "H and W should have the same dtype as X. Got "
                    f"H.dtype = {H.dtype} and W.dtype = {W.dtype}, X.dtype = "
                    f"{op.dtype}."
                )
            if H.shape[0] != W.shape[1]:
                raise ValueError(
                    f"W has {W.shape[1]} columns but H has {H.shape[0]} rows."
                )
            H = asarray_on(H, op.xp, op.device)
            W_op = asarray_on(W, op.xp, op.device)
            # The NumPy W update is in place: never modify the caller's array
            # (an upload to a device is a copy already).
            return (W_op.copy() if W_op is W else W_op), H
        if W is not None or H is not None:
            warnings.warn(
                "When init!='custom', provided W or H are ignored. Set "
                " init='custom' to use them as initialization.",
                RuntimeWarning,
                stacklevel=3,
            )
        if n_components == "auto":
            n_components = n_features
        if self.init == "nndsvd":
            warnings.warn(
                "The multiplicative update solver cannot update zeros present in the "
                "initialization, and so leads to poorer results when used jointly "
                "with init='nndsvd'. You may try init='nndsvda' or init='nndsvdar' "
                "instead.",
                UserWarning,
                stacklevel=3,
            )
        return _initialize_gnmf(
            op, n_components, init=self.init, random_state=self.random_state
        )

    def _warn_max_iter(self, n_iter):
        if n_iter == self.max_iter and self.tol > 0:
            warnings.warn(
                f"Maximum number of iterations {self.max_iter} reached. Increase it "
                "to improve convergence.",
                ConvergenceWarning,
                stacklevel=3,
            )

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None, W=None, H=None):
        """Learn the factorization and return ``W``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Non-negative training data.
        y : Ignored
            Not used, present for API consistency.
        W : array-like of shape (n_samples, n_components), default=None
            Initial W when ``init="custom"`` (not modified).
        H : array-like of shape (n_components, n_features), default=None
            Initial H when ``init="custom"`` (not modified).

        Returns
        -------
        W : ndarray of shape (n_samples, n_components)
            The factor ``W`` of the training data.
        """
        caller = Caller(X)
        op = validate_X(
            self,
            X,
            reset=True,
            strategy=self.strategy,
            ensure_non_negative=True,
            device=self.device,
        )
        # Before W and H exist: the column sums of squares may need temporaries
        # the size of a source, which then do not add to the peak of the fit.
        norm_X = _norm_sq(op)
        W, H = self._check_w_h(op, W, H)
        W, H, n_iter, error = _fit_multiplicative_update(
            op,
            W,
            H,
            max_iter=self.max_iter,
            tol=self.tol,
            update_H=True,
            return_error=True,
            norm_X=norm_X,
        )
        self._warn_max_iter(n_iter)
        self.reconstruction_err_ = error
        self.n_components_ = int(H.shape[0])
        # Fitted attributes stay where the fit ran.
        self.components_ = H
        self.n_iter_ = n_iter
        return caller.give(W)

    def fit(self, X, y=None, **params):
        """Learn the factorization.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Non-negative training data.
        y : Ignored
            Not used, present for API consistency.
        **params : dict
            ``W`` and ``H`` for ``init="custom"``, passed to :meth:`fit_transform`.

        Returns
        -------
        self : FactorizedGNMF
            Fitted estimator.
        """
        self.fit_transform(X, **params)
        return self

    def transform(self, X):
        """Solve for ``W`` with ``H = components_`` fixed (multiplicative updates).

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Non-negative data.

        Returns
        -------
        W : ndarray of shape (n_samples, n_components)
            The factor ``W`` of ``X``.
        """
        check_is_fitted(self)
        caller = Caller(X)
        op = validate_X(
            self,
            X,
            reset=False,
            strategy=self.strategy,
            ensure_non_negative=True,
            device=self.device,
        )
        xp = op.xp
        avg = np.sqrt(_data_mean(op) / self.n_components_)
        # The fitted H where the data is (not modified: H stays fixed).
        H = asarray_on(self.components_, xp, op.device, op.dtype)
        # Before W exists (see fit_transform).
        norm_X = _norm_sq(op) if self.tol > 0 else None
        W = xp.full(
            (op.n_rows, self.n_components_),
            float(avg),
            dtype=namespace_dtype(xp, op.dtype),
            device=op.device,
        )
        W, _, n_iter, _ = _fit_multiplicative_update(
            op,
            W,
            H,
            max_iter=self.max_iter,
            tol=self.tol,
            update_H=False,
            norm_X=norm_X,
        )
        self._warn_max_iter(n_iter)
        return caller.give(W)

    def inverse_transform(self, X):
        """Map ``W`` back to the data space: ``W @ components_``.

        Parameters
        ----------
        X : {ndarray, sparse matrix} of shape (n_samples, n_components)
            Transformed data.

        Returns
        -------
        X_original : ndarray of shape (n_samples, n_features)
            The reconstruction (dense: it is the joined matrix's size).
        """
        check_is_fitted(self)
        # The (small) components go to where ``X`` is (no copy when both are
        # NumPy).
        return X @ asarray_on(self.components_, *input_namespace(X))

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags
