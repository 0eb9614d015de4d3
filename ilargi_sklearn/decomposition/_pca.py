"""Factorized PCA: the eigendecomposition of the implicitly centered gram.

scikit-learn's ``PCA(svd_solver="covariance_eigh")`` forms ``X^T X``, subtracts
``n mu mu^T`` and takes the eigendecomposition of the result over ``n - 1``. The
gram and the means are exactly what :func:`~ilargi_sklearn.multisource._statistics.centered_gram`
computes through the operator protocol, so the fit reads the data once, never
centers it (sparsity and the factorization survive) and ends in a
(n_features, n_features) eigenproblem on the host. ``transform`` is
``T V - 1 (mu^T V)``, one factorized ``matmul``; ``score_samples`` adds one
``row_sq_norms``.

For data too wide for that eigenproblem, the truncated solvers ("arpack",
"randomized") of :mod:`~ilargi_sklearn.decomposition._svd` run on the implicitly
centered operator instead, as scikit-learn's PCA runs them on sparse input.
"""

from __future__ import annotations

from math import log
from numbers import Integral, Real

import numpy as np
from scipy import linalg
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.decomposition._pca import _infer_dimension
from sklearn.utils import check_array, check_random_state
from sklearn.utils._arpack import _init_arpack_v0
from sklearn.utils._param_validation import Interval, RealNotInt, StrOptions
from sklearn.utils.extmath import fast_logdet
from sklearn.utils.validation import check_is_fitted

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_numpy_namespace,
    namespace_dtype,
    numpy_dtype,
)
from ilargi_sklearn._backend._plan import DEVICE_OPTIONS, STRATEGIES
from ilargi_sklearn.decomposition._svd import (
    _arpack_svd,
    _randomized_svd,
    _svd_flip,
    _total_variance,
)
from ilargi_sklearn.multisource import AffineOperator
from ilargi_sklearn.multisource._statistics import (
    centered_gram,
    choose_shift,
    host64,
    shifted_design,
)
from ilargi_sklearn.utils._validation import (
    Caller,
    DeviceMixin,
    input_namespace,
    validate_X,
)

__all__ = ["FactorizedPCA"]


# --------------------------------------------------------------------------- kernels
def _covariance_eigh(op, lineage=None):
    """The spectrum of the sample covariance of ``T``, largest first.

    scikit-learn's ``covariance_eigh`` steps on the centered gram of
    :func:`centered_gram` (float64 on the host): ``C = G / (n - 1)``, NumPy's
    ``eigh``, eigenvalues reversed and clipped at zero, singular values
    ``sqrt(lambda (n - 1))``, and the sign of each eigenvector fixed by its
    largest entry (``svd_flip(None, V^T, u_based_decision=False)``). The gram is
    shared on ``op``'s ``lineage`` where it is given (a search's candidates).

    Returns
    -------
    mean : ndarray of shape (n_features,)
    explained_variance : ndarray of shape (n_features,)
    singular_values : ndarray of shape (n_features,)
    Vt : ndarray of shape (n_features, n_features)
        Eigenvectors as rows.
    """
    n_samples = op.n_rows
    stats = centered_gram(op, None, True, lineage=lineage)
    eigvals, eigvecs = np.linalg.eigh(stats.G / (n_samples - 1))
    eigvals = np.maximum(eigvals[::-1], 0.0)
    _, Vt = _svd_flip(np, None, np.ascontiguousarray(eigvecs[:, ::-1].T), False)
    return stats.mu, eigvals, np.sqrt(eigvals * (n_samples - 1)), Vt


