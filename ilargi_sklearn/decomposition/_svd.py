"""Truncated SVDs of an operator from its products only, shared by the
decomposition estimators.

:func:`_randomized_svd` is scikit-learn's ``randomized_svd`` (Halko et al.) over
``op.matmul`` / ``op.rmatmul``: GNMF's NNDSVD initialization,
:class:`~ilargi_sklearn.decomposition.FactorizedTruncatedSVD` and the truncated
solvers of :class:`~ilargi_sklearn.decomposition.FactorizedPCA` (on the
implicitly centered operator) call it. :func:`_arpack_svd` is
:func:`scipy.sparse.linalg.svds` on a ``LinearOperator`` made of the same two
products. :func:`_svd_flip` is scikit-learn's sign convention, in any namespace;
:func:`_total_variance` the denominator of ``explained_variance_ratio_``.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from scipy.sparse.linalg import LinearOperator, svds
from sklearn.utils import check_random_state

from ilargi_sklearn._backend._launcher import one_blas_thread
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    is_numpy_namespace,
    numpy_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._plan import UnsupportedOnDeviceError
from ilargi_sklearn.multisource._statistics import column_variances


def _svd_plan(op, n_components, n_oversamples, n_iter="auto"):
    """Sketch size, power iterations and orientation of the randomized SVD.

    scikit-learn's ``randomized_svd`` choices (``n_iter="auto"``,
    ``transpose="auto"``); the products run on ``T`` or, transposed, on ``T^T``.
    """
    n_samples, n_features = op.shape
    n_random = n_components + n_oversamples
    if n_iter == "auto":
        n_iter = 7 if n_components < 0.1 * min(n_samples, n_features) else 4
    transpose = n_samples < n_features
    if transpose:
        return n_random, n_iter, transpose, op.rmatmul, op.matmul, n_samples
    return n_random, n_iter, transpose, op.matmul, op.rmatmul, n_features


def _range_finder_linalg(xp, normalizer="auto", n_iter=4):
    """``(normalize, orthonormalize, svd)`` of :func:`_randomized_svd` in ``xp``.

    ``normalizer`` is scikit-learn's ``power_iteration_normalizer``: "auto" is
    "none" for ``n_iter <= 2``, else "LU". On NumPy these are scikit-learn's own
    (SciPy's LU or economic QR between the power iterations, Householder QR at
    the end, LAPACK's ``gesdd``), so that the result equals scikit-learn's
    ``randomized_svd`` on the joined matrix up to rounding. Other namespaces
    normalize ("LU" or "QR") by Cholesky QR on their device (:func:`_orthonormal`)
    instead of a host LU: both span the same subspace, so the triplets agree up
    to rounding, without an n-length round trip per iteration.
    """
    if normalizer == "auto":
        normalizer = "none" if n_iter <= 2 else "LU"

    def none(A):
        return A

    if is_numpy_namespace(xp):
        # The factorizations of the tall, thin block run on one BLAS thread: their
        # panels are too thin for BLAS's threads to pay, and threads that wait on
        # each other collapse when another process holds a core (n = 200,000 by
        # 20 on a loaded 2-core machine: LU 0.19 s -> 0.07 s, QR 0.41 s -> 0.12 s).

        def lu(A):
            with one_blas_thread():
                return linalg.lu(A, permute_l=True, check_finite=False)[0]

        def qr(A):
            with one_blas_thread():
                return linalg.qr(A, mode="economic", check_finite=False)[0]

        def svd(B):
            return linalg.svd(B, full_matrices=False, lapack_driver="gesdd")

        return {"LU": lu, "QR": qr, "none": none}[normalizer], qr, svd

    def orthonormal(A):
        return _orthonormal(xp, A)

    def svd(B):
        return xp.linalg.svd(B, full_matrices=False)

    return (none if normalizer == "none" else orthonormal), orthonormal, svd


def _gram(xp, Q):
    return xp.matrix_transpose(Q) @ Q


def _orthonormal(xp, Q):
    """An orthonormal basis of the columns of a tall ``Q`` on its device.

    Cholesky QR, twice: ``Q <- Q L^{-T}`` with ``L L^T = Q^T Q``, a product and a
    small host Cholesky per pass, instead of a Householder QR, which on a tall
    matrix runs one column at a time. Two passes reach working accuracy while
    ``cond(Q)^2`` stays below ``1 / (100 eps)``; a worse conditioned ``Q`` goes to
    ``xp.linalg.qr``. Both span the same subspace, and the randomized SVD's result
    does not depend on the basis.
    """
    limit = 0.01 / float(np.finfo(numpy_dtype(Q.dtype)).eps)
    for _ in range(2):
        G = np.asarray(to_numpy(_gram(xp, Q)), dtype=np.float64)
        G = 0.5 * (G + G.T)
        if not np.all(np.isfinite(G)) or np.linalg.cond(G) > limit:
            return xp.linalg.qr(Q)[0]
        try:
            L = np.linalg.cholesky(G)
        except np.linalg.LinAlgError:
            return xp.linalg.qr(Q)[0]
        L_inv_t = linalg.solve_triangular(L, np.eye(L.shape[0]), lower=True).T
        Q = Q @ asarray_on(L_inv_t, xp, device_of(Q), numpy_dtype(Q.dtype))
    return Q


def _svd_flip(xp, u, v, u_based_decision=True):
    """scikit-learn's ``svd_flip``: the largest entry (in absolute value, the first
    of ties) of each column of ``u`` (or row of ``v``) is made positive. ``u`` may
    be None with ``u_based_decision=False`` (PCA's eigenvectors)."""
    ref = xp.matrix_transpose(u) if u_based_decision else v
    n, m = ref.shape
    rows = xp.argmax(xp.abs(ref), axis=1)
    flat = rows + xp.arange(n, dtype=rows.dtype, device=device_of(ref)) * m
    signs = xp.sign(xp.take(xp.reshape(ref, (-1,)), flat, axis=0))
    return (None if u is None else u * signs[None, :]), v * signs[:, None]


def _randomized_svd(
    op,
    n_components,
    random_state,
    *,
    n_oversamples=10,
    n_iter="auto",
    power_iteration_normalizer="auto",
    flip_sign=True,
):
    """Truncated SVD of ``T`` from products only (scikit-learn's ``_randomized_svd``).

    The Halko et al. randomized range finder needs ``T @ Q`` and ``T^T @ Q`` with
    ``n_components + n_oversamples`` columns; the small SVD is of ``Q^T T``, itself a
    product. Same parameters and defaults as scikit-learn (``transpose="auto"``)
    and the same random matrix, drawn from scikit-learn's host stream and uploaded
    once; the factorizations are :func:`_range_finder_linalg`'s. Every n-length
    array stays on ``op``'s device.

    Returns
    -------
    U : array of shape (n_samples, n_components)
    S : array of shape (n_components,)
    Vt : array of shape (n_components, n_features)
    """
    xp = op.xp
    random_state = check_random_state(random_state)
    n_random, n_iter, transpose, matmul, rmatmul, n_cols = _svd_plan(
        op, n_components, n_oversamples, n_iter
    )
    Q = random_state.normal(size=(n_cols, n_random))
    dtype = np.float32 if op.dtype == np.float32 else np.float64
    Q = asarray_on(Q.astype(dtype, copy=False), xp, op.device)
    normalize, orthonormalize, svd = _range_finder_linalg(
        xp, power_iteration_normalizer, n_iter
    )
    for _ in range(n_iter):
        Q = normalize(rmatmul(normalize(matmul(Q))))
    Q = orthonormalize(matmul(Q))
    Uhat, s, Vt = svd(xp.matrix_transpose(rmatmul(Q)))
    U = Q @ Uhat
    if flip_sign:
        # scikit-learn flips on U in both orientations: with the transpose, U of
        # T^T is the V of T, hence the decision on Vt.
        U, Vt = _svd_flip(xp, U, Vt, u_based_decision=not transpose)
    if not transpose:
        return U[:, :n_components], s[:n_components], Vt[:n_components, :]
    return (
        xp.matrix_transpose(Vt[:n_components, :]),
        s[:n_components],
        xp.matrix_transpose(U[:, :n_components]),
    )


def _total_variance(op, ddof=0):
    """``sum_j var(T[:, j])`` from the factorized column sums and sums of squares
    (float64) of the design with its columns of large mean shifted by a pilot
    value (:func:`~ilargi_sklearn.multisource._statistics.column_variances`), so that no
    column's variance cancels: ``sum_j (s2_j - n m_j^2) / (n - ddof)``."""
    n = op.n_rows
    _, var = column_variances(op)
    return float(var.sum()) * n / (n - ddof)


def _linear_operator(op):
    """``op`` as a SciPy ``LinearOperator`` (NumPy operators only)."""
    if not is_numpy_namespace(op.xp):
        raise UnsupportedOnDeviceError(
            "ARPACK (algorithm='arpack') runs on the CPU only (SciPy's svds); got "
            f"an operator in {op.xp.__name__}. Use device='cpu' or "
            "algorithm='randomized'."
        )
    dtype = np.dtype(op.dtype)

    def cast(a):
        return np.asarray(a, dtype=dtype)

    return LinearOperator(
        shape=op.shape,
        dtype=dtype,
        matvec=lambda x: op.matmul(cast(x).ravel()),
        rmatvec=lambda y: op.rmatmul(cast(y).ravel()),
        matmat=lambda X: op.matmul(cast(X)),
        rmatmat=lambda Y: op.rmatmul(cast(Y)),
    )


def _arpack_svd(op, n_components, v0, tol=0.0):
    """The top ``n_components`` singular triplets of ``T`` by ARPACK, as
    scikit-learn takes them: :func:`scipy.sparse.linalg.svds` (which itself works
    on a ``LinearOperator``, so the iteration is the one it runs on the joined
    matrix), largest first, signs by :func:`_svd_flip` on ``Vt``.

    Returns
    -------
    U : ndarray of shape (n_samples, n_components)
    S : ndarray of shape (n_components,)
    Vt : ndarray of shape (n_components, n_features)
    """
    U, S, Vt = svds(_linear_operator(op), k=n_components, tol=tol, v0=v0)
    U, Vt = _svd_flip(np, U[:, ::-1], Vt[::-1], u_based_decision=False)
    return U, S[::-1], Vt
