"""Input validation shared by every estimator: one entry point for datasets and arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils.validation import validate_data

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    is_numpy_namespace,
    namespace_dtype,
    numpy_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._plan import (
    DEVICE_OPTIONS,
    STRATEGIES,
    DeviceUnavailableError,
)
from ilargi_sklearn.multisource import MatrixOperator, MultiSourceDataset, Operator
from ilargi_sklearn.multisource._lineage import lineage_of

__all__ = [
    "DEVICE_OPTIONS",
    "STRATEGIES",
    "Caller",
    "DeviceMixin",
    "check_device",
    "check_real",
    "check_strategy",
    "input_namespace",
    "validate_X",
]


def check_device(device: str) -> str:
    """Validate a ``device`` parameter; ``"gpu"`` also requires a usable GPU.

    Raises
    ------
    ValueError
        For a value outside :data:`DEVICE_OPTIONS`.
    DeviceUnavailableError
        For ``"gpu"`` when the GPU probe fails; the message carries its reason.
    """
    if device not in DEVICE_OPTIONS:
        raise ValueError(f"device must be one of {DEVICE_OPTIONS}, got {device!r}.")
    if device == "gpu":
        from ilargi_sklearn._backend._gpu import probe_gpu

        usable, reason = probe_gpu()
        if not usable:
            raise DeviceUnavailableError(
                f"device='gpu' was requested but no GPU is usable: {reason}."
            )
    return device


def input_namespace(X: Any) -> tuple[Any, Any]:
    """``(xp, device)`` where ``X`` (array or dataset) lives: results go back there."""
    if isinstance(X, MultiSourceDataset):
        return X.operator.xp, X.device
    if isinstance(X, (np.ndarray, list, tuple)) or not hasattr(X, "shape"):
        return get_namespace(), "cpu"
    try:
        xp = get_namespace(X)
    except TypeError:  # pandas and other array-likes
        return get_namespace(), "cpu"
    return xp, device_of(X)


class Caller:
    """Where the caller's data lives, to hand results back there.

    Made once at the boundary of a public method (``Caller(X)``, before ``X`` is
    validated or moved to the estimator's device); :meth:`give` returns an array
    computed in any namespace in the caller's namespace and on its device. NumPy
    results for a NumPy caller come back unchanged (no copy).
    """

    __slots__ = ("device", "xp")

    def __init__(self, X: Any) -> None:
        self.xp, self.device = input_namespace(X)

    def give(self, out: Any) -> Any:
        """``out`` in the caller's namespace and on its device."""
        if out is None:
            return None
        xp = get_namespace(out)
        if xp is self.xp or (is_numpy_namespace(xp) and is_numpy_namespace(self.xp)):
            return out
        return asarray_on(out, self.xp, self.device)


class DeviceMixin:
    """Pickling that stores device arrays (CuPy, ...) as NumPy arrays.

    A model fitted on a GPU then loads on a machine without one; its attributes are
    NumPy after loading (``predict`` moves them to where the data is).
    """

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        return {k: (v if _is_host(v) else to_numpy(v)) for k, v in dict(state).items()}


def _is_host(v: Any) -> bool:
    if v is None or isinstance(v, (np.ndarray, str, bytes, int, float, bool, dict)):
        return True
    if isinstance(v, (list, tuple)) or not hasattr(v, "shape"):
        return True
    try:
        return is_numpy_namespace(get_namespace(v))
    except TypeError:
        return True


def _validate_device_array(estimator: Any, X: Any, reset: bool) -> Operator:
    """Light validation of a non-NumPy array, in its own namespace."""
    xp = get_namespace(X)
    name = type(estimator).__name__
    if X.ndim != 2:
        raise ValueError(
            f"Expected 2D array, got {X.ndim}D array instead (shape={X.shape})."
        )
    if X.shape[0] == 0:
        raise ValueError(
            f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 "
            f"is required by {name}."
        )
    kind = numpy_dtype(X.dtype).kind
    check_real(X, "X", name)
    if kind not in "biuf":
        raise ValueError(f"{name} expects numeric data, got dtype {X.dtype}.")
    if kind != "f":
        X = xp.astype(X, namespace_dtype(xp, np.float64))
    if not bool(xp.all(xp.isfinite(X))):
        raise ValueError("Input X contains NaN or infinity.")
    n_features = int(X.shape[1])
    if reset:
        estimator.n_features_in_ = n_features
        if hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
    else:
        _check_n_features(estimator, n_features, name)
    return MatrixOperator(X)


def on_operator_device(a: Any, op: Operator) -> bool:
    """Whether ``a`` is an array of ``op``'s non-NumPy namespace, on its device."""
    if is_numpy_namespace(op.xp) or not hasattr(a, "shape") or _is_host(a):
        return False
    try:
        return get_namespace(a) is op.xp and device_of(a) == op.device
    except TypeError:
        return False


def device_regression_target(estimator: Any, y: Any, op: Operator) -> Any | None:
    """A regression target that already lives on ``op``'s device, validated there.

    Returns ``y`` as a float64 ``(n_samples, n_targets)`` array on that device, or
    ``None`` when ``y`` is not an array of the operator's (non-NumPy) namespace and
    device: the caller then validates it on the host as usual. Checking in place
    saves a round trip of the whole target over the bus (two copies of 80 MB for
    1e7 rows). The checks and messages are those of scikit-learn's ``_check_y``.
    """
    if not on_operator_device(y, op):
        return None
    xp = op.xp
    name = type(estimator).__name__
    if y.ndim not in (1, 2):
        raise ValueError(
            f"y should be a 1d or 2d array, got an array of shape {y.shape} instead."
        )
    kind = numpy_dtype(y.dtype).kind
    check_real(y, "y", name)
    if kind not in "biuf":
        raise ValueError(f"{name} expects a numeric target, got dtype {y.dtype}.")
    Y = xp.astype(y, namespace_dtype(xp, np.float64))
    if not bool(xp.all(xp.isfinite(Y))):
        raise ValueError("Input y contains NaN or infinity.")
    return xp.reshape(Y, (int(Y.shape[0]), -1))


def check_real(a: Any, what: str, name: str) -> None:
    """Refuse complex ``a`` (``X``, ``y``, weights) with an error that says so.

    scikit-learn refuses complex input too, but its message prints the whole
    array; a cast would drop the imaginary parts in silence.
    """
    dtype = getattr(a, "dtype", None)
    if dtype is None and isinstance(a, (list, tuple)):
        dtype = np.asarray(a).dtype
    try:
        kind = numpy_dtype(dtype).kind if dtype is not None else ""
    except TypeError:  # pandas extension dtypes
        kind = getattr(dtype, "kind", "")
    if kind == "c":
        raise ValueError(
            f"Complex data not supported: {name} got complex {what} (dtype {dtype}) "
            "and fits real data only, as scikit-learn. Pass the real part, or the "
            "real and imaginary parts as separate columns."
        )
    # A DataFrame: per-column dtypes (pandas' ``dtypes`` maps names to them).
    dtypes = getattr(a, "dtypes", None)
    if what == "X" and hasattr(dtypes, "items"):
        bad = [c for c, t in dtypes.items() if getattr(t, "kind", "") == "c"]
        if bad:
            raise ValueError(
                f"Complex data not supported: {name} got complex column(s) "
                f"{bad[:5]} in X and fits real data only, as scikit-learn. Pass the "
                "real parts, or the real and imaginary parts as separate columns."
            )


def _check_n_features(estimator: Any, n_features: int, name: str) -> None:
    expected = getattr(estimator, "n_features_in_", None)
    if expected is not None and n_features != expected:
        raise ValueError(
            f"X has {n_features} features, but {name} is expecting {expected} "
            "features as input."
        )


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}.")
    return strategy