def _truncated_svd_centered(op, n_components, solver, random_state, **params):
    """scikit-learn's truncated PCA solvers ("arpack", "randomized") on the
    implicitly centered operator ``T - 1 mu^T``.

    scikit-learn centers sparse input implicitly too (``_implicit_column_offset``);
    here the offset lives in an :class:`AffineOperator`, whose products are
    ``T X - 1 (mu^T X)`` and ``T^T Y - mu (1^T Y)``: the sources are never
    centered, so the sparse ones stay sparse. The total variance (``ddof=1``)
    comes from the factorized column sums of squares.

    Returns
    -------
    mean : ndarray of shape (n_features,)
    U : array of shape (n_samples, n_components)
    S : array of shape (n_components,)
    Vt : array of shape (n_components, n_features)
    total_var : float
    """
    # The design with its columns of large mean shifted (T = W + 1 k^T): centered,
    # its products never form the large values (multisource._statistics.shifted_design).
    W, k = shifted_design(op, choose_shift(op))
    mean_w = host64(W.col_sums()) / op.n_rows
    mean = k + mean_w
    total_var = _total_variance(op, ddof=1)
    centered = AffineOperator(W, offset=mean_w)
    if solver == "arpack":
        v0 = _init_arpack_v0(min(op.shape), random_state)
        U, S, Vt = _arpack_svd(centered, n_components, v0, tol=params["tol"])
    else:
        U, S, Vt = _randomized_svd(
            centered,
            n_components,
            random_state,
            n_oversamples=params["n_oversamples"],
            n_iter=params["iterated_power"],
            power_iteration_normalizer=params["power_iteration_normalizer"],
            flip_sign=False,
        )
        U, Vt = _svd_flip(op.xp, U, Vt, u_based_decision=False)
    return mean, U, S, Vt, total_var


def _n_kept(n_components, explained_variance, ratio, n_samples):
    """The number of components to keep, as scikit-learn resolves it."""
    if n_components == "mle":
        return int(_infer_dimension(explained_variance, n_samples))
    if 0 < n_components < 1.0:
        # side="right": the kept components explain strictly more than the
        # fraction asked for (scikit-learn #15669).
        return int(np.searchsorted(np.cumsum(ratio), n_components, side="right") + 1)
    return int(n_components)


def _shifted_rows(op, mean):
    """``(W, m)`` with ``T - 1 mean^T = W - 1 m^T``: ``W`` the design with its
    columns of large mean shifted (:func:`~ilargi_sklearn.multisource._statistics.shifted_design`),
    so that centering its rows subtracts small values, not large ones.

    ``mean`` lives where ``op`` does; so does ``m``.
    """
    W, k = shifted_design(op, choose_shift(op))
    if not np.any(k):
        return W, mean
    return W, mean - asarray_on(k, op.xp, op.device, numpy_dtype(mean.dtype))


def _project(op, components, mean, scale=None):
    """``(T - 1 mu^T) V^T`` as ``W V^T - 1 (m^T V^T)`` (:func:`_shifted_rows`),
    divided by ``scale``.

    ``components`` (k x d), ``mean`` and ``scale`` live where ``op`` does.
    """
    xp = op.xp
    W, m = _shifted_rows(op, mean)
    Vt = xp.matrix_transpose(components)
    Z = W.matmul(Vt) - xp.reshape(m, (1, -1)) @ Vt
    return Z if scale is None else Z / scale


def _whiten_scale(xp, explained_variance):
    """``sqrt(explained_variance)`` floored at its dtype's eps (scikit-learn's)."""
    scale = xp.sqrt(explained_variance)
    eps = float(np.finfo(numpy_dtype(scale.dtype)).eps)
    floor = xp.asarray(eps, dtype=scale.dtype, device=device_of(scale))
    return xp.where(scale < eps, floor, scale)


