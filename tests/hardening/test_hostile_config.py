"""Hostile config files through the real CLI: one line on stderr, exit 2, no traceback, no hang.

The cases are the ones an adversarial pass found (issue #11): a file that is not UTF-8, nested
10,000 deep, a 5,000-digit integer, an alias bomb, infinite or absurd numbers, duplicate keys, and
paths that are not files at all (/dev/zero, a FIFO nobody writes, a directory)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from preflight.core.boundedio import BoundedReadError, read_bounded
from preflight.core.config import Config, ConfigError, load_file
from tests.helpers import run_cli

BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
watched_packages: [*g,*g,*g,*g,*g,*g,*g,*g,*g]
"""

#: name -> (writes the hostile file under a directory and returns its path, words the error has)
Maker = Callable[[Path], Path]


def _file(name: str, data: bytes) -> Maker:
    def make(d: Path) -> Path:
        p = d / name
        p.write_bytes(data)
        return p
    return make


def _fifo(d: Path) -> Path:
    p = d / "config.yaml"
    os.mkfifo(p)
    return p


CASES: dict[str, tuple[Maker, str]] = {
    "not-utf8": (_file("c.yaml", b"expect_gpus: 8\ncomment: \xff\xfe\n"), "not UTF-8"),
    "nested-10000-yaml": (_file("c.yaml", b"a: " + b"[" * 10000 + b"]" * 10000 + b"\n"),
                          "nested deeper than 16"),
    "nested-10000-toml": (_file("c.toml", b"a = " + b"[" * 10000 + b"]" * 10000 + b"\n"),
                          "c.toml"),
    "5000-digit-int": (_file("c.yaml", b"expect_gpus: " + b"9" * 5000 + b"\n"), "5000 char"),
    "alias-bomb": (_file("c.yaml", BOMB.encode()), "aliases"),
    "inf-timeout": (_file("c.yaml", b"check_timeout_s: .inf\n"), "check_timeout_s"),
    "huge-interval": (_file("c.yaml", b"interval_s: 1e300\n"), "interval_s"),
    "nan-bench-timeout": (_file("c.yaml", b"bench_timeout_s: .nan\n"), "bench_timeout_s"),
    "port-99999": (_file("c.yaml", b"listen: 127.0.0.1:99999\n"), "listen"),
    "duplicate-key": (_file("c.yaml", b"expect_gpus: 8\nexpect_gpus: 4\n"), "duplicate key"),
    "oversized": (_file("c.yaml", b"# " + b"x" * (5 << 20) + b"\n"), "bytes"),
    "dev-zero": (lambda d: Path("/dev/zero"), "a device"),
    "fifo": (_fifo, "a FIFO"),
    "directory": (lambda d: d, "a directory"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_refuses_a_hostile_config_with_one_line(tmp_path: Path, case: str) -> None:
    make, words = CASES[case]
    path = make(tmp_path)
    started = time.monotonic()
    proc = run_cli(["check", "--only", "shm", "--expect-gpus", "0", "--config", str(path)],
                   timeout=30)
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("preflight: configuration error: ")
    assert words in lines[0]
    assert len(lines[0]) < 600
    assert took < 25, f"{case} took {took:.1f} s"  # within run_cli's 30 s: no hang, no bomb


def test_environment_numbers_are_bounded() -> None:
    for var, value in [("PREFLIGHT_CHECK_TIMEOUT_S", "inf"), ("PREFLIGHT_INTERVAL_S", "1e300"),
                       ("PREFLIGHT_EXPECT_GPUS", "9" * 5000), ("PREFLIGHT_SHM_CHANNELS", "-1")]:
        proc = run_cli(["check", "--only", "shm"], env={var: value})
        assert proc.returncode == 2, (var, proc.stderr)
        assert proc.stderr.count("\n") == 1 and var[len("PREFLIGHT_"):].lower() in proc.stderr
        assert len(proc.stderr) < 400  # the 5,000 digits are not echoed back


def test_a_fifo_nobody_writes_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(BoundedReadError, match="FIFO"):
        read_bounded(fifo)
    assert time.monotonic() - started < 10  # opening it for reading would block for ever


def test_a_pipe_on_stdin_that_never_ends_hits_the_deadline() -> None:
    """The daemon's child reads its config from stdin: a writer that never closes is bounded."""
    r, w = os.pipe()
    saved = os.dup(0)
    try:
        os.dup2(r, 0)
        os.write(w, b"expect_gpus: 1\n")
        started = time.monotonic()
        with pytest.raises(BoundedReadError, match=r"no end of file within 0\.3 s"):
            read_bounded("/dev/stdin", timeout_s=0.3)
        assert time.monotonic() - started < 10  # the writer never closes
    finally:
        os.dup2(saved, 0)
        for fd in (saved, r, w):
            os.close(fd)


def test_good_files_still_load(tmp_path: Path) -> None:
    y = tmp_path / "c.yaml"
    y.write_text("preflight:\n  expect_gpus: 8\n  watched_packages: [torch, numpy]\n"
                 "  listen: '[::1]:9857'\n")
    c = load_file(y)
    assert (c.expect_gpus, c.watched_packages, c.listen) == (8, ("torch", "numpy"), "[::1]:9857")
    t = tmp_path / "c.toml"
    t.write_text("[preflight]\ncheck_timeout_s = 5\ninterval_s = 600\n")
    assert (load_file(t).check_timeout_s, load_file(t).interval_s) == (5.0, 600.0)


def test_largest_sane_values_pass_and_one_beyond_fails() -> None:
    Config().replace(interval_s=7 * 86400, check_timeout_s=3600, expect_gpus=1024)
    with pytest.raises(ConfigError, match="interval_s must be a finite number"):
        Config().replace(interval_s=7 * 86400 + 1)


def test_diff_and_golden_refuse_streams(tmp_path: Path) -> None:
    fifo = tmp_path / "golden.json"
    os.mkfifo(fifo)
    proc = run_cli(["diff", str(fifo), "/dev/zero"], timeout=20)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"preflight diff: {fifo}: is a FIFO; expected a regular file"
    proc = run_cli(["check", "--only", "versions", "--expect-gpus", "0", "--golden", "/dev/zero",
                    "--json"], timeout=30)
    assert proc.returncode == 2  # the operator's config: refused before any check runs
    assert "configuration error: golden /dev/zero: /dev/zero: is a device; expected a regular " \
           "file" in proc.stderr
