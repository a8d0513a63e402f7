"""What makes a whole repository fast to lint changes no result: the rules skipped for lack of
their words, the files left unparsed, the worker processes of ``--jobs`` (same findings, same
order, nothing left running, a dying worker reported)."""

from __future__ import annotations

import ast
import gc
import multiprocessing
import os
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight.lint import (
    analyse,
    checks_for,
    gate_text,
    lint_file,
    lint_paths,
    lint_source,
    may_have_findings,
)
from preflight.lint.analysis import Module
from preflight.lint.checks import CHECKS
from preflight.lint.jobs import POOL_MIN_FILES, Dispatcher, usable_cpus
from tests.lint.corpus import entries, skip_unless_fetched
from tests.lint.synthetic import SCRIPTS, write_tree
from tests.lint.test_property import programs

REPO = Path(__file__).resolve().parents[2]


def _gating_changes_nothing(src: bytes | str) -> bool:
    tree = ast.parse(src)
    return analyse(tree, checks_for(gate_text(src))) == analyse(tree)


@pytest.mark.parametrize("name", SCRIPTS)
def test_rules_skipped_for_lack_of_their_words_would_have_found_nothing(name: str) -> None:
    src, _rules = SCRIPTS[name]
    assert _gating_changes_nothing(src)


def test_gating_changes_no_finding_on_the_real_scripts() -> None:
    skip_unless_fetched()
    changed = [e.file for e in entries() if not _gating_changes_nothing(e.read() or b"")]
    assert changed == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sets(st.integers(0, 3)))
def test_gating_changes_no_finding_on_generated_programs(src: str, dropped: set[int]) -> None:
    """Generated scripts, some of their imports left out, so that rules go unrun."""
    lines = src.splitlines(keepends=True)
    src = "".join(line for i, line in enumerate(lines) if i not in dropped)
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return
    assert analyse(tree, checks_for(gate_text(src))) == analyse(tree)


def test_a_file_without_any_rule_word_is_not_parsed(tmp_path: Path) -> None:
    plain = tmp_path / "model.py"
    plain.write_text("import torch\nx = torch.zeros(3, device='cuda:0')\ndef f(:\n")
    assert not may_have_findings(plain.read_bytes())
    assert lint_file(str(plain)).error is None  # not parsed: the syntax error goes unseen
    with pytest.raises(Exception, match="not valid Python"):
        lint_source(plain.read_bytes())  # lint_source always parses


def test_words_are_read_as_python_reads_identifiers(tmp_path: Path) -> None:
    """NFKC (fullwidth letters are the plain name to Python) and a coding cookie (UTF-7
    spells a name in base64) cannot hide a finding."""
    wide = "".join(chr(ord(c) - ord("a") + 0xFF41) for c in "environ")  # ｅｎｖｉｒｏｎ
    fullwidth = f"import os\nif os.{wide}['RANK'] == 0:\n    pass\n"
    utf7 = b"# coding: utf-7\nimport os\nif os.+AGUAbgB2AGkAcgBvAG4-['RANK'] == 0:\n    pass\n"
    for name, data in (("wide.py", fullwidth.encode()), ("utf7.py", utf7)):
        assert b"environ" not in data
        (tmp_path / name).write_bytes(data)
        result = lint_file(str(tmp_path / name))
        assert [f.rule for f in result.findings] == ["DDP105"], name


def test_the_index_of_a_file_is_dropped_with_it() -> None:
    src, _rules = SCRIPTS["torchrun_right.py"]
    module = Module(ast.parse(src))
    for check in CHECKS:
        list(check(module))
    ref = weakref.ref(module)
    del module
    gc.collect()
    assert ref() is None


def test_jobs_give_the_same_findings_in_the_same_order(tmp_path: Path) -> None:
    tree = write_tree(tmp_path, 4)
    assert sum(may_have_findings(p.read_bytes()) for p in tree.rglob("*.py")) >= POOL_MIN_FILES
    one = lint_paths([str(tree)], jobs=1)
    two = lint_paths([str(tree)], jobs=2)
    assert one.findings > 0 and len(one.skipped) == 1
    assert two.files == one.files and two.results == one.results
    assert multiprocessing.active_children() == []


def _pid_of(items: list[tuple[str, bytes]]) -> list[int]:
    return [os.getpid() for _ in items]


def _dies_on(items: list[tuple[str, bytes]]) -> list[str]:
    if any(path == "die" for path, _ in items):
        os._exit(1)
    return [path for path, _ in items]


def test_the_pool_runs_in_other_processes_and_only_for_enough_files() -> None:
    seen: dict[int, int] = {}
    few = Dispatcher(2, _pid_of, seen.__setitem__, lambda i, r: None)
    for i in range(POOL_MIN_FILES - 1):
        few.add(i, (f"f{i}", b""))
    few.finish()
    assert set(seen.values()) == {os.getpid()}  # a handful: no pool
    seen.clear()
    many = Dispatcher(2, _pid_of, seen.__setitem__, lambda i, r: None)
    for i in range(200):
        many.add(i, (f"f{i}", b""))
    many.finish()
    assert sorted(seen) == list(range(200))
    assert os.getpid() not in seen.values()
    assert multiprocessing.active_children() == []


def test_the_pool_works_when_the_process_has_other_threads() -> None:
    """With a second thread fork is unsafe, so the pool starts its workers from a fork server
    (a program that uses lint as a library, or the flake8 plugin): they lint, as forked ones do."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        seen: dict[int, int] = {}
        many = Dispatcher(2, _pid_of, seen.__setitem__, lambda i, r: None)
        for i in range(200):
            many.add(i, (f"f{i}", b""))
        many.finish()
    finally:
        stop.set()
        other.join()
    assert sorted(seen) == list(range(200))
    assert os.getpid() not in seen.values()


def test_a_worker_that_dies_costs_only_its_files() -> None:
    done: dict[int, str] = {}
    lost: dict[int, str] = {}
    dispatcher = Dispatcher(2, _dies_on, done.__setitem__, lost.__setitem__)
    names = [f"f{i}" for i in range(100)]
    names[95] = "die"
    for i, name in enumerate(names):
        dispatcher.add(i, (name, b""))
    dispatcher.finish()
    assert 95 in lost and "ended unexpectedly" in lost[95]
    assert sorted([*done, *lost]) == list(range(100))  # every file is accounted for
    assert done and all(done[i] == names[i] for i in done)
    assert multiprocessing.active_children() == []


def test_usable_cpus_and_the_jobs_option(tmp_path: Path) -> None:
    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    tree = write_tree(tmp_path, 4)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "preflight", "lint", str(tree), *args],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                              text=True, check=False, timeout=120)

    serial, parallel = cli("--jobs", "1"), cli("-j", "2")
    assert serial.returncode == parallel.returncode == 1
    assert serial.stdout == parallel.stdout and serial.stdout.count("DDP1") > 10
    bad = cli("--jobs", "0")
    assert bad.returncode == 2 and "must be at least 1" in bad.stderr
