"""MultiSourceDataset: several source tables and the metadata that joins them."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_cupy_namespace,
    is_numpy_namespace,
    to_numpy,
)
from ilargi_sklearn.multisource import _describe, _matrices, _placement
from ilargi_sklearn.multisource._describe import DatasetDescription
from ilargi_sklearn.multisource._matrices import _check_dtype
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
    Operator,
)

__all__ = ["DatasetDescription", "MultiSourceDataset", "as_operator"]


def _no_frames_builder(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover
    raise RuntimeError("ilargi_sklearn.multisource._frames did not register.")


#: ``from_frames`` (``multisource._frames``). The join builder stands above the
#: container (it makes datasets, and so do the schemas it records), so the
#: container cannot import it: that module registers it when it loads, which
#: ``import ilargi_sklearn.multisource`` always does.
_frames_builder: Callable[..., Any] = _no_frames_builder


def register_frames_builder(build: Callable[..., Any]) -> None:
    """Set the builder behind :meth:`MultiSourceDataset.from_frames`."""
    global _frames_builder
    _frames_builder = build


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
        # The root's row origin: (base row of each root row or None for
        # arange, number of base rows or None for the root's length, the base
        # frame's index or None). Slices compose it with their root rows.
        self._origin: tuple[np.ndarray | None, int | None, pd.Index | None] = (
            None,
            None,
            None,
        )

    # ---------------------------------------------------------------- builders
    @classmethod
    def from_matrices(
        cls,
        sources: Sequence[Any],
        indicators: Sequence[Any],
        mappings: Sequence[Any] | None = None,
        feature_names: Sequence[str] | None = None,
        *,
        source_names: Sequence[str] | None = None,
        priority: Sequence[int] | None = None,
        dtype: Any = np.float64,
        allow_nan: bool = False,
    ) -> MultiSourceDataset:
        """Build a dataset from source matrices, indicators and mappings.

        Parameters
        ----------
        sources : list of {ndarray, sparse matrix}
            Source ``k`` has shape ``(r_k, c_k)``.
        indicators : list of {ndarray of int, sparse matrix, None}
            Indicator of each source: an index vector of length ``n_rows`` (source
            row of each target row, -1 for no match), a sparse binary matrix of shape
            ``(n_rows, r_k)`` with at most one 1 per row, or None for the identity.
        mappings : list of {ndarray of int, None}, optional
            Target column of each source column (-1: unused). None (the default)
            concatenates the sources' columns in order.
        feature_names : list of str, optional
            Names of the target columns; default ``"{source}__{j}"``.
        source_names : list of str, optional
            Default ``"s0", "s1", ...``.
        priority : list of int, optional
            Ownership order for target columns that several sources supply; default
            the order of the sources (DESIGN.md 2.1).
        dtype : {np.float64, np.float32}, default=np.float64
            Dtype of the sources and of every operator result.
        allow_nan : bool, default=False
            Keep NaN in the sources as missing values (infinite values still
            raise). Such a dataset is taken by the estimators that route missing
            values (the gradient-boosted trees); the others raise a
            ``ValueError`` on it, and its products propagate NaN.

        Returns
        -------
        MultiSourceDataset

        Notes
        -----
        Index vectors are checked (integers in ``[-1, r_k)``, one per target row)
        and copied: the dataset owns its copies, so that a later write to the
        caller's arrays never changes it (and no kernel reads outside a source).
        """
        return _matrices.from_matrices(
            cls,
            sources,
            indicators,
            mappings,
            feature_names,
            source_names=source_names,
            priority=priority,
            dtype=dtype,
            allow_nan=allow_nan,
        )

    @classmethod
    def from_frames(
        cls,
        base: pd.DataFrame,
        base_features: Sequence[str] = (),
        joins: Sequence[Any] = (),
        **kwargs: Any,
    ) -> MultiSourceDataset:
        """Build a dataset from DataFrames and :class:`Join` specifications.

        See :func:`ilargi_sklearn.multisource.from_frames` for the parameters.
        """
        return _frames_builder(base, base_features, joins, **kwargs)

    @classmethod
    def union(cls, datasets: Sequence[MultiSourceDataset]) -> MultiSourceDataset:
        """Stack same-schema datasets row-wise without copying their sources.

        Parameters
        ----------
        datasets : list of MultiSourceDataset
            Datasets with identical feature names and dtype.

        Returns
        -------
        MultiSourceDataset
            Target rows of the first dataset, then those of the second, and so on.
        """
        return _matrices.union(cls, datasets)

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

    def nan_source(self) -> str | None:
        """The name of a source holding NaN (None when none does).

        Only a dataset that :attr:`allows_nan` can hold NaN; the answer is
        computed once (the sources are never modified).
        """
        if not self.allows_nan:
            return None
        if getattr(self, "_has_nan", None) is None:
            found: str | bool = False
            for t in self._factorized().terms:
                S = to_numpy(t.S)
                vals = S.data if sp.issparse(S) else S
                if np.isnan(vals).any():
                    found = self._source_names[t.source]
                    break
            self._has_nan = found
        return self._has_nan or None

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

    def operator_for(self, strategy: str = "factorized") -> Operator:
        """The operator a fit with ``strategy`` computes with.

        ``"factorized"``: :attr:`operator`. ``"materialized"``: the operator over
        the joined matrix, under the same implicit scaling and centering; the join
        of the root dataset (the one row slices come from) is built once and
        cached for every fit on it and its slices (a grid search's folds), see
        :func:`~ilargi_sklearn.planner.set_materialization_cache`. This is the one
        place where the package decides to build the join.

        Parameters
        ----------
        strategy : {"factorized", "materialized"}

        Returns
        -------
        Operator
        """
        from ilargi_sklearn.multisource._cache import materialized_operator

        if strategy == "factorized":
            return self._op
        if strategy != "materialized":
            raise ValueError(
                f"strategy must be 'factorized' or 'materialized', got {strategy!r}."
            )
        return materialized_operator(self, self._cache_device())[0]

    def cache_info(self) -> dict[str, Any]:
        """What the package's caches hold for this dataset's root.

        A row slice (a cross-validation fold) shares its root's entries, so this
        reports the same for the root and every slice of it.

        Returns
        -------
        dict
            ``"materialized"``: the root's joined matrix (``devices`` it is cached
            for, ``bytes``), see
            :func:`~ilargi_sklearn.planner.set_materialization_cache`;
            ``"statistics"``: the gram-based fits' sufficient statistics
            (``entries``, ``bytes``, ``hits``, ``misses``, ``downdates`` and
            ``fallbacks`` of the downdating guard, the cache's ``budget_bytes`` and
            ``total_bytes`` over all datasets), see
            :func:`~ilargi_sklearn.multisource.set_statistics_cache`.

        Examples
        --------
        >>> import numpy as np
        >>> from ilargi_sklearn import MultiSourceDataset
        >>> from ilargi_sklearn.linear_model import FactorizedRidge
        >>> rng = np.random.default_rng(0)
        >>> ds = MultiSourceDataset.from_matrices(
        ...     [rng.normal(size=(8, 2)), rng.normal(size=(3, 2))],
        ...     [None, np.array([0, 1, 2, 0, 1, 2, 0, 1])],
        ... )
        >>> _ = FactorizedRidge().fit(ds, rng.normal(size=8))
        >>> info = ds.cache_info()["statistics"]
        >>> info["entries"], info["misses"]
        (2, 2)
        """
        from ilargi_sklearn.multisource._cache import _CACHE
        from ilargi_sklearn.multisource._stats_cache import statistics_cache_info

        return {
            "materialized": _CACHE.info(self._root_token),
            "statistics": statistics_cache_info(self),
        }

    def _cache_device(self) -> str:
        """The materialization cache's key for where the sources live (a plan's
        device name where it is one)."""
        if is_numpy_namespace(self._op.xp):
            return "cpu"
        return "gpu" if is_cupy_namespace(self._op.xp) else str(self.device)

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

    def to_device(self, device: Any = "cpu", *, namespace: Any = None) -> Any:
        """The same dataset with sources and index vectors on ``device``.

        The move happens once per dataset: the copy of the root dataset (the one
        that row slices come from) is cached on it, and a row slice moved to a
        device takes its rows from that copy (a grid search does not re-upload
        per fold). Index vectors are int32 on the device.

        Parameters
        ----------
        device : {"cpu", "gpu"} or device object, default="cpu"
            "gpu" uses CuPy on the current CUDA device and requires a usable GPU
            (:func:`ilargi_sklearn._backend._gpu.probe_gpu`). Another namespace's
            device object (for example ``array_api_strict.Device("device1")``)
            needs ``namespace``.
        namespace : module, optional
            Array namespace for a device object (testing without a GPU).

        Returns
        -------
        MultiSourceDataset
            ``self`` when the data already is there.

        Raises
        ------
        RuntimeError
            For "gpu" without a usable GPU; the message carries the probe's reason.
        """
        return _placement.to_device(self, device, namespace=namespace)

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
        if root or self._root_rows is None:
            out._origin = self._origin
        else:
            out._origin = (self.base_rows_, self.n_base_rows_, self._origin[2])
        return out

    def _set_origin(
        self, rows: np.ndarray | None, n_base_rows: int, index: Any
    ) -> None:
        """Record the base row of each row (None: row ``i`` is base row ``i``)."""
        self._origin = (rows, int(n_base_rows), index)

    @property
    def match_report_(self) -> pd.DataFrame | None:
        """How each join matched, one row per join (datasets built from frames).

        Columns: ``how``, ``on`` (the key equation), ``rows`` (rows the join was
        applied to: those its left table matched), ``matched``, ``fraction``,
        ``null_keys`` (rows whose key is missing: they match nothing),
        ``unmatched_keys`` (a few key values that found no partner), ``hazards``
        (likely key mistakes, looked for whenever a key is unmatched),
        ``rows_out`` (rows after the join), ``fan_out`` (rows of the table per
        matched row: 1 for a lookup, more where keys repeat in the table) and
        ``repeated_keys`` (a few keys that matched several rows). None for
        datasets built from matrices.
        """
        return _describe.match_report_frame(self._match_report)

    # ------------------------------------------------------------- row origin
    @property
    def base_rows_(self) -> np.ndarray:
        """The base-table row each dataset row comes from (-1: none).

        Inner joins drop base rows and one-to-many joins repeat them, so the
        dataset's rows are no longer the base table's: row ``i`` comes from base
        row ``base_rows_[i]``; -1 marks rows an outer join added from another table.
        It stays right through row slicing (``ds[rows]``), :meth:`union` (the parts'
        base tables one after the other), ``via`` joins and relationship tables
        without base features. Datasets built from matrices are their own base.
        Use :meth:`align` to take base-aligned values into dataset order.
        """
        rows = self._origin[0]
        if rows is None:
            rows = np.arange(self._root_operator.n_rows, dtype=np.int64)
        return rows.copy() if self._root_rows is None else rows[self._root_rows]

    @property
    def n_base_rows_(self) -> int:
        """Rows of the base table(s) the dataset was built from."""
        n = self._origin[1]
        return self._root_operator.n_rows if n is None else n

    def align(self, values: Any, *, fill_value: Any = None) -> Any:
        """Take base-aligned values (target, weights, groups) into dataset order.

        Parameters
        ----------
        values : array-like, pandas.Series or pandas.DataFrame
            One value (or row) per row of the base table, in its order: for example
            ``base["price"]``, a weight per base row, the groups of ``GroupKFold``.
            A pandas object must carry the base frame's index (it is checked, so
            values of another frame or order are never matched by position);
            pass ``.to_numpy()`` to align by position.
        fill_value : scalar, optional
            The value of dataset rows without a base row (rows an outer join added).
            Default: such rows raise a ``ValueError``.

        Returns
        -------
        ndarray, pandas.Series or pandas.DataFrame
            ``values`` at :attr:`base_rows_`, one per dataset row; pandas objects
            get a fresh ``RangeIndex``.

        Examples
        --------
        >>> import pandas as pd
        >>> from ilargi_sklearn import Join, MultiSourceDataset
        >>> base = pd.DataFrame({"k": [1, 2, 3], "y": [10.0, 20.0, 30.0]})
        >>> dim = pd.DataFrame({"k": [1, 3, 3], "z": [0.5, 1.5, 2.5]})
        >>> ds = MultiSourceDataset.from_frames(
        ...     base,
        ...     joins=[
        ...         Join(dim, on="k", features=["z"], how="inner", validate="1:m")
        ...     ],
        ... )
        >>> ds.base_rows_
        array([0, 2, 2])
        >>> ds.align(base["y"]).tolist()
        [10.0, 30.0, 30.0]
        """
        rows = self.base_rows_
        n_base = self.n_base_rows_
        missing = rows < 0
        if missing.any() and fill_value is None:
            raise ValueError(
                f"{int(missing.sum()):,} dataset rows have no base row (an outer join "
                "added them); pass fill_value=..., or drop them first with "
                "ds[ds.base_rows_ >= 0]."
            )
        take = np.where(missing, 0, rows) if missing.any() else rows
        if isinstance(values, (pd.Series, pd.DataFrame)):
            self._check_index(values, n_base)
            out = values.iloc[take].reset_index(drop=True)
            if missing.any():
                mask = (
                    missing
                    if out.ndim == 1
                    else np.repeat(missing[:, None], out.shape[1], axis=1)
                )
                out = out.mask(mask, fill_value)
            return out
        if not hasattr(values, "__array_namespace__"):
            # Lists, polars and pyarrow columns: through NumPy.
            values = np.asarray(values)
        if values.ndim == 0 or values.shape[0] != n_base:
            raise ValueError(
                f"values have shape {tuple(values.shape)}, but the dataset was built "
                f"from {n_base:,} base rows; align takes one value per base row, in "
                "the base table's order."
            )
        if isinstance(values, np.ndarray):
            out = values[take]
            if missing.any():
                out = out.astype(np.result_type(out, np.asarray(fill_value)))
                out[missing] = fill_value
            return out
        xp = get_namespace(values)
        out = xp.take(values, asarray_on(take, xp, device_of(values)), axis=0)
        if missing.any():
            raise ValueError(
                "fill_value is only supported for NumPy and pandas values."
            )
        return out

    def _check_index(self, values: Any, n_base: int) -> None:
        if values.shape[0] != n_base:
            raise ValueError(
                f"values have {values.shape[0]:,} rows, but the dataset was built from "
                f"{n_base:,} base rows; align takes one value per base row, in the "
                "base table's order."
            )
        index = self._origin[2]
        if index is not None and not values.index.equals(index):
            raise ValueError(
                "the values' index differs from the base table's: they may come from "
                "another frame or another order. Pass values.to_numpy() if they are "
                "in the base table's row order."
            )

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
        from ilargi_sklearn.multisource._stats_cache import cached_slice

        return cached_slice(self, key, lambda: self._take(key))

    def _take(self, key: Any) -> MultiSourceDataset:
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
        out = self._like(self._op.take_rows(rows), root=True)
        out._root_token = self._root_token
        out._root_operator = self._root_operator
        out._root_rows = rows if self._root_rows is None else self._root_rows[rows]
        return out

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
        # Only the source rows that some target row takes are raised to the power;
        # the others become 0. Otherwise a row outside the join (dropped by an inner
        # join or a slice) could turn into NaN (a negative value to a fractional
        # power) or inf, and the reductions (counts of 0 times NaN) would be NaN.
        used: dict[int, np.ndarray] = {}
        for t in self._op.terms:
            mask = used.setdefault(id(t.S), np.zeros(t.S.shape[0], dtype=bool))
            if t.rows.is_identity:
                mask[:] = True
            else:
                mask[t.rows.idx[t.rows.idx >= 0]] = True

        def power(S: Any) -> Any:
            keep = used[id(S)]
            if sp.issparse(S):
                if not keep.all():
                    S = sp.csr_matrix(sp.diags(keep.astype(S.dtype)) @ S)
                    S.eliminate_zeros()
                return S.power(p)
            if keep.all():
                return S**p
            out = np.zeros_like(S)
            out[keep] = S[keep] ** p
            return out

        op = self._op.map_sources(power)
        return self._like(op)

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

    # ------------------------------------------------------------- describing
    def _factorized(self) -> FactorizedMatrix:
        op = self._op
        while isinstance(op, AffineOperator):
            op = op.base
        if not isinstance(op, FactorizedMatrix):  # pragma: no cover - defensive
            raise TypeError("dataset is not factorized.")
        return op

    def describe(self) -> DatasetDescription:
        """Schema and redundancy figures (see :class:`DatasetDescription`)."""
        return _describe.describe(self)

    def __repr__(self) -> str:
        return _describe.dataset_repr(self)


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
