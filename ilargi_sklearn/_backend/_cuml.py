"""cuML for materialized GPU plans, where cuML implements the same solver.

A fit with ``strategy="materialized"`` whose computation runs on a GPU (CuPy) has a
plain dense CuPy matrix: there cuML's solver can replace the project's own kernel
for the three estimators whose algorithm cuML implements,

==================================  =====================================
estimator                           cuML model
==================================  =====================================
FactorizedLinearRegression          ``cuml.LinearRegression(algorithm="eig")``
  (``solver="normal"``)             one model per target column
FactorizedLogisticRegression        ``cuml.LogisticRegression(solver="qn")``
  (``solver="lbfgs"``)              (L-BFGS for the L2 or no penalty)
FactorizedKMeans                    ``cuml.KMeans`` (Lloyd)
==================================  =====================================

and its fitted attributes are copied into the estimator's (same names, same
shapes, the estimator's dtype, on the device). Every other case (factorized plans,
sparse matrices, the CPU, ``solver="gd"``, GNMF, which cuML lacks) keeps the
project's kernel.

cuML is used only when :func:`cuml_available` holds: ``importlib.util.find_spec``
finds it (no import) and the GPU probe succeeded. It is imported only inside
:func:`fit_cuml`, never at module import: ``import cuml`` replaces CuPy's allocator
for the whole process (RMM), which on a machine without a usable GPU makes every
later CuPy allocation fail (DESIGN.md, section 9).

Parameter mapping and where results can differ from the project's kernels
(from cuML's documentation; not yet checked on a GPU):

* Linear regression: ``fit_intercept`` as is; ``sample_weight`` passed through.
  ``algorithm="eig"`` solves the normal equations through an eigendecomposition
  of the covariance, the same method as the project's gram solve; well-conditioned
  problems agree to rounding. On rank-deficient or ill-conditioned data the
  treatment of tiny eigenvalues differs (the project cuts eigenvalues below
  ``1e-12`` of the largest and returns the minimum-norm solution), so the
  coefficients may differ while the predictions agree. float32 data are solved
  in float32 by cuML.
* Logistic regression: ``penalty`` ("l2" or None), ``C``, ``fit_intercept``,
  ``max_iter``, ``tol``, ``linesearch_max_iter=50`` (scikit-learn's ``maxls``);
  the labels are passed encoded as ``0..n_classes-1``, ``sample_weight`` passed
  through. cuML normalizes the penalty by the sample weights as scikit-learn's
  objective does, so the optimum is the same; but cuML's stopping rule (gradient
  norm ``tol`` and a function-change test at ``tol / 100``, 5 L-BFGS corrections
  instead of SciPy's 10) differs, so the coefficients agree to about the
  optimization tolerance, not to rounding. Unpenalized multinomial models are not
  unique: coefficients may differ by a per-feature constant across classes (the
  probabilities agree).
* K-Means: ``n_clusters``, ``max_iter``, ``tol``, ``n_init`` (resolved as the
  estimator does), ``init`` ("k-means++" becomes cuML's
  ``"scalable-k-means++"`` (k-means||), "random" stays, an array is passed as the
  initial centers), ``random_state`` becomes an integer seed drawn from the
  estimator's random state, ``sample_weight`` passed through. The seeding differs
  from the greedy k-means++ of the project's kernel, and cuML's convergence test
  on ``tol`` is its own (not scikit-learn's variance-scaled center shift), so the
  clusters can differ for the same ``random_state``; with an array ``init`` both
  run Lloyd's algorithm from the same centers. cuML does not subtract the column
  means first.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import numpy as np

from ilargi_sklearn._backend._namespace import (
    asarray_on,
    is_cupy_namespace,
    namespace_dtype,
)

__all__ = ["KINDS", "cuml_available", "fit_cuml", "use_cuml"]

logger = logging.getLogger(__name__)

#: The estimator kinds that cuML fits with the same solver.
KINDS = ("linear", "logistic", "kmeans")


def cuml_available() -> bool:
    """Whether cuML may be used: installed (found without importing it) and the
    GPU probe succeeded. Never imports cuML and never raises."""
    try:
        if importlib.util.find_spec("cuml") is None:
            return False
    except (ImportError, ValueError):
        return False
    from ilargi_sklearn._backend import _gpu

    return _gpu.probe_gpu()[0]


def _on_gpu(op: Any) -> bool:
    """Whether ``op`` computes on the GPU (a CuPy namespace)."""
    return is_cupy_namespace(op.xp)


def use_cuml(op: Any, strategy: str) -> bool:
    """Whether a fit on ``op`` takes the cuML path: a materialized plan of a dense
    matrix on the GPU, with cuML available (see :func:`cuml_available`).

    The estimator checks its own solver condition on top of this.
    """
    return (
        strategy == "materialized"
        and _on_gpu(op)
        and not op.is_sparse
        and cuml_available()
    )


def fit_cuml(
    kind: str,
    op: Any,
    y: Any = None,
    sample_weight: Any = None,
    **params: Any,
) -> dict[str, Any]:
    """Fit cuML on the materialized matrix of ``op`` and return fitted attributes.

    Parameters
    ----------
    kind : {"linear", "logistic", "kmeans"}
        Which estimator (see the module docstring for the parameter mapping).
    op : Operator
        The (materialized) operator; its dense matrix is given to cuML as is.
    y : array, optional
        Targets: any shape the estimator accepts ("linear", 1-D or 2-D), encoded
        labels ``0..n_classes-1`` ("logistic"), or None ("kmeans"). Moved to the
        operator's device when needed.
    sample_weight : array of shape (n_samples,), optional
        Moved to the operator's device when needed.
    **params
        The estimator's parameters that map onto cuML's (module docstring).

    Returns
    -------
    dict
        Attribute name to value, in the estimator's conventions (names, shapes,
        the operator's dtype, arrays on the operator's device).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    import cuml  # only here: it replaces CuPy's allocator process-wide

    xp, dev = op.xp, op.device
    dtype = namespace_dtype(xp, op.dtype)
    X = op.materialize("dense")

    def dev_array(a: Any, dt: Any = None) -> Any:
        return None if a is None else asarray_on(a, xp, dev, dt)

    def ours(a: Any) -> Any:
        a = dev_array(a)
        return a if a.dtype == dtype else xp.astype(a, dtype)

    sw = dev_array(sample_weight, op.dtype)
    logger.info("fitting cuML (%s) on a %d x %d matrix", kind, *op.shape)
    if kind == "linear":
        fit_intercept = params["fit_intercept"]
        Y = dev_array(y, op.dtype)
        cols = [Y] if Y.ndim == 1 else [Y[:, j] for j in range(Y.shape[1])]
        coefs, intercepts = [], []
        for col in cols:
            model = cuml.LinearRegression(
                algorithm="eig", fit_intercept=fit_intercept, output_type="cupy"
            )
            model.fit(X, col, sample_weight=sw)
            coefs.append(xp.reshape(ours(model.coef_), (-1,)))
            intercepts.append(float(model.intercept_) if fit_intercept else 0.0)
        if Y.ndim == 1:
            coef = coefs[0]
            intercept = ours(np.asarray(intercepts[0])) if fit_intercept else 0.0
        else:
            coef = xp.stack(coefs, axis=0)
            intercept = ours(np.asarray(intercepts)) if fit_intercept else 0.0
        return {"coef_": coef, "intercept_": intercept, "n_iter_": 1}
    if kind == "logistic":
        model = cuml.LogisticRegression(
            penalty=params["penalty"],
            C=params["C"],
            fit_intercept=params["fit_intercept"],
            max_iter=params["max_iter"],
            tol=params["tol"],
            linesearch_max_iter=50,
            solver="qn",
            output_type="cupy",
        )
        model.fit(X, dev_array(y, op.dtype), sample_weight=sw)
        coef = ours(model.coef_)
        coef = xp.reshape(coef, (-1, op.shape[1]))
        n_outputs = coef.shape[0]
        if params["fit_intercept"]:
            intercept = xp.reshape(ours(model.intercept_), (n_outputs,))
        else:
            intercept = xp.zeros(n_outputs, dtype=dtype, device=dev)
        n_iter = int(np.asarray(getattr(model, "n_iter_", [0])).reshape(-1)[0])
        return {
            "coef_": coef,
            "intercept_": intercept,
            "n_iter_": np.asarray([n_iter], dtype=np.int32),
        }
    # kind == "kmeans"
    init = params["init"]
    if isinstance(init, str):
        init = "scalable-k-means++" if init == "k-means++" else init
    else:
        init = ours(init)
    seed = int(params["random_state"].randint(np.iinfo(np.int32).max))
    model = cuml.KMeans(
        n_clusters=params["n_clusters"],
        init=init,
        n_init=params["n_init"],
        max_iter=params["max_iter"],
        tol=params["tol"],
        random_state=seed,
        output_type="cupy",
    )
    model.fit(X, sample_weight=sw)
    labels = dev_array(model.labels_)
    return {
        "cluster_centers_": ours(model.cluster_centers_),
        "labels_": labels if labels.dtype == xp.int32 else xp.astype(labels, xp.int32),
        "inertia_": float(model.inertia_),
        "n_iter_": int(model.n_iter_),
    }
