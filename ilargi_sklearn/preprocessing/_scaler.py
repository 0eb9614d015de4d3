"""Standardization with the centering and scaling kept inside the operators."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.base import (
    BaseEstimator,
    OneToOneFeatureMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.validation import check_is_fitted

from ilargi_sklearn._backend._namespace import asarray_on, namespace_dtype, to_numpy
from ilargi_sklearn.multisource import AffineOperator, MultiSourceDataset
from ilargi_sklearn.multisource._statistics import column_variances
from ilargi_sklearn.utils._validation import (
    DEVICE_OPTIONS,
    Caller,
    DeviceMixin,
    validate_fit_inputs,
    validate_X,
)

__all__ = ["FactorizedStandardScaler"]


def _mean_var(op, sample_weight):
    """Weighted column means and (biased) variances from factorized column sums.

    The sums are those of the design with its columns of large mean shifted by a
    pilot value (:func:`~ilargi_sklearn.multisource._statistics.column_variances`): ``E[x^2]
    - E[x]^2`` of the raw columns would lose a column whose mean is large against
    its spread (at a ratio of 1e8, all of it). The n-length reductions run where
    ``op`` lives; the (n_features,) sums come to the host, where the statistics
    are finished in float64.
    """
    return column_variances(op, sample_weight)


def _affine(op, offset, factor, *, inverse, centered):
    """``(A - offset) * factor``, or ``A / factor + offset`` when ``inverse``, of
    the matrix of ``op`` (``offset`` and ``factor`` host float64 vectors).

    Dense data are transformed where they live, in float64, and rounded once to
    their dtype. A SciPy sparse matrix is only scaled, by a diagonal product that
    keeps it sparse; ``centered`` (a fit with ``with_mean``) raises for it, as in
    scikit-learn.
    """
    A = op.A
    if sp.issparse(A):
        if centered:
            what = "uncenter" if inverse else "center"
            raise ValueError(
                f"Cannot {what} sparse matrices: pass `with_mean=False` instead."
            )
        d = 1.0 / factor if inverse else factor
        return sp.csr_matrix(A @ sp.diags(d.astype(A.dtype)))
    xp, device = op.xp, op.device
    offset = asarray_on(offset, xp, device)
    factor = asarray_on(factor, xp, device)
    out = A / factor + offset if inverse else (A - offset) * factor
    return xp.astype(out, namespace_dtype(xp, op.dtype), copy=False)


class FactorizedStandardScaler(
    DeviceMixin,
    OneToOneFeatureMixin,
    TransformerMixin,
    BaseEstimator,
    auto_wrap_output_keys=None,
):
    """Standardize features by removing the mean and scaling to unit variance.

    Fitted from factorized column statistics (``1^T T`` and ``1^T (T o T)``, of
    the design with its columns of large mean shifted by a pilot value, so that
    the variances do not cancel). On a
    :class:`~ilargi_sklearn.MultiSourceDataset`, :meth:`transform` returns a dataset
    whose centering and scaling are applied implicitly inside its operators: the
    sources are untouched and stay sparse, and the join is never built. On an array it
    behaves as :class:`sklearn.preprocessing.StandardScaler`.

    Parameters
    ----------
    with_mean : bool, default=True
        Center the features. Centering a dataset is implicit (no densification);
        centering a sparse array raises, as in scikit-learn.
    with_std : bool, default=True
        Scale the features to unit variance.
    copy : bool, default=True
        Kept for scikit-learn compatibility; inputs are never modified.
    device : {"auto", "cpu", "gpu"}, default="auto"
        Where ``fit`` computes the column statistics: "auto" where the data lives,
        "cpu", or "gpu" (CuPy; a dataset is moved once and its device copy
        cached). The statistics are finished on the host and then stored where
        the fit ran. :meth:`transform` answers in the caller's array type: a
        dataset stays where it is (its scaling is implicit, nothing is computed),
        an array is scaled on the compute device and returned in its own
        namespace. Pickles hold NumPy arrays. "gpu" without a usable GPU raises a
        ``RuntimeError`` with the probe's reason.

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,) or None
        Weighted column means (None when ``with_mean=False`` and ``with_std=False``).
    var_ : ndarray of shape (n_features,) or None
        Column variances (None when ``with_std=False``).
    scale_ : ndarray of shape (n_features,) or None
        Per-feature scale; near-constant features get 1, as in scikit-learn.
    n_samples_seen_ : int or float
        Number of samples (sum of sample weights when given).
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features,)
        Feature names, when ``X`` has them.

    See Also
    --------
    sklearn.preprocessing.StandardScaler : The scikit-learn counterpart on arrays.

    Notes
    -----
    The transformed dataset represents ``(T - 1 mean^T) diag(1 / scale)``: products
    become ``T (D w) - 1 (mean^T D w)`` and ``D (T^T y - mean (1^T y))``, so every
    factorized estimator consumes it without materializing.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.preprocessing import FactorizedStandardScaler
    >>> ds = MultiSourceDataset.from_matrices(
    ...     [np.array([[1.0], [2.0], [3.0]]), np.array([[10.0], [20.0]])],
    ...     [None, np.array([0, 1, 1])])
    >>> Z = FactorizedStandardScaler().fit_transform(ds)
    >>> type(Z).__name__
    'MultiSourceDataset'
    >>> np.round(Z.materialize(), 3)
    array([[-1.225, -1.414],
           [ 0.   ,  0.707],
           [ 1.225,  0.707]])
    """

    _parameter_constraints: dict = {
        "with_mean": ["boolean"],
        "with_std": ["boolean"],
        "copy": ["boolean"],
        "device": [StrOptions(set(DEVICE_OPTIONS))],
    }

    def __init__(self, *, with_mean=True, with_std=True, copy=True, device="auto"):
        self.with_mean = with_mean
        self.with_std = with_std
        self.copy = copy
        self.device = device

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, sample_weight=None):
        """Compute the mean and standard deviation of each feature.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape (n_samples, n_features)
            Training data.
        y : None
            Ignored.
        sample_weight : array-like of shape (n_samples,), default=None
            Individual weights for each sample.

        Returns
        -------
        self : object
            Fitted scaler.
        """
        op, _, sample_weight, w_sum = validate_fit_inputs(self, X, None, sample_weight)
        if (
            self.with_mean
            and sp.issparse(getattr(op, "A", None))
            and not isinstance(X, MultiSourceDataset)
        ):
            raise ValueError(
                "Cannot center sparse matrices: pass `with_mean=False` instead, or wrap "
                "the data in a MultiSourceDataset, which centers implicitly."
            )
        mean, var = _mean_var(op, sample_weight)
        dtype = op.dtype
        self.n_samples_seen_ = op.n_rows if sample_weight is None else w_sum
        self.mean_ = mean.astype(dtype) if (self.with_mean or self.with_std) else None
        if self.with_std:
            eps = np.finfo(np.float64).eps
            n = float(self.n_samples_seen_)
            constant = var <= n * eps * var + (n * mean * eps) ** 2
            scale = np.sqrt(var)
            scale[constant | (scale < 10 * np.finfo(scale.dtype).eps)] = 1.0
            self.var_ = var.astype(dtype)
            self.scale_ = scale.astype(dtype)
        else:
            self.var_ = None
            self.scale_ = None
        # Fitted attributes stay where the fit ran.
        for name in ("mean_", "var_", "scale_"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, asarray_on(value, op.xp, op.device))
        return self

    def _offset_scale(self):
        """Host (NumPy) offset and inverse scale: small, moved where needed."""
        n = self.n_features_in_
        offset = to_numpy(self.mean_) if self.with_mean else np.zeros(n)
        inv = 1.0 / to_numpy(self.scale_) if self.with_std else np.ones(n)
        return offset, inv

    def transform(self, X, copy=None):
        """Center and scale ``X``.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape (n_samples, n_features)
            Data to scale.
        copy : bool, default=None
            Ignored; inputs are never modified.

        Returns
        -------
        X_tr : {ndarray, sparse matrix, MultiSourceDataset} of shape (n_samples, n_features)
            A dataset (scaling implicit) for a dataset input, else an array.
        """
        check_is_fitted(self)
        if isinstance(X, MultiSourceDataset):
            # Nothing is computed: the dataset keeps its device and the scaling
            # becomes part of its operator (moved there once, parameter-sized).
            validate_X(self, X, reset=False)
            offset, inv = self._offset_scale()
            return X._like(AffineOperator(X.operator, inv, offset))
        caller = Caller(X)
        op = validate_X(self, X, reset=False, device=self.device)
        offset, inv = self._offset_scale()
        return caller.give(
            _affine(op, offset, inv, inverse=False, centered=self.with_mean)
        )

    def inverse_transform(self, X, copy=None):
        """Undo the scaling of an array (datasets: call on the materialized array).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Scaled data.
        copy : bool, default=None
            Ignored; inputs are never modified.

        Returns
        -------
        X_original : {ndarray, sparse matrix} of shape (n_samples, n_features)
        """
        check_is_fitted(self)
        if isinstance(X, MultiSourceDataset):
            raise TypeError(
                "inverse_transform takes arrays; call it on X.materialize() for a dataset."
            )
        caller = Caller(X)
        op = validate_X(self, X, reset=False, device=self.device)
        offset, inv = self._offset_scale()
        return caller.give(
            _affine(op, offset, inv, inverse=True, centered=self.with_mean)
        )

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`):
        the column sums and sums of squares, one pass."""
        from ilargi_sklearn.planner._work import Work

        return Work("moments", "sums", passes=1.0, column_sum_passes=1.0)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # Sparse arrays are accepted only without centering (datasets always are).
        tags.input_tags.sparse = not self.with_mean
        tags.input_tags.allow_nan = False
        return tags