def validate_X(
    estimator: Any,
    X: Any,
    *,
    reset: bool,
    strategy: str = "factorized",
    accept_sparse: bool = True,
    ensure_non_negative: bool = False,
    device: str = "auto",
    return_lineage: bool = False,
) -> Any:
    """Validate ``X`` once at the estimator boundary and return its operator.

    A :class:`MultiSourceDataset` gives its (factorized) operator, or the materialized
    one when ``strategy="materialized"`` (the joined matrix of the dataset's root,
    built once and cached: :func:`~ilargi_sklearn.planner.set_materialization_cache`,
    and a slice's rows of it); arrays go through scikit-learn's
    ``validate_data`` and give a :class:`MatrixOperator`. ``n_features_in_`` and
    ``feature_names_in_`` are set when ``reset`` and checked otherwise.

    ``device`` places the computation: ``"auto"`` where the data lives, ``"cpu"``
    or ``"gpu"`` (a dataset moves once, through its cached
    :meth:`~MultiSourceDataset.to_device` copy; an array is copied for this call).
    Non-NumPy arrays are validated in their own namespace.

    ``return_lineage``: also return the operator's lineage
    (:func:`~ilargi_sklearn.multisource._lineage.lineage_of`, None for an
    array), the key under which the gram-based fits share their statistics;
    the fit hands it to them explicitly. Nothing is recorded anywhere.
    """
    op, lineage = _validate_X(
        estimator, X, reset, strategy, accept_sparse, ensure_non_negative, device
    )
    return (op, lineage) if return_lineage else op


