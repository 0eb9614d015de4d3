"""Plan features: data, data x algorithm and hardware figures of one fit.

Everything here is cheap: it reads the shapes and non-zero counts of the sources and
makes one pass over each index vector (``O(n_rows)`` per term, like
:meth:`MultiSourceDataset.describe`); the joined matrix is never built.

The features are split in two so that stored calibration records stay useful when
the cost formulas change:

* :func:`plan_features` gives the *raw* figures of one fit (a flat dict of numbers
  and a few strings) that calibration records store;
* :func:`plan_costs` derives, from raw figures alone, each plan's FLOPs, bytes moved
  and a roofline estimate of its time (DESIGN.md 3 and 5), and
  :func:`model_inputs` the vector the learned model reads.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from typing import Any

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn._backend._plan import DEVICES, PLANS, STRATEGIES, Plan

__all__ = [
    "COMPONENTS",
    "DEVICES",
    "PLANS",
    "STRATEGIES",
    "algorithm_features",
    "data_features",
    "estimator_kind",
    "model_inputs",
    "plan_costs",
    "plan_features",
    "split_plan",
    "unit_costs",
    "with_iterations",
]

# Python-level overhead of one operator call (one product, one gather), seconds.
_CALL_OVERHEAD = 2e-5
# GPU kernel launch and synchronization overhead per operator call, seconds.
_GPU_CALL_OVERHEAD = 5e-5
# Sparse kernels reach a small fraction of the GEMM rate; their time is modelled by
# the bytes they move, with this many extra bytes per multiply-add for the
# irregular access (index reads, cache misses on the dense operand).
_SPARSE_BYTES_PER_FLOP = 4.0
# Bytes moved per joined non-zero to build a CSR joined matrix: the indicator
# product, the COO triplets, their concatenation and the COO -> CSR sort.
_CSR_BUILD_BYTES_PER_NNZ = 96.0
# Host-to-GPU transfer rate (PCIe 4/5 x16, pinned memory), bytes per second.
_HOST_LINK_BYTES_PER_S = 20e9


def split_plan(plan: str) -> tuple[str, str]:
    """``"factorized-cpu"`` -> ``("factorized", "cpu")``, with a clear error."""
    if "-" not in str(plan):
        raise ValueError(f"unknown plan {plan!r}; plans are {list(PLANS)}.")
    parsed = Plan.parse(str(plan))
    return parsed.strategy, parsed.device


# ---------------------------------------------------------------------------- data
def _unwrap(op: Any) -> tuple[Any, bool, bool]:
    """The operator under implicit scaling/centering, and whether there was any."""
    from ilargi_sklearn.multisource import AffineOperator

    scaled = centered = False
    while isinstance(op, AffineOperator):
        scaled = True
        centered = centered or op.has_offset
        op = op.base
    return op, scaled, centered


def _nnz(S: Any) -> int:
    return int(S.nnz) if sp.issparse(S) else int(np.count_nonzero(S))


# Host datasets' operators -> their figures: a search's candidates fit slices of
# the same gathered rows (the slice memo, ``multisource._slices``), whose figures
# are then counted once. Weak keys: a figure never keeps an operator alive.
_DATA_FEATURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def data_features(X: Any) -> dict[str, Any]:
    """Raw data figures of a dataset (or operator, or matrix), never materializing.

    Parameters
    ----------
    X : {MultiSourceDataset, Operator, ndarray, sparse matrix}
        The training data.

    Returns
    -------
    features : dict
        Shapes, non-zeros and bytes of the sources and of the joined matrix, tuple
        and feature ratios, selectivity, sparsity, unmatched fraction, join-type
        flags, the FLOPs and bytes of the gram in both representations (which need
        per-term detail) and the size of the root dataset for the materialization
        cache.
    """
    from ilargi_sklearn.multisource._multi_source import MultiSourceDataset

    host = (
        isinstance(X, MultiSourceDataset) and str(getattr(X, "device", "cpu")) == "cpu"
    )
    if host:
        # Keyed by the operator, which the slices of one index array share (each
        # ``ds[idx]`` is a new dataset), with the root it was sliced from.
        root = getattr(X, "_root_operator", None)
        sig = (id(root), getattr(X, "_root_rows", None) is None)
        known = _DATA_FEATURES.get(X.operator)
        if known is not None and known[0] == sig:
            return dict(known[1])
    out = _data_features(X)
    if host:
        _DATA_FEATURES[X.operator] = (sig, dict(out))
    return out


def _data_features(X: Any) -> dict[str, Any]:
    from ilargi_sklearn.multisource import (
        FactorizedMatrix,
        InteractionOperator,
        MatrixOperator,
    )
    from ilargi_sklearn.multisource._multi_source import MultiSourceDataset, as_operator

    on_gpu = False
    if isinstance(X, MultiSourceDataset) and str(getattr(X, "device", "cpu")) != "cpu":
        # Counted on the host copy (kept by the dataset after its move).
        on_gpu = True
        X = X.to_device("cpu")
    op, scaled, centered = _unwrap(as_operator(X))
    if isinstance(op, InteractionOperator):
        return _interaction_features(op, data_features(op.base), on_gpu)
    n_rows, n_cols = (int(v) for v in op.shape)
    itemsize = int(np.dtype(op.dtype).itemsize)
    if isinstance(op, FactorizedMatrix):
        terms = [(t.S, t.rows, t.source) for t in op.terms]
    elif isinstance(op, MatrixOperator):
        terms = [(op.A, None, 0)]
    else:  # pragma: no cover - an operator of unknown structure
        raise TypeError(f"cannot compute plan features of {type(op).__name__}.")

    nnz_cache: dict[int, int] = {}
    rows_t, cols_t, nnz_t, sparse_t, matched_t, ident_t = [], [], [], [], [], []
    groups: set[int] = set()
    nnz_T = 0
    for S, rows, _ in terms:
        key = id(S)
        if key not in nnz_cache:
            nnz_cache[key] = _nnz(S)
        r, c = int(S.shape[0]), int(S.shape[1])
        rows_t.append(r)
        cols_t.append(c)
        nnz_t.append(nnz_cache[key])
        sparse_t.append(bool(sp.issparse(S)))
        identity = rows is None or rows.is_identity
        ident_t.append(identity)
        if identity:
            matched_t.append(n_rows)
            nnz_T += nnz_cache[key]
        else:
            groups.add(id(rows))
            idx = rows.idx
            matched = idx >= 0
            matched_t.append(int(matched.sum()))
            if r:
                row_nnz = (
                    np.diff(S.indptr) if sp.issparse(S) else np.count_nonzero(S, axis=1)
                )
                nnz_T += int(row_nnz[idx[matched]].sum())
    rows_a = np.asarray(rows_t, dtype=float)
    cols_a = np.asarray(cols_t, dtype=float)
    nnz_a = np.asarray(nnz_t, dtype=float)
    sparse_a = np.asarray(sparse_t, dtype=bool)
    ident_a = np.asarray(ident_t, dtype=bool)
    matched_a = np.asarray(matched_t, dtype=float)
    dims = ~ident_a

    base_cols = float(cols_a[ident_a].sum())
    dim_cols = float(cols_a[dims].sum())
    dim_rows = float(rows_a[dims].sum())
    distinct = {id(S): S for S, _, _ in terms}
    sum_source_rows = float(sum(S.shape[0] for S in distinct.values()))
    nnz_src = float(sum(nnz_cache[k] for k in distinct))
    bytes_src = float(
        sum(
            nnz_cache[k] * (itemsize + 4) + 8 * (S.shape[0] + 1)
            if sp.issparse(S)
            else S.size * itemsize
            for k, S in distinct.items()
        )
    )
    joined_sparse = bool(sparse_a.any())
    bytes_T = (
        nnz_T * (itemsize + 4) + 8 * (n_rows + 1)
        if joined_sparse
        else n_rows * n_cols * itemsize
    )
    ratios = n_rows / np.maximum(rows_a[dims], 1.0) if dims.any() else np.ones(1)

    # Gram FLOPs and bytes (linear regression's normal equations), per term pair.
    gram_flops_f = gram_bytes_f = 0.0
    for i in range(len(terms)):
        r, c, z = rows_a[i], cols_a[i], nnz_a[i]
        if sparse_a[i]:
            gram_flops_f += 2.0 * z * (z / max(r, 1.0))
            gram_bytes_f += 3.0 * z * (itemsize + 4)
        else:
            gram_flops_f += r * c * c
            gram_bytes_f += r * c * itemsize
        for j in range(i + 1, len(terms)):
            nnz_c = min(matched_a[i], matched_a[j])
            ca, cb, rb = cols_a[i], cols_a[j], rows_a[j]
            dens_a = nnz_a[i] / max(rows_a[i] * ca, 1.0)
            dens_b = nnz_a[j] / max(rb * cb, 1.0)
            gram_flops_f += 2.0 * (nnz_c * ca * dens_a + rb * ca * cb * dens_b)
            gram_bytes_f += 24.0 * n_rows + 8.0 * ca * cb
    gram_bytes_f += 8.0 * n_cols * n_cols * len(terms)
    if joined_sparse:
        gram_flops_m = 2.0 * nnz_T * (nnz_T / max(n_rows, 1))
        gram_bytes_m = 3.0 * nnz_T * (itemsize + 4) + 8.0 * n_cols * n_cols
    else:
        gram_flops_m = float(n_rows) * n_cols * n_cols
        gram_bytes_m = float(n_rows) * n_cols * itemsize + 8.0 * n_cols * n_cols

    # A row slice of a larger dataset (cross-validation): the materialized plan
    # builds the root's joined matrix once for all slices.
    root_rows = n_rows
    root_op = getattr(X, "_root_operator", None)
    if root_op is not None and getattr(X, "_root_rows", None) is not None:
        root_rows = max(int(root_op.shape[0]), n_rows)

    cells = max(float(n_rows) * n_cols, 1.0)
    cells_src = max(float((rows_a * cols_a).sum()), 1.0)
    return {
        "n_rows": n_rows,
        "n_features": n_cols,
        "n_terms": len(terms),
        "n_sources": len(distinct),
        "n_row_groups": len(groups),
        "has_base": bool(ident_a.any()),
        "itemsize": itemsize,
        "base_columns": base_cols,
        "dim_columns": dim_cols,
        "dim_rows": dim_rows,
        "source_rows": sum_source_rows,
        "nnz_sources": nnz_src,
        "nnz_terms": float(nnz_a.sum()),
        "nnz_terms_dense": float(nnz_a[~sparse_a].sum()),
        "nnz_terms_sparse": float(nnz_a[sparse_a].sum()),
        "cells_terms_dense": float((rows_a * cols_a)[~sparse_a].sum()),
        "nnz_joined": float(nnz_T),
        "bytes_sources": bytes_src,
        "bytes_joined": float(bytes_T),
        "joined_sparse": joined_sparse,
        "sparse_fraction": float(sparse_a.mean()),
        "tuple_ratio": float(n_rows / max(dim_rows, 1.0)) if dims.any() else 1.0,
        "tuple_ratio_max": float(ratios.max()),
        "tuple_ratio_min": float(ratios.min()),
        "feature_ratio": dim_cols / max(base_cols, 1.0),
        "selectivity": sum_source_rows / max(n_rows, 1),
        "sparsity_joined": 1.0 - nnz_T / cells,
        "sparsity_sources": 1.0 - float(nnz_a.sum()) / cells_src,
        "nnz_ratio": nnz_T / max(float(nnz_a.sum()), 1.0),
        "unmatched": float(1.0 - (matched_a[dims] / max(n_rows, 1)).mean())
        if dims.any()
        else 0.0,
        "many_to_many": bool(not ident_a.any()),
        "scaled": scaled,
        "centered": centered,
        "gram_flops_factorized": gram_flops_f,
        "gram_bytes_factorized": gram_bytes_f,
        "gram_flops_materialized": gram_flops_m,
        "gram_bytes_materialized": gram_bytes_m,
        "root_fraction": n_rows / max(root_rows, 1),
        "on_gpu": on_gpu,
    }


def _interaction_features(
    op: Any, base: dict[str, Any], on_gpu: bool
) -> dict[str, Any]:
    """Figures of implicit degree-2 features from those of their base operator.

    A product with the expansion costs about ``d`` products with the base (its
    ``matmul`` is one base product with ``d`` columns, its ``rmatmul`` a weighted
    gram of the base), so the factorized product figures are the base's times
    ``d``; the materialized plan works on the n x p expansion, and both grams are
    the expansion's (the factorized one is exact from row blocks, at the
    materialized cost).
    """
    d = max(float(base["n_features"]), 1.0)
    n, p = float(base["n_rows"]), float(op.n_cols)
    isz = float(base["itemsize"])
    # Each degree-2 column is non-zero where both factors are.
    density = 1.0 - float(base["sparsity_joined"])
    nnz = n * p * (density if base["joined_sparse"] else 1.0)
    f = dict(base)
    for key in ("cells_terms_dense", "nnz_terms_sparse", "n_terms"):
        f[key] = float(base[key]) * d
    f.update(
        n_features=int(p),
        nnz_joined=nnz,
        bytes_joined=nnz * (isz + 4) if base["joined_sparse"] else n * p * isz,
        sparsity_joined=1.0 - nnz / max(n * p, 1.0),
        gram_flops_factorized=nnz * p,
        gram_flops_materialized=nnz * p,
        gram_bytes_factorized=nnz * isz + 8.0 * p * p,
        gram_bytes_materialized=nnz * isz + 8.0 * p * p,
        on_gpu=on_gpu,
    )
    return f


# ----------------------------------------------------------------------- algorithm
def estimator_kind(estimator: Any, data: Any = None, y: Any = None) -> str:
    """The kind of work ``estimator`` declares (``"other"`` when it declares none).

    Without ``data``, the kind of a fit on a small dense dataset.
    """
    if getattr(estimator, "_plan_work", None) is None:
        return "other"
    if data is None:
        data = _KIND_PROBE
    return algorithm_features(estimator, data, y)["estimator"]


def algorithm_features(
    estimator: Any, data: dict[str, Any], y: Any = None, X: Any = None
) -> dict[str, Any]:
    """Work of one fit of ``estimator`` on data with figures ``data``.

    The estimator declares it (its ``_plan_work``, see
    :mod:`ilargi_sklearn.planner._work`): the planner knows no estimator by name.
    The work is counted in operator calls that both representations share: passes
    (one ``matmul`` and one ``rmatmul`` with ``m`` right-hand-side columns),
    extra ``matmul`` calls (k-means++), grams (normal equations), dense work on
    small matrices and element-wise work that does not depend on the plan, and,
    per representation, work that is not operator calls (the trees' histograms).

    Parameters
    ----------
    estimator : estimator
        The (unfitted) estimator.
    data : dict
        Output of :func:`data_features`.
    y : array-like, optional
        Target (the number of classes of a classifier).
    X : MultiSourceDataset, optional
        The training data, for declarations that need more than its figures.

    Returns
    -------
    features : dict
        ``estimator`` (kind), ``solver``, ``m`` (right-hand-side columns),
        ``iterations``, ``passes``, ``passes_per_iteration``, ``iter_scaled``,
        ``matmuls``, ``matmul_m``, ``grams``, ``common_flops``, ``common_bytes``,
        ``row_norms``, ``column_sum_passes``, ``fits``, ``joins`` and the
        per-plan amounts ``plan_{factorized,materialized}_{component}``.
    """
    from ilargi_sklearn.planner._work import PlanData, estimator_work

    data = data if isinstance(data, PlanData) else PlanData(data, X)
    return estimator_work(estimator, data, y).features()


#: Figures of a small dense dataset: what :func:`estimator_kind` declares on.
_KIND_PROBE = {
    "n_rows": 1000,
    "n_features": 10,
    "joined_sparse": False,
    "n_terms": 2,
    "n_sources": 2,
    "terms": [],
}

# Per-iteration passes of the solvers of records written before estimators
# declared their work (their features lack ``passes_per_iteration``); the
# declarations carry it now. Never extend: new records carry their own.
_LEGACY_PER_ITERATION = {
    "lsqr": 1.0,
    "gd": 1.0,
    "lbfgs": 1.1,
    "lloyd": 1.0,
    "mu": 1.0,
    "randomized": 1.0,
    "arpack": 1.0,
    "cd": 0.0,
}
_LEGACY_SCALED = {
    "lbfgs": ("common_bytes",),
    "lloyd": ("common_bytes",),
    "mu": ("common_bytes", "common_flops"),
    "cd": ("common_flops",),
    "randomized": ("common_flops",),
}


def _complete(features: dict[str, Any]) -> dict[str, Any]:
    """``features`` with the declaration keys that legacy records lack."""
    if "passes_per_iteration" in features:
        return features
    f = dict(features)
    solver = f.get("solver")
    f["passes_per_iteration"] = _LEGACY_PER_ITERATION.get(solver, -1.0)
    f["iter_scaled"] = ",".join(_LEGACY_SCALED.get(solver, ()))
    f["column_sum_passes"] = 0.5 if f.get("estimator") == "pca" else 0.0
    f.setdefault("fits", 1)
    f.setdefault("joins", True)
    for rep in ("factorized", "materialized"):
        for c in COMPONENTS:
            f.setdefault(f"plan_{rep}_{c}", 0.0)
    return f


def with_iterations(features: dict[str, Any], n_iter: Any) -> dict[str, Any]:
    """``features`` with the iteration count that a fit actually ran.

    Calibration records store the ``n_iter_`` of the timed fit; the model learns the
    cost per iteration from it, while predictions use the declared guess. How the
    work grows with the iterations is part of the declaration
    (``passes_per_iteration``, ``iter_scaled``).
    """
    features = _complete(features)
    per = float(features.get("passes_per_iteration", -1.0))
    if n_iter is None or per < 0:
        return features
    n_iter = int(n_iter)
    it = int(features["iterations"])
    if n_iter <= 0 or n_iter == it:
        return features
    f = dict(features)
    passes = float(f["passes"])
    f["passes"] = max(passes + per * (n_iter - it), min(passes, 1.0))
    f["iterations"] = n_iter
    scale = n_iter / max(it, 1)
    scaled = set(str(f.get("iter_scaled", "")).split(","))
    for key in ("common_bytes", "common_flops"):
        if key in scaled:
            f[key] = float(f[key]) * scale
    if "plan_work" in scaled:
        for rep in ("factorized", "materialized"):
            for c in COMPONENTS:
                if c != "setup_bytes":
                    f[f"plan_{rep}_{c}"] = float(f[f"plan_{rep}_{c}"]) * scale
    return f


def plan_features(
    X: Any, estimator: Any, y: Any = None, *, hardware: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Raw plan features of fitting ``estimator`` on ``X`` (data, algorithm, hardware).

    Parameters
    ----------
    X : {MultiSourceDataset, ndarray, sparse matrix}
        Training data.
    estimator : estimator
        The estimator to fit (its parameters are read, it is not fitted).
    y : array-like, optional
        Target.
    hardware : dict, optional
        Hardware figures; default :func:`~ilargi_sklearn.planner.hardware_info`.

    Returns
    -------
    features : dict
        Flat dict of numbers, booleans and the strings ``estimator`` and ``solver``.
        Plan-specific costs come from :func:`plan_costs`.

    Examples
    --------
    >>> from ilargi_sklearn.datasets import make_multi_source
    >>> from ilargi_sklearn.cluster import FactorizedKMeans
    >>> from ilargi_sklearn.planner import plan_features
    >>> ds = make_multi_source(2000, tuple_ratio=20, random_state=0).dataset
    >>> hw = {"cpu_cores": 2, "gemm_gflops": 20.0, "mem_bandwidth_gbs": 10.0}
    >>> f = plan_features(ds, FactorizedKMeans(n_clusters=4), hardware=hw)
    >>> f["n_rows"], f["n_features"], f["estimator"], f["m"]
    (2000, 15, 'kmeans', 4)
    >>> round(f["tuple_ratio"], 1)
    10.0
    """
    if hardware is None:
        from ilargi_sklearn.planner._hardware import hardware_info

        hardware = hardware_info()
    data = data_features(X)
    algo = algorithm_features(estimator, data, y, X)
    hw = {
        "cpu_cores": float(hardware.get("cpu_cores", 1)),
        "gemm_gflops": float(hardware.get("gemm_gflops", 10.0)),
        "mem_bandwidth_gbs": float(hardware.get("mem_bandwidth_gbs", 5.0)),
    }
    for key in ("gpu_gemm_gflops", "gpu_bandwidth_gbs", "gpu_memory_bytes"):
        if key in hardware:
            hw[key] = float(hardware[key])
    return {**data, **algo, **hw}


# ---------------------------------------------------------------------- plan costs
#: Cost components of a plan; the roofline time is their weighted sum.
COMPONENTS = (
    "dense_flops",  # BLAS work: dense products, dense grams, small dense algebra
    "stream_bytes",  # sequential memory traffic: sources, outputs, element-wise work
    "sparse_flops",  # multiply-adds of CSR kernels (irregular access)
    "gather_bytes",  # random row gathers and scatter-adds of the index vectors
    "calls",  # operator calls (Python and kernel-launch overhead)
    "setup_bytes",  # building (or slicing, uploading) the joined matrix
)


def unit_costs(features: dict[str, Any], device: str = "cpu") -> dict[str, float]:
    """Seconds per unit of each cost component, from the hardware figures."""
    if device == "gpu":
        gemm = float(features.get("gpu_gemm_gflops", 50_000.0)) * 1e9
        bw = float(features.get("gpu_bandwidth_gbs", 2_000.0)) * 1e9
        overhead = _GPU_CALL_OVERHEAD
    else:
        gemm = float(features.get("gemm_gflops", 10.0)) * 1e9
        bw = float(features.get("mem_bandwidth_gbs", 5.0)) * 1e9
        overhead = _CALL_OVERHEAD
    return {
        "dense_flops": 1.0 / gemm,
        "stream_bytes": 1.0 / bw,
        "sparse_flops": _SPARSE_BYTES_PER_FLOP / bw,
        "gather_bytes": 1.0 / bw,
        "calls": overhead,
        "setup_bytes": 1.0 / bw,
    }


def _upload_factor(f: dict[str, Any]) -> float:
    """Host-to-GPU bytes in units of GPU memory bytes (the link is slower)."""
    return float(f.get("gpu_bandwidth_gbs", 2_000.0)) * 1e9 / _HOST_LINK_BYTES_PER_S


def plan_costs(
    features: dict[str, Any],
    plan: str,
    *,
    cached: bool = False,
    efficiency: dict[str, float] | None = None,
    stats_cached: bool | str | None = False,
) -> dict[str, float]:
    """Cost components and a roofline time estimate of one plan, from raw features.

    Parameters
    ----------
    features : dict
        Output of :func:`plan_features`.
    plan : str
        One of :data:`PLANS`.
    cached : bool, default=False
        Whether the joined matrix is already materialized (materialized plans only).
    efficiency : dict of str to float, optional
        Measured slow-down of each component against its hardware rate (fitted on
        calibration records by :func:`~ilargi_sklearn.planner.train_cost_model`);
        default 1 for every component.
    stats_cached : bool or {"fold", "root"}, default=False
        Whether the sufficient statistics of a gram-based fit (``grams`` in the
        features) are in the statistics cache for this plan's operator (see
        :func:`~ilargi_sklearn.multisource._stats_cache.statistics_cached`):
        True or ``"fold"``, the fit's own gram and column sums: no gram and no
        column-sums pass, only the dense solve and the passes for the target;
        ``"root"``: its root's, from which the fold's gram is downdated: the gram
        of the other rows of the root only. The join's setup is unchanged (a
        materialized fit still reads its operator). Ignored without a gram.

    Returns
    -------
    costs : dict
        Every entry of :data:`COMPONENTS`; ``flops`` (dense and sparse) and
        ``bytes`` (stream and gather) of the fit without the setup, and
        ``seconds``: the sum over components of amount x seconds per unit x
        efficiency; ``component_seconds``, that sum's terms (a dict by
        component), and ``common_seconds``, the part of them that does not
        depend on the plan (dense algebra on small matrices, element-wise work).
    """
    rep, device = split_plan(plan)
    f = _complete(features)
    n, d, m = float(f["n_rows"]), float(f["n_features"]), float(f["m"])
    isz = float(f["itemsize"])
    groups = float(f["n_row_groups"])
    nnz_sparse = float(f["nnz_terms_sparse"])
    cells_dense = float(f["cells_terms_dense"])
    c = dict.fromkeys(COMPONENTS, 0.0)

    def product(mm: float, count: float) -> None:
        """``count`` products (one matmul or rmatmul each) with ``mm`` columns."""
        if rep == "factorized":
            c["dense_flops"] += count * 2.0 * cells_dense * mm
            c["stream_bytes"] += count * (
                isz * cells_dense + nnz_sparse * (isz + 4) + 8.0 * mm * (d + n)
            )
            c["sparse_flops"] += count * 2.0 * nnz_sparse * mm
            # Per row group: read the index, gather (or scatter) the m columns.
            c["gather_bytes"] += count * groups * n * (8.0 + 3.0 * 8.0 * mm)
            c["calls"] += count * (float(f["n_terms"]) + groups)
        elif f["joined_sparse"]:
            nnz = float(f["nnz_joined"])
            c["stream_bytes"] += count * (nnz * (isz + 4) + 8.0 * mm * (n + d))
            c["sparse_flops"] += count * 2.0 * nnz * mm
            c["calls"] += count
        else:
            c["dense_flops"] += count * 2.0 * n * d * mm
            c["stream_bytes"] += count * isz * (n * d + mm * (n + d))
            c["calls"] += count

    gram_share = _gram_share(f, stats_cached)
    passes = float(f["passes"])
    if gram_share < 1.0:
        # The cached entry holds the column sums too (PCA's only pass).
        passes = max(passes - float(f["column_sum_passes"]), 0.0)
    product(m, 2.0 * passes)
    if f["matmuls"]:
        product(float(f["matmul_m"]), float(f["matmuls"]))
    if f["row_norms"]:
        product(1.0, 1.0)
    if f["grams"] and gram_share > 0.0:
        c["dense_flops"] += gram_share * float(f[f"gram_flops_{rep}"])
        c["stream_bytes"] += gram_share * float(f[f"gram_bytes_{rep}"])
        c["calls"] += float(f["n_terms"]) ** 2
    c["dense_flops"] += float(f["common_flops"])
    c["stream_bytes"] += float(f["common_bytes"])
    # Declared work that is not operator calls (histograms, binning).
    for k in COMPONENTS:
        c[k] += float(f[f"plan_{rep}_{k}"])

    if rep == "materialized":
        fraction = max(float(f.get("root_fraction", 1.0)), 1e-3)
        if not f["joins"]:
            pass  # the estimator builds its own table: declared in plan_work
        elif not cached:
            if f["joined_sparse"]:
                setup = _CSR_BUILD_BYTES_PER_NNZ * float(f["nnz_joined"])
            else:
                setup = 3.0 * n * d * isz
            # The root dataset is materialized (then cached) when fitting a slice.
            c["setup_bytes"] += setup / fraction
        elif fraction < 1.0:
            c["setup_bytes"] += 2.0 * float(f["bytes_joined"])  # the slice's rows
        if device == "gpu" and f["joins"]:
            c["setup_bytes"] += float(f["bytes_joined"]) * _upload_factor(f)
    elif device == "gpu" and not f.get("on_gpu", False):
        c["setup_bytes"] += float(f["bytes_sources"]) * _upload_factor(f)

    unit = unit_costs(f, device)
    eff = efficiency or {}
    per = {k: c[k] * unit[k] * float(eff.get(k, 1.0)) for k in COMPONENTS}
    common = float(f["common_flops"]) * _per_unit(unit, eff, "dense_flops") + float(
        f["common_bytes"]
    ) * _per_unit(unit, eff, "stream_bytes")
    return {
        **c,
        "flops": c["dense_flops"] + c["sparse_flops"],
        "bytes": c["stream_bytes"] + c["gather_bytes"],
        "seconds": max(sum(per.values()), 1e-6),
        "component_seconds": per,
        "common_seconds": common,
    }


def _gram_share(f: dict[str, Any], stats_cached: bool | str | None) -> float:
    """The share of the fit's gram that is still computed, given the cache state.

    A fold's cached gram leaves none; its root's leaves the gram of the root's
    other rows (the test fold: ``1 / root_fraction - 1`` times the fold's rows),
    which the downdate subtracts; the gram's work scales with the rows.
    """
    if not f.get("grams") or not stats_cached:
        return 1.0
    if stats_cached == "root":
        fraction = max(float(f.get("root_fraction", 1.0)), 1e-3)
        return min(max(1.0 / fraction - 1.0, 0.0), 1.0)
    return 0.0


def _per_unit(unit: dict[str, float], efficiency: dict[str, float], key: str) -> float:
    """Seconds per unit of component ``key`` after its calibrated slow-down."""
    return unit[key] * float(efficiency.get(key, 1.0))


def _code(name: Any) -> float:
    """A stable number for a kind or solver name, for the learned model.

    Estimators name their kind of work themselves (:mod:`._work`), so the planner
    keeps no table of names: the code is a hash of the name, the same in every
    process, in [0, 1). A name the model never saw gets a code of its own, and
    the model then judges the work by the work features alone.
    """
    digest = hashlib.sha256(str(name).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2.0**32


def _log(v: float) -> float:
    return math.log10(max(float(v), 1e-12))


def model_inputs(
    features: dict[str, Any],
    plan: str,
    *,
    cached: bool = False,
    efficiency: dict[str, float] | None = None,
) -> dict[str, float]:
    """The learned model's input vector for one plan (finite floats only).

    Logarithms of sizes, ratios, flags, the estimator kind and solver as codes, the
    plan, the roofline estimates of this plan and of the other representation on
    the same device (the learned model predicts the log of measured time over this
    plan's roofline time), the shares of this plan's roofline time per cost
    component and for plan-independent work, and the counts of gathered elements
    and of per-row, per-column work. The shares and counts describe a workload by
    the kind of work it does rather than by its schema, so that what the model
    learns on the calibration grid carries over to schemas outside it.

    Parameters
    ----------
    features : dict
        Output of :func:`plan_features`.
    plan : str
        One of :data:`PLANS`.
    cached : bool, default=False
        Whether the joined matrix is already materialized.
    efficiency : dict of str to float, optional
        Calibrated component slow-downs (see :func:`plan_costs`).

    Returns
    -------
    inputs : dict of str to float

    See Also
    --------
    plan_costs : The roofline estimate the inputs are built around.

    Examples
    --------
    >>> import math
    >>> from ilargi_sklearn.datasets import make_multi_source
    >>> from ilargi_sklearn.cluster import FactorizedKMeans
    >>> from ilargi_sklearn.planner import model_inputs, plan_features
    >>> ds = make_multi_source(2000, tuple_ratio=20, random_state=0).dataset
    >>> hw = {"cpu_cores": 2, "gemm_gflops": 20.0, "mem_bandwidth_gbs": 10.0}
    >>> f = plan_features(ds, FactorizedKMeans(n_clusters=4), hardware=hw)
    >>> x = model_inputs(f, "factorized-cpu")
    >>> all(math.isfinite(v) for v in x.values())
    True
    >>> round(sum(x[f"share_{k}"] for k in COMPONENTS), 6)
    1.0
    """
    rep, device = split_plan(plan)
    f = _complete(features)
    other = ("materialized" if rep == "factorized" else "factorized") + "-" + device
    own = plan_costs(f, plan, cached=cached, efficiency=efficiency)
    alt = plan_costs(f, other, cached=cached, efficiency=efficiency)
    fact = own if rep == "factorized" else alt
    mat = alt if rep == "factorized" else own
    n, d, m = float(f["n_rows"]), float(f["n_features"]), float(f["m"])
    groups, passes = float(f["n_row_groups"]), float(f["passes"])
    x = {
        "log_rows": _log(f["n_rows"]),
        "log_features": _log(f["n_features"]),
        "log_nnz_joined": _log(f["nnz_joined"] + 1),
        "log_nnz_terms": _log(f["nnz_terms"] + 1),
        "log_bytes_sources": _log(f["bytes_sources"] + 1),
        "log_bytes_joined": _log(f["bytes_joined"] + 1),
        "log_tuple_ratio": _log(f["tuple_ratio"]),
        "log_tuple_ratio_max": _log(f["tuple_ratio_max"]),
        "log_feature_ratio": _log(f["feature_ratio"] + 1e-3),
        "log_nnz_ratio": _log(f["nnz_ratio"] + 1e-3),
        "selectivity": min(float(f["selectivity"]), 1e3),
        "sparsity_joined": float(f["sparsity_joined"]),
        "sparsity_sources": float(f["sparsity_sources"]),
        "sparse_fraction": float(f["sparse_fraction"]),
        "joined_sparse": float(f["joined_sparse"]),
        "unmatched": float(f["unmatched"]),
        "many_to_many": float(f["many_to_many"]),
        "n_sources": float(f["n_sources"]),
        "n_terms": float(f["n_terms"]),
        "n_row_groups": float(f["n_row_groups"]),
        "itemsize": float(f["itemsize"]),
        "centered": float(f["centered"]),
        "estimator": _code(f["estimator"]),
        "solver": _code(f["solver"]),
        "log_m": _log(f["m"]),
        "log_passes": _log(f["passes"]),
        "grams": float(f["grams"]),
        "log_fits": _log(f["fits"]),
        "factorized": float(rep == "factorized"),
        "gpu": float(device == "gpu"),
        "cached": float(bool(cached) and rep == "materialized"),
        "log_root_fraction": _log(f.get("root_fraction", 1.0)),
        "log_roofline_seconds": _log(own["seconds"]),
        "log_roofline_ratio": _log(fact["seconds"]) - _log(mat["seconds"]),
        "log_flop_ratio": _log(mat["flops"] + 1) - _log(fact["flops"] + 1),
        "log_setup_share": _log(own["setup_bytes"] + 1) - _log(own["bytes"] + 1),
        # Where this plan's roofline time goes (shares of its seconds), so that the
        # trees learn per kind of work how far it is from its rate, whatever the
        # schema: a gather-bound factorized plan (many row groups, several
        # right-hand-side columns) then looks alike on and off the grid.
        **{
            f"share_{k}": own["component_seconds"][k] / own["seconds"]
            for k in COMPONENTS
        },
        # Work that scales with rows x right-hand-side columns: gathered and
        # scattered elements of the factorized plan (zero for the materialized
        # one), and the per-row, per-column element-wise work both plans do
        # (distances and argmin, soft-max, multiplicative updates).
        "log_gather_elements": _log(n * m * groups * passes + 1)
        if rep == "factorized"
        else 0.0,
        "log_row_column_work": _log(n * m * passes),
        "log_columns_per_term": _log(d / max(float(f["n_terms"]), 1.0)),
        # Plan-independent work (dense algebra on small matrices, element-wise
        # passes) as a share of this plan's roofline time.
        "log_common_share": _log(own["common_seconds"] + 1e-9) - _log(own["seconds"]),
        "cpu_cores": float(f.get("cpu_cores", 1)),
        "log_gemm_gflops": _log(f.get("gemm_gflops", 10.0)),
        "log_bandwidth_gbs": _log(f.get("mem_bandwidth_gbs", 5.0)),
    }
    return x
