"""Sufficient statistics of the gram-based estimators: the implicitly centered gram.

Least squares, ridge, the coordinate-descent models and PCA all start from the same
figures of a weighted design: ``T^T S T``, its column sums and (for the supervised
models) ``T^T S Y``. They are computed here once, through the operator protocol, so
the data are never centered (sparsity and factorization survive) and every estimator
centers the same way.

Centering raw sums cancels: ``sum s x^2 - s_sum mean^2`` keeps about ``eps (mean /
spread)^2`` of its relative accuracy, so a column whose mean is large against its
spread (epoch seconds, prices in cents, ids) would be lost. The sums are therefore
formed of a shifted design ``W = T - 1 c^T``, with ``c`` a pilot value per column
(a value of the column near its median, on the columns that need it, see
:func:`choose_shift`; :func:`~ilargi_sklearn.multisource._operators.shift_columns`
keeps ``W`` factorized), and of a shifted target ``Y - 1 c_y^T``. Centering is
blind to constant shifts, so the centered figures of ``T`` are those of ``W``,
whose raw sums do not cancel; the means add ``c`` back. ``docs/concepts.rst``
derives it, left joins included.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    namespace_dtype,
    to_numpy,
)
from ilargi_sklearn._backend._ops import sum_axis0
from ilargi_sklearn._config import get_config
from ilargi_sklearn.multisource._lineage import ROOT, UNIT, Lineage, array_key
from ilargi_sklearn.multisource._operators import (
    AffineOperator,
    FactorizedMatrix,
    MatrixOperator,
    sample_columns,
    shift_columns,
)
from ilargi_sklearn.multisource._stats_cache import _STATS, has_gram_entry

logger = logging.getLogger(__name__)


def host64(a: Any) -> np.ndarray:
    """A parameter-sized array of any namespace as float64 NumPy."""
    return np.asarray(to_numpy(a), dtype=np.float64)


# ----------------------------------------------------------------- the pilot shift
#: Target rows read to choose the pilots (evenly spaced: deterministic, and a
#: sample of the rows a source reaches, so weighted by how often it is matched).
#: A pilot only needs to lie within a few spreads of the mean, and the test
#: against ``_PILOT_RATIO`` spreads is coarse: a small sample does (its cost is a
#: gather of these rows per source and a selection per column).
_PILOT_ROWS = 256
#: A column (or target) is shifted when its pilot exceeds this multiple of its
#: spread over the sampled rows: unshifted, its centered sums would then keep
#: less than ``1 - 1000 eps`` of their relative accuracy (``eps (1 + ratio^2)``).
_PILOT_RATIO = 32.0


def _sample_rows(n: int) -> np.ndarray:
    m = min(n, _PILOT_ROWS)
    return (np.arange(m, dtype=np.int64) * n) // max(m, 1)


def _pilots(values: np.ndarray) -> np.ndarray:
    """Per column of ``values`` (sampled rows), the pilot value: the sample's
    middle value (a value of the column, so that shifting is exact, and 0 where
    most rows are 0) where it exceeds ``_PILOT_RATIO`` times the sample's standard
    deviation, else 0."""
    m = values.shape[0]
    if m == 0:
        return np.zeros(values.shape[1])
    # A selection, not a sort (of Fortran-ordered columns: contiguous).
    middle = np.partition(values, m // 2, axis=0)[m // 2]
    spread = np.std(values, axis=0)
    return np.where(np.abs(middle) > _PILOT_RATIO * spread, middle, 0.0)


@dataclass(frozen=True)
class Shift:
    """The pilot values a design's raw sums were formed with: ``W = B - 1 c^T``
    for the design's base operator ``B`` (under its implicit scaling, see
    :func:`shifted_design`), ``c = values`` on ``cols`` and zero elsewhere.

    The same shift applied to every row subset of a design keeps their sums
    additive (a training fold's as all rows' minus the test rows').
    """

    cols: np.ndarray
    values: np.ndarray

    @property
    def trivial(self) -> bool:
        return self.cols.size == 0

    @property
    def key(self) -> str:
        """A digest of the pilots, for the keys of sums formed with them."""
        if self.trivial:
            return "none"
        h = hashlib.sha256(self.cols.tobytes() + self.values.tobytes())
        return h.hexdigest()[:16]

    def c(self, n_cols: int) -> np.ndarray:
        out = np.zeros(n_cols)
        out[self.cols] = self.values
        return out


NO_SHIFT = Shift(np.zeros(0, dtype=np.int64), np.zeros(0))


def _base(op: Any) -> tuple[Any, list[AffineOperator]]:
    """The operator under ``op``'s implicit affine layers, and the layers (outer
    first)."""
    layers = []
    while isinstance(op, AffineOperator):
        layers.append(op)
        op = op.base
    return op, layers


def _shiftable(op: Any) -> bool:
    return isinstance(op, FactorizedMatrix) or (
        isinstance(op, MatrixOperator) and not op.is_sparse
    )


def choose_shift(op: Any) -> Shift:
    """The pilot shift of ``op``'s dense columns whose raw sums would cancel.

    A sample of ``_PILOT_ROWS`` evenly spaced target rows of the operator under
    the implicit scaling (one gather of those rows per source) gives, per dense
    column, its middle value and spread (zeros counted where a left join does
    not match); a column is shifted by its middle value where that exceeds
    ``_PILOT_RATIO`` spreads. Sparse sources and other operators are not shifted.
    Well-scaled data get :data:`NO_SHIFT` and the sums of the design itself.
    """
    base, _ = _base(op)
    if not _shiftable(base) or base.n_rows == 0:
        return NO_SHIFT
    dense, values, moments = sample_columns(base, _sample_rows(base.n_rows))
    _warn_unshifted(moments)
    pilot = _pilots(values)
    cols = dense[pilot != 0]
    if cols.size == 0:
        return NO_SHIFT
    pilot = pilot[pilot != 0]
    logger.debug(
        "pilot shift of %d column(s) with a large mean against their spread: %s",
        cols.size,
        cols[:10].tolist(),
    )
    return Shift(cols, pilot)


#: Mean over spread from which a column that cannot be shifted (placed by a
#: sparse source) loses more than 1e-8 of its variance's relative accuracy
#: (``eps ratio^2``): a warning names it.
_UNSHIFTED_RATIO = 1e4


def _warn_unshifted(moments: np.ndarray) -> None:
    """Warn about the columns of sparse sources whose sampled mean exceeds
    ``_UNSHIFTED_RATIO`` times their sampled spread: their centered sums cancel
    and nothing shifts them (a sparse source is never densified)."""
    mean, var = moments
    # A column constant on the sample (variance 0: an indicator present in every
    # row) is no loss.
    bad = np.flatnonzero((var > 0) & (mean * mean > _UNSHIFTED_RATIO**2 * var))
    if not bad.size:
        return
    bad = bad.tolist()
    ratio = float(np.min(np.abs(mean[bad]) / np.sqrt(var[bad])))
    warnings.warn(
        f"Feature(s) {bad[:10]} (by position) are placed by a sparse source and "
        f"have a mean of {ratio:.3g} times their spread or more: a "
        "sparse source is never shifted, so their centered statistics lose "
        "digits (at 1e8 all of them: the column then counts as constant). "
        "Subtract a constant from them, or store their source dense.",
        UserWarning,
        stacklevel=4,
    )


def choose_target_shift(Y: Any) -> np.ndarray:
    """The pilot of each target column of ``Y`` (n_samples, n_targets): its
    sampled middle value where it exceeds ``_PILOT_RATIO`` sampled spreads, else 0
    (host float64)."""
    n = int(Y.shape[0])
    rows = _sample_rows(n)
    if isinstance(Y, np.ndarray):
        sample = Y[rows]
    else:
        xp = get_namespace(Y)
        sample = xp.take(Y, asarray_on(rows, xp, device_of(Y)), axis=0)
    return _pilots(host64(sample).reshape(rows.shape[0], -1))


def shifted_design(op: Any, shift: Shift) -> tuple[Any, np.ndarray]:
    """``(W, k)`` with ``op = W + 1 k^T``: ``W`` the design whose raw sums are
    formed (``shift``'s columns shifted, the implicit scaling kept as a diagonal,
    no implicit offset), ``k`` the constant it leaves out (host float64).

    With ``op = (B - 1 o^T) diag(s)`` (layers compose) and ``B = B_c + 1 c^T``
    (:func:`~ilargi_sklearn.multisource._operators.shift_columns`):
    ``W = B_c diag(s)`` and ``k = (c - o) s``. An implicit centering (a scaled
    dataset) thus never enters a raw sum either.
    """
    base, layers = _base(op)
    d = op.n_cols
    k = shift.c(d)
    W = base if shift.trivial else shift_columns(base, shift.cols, shift.values)
    if not layers:
        return W, k
    scale = np.ones(d)
    for layer in reversed(layers):
        s, o = host64(layer.scale), host64(layer.offset)
        k = (k - o) * s
        scale = scale * s
    if np.all(scale == 1.0):
        return W, k
    return AffineOperator(W, scale), k


def column_variances(op: Any, sample_weight: Any = None) -> tuple[np.ndarray, Any]:
    """Weighted column means and (biased) variances of ``op``, host float64.

    From the factorized column sums and sums of squares of the shifted design
    (:func:`shifted_design`), so that no cancellation loses a column whose mean is
    large against its spread. Returns ``(mean, var)``.
    """
    shift = choose_shift(op)
    W, k = shifted_design(op, shift)
    if sample_weight is None:
        w_sum = float(op.n_rows)
    else:
        w_sum = float(op.xp.sum(sample_weight))
    mean_w = host64(W.col_sums(sample_weight)) / w_sum
    sq = host64(W.col_sq_sums(sample_weight)) / w_sum
    _check_overflow(op, "sum of squares", mean_w, sq)
    var = np.maximum(sq - mean_w * mean_w, 0.0)
    return k + mean_w, var


@dataclass(frozen=True)
class GramStats:
    """The centered gram of ``T`` under weights ``s``, on the host in float64.

    With ``s_sum = sum(s)`` and the weighted column means ``mu = s^T T / s_sum``
    (zero without an intercept), ``G = T^T S T - s_sum mu mu^T`` (symmetrized) and
    ``rhs = T^T S Y - mu (s^T Y)``, formed from the shifted design ``W = T - 1
    k^T`` and target ``Y - 1 c_y^T`` (see the module's docstring).

    Attributes
    ----------
    G : ndarray of shape (n_features, n_features) or None
        Centered gram (None when it was not formed: ``centered_gram(gram=False)``).
    D : ndarray of shape (n_features,) or None
        Diagonal of the raw gram it was formed from (of ``W``, uncentered without
        an intercept): the scale of the rounding errors of ``G`` (an entry
        carries about ``eps * sqrt(D_i D_j)``, which centering keeps).
    mu : ndarray of shape (n_features,)
        Weighted column means (zeros when not centered).
    sw_sum : float
        Sum of the weights (``n_samples`` without weights).
    rhs : ndarray of shape (n_features, n_targets) or None
        Centered ``T^T S Y``.
    y_mean : ndarray of shape (n_targets,) or None
        Weighted target means (zeros when not centered).
    y_var : ndarray of shape (n_targets,) or None
        ``sum_i s_i (y_i - y_mean)^2`` per target.
    y_sq_norm : ndarray of shape (n_targets,) or None
        ``sum_i s_i (y_i - c_y)^2`` per target, the sum of squares the target's
        figures were formed from (``c_y`` its pilot; 0 without an intercept): the
        scale of their rounding errors.
    shift : Shift
        The pilots of the design's columns (:func:`shifted_design` rebuilds ``W``).
    y_shift : ndarray of shape (n_targets,) or None
        The target's pilots ``c_y``.
    w_center : ndarray of shape (n_features,) or None
        ``m`` with ``T - 1 mu^T = W - 1 m^T``: the weighted column means of ``W``
        (``-k`` without an intercept, where ``mu`` is 0), see
        :func:`centered_products`.
    y_center : ndarray of shape (n_targets,) or None
        ``y_mean - c_y`` from the shifted sums, exact where ``y_mean`` is rounded
        (``-c_y`` without an intercept): ``Y - 1 y_mean^T = Y~ - 1 y_center^T``.
    """

    G: np.ndarray | None
    D: np.ndarray | None
    mu: np.ndarray
    sw_sum: float
    rhs: np.ndarray | None = None
    y_mean: np.ndarray | None = None
    y_var: np.ndarray | None = None
    y_sq_norm: np.ndarray | None = None
    shift: Shift = NO_SHIFT
    y_shift: np.ndarray | None = None
    w_center: np.ndarray | None = None
    y_center: np.ndarray | None = None


def centered_gram(
    op: Any,
    sample_weight: Any = None,
    fit_intercept: bool = True,
    Y: Any = None,
    *,
    gram: bool = True,
    lineage: Lineage | None = None,
) -> GramStats:
    """The :class:`GramStats` of ``op`` (and of a target ``Y``, where ``op`` lives).

    With the ``lineage`` of ``op`` (computed at the estimator's boundary,
    ``validate_X(..., return_lineage=True)``), its raw sums are cached on it
    (the ``statistics_cache_bytes`` setting, :func:`~ilargi_sklearn.set_config`):
    the candidates of a grid search compute each fold's statistics once. A cached
    entry gives bit for bit what computing does, except a downdated gram (a
    training fold's gram as the root's minus the test rows',
    :func:`_downdated_sums`, only with the ``statistics_downdating`` setting on),
    which agrees to rounding (guarded, within the estimators' 1e-8).

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    fit_intercept : bool
        Center (implicitly) or not.
    Y : array of shape (n_samples, n_targets), float64, or None
        Where ``op`` lives.
    gram : bool, default=True
        False: the same statistics without the gram (``G`` and ``D`` are None),
        for the iterative solvers that only need the means and ``T^T S Y``
        (one ``col_sums`` and one ``rmatmul`` pass, no ``gram``).
    lineage : Lineage, optional
        Where ``op``'s rows come from (:func:`~ilargi_sklearn.multisource._lineage.lineage_of`);
        None: computed, not cached.
    """
    xs, ys = _raw_sums(
        op, sample_weight, Y, gram, col_sums=fit_intercept, lineage=lineage
    )
    return _centered(xs, ys, fit_intercept, gram, op.n_cols)


class _Design:
    """``shifted_design(op, shift)``, built on first use (a cache hit needs none)."""

    def __init__(self, op: Any, shift: Shift) -> None:
        self.op, self.shift = op, shift
        self._built: tuple[Any, np.ndarray] | None = None

    def get(self) -> tuple[Any, np.ndarray]:
        if self._built is None:
            self._built = shifted_design(self.op, self.shift)
        return self._built


def _raw_sums(
    op: Any,
    sample_weight: Any,
    Y: Any,
    gram: bool,
    col_sums: bool,
    lineage: Lineage | None = None,
) -> tuple[_XSums, _YSums | None]:
    """The raw sums of ``op`` (and ``Y``), from the cache where the caller gave
    ``op``'s lineage (the cached ones always carry the column sums). The target's
    sums are formed with the design's shift (that of the entry found, which may
    come from the root's, see :func:`_downdated_sums`)."""
    if not _STATS.enabled:
        lineage = None
    if lineage is None:
        design = _Design(op, choose_shift(op))
        y_shift = None if Y is None else choose_target_shift(Y)
        # A shifted target needs the column sums even without an intercept:
        # T^T S Y = T^T S Y~ + (T^T s) c_y^T.
        col_sums = col_sums or (y_shift is not None and bool(np.any(y_shift)))
        xs = _x_sums(op, sample_weight, gram, col_sums=col_sums, design=design)
        ys = None if Y is None else _y_sums(op, sample_weight, Y, design, y_shift)
        return xs, ys
    # The weights and the target are keyed where they live (a device array is
    # reduced on its device, never copied to the host for a key).
    w_key = array_key(sample_weight)
    xs = _cached_x_sums(op, lineage, sample_weight, w_key, gram)
    ys = None
    if Y is not None:
        design = _Design(op, xs.shift)
        ys = _STATS.get_or_compute(
            lineage.key() + ("Y", w_key, array_key(Y), xs.shift.key),
            lambda: _sized(_y_sums(op, sample_weight, Y, design)),
            _accept_any,
            "target sums",
        )
    return xs, ys


@dataclass(frozen=True)
class _XSums:
    """Additive raw sums of a design's shifted matrix ``W`` (:func:`shifted_design`):
    ``sum s``, ``s^T W`` and ``W^T S W``, with the shift they were formed with and
    the constant ``k`` (``T = W + 1 k^T``).

    Host float64; ``col_sums`` None when not computed (no intercept, no cache, no
    shift), ``gram`` None when not asked for.
    """

    sw_sum: float
    col_sums: np.ndarray | None
    gram: np.ndarray | None
    shift: Shift = NO_SHIFT
    k: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        arrays = (self.col_sums, self.gram, self.k)
        return sum(a.nbytes for a in arrays if a is not None)


@dataclass(frozen=True)
class _YSums:
    """Additive raw sums of a shifted target ``Y~ = Y - 1 c_y^T``: ``W^T S Y~``,
    ``s^T Y~`` and ``sum s y~^2``, and the pilots ``c_y``."""

    TtSY: np.ndarray
    sy: np.ndarray
    syy: np.ndarray
    y_shift: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.TtSY.nbytes + self.sy.nbytes + self.syy.nbytes


def _accept_any(_: Any) -> bool:
    return True


def _sized(sums: Any) -> tuple[Any, int]:
    return sums, sums.nbytes


def _x_sums(
    op: Any,
    sample_weight: Any,
    gram: bool,
    col_sums: bool,
    *,
    shift: Shift | None = None,
    design: _Design | None = None,
) -> _XSums:
    """The raw sums of ``op`` shifted by ``shift`` (chosen from ``op`` when None;
    ``design`` a prepared one). Column sums are always formed of a shifted or
    scaled design (its means are needed to undo the shift)."""
    if design is None:
        design = _Design(op, choose_shift(op) if shift is None else shift)
    W, k = design.get()
    if sample_weight is None:
        sw_sum = float(op.n_rows)
    else:
        sw_sum = float(op.xp.sum(sample_weight))
    col_sums = col_sums or W is not op or bool(np.any(k))
    cs = host64(W.col_sums(sample_weight)) if col_sums else None
    G = host64(W.gram(sample_weight, format="dense")) if gram else None
    _check_overflow(op, "gram", G, cs)
    return _XSums(sw_sum, cs, G, design.shift, k)


def _check_overflow(op: Any, what: str, *sums: Any) -> None:
    """Refuse sums that overflowed to inf or NaN (the data are finite: validated
    when the dataset or array was made), naming the dtype that overflowed."""
    if all(a is None or np.all(np.isfinite(a)) for a in sums):
        return
    dtype = np.dtype(op.dtype)
    raise ValueError(
        f"The {what} of X overflowed to non-finite values: the data contain values "
        f"too large to square and sum in {dtype.name} (largest finite "
        f"{float(np.finfo(dtype).max):.3g}). Rescale them (e.g. with "
        "FactorizedStandardScaler)"
        + (", or use float64 data." if dtype != np.float64 else ".")
    )


def _y_sums(op: Any, sample_weight: Any, Y: Any, design: _Design, y_shift=None):
    """The raw sums of ``Y`` shifted by ``y_shift`` (chosen from ``Y`` when None)
    against the design ``design`` of ``op``."""
    xp = op.xp
    W, _ = design.get()
    if y_shift is None:
        y_shift = choose_target_shift(Y)
    if np.any(y_shift):
        Y = Y - asarray_on(y_shift, xp, op.device)[None, :]
    SY = Y if sample_weight is None else Y * sample_weight[:, None]
    xdt = namespace_dtype(xp, op.dtype)
    TtSY = host64(W.rmatmul(xp.astype(SY, xdt, copy=False)))
    sy, syy = host64(sum_axis0(SY, xp)), host64(sum_axis0(SY * Y, xp))
    _check_overflow(op, "product X^T y", TtSY, sy, syy)
    return _YSums(TtSY, sy, syy, y_shift)


def _centered(
    xs: _XSums, ys: _YSums | None, fit_intercept: bool, gram: bool, n_features: int
) -> GramStats:
    """Center the raw sums. Always fresh arrays: a cached entry is never handed
    out (a caller may change what it gets in place).

    ``T = W + 1 k^T`` and ``Y = Y~ + 1 c_y^T``: centered, the figures of ``T`` and
    ``Y`` are those of ``W`` and ``Y~``, whose raw sums do not cancel; the means
    add ``k`` and ``c_y`` back. Without an intercept the uncentered figures are
    the centered ones plus ``s_sum mu mu^T`` (sums of terms that do not cancel).
    """
    sw_sum = xs.sw_sum
    k = np.zeros(n_features) if xs.k is None else xs.k
    shifted = bool(np.any(k))
    if xs.col_sums is not None:
        mu_w = xs.col_sums / sw_sum
    else:
        mu_w = np.zeros(n_features)
    G = D = None
    if gram:
        G = xs.gram
        if fit_intercept:
            D = np.diag(G).copy()
            G = G - sw_sum * np.outer(mu_w, mu_w)
        elif shifted:
            # T^T S T = W^T S W + u k^T + k u^T + s k k^T, u = s mu_w.
            u = xs.col_sums
            G = G + np.outer(u, k) + np.outer(k, u) + sw_sum * np.outer(k, k)
            D = np.diag(G).copy()
        else:
            D = np.diag(G).copy()
        G = 0.5 * (G + G.T)
    if fit_intercept:
        mu, w_center = k + mu_w, mu_w
    else:
        mu, w_center = np.zeros(n_features), -k
    if ys is None:
        return GramStats(G, D, mu, sw_sum, shift=xs.shift, w_center=w_center)
    c_y, sy, syy = ys.y_shift, ys.sy, ys.syy
    rhs = ys.TtSY
    if fit_intercept:
        ybar = sy / sw_sum
        y_mean, y_center = c_y + ybar, ybar
        y_var = np.maximum(syy - sy * ybar, 0.0)
        y_sq_norm = syy.copy()
        rhs = rhs - np.outer(mu_w, sy)
    else:
        y_mean, y_center = np.zeros(sy.shape[0]), -c_y
        # sum s y^2 and T^T S Y with Y = Y~ + c_y, T = W + k.
        y_var = syy + 2.0 * c_y * sy + sw_sum * c_y**2
        y_sq_norm = y_var.copy()
        if shifted or np.any(c_y):
            u = np.zeros(n_features) if xs.col_sums is None else xs.col_sums
            rhs = rhs + np.outer(u, c_y) + np.outer(k, sy + sw_sum * c_y)
        else:
            rhs = rhs.copy()
    return GramStats(
        G,
        D,
        mu,
        sw_sum,
        rhs,
        y_mean,
        y_var,
        y_sq_norm,
        shift=xs.shift,
        y_shift=c_y.copy(),
        w_center=w_center,
        y_center=y_center,
    )


def centered_products(op: Any, stats: GramStats) -> tuple[Any, np.ndarray]:
    """``(W, m)``: the shifted design of ``stats`` and the center to subtract in
    its products: ``T - 1 mu^T = W - 1 m^T`` with an intercept, ``T = W - 1 m^T``
    without one (``m = -k``).

    Products of ``W`` never form the large values of a shifted column: the
    refinement, leave-one-out and product-based solvers compute the centered
    design's products as ``W V - 1 (m^T V)`` and ``W^T R - m (1^T R)``.
    """
    W, _ = shifted_design(op, stats.shift)
    return W, stats.w_center


def _cached_x_sums(
    op: Any, lineage: Lineage, sample_weight: Any, w_key: str, gram: bool
) -> _XSums:
    root = lineage.root
    if root is not None:
        # The root's entries go when its operator is collected.
        _STATS.watch(root, group=lineage.token)

    def compute() -> tuple[_XSums, int]:
        sums = None
        if gram and sample_weight is None and get_config()["statistics_downdating"]:
            sums = _downdated_sums(lineage)
        if sums is None:
            # Column sums always: the entry then serves fits with and without an
            # intercept (one cheap pass next to the gram's).
            sums = _x_sums(op, sample_weight, gram, col_sums=True)
        return _sized(sums)

    return _STATS.get_or_compute(
        lineage.key() + ("X", w_key),
        compute,
        has_gram_entry if gram else _accept_any,
        "gram" if gram else "column sums",
    )


# A downdated gram is used only when the test rows carry at most this share of
# every column's squared mass (the root's gram diagonal): the rounding error of the
# difference, about eps * (D_root + D_test), then stays within 3 * eps * D_train,
# well inside the 100 * eps * D that the solvers treat as noise (``_GRAM_NOISE``).
_MAX_TEST_MASS = 0.5
# The root's pass is taken for slices of at least this share of it: K-fold training
# folds with K >= 4. Taken at the second fold, it costs that fold 1 + (1 - share)
# passes instead of share, 2 - 2 share more, and saves 2 share - 1 on each later
# fold: at 3/4 the next fold recovers it. The folds of a nested search
# (cross-validation inside a 75% training split: 0.6 of the root) would need four.
_ROOT_PASS_SHARE = 0.75


def _downdated_sums(lineage: Any) -> _XSums | None:
    """The unit-weight sums of a row slice as its root's minus the other rows'.

    A K-fold search then costs about two passes over the data instead of K: the
    root once, and each fold's test rows. Used for factorized operators of a slice
    with at least half of its root's rows (its test rows are then the smaller
    pass) when the root's sums are cached; the root's sums are computed when a
    second distinct slice of at least ``_ROOT_PASS_SHARE`` of the root is fitted,
    where the pass pays for itself over the folds still to come. A single fit on a
    slice never pays for a pass over the root. None where it does not apply or
    where the guard refuses: the caller computes directly.

    The guard: every column of the test rows carries at most ``_MAX_TEST_MASS`` of
    the root's squared mass, and the centered downdated gram is conditioned well
    enough that the difference's rounding (``eps * max(D_root)``) moves a solution
    by less than ``0.01 * sqrt(eps)`` relative (LAPACK's condition estimate of its
    Cholesky factor; a singular gram is computed directly).
    """
    rows, n_root = lineage.rows, lineage.n_root
    if (
        lineage.strategy != "factorized"
        or lineage.variant
        or rows is None
        or 2 * rows.shape[0] < n_root
    ):
        return None
    root_op = lineage.root
    if root_op is None:
        return None
    root_key = lineage.key(ROOT) + ("X", UNIT)
    n_large = 0
    if rows.shape[0] >= _ROOT_PASS_SHARE * n_root:
        n_large = _STATS.note(lineage.token, "large_slices", lineage.rows_key)
    root = _STATS.get(root_key, has_gram_entry, count=False)
    if root is None:
        if n_large < 2:
            return None
        root = _STATS.get_or_compute(
            root_key,
            lambda: _sized(_x_sums(root_op, None, True, col_sums=True)),
            has_gram_entry,
            "root gram",
        )
    test = np.ones(n_root, dtype=bool)
    test[rows] = False
    n_test = int(np.count_nonzero(test))
    if n_test != n_root - rows.shape[0]:
        return None  # repeated rows (a bootstrap): not a complement
    # The root's pilots: the sums of both parts are then of one shifted design.
    tsums = _x_sums(
        root_op.take_rows(np.flatnonzero(test)),
        None,
        True,
        col_sums=True,
        shift=root.shift,
    )
    sums, reason = _difference(root, tsums, np.dtype(lineage.dtype))
    if reason is not None:
        _STATS.count(lineage.token, "fallbacks")
        logger.debug(
            "statistics cache: no downdating for %d of %d rows (%s): computing "
            "directly.",
            rows.shape[0],
            n_root,
            reason,
        )
        return None
    _STATS.count(lineage.token, "downdates")
    logger.debug(
        "statistics cache downdate: %d rows = %d root rows - %d test rows.",
        rows.shape[0],
        n_root,
        n_test,
    )
    return sums


def _difference(
    root: _XSums, part: _XSums, dtype: Any
) -> tuple[_XSums | None, str | None]:
    """``root - part`` (the sums of the other rows), or None and why the guard
    refused it: ``part`` carries more than ``_MAX_TEST_MASS`` of a column's
    squared mass, or the difference's centered gram is too ill-conditioned for
    its rounding (``eps * max(D_root)``, ``eps`` of ``dtype``)."""
    eps = float(np.finfo(dtype).eps)
    D_root = np.diag(root.gram)
    if not np.all(np.diag(part.gram) <= _MAX_TEST_MASS * D_root):
        return None, "the test rows carry most of a column's mass"
    if part.shift is not root.shift:
        raise ValueError("sums of different pilot shifts are not additive.")
    sums = _XSums(
        root.sw_sum - part.sw_sum,
        root.col_sums - part.col_sums,
        root.gram - part.gram,
        root.shift,
        root.k,
    )
    error = _downdating_error(sums, eps * D_root)
    if not error <= 0.01 * np.sqrt(eps):
        return None, f"the gram is ill-conditioned (error bound {error:.2g})"
    return sums, None


def _downdating_error(sums: _XSums, noise: np.ndarray) -> float:
    """Relative error bound that a rounding of ``sqrt(noise_i noise_j)`` on the
    gram's entries causes in a solve with the centered gram (inf where it is
    singular).

    The centered gram is the smallest one a solver sees (the uncentered one adds
    ``s_sum mu mu^T``, positive semi-definite), so its bound covers both. The
    bound is that of the equilibrated gram (unit diagonal), which the solvers
    factor (``linear_model._least_squares._psd_solver``): columns of very different
    scales do not make it pessimistic.
    """
    mu = sums.col_sums / sums.sw_sum
    G = sums.gram - sums.sw_sum * np.outer(mu, mu)
    G = 0.5 * (G + G.T)
    if G.shape[0] == 0 or not np.any(noise):
        return 0.0
    g = np.diag(G)
    if not (np.all(g > 0) and np.all(np.isfinite(G))):
        return np.inf
    s = 1.0 / np.sqrt(g)
    Gs = G * s[:, None] * s[None, :]
    anorm = float(np.abs(Gs).sum(axis=0).max())
    try:
        c, _ = scipy.linalg.cho_factor(Gs, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return np.inf
    rc, info = scipy.linalg.lapack.dpocon(c, anorm, uplo="L")
    if info != 0 or not rc > 0:
        return np.inf
    # ||Gs^-1|| ~ 1 / (anorm rc): the error of a solve is noise * ||Gs^-1||,
    # with the noise of an equilibrated entry at most max_i noise_i / g_i.
    return float(np.max(noise * s * s)) / (anorm * rc)


class FoldStatistics:
    """The statistics of a K-fold cross-validation of one design, in about two
    passes over the rows instead of K.

    The raw sums of all rows are computed once (from the cache where ``lineage``
    is given: the refit on all rows then finds them); per fold, the test rows'
    directly (the smaller pass) and the training rows' as their difference, under
    the guard of :func:`_difference` (and the same bound on the targets' squared
    mass), falling back to the training rows' own pass where it refuses. The
    cross-validated estimators use it: they visit every fold and fit on all rows,
    so the pass over all rows is always paid for.

    Parameters
    ----------
    op : Operator of shape (n_samples, n_features)
    sample_weight : array of shape (n_samples,) or None
        Where ``op`` lives.
    Y : array of shape (n_samples, n_targets), float64
        Where ``op`` lives.
    fit_intercept : bool
    lineage : Lineage, optional
        Where ``op``'s rows come from (None: not cached).
    """

    def __init__(
        self,
        op: Any,
        sample_weight: Any,
        Y: Any,
        fit_intercept: bool,
        *,
        lineage: Lineage | None = None,
    ):
        self.op, self.sample_weight, self.Y = op, sample_weight, Y
        self.fit_intercept = fit_intercept
        self._all = _raw_sums(
            op, sample_weight, Y, True, col_sums=True, lineage=lineage
        )
        # The test rows' sums are formed with all rows' pilots (additive).
        self._design_shift = self._all[0].shift
        #: Folds whose training statistics were computed directly (the guard).
        self.fallbacks = 0

    @property
    def all_rows(self) -> GramStats:
        """The centered statistics of all rows."""
        return _centered(*self._all, self.fit_intercept, True, self.op.n_cols)

    def fold(self, train: np.ndarray, test: np.ndarray) -> Fold:
        """The fold with host indices ``train`` and ``test`` (a partition of the
        rows: otherwise its training rows are computed directly)."""
        op, xp, device = self.op, self.op.xp, self.op.device
        test_d = asarray_on(test, xp, device)
        test_op = op.take_rows(test_d)
        Y_test = xp.take(self.Y, test_d, axis=0)
        sw_test = _take(self.sample_weight, test_d, xp)
        design = _Design(test_op, self._design_shift)
        txs = _x_sums(test_op, sw_test, True, col_sums=True, design=design)
        tys = _y_sums(test_op, sw_test, Y_test, design, self._all[1].y_shift)
        train_sums = None
        if train.shape[0] + test.shape[0] == op.n_rows:
            train_sums = self._difference(txs, tys, train, test)
        if train_sums is None:
            train_d = asarray_on(train, xp, device)
            train_op = op.take_rows(train_d)
            sw_train = _take(self.sample_weight, train_d, xp)
            # Computed directly, with all rows' pilots: the training and test
            # rows' figures are then of one shifted design (the test error's
            # offset is a difference of their shifted means, _path_mse of
            # linear_model._coordinate_descent_cv).
            design = _Design(train_op, self._design_shift)
            Y_train = xp.take(self.Y, train_d, axis=0)
            train_sums = (
                _x_sums(train_op, sw_train, True, col_sums=True, design=design),
                _y_sums(train_op, sw_train, Y_train, design, self._all[1].y_shift),
            )
        n = op.n_cols
        return Fold(
            _centered(*train_sums, self.fit_intercept, True, n),
            _centered(txs, tys, True, True, n),
            test_op,
            Y_test,
            sw_test,
        )

    def _difference(self, txs, tys, train, test):
        xs, ys = self._all
        seen = np.zeros(self.op.n_rows, dtype=bool)
        seen[test] = True
        seen[train] = True
        reason = None
        if not seen.all():
            reason = "the folds are not a partition"
        elif not np.all(tys.syy <= _MAX_TEST_MASS * ys.syy):
            reason = "the test rows carry most of the target's mass"
        else:
            diff, reason = _difference(xs, txs, np.dtype(self.op.dtype))
        if reason is not None:
            self.fallbacks += 1
            logger.debug(
                "fold statistics: no downdating for %d of %d rows (%s): computing "
                "directly.",
                train.shape[0],
                self.op.n_rows,
                reason,
            )
            return None
        return diff, _YSums(
            ys.TtSY - tys.TtSY, ys.sy - tys.sy, ys.syy - tys.syy, ys.y_shift
        )


@dataclass(frozen=True)
class Fold:
    """One fold of :class:`FoldStatistics`: the centered statistics of its
    training rows (centered as the fit asks) and of its test rows (centered), the
    test rows' operator, targets and weights (where ``op`` lives)."""

    train: GramStats
    test: GramStats
    test_op: Any
    Y_test: Any
    sw_test: Any


def _take(a: Any, rows: Any, xp: Any) -> Any:
    return None if a is None else xp.take(a, rows, axis=0)