def _validate_X(
    estimator: Any,
    X: Any,
    reset: bool,
    strategy: str,
    accept_sparse: bool,
    ensure_non_negative: bool,
    device: str,
) -> tuple[Operator, Any]:
    """:func:`validate_X`'s work: the operator and its lineage (None: an array)."""
    check_strategy(strategy)
    check_device(device)
    if isinstance(X, MultiSourceDataset) and device != "auto":
        X = X.to_device(device)
    elif device == "cpu" and not _is_host(X):
        X = to_numpy(X)
    if not isinstance(X, MultiSourceDataset) and not _is_host(X):
        op = _validate_device_array(estimator, X, reset)
        if ensure_non_negative and bool(op.xp.any(op.A < 0)):
            raise ValueError(
                f"Negative values in data passed to {type(estimator).__name__}."
            )
        return op, None
    if isinstance(X, MultiSourceDataset):
        n_rows, n_features = X.shape
        name = type(estimator).__name__
        if n_rows == 0:
            raise ValueError(
                f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 "
                f"is required by {name}."
            )
        names = np.asarray(X.feature_names, dtype=object)
        if reset:
            estimator.n_features_in_ = n_features
            estimator.feature_names_in_ = names
            # The encoding travels with the model, to build new data alike.
            if X.schema_ is not None:
                estimator.dataset_schema_ = X.schema_
            elif hasattr(estimator, "dataset_schema_"):
                del estimator.dataset_schema_
        else:
            fitted_names = getattr(estimator, "feature_names_in_", None)
            expected = getattr(estimator, "n_features_in_", n_features)
            if fitted_names is None:
                diff = []
            else:
                diff = [a for a, b in zip(names, fitted_names) if a != b][:5]
            if diff or n_features != expected:
                raise ValueError(
                    f"X has {n_features} features, but {name} is expecting "
                    f"{expected} features as input"
                    + (f" (the feature names differ first at {diff})" if diff else "")
                    + ". A dataset built from new "
                    "frames encodes the categories those frames hold; build it with "
                    "the training encoding instead: "
                    "model.dataset_schema_.build(base, tables) or "
                    "MultiSourceDataset.from_frames(..., schema=train_ds.schema_)."
                )
        if ensure_non_negative:
            _check_non_negative_operator(X.operator, name)
        _check_missing_values(estimator, X, name)
        op = X.operator_for(strategy)
        return op, lineage_of(X, op, strategy)
    check_real(X, "X", type(estimator).__name__)
    X = validate_data(
        estimator,
        X,
        reset=reset,
        accept_sparse="csr" if accept_sparse else False,
        dtype=[np.float64, np.float32],
        ensure_non_negative=ensure_non_negative,
    )
    if device == "gpu":
        import array_api_compat.cupy as xp_cupy

        return MatrixOperator(asarray_on(X, xp_cupy)), None
    return MatrixOperator(X), None


