"""Factorized truncated SVD: the randomized or ARPACK SVD of ``T`` from its products.

No centering, so the data are read exactly as the sources hold them (sparse
sources stay sparse); both algorithms touch the data only through
``op.matmul`` and ``op.rmatmul`` (:mod:`ilargi_sklearn.decomposition._svd`).
"""

from __future__ import annotations

from numbers import Integral, Real

from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils import check_array, check_random_state
from sklearn.utils._arpack import _init_arpack_v0
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from ilargi_sklearn._backend._namespace import asarray_on, is_numpy_namespace
from ilargi_sklearn._backend._plan import DEVICE_OPTIONS, STRATEGIES
from ilargi_sklearn.decomposition._svd import (
    _arpack_svd,
    _randomized_svd,
    _svd_flip,
    _total_variance,
)
from ilargi_sklearn.utils._validation import (
    Caller,
    DeviceMixin,
    input_namespace,
    validate_X,
)

__all__ = ["FactorizedTruncatedSVD"]


class FactorizedTruncatedSVD(
    DeviceMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator
):
    """Truncated SVD (LSA) on a multi-source dataset without the join.

    The top ``n_components`` singular triplets of the joined matrix ``T``,
    uncentered, as :class:`sklearn.decomposition.TruncatedSVD` computes them on
    the materialized table: the same algorithms, parameters and random draws, with
    every product of the data a factorized one.

    Parameters
    ----------
    n_components : int, default=2
        Number of singular triplets; at most ``n_features`` for "randomized", below
        ``min(n_samples, n_features)`` for "arpack".
    algorithm : {"randomized", "arpack"}, default="randomized"
        "randomized": Halko et al.'s randomized SVD (scikit-learn's
        ``randomized_svd``). "arpack": :func:`scipy.sparse.linalg.svds` (ARPACK)
        on a ``LinearOperator`` of the factorized products (CPU only).
    n_iter : int, default=5
        Power iterations of the randomized algorithm.
    n_oversamples : int, default=10
        Extra random directions of the randomized algorithm.
    power_iteration_normalizer : {"auto", "QR", "LU", "none"}, default="auto"
        Normalization between the power iterations, as scikit-learn's: "auto" is
        "none" for ``n_iter <= 2``, else "LU". On a device "LU" and "QR" both
        normalize by Cholesky QR (the same subspace, no host round trip).
    random_state : int, RandomState instance or None, default=None
        Seeds the random matrix (randomized) or the starting vector (ARPACK),
        drawn from the host's stream as scikit-learn draws them.
    tol : float, default=0.0
        ARPACK's tolerance (0: machine precision); ignored by "randomized".
    strategy : {"factorized", "materialized"}, default="factorized"
        For a :class:`~ilargi_sklearn.MultiSourceDataset`: compute on the sources
        ("factorized") or on the joined matrix built once ("materialized"). Arrays
        are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the products run: "auto" where the data lives, "cpu", or "gpu"
        (CuPy; a dataset is moved once and its device copy cached). On a device
        the randomized SVD keeps every n-length array there (ARPACK raises
        :class:`~ilargi_sklearn._backend._plan.UnsupportedOnDeviceError`: use
        ``device="cpu"``); fitted attributes stay where the fit ran,
        ``transform`` returns the caller's array type and pickles hold NumPy
        arrays. "gpu" without a usable GPU raises a ``RuntimeError`` with the
        probe's reason.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Right singular vectors, each row with its largest entry (in absolute
        value) positive.
    explained_variance_ : ndarray of shape (n_components,)
        Variance (``ddof=0``) of the training data's projection on each component.
    explained_variance_ratio_ : ndarray of shape (n_components,)
        ``explained_variance_`` over the sum of the column variances of ``T``.
    singular_values_ : ndarray of shape (n_components,)
        The singular values, largest first.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of the features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.decomposition.TruncatedSVD : The scikit-learn estimator this one
        reproduces.
    FactorizedPCA : Factorized PCA (centered, from the gram).

    Notes
    -----
    With ``T = sum_k I_k S_k M_k^T`` the joined matrix, the randomized range
    finder alternates ``Y = T Q`` and ``Q = T^T Y`` (each a factorized product:
    per-source products, then a gather; a scatter, then per-source products), with
    ``n_components + n_oversamples`` columns, normalized between the passes; the
    small SVD is of ``Q^T T = (T^T Q)^T``. ARPACK runs the Lanczos iteration of
    ``T^T T`` (or ``T T^T``, the smaller) through the same products. The total
    variance of ``explained_variance_ratio_`` comes from the factorized column sums
    and sums of squares: ``sum_j (s2_j / n - (s_j / n)^2)``.

    The random matrix is drawn as scikit-learn draws it, in the same order, and
    the normalizations are its own (SciPy's LU and QR, LAPACK's ``gesdd``), so for
    the same ``random_state`` the result equals ``TruncatedSVD`` on the joined
    matrix up to rounding.

    References
    ----------
    Halko, N., Martinsson, P. G. and Tropp, J. A., "Finding structure with
    randomness: probabilistic algorithms for constructing approximate matrix
    decompositions", SIAM Review 53(2), 2011.

    Examples
    --------
    >>> import numpy as np
    >>> import scipy.sparse as sp
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.decomposition import FactorizedTruncatedSVD
    >>> rng = np.random.default_rng(0)
    >>> base = sp.random(300, 4, density=0.3, random_state=0, format="csr")
    >>> dim = sp.random(30, 6, density=0.3, random_state=1, format="csr")
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, rng.integers(0, 30, 300)])
    >>> svd = FactorizedTruncatedSVD(n_components=3, random_state=0)
    >>> Z = svd.fit_transform(ds)
    >>> Z.shape, svd.components_.shape
    ((300, 3), (3, 10))
    >>> from sklearn.decomposition import TruncatedSVD
    >>> ref = TruncatedSVD(n_components=3, random_state=0)
    >>> bool(np.allclose(Z, ref.fit_transform(ds.materialize())))
    True
    """

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "algorithm": [StrOptions({"arpack", "randomized"})],
        "n_iter": [Interval(Integral, 0, None, closed="left")],
        "n_oversamples": [Interval(Integral, 1, None, closed="left")],
        "power_iteration_normalizer": [StrOptions({"auto", "QR", "LU", "none"})],
        "random_state": ["random_state"],
        "tol": [Interval(Real, 0, None, closed="left")],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        n_components=2,
        *,
        algorithm="randomized",
        n_iter=5,
        n_oversamples=10,
        power_iteration_normalizer="auto",
        random_state=None,
        tol=0.0,
        strategy="factorized",
        device="auto",
    ):
        self.n_components = n_components
        self.algorithm = algorithm
        self.n_iter = n_iter
        self.n_oversamples = n_oversamples
        self.power_iteration_normalizer = power_iteration_normalizer
        self.random_state = random_state
        self.tol = tol
        self.strategy = strategy
        self.device = device

    def fit(self, X, y=None):
        """Fit the singular vectors of ``X``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        self : FactorizedTruncatedSVD
            Fitted estimator.
        """
        self.fit_transform(X)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None):
        """Fit the singular vectors of ``X`` and project ``X`` on them.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components)
            ``X @ components_.T`` (dense).
        """
        caller = Caller(X)
        op = validate_X(self, X, reset=True, strategy=self.strategy, device=self.device)
        xp = op.xp
        n_samples, n_features = op.shape
        if n_features < 2:
            raise ValueError(
                f"Found array with {n_features} feature(s) (shape={op.shape}) while "
                f"a minimum of 2 is required by {type(self).__name__}."
            )
        random_state = check_random_state(self.random_state)
        if self.algorithm == "arpack":
            v0 = _init_arpack_v0(min(op.shape), random_state)
            U, Sigma, Vt = _arpack_svd(op, self.n_components, v0, tol=self.tol)
        else:
            if self.n_components > n_features:
                raise ValueError(
                    f"n_components({self.n_components}) must be <="
                    f" n_features({n_features})."
                )
            U, Sigma, Vt = _randomized_svd(
                op,
                self.n_components,
                random_state,
                n_oversamples=self.n_oversamples,
                n_iter=self.n_iter,
                power_iteration_normalizer=self.power_iteration_normalizer,
                flip_sign=False,
            )
            U, Vt = _svd_flip(xp, U, Vt, u_based_decision=False)
        # Fitted attributes stay where the fit ran (ARPACK's come from the host).
        Vt = asarray_on(Vt, xp, op.device, op.dtype)
        if self.algorithm == "arpack" and self.tol == 0:
            Z = asarray_on(U * Sigma, xp, op.device, op.dtype)
        else:
            # scikit-learn projects again: U is only approximate here.
            Z = op.matmul(xp.matrix_transpose(Vt))
        self.components_ = Vt
        self.explained_variance_ = xp.var(Z, axis=0)
        self.explained_variance_ratio_ = self.explained_variance_ / _total_variance(op)
        self.singular_values_ = asarray_on(Sigma, xp, op.device, op.dtype)
        return caller.give(Z)

    def transform(self, X):
        """Project ``X`` on the singular vectors: ``X @ components_.T``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Data; a dataset is projected through its factorized operator.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components)
            Projections (dense).
        """
        check_is_fitted(self)
        caller = Caller(X)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        components = asarray_on(self.components_, op.xp, op.device)
        return caller.give(op.matmul(op.xp.matrix_transpose(components)))

    def inverse_transform(self, X):
        """Map projections back to the data space: ``X @ components_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components)
            Projections.

        Returns
        -------
        X_original : ndarray of shape (n_samples, n_features)
            Dense, in ``X``'s array type.
        """
        check_is_fitted(self)
        xp, device = input_namespace(X)
        if is_numpy_namespace(xp):
            X = check_array(X)
        return X @ asarray_on(self.components_, xp, device)

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`)."""
        from ilargi_sklearn.planner._work import Work, int_param

        params = self.get_params(deep=False)
        r = int_param(params, "n_components", 2)
        if self.algorithm == "randomized":
            q = r + int_param(params, "n_oversamples", 10)
            n_iter = int_param(params, "n_iter", 5)
            # The range finder: a matmul, then n_iter power iterations (rmatmul
            # and matmul, normalized by LU or QR of the n x q block), B = Q^T A.
            return Work(
                "svd",
                "randomized",
                m=q,
                iterations=n_iter,
                passes=n_iter + 1.0,
                passes_per_iteration=1.0,
                scales_with_iterations=("common_flops",),
                common_flops=4.0 * data["n_rows"] * q * q * (n_iter + 1),
            )
        it = 3 * r + 10  # ARPACK: Lanczos steps of one column each
        return Work(
            "svd", "arpack", iterations=it, passes=float(it), passes_per_iteration=1.0
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags
