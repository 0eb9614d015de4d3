"""Placement: a dataset's copies on other devices (``MultiSourceDataset.to_device``).

A root dataset (the one row slices come from) is copied to a device once; the copy
is kept in a weak table keyed by the root's operator, so that every slice of the
root (a grid search's folds) takes its rows from that copy instead of uploading
again. The table is the only place that knows of the copies: nothing hangs on the
operator, so a host dataset pickles after a move, and a dataset's copies go when
its root operator goes. The way back from a device copy to its host dataset is
a *weak* link: a table entry that held the host root strongly would keep it alive
through the copy forever.
"""

from __future__ import annotations

import weakref
from typing import Any

from ilargi_sklearn._backend._namespace import get_namespace, is_numpy_namespace
from ilargi_sklearn._backend._plan import DeviceUnavailableError

__all__ = ["drop_device_copies", "to_device"]

# ``to_device`` is a method of :class:`MultiSourceDataset` (assigned in its class
# body): ``self`` is the dataset.

#: Root operator -> {device key: the root dataset's copy there}.
_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: A copy's root operator -> (device key of its host, weak reference to the host
#: root's operator).
_HOMES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def drop_device_copies() -> None:
    """Forget the cached device copies of every root dataset
    (``ilargi_sklearn.clear_caches``): the next :meth:`~MultiSourceDataset.to_device`
    copies the sources as they are then. Datasets already moved keep their data,
    and a copy's way back to its host (a reference, not a copy) stays."""
    _COPIES.clear()


def to_device(self: Any, device: Any = "cpu", *, namespace: Any = None) -> Any:
    """The same dataset with sources and index vectors on ``device``.

    The move happens once per dataset: the copy of the root dataset (the one
    that row slices come from) is kept while the root lives, and a row slice
    moved to a device takes its rows from that copy (a grid search does not
    re-upload per fold). Moving a copy back to where its root came from gives
    the root's data, uncopied. Index vectors are int32 on the device.

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
    xp, dev, key = _resolve_device(device, namespace)
    op = self.operator
    if op.xp is xp or (is_numpy_namespace(xp) and is_numpy_namespace(op.xp)):
        if dev is None or is_numpy_namespace(xp) or op.device == dev:
            return self
    root_op = self._root_operator
    root = _COPIES.get(root_op, {}).get(key)
    if root is None:
        root = _home_of(self, root_op, key)
    if root is None:
        root = self._like(root_op.to_namespace(xp, dev), root=True)
        _COPIES.setdefault(root_op, {})[key] = root
        # The way back: the copy knows the dataset it came from.
        _HOMES[root._root_operator] = (
            _device_key(op.xp, op.device),
            weakref.ref(root_op),
        )
    if self._root_rows is None:
        return root
    return root[self._root_rows]


def _home_of(ds: Any, root_op: Any, key: tuple[str, str]) -> Any:
    """The host root of a device copy ``ds`` when ``key`` names the host's device
    and the host is alive; else None."""
    home = _HOMES.get(root_op)
    if home is None or home[0] != key:
        return None
    home_op = home[1]()
    if home_op is None:
        return None
    out = ds._like(home_op, root=True)
    out._root_token = ds._root_token
    return out


def _device_key(xp: Any, device: Any) -> tuple[str, str]:
    if is_numpy_namespace(xp):
        return ("numpy", "cpu")
    return (xp.__name__, str(device))


def _resolve_device(device: Any, namespace: Any) -> tuple[Any, Any, tuple[str, str]]:
    """``(xp, device, cache key)`` for :meth:`MultiSourceDataset.to_device`."""
    if namespace is not None:
        return namespace, device, _device_key(namespace, device)
    if device == "cpu":
        xp = get_namespace()
        return xp, "cpu", _device_key(xp, "cpu")
    if device == "gpu":
        from ilargi_sklearn._backend._gpu import probe_gpu

        usable, reason = probe_gpu()
        if not usable:
            raise DeviceUnavailableError(
                f"device='gpu' was requested but no GPU is usable: {reason}."
            )
        import array_api_compat.cupy as xp_cupy

        return xp_cupy, None, ("array_api_compat.cupy", "gpu")
    raise ValueError(
        f"device must be 'cpu' or 'gpu' (or a device object with namespace=...), "
        f"got {device!r}."
    )
