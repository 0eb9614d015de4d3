"""The constructors of :class:`~ilargi_sklearn.MultiSourceDataset`: from source
matrices, indicators and mappings; the union of datasets; ``from_frames``.

The construction half of the dataset, as pandas keeps ``DataFrame``'s
constructors in ``core/construction``: the checks of the inputs and the operator
they define. The functions are the dataset's classmethods (assigned in its class
body): ``cls`` is the dataset class, so this module stands below the container
and never imports it.

Two builders stand above the container and register here when they load, so that
nothing here imports upward:

* the join builder behind ``from_frames`` (``multisource._frames``, which
  ``import ilargi_sklearn.multisource`` always loads);
* *source kinds*: sources another engine holds (Dask arrays) go to that engine's
  builder (:func:`register_source_kind`; Dask's is registered at the package's
  top, ``ilargi_sklearn._source_kinds``) instead of this module knowing the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend import RowMap
from ilargi_sklearn._backend._namespace import (
    device_of,
    get_namespace,
    is_numpy_namespace,
    to_numpy,
)
from ilargi_sklearn.multisource._operators import FactorizedMatrix, Term
from ilargi_sklearn.multisource._terms import (
    build_factorized,
    check_finite,
    check_source,
    indicator_to_index,
)

__all__ = [
    "from_frames",
    "from_matrices",
    "register_frames_builder",
    "register_source_kind",
    "union",
]


@dataclass(frozen=True)
class SourceKind:
    """Sources that another engine holds, and the builder of their datasets.

    ``claims(source)`` says whether a source is of the kind; ``build(cls, sources,
    indicators, mappings, feature_names, *, source_names, priority, dtype,
    allow_nan)`` returns the dataset (``cls`` is the dataset class).
    """

    name: str
    claims: Callable[[Any], bool]
    build: Callable[..., Any]


#: The registered source kinds, by name (Dask's: ``ilargi_sklearn._source_kinds``).
_SOURCE_KINDS: dict[str, SourceKind] = {}


def register_source_kind(
    name: str, claims: Callable[[Any], bool], build: Callable[..., Any]
) -> None:
    """Let :meth:`~ilargi_sklearn.MultiSourceDataset.from_matrices` take the
    sources that ``claims`` recognizes, building their dataset with ``build``.

    Registering a name again replaces its kind.
    """
    _SOURCE_KINDS[name] = SourceKind(name, claims, build)


def _no_frames_builder(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover
    raise RuntimeError("ilargi_sklearn.multisource._frames did not register.")


#: ``from_frames`` (``multisource._frames``). The join builder stands above the
#: container (it makes datasets, and so do the schemas it records), so neither
#: the container nor this module can import it: it registers here when it loads,
#: which ``import ilargi_sklearn.multisource`` always does.
_frames_builder: Callable[..., Any] = _no_frames_builder


def register_frames_builder(build: Callable[..., Any]) -> None:
    """Set the builder behind :meth:`MultiSourceDataset.from_frames`."""
    global _frames_builder
    _frames_builder = build


def from_frames(
    cls: type,
    base: Any,
    base_features: Sequence[str] = (),
    joins: Sequence[Any] = (),
    **kwargs: Any,
) -> Any:
    """Build a dataset from DataFrames and :class:`Join` specifications.

    See :func:`ilargi_sklearn.multisource.from_frames` for the parameters.
    """
    return _frames_builder(base, base_features, joins, **kwargs)


def _source_kind(sources: Sequence[Any]) -> SourceKind | None:
    for kind in _SOURCE_KINDS.values():
        if any(kind.claims(S) for S in sources):
            return kind
    return None


def _check_source_names(
    sources: Sequence[Any], indicators: Sequence[Any], source_names: Any
) -> list[str]:
    """Check the source and indicator counts; return the (default) source names."""
    n_sources = len(sources)
    if n_sources == 0:
        raise ValueError("at least one source is required.")
    if len(indicators) != n_sources:
        raise ValueError(f"got {n_sources} sources but {len(indicators)} indicators.")
    names = (
        list(source_names)
        if source_names is not None
        else [f"s{k}" for k in range(n_sources)]
    )
    if len(names) != n_sources or len(set(names)) != n_sources:
        raise ValueError(
            f"source_names must be {n_sources} distinct names, got {names}."
        )
    return names


def _check_dtype(dtype: Any) -> np.dtype:
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}.") from None
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    return dtype


def from_matrices(
    cls: type,
    sources: Sequence[Any],
    indicators: Sequence[Any],
    mappings: Sequence[Any] | None = None,
    feature_names: Sequence[str] | None = None,
    *,
    source_names: Sequence[str] | None = None,
    priority: Sequence[int] | None = None,
    dtype: Any = np.float64,
    allow_nan: bool = False,
) -> Any:
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
    return _from_matrices(
        cls,
        sources,
        indicators,
        mappings,
        feature_names,
        source_names=source_names,
        priority=priority,
        dtype=dtype,
        copy_indicators=True,
        allow_nan=allow_nan,
    )


def _from_matrices(
    cls: type,
    sources: Sequence[Any],
    indicators: Sequence[Any],
    mappings: Sequence[Any] | None,
    feature_names: Sequence[str] | None,
    *,
    source_names: Sequence[str] | None,
    priority: Sequence[int] | None,
    dtype: Any,
    copy_indicators: bool,
    allow_nan: bool,
) -> Any:
    """:func:`from_matrices`; ``copy_indicators=False`` takes index vectors that
    nobody else holds (the frame builder's) without copying them."""
    kind = _source_kind(sources)
    if kind is not None:
        return kind.build(
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
    dtype = _check_dtype(dtype)
    names = _check_source_names(sources, indicators, source_names)
    checked = [
        check_source(S, names[k], dtype, finite=False) for k, S in enumerate(sources)
    ]

    # Device sources (CuPy, array_api_strict) stay where they are; index vectors
    # are validated on the host and moved next to them once the terms are built.
    xp = get_namespace(*checked)
    on_device = not is_numpy_namespace(xp)
    idxs: list[np.ndarray | None] = []
    for k, ind in enumerate(indicators):
        if ind is None:
            idxs.append(None)
        else:
            if not (isinstance(ind, np.ndarray) or sp.issparse(ind)):
                ind = to_numpy(ind) if hasattr(ind, "shape") else ind
            idx = indicator_to_index(ind, checked[k].shape[0], names[k])
            if copy_indicators and not sp.issparse(ind):
                # The caller keeps its array (or the memory of its Series): a
                # later write to it must not reach the dataset.
                idx = idx.copy()
            idxs.append(idx)
    lengths = {
        (checked[k].shape[0] if idx is None else idx.shape[0])
        for k, idx in enumerate(idxs)
    }
    if len(lengths) != 1:
        raise ValueError(
            f"indicators disagree on the number of target rows: {sorted(lengths)}."
        )
    rowmaps = [RowMap(idx, checked[k].shape[0]) for k, idx in enumerate(idxs)]
    colmaps, n_cols = _check_mappings(checked, mappings, names)
    feature_names = _check_feature_names(feature_names, colmaps, names, n_cols)
    # Checked here rather than with the sources, to name the offending feature.
    for k, (S, cm) in enumerate(zip(checked, colmaps)):
        check_finite(
            S,
            names[k],
            [
                feature_names[c] if c >= 0 else f"unused column {j}"
                for j, c in enumerate(cm)
            ],
            allow_nan=allow_nan,
        )
    op = build_factorized(checked, rowmaps, colmaps, n_cols, dtype, priority)
    if on_device:
        dev = device_of(checked[0])
        moved: dict[int, RowMap] = {}
        terms = []
        for t in op.terms:
            if id(t.rows) not in moved:
                moved[id(t.rows)] = t.rows.to_namespace(xp, dev)
            terms.append(Term(t.S, moved[id(t.rows)], t.cols, t.source))
        op = FactorizedMatrix(terms, op.n_rows, op.n_cols, dtype)
    base = next((k for k, idx in enumerate(idxs) if idx is None), None)
    return cls(op, feature_names, names, base_source=base, allows_nan=allow_nan)


def _check_mappings(
    checked: Sequence[Any], mappings: Sequence[Any] | None, names: list[str]
) -> tuple[list[np.ndarray], int]:
    """The target column of each source column (int64), and the target width."""
    n_sources = len(names)
    if mappings is None:
        mappings = [None] * n_sources
    if len(mappings) != n_sources:
        raise ValueError(f"got {n_sources} sources but {len(mappings)} mappings.")
    colmaps = []
    offset = 0
    for k, (S, cm) in enumerate(zip(checked, mappings)):
        if cm is None:
            cm = np.arange(offset, offset + S.shape[1])
        cm = np.asarray(cm)
        if cm.ndim != 1 or cm.shape[0] != S.shape[1] or cm.dtype.kind not in "iu":
            raise ValueError(
                f"mapping of source {names[k]!r} must be an integer vector of length "
                f"{S.shape[1]} (one target column per source column, -1: unused)."
            )
        cm = cm.astype(np.int64)
        used = cm[cm >= 0]
        if used.size != np.unique(used).size:
            raise ValueError(
                f"mapping of source {names[k]!r} sends two columns to one target column."
            )
        if cm.min(initial=0) < -1:
            raise ValueError(f"mapping of source {names[k]!r} has values below -1.")
        colmaps.append(cm)
        offset = max(offset, int(cm.max(initial=-1)) + 1)
    n_cols = max((int(cm.max(initial=-1)) + 1 for cm in colmaps), default=0)
    return colmaps, n_cols


def _check_feature_names(
    feature_names: Sequence[str] | None,
    colmaps: list[np.ndarray],
    names: list[str],
    n_cols: int,
) -> list[str]:
    """The (default, ``"{source}__{j}"``) names of the target columns, unique."""
    if feature_names is None:
        feature_names = [""] * n_cols
        for k, cm in enumerate(colmaps):
            for j, c in enumerate(cm):
                if c >= 0 and not feature_names[c]:
                    feature_names[c] = f"{names[k]}__{j}"
        feature_names = [f or f"x{c}" for c, f in enumerate(feature_names)]
    elif len(feature_names) != n_cols:
        raise ValueError(
            f"got {len(feature_names)} feature names for {n_cols} target columns."
        )
    feature_names = list(feature_names)
    seen: set[Any] = set()
    duplicated = [f for f in feature_names if f in seen or seen.add(f)]
    if duplicated:
        raise ValueError(
            f"feature names must be unique; {sorted(set(map(str, duplicated)))} "
            "appear more than once."
        )
    return feature_names


def union(cls: type, datasets: Sequence[Any]) -> Any:
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
    datasets = list(datasets)
    if not datasets:
        raise ValueError("union needs at least one dataset.")
    first = datasets[0]
    for d in datasets:
        if not isinstance(d, cls):
            raise TypeError(f"union takes MultiSourceDatasets, got {type(d).__name__}.")
        if not isinstance(d.operator, FactorizedMatrix):
            raise TypeError(
                "union takes unscaled datasets (apply scalers after the union)."
            )
        if list(d.feature_names) != list(first.feature_names) or d.dtype != first.dtype:
            raise ValueError(
                "union needs datasets with the same feature names and dtype."
            )
    n_rows = sum(len(d) for d in datasets)
    terms, names = [], []
    row_off, src_off = 0, 0
    for i, d in enumerate(datasets):
        for t in d.operator.terms:
            idx = np.full(n_rows, -1, dtype=np.int64)
            idx[row_off : row_off + len(d)] = t.rows.idx
            terms.append(
                Term(
                    t.S,
                    RowMap(idx, t.rows.n_source_rows),
                    t.cols,
                    t.source + src_off,
                )
            )
        names += [f"{n}[{i}]" if len(datasets) > 1 else n for n in d.source_names]
        row_off += len(d)
        src_off += d.n_sources
    op = FactorizedMatrix(terms, n_rows, first.shape[1], first.dtype)
    out = cls(
        op,
        first.feature_names,
        names,
        categories=first.categories_,
        allows_nan=any(d.allows_nan for d in datasets),
    )
    out.schema_ = (
        first.schema_ if all(d.schema_ == first.schema_ for d in datasets) else None
    )
    # The union's base table is the parts' base tables one after the other.
    origin, offset = [], 0
    for d in datasets:
        r = d.base_rows_
        origin.append(np.where(r >= 0, r + offset, -1))
        offset += d.n_base_rows_
    out._set_origin(np.concatenate(origin), offset, None)
    return out
