"""``check --prom-file`` against whatever an operator points it at: a device, a FIFO, symlinks, a
directory, a full filesystem. The verdict (stdout, JSON, exit code) never depends on the file, and
nothing but a regular file is ever replaced."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.outputs.textfile import (
    ERROR_METRIC,
    TextfileError,
    essential_lines,
    write_metrics_file,
)
from tests import topologies
from tests.helpers import REPO, run_cli, write_fixture

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod and mount need root")
needs_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                   reason="needs root and unshare for a private tmpfs mount")

CHECK = ["check", "--json", "--only", "gpu_visible", "--expect-gpus", "8"]


def _check(tmp_path: Path, prom: Path | str, *, lost: bool = False
           ) -> subprocess.CompletedProcess[str]:
    snap = topologies.lost_gpu() if lost else topologies.healthy_8x_h100()
    fixture = write_fixture(tmp_path / "gpus.json", snap)
    return run_cli([*CHECK, "--prom-file", str(prom)], fixture=fixture)


def _verdict_unchanged(proc: subprocess.CompletedProcess[str], *, status: str = "pass",
                       code: int = 0) -> None:
    assert proc.returncode == code, proc.stderr
    assert json.loads(proc.stdout)["status"] == status
    assert "Traceback" not in proc.stderr


@needs_root
def test_a_character_device_is_refused_and_stays_a_device(tmp_path: Path) -> None:
    dev = tmp_path / "null"
    subprocess.run(["mknod", str(dev), "c", "1", "3"], check=True)
    proc = _check(tmp_path, dev, lost=True)
    _verdict_unchanged(proc, status="fail", code=1)
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert os.major(os.lstat(dev).st_rdev) == 1 and os.minor(os.lstat(dev).st_rdev) == 3
    assert "is a device" in proc.stderr and str(dev) in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus.json", "null"]  # no temp file


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "metrics.prom"
    os.mkfifo(fifo)  # nobody reads it: opening it for writing would block for ever
    proc = _check(tmp_path, fifo)
    _verdict_unchanged(proc)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert "is a FIFO" in proc.stderr


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    proc = _check(tmp_path, tmp_path / "d")
    _verdict_unchanged(proc)
    assert "is a directory" in proc.stderr and (tmp_path / "d").is_dir()


def test_a_symlink_stays_a_link_and_its_target_is_replaced(tmp_path: Path) -> None:
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / "preflight.prom").write_text("old\n")
    link = tmp_path / "preflight.prom"
    link.symlink_to(real_dir / "preflight.prom")
    proc = _check(tmp_path, link)
    _verdict_unchanged(proc)
    assert proc.stderr == ""
    assert link.is_symlink() and os.readlink(link) == str(real_dir / "preflight.prom")
    text = (real_dir / "preflight.prom").read_text()
    assert "preflight_node_healthy 1.0" in text and f"{ERROR_METRIC} 0" in text
    assert sorted(p.name for p in real_dir.iterdir()) == ["preflight.prom"]


def test_a_dangling_symlink_creates_the_file_it_names(tmp_path: Path) -> None:
    link = tmp_path / "preflight.prom"
    link.symlink_to(tmp_path / "named.prom")
    _verdict_unchanged(_check(tmp_path, link))
    assert link.is_symlink() and "preflight_node_healthy" in (tmp_path / "named.prom").read_text()


@needs_root
def test_a_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    dev = tmp_path / "null"
    subprocess.run(["mknod", str(dev), "c", "1", "3"], check=True)
    link = tmp_path / "preflight.prom"
    link.symlink_to(dev)
    proc = _check(tmp_path, link)
    _verdict_unchanged(proc)
    assert stat.S_ISCHR(os.lstat(dev).st_mode) and link.is_symlink()
    assert "through the symlink" in proc.stderr


def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    proc = _check(tmp_path, tmp_path / "a")
    _verdict_unchanged(proc)
    assert "loop" in proc.stderr


def test_a_missing_directory_keeps_the_verdict_and_says_why(tmp_path: Path) -> None:
    proc = _check(tmp_path, tmp_path / "nope" / "x.prom", lost=True)
    _verdict_unchanged(proc, status="fail", code=1)
    assert proc.stderr.count("\n") == 1 and "nope" in proc.stderr
    assert "no such directory" in proc.stderr


def _full_tmpfs(tmp_path: Path, *, stale: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``check --json --prom-file`` on a 64 KiB tmpfs filled to the last block (a private mount
    namespace); returns the CLI's result and a copy of the directory as it was left."""
    full = tmp_path / "full"
    full.mkdir()
    after = tmp_path / "after"
    fixture = write_fixture(tmp_path / "gpus.json", topologies.lost_gpu())
    prom = full / "preflight.prom"
    old = ("# stale\npreflight_node_healthy 1\n" * 300) if stale else ""
    script = (f"mount -t tmpfs -o size=64k tmpfs {full} && "
              + (f"printf %s \"$STALE\" > {prom} && " if stale else "")
              + f"(head -c 1048576 /dev/zero > {full}/ballast 2>/dev/null; true) && "
              f'"$0" -m preflight {" ".join(CHECK)} --prom-file {prom} '
              f"> {tmp_path}/out.json 2> {tmp_path}/err.txt; echo $? > {tmp_path}/rc; "
              f"cp -a {full} {after}")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")},
           "PYTHONPATH": str(REPO), "PREFLIGHT_NVML_FIXTURE": str(fixture), "STALE": old}
    subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                    sys.executable], check=True, timeout=60, env=env)
    proc = subprocess.CompletedProcess(
        [], int((tmp_path / "rc").read_text()), (tmp_path / "out.json").read_text(),
        (tmp_path / "err.txt").read_text())
    return proc, after


