"""Which processes hold given files open or mapped, and whose they are (user, Slurm job, pod).

Read from ``<proc>/*/fd`` (each descriptor's link, then ``stat`` through it: the file's device and
inode, which name it in any mount namespace, deleted or not) and ``<proc>/*/maps`` (a mapping
names its file's device and inode itself). ``<proc>`` is the ``--root``'s ``/proc``, so from a
container with the host's ``/proc`` under ``/host`` the host's processes are seen. A process whose
descriptors cannot be read (another user's, without root) is counted, not guessed at, so a caller
can tell "nobody holds it" from "nobody that could be seen holds it".

For each holder: its pid, command line, user, session and process group (``stat``), and its cgroup,
from which :func:`job_of_cgroup` tells a Slurm job, a Kubernetes pod, a container or a systemd
unit. Every text read here is the process's own (a command line can hold anything) and is made
printable (:func:`preflight.core.textsafe.escape`) and bounded.

Used by the ``shm`` check (is the space in ``/dev/shm`` held by a live process, or left over?) and
the daemon (which process still holds the check child's output pipe). Pure parsers first, the one
scan after them.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from preflight.core.boundedio import read_small
from preflight.core.textsafe import escape

#: Most of one process's ``maps`` read (a process with 100,000 mappings has ~10 MB of them).
MAPS_MAX_BYTES = 4 << 20
#: Most of a command line shown.
COMMAND_MAX_CHARS = 160
#: Most descriptors looked at per process (a server with a million sockets costs no more).
FDS_PER_PROCESS_MAX = 65536
#: Largest passwd file read.
PASSWD_MAX_BYTES = 4 << 20


@dataclass(frozen=True, order=True)
class FileId:
    """A file as the kernel names it: ``st_dev`` and ``st_ino``."""

    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileId:
        return cls(st.st_dev, st.st_ino)


@dataclass(frozen=True)
class Wanted:
    """The files asked about: these files, and any file on these devices (a whole tmpfs)."""

    files: frozenset[FileId] = frozenset()
    devices: frozenset[int] = frozenset()

    def __contains__(self, file: object) -> bool:
        return isinstance(file, FileId) and (file in self.files or file.dev in self.devices)


@dataclass(frozen=True)
class Held:
    """One wanted file a process holds.

    Attributes:
        file: which file.
        path: its path as the holder sees it (from the descriptor link or the mapping; escaped).
        bytes: the space it takes (``st_blocks`` x 512) when read through a descriptor; None when
            only mapped.
        deleted: the file was removed but lives on while held.
    """

    file: FileId
    path: str
    bytes: int | None
    deleted: bool


@dataclass(frozen=True)
class Holder:
    """A process that holds at least one wanted file.

    Attributes:
        pid: its pid (in the pid namespace of the ``proc`` read).
        uid: its owner (the owner of ``<proc>/PID``); None when unreadable.
        user: the user name from ``<root>/etc/passwd``; None when not found there.
        command: its command line (NULs as spaces), escaped and bounded.
        cgroup: its cgroup path that tells its job, else its first (:func:`parse_cgroup`),
            escaped; "" when unreadable or the root.
        job: what the cgroup tells (:func:`job_of_cgroup`), e.g. ``Slurm job 4242``; None.
        session: its session id; None when unreadable.
        pgid: its process group; None when unreadable.
        files: what it holds.
    """

    pid: int
    uid: int | None
    user: str | None
    command: str
    cgroup: str
    job: str | None
    session: int | None
    pgid: int | None
    files: tuple[Held, ...]

    def describe(self) -> str:
        """``pid 4242 (python train.py) of alice (uid 1000), Slurm job 77``."""
        who = (f"{self.user} (uid {self.uid})" if self.user and self.uid is not None else
               f"uid {self.uid}" if self.uid is not None else "an unknown user")
        job = f", {self.job}" if self.job else ""
        return f"pid {self.pid} ({self.command or '?'}) of {who}{job}"


@dataclass(frozen=True)
class HolderScan:
    """The result of one scan.

    Attributes:
        holders: the processes holding a wanted file, by pid.
        processes: processes looked at.
        unreadable: processes whose descriptors could not be read (permission; they may hold
            wanted files unseen).
        complete: every process was looked at (the deadline did not cut the scan short, and
            ``proc`` could be listed).
        error: why ``proc`` could not be listed; None when it could.
    """

    holders: tuple[Holder, ...]
    processes: int
    unreadable: int
    complete: bool
    error: str | None = None

    @property
    def seen_all(self) -> bool:
        """Nothing could hold a wanted file unseen: the scan was complete and nothing was
        unreadable."""
        return self.complete and self.unreadable == 0

    def held(self) -> dict[FileId, Held]:
        """Every wanted file some process holds (the entry with a known size preferred)."""
        out: dict[FileId, Held] = {}
        for holder in self.holders:
            for h in holder.files:
                if h.file not in out or out[h.file].bytes is None:
                    out[h.file] = h
        return out


# --------------------------------------------------------------------------- pure parsing

_MAPS = re.compile(rb"^[0-9a-f]+-[0-9a-f]+ \S+ [0-9a-f]+ ([0-9a-f]+):([0-9a-f]+) (\d+)\s*(.*)$")


def parse_maps(text: bytes) -> list[tuple[FileId, str, bool]]:
    """``(file, path, deleted)`` of each file-backed line of ``/proc/PID/maps`` (anonymous
    mappings, inode 0, are left out; a malformed line is skipped)."""
    out = []
    for line in text.splitlines():
        m = _MAPS.match(line)
        if not m or m.group(3) == b"0":
            continue
        path = m.group(4).decode(errors="replace")
        deleted = path.endswith(" (deleted)")
        dev = os.makedev(int(m.group(1), 16), int(m.group(2), 16))
        out.append((FileId(dev, int(m.group(3))), path.removesuffix(" (deleted)"), deleted))
    return out


def parse_stat(text: bytes) -> tuple[int, int, int] | None:
    """``(ppid, pgid, session)`` from ``/proc/PID/stat``; None when malformed. The command name
    (field 2, in parentheses) may hold spaces and parentheses: fields are counted after the last
    ``)``."""
    _, sep, rest = text.rpartition(b")")
    fields = rest.split()
    if not sep or len(fields) < 4:
        return None
    try:
        return int(fields[1]), int(fields[2]), int(fields[3])
    except ValueError:
        return None


def parse_cgroup(text: bytes) -> list[str]:
    """The cgroup paths of ``/proc/PID/cgroup``, the v2 entry (``0::/path``) first, then each v1
    hierarchy's, without repeats or the bare root ``/`` (on a hybrid host the v2 path is ``/``
    while Slurm's v1 hierarchies hold ``/slurm/uid_U/job_N``)."""
    v2: list[str] = []
    v1: list[str] = []
    for line in text.decode(errors="replace").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if sep and path and path != "/":
            (v2 if hierarchy == "0" and controllers == "" else v1).append(path)
    return list(dict.fromkeys(v2 + v1))


