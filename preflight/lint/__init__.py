"""``preflight lint``: the training script's silent DDP mistakes, found statically.

The file is parsed with :mod:`ast` and never imported or run. Public entry points:
:func:`lint_source` (bytes or text of one file), :func:`lint_paths` (files and directories) and
:data:`RULES`. Only the standard library and :mod:`preflight.core.textsafe` are used, so the
package also serves the flake8 plugin without torch or flake8 installed.
"""

from __future__ import annotations

import ast
import io
import os
import re
import stat
import tokenize
import unicodedata
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatch

from preflight.core.textsafe import escape
from preflight.lint.analysis import LintFinding, Module
from preflight.lint.checks import CHECKS, NEEDS, Check, checks_for
from preflight.lint.rules import RULES, RULES_BY_ID, Rule, Severity

#: Larger files are not parsed (a training script is a few hundred KiB at most; parsing
#: memory grows ~10x the file).
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
#: Directory names never entered (as flake8 skips them), unless a path names them itself.
DEFAULT_EXCLUDE = (".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "__pycache__",
                   "node_modules", ".eggs", "*.egg", "site-packages", ".mypy_cache",
                   ".ruff_cache", ".pytest_cache")

_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>[A-Z][0-9A-Z]*(?:[,\s]+[A-Z][0-9A-Z]*)*))?",
                   re.IGNORECASE)


