"""Line matching: which rule a log line, a traceback frame or NCCL's ``Last error:`` detail names.

Pure functions over decoded text; the regexes are the rules' (rules.py), searched in the head of
the line only (``ranks.MAX_MATCH_CHARS``) so a megabyte-long line costs no more than a short one.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

from preflight.explain.blocks import RE2
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


#: Python's own regex parser (``re._parser`` since 3.11, ``sre_parse`` before): read once at
#: import, to find the text each pattern cannot match without.
_parser: Any = importlib.import_module("re._parser" if sys.version_info >= (3, 11)
                                       else "sre_parse")
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
#: Shorter literals are found in too many lines to be worth a check of their own.
_MIN_NEED = 3


def _requirements(items: Any) -> list[tuple[str, ...]]:
    """What a match of the parsed sequence ``items`` must contain: each entry is a set of
    literals of which one at least is in the matched text (one literal: that text itself).
    Only what holds for every match is listed: an optional part, a case-insensitive group,
    a character class end a literal; alternatives count only when each of them has one."""
    found: list[tuple[str, ...]] = []
    run: list[str] = []

    def end() -> None:
        if len(run) >= _MIN_NEED:
            found.append(("".join(run),))
        run.clear()

    for op, av in items:
        name = str(op)
        if name == "LITERAL":
            run.append(chr(av))
            continue
        end()
        if name == "SUBPATTERN":
            if not av[1] & re.IGNORECASE:
                found += _requirements(av[3])
        elif name in _REPEATS:
            if av[0] >= 1:
                found += _requirements(av[2])
        elif name == "ATOMIC_GROUP":
            found += _requirements(av)
        elif name == "BRANCH":
            best = [_best(_requirements(alt)) for alt in av[1]]
            if all(b is not None for b in best):
                found.append(tuple(x for b in best if b is not None for x in b))
    end()
    return found


def _best(found: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    """The requirement that rules out most lines: the longest shortest literal, fewest parts."""
    return max(found, key=lambda r: (min(map(len, r)), -len(r)), default=None)


def required_text(regex: re.Pattern[str]) -> tuple[str, ...] | None:
    """Literals of which a match of ``regex`` must contain one, or None when nothing is
    certain (a case-insensitive pattern, or no literal every match holds)."""
    if regex.flags & re.IGNORECASE:
        return None
    try:
        return _best(_requirements(_parser.parse(regex.pattern, regex.flags & ~re.UNICODE)))
    except Exception:  # a parser of another shape (another Python): search every line
        return None


def _index() -> tuple[tuple[tuple[Rule, Pattern], ...], tuple[tuple[str, tuple[int, ...]], ...],
                      tuple[int, ...]]:
    """Every rule's patterns in ``RULES`` order; each literal some pattern cannot match without,
    with the positions of those patterns; the positions of the patterns searched on every
    line (nothing certain)."""
    flat = tuple((rule, pat) for rule in RULES for pat in rule.patterns)
    by_literal: dict[str, list[int]] = {}
    always: list[int] = []
    for i, (_, pat) in enumerate(flat):
        need = required_text(pat.regex)
        if need is None:
            always.append(i)
        for lit in need or ():
            by_literal.setdefault(lit, []).append(i)
    return flat, tuple((lit, tuple(ix)) for lit, ix in by_literal.items()), tuple(always)


#: Most of a log's candidate lines hit no rule. A line is searched only with the patterns whose
#: literal it holds (one ``in`` test per literal, a fraction of a search) and the few with
#: none; ``match_line_every`` is the plain loop the tests hold this one to.
_FLAT, _LITERALS, _ALWAYS = _index()


def _literal_set() -> Any:
    """With google-re2, one RE2 set of every literal: the ones a line holds in one pass over
    it, not one ``in`` test each (281 of them, most of a candidate line's time)."""
    if RE2 is None:
        return None
    options = RE2.Options()
    options.max_mem = 64 << 20  # the set's DFA is built as lines need it; never short of room
    found = RE2.Set.SearchSet(options)
    for k, (lit, _) in enumerate(_LITERALS):
        if found.Add(re.escape(lit)) != k:
            return None
    found.Compile()
    return found


_SET = _literal_set()


def _held(head: str) -> list[tuple[int, ...]]:
    """The pattern positions of every literal ``head`` holds."""
    if _SET is not None:
        try:
            return [_LITERALS[k][1] for k in sorted(_SET.Match(head) or ())]
        except (UnicodeError, ValueError):  # a lone surrogate: RE2 reads UTF-8 only
            pass
    return [ix for lit, ix in _LITERALS if lit in head]


def match_line(text: str) -> tuple[Rule, Pattern, re.Match[str]] | None:
    """The first rule (in ``RULES`` order, origins first) whose pattern matches ``text``."""
    head = text[:MAX_MATCH_CHARS]
    held = _held(head)
    order = sorted(set(_ALWAYS).union(*held)) if held else _ALWAYS
    for i in order:
        rule, pat = _FLAT[i]
        m = pat.regex.search(head)
        if m:
            return rule, pat, m
    return None


def match_line_every(text: str) -> tuple[Rule, Pattern, re.Match[str]] | None:
    """``match_line`` without the literal pre-check: every pattern searched (the reference the
    tests hold ``match_line`` to)."""
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


def child_frame(call: tuple[str, str, str]) -> bool:
    """True for the frame a process multiprocessing started runs under: ``_bootstrap`` in
    multiprocessing's ``process.py``, or a DataLoader worker's ``_worker_loop``."""
    file, function, _ = call
    file = file.replace("\\", "/")
    return ((function == "_bootstrap" and file.endswith("multiprocessing/process.py"))
            or (function == "_worker_loop" and file.endswith("data/_utils/worker.py")))


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


#: What launchers and log collectors put before each line of a rank's output, up to two of
#: them: PyTorch's ``[rank3]:`` / torchrun's ``[default0]:``, Open MPI's ``[1,0]<stderr>:``,
#: Ray's ``(RayTrainWorker pid=1234)``, kubectl's ``--timestamps``, pdsh's (DeepSpeed's
#: multi-node launcher) ``worker-0:`` and srun's ``--label`` ``0:`` (a word that is not an
#: exception's class), docker compose's ``node-1 |``.
_LINE_PREFIX = (r"(?:\[[^\]\n]{1,40}\]:\s{0,2}"
                r"|\[\d{1,5},\d{1,5}\]<std(?:out|err)>:\s{0,2}"
                r"|\([\w.-]{1,40} pid=\d{1,10}(?:, ip=[\w.:]{3,45})?\)\s{1,2}"
                r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?Z?\s{1,2}"
                r"|(?![\w.]{0,240}(?:Error|Exception|Warning):)[\w.-]{1,64}:\s{1,2}"
                r"|[\w.-]{1,64}\s{1,20}\|\s{1,2}"
                r"){0,2}")
#: The last line of a Python traceback: ``ValueError: ...``, ``pkg.mod.SomeError: ...``.
_EXCEPTION_LINE = re.compile(r"^\s{0,8}" + _LINE_PREFIX
                             + r"(?P<cls>[A-Za-z_][\w.]{0,240}Error)"
                             r"(?:: (?P<msg>[^\n]{1,300})|\s{0,4}$)")
#: Exceptions that, raised from the job's own file, are the job's own: Python's, not a library's
#: (a library's errors raised through the job's line, such as CUDA's, have rules of their own).
#: A package that is not installed is the environment's, and no business of a
#: distributed-training triage; an import of a part the installed package lacks is the job's
#: code (``_API_IMPORT``).
JOB_EXCEPTIONS = frozenset({
    "ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "AssertionError",
    "ZeroDivisionError", "NotImplementedError", "RuntimeError", "OSError",
    "RecursionError", "LookupError", "PermissionError",
})
#: Paths of installed code, not the job's.
_INSTALLED = ("site-packages", "dist-packages", "/lib/python", "\\lib\\", "<frozen", "/torch/",
              "/usr/lib/", "<string>")


#: Subclasses of the classes above that Python and common libraries raise, each with the
#: class it is taken as: a decode error of the job's input is a ValueError (json's, the codecs',
#: tomllib's), a parse error of its YAML config (PyYAML's, not Python's) or a pickle that cannot
#: be read (a file of another kind, a truncated checkpoint) is the input's too.
EXCEPTION_BASES: dict[str, str] = {
    "JSONDecodeError": "ValueError", "UnicodeDecodeError": "ValueError",
    "UnicodeEncodeError": "ValueError", "UnicodeError": "ValueError",
    "TOMLDecodeError": "ValueError", "UnpicklingError": "ValueError",
    "ScannerError": "ValueError", "ParserError": "ValueError", "ComposerError": "ValueError",
    "ConstructorError": "ValueError",
}
#: An import of a part the installed package lacks: ``No module named 'torch._six'`` (Python
#: names the first part of a dotted name it could not find, so the package was found and its
#: submodule was not) or ``cannot import name 'X' from 'pkg'``. Raised in the job's own file,
#: the job's code was written for another version of the package. A bare ``No module named
#: 'x'`` (a package not installed) is not one, nor ``...; 'x' is not a package`` (a module of
#: that name shadows the package: another install, or a file beside the script).
_API_IMPORT = re.compile(r"No module named '\w{1,80}\.[\w.]{1,160}'\s{0,4}$"
                         r"|cannot import name '\w{1,80}' from '[\w.]{1,160}'")
_IMPORTS = frozenset({"ModuleNotFoundError", "ImportError"})


def job_exception(exc: tuple[str, str], frame_file: str) -> tuple[str, str] | None:
    """``exc`` (a traceback's exception line, parsed by :func:`exception`) when it is a
    Python exception and the frame above it is in the job's own file, else None."""
    if installed_code(frame_file):
        return None
    cls = _taken_as(exc[0])
    if cls in JOB_EXCEPTIONS or (cls in _IMPORTS and _API_IMPORT.match(exc[1])):
        return exc
    return None


#: Exceptions a library raises when the job hands it something it cannot take (a key its
#: table lacks, a value out of range, an argument of the wrong type or shape): raised in
#: installed code under a frame of the job's own file, the job's call is where to look.
#: RuntimeError and OSError are not among them: from installed code they are as often the
#: node's or the library's (CUDA, NCCL, the file system).
PASSED_EXCEPTIONS = frozenset({"KeyError", "ValueError", "TypeError", "AssertionError",
                               "IndexError"})


def passed_exception(exc: tuple[str, str]) -> tuple[str, str] | None:
    """``exc`` when its class is one of ``PASSED_EXCEPTIONS`` (or is taken as one), else None."""
    return exc if _taken_as(exc[0]) in PASSED_EXCEPTIONS else None


#: Installed code that only the model's own code calls: torch's layers, their functional forms
#: and its optimizers (``torch/nn/modules/batchnorm.py``'s input check, ``torch/nn/functional.py``,
#: ``torch/optim/``). One of ``PASSED_EXCEPTIONS`` raised there is what the model handed them
#: (an input of the wrong shape, an empty parameter list), even when the traceback was cut
#: above the job's own frame; torch's collectives and its CUDA calls raise RuntimeError.
_MODEL_CODE = re.compile(r"[/\\]torch[/\\](?:nn|optim)[/\\]")


def model_code(frame_file: str) -> bool:
    """True for a frame's file among torch's layers and optimizers (``_MODEL_CODE``)."""
    return _MODEL_CODE.search(frame_file) is not None


def _taken_as(cls: str) -> str:
    """The class an exception counts as: its base in ``EXCEPTION_BASES``, else itself."""
    return EXCEPTION_BASES.get(cls, cls)


def exception(text: str) -> tuple[str, str] | None:
    """``(class without its module, message)`` of a traceback's exception line, else None."""
    if "Error" not in text:  # every class the pattern takes ends in it: skip the search
        return None
    m = _EXCEPTION_LINE.search(text, 0, MAX_MATCH_CHARS)
    if m is None:
        return None
    return m.group("cls").rsplit(".", 1)[-1], m.group("msg") or ""


def continued(text: str) -> bool:
    """True for a traceback's exception line whose message goes on on the next line (it ends
    with a colon: ``ImportError: ... cannot be used due to the following error:``)."""
    exc = exception(text)
    return exc is not None and exc[1].rstrip().endswith(":")


#: Launchers' exceptions that only report another process's failure: never the first error.
WRAPPER_EXCEPTIONS = frozenset({"ChildFailedError", "CalledProcessError"})
#: A line that says "error" in a program's own words: argparse's ``prog: error: ...``,
#: ``Error: ...``, ``ERROR: ...`` at the start or after a prefix; or a shell's own complaint
#: about its script (bash's ``./run.sh: line 6: --name: command not found``).
_ERROR_SAID = re.compile(r"(?:^|[\s\]:])(?:error|Error|ERROR):\s{0,4}\S"
                         r"|^\S{1,300}: line \d{1,7}: \S")
#: torchrun's own report of a worker's exit (``ERROR:torch.distributed.elastic...: failed
#: (exitcode: 1) local_rank: 0``): another process's failure, like ``ChildFailedError``.
_WRAPPER_SAID = re.compile(r"failed \(exitcode: -?\d{1,4}\) local_rank: ")
#: c10's warning prefix (``[W socket.cpp:663] ...``, ``[rank0]:[W1203 10:00:00.0 ...]``): a
#: warning that quotes an error (``gai error: -3``) is not where a failure starts.
_C10_WARNING = re.compile(r"^(?:\[rank\d{1,7}\]:)?\[W[\d ]")


def exception_line(text: str) -> str | None:
    """The class of a traceback's exception line (any exception a launcher does not raise
    for another process's failure), else None."""
    exc = exception(text)
    return None if exc is None or exc[0] in WRAPPER_EXCEPTIONS else exc[0]


def says_error(text: str) -> bool:
    """True for a line that reports an error in words (``error: ...``), not a traceback's."""
    if "rror:" not in text and "RROR:" not in text and ": line " not in text:
        return False  # none of _ERROR_SAID's literals: skip the search
    return (_ERROR_SAID.search(text, 0, MAX_MATCH_CHARS) is not None
            and _WRAPPER_SAID.search(text, 0, MAX_MATCH_CHARS) is None
            and _C10_WARNING.match(text) is None)


def file_name(path: str) -> str:
    """The last part of a traceback frame's file, a POSIX or a Windows path."""
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def installed_code(frame_file: str) -> bool:
    """True for a traceback frame's file that is installed code (a library, Python, torch)."""
    return any(part in frame_file for part in _INSTALLED)
