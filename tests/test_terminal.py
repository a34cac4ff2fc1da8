"""The terminal pieces the commands print with: progress on a terminal only, tables that
never cut a value, prose that stays one line off a terminal, evidence never read as markup."""

from __future__ import annotations

import io


def _console(terminal: bool, width: int = 100):
    """The console a command makes, writing to a buffer as a terminal would (or not)."""
    from forensics.terminal import make_console

    return make_console(file=io.StringIO(), force_terminal=terminal, width=width, color_system=None)


def test_steps_show_file_n_of_m_then_each_step_on_a_terminal_only():
    from forensics.terminal import Steps

    shown = _console(terminal=True)
    with Steps(shown, files=3) as steps:
        steps.file("evidence/a.jsonl", 0, 2000)
        steps.file("evidence/b.jsonl", 1000, 2000)
        steps.progress.refresh()
        steps.step("Detector over_pool", 1, 4)
        steps.progress.refresh()
    out = shown.file.getvalue()
    assert "Loading file 2 of 3: b.jsonl" in out and "1.0 kB/2.0 kB" in out
    assert "Detector over_pool" in out and "2/4" in out

    hidden = _console(terminal=False)
    with Steps(hidden, files=3) as steps:
        steps.file("evidence/a.jsonl", 0, 2000)
        steps.step("Detector over_pool", 1, 4)
    assert hidden.file.getvalue() == ""


def _grid():
    from forensics.terminal import Col, Grid

    grid = Grid(
        "Evidence",
        [Col("path"), Col("rows", right=True), Col("first (UTC)", wrap=True)],
    )
    grid.add_row("evidence/requests-2026-09-08.jsonl.gz", "1,479", "2026-09-08 00:00:08Z")
    grid.add_row("[red]tenants.csv", "122", "-")
    return grid


def test_a_grid_prints_a_table_that_fits():
    console = _console(terminal=False, width=80)
    _grid().print(console)
    lines = console.file.getvalue().splitlines()
    assert lines[0] == "Evidence"
    assert lines[1].split() == ["path", "rows", "first", "(UTC)"]
    assert lines[2].split() == [
        "evidence/requests-2026-09-08.jsonl.gz",
        "1,479",
        "2026-09-08",
        "00:00:08Z",
    ]
    assert lines[3].split() == ["[red]tenants.csv", "122", "-"]


def test_a_narrow_terminal_wraps_between_words_and_never_cuts_a_value():
    console = _console(terminal=True, width=58)
    _grid().print(console)
    lines = console.file.getvalue().splitlines()
    assert all(len(line.rstrip()) <= 58 for line in lines)
    row = next(i for i, line in enumerate(lines) if line.startswith("evidence/"))
    assert lines[row].split() == ["evidence/requests-2026-09-08.jsonl.gz", "1,479", "2026-09-08"]
    assert lines[row + 1].split() == ["00:00:08Z"]


def test_too_narrow_each_row_is_one_line_which_only_a_terminal_wraps():
    piped = _console(terminal=False, width=55)
    _grid().print(piped)
    records = [
        "evidence/requests-2026-09-08.jsonl.gz: rows 1,479, first (UTC) 2026-09-08 00:00:08Z",
        "[red]tenants.csv: rows 122, first (UTC) -",
    ]
    assert piped.file.getvalue().splitlines() == ["Evidence", *records]
    terminal = _console(terminal=True, width=40)
    _grid().print(terminal)
    lines = terminal.file.getvalue().splitlines()
    assert all(len(line.rstrip()) <= 40 for line in lines)
    assert " ".join(" ".join(lines).split()) == " ".join(["Evidence", *records])


def test_prose_is_one_line_off_a_terminal_and_evidence_is_never_markup(monkeypatch):
    from forensics.terminal import make_console, styled

    monkeypatch.setenv("COLUMNS", "40")
    console = make_console()
    assert not console.is_terminal and console.soft_wrap
    with console.capture() as captured:
        console.print("no file matches this pattern ([[evidence]] #1, kind requests), [/] :joy:")
        console.print(styled(("warning: ", "yellow"), "[red]12 \x1b[2J"))
    assert captured.get().splitlines() == [
        "no file matches this pattern ([[evidence]] #1, kind requests), [/] :joy:",
        "warning: [red]12 \\x1b[2J",
    ]


def test_warnings_of_one_kind_past_three_are_counted_in_one_line():
    from forensics.terminal import warning_lines

    ranks = [f"d0 rank {r}: drifted" for r in range(5)]
    lines = warning_lines([*ranks, "no node"], ["replay_drift"] * 5 + ["no_decode_node"])
    assert lines == [
        *ranks[:3],
        "... and 2 more replay_drift warnings (every one: report.md, Methodology)",
        "no node",
    ]
    # Three of a kind, or no kinds given: every warning, as it is.
    assert warning_lines(ranks[:3], ["replay_drift"] * 3) == ranks[:3]
    assert warning_lines(ranks, []) == ranks
