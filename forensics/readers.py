"""Evidence file readers: present one JSON Lines, CSV or Parquet file to DuckDB as a relation.

A reader never decides a canonical column's type. It exposes, for each source column, an SQL
expression and the type that expression has as read (text for JSON Lines and CSV, the physical
type for Parquet); :mod:`forensics.ingest` casts those to the canonical types in one vectorised
query. Readers also give each row its provenance (``source_row``) and, for rows that turn out
bad, an SQL expression of the row's raw text.

Decompression (``.gz``, ``.zst``) and line splitting run in Arrow's C++ code in large blocks,
so Python never touches individual values; canonical JSON Lines files that DuckDB's JSON
reader reads exactly as the line reader does are left to it (:func:`json_lines_natively`).
A compressed JSON Lines or CSV file that turns out truncated or corrupt is salvaged
(:mod:`forensics.salvage`): every complete row before the damage loads, the row the damage
cut is rejected, and the source says what was lost.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forensics.errors import EvidenceError
from forensics.salvage import CompleteRecords, Damage, Salvage

if TYPE_CHECKING:
    import duckdb

# (done_bytes, total_bytes) of the file being read; the caller knows which file it is.
ByteProgress = Callable[[int, int], None]

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
FILE_TYPES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
_BLOCK = 16 << 20  # bytes of decompressed input handled per step
# DuckDB's file readers take a path as a glob pattern, with no escape: given `a[1].parquet`
# they read `a1.parquet`. A path holding one of these is never handed to them as it is.
GLOB_CHARACTERS = frozenset("*?[")


def globs(path: Path) -> bool:
    """Whether DuckDB would read ``path`` as a pattern rather than as the file.

    >>> globs(Path("logs/requests[1].parquet")), globs(Path("logs/requests-1.parquet"))
    (True, False)
    """
    return not GLOB_CHARACTERS.isdisjoint(str(path))


def sql_str(value: str) -> str:
    """An SQL string literal."""
    return "'" + str(value).replace("'", "''") + "'"


def sql_ident(name: str) -> str:
    """A quoted SQL identifier (column names such as ``at`` are reserved words in DuckDB)."""
    return '"' + name.replace('"', '""') + '"'


def detect_type(path: Path) -> tuple[str, str | None]:
    """The file type (jsonl, csv, parquet) and compression (gzip, zstd or None) of a path.

    >>> detect_type(Path("requests-01.jsonl.gz"))
    ('jsonl', 'gzip')
    """
    suffixes = [s.lower() for s in path.suffixes]
    compression = None
    if suffixes and suffixes[-1] in COMPRESSIONS:
        compression = COMPRESSIONS[suffixes.pop()]
    if not suffixes or suffixes[-1] not in FILE_TYPES:
        known = ", ".join(sorted(FILE_TYPES))
        raise EvidenceError(f"unknown file type (expected one of {known}, optionally .gz or .zst)")
    return FILE_TYPES[suffixes[-1]], compression


@dataclass
class Source:
    """One evidence file as a DuckDB relation plus the expressions ingest needs.

    Attributes:
        relation: SQL of a FROM item (a temp table or a table function call).
        columns: source column name -> (SQL expression, DuckDB type of that expression).
        row_expr: SQL of the 1-based source row (line for JSON Lines, data row otherwise).
        raw_expr: SQL of the row's raw text, evaluated only for rejected rows.
        pre_error: SQL giving a reason when a row is bad before any column is looked at
            (a JSON Lines line that does not parse), else NULL.
        extra_keys: SQL of the unknown columns as a JSON object, or None when there are none.
        early_rejects: rows rejected while parsing the file (CSV rows with the wrong number of
            fields) as (source_row, column, reason, raw).
        empty: the file holds no data at all (no header, no lines).
        problem: why only part of the file could be read (a damaged compressed file), saying
            which rows are lost; None when the whole file was read.
        rows_lost: how many rows that damage lost, None when unknown (a cut file does not
            say how much it held).
        rows: how many rows the relation holds when already known (counting would read the
            file again), else None.
        redo_for_rejects: the source has no raw text of its rows: a file in which any row is
            rejected must be read again by the line reader, which has it.
    """

    relation: str
    columns: dict[str, tuple[str, str]]
    row_expr: str
    raw_expr: str
    pre_error: str = "NULL"
    extra_keys: Callable[[set[str]], str | None] = lambda known: None
    early_rejects: list[tuple[int, str | None, str, str]] = field(default_factory=list)
    empty: bool = False
    problem: str | None = None
    rows_lost: int | None = None
    damage: Damage | None = None  # the damage behind ``problem``, when there is one
    rows: int | None = None
    redo_for_rejects: bool = False
    cleanup: list[str] = field(default_factory=list, repr=False)  # temp tables to drop
    temp_files: list[str] = field(default_factory=list, repr=False)

    def close(self, con: duckdb.DuckDBPyConnection) -> None:
        """Drop the temp tables and files behind this source."""
        for table in self.cleanup:
            con.execute(f"DROP TABLE IF EXISTS {table}")
        for name in self.temp_files:
            try:
                os.unlink(name)
                if os.path.basename(os.path.dirname(name)).startswith("kv-forensics-"):
                    os.rmdir(os.path.dirname(name))  # the folder of a link (see globs)
            except OSError:
                pass


def _stream(path: Path, compression: str | None) -> tuple[Any, Any]:
    """A decompressing Arrow input stream over ``path`` and the raw file (for progress)."""
    import pyarrow as pa

    raw = pa.OSFile(str(path), "rb")
    if compression is None:
        return raw, raw
    return pa.CompressedInputStream(raw, compression), raw


CUT_REASON = "line cut by the damage"


def _lost(damage: Damage, unit: str, complete: int) -> str:
    """The ``problem`` of a salvaged file: its damage and the last row that survived it.

    A cut file does not say how much more it held, hence "any rows after".
    """
    text = damage.describe()
    if damage.checksum:
        text += ", so the rows read before it may hold damaged values"
    if complete == 0:
        return f"{text}: no {unit} before the damage is complete, every row is lost"
    return f"{text}: any rows after {unit} {complete:,} are lost"


class _Decoded:
    """The decompressed blocks of a file: Arrow's fast path, and salvage after an error.

    Healthy files are decompressed once, by Arrow. When Arrow stops with an error, the file is
    decoded again by :class:`~forensics.salvage.Salvage` from where Arrow's last good block
    ended, so the bytes before the damage are kept; ``damage`` then says where it is.
    """

    def __init__(self, path: Path, compression: str | None, progress: ByteProgress | None):
        self.path, self.compression, self.progress = path, compression, progress
        self.damage: Damage | None = None

    def __iter__(self):
        import pyarrow as pa

        total = self.path.stat().st_size
        stream, raw = _stream(self.path, self.compression)
        done = 0
        try:
            while True:
                try:
                    block = stream.read(_BLOCK)
                except (OSError, pa.ArrowException) as exc:
                    if self.compression is None:
                        raise _decompress_error(self.path, None, exc) from None
                    break
                if not block:
                    return
                done += len(block)
                yield block
                if self.progress:
                    self.progress(raw.tell(), total)
        finally:
            stream.close()
        salvage = Salvage(self.path, self.compression, skip=done)
        try:
            for block in salvage:
                yield block
                if self.progress:
                    self.progress(salvage.tell(), total)
        except OSError as exc:
            raise EvidenceError(f"cannot read the file ({exc.strerror or exc})") from None
        self.damage = salvage.damage


def _decompress_error(path: Path, compression: str | None, exc: Exception) -> EvidenceError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if compression:
        return EvidenceError(f"truncated or corrupt {compression} data ({first})")
    return EvidenceError(f"cannot read the file ({first})")


def open_source(
    con: duckdb.DuckDBPyConnection,
    path: Path,
    tag: str,
    progress: ByteProgress | None = None,
) -> Source:
    """Read or attach one evidence file; ``tag`` makes temp table names unique.

    Raises:
        EvidenceError: unknown extension, unreadable or corrupt file, not JSON Lines at all.
    """
    file_type, compression = detect_type(path)
    if not path.is_file():
        raise EvidenceError("file not found")
    reader = {"jsonl": _open_jsonl, "csv": _open_csv, "parquet": _open_parquet}[file_type]
    return reader(con, path, compression, tag, progress)


# --- JSON Lines ---------------------------------------------------------------------------


def _open_jsonl(con, path: Path, compression, tag: str, progress) -> Source:
    source = open_lines(con, path, compression, tag, progress)
    if source.empty:
        return source
    return _json_lines(con, source)


def open_lines(con, path: Path, compression, tag: str, progress=None) -> Source:
    """The lines of a text file as a temp table ``(__kv_row, __kv_line)``, blank lines left out.

    Decompression, a byte-order mark, CRLF endings and a damaged compressed file are handled
    here, so every line-based format (JSON Lines, engine logs) gets them alike.
    """
    import numpy as np
    import pyarrow as pa

    table = f"__kv_lines_{tag}"
    con.execute(f"CREATE TEMP TABLE {table} (__kv_row BIGINT, __kv_line VARCHAR)")
    source = Source(relation=table, columns={}, row_expr="__kv_row", raw_expr="__kv_line")
    source.cleanup.append(table)
    decoded = _Decoded(path, compression, progress)
    line_no, first = 0, True

    def insert(data: bytes) -> None:
        nonlocal line_no, first
        if first:
            data, first = data.removeprefix(b"\xef\xbb\xbf"), False
        lines = _split_lines(data)
        batch = pa.table(
            {
                "__kv_row": np.arange(line_no + 1, line_no + len(lines) + 1, dtype=np.int64),
                "__kv_line": lines,
            }
        )
        line_no += len(lines)
        con.register(f"{table}_batch", batch)
        # Blank lines are not rows, but they keep their place in the line numbering. (A
        # regular expression and a suffix test are 30x faster than trim() over long lines.)
        con.execute(
            f"INSERT INTO {table} SELECT __kv_row, CASE WHEN suffix(__kv_line, chr(13)) "
            f"THEN rtrim(__kv_line, chr(13)) ELSE __kv_line END "
            f"FROM {table}_batch WHERE NOT regexp_full_match(__kv_line, '[ \\t\\r]*')"
        )
        con.unregister(f"{table}_batch")

    # The unfinished last line, in pieces: joined only once its end arrives, so a line that
    # spans many blocks (damaged data decoding to noise without newlines) costs linear time.
    pieces: list[bytes] = []
    for block in decoded:
        cut = block.rfind(b"\n")
        if cut < 0:
            pieces.append(block)
            continue
        insert(b"".join([*pieces, block[: cut + 1]]) if pieces else block[: cut + 1])
        pieces = [block[cut + 1 :]]
    tail = b"".join(pieces)
    damage = decoded.damage
    if damage is not None:
        # The last line stops where the data does: it is no row, but it was read, so it is
        # counted and kept (as a reject) rather than dropped.
        if tail.strip(b" \t\r"):
            raw_line = tail.decode("utf-8", errors="replace")
            if first:
                raw_line = raw_line.removeprefix("\ufeff")
            reason = f"{CUT_REASON}: {damage.describe()}"
            source.early_rejects.append((line_no + 1, None, reason, raw_line))
        source.problem, source.damage = _lost(damage, "line", line_no), damage
    elif tail:
        # An uncompressed file may end without a newline (or be cut mid-line): its last line
        # is read as it is, and rejected if it does not parse.
        insert(tail)

    if con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0:
        source.empty = True
    return source


def _split_lines(data: bytes):
    """The lines of ``data`` (a final newline ends the last line, it starts none) as an Arrow
    string array.

    Arrow splits and checks the bytes without making a Python string of each line; a block
    holding invalid UTF-8 is decoded by Python instead, which replaces the bad bytes rather
    than failing the file: the line still counts and usually still parses, and its raw text
    keeps the replacement characters.

    >>> _split_lines(b"a\\nb\\n").to_pylist()
    ['a', 'b']
    >>> _split_lines(b"caf\\xc3\\xa9\\n\\xff").to_pylist()
    ['café', '\ufffd']
    """
    import numpy as np
    import pyarrow as pa

    if data.endswith(b"\n"):
        data = data[:-1]
    # The newlines' positions give each line's length; the text without them is the values'
    # buffer (6x faster than Arrow's split_pattern, which builds a list per block).
    text = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(text == 10)
    bounds = np.concatenate([[-1], newlines, [len(text)]])
    offsets = np.concatenate([[0], np.cumsum(np.diff(bounds) - 1)]).astype(np.int64)
    values = pa.py_buffer(np.delete(text, newlines)) if len(newlines) else pa.py_buffer(data)
    lines = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), values]
    )
    try:
        return lines.cast(pa.large_string())
    except pa.ArrowInvalid:
        return pa.array(data.decode("utf-8", errors="replace").split("\n"), pa.large_string())


def _json_lines(con, source: Source) -> Source:
    table, damage = source.relation, source.damage
    # The objects' key lists, each once (a value that is no object has none): a file's lines
    # share a few of them, so the keys, and whether any object repeats a key, are known
    # without checking every line for them.
    shapes = [
        r[0]
        for r in con.execute(
            f"SELECT json_keys(__kv_line) AS k FROM {table} WHERE json_valid(__kv_line) GROUP BY k"
        ).fetchall()
    ]
    if not shapes:
        count = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        damaged = f"; {damage.describe()}" if damage else ""
        raise EvidenceError(
            f"not JSON Lines (none of its {count} lines is a JSON value; "
            f"the format needs one JSON object per line{damaged})"
        )
    keys = list(dict.fromkeys(k for shape in shapes for k in shape))
    repeats = any(len(set(shape)) < len(shape) for shape in shapes)
    source.pre_error = (
        "CASE WHEN NOT json_valid(__kv_line) THEN 'not valid JSON' "
        "WHEN json_type(__kv_line) <> 'OBJECT' THEN 'not a JSON object' "
        + (
            "WHEN len(json_keys(__kv_line)) <> len(list_distinct(json_keys(__kv_line))) "
            "THEN 'duplicate key in JSON object' "
            if repeats
            else ""
        )
        + "END"
    )
    if len({k.lower() for k in keys}) == len(keys):
        # Parse each line once into a struct of text values (3-4x faster than one extraction
        # per key). Strings come unquoted, integers keep every digit (a 63-bit bootstrap room
        # survives), JSON null is SQL NULL; a line that is not an object gets NULL and its
        # pre_error reason.
        import json

        spec = sql_str(json.dumps({k: "VARCHAR" for k in keys}))
        source.relation = (
            f"(SELECT *, try(json_transform(__kv_line, {spec})) AS __kv_obj FROM {table})"
        )
        for key in keys:
            source.columns[key] = (f"struct_extract(__kv_obj, {sql_str(key)})", "VARCHAR")
    else:
        # Keys differing only in case cannot share a struct (DuckDB struct fields are
        # case-insensitive): extract them one by one.
        for key in keys:
            path_sql = sql_str('$."' + key.replace('"', '\\"') + '"')
            source.columns[key] = (f"json_extract_string(__kv_line, {path_sql})", "VARCHAR")

    def extra(known: set[str]) -> str | None:
        if not set(keys) - known:
            return None
        names = "[" + ", ".join(sql_str(k) for k in sorted(known)) + "]"
        entries = (
            "list_filter(map_entries(json_transform(__kv_line, '\"MAP(VARCHAR, JSON)\"')), "
            f"lambda e: NOT list_contains({names}, e.key) AND e.value IS NOT NULL)"
        )
        return f"CASE WHEN len({entries}) > 0 THEN to_json(map_from_entries({entries})) END"

    source.extra_keys = extra
    return source


# --- JSON Lines read by DuckDB's own reader ---------------------------------------------


def count_lines(path: Path, compression: str | None) -> int | None:
    """The lines of a text file as the line reader numbers them, blank ones included, or None
    when the file does not decompress cleanly.

    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "a.jsonl").write_bytes(b'{"a": 1}\\n\\n{"a": 2}')
    >>> count_lines(folder / "a.jsonl", None)
    3
    """
    import pyarrow as pa

    lines, last = 0, b"\n"
    try:
        stream, _ = _stream(path, compression)
        try:
            while block := stream.read(_BLOCK):
                lines += block.count(b"\n")
                last = block[-1:]
        finally:
            stream.close()
    except (OSError, pa.ArrowException):
        return None
    # A last line without a newline is still a line (an empty tail is none).
    return lines + (last != b"\n")


@dataclass
class NativeJsonLines:
    """What :func:`json_lines_natively` made of some files."""

    sources: list[Source]  # one per file read, in order, its rows counted
    read: str  # every read file's rows in order, unnumbered: __kv_file_no (1-based), keys
    declined: list[int]  # positions of the files the line reader must read

    def numbered(self, table: str) -> str:
        """The rows of ``read`` copied, in order, to ``table``, each numbered by its line.

        Numbering them while reading (``row_number() OVER ()``) runs the whole read on one
        thread and costs twice the read; a table made from the read keeps its order (insertion
        order is kept, or the reader declines every file), so its row ids count the lines.
        """
        # Each file's rows follow the previous files' in the table.
        starts = [0]
        for source in self.sources[:-1]:
            starts.append(starts[-1] + (source.rows or 0))
        return (
            f"(SELECT *, rowid + 1 - list_extract({starts}::BIGINT[], __kv_file_no) "
            f"AS __kv_row FROM {table})"
        )


def json_lines_natively(
    con: duckdb.DuckDBPyConnection, paths: list[Path], compression: str | None, known: set[str]
) -> NativeJsonLines:
    """Canonical JSON Lines files parsed by DuckDB's JSON reader rather than line by line.

    DuckDB's reader decompresses and parses in C++ on every core, about three times faster than
    splitting lines in Python and parsing them in SQL, but it skips blank lines (so its row
    numbers would not be line numbers), takes one of two keys that differ only in case, reads a
    JSON ``null`` line as an empty row and keeps no raw text for a reject. So it reads only the
    files it reads exactly as the line reader does: every line a JSON object, no blank line
    (its objects are as many as the file's lines), no repeated key, only ``known`` keys, the
    same keys as the first such file. The others are declined, for the line reader, which
    handles them all; so are all of them when insertion order is not kept, on which the line
    numbers rely. Lines are counted and their shapes read in one pass of DuckDB's CSV reader
    cut at newlines alone; a file that pass refuses is counted apart and read as objects.

    Returns:
        The read files' sources (``rows`` counted, ``redo_for_rejects`` set), the SQL that
        reads their rows in order (:meth:`NativeJsonLines.numbered` numbers them), and the
        positions of the declined files.
    """
    import duckdb

    from forensics.sql import scalar

    everything = list(range(len(paths)))
    if not scalar(con, "SELECT current_setting('preserve_insertion_order')"):
        return NativeJsonLines([], "", everything)
    options = f"format = 'newline_delimited', compression = {sql_str(compression or 'none')}"

    def files_sql(chosen: list[Path]) -> str:
        return "[" + ", ".join(sql_str(str(p)) for p in chosen) + "]"

    def shapes_by_line(chosen: list[Path]) -> list[tuple]:
        # Every line as the line reader numbers them, blank ones included (as NULL), in one
        # pass: the text cut at each newline alone, with no quoting and a separator that no
        # valid JSON line holds raw. A carriage return anywhere fails the read (DuckDB's CSV
        # reader would otherwise end a line there, where the line reader does not). The keys
        # alone tell an object: anything else has none (so has ``{}``, a row the line reader
        # rejects anyway), and parsing every line once more for its type costs a fifth.
        return con.execute(
            f"SELECT filename, json_keys(line), count(*) "
            f"FROM read_csv({files_sql(chosen)}, columns = {{'line': 'VARCHAR'}}, "
            f"sep = '\\x01', quote = '', escape = '', header = false, new_line = '\\n', "
            f"auto_detect = false, compression = {sql_str(compression or 'none')}, "
            f"filename = true) GROUP BY ALL"
        ).fetchall()

    def shapes_by_object(path: Path) -> list[tuple]:
        # A file the line pass refuses (a carriage return, a line past its size, a byte-order
        # mark, ...): its objects as DuckDB's JSON reader finds them, and its lines counted
        # apart; lines that are not objects (blank ones among them) show as the difference.
        shapes = con.execute(
            f"SELECT filename, CASE WHEN json_type(json) = 'OBJECT' THEN json_keys(json) END, "
            f"count(*) FROM read_json_objects({files_sql([path])}, {options}, filename = true) "
            f"GROUP BY ALL"
        ).fetchall()
        counted = count_lines(path, compression)
        found = sum(row[2] for row in shapes)
        if counted is None or counted != found:
            shapes.append((str(path), None, abs((counted or 0) - found) or 1))
        return shapes

    try:
        shapes = shapes_by_line(paths)
    except duckdb.Error:
        # Malformed JSON, invalid UTF-8, damage or a line the pass refuses somewhere: each
        # file alone says which, and is read the other way.
        shapes = []
        for path in paths:
            try:
                shapes += shapes_by_line([path])
            except duckdb.Error:
                try:
                    shapes += shapes_by_object(path)
                except duckdb.Error:
                    shapes.append((str(path), None, 0))
    lines: dict[str, int] = {}  # every line, blank ones included
    key_sets: dict[str, set[str]] = {}
    odd: set[str] = set()
    for name, keys, count in shapes:
        # A blank line (NULL), no keys (not an object) or keys repeated or unknown.
        if not keys or len(set(keys)) < len(keys) or not set(keys) <= known:
            odd.add(name)
        lines[name] = lines.get(name, 0) + count
        key_sets.setdefault(name, set()).update(keys or [])
    chosen: list[int] = []
    for i, path in enumerate(paths):
        name = str(path)
        if name in odd or not lines.get(name):
            continue
        if chosen and key_sets[name] != key_sets[str(paths[chosen[0]])]:
            continue  # a column one file lacks takes the entry's default there, not here
        chosen.append(i)
    declined = [i for i in everything if i not in chosen]
    if not chosen:
        return NativeJsonLines([], "", declined)
    keys = sorted(key_sets[str(paths[chosen[0]])])
    spec = "{" + ", ".join(f"{sql_str(k)}: 'VARCHAR'" for k in keys) + "}"
    columns = {k: (sql_ident(k), "VARCHAR") for k in keys}
    read = [paths[i] for i in chosen]
    sources = [
        Source(
            relation=(
                f"(SELECT row_number() OVER () AS __kv_row, * FROM read_json("
                f"{sql_str(str(p))}, {options}, records = true, columns = {spec}))"
            ),
            columns=dict(columns),
            row_expr="__kv_row",
            raw_expr="NULL",
            rows=lines[str(p)],
            redo_for_rejects=True,
        )
        for p in read
    ]
    files = files_sql(read)
    relation = (
        f"SELECT list_position({files}, __kv_file) AS __kv_file_no, * EXCLUDE (__kv_file) "
        f"FROM read_json({files}, {options}, records = true, columns = {spec}, "
        f"filename = '__kv_file')"
    )
    return NativeJsonLines(sources, relation, declined)


# --- CSV ----------------------------------------------------------------------------------


@contextmanager
def _undecodable_rows(seen: list[Exception]) -> Iterator[None]:
    """Keep Arrow's report of a malformed row that is not UTF-8 off the screen.

    Arrow cannot hand such a row to the invalid-row handler: it prints the decoding error with
    a traceback ("Exception ignored in ...") and fails the read. The read still fails (one line
    naming the file); the error is kept in ``seen`` to say why.
    """
    previous = sys.unraisablehook

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, UnicodeDecodeError):
            seen.append(unraisable.exc_value)
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _open_csv(con, path: Path, compression, tag: str, progress) -> Source:
    seen: list[Exception] = []
    with _undecodable_rows(seen):
        try:
            return _open_csv_as_read(con, path, compression, tag, progress)
        except EvidenceError as exc:
            if seen and str(exc).startswith("not a readable CSV file"):
                raise EvidenceError("not valid UTF-8 text, so not a CSV file") from None
            raise


def _open_csv_as_read(con, path: Path, compression, tag: str, progress) -> Source:
    import pyarrow as pa

    try:
        return _read_csv(con, path, tag, progress, lambda: _stream(path, compression))
    except (OSError, pa.ArrowException) as exc:
        if compression is None:
            raise _csv_error(path, compression, exc) from None
    # Arrow stopped inside a compressed CSV file: damaged data, or a CSV problem. Read it again
    # through the salvage decoder, which keeps every complete record before any damage and
    # holds back the record the damage cut. (A healthy file never takes this second pass.)
    con.execute(f"DROP TABLE IF EXISTS __kv_csv_{tag}")
    opened: list[CompleteRecords] = []

    def salvaged() -> tuple[Any, Any]:
        records = CompleteRecords(Salvage(path, compression))
        opened.append(records)
        return pa.PythonFile(records, mode="r"), records

    try:
        return _read_csv(con, path, tag, progress, salvaged, opened)
    except (OSError, pa.ArrowException) as exc:
        damage = opened[-1].salvage.damage if opened else None
        raise _csv_error(path, compression, exc, damage) from None


def _read_csv(
    con,
    path: Path,
    tag: str,
    progress,
    opener: Callable[[], tuple[Any, Any]],
    salvaged: list[CompleteRecords] | None = None,
) -> Source:
    """Read a CSV file from the streams ``opener`` gives (the data, and what tells progress).

    ``salvaged`` lists the :class:`~forensics.salvage.CompleteRecords` streams ``opener`` made
    when the file is being salvaged; the last one says where the damage is and what it cut.
    Arrow's own errors are raised as they are, for the caller to tell damage from bad CSV.
    """
    import pyarrow as pa
    import pyarrow.csv as pacsv

    table = f"__kv_csv_{tag}"
    total = path.stat().st_size
    bad: list[tuple[int, int, int, str]] = []

    def on_invalid(row: Any) -> str:
        # row.number counts records from 1 with the header as record 1 (blank lines and
        # quoted newlines do not count), so the data row is number - 1.
        bad.append((row.number - 1, row.expected_columns, row.actual_columns, row.text))
        return "skip"

    def reader(names: list[str] | None):
        stream, raw = opener()
        block = _BLOCK if names is not None else 1 << 20
        convert = None
        if names is not None:
            # Every column as text: no type inference from a sample, ever.
            convert = pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            )
        parse = pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=on_invalid)
        # Single-threaded so invalid rows carry their record number.
        read = pacsv.ReadOptions(use_threads=False, block_size=block)
        return (
            pacsv.open_csv(stream, read_options=read, parse_options=parse, convert_options=convert),
            stream,
            raw,
        )

    try:
        probe, stream, _ = reader(None)
        try:
            header = probe.schema.names
        except UnicodeDecodeError:
            # Arrow hands the names over as they are; the values it checks itself.
            raise EvidenceError("the CSV header is not valid UTF-8 text") from None
        finally:
            stream.close()
    except (OSError, pa.ArrowException) as exc:
        message = str(exc)
        if "Empty CSV file" not in message:
            raise
        damage = salvaged[-1].salvage.damage if salvaged else None
        if damage is not None:
            raise EvidenceError(
                f"{damage.describe()}, before the end of the CSV header: no row can be read"
            ) from None
        return Source(
            relation="(SELECT 1 WHERE false)",
            columns={},
            row_expr="0",
            raw_expr="NULL",
            empty=True,
        )
    names = [h.strip().removeprefix("\ufeff").strip() for h in header]
    for name in names:
        if not name:
            raise EvidenceError("the CSV header has an empty column name")
        if names.count(name) > 1:
            raise EvidenceError(f"the CSV header names column {name!r} twice")
    bad.clear()

    cols_sql = ", ".join(f"{sql_ident(n)} VARCHAR" for n in names)
    con.execute(f"CREATE TEMP TABLE {table} (__kv_good BIGINT, {cols_sql})")
    source = Source(relation=table, columns={}, row_expr="__kv_good", raw_expr="NULL")
    source.cleanup.append(table)
    good = 0
    csv_reader, stream, raw = reader(header)
    try:
        for batch in csv_reader:
            arrays = [pa.array(range(good + 1, good + batch.num_rows + 1), pa.int64())]
            arrays += list(batch.columns)
            good += batch.num_rows
            con.register(f"{table}_batch", pa.Table.from_arrays(arrays, ["__kv_good", *names]))
            con.execute(f"INSERT INTO {table} SELECT * FROM {table}_batch")
            con.unregister(f"{table}_batch")
            if progress:
                progress(raw.tell(), total)
    finally:
        stream.close()

    for number, expected, actual, text in bad:
        reason = f"malformed CSV row: expected {expected} fields, found {actual}"
        source.early_rejects.append((number, None, reason, text))
    damage = salvaged[-1].salvage.damage if salvaged else None
    if salvaged and damage is not None:
        # Records are numbered among data rows, good and malformed alike; the record the
        # damage cut would have been the next one. It was read, so it is counted as a reject.
        complete = good + len(bad)
        cut = salvaged[-1].cut
        if cut.strip(b" \t\r\n"):
            raw_cut = cut.decode("utf-8", errors="replace")
            reason = f"{CUT_REASON}: {damage.describe()}"
            source.early_rejects.append((complete + 1, None, reason, raw_cut))
        source.problem = _lost(damage, "data row", complete)
    if bad:
        _number_good_rows(con, source, table, [b[0] for b in bad], tag)
    if good == 0 and not bad:
        source.empty = True
    _describe_columns(source, names)
    return source


def _number_good_rows(con, source: Source, table: str, bad_rows: list[int], tag: str) -> None:
    """Give each good row its data-row number in the file, skipped malformed rows counted."""
    # Good rows arrive in order with their position among good rows; a skipped bad row
    # shifts every later good row by one. k_j = b_j - j is how many good rows precede the
    # j-th bad row, so a good row g lies after every bad row with k_j < g.
    numbers = sorted(bad_rows)
    shift = f"__kv_shift_{tag}"
    # One statement over parallel lists: executemany costs about a millisecond a row.
    # Bad rows in a row share one k; the good row after them follows the last (max j):
    # the as-of join must see one row per k, or it may pick any of them.
    con.execute(
        f"CREATE TEMP TABLE {shift} AS SELECT k, max(j) AS j FROM "
        "(SELECT unnest(?::BIGINT[]) AS k, unnest(?::BIGINT[]) AS j) GROUP BY k",
        [[b - j for j, b in enumerate(numbers, start=1)], list(range(1, len(numbers) + 1))],
    )
    source.cleanup.append(shift)
    source.relation = (
        f"(SELECT t.*, t.__kv_good + coalesce(s.j, 0) AS __kv_datarow FROM {table} t "
        f"ASOF LEFT JOIN {shift} s ON t.__kv_good > s.k)"
    )
    source.row_expr = "__kv_datarow"


def _describe_columns(source: Source, names: list[str]) -> None:
    """The CSV's columns as text, how a rejected row's raw line is re-made, and how unknown
    columns go into ``extra``."""
    for name in names:
        source.columns[name] = (sql_ident(name), "VARCHAR")
    # The raw text of a rejected row, re-serialised as the CSV line it came from.
    quoted = [
        f"CASE WHEN regexp_matches({sql_ident(n)}, '[,\"\\r\\n]') "
        f"THEN '\"' || replace({sql_ident(n)}, '\"', '\"\"') || '\"' "
        f"ELSE {sql_ident(n)} END"
        for n in names
    ]
    source.raw_expr = "concat_ws(',', " + ", ".join(quoted) + ")"

    def extra(known: set[str]) -> str | None:
        unknown = [n for n in names if n not in known]
        if not unknown:
            return None
        entries = (
            "list_filter(["
            + ", ".join(
                f"struct_pack(k := {sql_str(n)}, v := to_json(NULLIF({sql_ident(n)}, '')))"
                for n in unknown
            )
            + "], lambda e: e.v IS NOT NULL)"
        )
        return f"CASE WHEN len({entries}) > 0 THEN to_json(map_from_entries({entries})) END"

    source.extra_keys = extra


def _csv_error(
    path: Path, compression, exc: Exception, damage: Damage | None = None
) -> EvidenceError:
    text = str(exc)
    if compression and ("compress" in text.lower() or "truncat" in text.lower()):
        return _decompress_error(path, compression, exc)
    also = f"; the file also has {damage.describe()}" if damage else ""
    if "UTF8" in text or "utf8" in text.lower():
        return EvidenceError(f"not valid UTF-8 text, so not a CSV file{also}")
    return EvidenceError(f"not a readable CSV file ({text.strip().splitlines()[0]}){also}")


# --- Parquet ------------------------------------------------------------------------------


def _open_parquet(con, path: Path, compression, tag: str, progress) -> Source:

    temp_files: list[str] = []
    target = path
    if compression:
        # Parquet needs random access, so a compressed Parquet file is inflated to disk first.
        fd, name = tempfile.mkstemp(suffix=".parquet", prefix="kv-forensics-")
        temp_files.append(name)
        decoded = _Decoded(path, compression, progress)
        try:
            with os.fdopen(fd, "wb") as out:
                for block in decoded:
                    out.write(block)
        except BaseException:
            os.unlink(name)
            raise
        if decoded.damage is not None:
            os.unlink(name)
            # Parquet keeps its row index at the end of the file: without it no row can be
            # found, so a damaged compressed Parquet file cannot be read in part.
            raise EvidenceError(
                f"{decoded.damage.describe()}: a Parquet file cannot be read without its end"
            )
        target = Path(name)
    elif globs(path):
        # Read through a link of a plain name (see GLOB_CHARACTERS).
        name = os.path.join(tempfile.mkdtemp(prefix="kv-forensics-"), "evidence.parquet")
        os.symlink(path.resolve(), name)
        temp_files.append(name)
        target = Path(name)
        if globs(target):
            raise EvidenceError(f"the temporary folder {target.parent} has *, ? or [ in its name")

    import duckdb

    relation = f"read_parquet({sql_str(str(target))}, file_row_number = true)"
    try:
        described = con.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()
    except duckdb.Error as exc:
        for name in temp_files:
            os.unlink(name)
        first = str(exc).strip().splitlines()[0]
        raise EvidenceError(f"not a readable Parquet file ({first})") from None
    source = Source(
        relation=relation,
        columns={},
        row_expr="file_row_number + 1",
        raw_expr="NULL",
        temp_files=temp_files,
    )
    names = [(r[0], r[1]) for r in described if r[0] != "file_row_number"]
    for name, dtype in names:
        source.columns[name] = (sql_ident(name), dtype)
    source.raw_expr = (
        (
            "to_json(struct_pack("
            + ", ".join(f"{sql_ident(n)} := {sql_ident(n)}" for n, _ in names)
            + "))"
        )
        if names
        else "NULL"
    )

    def extra(known: set[str]) -> str | None:
        unknown = [n for n, _ in names if n not in known]
        if not unknown:
            return None
        entries = (
            "list_filter(["
            + ", ".join(
                f"struct_pack(k := {sql_str(n)}, v := to_json({sql_ident(n)}))" for n in unknown
            )
            + "], lambda e: e.v IS NOT NULL)"
        )
        return f"CASE WHEN len({entries}) > 0 THEN to_json(map_from_entries({entries})) END"

    source.extra_keys = extra
    return source
