"""Compiled (numba) loss-and-gradient pass of the single-output GLM losses.

The binary logistic regression and the log-link Tweedie regressions (Poisson,
Gamma, Tweedie) share it. One evaluation of such an objective on a factorized
matrix is, in NumPy, a chain of passes through n-length arrays: the product
``T w`` (one ``take`` and one add per row group), the pointwise loss and its
derivative (``logaddexp`` and ``expit``, or ``exp``, with their temporaries) and
the gradient ``T^T g`` (one ``bincount`` per row group). Here two compiled
launches share one n-length buffer: the first writes the predictor (a part
computed before, plus one table entry per row group); NumPy's vectorized ``exp``
and ``log1p`` then give the loss' exponentials (``exp(-|z|)`` and
``log1p(exp(-|z|))`` for the log-loss, ``exp`` of multiples of ``z`` for Tweedie;
faster than numba's scalar calls), from which the second launch forms the loss and
its derivative (the log-loss without branches on the sign of ``z``), sums them, and
per row group sums the derivatives per source row (which the caller multiplies by
the small sources). Dense and sparse identity sources are multiplied by BLAS/SciPy
before and after: inside the loop those products were slower (a runtime-length dot
product per row, and a sum per column through memory). Figures:
``benchmarks/README.md``.

The kernels register with :mod:`.._backend._launcher` (lazy numba import, chunks
over rows with per-chunk partial sums on its thread pool,
:class:`~.._backend._launcher.CompiledUnavailable` on a compile failure), under the
names of the logistic objective they were first written for. The objectives run
them on one thread per row block and spread the blocks over the threads instead
(:mod:`._loss`).
"""

from __future__ import annotations

import numpy as np

from ilargi_sklearn._backend import _launcher

_u = _launcher.U

__all__ = ["fused_binomial", "fused_glm"]


#: The pointwise losses of :func:`_derivative_chunk` (its ``kind``): the binary
#: log-loss, and half the Tweedie deviance with the log link at power 1
#: (Poisson), 2 (Gamma), any other power, and 0 (the normal distribution)
#: (``_loss.HalfTweedie``).
BINOMIAL, POISSON, GAMMA, TWEEDIE, NORMAL = 0, 1, 2, 3, 4


def _predictor_chunk(
    z0, use_z0, idxs, n_groups, P, offsets, pads, bias, g, c, start, stop
):
    # One loop per row group: each reads one stream (an index vector), faster
    # than all groups in one loop.
    for i in range(start, stop):
        u = _u(i)
        g[u] = bias + z0[u] if use_z0 else bias
    for k in range(n_groups):
        ik = idxs[k]
        o = offsets[k]
        pad = pads[k]
        for i in range(start, stop):
            # Unmatched rows read the group's zero entry (a select, not a branch:
            # a branch mispredicts on scattered unmatched rows).
            u = _u(i)
            r = ik[u]
            g[u] += P[_u(o + (r if r >= 0 else pad))]


def _derivative_chunk(
    idxs,
    n_groups,
    offsets,
    pads,
    y,
    sw,
    use_sw,
    kind,
    a,
    b,
    t,
    lg,
    g,
    lsum,
    gsum,
    bins,
    c,
    start,
    stop,
):
    # In: g = z, and t, lg the loss' exponentials of z (_exponentials). Out: g =
    # the derivative. bins (chunks, total), lsum/gsum (chunks,). One loop for every
    # loss: kind is the same on every row, so its branch always predicts (the
    # logistic pass timed as fast as before it had one).
    ls = 0.0
    gs = 0.0
    for i in range(start, stop):
        ui = _u(i)
        z = g[ui]
        yi = y[ui]
        ti = t[ui]
        if kind == BINOMIAL:
            loss = max(z, 0.0) - yi * z + lg[ui]
            gi = (1.0 if z > 0.0 else ti) / (1.0 + ti) - yi
        elif kind == POISSON:
            loss = ti - yi * z
            gi = ti - yi
        elif kind == GAMMA:
            loss = z + yi * ti
            gi = 1.0 - yi * ti
        elif kind == TWEEDIE:
            li = lg[ui]
            loss = ti / a - yi * li / b
            gi = ti - yi * li
        else:  # NORMAL
            d = ti - yi
            loss = 0.5 * d * d
            gi = ti * d
        if use_sw:
            wi = sw[ui]
            loss *= wi
            gi *= wi
        ls += loss
        gs += gi
        g[ui] = gi
    lsum[c] = ls
    gsum[c] = gs
    bn = bins[c]
    for k in range(n_groups):
        ik = idxs[k]
        o = offsets[k]
        pad = pads[k]
        for i in range(start, stop):
            ui = _u(i)
            r = ik[ui]
            bn[_u(o + (r if r >= 0 else pad))] += g[ui]


_launcher.register("binomial_predictor", _predictor_chunk)
_launcher.register("binomial_derivative", _derivative_chunk)
#: The fewest rows of a chunk of :func:`fused_binomial`'s launches, and of a task of
#: the logistic objective (three blocks of rows, ``linear_model._loss``).
_launcher.MIN_CHUNK_ROWS.update(binomial=32768, logistic=98304)


