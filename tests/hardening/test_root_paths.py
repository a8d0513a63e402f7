"""Paths under --root resolve like the host would see them, never outside the root."""

from __future__ import annotations

import os
from pathlib import Path

from preflight.core.context import resolve_under


def test_absolute_link_restarts_at_the_root(tmp_path: Path) -> None:
    (tmp_path / "run" / "shm").mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    os.symlink("/run/shm", tmp_path / "dev" / "shm")
    assert resolve_under(tmp_path, "/dev/shm") == tmp_path / "run" / "shm"


def test_dotdot_and_relative_links_cannot_climb_out(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    os.symlink("../../../../etc", tmp_path / "a" / "up")
    assert resolve_under(tmp_path, "/a/up/passwd") == tmp_path / "etc" / "passwd"
    assert resolve_under(tmp_path, "/../../x") == tmp_path / "x"


def test_a_link_loop_ends(tmp_path: Path) -> None:
    os.symlink("/b", tmp_path / "a")
    os.symlink("/a", tmp_path / "b")
    out = resolve_under(tmp_path, "/a/shm")
    assert str(out).startswith(str(tmp_path))


def test_plain_root_is_untouched() -> None:
    assert resolve_under("/", "/dev/shm") == Path("/dev/shm")
