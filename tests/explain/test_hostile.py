"""Hostile and awkward inputs to ``preflight explain``, through the real CLI: control characters
from a log never reach the terminal raw, UTF-16/UTF-32 and gzip/zstd logs are read as zcat would,
a file that cannot be read is named in one line, capped ranks are said."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.cli import main

OOM = "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
WATCHDOG = ("[rank0]:[E1130 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1024, "
            "NumelOut=1024, Timeout(ms)=15000) ran for 15002 milliseconds before timing out.\n")
LOG = "step 1\n" + OOM + WATCHDOG


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "preflight", "explain", *args],
                          capture_output=True, timeout=60, check=False)


def reasons(out: bytes) -> list[str]:
    return [f["reason"] for f in json.loads(out)["findings"]]


def test_control_characters_from_a_log_are_escaped_in_text_and_kept_in_json(
        tmp_path: Path) -> None:
    evil = ("\x1b]0;owned\x07\x1b[2J[rank1]: RuntimeError: CUDA out of memory\x08\x08\x00 "
            "\x9b31m\n")
    log = tmp_path / "job\x1b[1m.log"
    log.write_text(evil, encoding="utf-8")
    text = cli(str(log))
    assert text.returncode == 1
    for raw in (b"\x1b", b"\x07", b"\x08", b"\x00", "\x9b".encode()):
        assert raw not in text.stdout
    assert b"\\e]0;owned\\x07\\e[2J" in text.stdout and b"\\x08\\x08\\x00" in text.stdout
    assert b"job\\e[1m.log" in text.stdout
    data = json.loads(cli("--json", str(log)).stdout)
    assert data["findings"][0]["evidence"][0]["text"] == evil.rstrip("\n")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32", "utf-32-be"])
def test_utf16_and_utf32_logs_with_a_bom_are_read(tmp_path: Path, encoding: str) -> None:
    """PowerShell's ``> job.log`` writes UTF-16 LE with a byte-order mark."""
    bom = {"utf-16-be": b"\xfe\xff", "utf-32-be": b"\x00\x00\xfe\xff"}.get(encoding, b"")
    path = tmp_path / "job.log"
    path.write_bytes(bom + LOG.encode(encoding))
    out = cli("--json", str(path))
    assert reasons(out.stdout) == ["CudaOutOfMemory", "CollectiveTimeout"]
    assert json.loads(out.stdout)["findings"][0]["evidence"][0]["line"] == 2


def test_gzip_with_several_members_is_read_as_zcat_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "job.log.gz"
    path.write_bytes(gzip.compress(b"step 1\n" + OOM.encode()) + gzip.compress(
        WATCHDOG.encode()))
    assert reasons(cli("--json", str(path)).stdout) == ["CudaOutOfMemory", "CollectiveTimeout"]
    # the content decides, not the name
    renamed = tmp_path / "plain-looking.log"
    renamed.write_bytes(path.read_bytes())
    assert reasons(cli("--json", str(renamed)).stdout) == ["CudaOutOfMemory",
                                                           "CollectiveTimeout"]


def test_zstd_is_read_with_the_zstandard_package(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    path = tmp_path / "job.log.zst"
    c = zstandard.ZstdCompressor()
    path.write_bytes(c.compress(b"step 1\n" + OOM.encode()) + c.compress(WATCHDOG.encode()))
    assert reasons(cli("--json", str(path)).stdout) == ["CudaOutOfMemory", "CollectiveTimeout"]


def test_zstd_without_a_decoder_says_why_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "job.log.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 32)
    code = ("import sys; sys.modules['zstandard'] = None; sys.modules['compression'] = None; "
            "from preflight.cli import main; raise SystemExit(main(['explain', sys.argv[1]]))")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("not read:")]
    assert "zstd-compressed, and no zstd decoder is installed (pip install zstandard" in line


def test_a_truncated_gzip_keeps_what_was_read_and_says_where_it_broke(tmp_path: Path) -> None:
    whole = gzip.compress(("step 1\n" * 20000 + OOM + "x" * 80 + "\n").encode() * 4,
                          compresslevel=1)
    path = tmp_path / "job.log.gz"
    path.write_bytes(whole[:len(whole) - 64])
    out = cli("--json", str(path))
    data = json.loads(out.stdout)
    assert data["unread"] and "gzip data is truncated or corrupt" in data["unread"][0]["why"]
    assert out.returncode in (1, 2)
    broken = tmp_path / "broken.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage-garbage-garbage")
    proc = cli(str(broken))
    assert proc.returncode == 2 and b"Traceback" not in proc.stdout + proc.stderr
    assert b"not read: " in proc.stdout


def test_more_ranks_than_tracked_is_said(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.log"
    path.write_text("".join(f"[rank{r}]: step 1\n" for r in range(5000)) + OOM)
    assert main(["explain", str(path)]) == 1
    out = capsys.readouterr().out
    assert "note: more than 4,096 ranks: only the first 4,096 are tracked" in out
    assert main(["explain", "--json", str(path)]) == 1
    assert json.loads(capsys.readouterr().out)["notes"]


def test_a_directory_stands_for_the_files_under_it(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "attempt_0" / "3").mkdir(parents=True)
    (tmp_path / "attempt_0" / "3" / "stderr.log").write_text(OOM.replace("[rank3]: ", ""))
    (tmp_path / "attempt_0" / "0").mkdir()
    (tmp_path / "attempt_0" / "0" / "stderr.log").write_text(WATCHDOG)
    assert main(["explain", "--json", str(tmp_path)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [f["reason"] for f in data["findings"]] == ["CudaOutOfMemory", "CollectiveTimeout"]
    assert data["findings"][0]["ranks"] == [3]
    assert len(data["sources"]) == 2


def test_a_json_lines_log_that_starts_like_a_dump_is_read_as_a_log(tmp_path: Path) -> None:
    path = tmp_path / "events.log"
    path.write_text('{"version": 1, "msg": "start"}\n{"msg": "' + OOM.strip() + '"}\n')
    data = json.loads(cli("--json", str(path)).stdout)
    assert [f["reason"] for f in data["findings"]] == ["CudaOutOfMemory"]
    assert data["unread"] == []
