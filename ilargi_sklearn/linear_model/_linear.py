"""Factorized ordinary least squares: normal equations, LSQR and gradient descent."""

from __future__ import annotations

import logging
import math
import warnings
from numbers import Integral, Real

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from sklearn.base import BaseEstimator, RegressorMixin, _fit_context
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_y, check_is_fitted

from ilargi_sklearn._backend._cuml import fit_cuml, use_cuml
from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    is_numpy_namespace,
    namespace_dtype,
)
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn._backend._plan import UnsupportedOnDeviceError
from ilargi_sklearn.linear_model._loss import (
    _gradient_descent,
    _lipschitz_constant,
    _loss_and_grad,
    _split_coef,
)
from ilargi_sklearn.multisource._operators import matmul_into
from ilargi_sklearn.utils._stats import (
    centered_gram,
    centered_products,
    choose_shift,
    host64,
    shifted_design,
)
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    STRATEGIES,
    Caller,
    DeviceMixin,
    device_regression_target,
    host_array,
    validate_fit_inputs,
    validate_X,
)

__all__ = ["FactorizedLinearRegression"]

logger = logging.getLogger(__name__)

# Above this many features a sparse problem is solved by LSQR on the operator
# (as scikit-learn's LinearRegression does for all sparse input) instead of through
# a dense (n_features, n_features) gram, which is cubic to factor and, on the wide
# one-hot sources these problems come from, usually rank-deficient, so Cholesky is
# refused and the eigendecomposition runs. Measured on Hamlet Walmart (421570 rows,
# 2521 sparse features, gram rank 2419; 2-core machine): the gram path took 36 s
# (eigh), LSQR about 1.5 s with the same R^2 (0.726651). An eigh of 1000 features
# already costs seconds, which LSQR beats whenever a matrix-vector product is
# cheap; dense data always keep the exact normal equations.
_MAX_DENSE_GRAM_FEATURES = 1000


def gram_out_of_reach(op):
    """Whether the solvers should iterate on products instead of forming a dense
    (n_features, n_features) gram: above ``_MAX_DENSE_GRAM_FEATURES`` features on
    sparse data, and on operators that say their gram is costly
    (``prefers_products``: implicit feature expansions, whose gram is quartic in
    the base features and costs as much as on the materialized expansion; below
    the threshold it is still formed, which keeps small problems exact)."""
    wide = op.n_cols > _MAX_DENSE_GRAM_FEATURES
    return bool(wide and (op.is_sparse or getattr(op, "prefers_products", False)))


def _check_n_rows(op, y, name="y"):
    n_rows, n_y = op.n_rows, y.shape[0]
    if n_rows != n_y:
        raise ValueError(
            f"X has {n_rows} samples but {name} has {n_y}; they must have the same "
            "number of rows."
        )


def _regression_target(estimator, y, op):
    """``(Y, y_ndim)``: the target as float64 of shape (n_samples, n_targets) where
    ``op`` lives, and the number of dimensions ``y`` came with.

    A target already next to the data is checked there; any other is validated on
    the host (one copy when it came from another device) and moved next to the
    data once, for the whole fit.
    """
    Y = device_regression_target(estimator, y, op)
    if Y is not None:
        _check_n_rows(op, Y)
        return Y, y.ndim
    y = _check_y(host_array(y), multi_output=True, y_numeric=True, estimator=estimator)
    if sp.issparse(y):
        y = y.toarray()
    _check_n_rows(op, y)
    Y = np.asarray(y, dtype=np.float64).reshape(op.n_rows, -1)
    return asarray_on(Y, op.xp, op.device), y.ndim


def _check_device_support(op, name="FactorizedLinearRegression"):
    """Sparse operators outside NumPy have no solver: LSQR and the sparse gram
    products are SciPy kernels. ``name``: the estimator the message names."""
    if op.is_sparse and not is_numpy_namespace(op.xp):
        raise UnsupportedOnDeviceError(
            f"on a device, {name} supports dense data only (got "
            f"a sparse {type(op).__name__} in {op.xp.__name__}); use device='cpu'."
        )


# Rounding errors of a gram entry G_ij, in units of eps * sqrt(G_ii G_jj).
_GRAM_NOISE = 100.0
# Refinement is skipped when the first solution's error bound (condition times
# the relative noise of the gram and the right-hand side) is below this.
_SKIP_REFINE = 1e-10
# A column dropped as constant up to rounding whose centered variance is above
# this many eps times its rounding scale was not constant: its variance was lost
# (a warning names it).
_LOST_VARIANCE = 10.0


def _ill_conditioned_warning(rcond, n_lost, n, why):
    """scikit-learn's (SciPy's) ``LinAlgWarning`` for a solve that loses digits."""
    warnings.warn(
        f"Ill-conditioned matrix (rcond={rcond:.3g}): result may not be accurate. "
        f"{n_lost} of {n} directions of the centered gram are below its rounding "
        f"noise and get no weight ({why}). Rescale the features (e.g. with "
        "FactorizedStandardScaler) or increase the penalty.",
        scipy.linalg.LinAlgWarning,
        stacklevel=4,
    )


