"""What the command line writes: results, narration, progress bars, JSON, charts.

Results go to stdout, progress bars and notes to stderr, through a
:class:`Console` that ``--quiet`` and ``--json`` configure; the commands and the
demo share these helpers, and nothing else in the package prints.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class RunError(Exception):
    """A failure while running a command (exit code 1), shown without traceback."""


class UsageError(Exception):
    """The command cannot start (exit code 2): an option's value, or a file named
    on the command line that is missing or cannot be used; shown without
    traceback."""


PLOT_HINT = "pip install 'ilargi-sklearn[plot]' (or pip install matplotlib)"


class Progress:
    """A minimal progress bar on a text stream (stderr by default).

    On a terminal the bar is redrawn in place; elsewhere (a log file, a pipe) one
    line is written when the step ends, so that logs stay readable.

    Parameters
    ----------
    total : int
        Number of units of work.
    label : str
        What is being done.
    stream : file-like, optional
        Where to draw; default ``sys.stderr`` at the time of the call.
    enabled : bool, default=True
        Draw nothing when False (``--quiet``).
    width : int, default=24
        Width of the bar in characters.
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool = True,
        width: int = 24,
    ) -> None:
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.width = width
        self.done = 0
        self.note = ""
        self._start = time.perf_counter()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._closed = False
        if self.enabled and self._tty:
            self._draw()

    def _line(self) -> str:
        filled = round(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self._start
        note = f" {self.note}" if self.note else ""
        return (
            f"{self.label:<34} [{bar}] {self.done}/{self.total} {elapsed:6.1f} s{note}"
        )

    def _draw(self) -> None:
        self.stream.write("\r" + self._line())
        self.stream.flush()

    def advance(self, n: int = 1, note: str = "") -> None:
        """Mark ``n`` more units done; ``note`` is shown after the bar."""
        self.done = min(self.done + n, self.total)
        self.note = note
        if self.enabled and self._tty:
            self._draw()

    def close(self) -> None:
        """Finish the bar (one line on non-terminals)."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        if self._tty:
            self._draw()
            self.stream.write("\n")
        else:
            self.stream.write(self._line() + "\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Console:
    """Where the command line writes: results on stdout, progress on stderr.

    Parameters
    ----------
    quiet : bool, default=False
        No progress bars and no narration; results and errors are still written.
    json : bool, default=False
        Machine-readable mode: nothing but the final JSON document goes to stdout
        (progress bars still go to stderr unless ``quiet``).
    stdout, stderr : file-like, optional
        Default ``sys.stdout`` and ``sys.stderr`` at the time of each write.
    """

    def __init__(
        self,
        *,
        quiet: bool = False,
        json: bool = False,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        self.quiet = quiet
        self.json = json
        self._stdout = stdout
        self._stderr = stderr

    @property
    def stdout(self) -> TextIO:
        return self._stdout if self._stdout is not None else sys.stdout

    @property
    def stderr(self) -> TextIO:
        return self._stderr if self._stderr is not None else sys.stderr

    def info(self, text: str = "") -> None:
        """Narration (what is happening): not under ``--quiet`` or ``--json``."""
        if not (self.quiet or self.json):
            self.stdout.write(text + "\n")

    def result(self, text: str = "") -> None:
        """Results: not under ``--json`` (where they go into the JSON document)."""
        if not self.json:
            self.stdout.write(text + "\n")

    def note(self, text: str) -> None:
        """A remark the user must see (a warning, a skipped step, a fallback): on
        stderr, also under ``--quiet``."""
        self.stderr.write(text + "\n")

    def notice(self, text: str) -> None:
        """Narration on stderr (what takes time, and why): not under ``--quiet``."""
        if not self.quiet:
            self.stderr.write(text + "\n")

    def progress(self, total: int, label: str) -> Progress:
        return Progress(total, label, stream=self.stderr, enabled=not self.quiet)

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[None]:
        """A one-unit progress bar around a block of work."""
        bar = self.progress(1, label)
        try:
            yield
            bar.advance()
        finally:
            bar.close()


def format_bytes(n: float | None) -> str:
    """``n`` bytes in decimal units (``"1.5 MB"``); ``"-"`` for None (unmeasured)."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A plain text table (left-aligned first column, right-aligned others)."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [
        max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)
    ]

    def fmt(values: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i == 0 else v.rjust(w)
            for i, (v, w) in enumerate(zip(values, widths))
        )

    lines = [fmt(columns), fmt(["-" * w for w in widths])]
    lines += [fmt(row) for row in cells]
    return "\n".join(lines)


#: What the command line says when the first numba kernel compiles.
COMPILE_NOTE = (
    "note: compiling numba kernels for this machine (once: a few seconds each; "
    "later runs load them from numba's cache)"
)


@contextlib.contextmanager
def compile_notes(console: Console) -> Iterator[None]:
    """Inside the block, say once (:meth:`Console.notice`) when a numba kernel
    starts compiling; nothing when every kernel loads from numba's cache."""
    from ilargi_sklearn._backend import _launcher

    said = threading.Lock()

    def note(name: str) -> None:
        if said.acquire(blocking=False):
            console.notice(COMPILE_NOTE)

    remove = _launcher.on_compile(note)
    try:
        yield
    finally:
        remove()


def plain(v: Any) -> Any:
    """A JSON-able value (NumPy scalars to Python, NaN and infinities to None)."""
    if isinstance(v, (np.integer, np.bool_, np.floating)):
        v = v.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    if isinstance(v, (tuple, list)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def emit_json(console: Console, doc: dict[str, Any]) -> None:
    """Write ``doc`` as the one JSON document of a ``--json`` run."""
    console.stdout.write(json.dumps(doc, indent=2, default=json_default) + "\n")


def json_default(o: Any) -> Any:
    """``json.dumps``'s ``default``: NumPy values and paths as plain values."""
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def import_pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (ImportError if absent)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
