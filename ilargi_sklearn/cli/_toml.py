"""Reading a TOML spec, and locating a key of it in the file for error messages.

A :class:`SpecError` names the file, the key and the line, so that every problem
with a spec points at what to edit; :func:`find_line` finds the line of a key from
the source text, since :mod:`tomllib` keeps no positions.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class SpecError(Exception):
    """A problem with a fit spec, located in the spec file.

    Parameters
    ----------
    message : str
        What is wrong and how to fix it.
    path : str or path-like, optional
        The spec file.
    key : tuple, optional
        Where in the spec: ``("tables", "planes", "path")``, ``("joins", 2, "on")``
        (join numbers count from 1, as a reader of the file counts them).
    line : int, optional
        Line in the spec file (from the TOML parser, or found from ``key``).
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike | None = None,
        key: tuple[Any, ...] = (),
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)
        self.key = tuple(key)
        self.line = line

    @property
    def location(self) -> str:
        where = self.path or "<spec>"
        if self.line is not None:
            where += f":{self.line}"
        if self.key:
            where += f": {format_key(self.key)}"
        return where

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


def format_key(key: Sequence[Any]) -> str:
    out = ""
    for part in key:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEYLINE = re.compile(
    r"^\s*((?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)


def _split_dotted(text: str) -> list[str]:
    parts = re.findall(r"\"[^\"]*\"|'[^']*'|[A-Za-z0-9_\-]+", text)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


def find_line(text: str, key: Sequence[Any]) -> int | None:
    """Line (1-based) of ``key`` in TOML source ``text``, best effort.

    Array-of-tables entries are numbered from 1 in ``key`` (``("joins", 2,
    "on")``). Returns the line of the deepest part of ``key`` that can be found
    (the table header when the key itself is not written out), or None.
    """
    key = [str(k) if not isinstance(k, int) else k for k in key]
    best: tuple[int, int] | None = None  # (depth matched, line)
    header: list[Any] = []
    counts: dict[tuple[Any, ...], int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _HEADER.match(line)
        if m and not _KEYLINE.match(line):
            names = _split_dotted(m.group(2))
            if m.group(1) == "[[":
                counts[tuple(names)] = counts.get(tuple(names), 0) + 1
                header = [*names, counts[tuple(names)]]
            else:
                header = list(names)
            full = header
        else:
            km = _KEYLINE.match(line)
            if not km:
                continue
            full = header + _split_dotted(km.group(1))
        depth = 0
        for a, b in zip(full, key):
            if a != b:
                break
            depth += 1
        if depth == len(full) and depth > 0 and (best is None or depth > best[0]):
            best = (depth, lineno)
            if depth == len(key):
                break
    return None if best is None else best[1]


def _duplicate_key(text: str, line: int) -> str | None:
    """Name the key that line ``line`` repeats, with its section and first line."""
    lines = text.splitlines()
    km = _KEYLINE.match(lines[line - 1]) if line <= len(lines) else None
    if km is None:
        return None
    key = _split_dotted(km.group(1))
    section, start = "the top level", 0
    for no in range(line - 1, 0, -1):
        hm = _HEADER.match(lines[no - 1])
        if hm and not _KEYLINE.match(lines[no - 1]):
            section, start = lines[no - 1].split("#")[0].strip(), no
            if hm.group(1) == "[[":
                count = sum(
                    1
                    for x in lines[:no]
                    if (h := _HEADER.match(x)) and h.group(2) == hm.group(2)
                )
                section += f" (entry {count})"
            break
    first = next(
        (
            no
            for no in range(start + 1, line)
            if (k := _KEYLINE.match(lines[no - 1])) and _split_dotted(k.group(1)) == key
        ),
        None,
    )
    where = f" (first at line {first})" if first else ""
    return f"key {'.'.join(key)!r} is given twice in {section}{where}; keep one of them"


def read_toml(path: str | os.PathLike) -> tuple[dict[str, Any], str]:
    """The parsed document and the source text of the TOML file ``path``.

    Raises
    ------
    SpecError
        The file is missing or is not valid TOML (with the line of the problem).
    """
    path = Path(path)
    if not path.is_file():
        raise SpecError("spec file not found.", path=path)
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        line = getattr(exc, "lineno", None)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            line = line or int(m.group(1))
            msg = msg[: m.start()].strip()
        if msg == "Cannot overwrite a value" and line is not None:
            msg = _duplicate_key(text, line) or msg
        raise SpecError(f"TOML syntax error: {msg}", path=path, line=line) from None
    return data, text