def _check_missing_values(estimator: Any, X: MultiSourceDataset, name: str) -> None:
    """A dataset holding NaN (built with ``allow_nan=True``) reaches only the
    estimators whose tags allow NaN: in the others' products NaN would spread."""
    if not X.allows_nan:
        return
    try:
        allow = estimator.__sklearn_tags__().input_tags.allow_nan
    except AttributeError:  # pragma: no cover - not a scikit-learn estimator
        allow = False
    if allow:
        return
    source = X.nan_source()
    if source is not None:
        raise ValueError(
            f"the dataset holds missing values (NaN) in source {source!r}, kept by "
            f"allow_nan=True or impute='missing'; {name} does not take missing "
            "values. Impute them (Join(impute='mean'), ...), or use an estimator "
            "that routes them (FactorizedHistGradientBoostingRegressor or "
            "FactorizedHistGradientBoostingClassifier)."
        )


def _check_non_negative_operator(op: Operator, name: str) -> None:
    from ilargi_sklearn.multisource import AffineOperator, FactorizedMatrix

    # A centered dataset (non-zero offset) is treated as possibly negative: its
    # range is not known without column minima, and centering makes some cells < 0.
    while isinstance(op, AffineOperator):
        if op.has_offset or bool(op.xp.any(op.scale < 0)):
            raise ValueError(
                f"Negative values in data passed to {name} (the dataset is centered "
                "or negatively scaled)."
            )
        op = op.base
    if isinstance(op, FactorizedMatrix):
        for t in op.terms:
            S = t.S
            if not (isinstance(S, np.ndarray) or hasattr(S, "indptr")):
                if bool(get_namespace(S).any(S < 0)):
                    raise ValueError(f"Negative values in data passed to {name}.")
                continue
            vals = S if isinstance(S, np.ndarray) else S.data
            if vals.size and vals.min() < 0:
                raise ValueError(f"Negative values in data passed to {name}.")


def host_array(a: Any) -> Any:
    """``a`` on the host for scikit-learn's checks: an array of another namespace
    (CuPy, ``array_api_strict``, Dask) becomes NumPy; NumPy arrays, lists, pandas
    objects and scalars are returned as they are."""
    return a if _is_host(a) else to_numpy(a)


def validate_fit_inputs(
    estimator: Any,
    X: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    target: Any = None,
    strategy: str = "factorized",
    reset: bool = True,
    non_negative_weights: bool = False,
    return_lineage: bool = False,
) -> tuple:
    """The fit preamble: validate ``X``, ``y`` and ``sample_weight`` once and place
    them on the estimator's device (its ``device`` parameter).

    Parameters
    ----------
    estimator : estimator
        Sets ``n_features_in_`` (and ``feature_names_in_``) as :func:`validate_X`
        with ``reset=True``, or checks them with ``reset=False``.
    X : {array-like, sparse matrix, MultiSourceDataset}
    y : array-like, optional
        Required when ``target`` is given.
    sample_weight : array-like of shape (n_samples,), float or None
        Checked by scikit-learn's ``_check_sample_weight`` on the host (a device
        array crosses once), then moved to ``op``'s device.
    target : callable, optional
        ``target(estimator, y, op)`` validates ``y``, checks its rows and places it
        on ``op``'s device. None: ``y`` is ignored (transformers).
    strategy : {"factorized", "materialized"}, default="factorized"
    reset : bool, default=True
        False for methods of a fitted estimator that take targets (``score``).
    non_negative_weights : bool, default=False
        Refuse negative weights, as ``_check_sample_weight(...,
        ensure_non_negative=True)`` does (scikit-learn's ``LinearRegression``;
        the estimators whose scikit-learn counterpart fails on them deep inside,
        with NaN, refuse them here with its message).
    return_lineage : bool, default=False
        Also return the design's lineage (see :func:`validate_X`): the
        gram-based estimators hand it to their statistics.

    Returns
    -------
    op : Operator
        The design matrix, on the estimator's device.
    y : object
        What ``target`` returned (None without one).
    sample_weight : array of shape (n_samples,) or None
        float64 weights on ``op``'s device; None for unit weights.
    sw_sum : float
        ``sum(sample_weight)`` (``n_samples`` for unit weights), summed on the host.
    lineage : Lineage or None
        Only with ``return_lineage``.
    """
    from sklearn.utils.validation import _check_sample_weight

    check_dataset_rows(X, y, "y")
    check_dataset_rows(X, sample_weight, "sample_weight")
    op, lineage = validate_X(
        estimator,
        X,
        reset=reset,
        strategy=strategy,
        device=estimator.device,
        return_lineage=True,
    )
    if target is not None:
        if y is None:
            raise ValueError(
                f"{type(estimator).__name__} requires y to be passed, but the target "
                "y is None."
            )
        check_real(y, "y", type(estimator).__name__)
        y = target(estimator, y, op)
    sw_sum = float(op.n_rows)
    if sample_weight is not None:
        check_real(sample_weight, "sample_weight", type(estimator).__name__)
        sample_weight = _check_sample_weight(
            host_array(sample_weight),
            op,
            dtype=np.float64,
            ensure_non_negative=non_negative_weights,
        )
        sw_sum = float(np.sum(sample_weight))
        sample_weight = asarray_on(sample_weight, op.xp, op.device)
    if return_lineage:
        return op, y, sample_weight, sw_sum, lineage
    return op, y, sample_weight, sw_sum


