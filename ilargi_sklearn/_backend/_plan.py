"""The vocabulary of plans and devices, defined once for the whole package.

A plan is how a fit runs: a *strategy* (``"factorized"``, over the sources, or
``"materialized"``, over the joined matrix built once) on a *device* (``"cpu"`` or
``"gpu"``). Estimators take both as parameters (their ``device`` also accepts
``"auto"``), the planner predicts the time of each plan, the CLI and the
calibration name plans by :attr:`Plan.name` (``"factorized-cpu"``).

Falling back to another plan is driven by the exception's type, never by its
message: :class:`DeviceUnavailableError` (no usable GPU, or the GPU libraries
failing) and :class:`UnsupportedOnDeviceError` (a configuration the device's kernels
do not implement).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEVICES",
    "DEVICE_OPTIONS",
    "PLANS",
    "STRATEGIES",
    "DeviceUnavailableError",
    "Plan",
    "UnsupportedOnDeviceError",
]

#: How a fit reads its data: over the sources, or over the joined matrix.
STRATEGIES = ("factorized", "materialized")

#: Where a plan runs.
DEVICES = ("cpu", "gpu")

#: The values of an estimator's ``device`` parameter (``"auto"``: the GPU when one
#: is usable and the data is large enough, else the CPU).
DEVICE_OPTIONS = ("auto", *DEVICES)


class DeviceUnavailableError(RuntimeError):
    """The requested device cannot be used here (no GPU, or its libraries fail).

    A :class:`RuntimeError`, so code written against the earlier untyped error still
    catches it.
    """


class UnsupportedOnDeviceError(NotImplementedError):
    """The device's kernels do not implement this configuration (for example a
    parameter the GPU path lacks); the CPU runs it."""


@dataclass(frozen=True, order=True)
class Plan:
    """One way to run a fit: a strategy on a device.

    Parameters
    ----------
    strategy : {"factorized", "materialized"}
    device : {"cpu", "gpu"}
    """

    strategy: str
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {STRATEGIES}, got {self.strategy!r}."
            )
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}.")

    @property
    def name(self) -> str:
        """``"<strategy>-<device>"``, the name used in records, the CLI and JSON."""
        return f"{self.strategy}-{self.device}"

    @classmethod
    def parse(cls, name: str) -> Plan:
        """The plan named ``name`` (``"factorized-gpu"``; a bare strategy means the
        CPU)."""
        if not isinstance(name, str):
            raise TypeError(f"a plan name must be a string, got {type(name).__name__}.")
        strategy, dash, device = name.partition("-")
        try:
            return cls(strategy, device if dash else "cpu")
        except ValueError:
            raise ValueError(
                f"unknown plan {name!r}; plans are {list(PLANS)}."
            ) from None

    def __str__(self) -> str:
        return self.name


#: Every plan's name, CPU plans first.
PLANS = tuple(Plan(s, d).name for d in DEVICES for s in STRATEGIES)