@needs_unshare
def test_a_full_disk_keeps_the_fail_verdict_and_leaves_no_stale_file(tmp_path: Path) -> None:
    proc, after = _full_tmpfs(tmp_path, stale=False)
    _verdict_unchanged(proc, status="fail", code=1)
    assert json.loads(proc.stdout)["results"][0]["reason"] == "GpuLost"
    assert "No space left on device" in proc.stderr and proc.stderr.count("\n") == 1
    assert sorted(p.name for p in after.iterdir()) == ["ballast"]  # no temp file left


@needs_unshare
def test_a_full_disk_replaces_the_stale_verdict_with_the_error_gauge(tmp_path: Path) -> None:
    proc, after = _full_tmpfs(tmp_path, stale=True)
    _verdict_unchanged(proc, status="fail", code=1)
    text = (after / "preflight.prom").read_text()
    assert "stale" not in text  # the old PASS is not served any more
    assert f"{ERROR_METRIC} 1" in text and "preflight_node_healthy 0.0" in text
    assert "wrote only preflight_textfile_write_error 1" in proc.stderr
    assert sorted(p.name for p in after.iterdir()) == ["ballast", "preflight.prom"]


def test_essential_lines_keep_only_the_named_families() -> None:
    text = (b"# HELP a_x help\n# TYPE a_x gauge\na_x 1\n# HELP b b\n# TYPE b gauge\n"
            b'b{l="a_x"} 2\na_x_total 3\n')
    assert essential_lines(text, ["a_x"]) == b"# HELP a_x help\n# TYPE a_x gauge\na_x 1\n"
    assert essential_lines(text, ["b"]) == b'# HELP b b\n# TYPE b gauge\nb{l="a_x"} 2\n'


def test_writer_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(TextfileError, match="is a directory"):
        write_metrics_file(tmp_path, b"x 1\n")
    target = tmp_path / "ok.prom"
    write_metrics_file(target, b"x 1\n")
    assert target.read_text() == ("x 1\n# HELP preflight_textfile_write_error 1 when preflight "
                                  "could not write this file in full (disk full, read-only): "
                                  "only the verdict series are here; 0 after a full write.\n"
                                  "# TYPE preflight_textfile_write_error gauge\n"
                                  "preflight_textfile_write_error 0\n")
