"""The least-squares solvers of the linear family: the (penalized) normal
equations from the implicitly centered gram, LSQR and conjugate gradients on the
operator.

Each solves ``min ||sqrt(s) (Y - T W - 1 b)||^2 + sum_j alpha_j ||w_j||^2`` (the
intercept not penalized, ``alpha = 0`` for least squares) with the data entering
through the operator protocol only: the gram statistics of
:func:`~ilargi_sklearn.multisource._statistics.centered_gram`, or one ``matmul`` and one
``rmatmul`` per iteration, the centering applied to the products (never to the
data). Estimators call them with explicit arguments (:mod:`._linear`,
:mod:`._ridge` and the cross-validated searches); which one runs is the
estimator's choice (:func:`gram_out_of_reach`).
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import scipy.linalg
from sklearn.exceptions import ConvergenceWarning

from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import asarray_on, namespace_dtype
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn.linear_model._base import _predict64
from ilargi_sklearn.multisource._operators import matmul_into
from ilargi_sklearn.multisource._statistics import (
    centered_gram,
    centered_products,
    choose_shift,
    host64,
    shifted_design,
)

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
    With the pilot shift (``multisource._statistics``) only constant columns are, and the
    columns of sparse sources with a mean far larger than their spread, which a
    warning names when the statistics are formed
    (:func:`~ilargi_sklearn.multisource._statistics.choose_shift`).
    """
    return np.diag(G) <= _GRAM_NOISE * float(np.finfo(dtype).eps) * D


def _drop_constant_columns(G, rhs, D, dtype):
    """``G`` and ``rhs`` with the columns that are constant up to rounding zeroed.

    A constant column's centered variance is cancellation noise of the uncentered
    gram (about ``eps * D_j``, see ``multisource._statistics.GramStats``), and so are its
    correlations; left in, the noise is a feature that a small penalty lets in with
    a huge coefficient. scikit-learn, which centers the data explicitly, sees a
    zero (or rounding-sized) column there and gives it a zero coefficient: a zero
    diagonal entry does the same here (the sweeps skip it, screening drops it).
    """
    noise = lost_columns(G, D, dtype)
    if not noise.any():
        return G, rhs
    G, rhs = G.copy(), rhs.copy()
    G[noise, :] = 0.0
    G[:, noise] = 0.0
    rhs[noise] = 0.0
    return G, rhs


def _gram_solver(stats, alphas, dtype, cond):
    """A solver of ``(G + alpha_j I) x_j = b_j`` for the centered gram of ``stats``
    (:class:`~ilargi_sklearn.multisource._statistics.GramStats`), one penalty per column.

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
    op,
    Y,
    sample_weight,
    fit_intercept,
    cond,
    max_refine=5,
    alpha=None,
    stats=None,
    *,
    lineage=None,
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
    stats : GramStats, default=None
        The centered statistics of ``op`` and ``Y`` with ``fit_intercept``
        (:func:`centered_gram`), where the caller holds them already (a
        cross-validated search's statistics of all rows); None computes them.
    lineage : Lineage, default=None
        ``op``'s lineage (:func:`centered_gram` shares the statistics on it).

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

    if stats is None:
        stats = centered_gram(op, sample_weight, fit_intercept, Y, lineage=lineage)
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
    # T = W + 1 k^T (multisource._statistics.shifted_design): the centered products
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


# ------------------------------------------------- conjugate gradients
def _normal_product(op, mu, sample_weight):
    """``V -> T_c^T S T_c V`` through the operator, ``T_c = T - 1 mu^T``.

    ``V`` (n_features, k) is on the host; one ``matmul`` and one ``rmatmul`` of k
    columns, with the centering applied to the products (never to the data).
    ``op`` and ``mu`` are the shifted design and its center
    (:func:`~ilargi_sklearn.multisource._statistics.centered_products`), whose products do
    not form the large values of a column with a large mean.
    """
    xp = op.xp
    xdt = namespace_dtype(xp, op.dtype)
    centered = bool(np.any(mu))

    def product(V):
        R = _predict64(op, V)
        if centered:
            R = R - asarray_on(mu @ V, xp, op.device)
        if sample_weight is not None:
            R = R * sample_weight[:, None]
        out = host64(op.rmatmul(xp.astype(R, xdt, copy=False)))
        if centered:
            out -= np.outer(mu, host64(sum_axis0(R, xp)))
        return out

    return product


def _conjugate_gradient(product, B, alphas, tol, max_iter):
    """Conjugate gradients on ``(N + alpha_j I) x_j = b_j`` for every column.

    The iteration and stopping rule of :func:`scipy.sparse.linalg.cg` (which
    scikit-learn's ``Ridge(solver="sparse_cg")`` calls with ``rtol=tol``): stop
    when ``||r_j|| < tol ||b_j||``, at most ``10 n_features`` iterations by
    default. The columns still iterating share one ``product`` (one pass over the
    data for all of them) per iteration.

    Returns
    -------
    X : ndarray of shape (n_features, n_targets)
    n_iter : ndarray of shape (n_targets,), int32
    converged : ndarray of shape (n_targets,), bool
    """
    n_features, n_targets = B.shape
    max_iter = 10 * n_features if max_iter is None else max_iter
    X = np.zeros_like(B)
    R = B.copy()
    P = np.zeros_like(B)
    rho_prev = np.ones(n_targets)
    n_iter = np.zeros(n_targets, dtype=np.int32)
    b_norm = np.linalg.norm(B, axis=0)
    active = b_norm > 0  # a zero right-hand side has the solution zero
    for it in range(max_iter):
        active &= ~(np.linalg.norm(R, axis=0) < tol * b_norm)
        cols = np.flatnonzero(active)
        if cols.size == 0:
            break
        Rc = R[:, cols]
        rho = np.einsum("ij,ij->j", Rc, Rc)
        # Every column starts at it == 0 and only ever leaves: one branch for all.
        P[:, cols] = Rc if it == 0 else Rc + (rho / rho_prev[cols]) * P[:, cols]
        Pc = P[:, cols]
        Q = product(Pc) + alphas[cols] * Pc
        step = rho / np.einsum("ij,ij->j", Pc, Q)
        X[:, cols] += step * Pc
        R[:, cols] -= step * Q
        rho_prev[cols] = rho
        n_iter[cols] += 1
    converged = ~active | (np.linalg.norm(R, axis=0) < tol * b_norm)
    return X, n_iter, converged


def _solve_sparse_cg(
    op, Y, sample_weight, fit_intercept, alphas, tol, max_iter, *, lineage=None
):
    """Ridge by conjugate gradients on ``(T_c^T S T_c + alpha I) w = T_c^T S y``.

    Returns ``(coef (n_targets, n_features), intercept (n_targets,), n_iter)``.
    """
    stats = centered_gram(
        op, sample_weight, fit_intercept, Y, gram=False, lineage=lineage
    )
    product = _normal_product(*centered_products(op, stats), sample_weight)
    coef, n_iter, converged = _conjugate_gradient(
        product, stats.rhs, alphas, tol, max_iter
    )
    if not converged.all():
        warnings.warn(
            f"sparse_cg did not reach tol={tol} in {int(n_iter.max())} iterations "
            f"for {int((~converged).sum())} target(s); increase max_iter.",
            ConvergenceWarning,
            stacklevel=4,
        )
    return coef.T, stats.y_mean - stats.mu @ coef, n_iter
