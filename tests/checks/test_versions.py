"""The ``versions`` check: golden comparison against a real second interpreter (a venv with the
article's scikit-learn 1.3.2), unreadable golden files, hash_paths, a missing interpreter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from preflight.checks import CHECKS, versions
from preflight.core.result import Status
from preflight.core.runner import run_checks, select
from preflight.probes import fingerprint as fpm
from tests import topologies
from tests.conftest import MakeCtx


def golden_from(make_ctx: MakeCtx, path: Path, python: Path, **edit: Any) -> Path:
    """Fingerprint ``python`` as a good node would, apply ``edit`` to its packages, save it."""
    fp = versions.fingerprint_of(make_ctx(python=str(python)))
    fp["packages"].update(edit)
    fp["packages"] = {k: v for k, v in fp["packages"].items() if v is not None}
    path.write_text(json.dumps(fp))
    return path


def test_registered() -> None:
    assert [c.run for c in CHECKS if c.name == "versions"] == [versions.run]


def test_no_golden_pass_with_summary(make_ctx: MakeCtx, node_python: Path) -> None:
    r = versions.run(make_ctx(python=str(node_python)))
    assert (r.status, r.reason) == (Status.PASS, "VersionsRecorded")
    assert r.message.startswith("torch 2.4.0+cu121, CUDA 12.1, cuDNN 9.1.0.70, NCCL 2.21.5, "
                                "driver 570.124.06, python 3.")
    fp = r.details["fingerprint"]
    assert isinstance(fp, dict)
    assert fp["packages"]["scikit-learn"] == "1.3.2"
    assert r.details["sha256"] == fp["sha256"] == fpm.canonical_sha256(fp)


def test_golden_mismatch_fails_naming_the_package(make_ctx: MakeCtx, node_python: Path,
                                                  tmp_path: Path) -> None:
    """The article's story: scikit-learn 1.5.0 on the golden node, 1.3.2 here."""
    golden = golden_from(make_ctx, tmp_path / "golden.json", node_python,
                         **{"scikit-learn": "1.5.0", "deepspeed": "0.14.0"})
    r = versions.run(make_ctx(python=str(node_python), golden=str(golden)))
    assert (r.status, r.reason) == (Status.FAIL, "VersionsDiffer")
    assert f"2 differences from golden {golden}" in r.message
    assert "only in golden: deepspeed 0.14.0" in r.message
    assert "scikit-learn: 1.3.2 on this node, 1.5.0 in golden" in r.message
    assert f"{node_python} -m pip install deepspeed==0.14.0 scikit-learn==1.5.0" in r.remedy
    assert [d["key"] for d in r.details["differences"]] == ["deepspeed", "scikit-learn"]


def test_golden_match_pass(make_ctx: MakeCtx, node_python: Path, tmp_path: Path) -> None:
    golden = golden_from(make_ctx, tmp_path / "golden.json", node_python)
    r = versions.run(make_ctx(python=str(node_python), golden=str(golden)))
    assert (r.status, r.reason) == (Status.PASS, "VersionsMatch")
    assert r.message.startswith(f"matches golden {golden}")


def test_other_driver_fails(make_ctx: MakeCtx, node_python: Path, tmp_path: Path) -> None:
    golden = golden_from(make_ctx, tmp_path / "golden.json", node_python)
    snap = topologies.snapshot([topologies.h100(0, "0000:18:00.0")],
                               driver_version="550.54.15", cuda_driver_version=12040)
    r = versions.run(make_ctx(python=str(node_python), golden=str(golden), snapshot=snap))
    assert r.status is Status.FAIL
    assert "driver: 550.54.15 on this node, 570.124.06 in golden" in r.message
    assert "driver CUDA: 12.4 on this node, 12.8 in golden" in r.message


