"""How the commands write to the terminal.

Almost everything a command prints comes from evidence someone else shaped: file names,
tenant ids, rejected values, engine error messages. A forensic tool must print them exactly, so
no string is ever read as console markup (``[red]12`` stays ``[red]12``) or as an emoji code,
and a control character (a newline, a terminal escape sequence) is shown escaped, never obeyed;
styles are given to :class:`rich.text.Text` spans, never written inline.

Prose is printed as whole lines in a pipe or a log, so grep and copy see each message whole;
on a terminal it wraps between words. Tables take the width of the terminal (or ``COLUMNS``);
a table that cannot fit without cutting a value prints each row as one line instead. Progress
shows only on a terminal.

Rich is imported inside the functions: ``forensics --help`` must stay instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import Console
    from rich.text import Text

# Between two table columns.
_GAP = 2


def clean(text: str) -> str:
    r"""Text as one printable line: control and invisible characters (a newline, an escape
    sequence that would recolour or move the terminal, a zero-width space) are shown escaped.

    >>> print(clean("acct\x1b[2J\nx\u200b"))
    acct\x1b[2J\nx\u200b
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def make_console(*, stderr: bool = False, **options: Any) -> Console:
    """A console that prints strings literally (no markup, no emoji codes, no highlighting,
    control characters escaped: see :func:`clean`).

    On a terminal prose wraps between words at its width; anywhere else (a pipe, a file, a
    log) a line of prose is never broken (soft wrap). ``options`` go to rich's Console (tests
    give a file, a width, a forced terminal).
    """
    from rich.console import Console

    class LiteralConsole(Console):
        def render_str(self, text: str, **kwargs: Any) -> Text:
            return super().render_str(clean(text), **kwargs)

    console = LiteralConsole(stderr=stderr, markup=False, emoji=False, highlight=False, **options)
    console.soft_wrap = not console.is_terminal
    return console


def styled(*parts: str | tuple[str, str] | Text) -> Text:
    """One line from literal parts: a string, a (string, style) pair or a Text.

    >>> styled(("warning: ", "yellow"), "[red]12").plain
    'warning: [red]12'
    """
    from rich.text import Text

    return Text.assemble(
        *(
            clean(p) if isinstance(p, str) else (clean(p[0]), p[1]) if isinstance(p, tuple) else p
            for p in parts
        )
    )


def plural(count: int, word: str, many: str | None = None) -> str:
    """``count`` and the noun in the right number.

    >>> plural(1, "pattern"), plural(1234, "file"), plural(2, "is", "are")
    ('1 pattern', '1,234 files', '2 are')
    """
    return f"{count:,} {word if count == 1 else (many or word + 's')}"


def warning_lines(warnings: list[str], codes: list[str], per_code: int = 3) -> list[str]:
    """The warnings to print, at most ``per_code`` of one kind (a warning per decode rank can
    run to hundreds), the rest of that kind counted in one line; ``codes`` gives each
    warning's kind (empty: every warning printed). The report lists every one.

    >>> for line in warning_lines(["r0 drift", "r1 drift", "r2 drift", "no node"],
    ...                           ["drift", "drift", "drift", "node"], per_code=2):
    ...     print(line)
    r0 drift
    r1 drift
    ... and 1 more drift warning (every one: report.md, Methodology)
    no node
    """
    if len(codes) != len(warnings):
        return list(warnings)
    total: dict[str, int] = {}
    for code in codes:
        total[code] = total.get(code, 0) + 1
    lines, shown = [], dict.fromkeys(total, 0)
    for warning, code in zip(warnings, codes, strict=True):
        shown[code] += 1
        if shown[code] <= per_code:
            lines.append(warning)
        if shown[code] == total[code] and total[code] > per_code:
            more = plural(total[code] - per_code, f"more {code} warning")
            lines.append(f"... and {more} (every one: report.md, Methodology)")
    return lines


def counted_parts(*parts: tuple[int, str]) -> str:
    """The texts whose count is not zero, joined by "and".

    >>> counted_parts((2, "2 before"), (0, "0 after")), counted_parts((1, "a"), (3, "b"))
    ('2 before', 'a and b')
    """
    return " and ".join(text for count, text in parts if count)


def utc(value: datetime | None) -> str:
    """An instant as RFC 3339 in UTC, to the microsecond the evidence gives; "not logged" when
    there is none.

    >>> from datetime import timedelta, timezone
    >>> utc(datetime(2026, 9, 8, 16, 2, 0, 250000, tzinfo=timezone(timedelta(hours=2))))
    '2026-09-08T14:02:00.250000Z'
    """
    if value is None:
        return "not logged"
    return value.astimezone(UTC).isoformat().removesuffix("+00:00") + "Z"


def shown(path: Path) -> str:
    """A path as short as it can be and still be used from here: relative to the current
    folder when it lies inside it, else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


@dataclass(frozen=True)
class Col:
    """A column of a :class:`Grid`.

    ``wrap`` columns (prose, timestamps) may break between words when the terminal is narrow;
    the others never break, so a path, a digest or a count is always whole.
    """

    name: str
    right: bool = False
    wrap: bool = False


class Grid:
    """A table that fits the console width without cutting a value, else one line per row
    (``first cell: column value, column value, ...``).

    On a terminal, ``wrap`` columns may break between words to fit. Anywhere else nothing
    wraps: a pipe or a log gets the table at its natural width when it fits, else the rows as
    lines, so every value stays on one line for grep.
    """

    def __init__(self, title: str, columns: Sequence[Col]):
        self.title = title
        self.columns = list(columns)
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: str | Text) -> None:
        from rich.text import Text

        self.rows.append([c if isinstance(c, Text) else Text(clean(c)) for c in cells])

    def widths(self, width: int, wrap: bool = True) -> list[int] | None:
        """Column widths that fit ``width`` with every value whole (and, unless ``wrap``, on
        one line), or None when none do."""
        natural, least = [], []
        for i, col in enumerate(self.columns):
            cells = [row[i].plain for row in self.rows] + [col.name]
            natural.append(max(_cell_len(line) for c in cells for line in c.splitlines() or [""]))
            if col.wrap and wrap:
                least.append(max((_cell_len(w) for c in cells for w in c.split()), default=1))
            else:
                least.append(natural[-1])
        room = width - _GAP * (len(self.columns) - 1)
        if sum(least) > room:
            return None
        widths = list(natural)
        while sum(widths) > room:
            # Narrow the widest column that may still wrap, one cell at a time.
            i = max(
                (i for i in range(len(widths)) if widths[i] > least[i]),
                key=lambda i: widths[i],
            )
            widths[i] -= 1
        return widths

    def print(self, console: Console) -> None:
        from rich.table import Table

        if self.title:
            console.print(styled((self.title, "bold")))
        widths = self.widths(console.width, wrap=console.is_terminal)
        if widths is None:
            for row in self.rows:
                console.print(self.record(row))
            return
        table = Table(box=None, padding=(0, 1), pad_edge=False, header_style="bold")
        for col, width in zip(self.columns, widths, strict=True):
            table.add_column(
                col.name,
                justify="right" if col.right else "left",
                no_wrap=not col.wrap,
                overflow="fold",
                width=width,
            )
        for row in self.rows:
            table.add_row(*row)
        console.print(table, soft_wrap=False)

    def record(self, row: list[Text]) -> Text:
        """One row as one line: its first cell, then each other column's name and value."""
        parts: list[Any] = [row[0], ": "]
        for i, (col, cell) in enumerate(zip(self.columns[1:], row[1:], strict=True)):
            parts += [", " if i else "", f"{col.name} ", cell]
        return styled(*parts)


def _cell_len(text: str) -> int:
    from rich.cells import cell_len

    return cell_len(text)


class Steps:
    """What a long command is doing, on one transient line of the terminal: a spinner, the
    step running now, how far it is (file N of M and bytes while loading, step N of M after),
    and the time since the command started. Off a terminal it does nothing: a log or a pipe
    gets only the command's result lines.

    Its methods are the library's progress callbacks: :meth:`file` for ingest
    (label, bytes done, bytes in all), :meth:`step` for detection, attribution and the report
    (what runs now, steps done, steps in all).
    """

    def __init__(self, console: Console, files: int = 0):
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TextColumn("{task.fields[count]}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self.files = files
        self.seen: dict[str, int] = {}
        self.task: Any = None

    def __enter__(self) -> Steps:
        self.progress.__enter__()
        self.task = self.progress.add_task("Starting", total=None, count="")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.__exit__(kind, value, tb)

    def file(self, label: str, done: int, total: int) -> None:
        """Ingest progress: file N of M (M when known) and its bytes."""
        from rich.filesize import decimal

        number = self.seen.setdefault(label, len(self.seen) + 1)
        of = f" of {max(self.files, number):,}" if self.files else ""
        self.progress.update(
            self.task,
            description=f"Loading file {number:,}{of}: {Path(label).name}",
            completed=done,
            total=total or None,
            count=f"{decimal(done)}/{decimal(total)}",
        )

    def step(self, what: str, done: int, total: int) -> None:
        """Stage progress: what runs now and, when there are several steps, which one."""
        self.progress.update(
            self.task,
            description=what,
            completed=done,
            total=total or None,
            count=f"{done + 1:,}/{total:,}" if total > 1 else "",
        )
