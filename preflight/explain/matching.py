"""Line matching: which rule a log line, a traceback frame or NCCL's ``Last error:`` detail names.

Pure functions over decoded text; the regexes are the rules' (rules.py), searched in the head of
the line only (``ranks.MAX_MATCH_CHARS``) so a megabyte-long line costs no more than a short one.
"""

from __future__ import annotations

import re

from preflight.explain.ranks import MAX_MATCH_CHARS
from preflight.explain.rules import RULES, Frame, Pattern, Rule
from preflight.explain.ruletypes import COLLECTIVE_FUNCTIONS, RENDEZVOUS_FUNCTIONS

#: ``  File "/x/rendezvous.py", line 246, in _env_rendezvous_handler`` (Python's traceback).
FRAME_LINE = re.compile(r'File "(?P<file>[^"\n]{1,500})", line (?P<no>\d{1,7}), in '
                        r"(?P<func>[\w<>.]{1,200})")
#: What NCCL prints after ``Last error:`` on the same line, when it does.
_LAST_ERROR = re.compile(r"Last error:\s{0,8}(?P<detail>\S[^\n]{0,2000})")

#: Function name -> the rules and frames that recognise it (built once from RULES).
FRAMES: dict[str, tuple[tuple[Rule, Frame], ...]] = {}
for _rule in RULES:
    for _frame in _rule.frames:
        FRAMES[_frame.function] = (*FRAMES.get(_frame.function, ()), (_rule, _frame))


def match_line(text: str) -> tuple[Rule, Pattern, re.Match[str]] | None:
    """The first rule (in ``RULES`` order, origins first) whose pattern matches ``text``."""
    head = text[:MAX_MATCH_CHARS]
    for rule in RULES:
        for pat in rule.patterns:
            m = pat.regex.search(head)
            if m:
                return rule, pat, m
    return None


def frame_call(text: str) -> tuple[str, str, str] | None:
    """``(file, function, line number)`` of a traceback frame line, else None."""
    if '", line ' not in text:
        return None
    m = FRAME_LINE.search(text, 0, MAX_MATCH_CHARS)
    return None if m is None else (m.group("file"), m.group("func"), m.group("no"))


def collective_frame(call: tuple[str, str, str]) -> bool | None:
    """True for a frame inside one of torch.distributed's collectives, False for one of its
    rendezvous or init (which a traceback of the ranks meeting runs through), None for any
    other frame."""
    file, function, _ = call
    if "distributed" not in file:
        return None
    if function in COLLECTIVE_FUNCTIONS:
        return True
    if function in RENDEZVOUS_FUNCTIONS:
        return False
    return None


def match_frame(function: str, source: str) -> tuple[Rule, Frame, re.Match[str]] | None:
    """The rule whose frame of ``function`` matches the frame's source line."""
    head = source[:MAX_MATCH_CHARS]
    for rule, frame in FRAMES.get(function, ()):
        m = frame.source.search(head)
        if m:
            return rule, frame, m
    return None


def last_error_detail(text: str) -> str | None:
    """The text NCCL printed after ``Last error:`` on the same line, if any."""
    if "Last error:" not in text:
        return None
    m = _LAST_ERROR.search(text, 0, MAX_MATCH_CHARS)
    return m.group("detail") if m else None


#: The last line of a Python traceback: ``ValueError: ...``, ``pkg.mod.SomeError: ...``.
_EXCEPTION_LINE = re.compile(r"^\s{0,8}(?:\[[^\]\n]{1,40}\]:\s{0,2})?"
                             r"(?P<cls>[A-Za-z_][\w.]{0,240}Error)"
                             r"(?:: (?P<msg>[^\n]{1,300})|\s{0,4}$)")
#: Exceptions that, raised from the job's own file, are the job's own: Python's, not a library's
#: (a library's errors raised through the job's line, such as CUDA's, have rules of their own).
#: An import that fails is the environment's, and no business of a distributed-training triage.
JOB_EXCEPTIONS = frozenset({
    "ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "AssertionError",
    "ZeroDivisionError", "NotImplementedError", "RuntimeError", "OSError",
    "RecursionError", "LookupError", "PermissionError",
})
#: Paths of installed code, not the job's.
_INSTALLED = ("site-packages", "dist-packages", "/lib/python", "\\lib\\", "<frozen", "/torch/",
              "/usr/lib/", "<string>")


def job_exception(text: str, frame_file: str) -> tuple[str, str] | None:
    """``(class, message)`` when ``text`` is a traceback's exception line of a Python
    exception and the frame above it is in the job's own file, else None."""
    if installed_code(frame_file):
        return None
    m = _EXCEPTION_LINE.search(text, 0, MAX_MATCH_CHARS)
    if m is None:
        return None
    cls = m.group("cls").rsplit(".", 1)[-1]
    return (cls, m.group("msg") or "") if cls in JOB_EXCEPTIONS else None


#: Launchers' exceptions that only report another process's failure: never the first error.
WRAPPER_EXCEPTIONS = frozenset({"ChildFailedError", "CalledProcessError"})
#: A line that says "error" in a program's own words: argparse's ``prog: error: ...``,
#: ``Error: ...``, ``ERROR: ...`` at the start or after a prefix.
_ERROR_SAID = re.compile(r"(?:^|[\s\]:])(?:error|Error|ERROR):\s{0,4}\S")


def exception_line(text: str) -> str | None:
    """The class of a traceback's exception line (any exception a launcher does not raise
    for another process's failure), else None."""
    m = _EXCEPTION_LINE.search(text, 0, MAX_MATCH_CHARS)
    if m is None:
        return None
    cls = m.group("cls").rsplit(".", 1)[-1]
    return None if cls in WRAPPER_EXCEPTIONS else cls


def says_error(text: str) -> bool:
    """True for a line that reports an error in words (``error: ...``), not a traceback's."""
    return _ERROR_SAID.search(text, 0, MAX_MATCH_CHARS) is not None


def installed_code(frame_file: str) -> bool:
    """True for a traceback frame's file that is installed code (a library, Python, torch)."""
    return any(part in frame_file for part in _INSTALLED)

