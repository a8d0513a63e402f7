"""The state file under real concurrent processes: no update lost, no reader sees half a file,
a stuck holder of the lock is a bounded error, an unsafe directory is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from preflight.core.state import StateError, StateFile, boot_id, check_dir
from tests.helpers import REPO

_WRITER = """
import sys
from preflight.core.state import StateFile
state = StateFile(sys.argv[1], "counter")
for _ in range(int(sys.argv[2])):
    with state.update(timeout_s=30) as data:
        data["n"] = data.get("n", 0) + 1
        data.setdefault("by", []).append(sys.argv[3])
        # a big-ish object, so a torn write would show as invalid JSON
        data["pad"] = "x" * 20000
"""

_READER = """
import sys, time
from preflight.core.state import StateFile
state = StateFile(sys.argv[1], "counter")
seen = 0
end = time.monotonic() + 60
reads = 0
while seen < int(sys.argv[2]) and time.monotonic() < end:
    data = state.read()          # raises StateError on a torn or corrupt file
    seen = max(seen, data.get("n", 0))
    reads += 1
print(seen, reads)
"""


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def test_concurrent_writers_lose_no_update_and_readers_never_see_half_a_file(
        tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    writers = [_python(_WRITER, str(state_dir), "25", f"w{i}") for i in range(4)]
    reader = _python(_READER, str(state_dir), "100")
    for w in writers:
        _, err = w.communicate(timeout=60)
        assert w.returncode == 0, err
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    data = StateFile(state_dir, "counter").read()
    assert data["n"] == 100
    assert sorted(set(data["by"])) == ["w0", "w1", "w2", "w3"]
    assert all(data["by"].count(f"w{i}") == 25 for i in range(4))
    seen, reads = map(int, out.split())
    assert seen == 100 and reads > 1
    # no temporary file is left behind by the renames
    assert sorted(p.name for p in state_dir.iterdir()) == ["counter.json", "counter.lock"]


def test_a_held_lock_is_a_bounded_error(tmp_path: Path) -> None:
    holder = _python("""
import sys, time
from preflight.core.state import StateFile
with StateFile(sys.argv[1], "h").update():
    print("locked", flush=True)
    time.sleep(30)
""", str(tmp_path))
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with pytest.raises(StateError, match="held by another preflight run"), \
                StateFile(tmp_path, "h").update(timeout_s=0.3):
            pass
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()
    # the holder died: its lock went with it
    with StateFile(tmp_path, "h").update(timeout_s=1) as data:
        data["ok"] = True
    assert StateFile(tmp_path, "h").read() == {"ok": True}


def test_corrupt_state_is_an_error_to_read_and_replaced_by_an_update(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text('{"n": 3')
    with pytest.raises(StateError, match="not JSON"):
        StateFile(tmp_path, "s").read()
    with StateFile(tmp_path, "s").update() as data:
        assert data == {}
        data["n"] = 1
    assert json.loads((tmp_path / "s.json").read_text()) == {"n": 1}
    (tmp_path / "s.json").write_text("[1, 2]")
    with pytest.raises(StateError, match="not a JSON object"):
        StateFile(tmp_path, "s").read()


def test_missing_state_is_empty_and_the_directory_is_created_on_update(tmp_path: Path) -> None:
    where = tmp_path / "a" / "b"
    with pytest.raises(StateError, match="does not exist"):
        StateFile(where, "x").read()
    with StateFile(where, "x").update() as data:
        data["k"] = "v"
    assert StateFile(where, "x").read() == {"k": "v"}
    assert (where.stat().st_mode & 0o777) == 0o755


@pytest.mark.parametrize("kind", ["world-writable", "symlink", "file"])
def test_an_unsafe_state_dir_is_refused(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "d"
    if kind == "world-writable":
        target.mkdir()
        target.chmod(0o777)
        words = "writable by group or others"
    elif kind == "symlink":
        real = tmp_path / "real"
        real.mkdir()
        target.symlink_to(real)
        words = "not a directory"
    else:
        target.write_text("")
        words = "not a directory"
    with pytest.raises(StateError, match=words):
        check_dir(target, create=True)
    with pytest.raises(StateError), StateFile(target, "x").update():
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_state_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()
    os.chown(target, 12345, 12345)
    with pytest.raises(StateError, match="belongs to uid 12345"):
        StateFile(target, "x").read()


def test_boot_id(tmp_path: Path) -> None:
    assert boot_id(Path("/")) is None or len(boot_id(Path("/")) or "") == 36
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    boot = "0d7e0c6e-1a2b-4c3d-8e9f-001122334455"
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    assert boot_id(tmp_path) == boot
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("../../etc\n")
    assert boot_id(tmp_path) is None