def test_golden_unreadable_is_error_naming_the_file(make_ctx: MakeCtx, tmp_path: Path) -> None:
    bad = tmp_path / "golden.json"
    bad.write_text("{truncated")
    for path, why in [(tmp_path / "none.json", "no such file"), (bad, "not valid JSON")]:
        r = versions.run(make_ctx(golden=str(path)))
        assert (r.status, r.reason) == (Status.ERROR, "GoldenUnreadable")
        assert f"{path}: {why}" in r.message
        assert f"preflight fingerprint --json > {path}" in r.remedy
    bad.write_text('{"schema_version": 1}')
    r = versions.run(make_ctx(golden=str(bad)))
    assert "not a fingerprint" in r.message


def test_hash_path_change_fails(make_ctx: MakeCtx, tmp_path: Path) -> None:
    code = tmp_path / "train.py"
    code.write_text("lr = 1e-3\n")
    ctx_args = {"hash_paths": (str(code),), "watched_packages": ("pytest",)}
    golden = tmp_path / "golden.json"
    golden.write_text(json.dumps(versions.fingerprint_of(make_ctx(**ctx_args))))
    assert versions.run(make_ctx(golden=str(golden), **ctx_args)).status is Status.PASS
    code.write_text("lr = 3e-4\n")
    r = versions.run(make_ctx(golden=str(golden), **ctx_args))
    assert r.status is Status.FAIL
    assert f"sha256 of {code}: " in r.message
    assert "align sha256 of" in r.remedy


def test_hash_path_missing_warns_without_golden(make_ctx: MakeCtx, tmp_path: Path) -> None:
    r = versions.run(make_ctx(hash_paths=(str(tmp_path / "data"),), watched_packages=()))
    assert (r.status, r.reason) == (Status.WARN, "HashPathProblem")
    assert f"{tmp_path / 'data'}: <missing>" in r.message


def test_missing_interpreter_is_undecided_never_a_node_fault(make_ctx: MakeCtx,
                                                             tmp_path: Path) -> None:
    """The commands refuse such a --python before the checks run (a configuration error); if it
    vanishes in between, the check cannot decide: ERROR, never a FAIL that drains."""
    python = tmp_path / "shared" / "venv" / "bin" / "python"
    r = versions.run(make_ctx(python=str(python)))
    assert (r.status, r.reason, r.scope.value) == (Status.ERROR, "PythonMissing", "undecided")
    assert str(python) in r.message and str(python) in r.remedy


def test_hung_interpreter_is_error_via_runner(make_ctx: MakeCtx, tmp_path: Path) -> None:
    """The interpreter's own deadline (0.8 x check_timeout_s) fires before the runner's, so the
    ERROR names what hung. The 20 % between them (2 s here) covers killing its group and a
    loaded machine's scheduling; at 1 s (0.2 s apart) the runner's CheckTimeout won once."""
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\nexec sleep 60\n")
    exe.chmod(0o755)
    ctx = make_ctx(python=str(exe), check_timeout_s=10.0, watched_packages=())
    report = run_checks(ctx, select(CHECKS, only=["versions"]))
    r = report.results[0]
    assert (r.status, r.reason, r.scope.value) == (Status.ERROR, "ProbeTimeout", "undecided")
    assert "did not describe its environment within 8 s" in r.message
    assert "bug" not in r.remedy  # the node did not answer; preflight did not crash


def test_no_driver_node(make_ctx: MakeCtx) -> None:
    r = versions.run(make_ctx(snapshot=topologies.no_driver(), watched_packages=("pytest",)))
    assert r.status is Status.PASS
    assert "driver none" in r.message
    fp = r.details["fingerprint"]
    assert isinstance(fp, dict) and fp["driver"] is None
    assert fp["meta"]["errors"] and "libnvidia-ml.so.1" in fp["meta"]["errors"][0]


def test_fingerprint_shared_within_a_run(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(watched_packages=("pytest",))
    assert versions.fingerprint_of(ctx) is versions.fingerprint_of(ctx)