# ------------------------------------------------------------------------ estimator
class FactorizedPCA(
    DeviceMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator
):
    """Principal component analysis on a multi-source dataset without the join.

    The principal axes are the eigenvectors of the sample covariance of the
    joined matrix ``T``, computed from its factorized gram: the same model as
    :class:`sklearn.decomposition.PCA` with ``svd_solver="covariance_eigh"`` on
    the materialized table. The data are centered implicitly, never copied, so
    sparse sources stay sparse.

    Parameters
    ----------
    n_components : int, float, "mle" or None, default=None
        Number of components to keep, with scikit-learn's meaning: an int in
        ``[0, min(n_samples, n_features)]``; a float in (0, 1), the smallest number
        of components whose explained variance ratio exceeds it; "mle", Minka's
        MLE of the dimension (needs ``n_samples >= n_features``); None,
        ``min(n_samples, n_features)``. The truncated solvers take an int in
        ``[1, min(n_samples, n_features)]`` (below it for "arpack"; None is
        ``min(n_samples, n_features) - 1`` there).
    whiten : bool, default=False
        Divide the projections by ``sqrt(explained_variance_)`` (unit variance
        components). :meth:`inverse_transform` undoes it.
    svd_solver : {"covariance_eigh", "arpack", "randomized"}, \
            default="covariance_eigh"
        * "covariance_eigh": the eigendecomposition of the covariance, from the
          factorized gram; one pass over the data, then an (n_features,
          n_features) eigenproblem: the choice up to a few thousand features.
        * "arpack": ARPACK's truncated SVD (:func:`scipy.sparse.linalg.svds`) of
          the implicitly centered data, from products only (CPU only).
        * "randomized": Halko et al.'s randomized SVD of the implicitly centered
          data, from products only.

        The truncated solvers never form the gram, for wide (one-hot) data whose
        eigenproblem would be too large; their results equal scikit-learn's PCA
        with the same solver and ``random_state`` up to rounding. Unlike
        scikit-learn, "randomized" also takes sparse data (the centering stays
        implicit).
    tol : float, default=0.0
        ARPACK's tolerance ("arpack" only).
    iterated_power : int or "auto", default="auto"
        Power iterations of "randomized" ("auto": 7 when ``n_components`` is below
        a tenth of ``min(n_samples, n_features)``, else 4).
    n_oversamples : int, default=10
        Extra random directions of "randomized".
    power_iteration_normalizer : {"auto", "QR", "LU", "none"}, default="auto"
        Normalization between the power iterations of "randomized", as
        scikit-learn's ("auto": "none" for ``iterated_power <= 2``, else "LU").
    random_state : int, RandomState instance or None, default=None
        Seeds "arpack"'s starting vector and "randomized"'s random matrix, drawn
        as scikit-learn draws them.
    strategy : {"factorized", "materialized"}, default="factorized"
        For a :class:`~ilargi_sklearn.MultiSourceDataset`: compute on the sources
        ("factorized") or on the joined matrix built once ("materialized"). Arrays
        are always used as they are.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where the gram and the projections are computed: "auto" where the data
        lives, "cpu", or "gpu" (CuPy; a dataset is moved once and its device copy
        cached). The (n_features, n_features) eigenproblem always runs on the host
        in float64; "arpack" raises
        :class:`~ilargi_sklearn._backend._plan.UnsupportedOnDeviceError` on a
        device (use ``device="cpu"``); the fitted attributes stay where the fit
        ran, ``transform`` returns the caller's array type and pickles hold NumPy
        arrays. "gpu" without a usable GPU raises a ``RuntimeError`` with the
        probe's reason.

    Attributes
    ----------
    components_ : ndarray of shape (n_components_, n_features)
        Principal axes (unit rows), by decreasing explained variance, each with
        its largest entry (in absolute value) positive.
    explained_variance_ : ndarray of shape (n_components_,)
        Variance along each axis (eigenvalues of the covariance, ``ddof=1``).
    explained_variance_ratio_ : ndarray of shape (n_components_,)
        Fraction of the total variance along each axis.
    singular_values_ : ndarray of shape (n_components_,)
        Singular values of the centered data, ``sqrt((n_samples - 1)
        explained_variance_)``.
    mean_ : ndarray of shape (n_features,)
        Column means of the training data.
    n_components_ : int
        Number of components kept.
    n_samples_ : int
        Number of training samples.
    noise_variance_ : float
        Mean of the discarded eigenvalues (probabilistic PCA's noise variance);
        0.0 when none is discarded.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Names of the features seen during fit (datasets, and DataFrames with string
        column names).

    See Also
    --------
    sklearn.decomposition.PCA : The scikit-learn estimator this one reproduces
        (``svd_solver="covariance_eigh"``, "arpack" or "randomized").
    FactorizedTruncatedSVD : Factorized truncated SVD, without centering.
    FactorizedStandardScaler : Factorized standardization, often applied first.

    Notes
    -----
    With ``T = sum_k I_k S_k M_k^T`` the joined matrix and ``mu = T^T 1 / n`` its
    column means (factorized column sums), the covariance is

        ``C = (T^T T - n mu mu^T) / (n - 1)``,

    with ``T^T T`` assembled from per-source blocks and co-occurrence blocks of
    the sources (no joined row is formed). Formed as written, it would lose the
    columns whose mean is large against their spread (cancellation); the sums are
    those of ``W = T - 1 k^T``, whose columns of large mean are shifted by a pilot
    value (``k``, a value of the column) inside the factorized terms, which
    centering does not see (``docs/concepts.rst``). scikit-learn's own
    ``covariance_eigh`` cancels there; its ``"full"`` solver does not, and this
    one agrees with it. ``C = V diag(lambda) V^T`` on the host; the projection of
    new data is ``(T - 1 mu^T) V = W V - 1 ((mu - k)^T V)``, one factorized product
    with ``n_components_`` columns, and the log-likelihood of
    :meth:`score_samples` needs the squared row norms of ``W - 1 (mu - k)^T``,
    which are ``rownorms(W)^2 - 2 W (mu - k) + ||mu - k||^2``.

    The truncated solvers run on the operator ``W - 1 (mu - k)^T`` whose products
    are ``W X - 1 ((mu - k)^T X)`` and ``W^T Y - (mu - k) (1^T Y)``
    (:class:`~ilargi_sklearn.multisource.AffineOperator`); the total variance of
    ``explained_variance_ratio_`` is ``sum_j (s2_j - n m_j^2) / (n - 1)`` from the
    factorized column sums ``n m`` and sums of squares ``s2`` of ``W``.

    Accuracy: forming the gram squares the condition number, as scikit-learn's
    ``covariance_eigh`` does: eigenvalues far below the largest (below about
    ``1e-8`` of it in float64) carry absolute errors of that order (a zero
    singular value comes out near ``sqrt(eps)`` times the largest), and
    eigenvectors of (nearly) equal eigenvalues are determined only up to a rotation
    within their eigenspace. The gram is accumulated in the data's dtype and its
    eigenproblem solved in float64. Where the two largest entries of a component
    are equal in magnitude (duplicate one-hot columns), which one decides its sign
    is left to rounding, here as in scikit-learn.

    References
    ----------
    Tipping, M. E. and Bishop, C. M., "Probabilistic Principal Component
    Analysis", JRSS B 61(3), 1999.

    Minka, T. P., "Automatic choice of dimensionality for PCA", NIPS 2000.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.decomposition import FactorizedPCA
    >>> rng = np.random.default_rng(0)
    >>> base = rng.standard_normal((200, 2))
    >>> dim = rng.standard_normal((20, 3))
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, rng.integers(0, 20, 200)])
    >>> pca = FactorizedPCA(n_components=2).fit(ds)
    >>> pca.components_.shape, pca.n_components_
    ((2, 5), 2)
    >>> from sklearn.decomposition import PCA
    >>> ref = PCA(n_components=2, svd_solver="covariance_eigh").fit(ds.materialize())
    >>> bool(np.allclose(pca.transform(ds), ref.transform(ds.materialize())))
    True
    >>> bool(np.allclose(pca.explained_variance_, ref.explained_variance_))
    True
    """

    _parameter_constraints: dict = {
        "n_components": [
            Interval(Integral, 0, None, closed="left"),
            Interval(RealNotInt, 0, 1, closed="neither"),
            StrOptions({"mle"}),
            None,
        ],
        "whiten": ["boolean"],
        "svd_solver": [StrOptions({"covariance_eigh", "arpack", "randomized"})],
        "tol": [Interval(Real, 0, None, closed="left")],
        "iterated_power": [
            StrOptions({"auto"}),
            Interval(Integral, 0, None, closed="left"),
        ],
        "n_oversamples": [Interval(Integral, 1, None, closed="left")],
        "power_iteration_normalizer": [StrOptions({"auto", "QR", "LU", "none"})],
        "random_state": ["random_state"],
        "strategy": [StrOptions(set(STRATEGIES))],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(
        self,
        n_components=None,
        *,
        whiten=False,
        svd_solver="covariance_eigh",
        tol=0.0,
        iterated_power="auto",
        n_oversamples=10,
        power_iteration_normalizer="auto",
        random_state=None,
        strategy="factorized",
        device="auto",
    ):
        self.n_components = n_components
        self.whiten = whiten
        self.svd_solver = svd_solver
        self.tol = tol
        self.iterated_power = iterated_power
        self.n_oversamples = n_oversamples
        self.power_iteration_normalizer = power_iteration_normalizer
        self.random_state = random_state
        self.strategy = strategy
        self.device = device

    def _check_n_components(self, n_samples, n_features):
        """``n_components`` resolved and checked as scikit-learn's PCA does for
        the solver."""
        solver = self.svd_solver
        n_components = self.n_components
        if n_components is None:
            n_components = min(n_samples, n_features) - (solver == "arpack")
        if solver == "covariance_eigh":
            if n_components == "mle":
                if n_samples < n_features:
                    raise ValueError(
                        "n_components='mle' is only supported if n_samples >= "
                        "n_features"
                    )
            elif not 0 <= n_components <= min(n_samples, n_features):
                raise ValueError(
                    f"n_components={n_components} must be between 0 and "
                    f"min(n_samples, n_features)={min(n_samples, n_features)} with "
                    "svd_solver='covariance_eigh'"
                )
            return n_components
        if isinstance(n_components, str):
            raise ValueError(
                f"n_components={n_components!r} cannot be a string with "
                f"svd_solver='{solver}'"
            )
        if not 1 <= n_components <= min(n_samples, n_features):
            raise ValueError(
                f"n_components={n_components!r} must be between 1 and "
                f"min(n_samples, n_features)={min(n_samples, n_features)!r} with "
                f"svd_solver='{solver}'"
            )
        if solver == "arpack" and n_components == min(n_samples, n_features):
            raise ValueError(
                f"n_components={n_components!r} must be strictly less than "
                f"min(n_samples, n_features)={min(n_samples, n_features)!r} with "
                f"svd_solver='{solver}'"
            )
        return n_components

    def _fit(self, X):
        """Fit; returns the operator and, for the truncated solvers, ``U`` (which
        ``fit_transform`` scales, as scikit-learn's does)."""
        op, lineage = validate_X(
            self,
            X,
            reset=True,
            strategy=self.strategy,
            device=self.device,
            return_lineage=True,
        )
        xp = op.xp
        n_samples, n_features = op.shape
        name = type(self).__name__
        if n_samples < 2:
            # scikit-learn divides by n - 1 = 0 and fails in eigh.
            raise ValueError(
                f"n_samples={n_samples}: {name} needs at least 2 samples to estimate "
                "a covariance."
            )
        n_components = self._check_n_components(n_samples, n_features)
        U = None
        if self.svd_solver == "covariance_eigh":
            mean, ev, S, Vt = _covariance_eigh(op, lineage)
            ratio = ev / ev.sum()
            k = _n_kept(n_components, ev, ratio, n_samples)
            noise = float(np.mean(ev[k:])) if k < min(n_features, n_samples) else 0.0
            ev, ratio, S, Vt = ev[:k], ratio[:k], S[:k], Vt[:k]
        else:
            k = int(n_components)
            mean, U, S, Vt, total_var = _truncated_svd_centered(
                op,
                k,
                self.svd_solver,
                check_random_state(self.random_state),
                tol=self.tol,
                iterated_power=self.iterated_power,
                n_oversamples=self.n_oversamples,
                power_iteration_normalizer=self.power_iteration_normalizer,
            )
            S = host64(S)
            ev = S**2 / (n_samples - 1)
            ratio = ev / total_var
            noise = 0.0
            if k < min(n_features, n_samples):
                noise = (total_var - ev.sum()) / (min(n_features, n_samples) - k)

        # Fitted attributes stay where the fit ran, in the data's dtype.
        def place(a):
            if isinstance(a, np.ndarray):
                a = np.ascontiguousarray(a)
            return asarray_on(a, xp, op.device, op.dtype)

        self.mean_ = place(mean)
        self.components_ = place(Vt)
        self.explained_variance_ = place(ev)
        self.explained_variance_ratio_ = place(ratio)
        self.singular_values_ = place(S)
        self.noise_variance_ = np.dtype(op.dtype).type(noise)
        self.n_components_ = k
        self.n_samples_ = n_samples
        return op, (None if U is None else place(U))

    def _transform_op(self, op):
        xp = op.xp
        components = asarray_on(self.components_, xp, op.device)
        mean = asarray_on(self.mean_, xp, op.device)
        scale = None
        if self.whiten:
            scale = _whiten_scale(
                xp, asarray_on(self.explained_variance_, xp, op.device)
            )
        return _project(op, components, mean, scale)

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Fit the principal axes of ``X``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        self : FactorizedPCA
            Fitted estimator.
        """
        self._fit(X)
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def fit_transform(self, X, y=None):
        """Fit the principal axes of ``X`` and project ``X`` on them.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Training data.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components_)
            Projections (whitened when ``whiten=True``).
        """
        caller = Caller(X)
        op, U = self._fit(X)
        if U is None:  # covariance_eigh computes no U
            return caller.give(self._transform_op(op))
        # scikit-learn's truncated solvers return the scaled U: X V = U S.
        if self.whiten:
            return caller.give(U * float(np.sqrt(op.n_rows - 1)))
        return caller.give(U * asarray_on(self.singular_values_, op.xp, op.device))

    def transform(self, X):
        """Project ``X`` on the principal axes: ``(X - mean_) @ components_.T``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Data; a dataset is projected through its factorized operator.

        Returns
        -------
        X_new : ndarray of shape (n_samples, n_components_)
            Projections (whitened when ``whiten=True``).
        """
        check_is_fitted(self)
        caller = Caller(X)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        return caller.give(self._transform_op(op))

    def inverse_transform(self, X):
        """Map projections back to the data space.

        ``X @ components_ + mean_`` (with the components scaled by
        ``sqrt(explained_variance_)`` when ``whiten=True``): the exact inverse of
        :meth:`transform` on the span of the components.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components_)
            Projections.

        Returns
        -------
        X_original : ndarray of shape (n_samples, n_features)
            Dense, in ``X``'s array type.
        """
        check_is_fitted(self)
        xp, device = input_namespace(X)
        if is_numpy_namespace(xp):
            X = check_array(X, input_name="X", dtype=[np.float64, np.float32])
        components = asarray_on(self.components_, xp, device)
        if self.whiten:
            ev = asarray_on(self.explained_variance_, xp, device)
            components = xp.sqrt(ev)[:, None] * components
        return X @ components + asarray_on(self.mean_, xp, device)

    def _host_model(self):
        """``(components, explained_variance, noise_variance)`` as float64 NumPy,
        the components scaled by ``sqrt(explained_variance)`` when whitening (as
        scikit-learn's generative model takes them)."""
        V = host64(self.components_)
        ev = host64(self.explained_variance_)
        if self.whiten:
            V = V * np.sqrt(ev)[:, None]
        return V, ev, float(self.noise_variance_)

    def _give_like_components(self, a):
        V = self.components_
        return asarray_on(a, get_namespace(V), device_of(V), numpy_dtype(V.dtype))

    def _covariance64(self):
        V, ev, noise = self._host_model()
        diff = np.where(ev > noise, ev - noise, 0.0)
        cov = (V.T * diff) @ V
        cov.flat[:: cov.shape[0] + 1] += noise
        return cov

    def _precision64(self):
        n_features = self.components_.shape[1]
        V, ev, noise = self._host_model()
        if self.n_components_ == 0:
            return np.eye(n_features) / noise
        if noise == 0.0:
            return linalg.inv(self._covariance64())
        # The matrix inversion lemma: one (k, k) inverse instead of (d, d).
        diff = np.where(ev > noise, ev - noise, 0.0)
        with np.errstate(divide="ignore"):
            inner = V @ V.T / noise + np.diag(1.0 / diff)
        precision = V.T @ linalg.inv(inner) @ V / -(noise**2)
        precision.flat[:: n_features + 1] += 1.0 / noise
        return precision

    def get_covariance(self):
        """The data covariance of the probabilistic PCA model.

        ``components_.T @ diag(explained_variance_ - noise_variance_) @ components_
        + noise_variance_ I``, as scikit-learn's ``PCA.get_covariance``.

        Returns
        -------
        cov : ndarray of shape (n_features, n_features)
            Where ``components_`` lives, in its dtype.
        """
        check_is_fitted(self)
        return self._give_like_components(self._covariance64())

    def get_precision(self):
        """The inverse of :meth:`get_covariance`, by the matrix inversion lemma.

        Returns
        -------
        precision : ndarray of shape (n_features, n_features)
            Where ``components_`` lives, in its dtype.
        """
        check_is_fitted(self)
        return self._give_like_components(self._precision64())

    def score_samples(self, X):
        """The log-likelihood of each sample under the probabilistic PCA model.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Data.

        Returns
        -------
        ll : ndarray of shape (n_samples,)
            Log-likelihood of each sample.

        Notes
        -----
        With ``x_r = x - mean_`` and the precision ``P = c I + R`` (``c`` the
        inverse noise variance, ``R`` in the span of the components ``V``), the
        quadratic form is ``c ||x_r||^2 + z^T (V R V^T) z`` with ``z = V x_r``:
        one factorized product with ``n_components_ + 1`` columns and the squared
        row norms. Where the noise variance is zero with fewer components than
        features, the precision has no such form and the full (n_features columns)
        projection on its eigenvectors is used.
        """
        check_is_fitted(self)
        caller = Caller(X)
        op = validate_X(
            self, X, reset=False, strategy=self.strategy, device=self.device
        )
        xp = op.xp
        n_features = op.n_cols
        precision = self._precision64()
        V0 = host64(self.components_)
        mu = host64(self.mean_)
        noise = float(self.noise_variance_)
        k = V0.shape[0]
        if noise > 0.0 or k == n_features:
            c = 1.0 / noise if noise > 0.0 else 0.0
            R = precision - c * np.eye(n_features)
            W, M = V0, V0 @ R @ V0.T
        else:
            c = 0.0
            lam, W = np.linalg.eigh(precision)
            W, M = W.T, np.diag(lam)
        # The rows relative to the mean as those of the shifted design relative
        # to its own (``x - mean_ = w - m``): the norms below then subtract small
        # values, not the squares of large means.
        op, m = _shifted_rows(op, asarray_on(mu, xp, op.device))
        mu = host64(m)
        # One product gives W m and W V^T (in the data's dtype); the quadratic
        # form is then summed in float64 where the data live.
        B = asarray_on(np.column_stack([mu, W.T]), xp, op.device, op.dtype)
        f64 = namespace_dtype(xp, np.float64)
        P = xp.astype(op.matmul(B), f64)
        Tmu = P[:, 0]
        Z = P[:, 1:] - asarray_on(mu @ W.T, xp, op.device)
        quad = xp.sum((Z @ asarray_on(M, xp, op.device)) * Z, axis=1)
        if c:
            row_sq = xp.astype(op.row_sq_norms(), f64)
            quad = quad + c * (row_sq - 2.0 * Tmu + float(mu @ mu))
        const = 0.5 * (n_features * log(2.0 * np.pi) - float(fast_logdet(precision)))
        ll = -0.5 * quad - const
        return caller.give(xp.astype(ll, namespace_dtype(xp, op.dtype)))

    def score(self, X, y=None):
        """The average log-likelihood of the samples.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape \
                (n_samples, n_features)
            Data.
        y : Ignored
            Not used, present for API consistency.

        Returns
        -------
        ll : float
            Mean of :meth:`score_samples`.
        """
        ll = self.score_samples(X)
        return float(get_namespace(ll).mean(ll))

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`)."""
        from ilargi_sklearn.planner._work import Work, int_param

        n, d = data["n_rows"], data["n_features"]
        params = self.get_params(deep=False)
        r = int_param(params, "n_components", min(n, d))
        if self.svd_solver == "randomized":
            q = r + int_param(params, "n_oversamples", 10)
            n_iter = int_param(
                params, "iterated_power", 7 if r < 0.1 * min(n, d) else 4
            )
            return Work(
                "svd",
                "randomized",
                m=q,
                iterations=n_iter,
                passes=n_iter + 1.5,
                passes_per_iteration=1.0,
                scales_with_iterations=("common_flops",),
                column_sum_passes=0.5,
                common_flops=4.0 * n * q * q * (n_iter + 1),
            )
        if self.svd_solver == "arpack":
            it = 3 * r + 10  # Lanczos steps of one column each
            return Work(
                "svd",
                "arpack",
                iterations=it,
                passes=it + 0.5,
                passes_per_iteration=1.0,
                column_sum_passes=0.5,
            )
        # The gram and the column means (half a pass); an eigendecomposition.
        return Work(
            "pca",
            "eigh",
            passes=0.5,
            grams=1,
            column_sum_passes=0.5,
            common_flops=4.0 * d**3,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags
