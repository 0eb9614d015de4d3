"""Sufficient statistics of the gram-based estimators: the implicitly centered gram.

Least squares, ridge, the coordinate-descent models and PCA all start from the same
figures of a weighted design: ``T^T S T``, its column sums and (for the supervised
models) ``T^T S Y``. They are computed here once, through the operator protocol, so
the data are never centered (sparsity and factorization survive) and every estimator
centers the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ilargi_sklearn._backend._namespace import namespace_dtype, to_numpy
from ilargi_sklearn._backend._ops import sum_axis0


def host64(a: Any) -> np.ndarray:
    """A parameter-sized array of any namespace as float64 NumPy."""
    return np.asarray(to_numpy(a), dtype=np.float64)


@dataclass(frozen=True)
class GramStats:
    """The centered gram of ``T`` under weights ``s``, on the host in float64.

    With ``s_sum = sum(s)`` and the weighted column means ``mu = s^T T / s_sum``
    (zero without an intercept), ``G = T^T S T - s_sum mu mu^T`` (symmetrized) and
    ``rhs = T^T S Y - mu (s^T Y)``.

    Attributes
    ----------
    G : ndarray of shape (n_features, n_features) or None
        Centered gram (None when it was not formed: ``centered_gram(gram=False)``).
    D : ndarray of shape (n_features,) or None
        Diagonal of the uncentered gram: the scale of the rounding errors of ``G``
        (an entry carries about ``eps * sqrt(D_i D_j)``, which centering keeps).
    mu : ndarray of shape (n_features,)
        Weighted column means (zeros when not centered).
    sw_sum : float
        Sum of the weights (``n_samples`` without weights).
    rhs : ndarray of shape (n_features, n_targets) or None
        Centered ``T^T S Y``.
    y_mean : ndarray of shape (n_targets,) or None
        Weighted target means (zeros when not centered).
    y_sq_norm : ndarray of shape (n_targets,) or None
        ``sum_i s_i y_i^2`` per target (uncentered).
    """

    G: np.ndarray | None
    D: np.ndarray | None
    mu: np.ndarray
    sw_sum: float
    rhs: np.ndarray | None = None
    y_mean: np.ndarray | None = None
    y_sq_norm: np.ndarray | None = None

    @property
    def y_var(self) -> np.ndarray | None:
        """Centered ``sum_i s_i (y_i - y_mean)^2`` per target."""
        if self.y_sq_norm is None:
            return None
        return np.maximum(self.y_sq_norm - self.sw_sum * self.y_mean**2, 0.0)


def centered_gram(
    op: Any,
    sample_weight: Any = None,
    fit_intercept: bool = True,
    Y: Any = None,
    *,
    gram: bool = True,
) -> GramStats:
    """The :class:`GramStats` of ``op`` (and of a target ``Y``, where ``op`` lives).

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    fit_intercept : bool
        Center (implicitly) or not.
    Y : array of shape (n_samples, n_targets), float64, or None
        Where ``op`` lives.
    gram : bool, default=True
        False: the same statistics without the gram (``G`` and ``D`` are None),
        for the iterative solvers that only need the means and ``T^T S Y``
        (one ``col_sums`` and one ``rmatmul`` pass, no ``gram``).
    """
    n_samples, n_features = op.shape
    xp = op.xp
    if sample_weight is None:
        sw_sum = float(n_samples)
    else:
        sw_sum = float(xp.sum(sample_weight))
    if fit_intercept:
        mu = host64(op.col_sums(sample_weight)) / sw_sum
    else:
        mu = np.zeros(n_features)
    G = D = None
    if gram:
        G = host64(op.gram(sample_weight, format="dense"))
        D = np.diag(G).copy()
        if fit_intercept:
            G = G - sw_sum * np.outer(mu, mu)
        G = 0.5 * (G + G.T)
    if Y is None:
        return GramStats(G, D, mu, sw_sum)
    SY = Y if sample_weight is None else Y * sample_weight[:, None]
    xdt = namespace_dtype(xp, op.dtype)
    rhs = host64(op.rmatmul(xp.astype(SY, xdt, copy=False)))
    y_sq_norm = host64(sum_axis0(SY * Y, xp))
    if fit_intercept:
        y_mean = host64(sum_axis0(SY, xp)) / sw_sum
        rhs = rhs - np.outer(mu, sw_sum * y_mean)
    else:
        y_mean = np.zeros(Y.shape[1])
    return GramStats(G, D, mu, sw_sum, rhs, y_mean, y_sq_norm)