def _psd_solver(G, D, dtype, cond, penalized=False):
    """A solver for ``G x = b`` with ``G`` symmetric positive semi-definite.

    ``G`` is the centered gram and ``D`` the diagonal of the raw gram it came
    from: the entries of the raw gram carry rounding errors of about
    ``eps * sqrt(D_i D_j)``, and centering keeps them even where the centered
    gram is much smaller (columns whose mean is large compared with their spread
    and were not shifted, constant columns). A direction ``v`` of ``G`` is
    therefore only resolved when its eigenvalue is above ``eps * (sum_i |v_i|
    sqrt(D_i))^2``.

    scikit-learn's dense ``LinearRegression`` calls ``lstsq(X, y, cond=tol)``:
    singular values of the design below ``cond`` times the largest count as zero.
    The gram's eigenvalues are the squared singular values, so its cut is
    ``cond**2``. Cholesky when ``G`` is well conditioned (LAPACK's reciprocal
    condition estimate above ``cond**2``, and that of the equilibrated gram
    ``diag(G)^-1/2 G diag(G)^-1/2`` above its worst-case noise): the factor is
    taken of the equilibrated gram, whose accuracy does not depend on the columns'
    scales (a column whose variance dwarfs the others' leaves them exact).
    Otherwise the pseudo-inverse through the eigendecomposition, dropping the
    eigenvalues below ``cond**2 * max(eigenvalues)`` or below their own noise
    level: the minimum-norm solution that ``lstsq(cond=cond)`` computes on the
    design. Dropping an eigenvalue that ``cond`` keeps (one below the noise only)
    loses a direction ``lstsq`` resolves: a ``LinAlgWarning`` says so, as
    scikit-learn's ridge solve does for an ill-conditioned system.

    Ridge passes ``G + alpha I`` with the ``D`` of ``G``: the penalty is exact and
    adds no rounding noise. ``penalized`` (a positive penalty) makes every dropped
    eigenvalue a lost direction: the penalized gram is positive definite.

    Returns
    -------
    solve : callable
        ``solve(b)`` for ``b`` of shape (n,) or (n, k).
    rank : int
        Number of eigenvalues kept (``n`` for the Cholesky path).
    error : float
        A bound on the relative error that the noise of ``G`` causes in a
        solution: the condition estimate times the worst-case relative noise
        (inf on the pseudo-inverse path).
    """
    n = G.shape[0]
    eps = _GRAM_NOISE * float(np.finfo(dtype).eps)
    sqrt_d = np.sqrt(np.maximum(D, 0.0))
    anorm = float(np.abs(G).sum(axis=0).max(initial=0.0))
    rc_scaled = 0.0
    if anorm > 0 and np.all(np.isfinite(G)):
        g = np.diag(G)
        s = np.where(g > 0, 1.0 / np.sqrt(np.where(g > 0, g, 1.0)), 1.0)
        Gs = G * s[:, None] * s[None, :]
        anorm_s = float(np.abs(Gs).sum(axis=0).max())
        worst_noise = eps * n * float(np.max(np.maximum(D, 0.0) * s * s, initial=0.0))
        try:
            c, lower = scipy.linalg.cho_factor(Gs, lower=True, check_finite=False)
            rc_scaled, info = scipy.linalg.lapack.dpocon(c, anorm_s, uplo="L")
            # lstsq's cut is on the design's own scale: the unscaled gram's
            # condition, whose factor is diag(1 / s) times the scaled one's.
            rc = 1.0
            if cond > 0:
                rc, _ = scipy.linalg.lapack.dpocon(
                    np.tril(c) / s[:, None], anorm, uplo="L"
                )
            if info == 0 and rc_scaled >= worst_noise / anorm_s and rc >= cond**2:

                def solve(b):
                    sb = b * (s if b.ndim == 1 else s[:, None])
                    x = scipy.linalg.cho_solve((c, lower), sb, check_finite=False)
                    return x * (s if b.ndim == 1 else s[:, None])

                return solve, n, worst_noise / anorm_s / rc_scaled
        except np.linalg.LinAlgError:
            pass
    eigvals, V = scipy.linalg.eigh(G, check_finite=False)
    top = float(eigvals[-1]) if n else 0.0
    noise = eps * (np.abs(V).T @ sqrt_d) ** 2
    kept_by_cond = eigvals > cond**2 * top
    keep = kept_by_cond & (eigvals > noise)
    rank = int(keep.sum())
    logger.info(
        "gram singular or ill-conditioned: minimum-norm solution of rank %d/%d.",
        rank,
        n,
    )
    # Directions lost to rounding only (not to cond): the solution differs from
    # lstsq's. Without a penalty, an exactly singular direction is at the rounding
    # level of the gram's entries, far below eps * top, and is told apart from it.
    lost = kept_by_cond & ~keep
    if not penalized:
        lost &= eigvals > _LOST_VARIANCE * float(np.finfo(dtype).eps) * top
    if lost.any():
        why = "the penalty is below the gram's rounding" if penalized else "rounding"
        _ill_conditioned_warning(rc_scaled, int(lost.sum()), n, why)
    Vk, ev = V[:, keep], eigvals[keep]

    def solve(b):
        coords = Vk.T @ b
        coords /= ev if b.ndim == 1 else ev[:, None]
        return Vk @ coords

    return solve, rank, np.inf