def job_of_cgroups(paths: Iterable[str]) -> tuple[str, str | None]:
    """``(cgroup, job)``: the first of ``paths`` that tells a job (:func:`job_of_cgroup`), else
    the first path and None; ``("", None)`` for none."""
    paths = list(paths)
    for path in paths:
        job = job_of_cgroup(path)
        if job:
            return path, job
    return (paths[0] if paths else ""), None


_SLURM = re.compile(r"/job_(\d+)(?:/|$)")
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER = re.compile(r"(?:docker|cri-containerd|crio|libpod)[-/]([0-9a-f]{12})[0-9a-f]*"
                        r"(?:\.scope)?(?:/|$)")
_SESSION = re.compile(r"/user-(\d+)\.slice/session-([^/]+)\.scope")
_UNIT = re.compile(r"/([^/]+\.service)(?:/|$)")


def job_of_cgroup(path: str) -> str | None:
    """What a cgroup path says a process belongs to: ``Slurm job N`` (``.../job_N/...``, cgroup v1
    and v2), ``Kubernetes pod UID`` (systemd and cgroupfs drivers), ``container ID12`` (Docker,
    containerd, CRI-O, Podman), ``login session S of uid U``, ``systemd unit NAME``; None when it
    says nothing."""
    if m := _SLURM.search(path):
        return f"Slurm job {m.group(1)}"
    if m := _POD.search(path):
        return f"Kubernetes pod {m.group(1).replace('_', '-')}"
    if m := _CONTAINER.search(path):
        return f"container {m.group(1)}"
    if m := _SESSION.search(path):
        return f"login session {m.group(2)} of uid {m.group(1)}"
    if m := _UNIT.search(path):
        return f"systemd unit {m.group(1)}"
    return None


