"""``preflight fingerprint`` and ``preflight diff`` as a user runs them: real processes, exit codes,
stdout for results, stderr for errors, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight.cli import main
from tests.venvs import MakeVenv, run_cli


def test_fingerprint_json_of_another_interpreter(node_python: Path, nvml_fixture: Path,
                                                 tmp_path: Path) -> None:
    out = run_cli("fingerprint", "--json", "--python", str(node_python))
    assert out.returncode == 0, out.stderr
    fp = json.loads(out.stdout)
    assert fp["packages"]["scikit-learn"] == "1.3.2"
    assert (fp["torch"], fp["cuda"], fp["driver"]) == ("2.4.0+cu121", "12.1", "570.124.06")
    assert fp["meta"]["executable"] == str(node_python)


def test_fingerprint_config_file(node_python: Path, nvml_fixture: Path, tmp_path: Path) -> None:
    """python, watched_packages and hash_paths from a YAML config file."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    cfg = tmp_path / "preflight.yaml"
    cfg.write_text(f"python: {node_python}\nwatched_packages: [scikit-learn]\n"
                   f"hash_paths: ['{code}']\n")
    out = run_cli("fingerprint", "--json", "--config", str(cfg))
    assert out.returncode == 0, out.stderr
    fp = json.loads(out.stdout)
    assert fp["packages"] == {"scikit-learn": "1.3.2"}
    assert len(fp["hashes"][str(code)]) == 64


def test_fingerprint_human(node_python: Path, nvml_fixture: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fingerprint", "--python", str(node_python)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("torch 2.4.0+cu121, CUDA 12.1, cuDNN 9.1.0.70, NCCL 2.21.5, "
                          "driver 570.124.06")
    assert "scikit-learn" in out and "1.3.2" in out


def test_fingerprint_missing_python_exit_1(tmp_path: Path, nvml_fixture: Path) -> None:
    out = run_cli("fingerprint", "--python", str(tmp_path / "nope"))
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.strip() == f"preflight fingerprint: python interpreter {tmp_path / 'nope'}"\
        " does not exist"


def test_fingerprint_bad_config_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("watched_packages: 3\n")
    out = run_cli("fingerprint", "--config", str(cfg))
    assert out.returncode == 2
    assert "watched_packages must be a list of strings" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture
def two_fingerprints(node_python: Path, make_venv: MakeVenv, nvml_fixture: Path,
                     tmp_path: Path) -> tuple[Path, Path, Path]:
    """A: the scikit-learn 1.3.2 node; A2: the same again; B: scikit-learn 1.5.0 + deepspeed."""
    other = make_venv(packages={"scikit-learn": "1.5.0", "numpy": "1.26.4",
                                "deepspeed": "0.14.0", "nvidia-nccl-cu12": "2.21.5",
                                "nvidia-cudnn-cu12": "9.1.0.70"},
                      torch=("2.4.0+cu121", "12.1"))
    paths = []
    for name, python in [("a", node_python), ("a2", node_python), ("b", other)]:
        out = run_cli("fingerprint", "--json", "--python", str(python))
        assert out.returncode == 0, out.stderr
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(out.stdout)
    return paths[0], paths[1], paths[2]


def test_diff_exit_codes_and_wording(two_fingerprints: tuple[Path, Path, Path]) -> None:
    a, a2, b = two_fingerprints
    same = run_cli("diff", str(a), str(a2))
    assert same.returncode == 0, same.stderr
    assert same.stdout.startswith("same: ")

    differ = run_cli("diff", str(a), str(b))
    assert differ.returncode == 1, differ.stderr
    assert differ.stdout.splitlines() == [
        f"A = {a}", f"B = {b}", "2 differences:",
        "  only on B: deepspeed 0.14.0",
        "  scikit-learn: 1.3.2 on A, 1.5.0 on B"]

    as_json = run_cli("diff", "--json", str(a), str(b))
    assert as_json.returncode == 1
    data = json.loads(as_json.stdout)
    assert data["same"] is False and data["a_sha256"] != data["b_sha256"]
    assert [d["text"] for d in data["differences"]] == ["only on B: deepspeed 0.14.0",
                                                        "scikit-learn: 1.3.2 on A, 1.5.0 on B"]


def test_diff_of_check_reports(two_fingerprints: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """A `preflight check --json` report carries the fingerprint; diff reads it directly."""
    a, _, b = two_fingerprints
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"schema_version": 1, "results": [],
                                  "fingerprint": json.loads(b.read_text())}))
    out = run_cli("diff", str(a), str(report))
    assert out.returncode == 1
    assert "scikit-learn: 1.3.2 on A, 1.5.0 on B" in out.stdout


def test_diff_unreadable_exit_2(two_fingerprints: tuple[Path, Path, Path],
                                tmp_path: Path) -> None:
    a = two_fingerprints[0]
    bad = tmp_path / "bad.json"
    bad.write_text('{"python": "3.11"}')
    for other, why in [(tmp_path / "none.json", "no such file"),
                       (bad, "not a fingerprint: fingerprint_version is None")]:
        out = run_cli("diff", str(a), str(other))
        assert out.returncode == 2
        assert out.stdout == ""
        assert out.stderr.strip().startswith(f"preflight diff: {other}: {why}")
    usage = run_cli("diff", str(a))
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_check_json_carries_fingerprint(node_python: Path, nvml_fixture: Path,
                                        tmp_path: Path) -> None:
    """End to end: `preflight check --only versions --golden` FAILs with exit 1 and the story."""
    golden = tmp_path / "golden.json"
    fp = json.loads(run_cli("fingerprint", "--json", "--python", str(node_python)).stdout)
    fp["packages"]["scikit-learn"] = "1.5.0"
    golden.write_text(json.dumps(fp))
    out = run_cli("check", "--json", "--only", "versions", "--python", str(node_python),
                  "--golden", str(golden))
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    result = report["results"][0]
    assert result["reason"] == "VersionsDiffer"
    assert "scikit-learn: 1.3.2 on this node, 1.5.0 in golden" in result["message"]
    # The runner lifts the fingerprint out of the result into the report, once.
    assert report["fingerprint"]["packages"]["scikit-learn"] == "1.3.2"
    assert "fingerprint" not in result["details"]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=120) | st.sampled_from([b"{}", b"[]", b'{"fingerprint_version": 1}',
                                                   b'{"fingerprint_version": 1, "packages": 0}']))
def test_diff_cli_any_file_content(tmp_path: Path, content: bytes) -> None:
    """In process (fast): any content gives exit 0/1/2, never an exception out of main()."""
    p = tmp_path / f"x{os.getpid()}.json"
    p.write_bytes(content)
    assert main(["diff", str(p), str(p)]) in (0, 2)