def lost_columns(G, D, dtype):
    """Boolean mask of the columns whose centered variance is below the rounding
    noise of the raw gram (``_GRAM_NOISE`` eps ``D_j``): constant up to rounding.

    Such a column gets a zero coefficient, as ``lstsq`` gives a constant one.
    With the pilot shift (``utils._stats``) only constant columns are, and the
    columns of sparse sources with a mean far larger than their spread, which a
    warning names when the statistics are formed
    (:func:`~ilargi_sklearn.utils._stats.choose_shift`).
    """
    return np.diag(G) <= _GRAM_NOISE * float(np.finfo(dtype).eps) * D


def _gram_solver(stats, alphas, dtype, cond):
    """A solver of ``(G + alpha_j I) x_j = b_j`` for the centered gram of ``stats``
    (:class:`~ilargi_sklearn.utils._stats.GramStats`), one penalty per column.

    Columns that are constant up to rounding (a "year" column, a dimension
    attribute that never varies) have a centered variance that is pure
    cancellation noise, which would also leak into every other direction through
    the off-diagonal noise: they get a zero coefficient, as with lstsq
    (:func:`lost_columns`). Columns that share a penalty share one factorization
    (:func:`_psd_solver`).

    Returns
    -------
    solve : callable
        ``solve(b)`` for ``b`` of shape (n_features, len(alphas)).
    rank : int
        The smallest effective rank over the penalties.
    error : float
        The largest error bound of :func:`_psd_solver` over the penalties.
    free : ndarray of int
        The columns that are not constant.
    """
    G, D = stats.G, stats.D
    free = np.flatnonzero(~lost_columns(G, D, dtype))
    G_free, D_free = G[np.ix_(free, free)], D[free]
    solvers, rank, error = [], free.size, 0.0
    for a in np.unique(alphas):
        targets = np.flatnonzero(alphas == a)
        A = G_free + a * np.eye(free.size) if a else G_free
        solve_a, rank_a, error_a = _psd_solver(A, D_free, dtype, cond, a > 0)
        solvers.append((targets, solve_a))
        rank, error = min(rank, rank_a), max(error, error_a)

    def solve(b):
        x = np.zeros_like(b)
        for targets, solve_a in solvers:
            x[np.ix_(free, targets)] = solve_a(b[np.ix_(free, targets)])
        return x

    return solve, rank, error, free


