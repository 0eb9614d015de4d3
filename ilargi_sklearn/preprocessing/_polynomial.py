"""Degree-2 polynomial features whose output stays a MultiSourceDataset."""

from __future__ import annotations

from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_feature_names_in, check_is_fitted

from ilargi_sklearn._backend._namespace import is_numpy_namespace
from ilargi_sklearn.multisource import InteractionOperator, MultiSourceDataset
from ilargi_sklearn.multisource._interactions import n_output_features, pair_columns
from ilargi_sklearn.utils._validation import Caller, validate_X

__all__ = ["FactorizedPolynomialFeatures"]


class FactorizedPolynomialFeatures(
    TransformerMixin, BaseEstimator, auto_wrap_output_keys=None
):
    """Generate polynomial and interaction features of degree 2 over joins.

    On a :class:`~ilargi_sklearn.MultiSourceDataset`, :meth:`transform` returns a
    dataset whose operator evaluates the degree-2 features implicitly
    (:class:`~ilargi_sklearn.multisource.InteractionOperator`): the ``n x d^2``
    matrix is never built, and the estimators of the package fit on it through
    factorized products of the joined matrix. On an array it behaves as
    :class:`sklearn.preprocessing.PolynomialFeatures`: the same columns in the same
    order, as an array (CSR for sparse input).

    Parameters
    ----------
    degree : int, default=2
        1 (the bias and the features) or 2. Higher degrees and
        ``(min_degree, max_degree)`` tuples raise a ``ValueError``: materialize the
        dataset and use :class:`sklearn.preprocessing.PolynomialFeatures` for them.
    interaction_only : bool, default=False
        Only products of distinct features (no squares).
    include_bias : bool, default=True
        Include a column of ones first.
    order : {"C", "F"}, default="C"
        Memory order of a dense array output (NumPy only); datasets keep their
        features implicit.

    Attributes
    ----------
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Feature names, when ``X`` has them (a dataset always has).
    n_output_features_ : int
        Number of output features.
    powers_ : ndarray of shape (n_output_features_, n_features_in_)
        ``powers_[i, j]`` is the exponent of input ``j`` in output ``i``.

    See Also
    --------
    sklearn.preprocessing.PolynomialFeatures : The scikit-learn counterpart on
        arrays.
    FactorizedStandardScaler : Standardize first: the products of centered features
        are better conditioned.

    Notes
    -----
    The transformed dataset represents ``P = [1, T, T_a * T_b (a <= b)]`` for the
    joined matrix ``T`` of ``d`` columns. With ``w = [w_0, w_1, w_q]`` and ``W`` the
    symmetric ``d x d`` matrix of the quadratic weights ``w_q`` (off-diagonal
    entries halved),

    ``P w = w_0 + T w_1 + rowsum((T W) * T)``, and
    ``P^T g = [1^T g, T^T g, triu(T^T diag(g) T)]``,

    where ``T W`` is a factorized product (``S_k W`` once per source) and
    ``T^T diag(g) T`` the factorized weighted gram. A fit that iterates on products
    (logistic regression, L-BFGS) thus costs ``O(n d)`` per pass over the data instead
    of ``O(n d^2)``. The gram of ``P`` holds fourth-order sums and is computed from
    materialized blocks of rows: solvers that form normal equations (linear
    regression) pay ``O(n p^2)`` with ``p = n_output_features_``; the operator says
    so through ``prefers_products``.

    Unmatched rows of left and outer joins are 0 in ``T``, so their products are 0
    too (zero imputation, as for every factorized operator).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.preprocessing import PolynomialFeatures
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> from ilargi_sklearn.preprocessing import FactorizedPolynomialFeatures
    >>> ds = MultiSourceDataset.from_matrices(
    ...     [np.array([[1.0], [2.0], [3.0]]), np.array([[10.0], [20.0]])],
    ...     [None, np.array([0, 1, 1])])
    >>> poly = FactorizedPolynomialFeatures()
    >>> P = poly.fit_transform(ds)
    >>> type(P).__name__, P.shape
    ('MultiSourceDataset', (3, 6))
    >>> P.materialize()
    array([[  1.,   1.,  10.,   1.,  10., 100.],
           [  1.,   2.,  20.,   4.,  40., 400.],
           [  1.,   3.,  20.,   9.,  60., 400.]])
    >>> bool(np.allclose(P.materialize(),
    ...                  PolynomialFeatures(2).fit_transform(ds.materialize())))
    True
    >>> poly.get_feature_names_out()[3:].tolist()
    ['s0__0^2', 's0__0 s1__0', 's1__0^2']
    >>> P @ np.ones(6)
    array([123., 467., 493.])
    """

    _parameter_constraints: dict = {
        "degree": [Interval(Integral, 0, None, closed="left"), "array-like"],
        "interaction_only": ["boolean"],
        "include_bias": ["boolean"],
        "order": [StrOptions({"C", "F"})],
    }

    def __init__(
        self, degree=2, *, interaction_only=False, include_bias=True, order="C"
    ):
        self.degree = degree
        self.interaction_only = interaction_only
        self.include_bias = include_bias
        self.order = order

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Record the number and names of the input features.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape (n_samples, n_features)
            The data.
        y : None
            Ignored.

        Returns
        -------
        self : object
            Fitted transformer.
        """
        if not isinstance(self.degree, Integral) or self.degree not in (1, 2):
            raise ValueError(
                f"degree={self.degree!r}: only degree 1 or 2 is supported over joins; "
                "materialize and use sklearn.preprocessing.PolynomialFeatures for "
                "higher degrees."
            )
        validate_X(self, X, reset=True)
        self.n_output_features_ = n_output_features(
            self.n_features_in_, self.degree, self.interaction_only, self.include_bias
        )
        return self

    def _operator(self, op):
        return InteractionOperator(
            op,
            degree=self.degree,
            interaction_only=self.interaction_only,
            include_bias=self.include_bias,
        )

    def transform(self, X):
        """Transform data to polynomial features.

        Parameters
        ----------
        X : {array-like, sparse matrix, MultiSourceDataset} of shape (n_samples, n_features)
            The data to transform.

        Returns
        -------
        XP : {ndarray, sparse matrix, MultiSourceDataset} of shape (n_samples, n_output_features_)
            A dataset (features implicit) for a dataset input, else an array: dense
            for dense input, CSR for sparse input.
        """
        check_is_fitted(self)
        if isinstance(X, MultiSourceDataset):
            # Nothing is computed: the products become part of the dataset's operator.
            validate_X(self, X, reset=False)
            return X._like(
                self._operator(X.operator), feature_names=self.get_feature_names_out()
            )
        caller = Caller(X)
        op = validate_X(self, X, reset=False)
        XP = self._operator(op).materialize()
        if self.order == "F" and not op.is_sparse:
            if not is_numpy_namespace(op.xp):
                raise ValueError(
                    "order='F' is only supported for NumPy arrays; use order='C'."
                )
            XP = np.asfortranarray(XP)
        return caller.give(XP)

    @property
    def powers_(self):
        """Exponent of each input in each output, ``(n_output_features_, n_features_in_)``."""
        check_is_fitted(self)
        d = self.n_features_in_
        rows = [np.zeros((1, d), dtype=np.int64)] if self.include_bias else []
        rows.append(np.eye(d, dtype=np.int64))
        if self.degree == 2:
            a, b = pair_columns(d, self.interaction_only)
            pairs = np.zeros((a.shape[0], d), dtype=np.int64)
            np.add.at(pairs, (np.arange(a.shape[0]), a), 1)
            np.add.at(pairs, (np.arange(a.shape[0]), b), 1)
            rows.append(pairs)
        return np.vstack(rows)

    def get_feature_names_out(self, input_features=None):
        """Get output feature names for transformation.

        Parameters
        ----------
        input_features : array-like of str or None, default=None
            Input features: ``feature_names_in_`` when None (``x0``, ``x1``, ... when
            ``X`` had no names); otherwise they must match ``feature_names_in_``
            where it is defined.

        Returns
        -------
        feature_names_out : ndarray of str objects
            ``"1"`` for the bias, ``"a"``, ``"a^2"`` and ``"a b"`` for the others, as
            in scikit-learn.
        """
        powers = self.powers_
        names = _check_feature_names_in(self, input_features)
        out = []
        for row in powers:
            terms = [
                names[j] if row[j] == 1 else f"{names[j]}^{row[j]}"
                for j in np.flatnonzero(row)
            ]
            out.append(" ".join(terms) if terms else "1")
        return np.asarray(out, dtype=object)

    def _plan_work(self, data, y):
        """The work of a fit, for the planner (:mod:`ilargi_sklearn.planner._work`):
        the fit reads the shape only; the expansion is implicit."""
        from ilargi_sklearn.planner._work import Work

        return Work("expansion", "shape", passes=0.0)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags
