"""What the parent removes from /dev/shm after a run (bench/leftovers.py), on real files and a
real process that holds one of them open or mapped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from preflight.bench import leftovers

HOLD = """
import mmap, sys, time
f = open(sys.argv[1], "r+b")
m = mmap.mmap(f.fileno(), 0) if sys.argv[2] == "map" else None
if m is not None:
    f.close()
print("ready", flush=True)
time.sleep(60)
"""


def _holder(path: Path, how: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), how],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _segment(d: Path, name: str) -> Path:
    path = d / name
    path.write_bytes(b"\0" * 4096)
    return path


def test_removes_only_new_unused_nccl_files_of_this_user(tmp_path: Path) -> None:
    old = _segment(tmp_path, "nccl-old111")
    before = leftovers.snapshot(str(tmp_path))
    assert before == {"nccl-old111"}
    orphan = _segment(tmp_path, "nccl-orphan")
    opened = _segment(tmp_path, "nccl-opened")
    mapped = _segment(tmp_path, "nccl-mapped")
    other = _segment(tmp_path, "torch-12345")
    (tmp_path / "nccl-dir").mkdir()
    (tmp_path / "nccl-link").symlink_to(other)
    holders = [_holder(opened, "open"), _holder(mapped, "map")]
    try:
        removed = leftovers.remove_orphans(before, directory=str(tmp_path))
    finally:
        for h in holders:
            h.kill()
            h.wait()
    assert removed == (str(orphan),)
    assert not orphan.exists()
    for kept in (old, opened, mapped, other, tmp_path / "nccl-dir", tmp_path / "nccl-link"):
        assert os.path.lexists(kept), kept


def test_once_the_holder_is_gone_the_file_is_an_orphan(tmp_path: Path) -> None:
    path = _segment(tmp_path, "nccl-held")
    holder = _holder(path, "map")
    assert leftovers.remove_orphans(frozenset(), directory=str(tmp_path)) == ()
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 5
    while path.exists() and time.monotonic() < deadline:
        leftovers.remove_orphans(frozenset(), directory=str(tmp_path))
    assert not path.exists()


def test_a_file_held_under_another_name_is_kept(tmp_path: Path) -> None:
    """Held means the same device and inode: a process that has the file open through a hard
    link elsewhere holds it."""
    path = _segment(tmp_path, "nccl-aliased")
    (tmp_path / "sub").mkdir()
    os.link(path, tmp_path / "sub" / "alias")
    holder = _holder(tmp_path / "sub" / "alias", "open")
    try:
        assert leftovers.remove_orphans(frozenset(), directory=str(tmp_path)) == ()
    finally:
        holder.kill()
        holder.wait()
    assert path.exists()


def test_nothing_is_removed_when_the_processes_cannot_be_listed(tmp_path: Path) -> None:
    path = _segment(tmp_path, "nccl-unknown")
    assert leftovers.remove_orphans(frozenset(), directory=str(tmp_path),
                                    proc=str(tmp_path / "no-proc")) == ()
    assert path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file another owner")
def test_another_users_file_is_left_alone(tmp_path: Path) -> None:
    path = _segment(tmp_path, "nccl-theirs")
    os.chown(path, 12345, 12345)
    assert leftovers.remove_orphans(frozenset(), directory=str(tmp_path)) == ()
    assert path.exists()


def test_unreadable_directory_is_nothing_to_do(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent")
    assert leftovers.snapshot(missing) == frozenset()
    assert leftovers.remove_orphans(frozenset(), directory=missing) == ()