def _solve_normal_equations(
    op, Y, sample_weight, fit_intercept, cond, max_refine=5, alpha=None
):
    """Weighted least squares (or ridge) from the gram of ``T``, with implicit
    centering.

    With weights ``s``, ``s_sum = sum(s)`` and weighted column means
    ``mu = s^T T / s_sum``, the centered gram and right-hand side are
    ``T^T S T - s_sum mu mu^T`` and ``T^T S Y - mu (s^T Y)``: the data are never
    centered, so sparsity and factorization survive. They are formed from the
    shifted design ``W = T - 1 k^T`` and target (:func:`centered_gram`), so
    columns and targets whose means are large compared with their spread keep
    their digits.

    The solution is then refined with the residual computed through the shifted
    design (``dW = G_c^+ W_c^T S (Y~ - W_c W - b~)``: one ``matmul`` and one
    ``rmatmul`` per step) until the correction stops shrinking, which recovers
    the accuracy that forming the gram loses on ill-conditioned data.

    With ``alpha`` (ridge, one penalty per target) target ``j`` solves
    ``(G + alpha_j I) w_j = rhs_j``: one factorization per distinct penalty, and
    the refinement's residual is ``rhs_j - (G + alpha_j I) w_j`` computed through
    the operator.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    Y : ndarray of shape (n_samples, n_targets)
    sample_weight : ndarray of shape (n_samples,) or None
    fit_intercept : bool
    cond : float
        Singular values of the centered design below ``cond`` times the largest
        are treated as zero (``lstsq``'s ``cond``).
    max_refine : int, default=5
        Most refinement steps.
    alpha : ndarray of shape (n_targets,), default=None
        Ridge penalties (None: least squares).

    Returns
    -------
    coef : ndarray of shape (n_targets, n_features), float64
    intercept : ndarray of shape (n_targets,), float64
    rank : int
        Effective rank of the (centered, penalized) gram; the smallest over the
        penalties.
    """
    n_features = op.n_cols
    dtype = op.dtype
    # ``Y`` and ``sample_weight`` live where ``op`` does; the parameter-sized algebra
    # (gram, Cholesky, refinement steps) runs on the host in float64.
    xp = op.xp
    xdt = namespace_dtype(xp, dtype)

    def cast(a):
        return xp.astype(a, xdt, copy=False)

    def colsum(a):
        return host64(sum_axis0(a, xp))

    def weighted(R):
        return R if sample_weight is None else R * sample_weight[:, None]

    stats = centered_gram(op, sample_weight, fit_intercept, Y)
    D, mu, rhs, y_mean = stats.D, stats.mu, stats.rhs, stats.y_mean
    n_targets = Y.shape[1]
    alphas = np.zeros(n_targets) if alpha is None else np.asarray(alpha, dtype=float)
    solve, rank, error, free = _gram_solver(stats, alphas, dtype, cond)
    coef = solve(rhs)  # (n_features, n_targets)
    if n_features == 0 or rank == 0:
        return coef.T, y_mean, rank
    # The right-hand side's entries carry rounding errors up to
    # eps * sqrt(D_j) ||sqrt(s) Y~|| (Cauchy-Schwarz on W^T S Y~), which centering
    # keeps. When the error bound of the first solve is far below the accuracy
    # the estimators promise (1e-8 relative), refining cannot change the result.
    y_norm = np.sqrt(stats.y_sq_norm)
    rhs_noise = _GRAM_NOISE * float(np.finfo(dtype).eps) * np.outer(np.sqrt(D), y_norm)
    # Per unit of each column's scale (the solver's equilibrated coordinates): a
    # column whose variance dwarfs the others' does not set the others' noise.
    g = np.diag(stats.G)[free]
    unit = 1.0 / np.sqrt(np.where(g > 0, g, 1.0))[:, None]
    rhs_scale = np.max(np.abs(rhs[free]) * unit, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rhs_error = np.max(rhs_noise[free] * unit, axis=0) / rhs_scale
    if error + float(np.max(np.nan_to_num(rhs_error, nan=np.inf))) < _SKIP_REFINE:
        return coef.T, y_mean - mu @ coef, rank

    # The residual through the shifted design: with T - 1 mu^T = W - 1 m^T and
    # Y - y_mean = Y~ - ybar~, no product forms a large value of a shifted column
    # or target (without an intercept, m = -k and the constants are genuine).
    W, m = centered_products(op, stats)
    c_y = stats.y_shift
    Yt = Y - asarray_on(c_y, xp, op.device)[None, :] if np.any(c_y) else Y
    y_center = stats.y_center
    tiny = 10 * float(np.finfo(dtype).eps)
    previous = np.inf
    for _ in range(max_refine):
        b = asarray_on(y_center - m @ coef, xp, op.device)
        R = Yt - _predict64(W, coef) - b
        SR = weighted(R)
        grad = host64(W.rmatmul(cast(SR))) - np.outer(m, colsum(SR))
        if alpha is not None:
            grad -= alphas * coef
        step = solve(grad)
        size = float(np.max(np.abs(step)))
        if not size < 0.5 * previous:
            # At the rounding-noise level (or diverging): keep the current solution.
            break
        coef = coef + step
        previous = size
        if size <= tiny * float(np.max(np.abs(coef))):
            break
    return coef.T, y_mean - mu @ coef, rank


def _predict64(op, coef):
    """``T @ coef`` as float64 where ``op`` lives (``coef`` on the host)."""
    P = op.matmul(asarray_on(coef, op.xp, op.device, op.dtype))
    return op.xp.astype(P, op.xp.float64, copy=False)


def _lsqr(
    matvec, rmatvec, u, n_features, atol, btol, conlim=1e8, iter_lim=None, damp=0.0
):
    """LSQR (Paige and Saunders, 1982) for ``min ||A x - b||^2 + damp^2 ||x||^2``,
    ``b`` given as ``u``.

    The algorithm and stopping rules of :func:`scipy.sparse.linalg.lsqr` (which
    scikit-learn's sparse ``LinearRegression`` calls with ``damp=0``, and its
    ``Ridge(solver="lsqr")`` with ``damp=sqrt(alpha)``), written so
    that the n-length Lanczos vector is updated in place: ``u`` (the right-hand
    side, overwritten) is the only n-length array the loop owns, and ``matvec`` may
    return a buffer of its own that is read before its next call. SciPy's loop
    allocates three n-length temporaries per iteration, and where glibc returns
    such blocks to the kernel at every free, each one costs its page faults again
    (``benchmarks/README.md`` has the figures).

    Parameters
    ----------
    matvec, rmatvec : callable
        ``A v`` (n-length, may be a reused buffer) and ``A^T u`` (fresh).
    u : ndarray of shape (n_samples,), float64
        The right-hand side ``b``; overwritten.
    n_features : int
    atol, btol : float
        Stopping tolerances (the residual test ``||r|| <= btol ||b|| + atol ||A||
        ||x||`` and the least-squares test ``||A^T r|| <= atol ||A|| ||r||``).
    conlim : float, default=1e8
        Stop when the estimate of ``cond(A)`` exceeds it.
    iter_lim : int, default=None
        Most iterations; None: ``2 * n_features`` (SciPy's default).
    damp : float, default=0.0
        Damping (ridge: ``sqrt(alpha)``), eliminated by one more plane rotation
        per iteration, as in SciPy.

    Returns
    -------
    x : ndarray of shape (n_features,)
    n_iter : int
    """
    eps = float(np.finfo(np.float64).eps)
    iter_lim = 2 * n_features if iter_lim is None else iter_lim
    dampsq = damp**2
    ctol = 1.0 / conlim if conlim > 0 else 0.0
    x = np.zeros(n_features)
    beta = bnorm = float(np.linalg.norm(u))
    alpha = 0.0
    v = np.zeros(n_features)
    if beta > 0:
        u *= 1.0 / beta
        v = rmatvec(u)
        alpha = float(np.linalg.norm(v))
    if alpha > 0:
        v *= 1.0 / alpha
    if alpha * beta == 0:
        return x, 0
    w = v.copy()
    rhobar, phibar = alpha, beta
    # Norm estimates of A (Frobenius, of the bidiagonal), of the inverse's columns
    # and of x (a second rotation on the right; Paige and Saunders, section 5).
    anorm = ddnorm = xxnorm = z = sn2 = res2 = 0.0
    cs2 = -1.0
    n_iter = 0
    while n_iter < iter_lim:
        n_iter += 1
        # u <- A v - alpha u, in place.
        u *= alpha
        np.subtract(matvec(v), u, out=u)
        beta = float(np.linalg.norm(u))
        if beta > 0:
            u *= 1.0 / beta
            anorm = math.sqrt(anorm**2 + alpha**2 + beta**2 + dampsq)
            v = rmatvec(u) - beta * v
            alpha = float(np.linalg.norm(v))
            if alpha > 0:
                v *= 1.0 / alpha
        # The rotation that eliminates the damping from the diagonal, then the
        # one that eliminates beta from the lower bidiagonal.
        psi = 0.0
        if damp > 0:
            rhobar1 = math.hypot(rhobar, damp)
            psi = damp / rhobar1 * phibar
            phibar *= rhobar / rhobar1
            rhobar = rhobar1
        rho = math.hypot(rhobar, beta)
        c, s = rhobar / rho, beta / rho
        theta = s * alpha
        rhobar = -c * alpha
        phi = c * phibar
        phibar = s * phibar
        tau = s * phi
        ddnorm += float(np.linalg.norm(w / rho)) ** 2
        x += (phi / rho) * w
        w = v - (theta / rho) * w
        delta = sn2 * rho
        gambar = -cs2 * rho
        rhs = phi - delta * z
        xnorm = math.sqrt(xxnorm + (rhs / gambar) ** 2)
        gamma = math.hypot(gambar, theta)
        cs2, sn2 = gambar / gamma, theta / gamma
        z = rhs / gamma
        xxnorm += z**2
        acond = anorm * math.sqrt(ddnorm)
        res2 += psi**2
        rnorm = math.sqrt(phibar**2 + res2)
        arnorm = alpha * abs(tau)
        test1 = rnorm / bnorm
        test2 = arnorm / (anorm * rnorm + eps)
        test3 = 1.0 / (acond + eps)
        scaled = test1 / (1.0 + anorm * xnorm / bnorm)
        rtol = btol + atol * anorm * xnorm / bnorm
        if (
            1.0 + test3 <= 1.0
            or 1.0 + test2 <= 1.0
            or 1.0 + scaled <= 1.0
            or test3 <= ctol
            or test2 <= atol
            or test1 <= rtol
        ):
            break
    return x, n_iter


def _solve_lsqr(op, Y, sample_weight, fit_intercept, tol, alpha=None, max_iter=None):
    """Weighted least squares (or ridge) by LSQR on ``diag(sqrt(s)) (T - 1 mu^T)``.

    The centering stays inside the matrix-vector products (as scikit-learn's sparse
    ``LinearRegression`` and ``Ridge`` do): ``matvec(v) = sqrt(s) * (T v - mu^T v)``
    and ``rmatvec(u) = T^T (sqrt(s) u) - mu sum(sqrt(s) u)``. Ridge penalties
    ``alpha`` (one per target) are LSQR's damping ``sqrt(alpha)``.

    Returns
    -------
    coef : ndarray of shape (n_targets, n_features), float64
    intercept : ndarray of shape (n_targets,), float64
    n_iter : ndarray of shape (n_targets,), int32
        LSQR iterations per target.
    """
    n_samples, n_features = op.shape
    dtype = op.dtype
    sw_sum = float(n_samples if sample_weight is None else np.sum(sample_weight))
    sqrt_sw = None if sample_weight is None else np.sqrt(sample_weight)
    # The products run on the design with its columns of large mean shifted,
    # T = W + 1 k^T (utils._stats.shifted_design): the centered products
    # W v - m^T v then never form the large values.
    op, k = shifted_design(op, choose_shift(op))
    if fit_intercept:
        m = np.asarray(op.col_sums(sample_weight), dtype=np.float64) / sw_sum
        mu = k + m
    else:
        m, mu = -k, np.zeros(n_features)

    # n-sized workspaces reused by every product: a fresh n-sized array per
    # product costs its page faults each time (expensive on a virtual machine). LSQR
    # consumes each matvec result before the next call, so one buffer suffices.
    prod = np.empty(n_samples, dtype=dtype)
    res = prod if dtype == np.float64 else np.empty(n_samples)
    scaled = None if sqrt_sw is None else np.empty(n_samples)
    cast = None if dtype == np.float64 else np.empty(n_samples, dtype=dtype)

    def matvec(v):
        out = matmul_into(op, v.astype(dtype, copy=False), prod)
        if out is not prod:  # an operator without out=
            out = np.asarray(out, dtype=np.float64)
        elif res is not prod:
            res[...] = prod
            out = res
        out -= m @ v
        if sqrt_sw is not None:
            out *= sqrt_sw
        return out

    def rmatvec(u):
        if sqrt_sw is not None:
            u = np.multiply(u, sqrt_sw, out=scaled)
        if cast is not None:
            cast[...] = u
            ud = cast
        else:
            ud = u
        out = np.asarray(op.rmatmul(ud), dtype=np.float64)
        out -= m * u.sum()
        return out

    n_targets = Y.shape[1]
    coef = np.zeros((n_targets, n_features))
    intercept = np.zeros(n_targets)
    n_iter = np.zeros(n_targets, dtype=np.int32)
    damp = np.zeros(n_targets) if alpha is None else np.sqrt(alpha)
    # LSQR's BLAS calls are dots and norms of vectors, thousands of them: BLAS
    # threads that wake and spin-wait for each cost more than they save, and
    # collapse when another process holds a core (benchmarks/README.md, threads).
    with one_blas_thread():
        for j in range(n_targets):
            b = np.array(Y[:, j], dtype=np.float64)
            if fit_intercept:
                wy = b if sample_weight is None else b * sample_weight
                intercept[j] = wy.sum() / sw_sum
                b -= intercept[j]
            if sqrt_sw is not None:
                b *= sqrt_sw
            coef[j], n_iter[j] = _lsqr(
                matvec,
                rmatvec,
                b,
                n_features,
                atol=tol,
                btol=tol,
                iter_lim=max_iter,
                damp=float(damp[j]),
            )
    if fit_intercept:
        intercept -= coef @ mu
    return coef, intercept, n_iter


def _linear_decision(estimator, X):
    """``(T coef_^T + intercept_, xp, caller)`` of a fitted linear model.

    ``coef_`` is (n_features,) or (n_outputs, n_features) and ``intercept_`` a
    float or (n_outputs,); the values are computed where ``X`` is placed (the
    estimator's ``device``), ``caller`` hands them back to where ``X`` came from.
    """
    check_is_fitted(estimator)
    caller = Caller(X)
    op = validate_X(estimator, X, reset=False, device=estimator.device)
    xp = op.xp
    # Parameters go to where the data is (they are small).
    coef = asarray_on(estimator.coef_, xp, op.device)
    coef = coef if coef.ndim == 1 else xp.matrix_transpose(coef)
    b = estimator.intercept_
    b = asarray_on(b, xp, op.device) if hasattr(b, "shape") else b
    return op.matmul(coef) + b, xp, caller


class LinearPredictorMixin:
    """``predict`` of a fitted linear model: ``T coef_^T + intercept_`` through the
    operator's ``matmul``, on the data's device, returned in the caller's array
    type. ``coef_`` is (n_features,) or (n_targets, n_features); ``intercept_`` a
    scalar or (n_targets,)."""

    def predict(self, X):
        """Predict with the linear model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Samples; a dataset is used through its factorized operator.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,) or (n_samples, n_targets)
            Predicted values.
        """
        values, _, caller = _linear_decision(self, X)
        return caller.give(values)


class FactorizedLinearRegression(
    LinearPredictorMixin, DeviceMixin, RegressorMixin, BaseEstimator
):
    """Ordinary least squares on joined data sources, without building the join.

    Fits ``y ~ T coef + intercept`` where ``T`` is the joined matrix of a
    :class:`~ilargi_sklearn.MultiSourceDataset` (or a plain array or sparse matrix).
    The default solver forms the normal equations from the factorized gram
    ``T^T diag(s) T`` and gives the same model as
    :class:`sklearn.linear_model.LinearRegression` on the materialized table; the
    ``"gd"`` solver is the fixed-iteration gradient descent of the factorized-learning
    papers.

    Parameters
    ----------
    fit_intercept : bool, default=True
        Whether to fit an intercept. The data are centered implicitly, never copied.
    solver : {"normal", "gd"}, default="normal"
        * ``"normal"``: exact least squares. The centered gram is solved by Cholesky,
          or, when it is singular or ill-conditioned, by its pseudo-inverse (the
          minimum-norm solution, as ``lstsq`` gives). Sparse problems with more than
          1000 features use LSQR on the operator instead of a dense gram.
        * ``"gd"``: gradient descent with a fixed step,
          ``w <- w - learning_rate * T^T (s * (T w + b - y)) / sum(s)`` and the
          matching intercept step, for at most ``max_iter`` iterations (exactly
          ``max_iter`` with ``tol=0``, as in the papers).
    max_iter : int, default=20
        Most gradient-descent iterations (``solver="gd"`` only).
    learning_rate : float, default=None
        Step size of ``solver="gd"``. None uses ``1 / L`` with ``L`` the largest
        eigenvalue of ``[T, 1]^T diag(s) [T, 1] / sum(s)`` (the Lipschitz constant of
        the gradient, estimated by power iteration), which is always stable.
    tol : float, default=1e-6
        The precision of the solution, with scikit-learn's meaning: on the LSQR
        path of large sparse problems, LSQR's ``atol`` and ``btol``; on the normal
        equations, singular values of the centered design below ``tol`` times the
        largest are treated as zero (``lstsq``'s ``cond``). Smaller values give a
        more precise solution at more LSQR iterations (1e-12 takes 2-5 times
        as many on the Hamlet datasets). For ``solver="gd"``: stop once the largest absolute
        gradient entry is at most ``tol`` (a ``ConvergenceWarning`` when
        ``max_iter`` steps do not get there); ``tol=0`` runs exactly ``max_iter``
        steps, the papers' fixed-iteration mode.
    strategy : {"factorized", "materialized"}, default="factorized"
        How a :class:`~ilargi_sklearn.MultiSourceDataset` is used in ``fit``: through
        its factorized operator, or materialized once into a plain matrix. Both give
        the same model; plain arrays are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` and ``predict`` compute: "auto" where the data lives, "cpu",
        or "gpu" (CuPy; a dataset is moved once and its device copy cached). On a
        device the dense normal equations and gradient descent run (sparse data
        raise ``UnsupportedOnDeviceError``: use ``device="cpu"``); the gram, the
        refinement steps' and the solvers' parameter-sized algebra run on the
        host. ``coef_`` and ``intercept_`` stay where the fit ran; ``predict``
        returns the caller's array type; pickles hold NumPy arrays. "gpu" without
        a usable GPU raises a ``RuntimeError`` with the probe's reason. A materialized dense plan on
        the GPU is solved by cuML (``algorithm="eig"``) when cuML is installed.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
        Coefficients, 1-D for a 1-D ``y``; dtype of the training data.
    intercept_ : float or ndarray of shape (n_targets,)
        Intercept (0.0 when ``fit_intercept=False``).
    n_iter_ : int
        Gradient-descent steps (``solver="gd"``), LSQR iterations (largest over the
        targets) for large sparse problems, or 1 for the direct solve.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.linear_model.LinearRegression : The same model on a single matrix.
    FactorizedLogisticRegression : Factorized logistic regression.

    Notes
    -----
    The factorized rewrite: with the joined matrix ``T = sum_k I_k S_k M_k^T``,
    weights ``s`` (``S = diag(s)``), ``s_sum = sum(s)`` and weighted column means
    ``mu = s^T T / s_sum``, the normal equations are::

        (T^T S T - s_sum mu mu^T) w = T^T S y - mu (s^T y)
        b = s^T y / s_sum - mu^T w

    The gram ``T^T S T`` is assembled from per-source blocks
    ``S_k^T diag(I_k^T s) S_k`` and co-occurrence blocks ``S_k^T (I_k^T S I_l) S_l``,
    and ``T^T S y`` scatters ``S y`` into each source's rows before one product with
    ``S_k^T``: no joined row is ever formed, and the data are centered only
    implicitly. The solution is refined with residuals computed through the
    operator (one ``T w`` and one ``T^T r`` per step). Gradient descent only needs
    ``T w`` (per-source products, then a gather) and ``T^T r`` (a scatter, then
    per-source products). So does LSQR, which runs the algorithm and stopping rules
    of :func:`scipy.sparse.linalg.lsqr` (and so scikit-learn's iteration counts)
    with its n-length vectors updated in place.

    Accuracy: the gram squares the condition number of ``T``. For well-conditioned
    data the result agrees with :class:`~sklearn.linear_model.LinearRegression` to
    machine precision; on rank-deficient data both return the minimum-norm solution
    (the same predictions), with singular values below ``tol`` (1e-6) times the
    largest treated as zero, as in scikit-learn, and columns that are constant
    up to rounding given a zero coefficient. Implicit centering cancels digits on
    columns whose mean is far larger than their spread: directions whose
    eigenvalue is below that rounding noise are dropped, so very ill-conditioned
    data with such columns (condition number above about 1e4 with means a few times
    the spread) can lose accuracy; standardize them first. A float32 gram is noisier
    still and is cut accordingly.

    References
    ----------
    .. [1] W. Sun, R. Hai et al., "Ilargi: a GPU compatible factorized ML model
       training framework", 2025.
    .. [2] L. Chen, A. Kumar, J. Naughton, J. M. Patel, "Towards linear algebra over
       normalized data", PVLDB 10(11), 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.linear_model import FactorizedLinearRegression
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((100, 2))
    >>> dim = rng.standard_normal((10, 3))
    >>> fk = rng.integers(0, 10, 100)
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, fk])
    >>> y = base @ [1.0, -2.0] + dim[fk] @ [0.5, 0.0, 3.0] + 4.0
    >>> reg = FactorizedLinearRegression().fit(ds, y)
    >>> np.round(reg.coef_, 6) + 0.0  # + 0.0 turns -0.0 into 0.0
    array([ 1. , -2. ,  0.5,  0. ,  3. ])
    >>> round(float(reg.intercept_), 6)
    4.0
    >>> round(reg.score(ds, y), 6)
    1.0
    """

    _parameter_constraints: dict = {
        "fit_intercept": ["boolean"],
        "solver": [StrOptions({"normal", "gd"})],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "learning_rate": [Interval(Real, 0, None, closed="neither"), None],
        "tol": [Interval(Real, 0, None, closed="left")],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        *,
        fit_intercept=True,
        solver="normal",
        max_iter=20,
        learning_rate=None,
        tol=1e-6,
        strategy="factorized",
        device="auto",
    ):
        self.fit_intercept = fit_intercept
        self.solver = solver
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.tol = tol
        self.strategy = strategy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, sample_weight=None):
        """Fit the linear model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_targets)
            Target values.
        sample_weight : array-like of shape (n_samples,), default=None
            Individual weights for each sample.

        Returns
        -------
        self : object
            Fitted estimator.
        """
        op, (Y, y_ndim), sample_weight, sw_sum = validate_fit_inputs(
            self,
            X,
            y,
            sample_weight,
            target=_regression_target,
            strategy=self.strategy,
            non_negative_weights=True,
        )
        n_features = op.n_cols
        if self.solver == "normal" and use_cuml(op, self.strategy):
            # A materialized dense plan on the GPU is solved by cuML's "eig" solver
            # (_backend._cuml): another library's solver, not a kernel of this
            # package, so it stays a branch of its own.
            fitted = fit_cuml(
                "linear",
                op,
                Y[:, 0] if y_ndim == 1 else Y,
                sample_weight,
                fit_intercept=self.fit_intercept,
            )
            for name, value in fitted.items():
                setattr(self, name, value)
            return self
        _check_device_support(op)
        if self.solver == "gd":
            coef, intercept, n_iter = self._fit_gd(op, Y, sample_weight, sw_sum)
        elif gram_out_of_reach(op):
            logger.info(
                "%d features (%s): LSQR on the operator instead of a dense gram.",
                n_features,
                "sparse" if op.is_sparse else "products preferred",
            )
            coef, intercept, n_iters = _solve_lsqr(
                op, Y, sample_weight, self.fit_intercept, self.tol
            )
            n_iter = int(n_iters.max())
        else:
            coef, intercept, _ = _solve_normal_equations(
                op, Y, sample_weight, self.fit_intercept, self.tol
            )
            n_iter = 1

        # Fitted attributes stay where the fit ran.
        coef = asarray_on(coef.astype(op.dtype, copy=False), op.xp, op.device)
        intercept = asarray_on(intercept.astype(op.dtype, copy=False), op.xp, op.device)
        if y_ndim == 1:
            self.coef_ = coef[0, :]
            self.intercept_ = intercept[0] if self.fit_intercept else 0.0
        else:
            self.coef_ = coef
            self.intercept_ = intercept if self.fit_intercept else 0.0
        self.n_iter_ = n_iter
        return self

    def _fit_gd(self, op, Y, sample_weight, sw_sum):
        # Every product of the power iteration and of the descent has one column
        # per target: on one BLAS thread, as the logistic and GLM solvers run.
        # Multi-threaded, a factorized pass (one small BLAS call per term) spends
        # more on waking BLAS's threads than it saves; on a loaded 2-core machine
        # a factorized fit of 30,000 rows and three one-hot sources took 0.27 s
        # with two OpenBLAS threads, 0.017 s with one (benchmarks/README.md).
        with one_blas_thread():
            return self._fit_gd_steps(op, Y, sample_weight, sw_sum)

    def _fit_gd_steps(self, op, Y, sample_weight, sw_sum):
        n_features = op.n_cols
        n_targets = Y.shape[1]
        learning_rate = self.learning_rate
        if learning_rate is None:
            L = _lipschitz_constant(
                op, sample_weight, sw_sum, 0.0, self.fit_intercept, "squared"
            )
            learning_rate = 1.0 / L if L > 0 else 1.0
            logger.info("gradient descent step size 1/L = %.3g", learning_rate)
        w0 = np.zeros(n_targets * (n_features + int(self.fit_intercept)))
        args = (op, Y, sample_weight, sw_sum, 0.0, self.fit_intercept, n_targets)
        # tol=0 is the papers' fixed-iteration mode: no gradient test at all.
        tol = self.tol if self.tol > 0 else None
        w, n_iter, converged = _gradient_descent(
            _loss_and_grad,
            w0,
            (*args, "squared"),
            learning_rate,
            self.max_iter,
            tol,
        )
        if tol is not None and not converged:
            warnings.warn(
                f"Gradient descent did not reach tol={self.tol} in "
                f"max_iter={self.max_iter} iterations; increase max_iter or "
                "learning_rate, or set tol=0 for the fixed-iteration mode.",
                ConvergenceWarning,
                stacklevel=4,
            )
        coef, intercept = _split_coef(w, n_features, n_targets, self.fit_intercept)
        if intercept is None:
            intercept = np.zeros(n_targets)
        return coef.copy(), intercept.copy(), n_iter

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.multi_output = True
        return tags
