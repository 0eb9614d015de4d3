"""MultiSourceDataset: several source tables and the metadata that joins them."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    is_numpy_namespace,
)
from ilargi_sklearn.multisource import (
    _cache_info,
    _describe,
    _matrices,
    _origin,
    _placement,
)
from ilargi_sklearn.multisource._describe import DatasetDescription  # noqa: F401
from ilargi_sklearn.multisource._matrices import _check_dtype
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
    Operator,
)

__all__ = ["DatasetDescription", "MultiSourceDataset", "as_operator"]


class MultiSourceDataset:
    """Several source tables plus the data-integration metadata that joins them.

    The joined ("target") matrix ``T = sum_k I_k S_k M_k^T`` is never built unless
    :meth:`materialize` is called: products, reductions and row slicing run on the
    sources and index vectors. Build one with :meth:`from_frames` (from pandas
    DataFrames and join specifications) or :meth:`from_matrices` (from source
    matrices, indicators and mappings).

    Unmatched rows of left and outer joins contribute zeros to ``T`` (zero imputation).

    Notes
    -----
    ``np.asarray(ds)`` raises a ``TypeError``: converting implicitly would build the
    join behind the user's back. Call :meth:`materialize` to build it on purpose, or
    use the factorized estimators and transformers, which take the dataset directly.

    Examples
    --------
    >>> import numpy as np
    >>> from ilargi_sklearn import MultiSourceDataset
    >>> base = np.array([[1.0], [2.0], [3.0]])
    >>> dim = np.array([[10.0, 0.0], [20.0, 1.0]])
    >>> ds = MultiSourceDataset.from_matrices([base, dim], [None, np.array([0, 1, 1])])
    >>> ds.shape
    (3, 3)
    >>> ds.materialize()
    array([[ 1., 10.,  0.],
           [ 2., 20.,  1.],
           [ 3., 20.,  1.]])
    >>> ds @ np.ones(3)
    array([11., 23., 24.])
    """

    # Keep NumPy from broadcasting ``ndarray @ ds`` itself: defer to __rmatmul__.
    __array_ufunc__ = None

    def __init__(
        self,
        operator: Operator,
        feature_names: Sequence[str],
        source_names: Sequence[str],
        *,
        base_source: int | None = None,
        categories: dict[str, list[Any]] | None = None,
        allows_nan: bool = False,
    ) -> None:
        self._op = operator
        # Built with NaN kept as missing values (``allow_nan=True``): only the
        # estimators that route missing values take it (``validate_X``).
        self._allows_nan = bool(allows_nan)
        self._has_nan: str | bool | None = None
        self._feature_names = np.asarray(list(feature_names), dtype=object)
        if self._feature_names.shape[0] != operator.n_cols:
            raise ValueError(
                f"got {self._feature_names.shape[0]} feature names for "
                f"{operator.n_cols} target columns."
            )
        self._source_names = list(source_names)
        self._base_source = base_source
        self.categories_ = dict(categories or {})
        #: The encoding to build new data alike (datasets built from frames).
        self.schema_: Any = None
        # The builder's match report (one dict per join), as a frame on request.
        self._match_report: list[dict[str, Any]] | None = None
        # Lineage for caches that outlive one fit (the planner's materialization
        # cache): every row slice shares its root's token and knows its root rows.
        self._root_token = object()
        self._root_rows: np.ndarray | None = None
        self._root_operator = operator
        # The digest of ``_root_rows`` once the statistics' key needed it, shared
        # by the slices of one index array (``_lineage``).
        self._rows_memo: dict[str, Any] = {}
        # For an implicit scaling of another dataset's operator (a fitted
        # scaler's transform): that dataset's lineage record, so that the
        # statistics of the scaled rows are keyed by the rows they scale.
        self._scaled_from: Any = None
        # The root's row origin: (base row of each root row or None for
        # arange, number of base rows or None for the root's length, the base
        # frame's index or None). Slices compose it with their root rows.
        self._origin: tuple[np.ndarray | None, int | None, pd.Index | None] = (
            None,
            None,
            None,
        )

    # ------------------------------------------------- builders (_matrices.py)
    from_matrices = classmethod(_matrices.from_matrices)
    from_frames = classmethod(_matrices.from_frames)
    union = classmethod(_matrices.union)

    # -------------------------------------------------------------- properties
    @property
    def shape(self) -> tuple[int, int]:
        """``(n_rows, n_features)`` of the joined matrix."""
        return self._op.shape

    @property
    def dtype(self) -> np.dtype:
        return self._op.dtype

    @property
    def ndim(self) -> int:
        return 2

    @property
    def feature_names(self) -> np.ndarray:
        """Names of the target columns, ``"{source}__{column}"``."""
        return self._feature_names.copy()

    @property
    def allows_nan(self) -> bool:
        """Whether the dataset was built keeping NaN as missing values
        (``from_matrices(allow_nan=True)``, ``Join(impute="missing")``)."""
        return getattr(self, "_allows_nan", False)

    @property
    def source_names(self) -> list[str]:
        return list(self._source_names)

    @property
    def n_sources(self) -> int:
        return len(self._source_names)

    @property
    def operator(self) -> Operator:
        """The operator behind the dataset (what the kernels compute with)."""
        return self._op

    @property
    def nbytes(self) -> int:
        """Bytes held by sources and index vectors (shared sources counted once)."""
        return self._op.nbytes

    def __len__(self) -> int:
        return self._op.n_rows

    @property
    def device(self) -> Any:
        """Where the sources live: ``"cpu"`` for NumPy/SciPy, else their device."""
        return self._op.device

    def _like(
        self, op: Operator, *, root: bool = False, feature_names: Any = None
    ) -> MultiSourceDataset:
        """A dataset of the same schema on operator ``op``.

        ``op`` has this dataset's rows (its origin is this dataset's base rows), or
        with ``root`` its root's rows (its origin is the root's). ``feature_names``
        names the columns of an ``op`` of another width (a transformer's output,
        such as degree-2 interactions); default: this dataset's names.
        """
        out = MultiSourceDataset(
            op,
            self._feature_names if feature_names is None else feature_names,
            self._source_names,
            base_source=self._base_source,
            categories=self.categories_,
            allows_nan=self._allows_nan,
        )
        out.schema_ = self.schema_
        out._match_report = self._match_report
        if isinstance(op, AffineOperator) and op.base is self._op:
            from ilargi_sklearn.multisource._lineage import scaled_from

            out._scaled_from = scaled_from(self)
        if root or self._root_rows is None:
            out._origin = self._origin
        else:
            out._origin = (self.base_rows_, self.n_base_rows_, self._origin[2])
        return out

    def astype(self, dtype: Any) -> MultiSourceDataset:
        """A copy with sources cast to ``dtype`` (float32 or float64)."""
        dtype = _check_dtype(dtype)
        if dtype == self.dtype:
            return self
        return self._like(self._op.astype(dtype))

    # ----------------------------------------------------------------- slicing
    def __getitem__(self, key: Any) -> MultiSourceDataset:
        if isinstance(key, tuple):
            # ``key[1] == slice(None)`` alone would compare an array element-wise.
            if len(key) == 2 and (
                key[1] is Ellipsis
                or (isinstance(key[1], slice) and key[1] == slice(None))
            ):
                key = key[0]
            elif len(key) == 1:
                key = key[0]
            else:
                raise IndexError(
                    "MultiSourceDataset selects rows only: use ds[rows] or ds[rows, ...]."
                )
        from ilargi_sklearn.multisource._slices import gathered_rows

        # A new dataset every time (its attributes are its own); the gathered
        # rows underneath are shared by the slices of one index array.
        op, rows, memo = gathered_rows(self, key, lambda: self._gather(key))
        out = self._like(op, root=True)
        out._root_token = self._root_token
        out._root_operator = self._root_operator
        out._root_rows = rows
        out._rows_memo = memo
        return out

    def _gather(self, key: Any) -> tuple[Operator, np.ndarray, dict[str, Any]]:
        """The operator of rows ``key``, the rows in the root, and the memo of
        their digest (filled by the statistics' key, ``_lineage``)."""
        n = len(self)
        if isinstance(key, slice):
            rows = np.arange(n)[key]
        elif isinstance(key, numbers.Integral):
            raise IndexError(
                f"MultiSourceDataset selects sets of rows: use ds[{key}:{key + 1}] "
                f"or ds[[{key}]] instead of ds[{key}]."
            )
        else:
            key = np.asarray(key)
            if key.dtype == bool:
                if key.shape != (n,):
                    raise IndexError(
                        f"boolean mask has shape {key.shape}, expected ({n},)."
                    )
                rows = np.flatnonzero(key)
            elif key.dtype.kind in "iu" and key.ndim == 1:
                rows = np.arange(n)[key]
            elif key.size == 0:
                rows = np.zeros(0, dtype=np.int64)
            else:
                raise IndexError(
                    f"rows must be an integer array, a boolean mask or a slice; got "
                    f"dtype {key.dtype} with shape {key.shape}."
                )
        root_rows = rows if self._root_rows is None else self._root_rows[rows]
        return self._op.take_rows(rows), root_rows, {}

    # --------------------------------------------------------------- operators
    def _operand(self, W: Any) -> Any:
        """An operand in the dataset's namespace and on its device (NumPy: asarray)."""
        xp = self._op.xp
        if is_numpy_namespace(xp):
            return np.asarray(W)
        return asarray_on(W, xp, self._op.device)

    def _check_rhs(self, W: Any, n: int, side: str) -> np.ndarray:
        if isinstance(W, MultiSourceDataset):
            raise TypeError("the product of two MultiSourceDatasets is not supported.")
        W = self._operand(W)
        if W.ndim not in (1, 2) or W.shape[0] != n:
            raise ValueError(
                f"{side} operand has shape {W.shape}; expected ({n},) or ({n}, k)."
            )
        return W

    def __matmul__(self, W: Any) -> np.ndarray:
        """``T @ W`` for ``W`` of shape ``(n_features,)`` or ``(n_features, k)``."""
        return self._op.matmul(self._check_rhs(W, self.shape[1], "right"))

    def __rmatmul__(self, Y: Any) -> np.ndarray:
        """``Y @ T`` for ``Y`` of shape ``(n_rows,)`` or ``(k, n_rows)``."""
        Y = self._operand(Y)
        if Y.ndim == 1:
            return self._op.rmatmul(self._check_rhs(Y, len(self), "left"))
        if Y.ndim != 2 or Y.shape[1] != len(self):
            raise ValueError(
                f"left operand has shape {Y.shape}; expected (k, {len(self)})."
            )
        return self._op.rmatmul(Y.T).T

    @property
    def T(self) -> _Transposed:
        """Lazy transpose: ``ds.T @ Y`` computes ``T^T Y`` without materializing."""
        return _Transposed(self)

    def gram(self, weights: Any = None, format: str = "auto") -> Any:
        """``T^T T`` (or ``T^T diag(weights) T``) computed from the sources.

        Parameters
        ----------
        weights : array-like of shape (n_rows,), optional
            Row weights.
        format : {"auto", "dense", "sparse"}, default="auto"
            "auto" returns a CSR matrix when any source is sparse, else an ndarray.
        """
        if weights is not None:
            weights = self._check_rhs(weights, len(self), "weights")
            if weights.ndim != 1:
                raise ValueError("weights must be 1-D.")
        return self._op.gram(weights, format=format)

    def sum(self, axis: int | None = None) -> Any:
        """Sum of ``T`` over rows (``axis=0``), columns (``axis=1``) or all cells."""
        if axis is None:
            return self._op.col_sums().sum()
        if axis == 0:
            return self._op.col_sums()
        if axis == 1:
            return self._op.row_sums()
        raise ValueError(f"axis must be 0, 1 or None, got {axis!r}.")

    def row_norms(self, squared: bool = True) -> np.ndarray:
        """Euclidean norm of each row of ``T`` (squared by default)."""
        sq = self._op.row_sq_norms()
        return sq if squared else np.sqrt(np.maximum(sq, 0))

    def _scaled(self, c: Any) -> MultiSourceDataset:
        if not isinstance(c, numbers.Real) or isinstance(c, bool):
            raise TypeError(
                f"MultiSourceDataset supports scalar multiplication only, got {type(c).__name__}."
            )
        if isinstance(self._op, AffineOperator):
            op = AffineOperator(self._op.base, self._op.scale * c, self._op.offset)
        else:
            op = AffineOperator(self._op, np.full(self.shape[1], c, dtype=self.dtype))
        return self._like(op)

    def __mul__(self, c: Any) -> MultiSourceDataset:
        return self._scaled(c)

    __rmul__ = __mul__

    def __truediv__(self, c: Any) -> MultiSourceDataset:
        if isinstance(c, numbers.Real) and c == 0:
            raise ZeroDivisionError("division of a MultiSourceDataset by zero.")
        return self._scaled(1.0 / c if isinstance(c, numbers.Real) else c)

    def __neg__(self) -> MultiSourceDataset:
        return self._scaled(-1.0)

    def __pow__(self, p: Any) -> MultiSourceDataset:
        if not isinstance(p, numbers.Real) or p <= 0:
            raise ValueError(
                f"ds ** {p!r}: only powers p > 0 keep unmatched (zero) cells at zero and "
                "can be applied per source; call materialize() for other powers."
            )
        if not isinstance(self._op, FactorizedMatrix):
            raise ValueError(
                "ds ** p is not factorizable on a scaled or centered dataset; apply it "
                "before scaling."
            )
        return self._like(self._op.power(p))

    def _no_shift(self, *_: Any) -> Any:
        raise TypeError(
            "adding a scalar or array to a MultiSourceDataset would change the zero cells "
            "of unmatched rows, so it cannot be applied per source; use "
            "FactorizedStandardScaler for implicit centering, or materialize() first."
        )

    __add__ = __radd__ = __sub__ = __rsub__ = _no_shift

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(
            f"a MultiSourceDataset of shape {self.shape} is not converted to a dense array "
            "implicitly, since that would build the whole join. Call ds.materialize() to "
            "build it on purpose, or use the factorized estimators and transformers "
            "(for example FactorizedStandardScaler instead of StandardScaler)."
        )

    def materialize(self, format: str = "auto") -> Any:
        """Build the joined matrix ``T``.

        Parameters
        ----------
        format : {"auto", "dense", "sparse"}, default="auto"
            "auto" returns CSR when any source is sparse, else a dense ndarray.

        Returns
        -------
        ndarray or scipy.sparse.csr_matrix of shape (n_rows, n_features)
        """
        return self._op.materialize(format)

    def _factorized(self) -> FactorizedMatrix:
        op = self._op
        while isinstance(op, AffineOperator):
            op = op.base
        if not isinstance(op, FactorizedMatrix):  # pragma: no cover - defensive
            raise TypeError("dataset is not factorized.")
        return op

    # Methods whose code (and numpydoc) live in the module of their concern.
    # ------------------------------------------------------ placement, caches
    to_device = _placement.to_device
    operator_for = _cache_info.operator_for
    cache_info = _cache_info.cache_info
    _cache_device = _cache_info.cache_device
    # ------------------------------------------------------------ row origin
    base_rows_ = property(_origin.base_rows)
    n_base_rows_ = property(_origin.n_base_rows)
    align = _origin.align
    _set_origin = _origin.set_origin
    # ------------------------------------------------------------ describing
    describe = _describe.describe
    match_report_ = property(_describe.match_report)
    nan_source = _describe.nan_source
    __repr__ = _describe.dataset_repr


class _Transposed:
    """``ds.T``: a lazy transpose that only supports ``@``."""

    __array_ufunc__ = None

    def __init__(self, ds: MultiSourceDataset) -> None:
        self._ds = ds

    @property
    def shape(self) -> tuple[int, int]:
        return self._ds.shape[::-1]

    @property
    def T(self) -> MultiSourceDataset:
        return self._ds

    def __matmul__(self, Y: Any) -> np.ndarray:
        Y = self._ds._check_rhs(Y, len(self._ds), "right")
        return self._ds.operator.rmatmul(Y)

    def __rmatmul__(self, X: Any) -> np.ndarray:
        X = self._ds._operand(X)
        if X.ndim == 1:
            return self._ds @ X
        return (self._ds @ X.T).T

    def __repr__(self) -> str:
        return f"{self._ds!r}.T"


def as_operator(X: Any) -> Operator:
    """The operator of a dataset, or a :class:`MatrixOperator` over an array."""
    if isinstance(X, MultiSourceDataset):
        return X.operator
    if isinstance(X, Operator):
        return X
    return MatrixOperator(X)
