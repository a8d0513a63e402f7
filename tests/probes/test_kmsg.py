"""The kernel log reader on the live /dev/kmsg of this machine, on fixture roots, and its
journalctl fallback (a stand-in journalctl on PATH: its output format, its exit codes, a hang)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from preflight.probes import kmsg
from preflight.probes.kernlog import parse_journal, parse_kmsg

needs_kmsg = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/dev/kmsg"),
                                reason="needs root and /dev/kmsg")


@needs_kmsg
def test_live_kmsg_reads_the_ring_buffer_from_its_start_and_returns() -> None:
    marker = f"preflight-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    # Writing to /dev/kmsg logs a line (root only): what we read must contain it, in order,
    # after records older than it, and the read must stop (EAGAIN) instead of waiting for more.
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, f"<6>{marker}\n".encode())
    finally:
        os.close(fd)
    log = kmsg.read_kernel_log(Path("/"), deadline_s=5.0)
    # not truncated: the read ended at EAGAIN, not at its deadline (waiting for more would)
    assert log.form == "kmsg" and log.source == "/dev/kmsg" and not log.truncated
    lines = list(parse_kmsg(log.text))
    texts = [ln.text for ln in lines]
    assert any(marker in t for t in texts)
    assert texts.index(next(t for t in texts if marker in t)) > 0  # older records came first
    assert all(ln.uptime_s is not None for ln in lines)  # every record parsed as a record
    # in order means in the kernel's sequence order: each record's number is above the last
    # one's (gaps are records the ring overwrote). Timestamps are not a test of order: CPUs
    # stamp records concurrently, so a real ring buffer holds neighbours a few microseconds
    # out of time order.
    seqs = [int(raw.split(",", 2)[1]) for raw in log.text.splitlines() if raw[:1].isdigit()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    uptimes = [ln.uptime_s for ln in lines if ln.uptime_s is not None]
    now = kmsg.uptime_s(Path("/"))
    assert now is not None and max(uptimes) <= now + 1


@needs_kmsg
def test_live_kmsg_size_bound_truncates() -> None:
    text, truncated = kmsg.read_kmsg(Path("/dev/kmsg"), deadline_s=5.0, max_bytes=64)
    assert truncated and 0 < len(text) < 64 + 16384


def test_fixture_file_under_root(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text("6,1,1000,-;hello\n")
    log = kmsg.read_kernel_log(tmp_path)
    assert (log.form, log.text) == ("kmsg", "6,1,1000,-;hello\n")


def _fake_journalctl(tmp_path: Path, body: str) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "journalctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_journal_fallback_when_kmsg_is_missing(tmp_path: Path) -> None:
    args = tmp_path / "args"
    fake = _fake_journalctl(tmp_path, f'echo "$@" > {args}\n'
                            "echo '[ 3600.000001] node kernel: NVRM: Xid (PCI:0000:3b:00): 48, "
                            "An uncorrectable double bit error'\n")
    log = kmsg.read_kernel_log(tmp_path, deadline_s=5.0, journalctl=fake)
    assert log.form == "journal" and log.source == "journalctl -k"
    assert log.tried and "kmsg" in log.tried[0]
    assert f"-D {tmp_path}/var/log/journal" in args.read_text()  # the host's journal under --root
    assert [ln.uptime_s for ln in parse_journal(log.text)] == [3600.000001]


def test_empty_journal_is_not_a_clean_log(tmp_path: Path) -> None:
    fake = _fake_journalctl(tmp_path, "exit 0\n")
    with pytest.raises(kmsg.KernelLogError, match="no kernel message"):
        kmsg.read_kernel_log(tmp_path, deadline_s=5.0, journalctl=fake)


def test_hung_journalctl_hits_the_deadline_and_is_named(tmp_path: Path) -> None:
    fake = _fake_journalctl(tmp_path, "exec sleep 30\n")
    t0 = time.monotonic()
    with pytest.raises(kmsg.KernelLogError, match=r"journalctl .* did not answer within"):
        kmsg.read_kernel_log(tmp_path, deadline_s=1.0, journalctl=fake)
    assert time.monotonic() - t0 < 20  # journalctl sleeps 30 s; the deadline is 1 s


def test_nothing_readable_names_both_sources(tmp_path: Path) -> None:
    fake = _fake_journalctl(
        tmp_path, "echo 'Failed to open /x: No such file or directory' >&2; exit 1\n")
    with pytest.raises(kmsg.KernelLogError) as info:
        kmsg.read_kernel_log(tmp_path, deadline_s=5.0, journalctl=fake)
    assert "kmsg: No such file or directory" in str(info.value)
    assert "exited 1: Failed to open /x" in str(info.value)