def check_dataset_rows(X: Any, values: Any, name: str) -> None:
    """Refuse per-base-row ``values`` for a dataset whose joins changed its rows.

    A target, weights or groups taken from the base table have one value per
    base row; a dataset after inner, outer or one-to-many joins has other rows.
    The error names the joins that changed them and the fix (``ds.align``);
    other length mismatches are left to the usual checks.
    """
    if not isinstance(X, MultiSourceDataset) or values is None:
        return
    shape = getattr(values, "shape", None)
    if shape is None and isinstance(values, (list, tuple)):
        shape = (len(values),)
    if not shape or not isinstance(shape[0], (int, np.integer)):
        return  # a scalar weight, or a lazy array of unknown length
    n_values, n_rows = int(shape[0]), len(X)
    if n_values == n_rows or n_values != X.n_base_rows_:
        return
    changes = []
    for r in (X._match_report or []) if X._root_rows is None else []:
        if r.get("fan_out", 1.0) > 1:
            changes.append(
                f"join {r['join']!r} repeats rows (keys such as "
                f"{r['repeated_keys'][:3]} occur more than once in its table)"
            )
        if r["how"] == "inner" and r["matched"] < r["rows"]:
            changes.append(
                f"inner join {r['join']!r} drops {r['rows'] - r['matched']:,} "
                "unmatched rows"
            )
        kept = round(r["matched"] * r.get("fan_out", 1.0)) + r["rows"] - r["matched"]
        if r["how"] == "outer" and r.get("rows_out", kept) > kept:
            changes.append(
                f"outer join {r['join']!r} adds {r['rows_out'] - kept:,} rows of its "
                "table that matched nothing"
            )
    why = f" ({'; '.join(changes)})" if changes else ""
    raise ValueError(
        f"X has {n_rows:,} rows but {name} has {n_values:,}, one per row of the base "
        f"table: the dataset's joins changed its rows{why}. Take {name} into the "
        f"dataset's order with ds.align({name}) (from_frames(..., target=COLUMN) "
        "returns the target aligned), or fix the join if it should keep the base "
        "rows."
    )


def sample_weight_on(op: Operator, sample_weight: Any = None) -> Any:
    """``sample_weight`` checked as scikit-learn's ``_check_sample_weight`` does,
    as an array of ``op``'s dtype in ``op``'s namespace and on its device.

    Unit weights (``None``) for an operator on a device are made there, with no
    n-length upload; given weights are checked on the host and moved once.
    """
    from sklearn.utils.validation import _check_sample_weight

    xp = op.xp
    dtype = np.dtype(op.dtype)
    if sample_weight is None and not is_numpy_namespace(xp):
        return xp.ones(op.n_rows, dtype=namespace_dtype(xp, dtype), device=op.device)
    if sample_weight is not None:
        sample_weight = host_array(sample_weight)
    # A zero-width stand-in for X: only its number of rows and its dtype are read.
    stand_in = np.empty((op.n_rows, 0), dtype=dtype)
    sample_weight = _check_sample_weight(sample_weight, stand_in, dtype=dtype)
    return asarray_on(sample_weight, xp, op.device)
