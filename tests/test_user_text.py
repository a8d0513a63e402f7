"""What a user reads names no issue number, no document they do not have, no unfinished work: the
README, docs/ (the raw logs of docs/device-runs/ aside), every command's --help, and the
docstrings of the package (what ``help()`` and an IDE show)."""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from preflight.cli import build_parser

REPO = Path(__file__).resolve().parents[1]

#: An issue of this project: "issue 14", "issue #11", "(#11 point 3)". An upstream reference
#: names its repository ("nccl-tests#212, #290", "NVIDIA/nccl#1664") and is removed first.
_UPSTREAM = re.compile(r"[\w./-]+#\d+(?:,\s*#\d+)*")
_ISSUE = re.compile(r"\bissues?\s+#?\d+|(?<![\w&])#\d+\b", re.IGNORECASE)
#: Documents, places and words of the project's making that a user does not have.
_INTERNAL = re.compile(
    r"(?-i:ARCHITECTURE\.md|STYLE\.md|STYLE habit)|measured\.md|peers\.md|style-anchors\.md|"
    r"shared/(design|reference|seed)|lent machine|being built|once it lands|"
    r"until it is on main|this session", re.IGNORECASE)
#: Files another change in flight rewrites; each goes when that change lands.
PENDING = {
}


def problems(text: str) -> list[str]:
    """The banned phrases in ``text``."""
    found = [m.group(0) for m in _ISSUE.finditer(_UPSTREAM.sub("", text))]
    return found + [m.group(0) for m in _INTERNAL.finditer(text)]


def _docs() -> Iterator[Path]:
    yield REPO / "README.md"
    for path in sorted((REPO / "docs").rglob("*.md")):
        if "device-runs" not in path.relative_to(REPO / "docs").parts:
            yield path


def _docstrings(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc


def _helps() -> Iterator[tuple[str, str]]:
    parser = build_parser()
    yield "preflight --help", parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"preflight {name} --help", sub.format_help()


def test_the_banned_phrases_are_caught() -> None:
    """The patterns themselves, on the kind of text they must catch and must let pass."""
    assert problems("fixed in issue 14") == ["issue 14"]
    assert problems("a job fault (#11 point 3)") == ["#11"]
    assert problems("see ARCHITECTURE.md and STYLE habit 3") == ["ARCHITECTURE.md", "STYLE habit"]
    assert problems("a torch-free engine is being built") == ["being built"]
    assert problems("ring, <= 4 GPUs (nccl-tests#212, #290); NVIDIA/nccl#1664, CMT#15") == []
    assert problems("&#123; and a public GitHub issue thread") == []


@pytest.mark.parametrize("path", list(_docs()), ids=lambda p: str(p.relative_to(REPO)))
def test_docs(path: Path) -> None:
    assert problems(path.read_text()) == []


@pytest.mark.parametrize(("command", "text"), list(_helps()), ids=lambda x: str(x)[:40])
def test_help(command: str, text: str) -> None:
    assert problems(text) == [], command
    assert "(default: )" not in text, command
    assert "``" not in text and ":func:`" not in text, f"{command}: reST markup in --help"


def test_docstrings() -> None:
    found = []
    for path in sorted((REPO / "preflight").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if any(rel.startswith(p) for p in PENDING):
            continue
        for line, doc in _docstrings(path):
            found += [f"{rel}:{line}: {p}" for p in problems(doc)]
    assert found == []


def test_the_epilog_names_a_place_the_user_has() -> None:
    """The wheel and the image have no source tree: the epilog points to preflight docs."""
    text = build_parser().format_help()
    assert "source tree" not in text and "preflight docs" in text