def _loss_kind(power):
    """``(kind, a, b)`` of :func:`_derivative_chunk` for the binomial loss (power
    None) or the log-link Tweedie loss of power ``power``."""
    if power is None:
        return BINOMIAL, 0.0, 0.0
    kind = {0.0: NORMAL, 1.0: POISSON, 2.0: GAMMA}.get(power, TWEEDIE)
    return kind, 2.0 - power, 1.0 - power


def _exponentials(kind, z, a, b):
    """The arrays ``t, lg`` that :func:`_derivative_chunk` reads for ``kind``.

    By NumPy's vectorized ``exp`` and ``log1p``: its SIMD loops, with the passes
    between them, beat the compiled scalar calls. The Tweedie exponentials are the
    NumPy path's (``_loss.HalfTweedie``): an overflow gives inf there and here
    alike (a trial step L-BFGS rejects), without a warning.
    """
    if kind == BINOMIAL:
        t = np.abs(z)
        np.negative(t, out=t)
        np.exp(t, out=t)
        return t, np.log1p(t)
    with np.errstate(over="ignore"):
        if kind == TWEEDIE:
            # exp((2-p) z) and exp((1-p) z), as the NumPy path forms them.
            return np.exp(a * z), np.exp(b * z)
        t = np.exp(-z if kind == GAMMA else z)
        return t, t


def fused_glm(
    z0: np.ndarray | None,
    idxs: list[np.ndarray],
    P: np.ndarray,
    offsets: np.ndarray,
    pads: np.ndarray,
    y: np.ndarray,
    sw: np.ndarray | None,
    bias: float,
    threads: int | None = None,
    power: float | None = None,
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Weighted pointwise losses, their derivatives and their sums per source row.

    The linear predictor of row ``i`` is
    ``z_i = bias + z0[i] + sum_k P[offsets[k] + r_k]`` with ``r_k = idxs[k][i]``,
    or ``pads[k]`` where that is -1 (the caller sets ``P`` to zero there). With
    ``l_i`` the loss of ``z_i`` and ``g_i = sw_i dl/dz (z_i)``, returns

    * ``lsum = sum_i sw_i l_i`` and ``gsum = sum_i g_i``;
    * ``g`` of shape ``(n,)``;
    * ``bins``: per row group, ``bins[offsets[k] + r] = sum_{i: r_k = r} g_i``,
      shape ``(total,)`` with ``total = P.shape[0]`` (the pad entries collect the
      unmatched rows).

    The loss: with ``power`` None the binary log-loss
    ``l_i = log(1 + exp(z_i)) - y_i z_i`` (``dl/dz = expit(z_i) - y_i``);
    otherwise half the Tweedie deviance of that power with the log link, constant
    terms dropped as in ``_loss.HalfTweedie`` (power 1:
    ``exp(z) - y z``; 2: ``z + y exp(-z)``; 0: ``(exp(z) - y)^2 / 2``; other ``p``:
    ``exp((2-p) z) / (2-p) - y exp((1-p) z) / (1-p)``).

    Parameters
    ----------
    z0 : ndarray of float64 of shape (n,) or None
        The part of the predictor computed elsewhere (an identity source times
        its coefficients, by BLAS).
    idxs : list of ndarray of int64 of shape (n,)
        One index vector per row group (-1: no source row).
    P : ndarray of float64 of shape (total,)
        The row groups' per-source-row predictor parts, stacked.
    offsets : ndarray of int64 of shape (n_groups,)
        First entry of each group in ``P``.
    pads : ndarray of int64 of shape (n_groups,)
        Entry of each group (relative to its offset) that unmatched rows take.
    y : ndarray of float64 of shape (n,)
        Targets: in {0, 1} for the log-loss, in the Tweedie loss' domain otherwise.
    sw : ndarray of float64 of shape (n,) or None
        Sample weights (None: ones).
    bias : float
        Constant part of the predictor (the intercept, and the offsets' part).
    threads : int, default=None
        The thread count (:func:`~.._backend._launcher.n_threads`, looked up when None).
    power : float, default=None
        The Tweedie power; None for the log-loss.

    Returns
    -------
    lsum, gsum : float
    g : ndarray of float64 of shape (n,)
    bins : ndarray of float64 of shape (total,)
    """
    n = y.shape[0]
    kind, a, b = _loss_kind(power)
    tup, n_groups = _launcher.index_tuple(idxs, n)
    threads = _launcher.n_threads() if threads is None else threads
    n_chunks = _launcher.chunks(n, _launcher.MIN_CHUNK_ROWS["binomial"], threads)
    g = np.empty(n)
    head = (np.zeros(0) if z0 is None else z0, z0 is not None, tup, n_groups, P)
    head += (offsets, pads, float(bias), g)
    _launcher.launch("binomial_predictor", head, n, n_chunks, threads)
    t, lg = _exponentials(kind, g, a, b)
    lsum = np.zeros(n_chunks)
    gsum = np.zeros(n_chunks)
    bins = np.zeros((n_chunks, P.shape[0]))
    head = (tup, n_groups, offsets, pads, y, np.zeros(0) if sw is None else sw)
    head += (sw is not None, kind, a, b, t, lg, g, lsum, gsum, bins)
    _launcher.launch("binomial_derivative", head, n, n_chunks, threads)
    if n_chunks == 1:
        return float(lsum[0]), float(gsum[0]), g, bins[0]
    return float(lsum.sum()), float(gsum.sum()), g, bins.sum(axis=0)


#: The log-loss (``power=None``) under the name the logistic objective knows.
fused_binomial = fused_glm
