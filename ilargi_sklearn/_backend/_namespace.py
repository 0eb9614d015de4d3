"""Array namespaces and devices: resolved once, at the boundary, for every kernel.

The kernels of the package are written against the array-API standard; this module
says which namespace (``xp``) and device the inputs live in, and moves arrays between
namespaces explicitly (never silently: CuPy and ``array_api_strict`` refuse implicit
conversion to NumPy, and so do these helpers' callers).

CuPy is never imported here unless an input already is a CuPy array (checked with
``type(x).__module__`` first), so ``import ilargi_sklearn`` stays free of it.
SciPy sparse matrices count as NumPy; ``cupyx.scipy.sparse`` matrices as CuPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = [
    "asarray_on",
    "device_of",
    "get_namespace",
    "is_cupy_namespace",
    "is_numpy_namespace",
    "namespace_dtype",
    "numpy_dtype",
    "same_namespace",
    "to_numpy",
]

#: Names under which the NumPy namespace can appear.
_NUMPY_NAMES = frozenset({"numpy", "array_api_compat.numpy"})


def _is_cupy_object(x: Any) -> bool:
    """Whether ``x`` is a CuPy array or ``cupyx.scipy.sparse`` matrix (no import)."""
    return type(x).__module__.startswith(("cupy", "cupyx"))


def _is_cupy_sparse(x: Any) -> bool:
    """Whether ``x`` is a ``cupyx.scipy.sparse`` matrix (checked without importing)."""
    return type(x).__module__.startswith("cupyx.scipy.sparse")


def _cupy_namespace() -> Any:
    import array_api_compat.cupy as xp_cupy

    return xp_cupy


def _numpy_namespace() -> Any:
    import array_api_compat.numpy as xp_numpy

    return xp_numpy


def get_namespace(*arrays: Any) -> Any:
    """The array namespace of ``arrays`` (None and Python scalars are skipped).

    Parameters
    ----------
    *arrays : arrays, sparse matrices, None or scalars
        Inputs that must share one namespace.

    Returns
    -------
    module
        ``array_api_compat.numpy`` for NumPy arrays and SciPy sparse matrices (and
        when no array is given), ``array_api_compat.cupy`` for CuPy arrays and
        ``cupyx.scipy.sparse`` matrices, otherwise the namespace that
        ``array_api_compat.array_namespace`` reports (``array_api_strict``, ...).

    Raises
    ------
    TypeError
        When the inputs come from different namespaces.

    Examples
    --------
    >>> import numpy as np
    >>> is_numpy_namespace(get_namespace(np.ones(2), None, 3.0))
    True
    """
    found: list[Any] = []
    for x in arrays:
        if x is None or isinstance(x, (bool, int, float, complex, np.generic)):
            continue
        if isinstance(x, np.ndarray) or sp.issparse(x):
            xp = _numpy_namespace()
        elif _is_cupy_object(x):
            xp = _cupy_namespace()
        else:
            import array_api_compat

            xp = array_api_compat.array_namespace(x)
            if is_numpy_namespace(xp):
                xp = _numpy_namespace()
        if found and xp is not found[0]:
            raise TypeError(
                f"inputs mix array namespaces {found[0].__name__} and {xp.__name__}; "
                "move them to one device first (MultiSourceDataset.to_device, "
                "or the estimator's device parameter)."
            )
        if not found:
            found.append(xp)
    return found[0] if found else _numpy_namespace()


def is_numpy_namespace(xp: Any) -> bool:
    """Whether ``xp`` is NumPy (plain, or wrapped by ``array_api_compat``)."""
    return xp is None or getattr(xp, "__name__", "") in _NUMPY_NAMES


def same_namespace(xp: Any, other: Any) -> bool:
    """Whether ``xp`` and ``other`` are one namespace (any two spellings of NumPy)."""
    return xp is other or (is_numpy_namespace(xp) and is_numpy_namespace(other))


def is_cupy_namespace(xp: Any) -> bool:
    """Whether ``xp`` is CuPy (plain, or wrapped by ``array_api_compat``)."""
    return getattr(xp, "__name__", "") in ("cupy", "array_api_compat.cupy")


def device_of(x: Any) -> Any:
    """The device of ``x``: ``"cpu"`` for NumPy and SciPy, else the array's device."""
    if x is None or isinstance(x, np.ndarray) or sp.issparse(x):
        return "cpu"
    if _is_cupy_sparse(x):
        # cupyx sparse matrices keep their device on the data array.
        return x.data.device
    if _is_cupy_object(x):
        return x.device
    import array_api_compat

    return array_api_compat.device(x)


