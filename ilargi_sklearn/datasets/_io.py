"""CSV and Parquet files read with a check of every CSV row's field count.

:func:`read_table` reads the needed columns of a CSV or Parquet file. pandas' C
parser does not check field counts under ``usecols=`` (a row with too many fields
is cut, and the columns of a file whose rows all have one field more than the header
are shifted against their names), and pads a row with too few fields with missing
values; so the CSV bytes pass through a counter of each row's fields on their way
to the parser, and a row whose count differs from the header's is an error that
names the file and the line. A Parquet file is read with pyarrow and converted as
:func:`ilargi_sklearn.multisource._interop.as_pandas` converts an Arrow table.
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import gzip
import io
import logging
import lzma
import tarfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import pandas as pd

from ilargi_sklearn.multisource import _interop
from ilargi_sklearn.multisource._interop import (
    MissingColumnsError,
    _arrow_to_pandas,
    _check_columns,
    _column_list,
)

__all__ = ["MalformedRowError", "MissingColumnsError", "read_table"]

logger = logging.getLogger(__name__)


class MalformedRowError(ValueError):
    """A CSV row with more or fewer fields than the header.

    Attributes
    ----------
    path : str
        The file.
    line : int
        The 1-based line of the file where the first such row starts.
    n_fields : int
        The fields of that row.
    expected : tuple of int
        The field counts a row may have: the header's (and one fewer when the
        header ends with a separator, whose unnamed last column rows may omit).
    n_bad : int
        The rows of the file with a wrong field count.
    """

    def __init__(
        self,
        path: str,
        line: int,
        n_fields: int,
        expected: tuple[int, ...],
        n_bad: int,
        sep: str,
    ) -> None:
        self.path = path
        self.line = line
        self.n_fields = n_fields
        self.expected = expected
        self.n_bad = n_bad
        header = f"the header has {expected[0]}"
        if len(expected) > 1:
            header += f" (its last, unnamed, may be left out: {expected[1]})"
        more = ""
        if n_bad > 1:
            more = f"; {n_bad - 1} more row{'s' if n_bad > 2 else ''} of the file too"
        super().__init__(
            f"malformed row in {path}: line {line} has {n_fields} "
            f"field{'s' if n_fields != 1 else ''}, {header}{more}. Fix the line (a "
            f"field that contains the separator {sep!r}, a quote or a line break "
            "must be quoted), or remove it."
        )


def read_table(
    path: str | Path,
    columns: Sequence[str] | None,
    *,
    fmt: Literal["csv", "parquet"] | None = None,
    sep: str = ",",
) -> pd.DataFrame:
    """Read the needed columns of a CSV or Parquet file, rejecting malformed rows.

    Parameters
    ----------
    path : str or path-like
        The file. A CSV file may be compressed (``.gz``, ``.bz2``, ``.xz``,
        ``.zip`` or ``.tar`` with one member, ``.zst`` where ``zstandard`` is
        installed).
    columns : list of str or None
        The columns to read; None reads all.
    fmt : {"csv", "parquet"}, optional
        The file's format; default ``"parquet"`` for a ``.parquet`` or ``.pq``
        suffix, ``"csv"`` otherwise.
    sep : str, default=","
        The field separator of a CSV file (one character).

    Returns
    -------
    pandas.DataFrame
        The columns in the file's order, with the dtypes that
        ``pandas.read_csv(path, sep=sep, usecols=columns)`` gives (CSV) or that
        :func:`as_pandas` gives for the Arrow table (Parquet).

    Raises
    ------
    MalformedRowError
        When a CSV row has more or fewer fields than the header (a ``ValueError``
        naming the file, the line, and both counts). Rows are counted with the C
        parser's quoting rules: a field that starts with a quote runs to its closing
        quote, across separators and line breaks. Blank lines are skipped. A header
        that ends with a separator names an empty last column, which rows may have
        or leave out.
    MissingColumnsError
        When ``columns`` names columns the file does not have (a ``ValueError``
        listing the file's columns).
    ValueError
        When the file is empty, cannot be parsed, or ``fmt`` or ``sep`` is invalid.
    ImportError
        For a Parquet file where pyarrow is not installed.

    See Also
    --------
    pandas.read_csv : The parser; ``usecols`` alone keeps malformed rows.

    Notes
    -----
    The field counter sees each block of bytes as the parser reads it, so the file
    is read once and only the requested columns are held. It keeps a block's
    separators, line breaks and quotes (``bytes.translate``), drops the marks
    between an opening and a closing quote, and takes the gaps between line breaks.
    A quote that does not start a field (``5" disk``) is plain text to the parser
    but would open a quoted field for the counter; when it meets one, the file is
    counted again after parsing with Python's ``csv`` module, which follows the
    parser's rule (slower; logged at INFO).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from ilargi_sklearn.datasets._io import read_table
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "planes.csv"
    >>> _ = path.write_text("tailnum,seats,engine\\nN10156,55,Turbo-fan\\nN102UW,182\\n")
    >>> try:
    ...     read_table(path, ["tailnum", "seats"])
    ... except ValueError as exc:
    ...     print(exc)  # doctest: +ELLIPSIS
    malformed row in ...planes.csv: line 3 has 2 fields, the header has 3. ...
    """
    path = Path(path)
    if fmt is None:
        suffixes = [s.lower() for s in path.suffixes]
        fmt = "parquet" if ".parquet" in suffixes or ".pq" in suffixes else "csv"
    columns = _column_list(columns)
    if fmt == "parquet":
        return _read_parquet(path, columns)
    if fmt != "csv":
        raise ValueError(f"fmt must be 'csv' or 'parquet', got {fmt!r}.")
    return _read_csv(path, columns, sep)


def _read_parquet(path: Path, columns: list[str] | None) -> pd.DataFrame:
    if _interop._pyarrow() is None:
        raise ImportError(
            f"reading the Parquet file {path} needs pyarrow: pip install pyarrow, or "
            "convert the file to CSV."
        )
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except pa.ArrowException as exc:
        raise ValueError(f"cannot read {path} as Parquet: {exc}") from exc
    names = file.schema_arrow.names
    if columns is not None:
        _check_columns(names, columns, str(path))
        wanted = set(columns)
        columns = [c for c in names if c in wanted]
    return _arrow_to_pandas(file.read(columns=columns))


def _read_csv(path: Path, columns: list[str] | None, sep: str) -> pd.DataFrame:
    if len(sep) != 1 or sep in '"\r\n\0':
        raise ValueError(
            "sep must be one character other than a quote, a line break or NUL, got "
            f"{sep!r}."
        )
    try:
        with _open_binary(path) as fh:
            header = list(pd.read_csv(fh, sep=sep, nrows=0).columns)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path} is empty: a CSV table needs a header line.") from None
    if columns is not None:
        _check_columns(header, columns, str(path))
    with _open_binary(path) as fh:
        counter = _FieldCounter(fh, sep)
        try:
            frame = pd.read_csv(counter, sep=sep, usecols=columns, engine="c")
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            counter.drain()
            counter.counts.raise_bad(path)
            raise ValueError(f"cannot read {path} as CSV: {exc}") from exc
        counter.drain()
    counts = counter.counts
    if counter.recount is not None:
        logger.info(
            "%s: %s; counting the fields of its rows again with Python's csv module.",
            path,
            counter.recount,
        )
        with _open_binary(path) as fh:
            counts = _count_fields_exactly(fh, sep)
    counts.raise_bad(path)
    return frame


@contextlib.contextmanager
def _open_binary(path: Path) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed by its suffix as ``pandas.read_csv`` infers."""
    name = path.name.lower()
    with contextlib.ExitStack() as stack:
        if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            tar = stack.enter_context(tarfile.open(path, "r:*"))
            members = [m for m in tar.getmembers() if m.isfile()]
            names = [m.name for m in members]
            fh = tar.extractfile(members[0]) if len(members) == 1 else None
        elif name.endswith(".zip"):
            archive = stack.enter_context(zipfile.ZipFile(path))
            members = [m for m in archive.infolist() if not m.is_dir()]
            names = [m.filename for m in members]
            fh = archive.open(members[0]) if len(members) == 1 else None
        elif name.endswith(".gz"):
            fh = gzip.open(path, "rb")
        elif name.endswith(".bz2"):
            fh = bz2.open(path, "rb")
        elif name.endswith(".xz"):
            fh = lzma.open(path, "rb")
        elif name.endswith(".zst"):
            try:
                import zstandard
            except ImportError:
                raise ImportError(
                    f"reading {path} needs zstandard: pip install zstandard, or "
                    "decompress the file."
                ) from None
            fh = zstandard.open(path, "rb")
        else:
            fh = open(path, "rb")
        if fh is None:
            raise ValueError(
                f"{path} must hold one file, it holds {len(names)}: {names}."
            )
        yield stack.enter_context(fh)


_WHITESPACE = b" \t\r\x0b\x0c"
_QUOTE = ord('"')
#: Bytes after which the counter gives up on finding the end of a row (a quote that
#: never closes would otherwise make it copy the rest of the file once per block).
_MAX_ROW_BYTES = 1 << 24
_CR_AS_LF = bytes.maketrans(b"\r", b"\n")


@dataclass
class _RowCounts:
    """Field counts of a CSV file's rows against its header's."""

    sep: str
    expected: tuple[int, ...] | None = None
    first_bad: tuple[int, int] | None = None
    n_bad: int = 0

    def set_header(self, n_fields: int, trailing_sep: bool) -> None:
        n = n_fields
        self.expected = (n, n - 1) if trailing_sep and n > 1 else (n,)

    def add_bad(self, line: int, n_fields: int, n_rows: int = 1) -> None:
        if self.first_bad is None:
            self.first_bad = (line, n_fields)
        self.n_bad += n_rows

    def raise_bad(self, path: Path) -> None:
        if self.first_bad is not None:
            assert self.expected is not None
            line, n_fields = self.first_bad
            raise MalformedRowError(
                str(path), line, n_fields, self.expected, self.n_bad, self.sep
            )


class _FieldCounter(io.RawIOBase):
    """A binary stream that counts each CSV row's fields as its reader pulls bytes.

    Each block read is appended to the bytes left over from the previous block (a
    row cut by the block's end) and counted up to its last line break outside
    quotes, which is where a row ends. Line breaks are those of the C parser: \\n,
    \\r\\n, and \\r alone. The header (the first non-blank row) fixes the expected
    count. ``recount`` says why the counts cannot be trusted (then
    :func:`_count_fields_exactly` counts again), None when they can.

    The counts come from ``bytes.translate``, which keeps only the separators and
    line breaks in one pass over the bytes: the gaps between the line breaks of
    what it keeps are the counts. Where the block has quotes, it keeps the quotes
    too, and the marks between an opening and a closing quote are dropped before
    the gaps are taken. This is faster than locating every separator of a block
    with NumPy, whose index array is eight times as large as the kept bytes.
    """

    def __init__(self, raw: IO[bytes], sep: str) -> None:
        super().__init__()
        self._raw = raw
        self._sep = ord(sep)
        # The bytes that are neither the separator nor a line break (nor a quote).
        marks = (self._sep, 10, 13)
        self._others = bytes(b for b in range(256) if b not in marks)
        self._others_quoted = self._others.replace(b'"', b"")
        self._rest = b""
        self._lines = 0  # line breaks before self._rest
        self._eof = False
        self.counts = _RowCounts(sep)
        self.recount: str | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = self._raw.readinto(view)
        if n:
            self._count(self._rest + view[:n])
        elif not self._eof:
            self._eof = True
            if self._rest:
                self._count(self._rest + b"\n")
            self._rest = b""
        return n

    def drain(self) -> None:
        """Count whatever the reader left unread (it stops early on an error)."""
        while not self._eof:
            self.read(1 << 20)

    def _count(self, buf: bytes) -> None:
        if self.recount is not None:
            return
        # A \r that ends the block may be the first half of a \r\n.
        end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        quotes = None
        if buf.find(b'"', 0, end) >= 0:
            quotes = np.flatnonzero(np.frombuffer(buf, np.uint8, count=end) == _QUOTE)
            if not self._regular(buf, quotes):
                return
        fields = self._field_counts(buf, end, quotes is not None)
        if fields.size == 0:
            self._keep(buf)
            return
        ends = None
        first = 0
        if self.counts.expected is None:
            ends = self._row_ends(buf, end, quotes)
            first = self._header(buf, ends, fields)
        expected = self.counts.expected
        if expected is not None:
            bad = fields[first:] != expected[0]
            if len(expected) > 1:
                bad &= fields[first:] != expected[1]
            if bad.any():
                ends = self._row_ends(buf, end, quotes) if ends is None else ends
                self._add_bad(buf, end, ends, fields, np.flatnonzero(bad) + first)
        last = self._last_row_end(buf, end, quotes) + 1
        if quotes is None:
            self._lines += fields.size  # every line break ends a row
        elif buf.find(b"\r", 0, last) < 0:
            a = np.frombuffer(buf, np.uint8, count=last)
            self._lines += int(np.count_nonzero(a == 10))
        else:
            self._lines += len(self._breaks(buf, last))
        self._rest = buf[last:]

    def _field_counts(self, buf: bytes, end: int, quoted: bool) -> np.ndarray:
        """The field count of each row that ends in ``buf[:end]``."""
        table = None
        if buf.find(b"\r", 0, end) >= 0:
            buf, table = buf[:end].replace(b"\r\n", b"\n"), _CR_AS_LF
        kept = buf.translate(table, self._others_quoted if quoted else self._others)
        if quoted:
            # Two quotes with no mark between them (an empty or mark-free quoted
            # field, a doubled quote) change no mark's side: dropping them first
            # leaves few quotes in most files.
            kept = kept.replace(b'""', b"")
        if quoted and kept.find(b'"') >= 0:
            k = np.frombuffer(kept, dtype=np.uint8)
            gaps = np.diff(np.flatnonzero(k == _QUOTE), prepend=0, append=k.size)
            outside = np.zeros(gaps.size, dtype=bool)
            outside[::2] = True
            kept = (k * np.repeat(outside, gaps)).tobytes().translate(None, b'\0"')
        rows = np.flatnonzero(np.frombuffer(kept, dtype=np.uint8) == 10)
        return np.diff(rows, prepend=-1)

    def _regular(self, buf: bytes, quotes: np.ndarray) -> bool:
        """Whether every quote that would open a field starts one (else recount).

        buf starts a row, outside quotes: the quotes at even positions in
        ``quotes`` open a field, or are the second of a doubled quote.
        """
        opening = quotes[::2]
        opening = opening[opening > 0]
        before = np.frombuffer(buf, dtype=np.uint8)[opening - 1]
        plain = (
            (before != self._sep) & (before != 10) & (before != 13) & (before != _QUOTE)
        )
        if plain.any():
            pos = int(opening[plain.argmax()])
            line = self._line_at(self._breaks(buf, len(buf)), pos)
            self.recount = f"line {line} has a quote inside a field"
        return self.recount is None

    @staticmethod
    def _breaks(buf: bytes, end: int) -> np.ndarray:
        """The positions of the line breaks in ``buf[:end]`` (the \\n of a \\r\\n)."""
        a = np.frombuffer(buf, dtype=np.uint8, count=end)
        breaks = a == 10
        cr = a == 13
        if cr.any():
            cr[:-1] &= ~breaks[1:]
            breaks |= cr
        return np.flatnonzero(breaks)

    def _row_ends(self, buf: bytes, end: int, quotes: np.ndarray | None) -> np.ndarray:
        """The positions of the line breaks in ``buf[:end]`` outside quotes."""
        breaks = self._breaks(buf, end)
        if quotes is None:
            return breaks
        return breaks[np.searchsorted(quotes, breaks) % 2 == 0]

    @staticmethod
    def _last_row_end(buf: bytes, end: int, quotes: np.ndarray | None) -> int:
        pos = end
        while True:
            i = max(buf.rfind(b"\n", 0, pos), buf.rfind(b"\r", 0, pos))
            k = 0 if quotes is None else int(np.searchsorted(quotes, i))
            if k % 2 == 0:
                return i
            pos = int(quotes[k - 1])  # the quote that opens the field holding i

    def _add_bad(
        self,
        buf: bytes,
        end: int,
        ends: np.ndarray,
        fields: np.ndarray,
        rows: np.ndarray,
    ) -> None:
        # A row without separators may be a blank line, which the parser skips.
        bad = [
            r
            for r in rows.tolist()
            if fields[r] > 1 or self._row(buf, ends, r).strip(_WHITESPACE)
        ]
        if bad:
            start = 0 if bad[0] == 0 else int(ends[bad[0] - 1]) + 1
            line = self._line_at(self._breaks(buf, end), start)
            self.counts.add_bad(line, int(fields[bad[0]]), len(bad))

    def _keep(self, buf: bytes) -> None:
        """Keep a row cut by the block's end, up to :data:`_MAX_ROW_BYTES`."""
        if len(buf) > _MAX_ROW_BYTES:
            self.recount = f"line {self._lines + 1} starts a row of over 16 MiB"
        self._rest = buf

    def _header(self, buf: bytes, ends: np.ndarray, fields: np.ndarray) -> int:
        """Take the first non-blank row as the header; return the row after it."""
        for r in range(len(fields)):
            row = self._row(buf, ends, r).rstrip(b"\r")
            if fields[r] > 1 or row.strip(_WHITESPACE):
                self.counts.set_header(int(fields[r]), row.endswith(bytes([self._sep])))
                return r + 1
        return len(fields)

    @staticmethod
    def _row(buf: bytes, ends: np.ndarray, r: int) -> bytes:
        return buf[0 if r == 0 else int(ends[r - 1]) + 1 : int(ends[r])]

    def _line_at(self, breaks: np.ndarray, pos: int) -> int:
        """The 1-based line of the file at position ``pos`` of the block."""
        return self._lines + int(np.searchsorted(breaks, pos)) + 1


def _count_fields_exactly(fh: IO[bytes], sep: str) -> _RowCounts:
    """Count every row's fields with Python's csv module (quotes as the C parser)."""
    counts = _RowCounts(sep)
    text = io.TextIOWrapper(fh, encoding="utf-8", errors="replace", newline="")
    reader = csv.reader(text, delimiter=sep, quotechar='"', doublequote=True)
    line = 1  # where the next row starts
    try:
        for row in reader:
            start, line = line, reader.line_num + 1
            # A blank line reads as [] or a field of whitespace; a quoted empty
            # field reads as [""] and is a row.
            if not row or (len(row) == 1 and row[0] and not row[0].strip(" \t\v\f")):
                continue
            if counts.expected is None:
                counts.set_header(len(row), row[-1] == "")
            elif len(row) not in counts.expected:
                counts.add_bad(start, len(row))
    except csv.Error as exc:
        logger.info("could not count the fields of every row (%s); not checked.", exc)
    finally:
        text.detach()  # the caller closes fh
    return counts
