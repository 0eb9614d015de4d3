"""Coordinate descent for the elastic net on a gram matrix: one loop, two runs.

The loop of :func:`enet_cd_gram` is written once, in NumPy-level Python that numba
also compiles (row slices, ``np.dot``, scalar arithmetic). It runs as it is where
numba is not used, and jitted through the launcher (:mod:`.._backend._launcher`,
kernel ``"enet_cd_gram"``) where it is: a sweep updates every coordinate in turn,
each update a scalar step and an ``axpy`` of one gram row, so in Python the
interpreter's few microseconds per coordinate dominate from a few dozen features
on, and compiled the sweep costs about ``2 d^2`` flops.

The algorithm, stopping rule, gap-safe screening and random coordinate draws are
those of scikit-learn's ``enet_coordinate_descent_gram`` (its ``precompute=True``
path, ``sklearn/linear_model/_cd_fast.pyx``), so that at equal ``tol`` the same
sweeps run and ``n_iter_`` agrees.
"""

from __future__ import annotations

import math

import numpy as np

from ilargi_sklearn._backend import _launcher

__all__ = ["RAND_R_MAX", "enet_cd_gram"]

#: The range of scikit-learn's ``our_rand_r`` (``sklearn/utils/_random.pxd``): the
#: seed of a fit is ``rng.randint(0, RAND_R_MAX)``, and each draw is the xorshift
#: state modulo ``RAND_R_MAX + 1``.
RAND_R_MAX = 2147483647


def _enet_cd_gram_kernel(
    w, l1_reg, l2_reg, Q, q, y_norm2, max_iter, tol, seed, random, positive, out
):
    """Minimize ``w^T Q w / 2 - q^T w + l1_reg |w|_1 + l2_reg |w|^2 / 2``.

    ``w`` (the start) is updated in place; ``out`` receives the final duality gap,
    its tolerance ``tol * y_norm2``, the number of sweeps, and 1.0 where the gap
    reached the tolerance (0.0 after ``max_iter`` sweeps without).

    One function (no helpers) so that numba compiles it as it is: the gap and the
    screening each appear once, run whenever a sweep's largest update is small
    relative to the largest coefficient (and before the first sweep).
    """
    n = w.shape[0]
    Qw = np.dot(Q, w)
    XtA = np.zeros(n)
    gap_tol = tol * y_norm2
    screening = l1_reg != 0
    active = np.arange(n)
    excluded = np.zeros(n, dtype=np.bool_)
    n_active = n
    state = seed
    gap = 0.0
    converged = False
    check = True
    first = True
    sweeps = 0
    while True:
        if check:
            # The duality gap at w (XtA = q - Q w - l2 w, the dual point's
            # correlations): scikit-learn's formulation A for l1_reg > 0, B (ridge)
            # for l1_reg = 0 < l2_reg, the squared gradient norm for plain least
            # squares; ||y - X w||^2 and (y - X w)^T y come from the gram alone.
            w_l2 = np.dot(w, w) if l2_reg > 0 else 0.0
            q_dot_w = np.dot(w, q)
            R_norm2 = y_norm2 + np.dot(w, Qw) - 2.0 * q_dot_w
            Ry = y_norm2 - q_dot_w
            dual_norm = 0.0
            if l1_reg == 0:
                for j in range(n):
                    XtA[j] = q[j] - Qw[j]
                dual_norm = np.dot(XtA, XtA)
                if l2_reg == 0:
                    gap = dual_norm
                else:
                    gap = R_norm2 + 0.5 * l2_reg * w_l2 - Ry
                    gap += dual_norm / (2.0 * l2_reg)
            else:
                for j in range(n):
                    XtA[j] = q[j] - Qw[j] - l2_reg * w[j]
                    a = XtA[j] if positive else abs(XtA[j])
                    if j == 0 or a > dual_norm:
                        dual_norm = a
                primal = 0.5 * (R_norm2 + l2_reg * w_l2) + l1_reg * np.sum(np.abs(w))
                scale = l1_reg / dual_norm if dual_norm > l1_reg else 1.0
                dual = -0.5 * scale**2 * (R_norm2 + l2_reg * w_l2) + scale * Ry
                gap = primal - dual
            # A singular Q can give a slightly negative gap: before the first
            # sweep only a non-negative one ends the fit.
            if gap <= gap_tol and (gap >= 0.0 or not first):
                converged = True
                break
            if screening:
                # Gap-safe screening (Fercoq, Gramfort and Salmon, 2015):
                # coordinates whose dual constraint is provably inactive at the
                # optimum are set to zero and left out of the sweeps.
                radius = math.sqrt(2.0 * abs(gap)) / l1_reg
                theta_scale = max(l1_reg, dual_norm)
                n_active = 0
                for j in range(n):
                    if first and Q[j, j] == 0.0:
                        w[j] = 0.0
                        excluded[j] = True
                        continue
                    if excluded[j] and not first:
                        continue
                    d_j = (1.0 - abs(XtA[j] / theta_scale)) / math.sqrt(
                        Q[j, j] + l2_reg
                    )
                    if d_j <= radius:
                        active[n_active] = j
                        excluded[j] = False
                        n_active += 1
                    else:
                        if w[j] != 0.0:
                            Qw -= w[j] * Q[j]
                            w[j] = 0.0
                        excluded[j] = True
            first = False
        if sweeps == max_iter:
            break
        w_max = 0.0
        d_w_max = 0.0
        for f_iter in range(n_active):
            if random:
                # scikit-learn's our_rand_r: a 32-bit xorshift, modulo 2^31.
                if state == 0:
                    state = 1
                state ^= (state << 13) & 0xFFFFFFFF
                state ^= state >> 17
                state ^= (state << 5) & 0xFFFFFFFF
                j = (state % (RAND_R_MAX + 1)) % n_active
            else:
                j = f_iter
            if screening:
                j = active[j]
            if Q[j, j] == 0.0:
                continue
            w_j = w[j]
            tmp = q[j] - Qw[j] + w_j * Q[j, j]
            if positive and tmp < 0:
                w[j] = 0.0
            elif tmp > l1_reg:
                w[j] = (tmp - l1_reg) / (Q[j, j] + l2_reg)
            elif tmp < -l1_reg:
                w[j] = (tmp + l1_reg) / (Q[j, j] + l2_reg)
            else:
                w[j] = 0.0
            if w[j] != w_j:
                Qw += (w[j] - w_j) * Q[j]
            d_w_max = max(d_w_max, abs(w[j] - w_j))
            w_max = max(w_max, abs(w[j]))
        sweeps += 1
        check = w_max == 0.0 or d_w_max / w_max <= tol or sweeps == max_iter
    out[0] = gap
    out[1] = gap_tol
    out[2] = sweeps
    out[3] = 1.0 if converged else 0.0