def to_numpy(x: Any) -> Any:
    """``x`` as a NumPy array (SciPy sparse stays sparse), from any namespace.

    CuPy arrays and ``cupyx`` sparse matrices are copied with ``.get()``; other
    array-API arrays are first moved to their namespace's CPU device (the explicit
    conversion that ``array_api_strict`` accepts).

    Examples
    --------
    >>> import numpy as np
    >>> to_numpy(np.arange(3))
    array([0, 1, 2])
    """
    if x is None or isinstance(x, np.ndarray) or sp.issparse(x):
        return x
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return np.asarray(x)
    if _is_cupy_object(x):
        return x.get()
    mod = type(x).__module__
    if mod.startswith("array_api_strict"):
        import array_api_strict

        return np.asarray(x.to_device(array_api_strict.Device("CPU_DEVICE")))
    if hasattr(x, "to_device") and not hasattr(x, "__array__"):
        return np.asarray(x.to_device("cpu"))
    return np.asarray(x)


def _cupy_module() -> Any:
    import cupy

    return cupy


def asarray_on(x: Any, xp: Any, device: Any = None, dtype: Any = None) -> Any:
    """``x`` (any namespace, or sparse) as an array of namespace ``xp`` on ``device``.

    A no-op when ``x`` already is there with the right dtype. SciPy sparse input
    becomes a ``cupyx.scipy.sparse`` CSR matrix for CuPy; other non-NumPy namespaces
    have no sparse arrays and raise a ``TypeError``.

    Parameters
    ----------
    x : array, sparse matrix or scalar
    xp : module
        Target namespace (``is_numpy_namespace`` ones give NumPy arrays).
    device : object, optional
        Target device (the namespace's default when None).
    dtype : NumPy dtype, optional
        Target dtype (mapped into ``xp`` with :func:`namespace_dtype`).
    """
    if is_numpy_namespace(xp):
        out = to_numpy(x)
        if dtype is not None and out.dtype != np.dtype(dtype):
            out = out.astype(dtype)
        return out
    if is_cupy_namespace(xp):
        cp = _cupy_module()
        if sp.issparse(x) or _is_cupy_sparse(x):
            import cupyx.scipy.sparse as cusp

            # cupyx sparse matrices hold float32/float64 data and int32 indices
            # only (their constructor casts the indices and rejects other dtypes).
            if sp.issparse(x):
                x = sp.csr_matrix(x if dtype is None else x.astype(dtype))
                if device is None or device == "cpu":
                    return cusp.csr_matrix(x)
                with cp.cuda.Device(getattr(device, "id", device)):
                    return cusp.csr_matrix(x)
            out = cusp.csr_matrix(x)
            return out if dtype is None else out.astype(dtype)
        if not _is_cupy_object(x) and not isinstance(x, np.ndarray):
            # array_api_strict and other namespaces refuse implicit conversion.
            x = to_numpy(x)
        if device is None or device == "cpu":
            return cp.asarray(x, dtype=dtype)
        with cp.cuda.Device(getattr(device, "id", device)):
            return cp.asarray(x, dtype=dtype)
    if sp.issparse(x):
        raise TypeError(
            f"the namespace {xp.__name__} has no sparse arrays; a sparse source "
            "cannot be moved there (materialize it as dense first)."
        )
    xdtype = None if dtype is None else namespace_dtype(xp, dtype)
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray) and not isinstance(
        x, (bool, int, float, np.generic)
    ):
        if get_namespace(x) is xp:
            if device is not None and device_of(x) != device:
                x = x.to_device(device)
            return x if xdtype is None or x.dtype == xdtype else xp.astype(x, xdtype)
        x = to_numpy(x)
    return xp.asarray(np.asarray(x), dtype=xdtype, device=device)


def namespace_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype of namespace ``xp`` named like the NumPy ``dtype``."""
    dtype = np.dtype(dtype)
    if is_numpy_namespace(xp):
        return dtype
    return getattr(xp, dtype.name)


def numpy_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of an array-API dtype (``xp.float32`` -> ``float32``)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    # array_api_strict and friends: their dtypes print as "namespace.float64".
    try:
        return np.dtype(str(dtype).rsplit(".", 1)[-1])
    except TypeError:
        raise TypeError(f"unknown array dtype {dtype!r}.") from None
