"""`preflight docs`: the documentation from the installed package (a wheel carries it)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import REPO, run_cli


def test_lists_the_topics_with_their_titles() -> None:
    proc = run_cli(["docs"])
    assert proc.returncode == 0
    rows = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    assert rows["configuration"] == "Configuration"
    assert rows["site-checks"] == "Site checks"
    assert "runbooks/PreflightCheckFailing" in rows and "readme" in rows
    listed = json.loads(run_cli(["docs", "--json"]).stdout)
    assert {"topic": "checks", "title": "Checks"} in listed


@pytest.mark.parametrize("topic", ["configuration", "docs/configuration.md", "Configuration"])
def test_prints_a_topic(topic: str) -> None:
    proc = run_cli(["docs", topic])
    assert proc.returncode == 0
    assert proc.stdout == (REPO / "docs" / "configuration.md").read_text()


def test_an_unknown_topic_is_one_line_and_exit_2() -> None:
    proc = run_cli(["docs", "nope"])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("preflight docs: no topic 'nope'; topics: readme, ")
    assert len(proc.stderr.splitlines()) == 1


@pytest.mark.slow
def test_the_wheel_carries_the_docs(tmp_path: Path) -> None:
    """Built from a copy of the tree, unpacked where no docs/ lies beside it: the docs come from
    inside the package."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "preflight", src / "preflight",
                    ignore=shutil.ignore_patterns("__pycache__", "_docs"))
    shutil.copytree(REPO / "docs", src / "docs", ignore=shutil.ignore_patterns("device-runs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", str(src), "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "preflight/_docs/site-checks.md" in names
    assert "preflight/_docs/runbooks/PreflightCheckFailing.md" in names
    assert not any("device-runs" in n for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    proc = subprocess.run([sys.executable, "-m", "preflight", "docs", "site-checks"],
                          cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (REPO / "docs" / "site-checks.md").read_text()


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40))
def test_any_topic_prints_or_refuses_in_one_line(topic: str) -> None:
    from preflight import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["docs", "--", topic])
    assert code in (0, 2)
    if code == 2:
        assert len(err.getvalue().splitlines()) == 1 and "Traceback" not in err.getvalue()
    else:
        assert out.getvalue()