def parse_passwd(text: bytes) -> dict[int, str]:
    """``{uid: name}`` from a passwd file (malformed lines skipped; the first name of a uid)."""
    users: dict[int, str] = {}
    for line in text.decode(errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit() and fields[0]:
            users.setdefault(int(fields[2]), fields[0])
    return users


def command_text(cmdline: bytes, comm: bytes = b"") -> str:
    """A command line for a person: NUL-separated arguments joined by spaces, escaped, bounded;
    the kernel's short name (``comm``) in brackets when the command line is empty (a kernel
    thread, a zombie)."""
    words = [w.decode(errors="replace") for w in cmdline.split(b"\0") if w]
    if words:
        return escape(" ".join(words), COMMAND_MAX_CHARS)
    name = comm.strip().decode(errors="replace")
    return f"[{escape(name, 32)}]" if name else ""


# --------------------------------------------------------------------------- the scan


def _read_or_empty(path: Path, max_bytes: int = 64 << 10) -> bytes:
    try:
        return read_small(path, max_bytes=max_bytes, cut=True)
    except OSError:
        return b""


def _held_through_fds(fd_dir: Path, wanted: Wanted) -> list[Held]:
    found: list[Held] = []
    with os.scandir(fd_dir) as entries:
        for n, entry in enumerate(entries):
            if n >= FDS_PER_PROCESS_MAX:
                break
            try:
                link = os.readlink(entry.path)
            except OSError:
                continue
            if link.startswith(("socket:", "anon_inode:")):
                continue  # never a file (and a node has many): no stat for them
            try:
                st = os.stat(entry.path)  # through the magic link: the file itself
            except OSError:
                continue
            file = FileId.of(st)
            if file in wanted:
                deleted = link.endswith(" (deleted)")
                found.append(Held(file, escape(link.removesuffix(" (deleted)"), 300),
                                  st.st_blocks * 512, deleted))
    return found


def describe_process(proc: str | os.PathLike[str], pid: int, files: Iterable[Held] = (),
                     users: Mapping[int, str] | None = None) -> Holder:
    """Process ``pid`` under ``proc`` as a :class:`Holder` of ``files`` (its command, owner,
    session, cgroup and job read now; names from ``users``)."""
    base = Path(proc) / str(pid)
    users = users or {}
    files = list(files)
    try:
        uid: int | None = os.stat(base).st_uid
    except OSError:
        uid = None
    ids = parse_stat(_read_or_empty(base / "stat"))
    cgroup, job = job_of_cgroups(parse_cgroup(_read_or_empty(base / "cgroup")))
    unique = {h.file: h for h in reversed(files)}  # the first entry of each file wins
    return Holder(pid=pid, uid=uid, user=users.get(uid) if uid is not None else None,
                  command=command_text(_read_or_empty(base / "cmdline", 4096),
                                       _read_or_empty(base / "comm", 64)),
                  cgroup=escape(cgroup, 300), job=job,
                  session=ids[2] if ids else None, pgid=ids[1] if ids else None,
                  files=tuple(sorted(unique.values(), key=lambda h: h.file)))


def find_holders(proc: str | os.PathLike[str], wanted: Wanted, *, maps: bool = True,
                 passwd: str | os.PathLike[str] | None = None, deadline_s: float = 5.0,
                 skip_pids: Iterable[int] = (),
                 clock: Callable[[], float] = time.monotonic) -> HolderScan:
    """The processes under ``proc`` (``ctx.host_path("/proc")``) holding a ``wanted`` file
    through a descriptor or (``maps``) a mapping.

    Args:
        passwd: where user names are read (default: ``etc/passwd`` beside ``proc``).
        deadline_s: stop looking after this long (``complete`` is then False).
        skip_pids: processes not to report (the caller itself).
    """
    base = Path(proc)
    stop_at = clock() + deadline_s
    skip = {str(p) for p in skip_pids}
    try:
        pids = sorted((p for p in os.listdir(base) if p.isdigit() and p not in skip), key=int)
    except OSError as exc:
        return HolderScan((), 0, 0, False, f"cannot list {base}: {exc.strerror or exc}")
    tokens = [f" {os.major(dev):02x}:{os.minor(dev):02x} ".encode()
              for dev in {*wanted.devices, *(f.dev for f in wanted.files)}]
    found: dict[int, list[Held]] = {}
    looked = unreadable = 0
    complete = True
    for pid in pids:
        if clock() > stop_at:
            complete = False
            break
        looked += 1
        held: list[Held] = []
        try:
            held += _held_through_fds(base / pid / "fd", wanted)
        except FileNotFoundError:
            continue  # it exited meanwhile
        except OSError:
            unreadable += 1
        if maps:
            text = _read_or_empty(base / pid / "maps", MAPS_MAX_BYTES)
            # Most processes map nothing of the wanted devices: one substring test each.
            if any(token in text for token in tokens):
                held += [Held(file, escape(path, 300), None, deleted)
                         for file, path, deleted in parse_maps(text) if file in wanted]
        if held:
            found[int(pid)] = held
    users: dict[int, str] = {}
    if found:
        users = parse_passwd(_read_or_empty(Path(passwd) if passwd else
                                            base.parent / "etc" / "passwd", PASSWD_MAX_BYTES))
    holders = tuple(describe_process(base, pid, files, users)
                    for pid, files in sorted(found.items()))
    return HolderScan(holders, looked, unreadable, complete)


def session_members(proc: str | os.PathLike[str], session: int) -> list[int]:
    """Pids under ``proc`` whose session id is ``session`` (a process group that left its
    session's group by ``setpgid`` is still in the session; one that called ``setsid`` is not)."""
    base = Path(proc)
    try:
        pids = [p for p in os.listdir(base) if p.isdigit()]
    except OSError:
        return []
    members = []
    for pid in pids:
        ids = parse_stat(_read_or_empty(base / pid / "stat"))
        if ids is not None and ids[2] == session:
            members.append(int(pid))
    return sorted(members)


__all__ = ["FileId", "Held", "Holder", "HolderScan", "Wanted", "command_text", "describe_process",
           "find_holders", "job_of_cgroup", "job_of_cgroups", "parse_cgroup", "parse_maps",
           "parse_passwd", "parse_stat", "session_members"]