_launcher.register("enet_cd_gram", _enet_cd_gram_kernel)


def enet_cd_gram(
    G,
    rhs,
    alpha,
    l1_ratio,
    coef0,
    *,
    sw_sum,
    y_norm2,
    max_iter=1000,
    tol=1e-4,
    seed=0,
    random=False,
    positive=False,
    compiled=None,
):
    """Elastic-net coordinate descent on a centered gram, scikit-learn's objective.

    Minimizes ``||y - X w||^2 / (2 s) + alpha l1_ratio |w|_1
    + alpha (1 - l1_ratio) |w|^2 / 2`` (``s = sw_sum``, the weighted residual when
    ``G`` and ``rhs`` carry weights) given only ``G = X^T X`` and ``rhs = X^T y``:
    the problem scaled by ``s`` is ``enet_coordinate_descent_gram``'s, with
    ``l1_reg = alpha l1_ratio s`` and ``l2_reg = alpha (1 - l1_ratio) s``. Scaling the
    gram, the right-hand side and both penalties by one factor leaves every
    update and every stopping test unchanged, so weights need not be rescaled to
    sum to ``n_samples`` as scikit-learn does.

    A path over ``alpha`` calls this once per value, passing the last solution as
    ``coef0`` (warm start).

    Parameters
    ----------
    G : ndarray of shape (n_features, n_features), float64, C-contiguous
    rhs : ndarray of shape (n_features,), float64
    alpha : float
    l1_ratio : float in [0, 1]
    coef0 : ndarray of shape (n_features,)
        Start; not modified.
    sw_sum : float
        Sum of the weights (``n_samples`` without weights).
    y_norm2 : float
        ``sum_i s_i (y_i - ybar)^2`` (uncentered without an intercept): the scale
        of the gap's tolerance.
    max_iter : int, default=1000
        Most sweeps.
    tol : float, default=1e-4
        scikit-learn's: the gap is checked once a sweep's largest update is at most
        ``tol`` times the largest coefficient, and the fit stops when it is at most
        ``tol * y_norm2``.
    seed : int, default=0
        State of scikit-learn's ``rand_r`` for ``random=True``
        (``rng.randint(0, RAND_R_MAX)`` there).
    random : bool, default=False
        Draw the coordinate of each update at random (``selection="random"``).
    positive : bool, default=False
        Constrain the coefficients to be non-negative.
    compiled : bool, default=None
        Run the jitted loop (None: where numba is available); a compile failure
        falls back to the Python loop.

    Returns
    -------
    coef : ndarray of shape (n_features,), float64
    gap : float
        Duality gap of scikit-learn's objective (the scaled problem's, over ``s``).
    n_iter : int
        Sweeps run (0 when ``coef0`` already meets the tolerance).
    converged : bool
    gap_tol : float
        The tolerance the gap was compared with, in the same units as ``gap``.
    """
    w = np.array(coef0, dtype=np.float64, copy=True)
    Q = np.ascontiguousarray(G, dtype=np.float64)
    q = np.ascontiguousarray(rhs, dtype=np.float64)
    out = np.zeros(4)
    args = (
        w,
        float(alpha * l1_ratio * sw_sum),
        float(alpha * (1.0 - l1_ratio) * sw_sum),
        Q,
        q,
        float(y_norm2),
        int(max_iter),
        float(tol),
        int(seed),
        bool(random),
        bool(positive),
        out,
    )
    if compiled is None:
        compiled = _launcher.numba_available()
    ran = False
    if compiled:
        try:
            _launcher.call("enet_cd_gram", *args)
            ran = True
        except _launcher.CompiledUnavailable:
            w[...] = coef0  # the failed call may have started on w
    if not ran:
        _enet_cd_gram_kernel(*args)
    gap, gap_tol, n_iter, converged = out
    return w, gap / sw_sum, int(n_iter), bool(converged), gap_tol / sw_sum
