"""A cached probe of whether a usable NVIDIA GPU is present, that never raises.

``import cupy`` succeeds on machines without a driver, and the first allocation then
fails; without the CUDA libraries even ``import cupyx.scipy.sparse`` can fail. So
usability is decided once, by running tiny cuBLAS, cuSPARSE and scatter-add
operations, and the reason is kept for error messages.
"""

from __future__ import annotations

import functools
import importlib.util
import logging

__all__ = ["gpu_reason", "gpu_usable", "probe_gpu"]

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def probe_gpu() -> tuple[bool, str]:
    """Return ``(usable, reason)`` for the GPU backend; cached for the process.

    Never raises and never imports CuPy unless it is installed. cuML is not imported
    here (its import replaces CuPy's allocator for the whole process).
    """
    if importlib.util.find_spec("cupy") is None:
        return False, "CuPy is not installed (pip install 'ilargi-sklearn[gpu]')"
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        return False, f"no CUDA device is visible to CuPy ({type(exc).__name__}: {exc})"
    if n < 1:
        return False, "CuPy sees no CUDA device"
    try:
        import cupyx
        import cupyx.scipy.sparse as cusp

        a = cupy.arange(6, dtype=cupy.float64).reshape(2, 3)
        float((a @ a.T).sum())  # cuBLAS
        m = cusp.csr_matrix(a)
        float((m @ cupy.ones(3)).sum())  # cuSPARSE
        out = cupy.zeros(2, dtype=cupy.float64)
        cupyx.scatter_add(out, cupy.asarray([0, 0, 1]), cupy.ones(3))
        if float(out[0]) != 2.0:
            return False, "scatter-add smoke test gave a wrong result"
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