class LintError(Exception):
    """The file could not be linted (unreadable, not Python, too large); ``reason`` is
    printable."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FileResult:
    """The findings of one file, or why it could not be linted (``error``)."""

    path: str
    findings: tuple[LintFinding, ...] = ()
    error: str | None = None


@dataclass
class Summary:
    files: int = 0
    results: list[FileResult] = field(default_factory=list)

    @property
    def findings(self) -> int:
        return sum(len(r.findings) for r in self.results)

    @property
    def skipped(self) -> list[FileResult]:
        return [r for r in self.results if r.error is not None]


def _decode(source: bytes) -> str:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError:
        encoding = "utf-8"
    try:
        return source.decode(encoding, errors="replace")
    except LookupError:
        return source.decode("utf-8", errors="replace")


def _parse(source: bytes | str, path: str) -> ast.Module:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for `"\d"` is not our business
            return ast.parse(source, filename=path)
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise LintError(f"not valid Python{where}: {escape(str(exc.msg), 120)}") from None
    except (ValueError, TypeError) as exc:  # null bytes, a bad coding cookie
        raise LintError(f"not valid Python: {escape(str(exc), 120)}") from None
    except (RecursionError, MemoryError):
        raise LintError("too deeply nested to parse") from None


def noqa_codes(line: str) -> frozenset[str] | None:
    """None when the line has no ``# noqa``; an empty set for a bare ``# noqa`` (everything);
    else the codes named (``# noqa: DDP101,DDP104``)."""
    match = _NOQA.search(line)
    if match is None:
        return None
    codes = match.group("codes")
    if not codes:
        return frozenset()
    return frozenset(c.upper() for c in re.split(r"[,\s]+", codes) if c)


def _suppressed(finding: LintFinding, lines: Sequence[str]) -> bool:
    if not 1 <= finding.line <= len(lines):
        return False
    codes = noqa_codes(lines[finding.line - 1])
    if codes is None:
        return False
    return not codes or any(finding.rule.startswith(code) for code in codes)


def analyse(tree: ast.Module, checks: Sequence[Check] = CHECKS) -> list[LintFinding]:
    """Every finding of the rules (``checks``, all by default) on a parsed module, sorted, one
    per rule and line."""
    if not checks:
        return []
    module = Module(tree)
    found: dict[tuple[str, int], LintFinding] = {}
    for check in checks:
        try:
            for finding in check(module):
                key = (finding.rule, finding.line)
                if key not in found or (finding.sure and not found[key].sure):
                    found[key] = finding
        except RecursionError:
            continue  # a pathological expression: that rule stays quiet on this file
    return sorted(found.values(), key=lambda f: (f.line, f.col, f.rule))


def gate_text(source: bytes | str) -> bytes | str:
    """The text the rules' words are looked for in: the source as Python reads identifiers.
    Plain ASCII without a coding cookie is used as it is (no copy); a cookie is honoured (a
    UTF-7 file spells ``environ`` in base64), and non-ASCII text is NFKC-normalized as the
    parser normalizes identifiers (``ｅｎｖｉｒｏｎ`` is ``environ``)."""
    if isinstance(source, bytes):
        first = source.find(b"\n")
        second = source.find(b"\n", first + 1) if first >= 0 else -1
        head = source if second < 0 else source[:second]
        if b"coding" not in head and source.isascii():
            return source
        source = _decode(source)
    if source.isascii():
        return source
    return unicodedata.normalize("NFKC", source)


def _findings(source: bytes | str, path: str, checks: Sequence[Check], sure_only: bool) \
        -> list[LintFinding]:
    tree = _parse(source, path)
    try:
        findings = analyse(tree, checks)
    except RecursionError:
        raise LintError("too deeply nested to analyse") from None
    if not findings:
        return []
    text = source if isinstance(source, str) else _decode(source)
    lines = text.splitlines()
    return [f for f in findings
            if not _suppressed(f, lines) and (f.sure or not sure_only)]


def lint_source(source: bytes | str, path: str = "<stdin>", *, sure_only: bool = False) \
        -> list[LintFinding]:
    """The findings in one file's contents. Raises :class:`LintError` when it is not Python
    (the file is always parsed; only the rules whose words it holds are run)."""
    return _findings(source, path, checks_for(gate_text(source)), sure_only)


def _excluded(name: str, exclude: Sequence[str]) -> bool:
    return any(fnmatch(name, pattern) for pattern in exclude)


def iter_python_files(paths: Iterable[str], *, exclude: Sequence[str] = DEFAULT_EXCLUDE) \
        -> Iterator[tuple[str, str | None]]:
    """(path, None) for each file to lint, (path, reason) for one that cannot be. Directories
    are walked without following symlinked directories, so a symlink loop is never entered;
    a path given on the command line is linted whatever its name ends with."""
    for top in paths:
        try:
            mode = os.stat(top).st_mode
        except OSError as exc:
            yield top, f"cannot read: {exc.strerror or exc}"
            continue
        if not stat.S_ISDIR(mode):
            yield top, (None if stat.S_ISREG(mode) else "is not a regular file")
            continue
        for root, dirs, files in os.walk(top, onerror=None):
            dirs[:] = sorted(d for d in dirs if not _excluded(d, exclude))
            for name in sorted(files):
                if name.endswith(".py") and not _excluded(name, exclude):
                    full = os.path.join(root, name)
                    if os.path.islink(full) and not os.path.exists(full):
                        yield full, "broken or looping symlink"
                    else:
                        yield full, None


def read_file(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The file's bytes, at most ``max_bytes``; :class:`LintError` otherwise."""
    try:
        with open(path, "rb") as stream:
            if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
                raise LintError("is not a regular file")
            data = stream.read(max_bytes + 1)
    except OSError as exc:
        raise LintError(f"cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise LintError(f"larger than {max_bytes:,} bytes (--max-bytes); not parsed")
    return data


def may_have_findings(source: bytes | str) -> bool:
    """False when no rule can fire: the file holds no word that any rule needs (``NEEDS`` in
    preflight/lint/checks.py). Such a file is not parsed by :func:`lint_file`, so a syntax
    error in it goes unreported, as it would by a grep."""
    return bool(checks_for(gate_text(source)))


def lint_file(path: str, *, max_bytes: int = DEFAULT_MAX_BYTES,
              sure_only: bool = False) -> FileResult:
    try:
        data = read_file(path, max_bytes=max_bytes)
    except LintError as exc:
        return FileResult(path, error=exc.reason)
    return lint_data(path, data, sure_only=sure_only)


def lint_data(path: str, data: bytes, *, sure_only: bool = False) -> FileResult:
    """:func:`lint_file` on bytes already read: a file no rule can match is not parsed."""
    checks = checks_for(gate_text(data))
    if not checks:
        return FileResult(path)
    try:
        return FileResult(path, tuple(_findings(data, path, checks, sure_only)))
    except LintError as exc:
        return FileResult(path, error=exc.reason)


def _lint_chunk(items: list[tuple[str, bytes]], sure_only: bool = False) -> list[FileResult]:
    return [lint_data(path, data, sure_only=sure_only) for path, data in items]


def _lint_chunk_sure(items: list[tuple[str, bytes]]) -> list[FileResult]:
    return _lint_chunk(items, sure_only=True)


def lint_paths(paths: Iterable[str], *, exclude: Sequence[str] = DEFAULT_EXCLUDE,
               max_bytes: int = DEFAULT_MAX_BYTES, sure_only: bool = False,
               jobs: int = 1) -> Summary:
    """Lint files and directories. With ``jobs`` > 1 the files that must be parsed are spread
    over that many worker processes (preflight/lint/jobs.py); the results are in the order the
    files were walked either way."""
    from preflight.lint.jobs import Dispatcher

    summary = Summary()
    slots: dict[int, FileResult] = {}

    def done(index: int, result: FileResult) -> None:
        if result.findings or result.error:
            slots[index] = result

    paths_by_index: dict[int, str] = {}

    def lost(index: int, reason: str) -> None:
        slots[index] = FileResult(paths_by_index[index], error=reason)

    dispatcher = Dispatcher(jobs, _lint_chunk_sure if sure_only else _lint_chunk, done, lost)
    try:
        for index, (path, problem) in enumerate(iter_python_files(paths, exclude=exclude)):
            summary.files += 1
            if problem is not None:
                slots[index] = FileResult(path, error=problem)
                continue
            try:
                data = read_file(path, max_bytes=max_bytes)
            except LintError as exc:
                slots[index] = FileResult(path, error=exc.reason)
                continue
            if not may_have_findings(data):
                continue
            if jobs > 1:
                paths_by_index[index] = path
            dispatcher.add(index, (path, data))
        dispatcher.finish()
    finally:
        dispatcher.close()
    summary.results = [slots[i] for i in sorted(slots)]
    return summary


__all__ = [
    "DEFAULT_EXCLUDE",
    "DEFAULT_MAX_BYTES",
    "NEEDS",
    "RULES",
    "RULES_BY_ID",
    "FileResult",
    "LintError",
    "LintFinding",
    "Rule",
    "Severity",
    "Summary",
    "analyse",
    "checks_for",
    "gate_text",
    "iter_python_files",
    "lint_data",
    "lint_file",
    "lint_paths",
    "lint_source",
    "may_have_findings",
    "noqa_codes",
    "read_file",
]
