"""A cached probe of whether a usable NVIDIA GPU is present, that never raises.

``import cupy`` succeeds on machines without a driver, and the first allocation then
fails; without the CUDA libraries even ``import cupyx.scipy.sparse`` can fail. So
usability is decided once, by running tiny cuBLAS, cuSPARSE and scatter-add
operations, and the reason is kept for error messages.

Warnings raised while probing are silenced: under a test runner that turns
``DeprecationWarning`` into an error (this project's pytest configuration does), a
deprecation inside CuPy would otherwise make a working GPU look unusable and every
GPU test would skip. The scatter-add smoke test uses ``cupy.add.at`` (CuPy 12+),
not ``cupyx.scatter_add``, which goes through the deprecated
``ndarray.scatter_add`` since CuPy 12.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import warnings
from typing import Any

__all__ = ["gpu_reason", "gpu_usable", "probe_gpu"]

logger = logging.getLogger(__name__)


def _smoke_test(cupy: Any) -> str | None:
    """Run tiny cuBLAS, cuSPARSE and scatter-add products; None when all agree.

    Returns the first failing check's description otherwise. Each result is
    compared with its exact value (small integers, exact in float64).
    """
    import cupyx.scipy.sparse as cusp

    a = cupy.arange(6, dtype=cupy.float64).reshape(2, 3)
    if float((a @ a.T).sum()) != 83.0:  # cuBLAS GEMM: [[5, 14], [14, 50]]
        return "cuBLAS smoke test gave a wrong result"
    m = cusp.csr_matrix(a)
    if float((m @ cupy.ones(3)).sum()) != 15.0:  # cuSPARSE SpMV: [3, 12]
        return "cuSPARSE smoke test gave a wrong result"
    if float((m.T @ cupy.ones((2, 1))).sum()) != 15.0:  # transposed SpMM
        return "cuSPARSE transposed smoke test gave a wrong result"
    out = cupy.zeros(2, dtype=cupy.float64)
    cupy.add.at(out, cupy.asarray([0, 0, 1], dtype=cupy.int32), cupy.ones(3))
    if float(out[0]) != 2.0 or float(out[1]) != 1.0:
        return "scatter-add smoke test gave a wrong result"
    # Surface errors of asynchronous launches here rather than in a later fit.
    cupy.cuda.Device().synchronize()
    return None


@functools.lru_cache(maxsize=1)
def probe_gpu() -> tuple[bool, str]:
    """Return ``(usable, reason)`` for the GPU backend; cached for the process.

    Never raises and never imports CuPy unless it is installed. cuML is not imported
    here (its import replaces CuPy's allocator for the whole process).

    Returns
    -------
    usable : bool
        Whether CuPy sees a device and the smoke tests passed.
    reason : str
        The device name and count when usable, else why not (quoted in the error
        of any ``device="gpu"`` request).

    Examples
    --------
    >>> usable, reason = probe_gpu()
    >>> isinstance(usable, bool) and isinstance(reason, str) and len(reason) > 0
    True
    """
    try:
        if importlib.util.find_spec("cupy") is None:
            return False, "CuPy is not installed (pip install 'ilargi-sklearn[gpu]')"
    except (ImportError, ValueError) as exc:
        return False, f"CuPy cannot be located ({type(exc).__name__}: {exc})"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import cupy

            n = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
            return False, (
                f"no CUDA device is visible to CuPy ({type(exc).__name__}: {exc})"
            )
        if n < 1:
            return False, "CuPy sees no CUDA device"
        try:
            failed = _smoke_test(cupy)
            if failed is not None:
                return False, failed
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception as exc:  # noqa: BLE001
            return False, f"GPU smoke test failed ({type(exc).__name__}: {exc})"
    logger.info("GPU usable: %s (%d device(s))", name, n)
    return True, f"{name} ({n} device(s))"


def gpu_usable() -> bool:
    """Whether the GPU backend can be used (see :func:`probe_gpu`)."""
    return probe_gpu()[0]


def gpu_reason() -> str:
    """The probe's reason string (device name, or why no GPU is usable)."""
    return probe_gpu()[1]
