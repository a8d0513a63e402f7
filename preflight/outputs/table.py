"""The human table: one line per check, the remedy under it.

Messages quote the job's environment, which can hold anything: every text is passed through
:func:`~preflight.core.textsafe.escape`, so an escape sequence or a newline in a variable shows as
``\\e`` / ``\\n`` instead of acting on the terminal."""

from __future__ import annotations

import shutil
import textwrap

from preflight.core.result import Report, Status
from preflight.core.textsafe import escape

_COLOURS = {
    Status.PASS: "\033[32m",
    Status.SKIP: "\033[2m",
    Status.WARN: "\033[33m",
    Status.ERROR: "\033[35m",
    Status.FAIL: "\033[31m",
}
_RESET = "\033[0m"


def render(report: Report, *, colour: bool = False, width: int | None = None) -> str:
    """A fixed-column table; long messages wrap under the message column."""
    width = width or shutil.get_terminal_size((100, 24)).columns
    name_w = max([len("CHECK"), *(len(escape(r.check)) for r in report.results)])
    head = f"{'STATUS':<6}  {'CHECK':<{name_w}}  MESSAGE"
    indent = " " * (6 + 2 + name_w + 2)
    wrap_w = max(30, width - len(indent))
    lines = [head]
    for r in report.results:
        word = r.status.name
        shown = f"{_COLOURS[r.status]}{word:<6}{_RESET}" if colour else f"{word:<6}"
        msg = textwrap.wrap(escape(r.message), wrap_w) or [""]
        lines.append(f"{shown}  {escape(r.check):<{name_w}}  {msg[0]}")
        lines.extend(indent + m for m in msg[1:])
        if r.remedy and r.status >= Status.WARN:
            fix = textwrap.wrap(escape(r.remedy), wrap_w - 5) or [""]
            lines.append(f"{indent}fix: {fix[0]}")
            lines.extend(indent + "     " + f for f in fix[1:])
    status = report.status
    verdict = f"{status.name}" if not colour else f"{_COLOURS[status]}{status.name}{_RESET}"
    counts = ", ".join(
        f"{sum(1 for r in report.results if r.status is s)} {s.word}"
        for s in Status if any(r.status is s for r in report.results))
    lines.append(f"\n{escape(report.host)}: {verdict} ({counts})")
    return "\n".join(lines)
