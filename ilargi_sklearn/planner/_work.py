"""The work of one fit, as the estimator itself declares it.

Every estimator that :class:`~ilargi_sklearn.planner.AutoPlan` plans defines one
small private method where it is defined::

    def _plan_work(self, data, y) -> Work

``data`` is a :class:`PlanData` (the cheap figures of the training data of
:func:`~ilargi_sklearn.planner.data_features`, read as a mapping, and the dataset
itself), ``y`` the target or None. The method returns a :class:`Work`: the kind
of work, the operator calls a fit makes (passes of one ``matmul`` and one
``rmatmul`` with ``m`` right-hand-side columns, extra ``matmul`` calls, grams),
the expected iterations and how the passes grow with them, the plan-independent
dense and element-wise work, and, for work that is not operator calls (the trees'
histograms, binning), the amounts of each cost component per representation. A
cross-validated search composes its inner estimator's work over folds and
candidates (:meth:`Work.repeated`).

The planner reads the declaration (:func:`estimator_work`) and knows no estimator
by name: a new estimator needs no edit in ``planner/``. This module imports
nothing from the rest of the package, so estimators may import it freely.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = [
    "PlanData",
    "Work",
    "estimator_work",
    "guess_lsqr_iterations",
    "int_param",
    "n_classes",
    "n_folds",
    "n_targets",
]

#: The representations a :attr:`Work.plan_work` entry may name.
_REPRESENTATIONS = ("factorized", "materialized")
#: The cost components a :attr:`Work.plan_work` entry may name (those of
#: :data:`~ilargi_sklearn.planner._features.COMPONENTS`).
_COMPONENTS = (
    "dense_flops",
    "stream_bytes",
    "sparse_flops",
    "gather_bytes",
    "calls",
    "setup_bytes",
)
#: What the iteration count may rescale besides the passes.
_SCALABLE = ("common_flops", "common_bytes", "plan_work")


@dataclass(frozen=True)
class PlanData(Mapping):
    """The training data of a planned fit: its figures, and the data itself.

    Reads as the mapping of :func:`~ilargi_sklearn.planner.data_features`
    (``data["n_rows"]``, ``data["joined_sparse"]``, ...); :attr:`dataset` is the
    training data, for the rare declaration that needs more than the figures
    (the trees' tree features per source). Never materialize it.
    """

    figures: Mapping[str, Any]
    dataset: Any = None

    def __getitem__(self, key: str) -> Any:
        return self.figures[key]

    def __iter__(self):
        return iter(self.figures)

    def __len__(self) -> int:
        return len(self.figures)


@dataclass(frozen=True)
class Work:
    """What one fit computes, in units both plans share.

    Parameters
    ----------
    kind : str
        A short name of the kind of work (``"ridge"``, ``"kmeans"``, ``"trees"``);
        the learned cost model reads it as a category. Never ``"other"``: that is
        the planner's name for an estimator that declares nothing.
    solver : str, default="other"
        The solver that runs (``"normal"``, ``"lbfgs"``, ``"cd"``, ...).
    m : int, default=1
        Right-hand-side columns of each pass (targets, classes, clusters, rank).
    iterations : int, default=1
        Expected iterations (an upper bound where the solver stops early).
    passes : float, default=1.0
        Passes over the data: each one ``matmul`` and one ``rmatmul`` with ``m``
        columns.
    passes_per_iteration : float or None, default=None
        Passes each iteration adds: how :attr:`passes` changes when a fit runs
        another number of iterations (calibration records store the iterations
        run). None: the passes do not depend on the iterations.
    scales_with_iterations : tuple of str, default=()
        Which of ``"common_flops"``, ``"common_bytes"`` and ``"plan_work"`` grow in
        proportion to the iterations too.
    matmuls : float, default=0.0
        Extra ``matmul`` calls with ``matmul_m`` columns (k-means++).
    matmul_m : int, default=1
    grams : float, default=0
        Grams of the data formed (the normal equations; ``2`` for the fold
        statistics of a search: all rows, then the test folds).
    row_norms : int, default=0
        Whether the squared row norms are computed (one pass of one column).
    common_flops, common_bytes : float, default=0.0
        Work that does not depend on the plan: dense algebra on small matrices,
        element-wise passes over rows.
    column_sum_passes : float, default=0.0
        Passes that only compute column sums, which a cached gram carries too.
    fits : int, default=1
        Fits the work stands for (folds x candidates, plus the refit, of a search).
    joins : bool, default=True
        Whether the materialized plan builds the join through the operator's
        materialization cache (the linear, clustering and decomposition models);
        False where it builds its own table (the trees), counted in
        :attr:`plan_work`.
    plan_work : dict, default={}
        Work that is not operator calls: per representation (``"factorized"``,
        ``"materialized"``), the amount of each cost component (``dense_flops``,
        ``stream_bytes``, ``sparse_flops``, ``gather_bytes``, ``calls``,
        ``setup_bytes``). ``setup_bytes`` never grows with the iterations.
    """

    kind: str
    solver: str = "other"
    m: int = 1
    iterations: int = 1
    passes: float = 1.0
    passes_per_iteration: float | None = None
    scales_with_iterations: tuple[str, ...] = ()
    matmuls: float = 0.0
    matmul_m: int = 1
    grams: float = 0
    row_norms: int = 0
    common_flops: float = 0.0
    common_bytes: float = 0.0
    column_sum_passes: float = 0.0
    fits: int = 1
    joins: bool = True
    plan_work: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError(
                f"Work.kind must be a non-empty string, got {self.kind!r}."
            )
        bad = [s for s in self.scales_with_iterations if s not in _SCALABLE]
        if bad:
            raise ValueError(
                f"Work.scales_with_iterations names {bad}; allowed: {list(_SCALABLE)}."
            )
        for rep, amounts in self.plan_work.items():
            if rep not in _REPRESENTATIONS:
                raise ValueError(
                    f"Work.plan_work names representation {rep!r}; allowed: "
                    f"{list(_REPRESENTATIONS)}."
                )
            unknown = [c for c in amounts if c not in _COMPONENTS]
            if unknown:
                raise ValueError(
                    f"Work.plan_work[{rep!r}] names components {unknown}; allowed: "
                    f"{list(_COMPONENTS)}."
                )

    def repeated(self, times: float, **changes: Any) -> Work:
        """This work done ``times`` times (a search's fits), with ``changes``.

        Passes, extra calls, grams, plan-independent work and the per-plan work
        are multiplied; the iterations and their scaling stay per fit, so that a
        record's iteration count (the refit's) rescales each fit alike.
        """
        f = float(times)
        plan_work = {
            rep: {c: float(v) * f for c, v in amounts.items()}
            for rep, amounts in self.plan_work.items()
        }
        per = self.passes_per_iteration
        out = replace(
            self,
            passes=self.passes * f,
            passes_per_iteration=None if per is None else per * f,
            matmuls=self.matmuls * f,
            grams=self.grams * f,
            common_flops=self.common_flops * f,
            common_bytes=self.common_bytes * f,
            column_sum_passes=self.column_sum_passes * f,
            fits=max(int(round(self.fits * f)), 1),
            plan_work=plan_work,
        )
        return replace(out, **changes) if changes else out

    def features(self) -> dict[str, Any]:
        """The flat features the planner stores and reads (JSON-able)."""
        out = {
            "estimator": self.kind,
            "solver": self.solver,
            "m": int(self.m),
            "iterations": int(self.iterations),
            "passes": float(self.passes),
            "passes_per_iteration": -1.0
            if self.passes_per_iteration is None
            else float(self.passes_per_iteration),
            "iter_scaled": ",".join(sorted(self.scales_with_iterations)),
            "matmuls": float(self.matmuls),
            "matmul_m": int(self.matmul_m),
            "grams": float(self.grams),
            "row_norms": int(self.row_norms),
            "common_flops": float(self.common_flops),
            "common_bytes": float(self.common_bytes),
            "column_sum_passes": float(self.column_sum_passes),
            "fits": int(self.fits),
            "joins": bool(self.joins),
        }
        for rep in _REPRESENTATIONS:
            amounts = self.plan_work.get(rep, {})
            for c in _COMPONENTS:
                out[f"plan_{rep}_{c}"] = float(amounts.get(c, 0.0))
        return out


#: The declaration of an estimator that declares nothing (a third-party
#: estimator with a ``strategy`` parameter): ``max_iter`` passes.
def _undeclared(estimator: Any) -> Work:
    params = estimator.get_params(deep=False)
    it = int_param(params, "max_iter", 10)
    return Work(kind="other", iterations=it, passes=float(it))


_WARNED: set[str] = set()


def estimator_work(estimator: Any, data: PlanData, y: Any = None) -> Work:
    """The work of fitting ``estimator`` on ``data``, as the estimator declares it.

    Parameters
    ----------
    estimator : estimator
        Read through its ``_plan_work(data, y)`` method, never fitted.
    data : PlanData
    y : array-like, optional

    Returns
    -------
    Work
        For an estimator without ``_plan_work``: ``max_iter`` (default 10) passes
        of kind ``"other"``, with one warning per class that names it.

    Raises
    ------
    TypeError
        When ``_plan_work`` returns something other than a :class:`Work`.
    """
    declare = getattr(estimator, "_plan_work", None)
    if declare is None:
        name = type(estimator).__name__
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(
                f"{name} does not declare the work of its fit (no _plan_work "
                "method): AutoPlan costs it as max_iter passes over the data, which "
                "may choose the slower plan. Define _plan_work(self, data, y) "
                "returning ilargi_sklearn.planner._work.Work.",
                UserWarning,
                stacklevel=3,
            )
        return _undeclared(estimator)
    work = declare(data, y)
    if not isinstance(work, Work):
        raise TypeError(
            f"{type(estimator).__name__}._plan_work returned "
            f"{type(work).__name__}; it must return a Work."
        )
    return work


# ----------------------------------------------------------- shared helpers
def int_param(params: Mapping[str, Any], name: str, default: int) -> int:
    """``params[name]`` when it is an integer, else ``default``."""
    v = params.get(name, default)
    return int(v) if isinstance(v, numbers.Integral) else default


def n_classes(y: Any) -> int:
    """Classes of a classification target (2 when unknown)."""
    if y is None:
        return 2
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] == 0:
        return 2
    return max(int(np.unique(y).shape[0]), 2)


def n_targets(y: Any) -> int:
    """Columns of a regression target (1 for a vector or when unknown)."""
    return 1 if y is None or np.ndim(y) < 2 else int(np.shape(y)[1])


def guess_lsqr_iterations(
    tol: Any, max_iter: Any, n_features: float, default_tol: float
) -> int:
    """LSQR's iteration count, guessed from its tolerance (``max_iter`` bounds it)."""
    tol = tol or default_tol
    it = int(min(2 * n_features, 25 * max(math.log10(1.0 / tol), 1.0)))
    return min(it, int(max_iter)) if isinstance(max_iter, numbers.Integral) else it


def n_folds(cv: Any, default: int = 5) -> int:
    """Folds of a ``cv`` parameter, as ``check_cv`` reads it (``default`` for None)."""
    if cv is None:
        return default
    if isinstance(cv, numbers.Integral):
        return int(cv)
    if hasattr(cv, "get_n_splits"):
        try:
            return max(int(cv.get_n_splits()), 1)
        except (TypeError, ValueError):
            return default
    try:
        return max(len(cv), 1)
    except TypeError:
        return default
