"""PyTorch's flight recorder dumps, read without executing anything, matched across ranks.

With the flight recorder on (``TORCH_FR_BUFFER_SIZE=N``, older torch
``TORCH_NCCL_TRACE_BUFFER_SIZE``) each rank keeps its last N collectives; on a watchdog timeout
(``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) ProcessGroupNCCL writes them to
``${TORCH_FR_DUMP_TEMP_FILE}<rank>`` (older ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, default
``/tmp/nccl_trace_rank_``), and any backend's can be taken on demand
(``torch._C._distributed_c10d._dump_fr_trace()``, ``_dump_fr_trace_json()``). docs/explain.md
says which torch writes what.

A dump is a pickle of plain data (dicts, lists, strings, numbers) or the same as JSON. A pickle
can name any class and so run any code when loaded: here its opcodes are checked first, and one
that names a class (GLOBAL, STACK_GLOBAL, INST), builds an object (REDUCE, BUILD, NEWOBJ, OBJ)
or uses an extension or persistent id is refused in one line, before anything is loaded (and
the loader itself refuses every class as a second guard).

Across ranks, per process group: the ranks that never entered collective N that the others
entered (and what N was: op, sizes, dtypes, the user's frame), the collective each rank was in
last, and collectives where ranks disagree on the op or the sizes. The result is diagnoses in
the ``communication`` layer, beside the logs' own.
"""

from __future__ import annotations

import json
import pickle
import pickletools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from preflight.explain.model import Detail, Diagnosis, Evidence
from preflight.explain.ranks import compress, plural
from preflight.explain.rules import Layer

#: A dump larger than this is refused (torch's default 2,000 entries with stacks: a few MB).
MAX_DUMP_BYTES = 256 << 20
#: Ranks and entries kept per dump.
MAX_ENTRIES = 100_000
#: Opcodes of plain data. Everything else (classes, object building, extensions, persistent
#: ids, out-of-band buffers) is refused.
PLAIN_OPS = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1",
    "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE",
    "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "EMPTY_LIST", "APPEND", "APPENDS", "LIST", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
})
_CLASS_OPS = frozenset({"GLOBAL", "INST", "STACK_GLOBAL"})
_RANK_IN_NAME = re.compile(r"(\d{1,7})(?:\.(?:json|pkl|pickle|bin))?$")
#: Collectives whose sizes every rank must agree on (gather / scatter / all_to_all differ by
#: design between the root and the others, or by split).
SIZED_OPS = frozenset({"all_reduce", "allreduce", "broadcast", "reduce", "all_gather",
                       "allgather", "_allgather_base", "all_gather_into_tensor",
                       "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor",
                       "allreduce_coalesced", "barrier"})

NOT_JOINED = "CollectiveNotJoined"
STUCK = "CollectiveStuck"
MISMATCH = "CollectiveMismatch"
REMEDY_NOT_JOINED = (
    "the named ranks never called that collective: look at what they did instead (their own "
    "log, their last collective's stack below: a branch only some ranks take, a rank still in "
    "data loading or a checkpoint, a rank that died; `py-spy dump --pid PID` on a live one); "
    "every rank must call the same collectives in the same order on each process group")
REMEDY_STUCK = (
    "the collective was entered and never completed: with every rank of the group in it, the "
    "transport hung (a link, a NIC, a GPU: `preflight check` on those nodes, NCCL_DEBUG=INFO); "
    "with only some ranks' dumps at hand, get the others' (same TORCH_FR_DUMP_TEMP_FILE "
    "prefix on every node) to see who did not enter it")
REMEDY_MISMATCH = (
    "the ranks called different collectives (or with different sizes) at the same position of "
    "one process group: make every rank call the same op with the same shapes in the same "
    "order (a rank-dependent branch, uneven last batches, a model built differently per rank); "
    "`TORCH_DISTRIBUTED_DEBUG=DETAIL` checks this at every call")


class DumpRefused(Exception):
    """A dump that is not read: the message is one line saying why."""


@dataclass(frozen=True)
class FrEntry:
    """One recorded collective (or point-to-point op) of one rank."""

    index: int
    pg_name: str
    pg_desc: str
    seq: int
    p2p_seq: int
    is_p2p: bool
    op: str
    input_sizes: Any
    output_sizes: Any
    input_dtypes: Any
    state: str
    retired: bool | None
    frame: str

    @property
    def short_op(self) -> str:
        """``nccl:all_reduce`` -> ``all_reduce``."""
        return self.op.split(":", 1)[-1]

    def describe(self) -> str:
        sizes = json.dumps(self.input_sizes, separators=(",", ":"))[:200]
        dtypes = ",".join(str(d) for d in self.input_dtypes) if isinstance(
            self.input_dtypes, list) else ""
        where = f" at {self.frame}" if self.frame else ""
        return (f"#{self.seq} {self.op} input sizes {sizes}{' ' + dtypes if dtypes else ''}, "
                f"state {self.state}{where}")


@dataclass(frozen=True)
class RankDump:
    """One rank's dump: its collectives oldest first, its groups' members where recorded."""

    source: str
    rank: int
    version: str
    entries: tuple[FrEntry, ...]
    groups: Mapping[str, tuple[int, ...]]


def sniff(head: bytes) -> str | None:
    """``"pickle"`` or ``"json"`` when ``head`` (a file's first bytes) looks like a dump."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    text = head.lstrip()[:64]
    for key in (b'{"comm_lib_version"', b'{"entries"', b'{"nccl_comm_state"', b'{"pg_config"',
                b'{"pg_status"', b'{"version"'):
        if text.startswith(key):
            return "json"
    return None


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise DumpRefused(f"the pickle names the class {module}.{name}: refused, nothing "
                          "executed")


def _check_opcodes(data: bytes) -> None:
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in _CLASS_OPS:
                name = (str(arg).replace(" ", ".") if op.name != "STACK_GLOBAL" else
                        ".".join(strings[-2:]) or "?")
                raise DumpRefused(f"the pickle names the class {name}: refused, nothing "
                                  "executed (a flight recorder dump holds plain data only)")
            if op.name not in PLAIN_OPS:
                raise DumpRefused(f"the pickle uses opcode {op.name}: refused, nothing "
                                  "executed (a flight recorder dump holds plain data only)")
            if isinstance(arg, str):
                strings = [*strings[-1:], arg]
    except ValueError as exc:
        raise DumpRefused(f"not a whole pickle (truncated or corrupt: {exc})") from None


def _load(data: bytes, kind: str) -> Any:
    if kind == "pickle":
        _check_opcodes(data)
        import io
        try:
            return _NoClasses(io.BytesIO(data)).load()
        except DumpRefused:
            raise
        except Exception as exc:
            raise DumpRefused(f"not a whole pickle ({type(exc).__name__}: {exc})") from None
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except RecursionError:
        raise DumpRefused("JSON nested too deeply") from None
    except ValueError as exc:
        raise DumpRefused(f"not whole JSON (truncated or corrupt: {exc})") from None


def _int(value: Any, default: int = -1) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) < 20:
        return int(value)
    return default


def _str(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)[:200]


def _ranks_of(text: Any) -> tuple[int, ...]:
    if isinstance(text, list):
        return tuple(r for r in (_int(x) for x in text[:MAX_ENTRIES]) if r >= 0)
    if not isinstance(text, str):
        return ()
    return tuple(int(x) for x in re.findall(r"\d{1,7}", text[:1 << 20]))


def _frame(frames: Any) -> str:
    """The innermost frame outside torch itself: where the user's code called the op."""
    if not isinstance(frames, list):
        return ""
    for f in frames[:64]:
        if not isinstance(f, dict):
            continue
        name, file = _str(f.get("name")), _str(f.get("filename"))
        if "/torch/" in file or file.startswith("torch/"):
            continue
        return f"{name} {file}:{_int(f.get('line'), 0)}"
    return ""


def _entry(i: int, e: Any) -> FrEntry | None:
    if not isinstance(e, dict):
        return None
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) >= 2:
        pg_name, pg_desc = _str(pg[0]), _str(pg[1])
    else:
        pg_name, pg_desc = _str(e.get("pg_id", "")), ""
    seq = _int(e.get("collective_seq_id", e.get("seq_id")))
    return FrEntry(
        index=_int(e.get("record_id"), i), pg_name=pg_name, pg_desc=pg_desc, seq=seq,
        p2p_seq=_int(e.get("p2p_seq_id"), 0), is_p2p=e.get("is_p2p") is True,
        op=_str(e.get("profiling_name")), input_sizes=e.get("input_sizes", e.get("sizes")),
        output_sizes=e.get("output_sizes"), input_dtypes=e.get("input_dtypes"),
        state=_str(e.get("state")), retired=e.get("retired") if isinstance(
            e.get("retired"), bool) else None, frame=_frame(e.get("frames")))


def load_dump(data: bytes, source: str) -> RankDump:
    """One rank's dump from its bytes; the rank from the dump or the file name's last digits.

    Raises:
        DumpRefused: too large, not plain data, truncated, or not a flight recorder dump.
    """
    if len(data) > MAX_DUMP_BYTES:
        raise DumpRefused(f"{len(data):,} bytes, more than the {MAX_DUMP_BYTES >> 20} MiB a "
                          "dump is read to")
    kind = sniff(data[:64])
    if kind is None:
        raise DumpRefused("not a flight recorder dump (neither its pickle nor its JSON form)")
    raw = _load(data, kind)
    if isinstance(raw, list):  # the first dumps (torch 2.2) were a bare list of entries
        raw = {"entries": raw}
    if not isinstance(raw, dict) or not isinstance(raw.get("entries", []), list):
        raise DumpRefused("not a flight recorder dump (no list of entries)")
    rank = _int(raw.get("rank"))
    if rank < 0:
        m = _RANK_IN_NAME.search(source)
        if m is None:
            raise DumpRefused("cannot tell its rank: the dump does not say and the file name "
                              "does not end in the rank (torch names them PREFIX<rank>)")
        rank = int(m.group(1))
    entries = tuple(x for x in (_entry(i, e) for i, e in enumerate(
        raw.get("entries", [])[:MAX_ENTRIES])) if x is not None)
    groups: dict[str, tuple[int, ...]] = {}
    config = raw.get("pg_config")
    if isinstance(config, dict):
        for name, info in list(config.items())[:MAX_ENTRIES]:
            if isinstance(info, dict) and _str(name):
                ranks = _ranks_of(info.get("ranks"))
                if ranks:
                    groups[_str(name)] = ranks
    return RankDump(source, rank, _str(raw.get("version")), entries, groups)


def _group_label(name: str, desc: str) -> str:
    return f"process group {name} ({desc})" if desc and desc != "undefined" else (
        f"process group {name}")


def analyse(dumps: Iterable[RankDump]) -> tuple[list[Diagnosis], list[str]]:
    """Diagnoses (never-entered collectives, mismatches) and notes for a set of dumps."""
    by_rank: dict[int, RankDump] = {}
    notes: list[str] = []
    for d in dumps:
        if d.rank in by_rank:
            notes.append(f"flight recorder: two dumps for rank {d.rank} ({by_rank[d.rank].source}"
                         f", {d.source}): the first is used")
            continue
        by_rank[d.rank] = d
    if not by_rank:
        return [], notes
    groups: dict[str, str] = {}
    members: dict[str, set[int]] = {}
    for d in by_rank.values():
        for e in d.entries:
            groups.setdefault(e.pg_name, e.pg_desc)
        for name, ranks in d.groups.items():
            members.setdefault(name, set()).update(ranks)
    findings: list[Diagnosis] = []
    quiet: list[str] = []
    for name in sorted(groups, key=lambda n: (_int(n, 1 << 30), n)):
        desc = groups[name]
        found = _group(name, desc, by_rank, members.get(name, set()), notes)
        findings.extend(found)
        if not found:
            quiet.append(name)
    versions = sorted({d.version for d in by_rank.values() if d.version})
    if not findings:
        notes.append(f"flight recorder: {len(by_rank)} dump{'s' if len(by_rank) != 1 else ''} "
                     f"(ranks {compress(list(by_rank))}, format {', '.join(versions) or '?'}): "
                     "every rank entered the same collectives of every process group; "
                     "nothing points at one rank")
    return findings, notes


def _group(name: str, desc: str, by_rank: Mapping[int, RankDump], recorded: set[int],
           notes: list[str]) -> list[Diagnosis]:
    label = _group_label(name, desc)
    per_rank: dict[int, dict[int, FrEntry]] = {}
    for r, d in by_rank.items():
        seqs = {e.seq: e for e in d.entries if e.pg_name == name and not e.is_p2p and e.seq >= 0}
        if seqs or r in recorded:
            per_rank[r] = seqs
    # gloo records no members (torch 2.13): the default group has every dumped rank
    default = desc == "default_pg" or (name == "0" and not desc)
    if default:
        per_rank.update({r: per_rank.get(r, {}) for r in by_rank})
    missing_dumps = sorted(recorded - set(by_rank))
    if missing_dumps:
        notes.append(f"flight recorder: no dump from {plural('rank', missing_dumps)} of {label}"
                     " (dead before the dump, or the dump is elsewhere)")
    out: list[Diagnosis] = []
    last = {r: max(s) if s else 0 for r, s in per_rank.items()}
    top = max(last.values(), default=0)
    behind = sorted((r for r, v in last.items() if v < top), key=lambda r: (last[r], r))
    if behind:
        out.append(_not_joined(name, desc, label, by_rank, per_rank, last=last,
                               behind=behind))
    else:
        out.extend(_stuck(label, by_rank, per_rank))
    mismatch = _first_mismatch(per_rank)
    if mismatch is not None:
        seq, sigs, count = mismatch
        out.append(_mismatch(name, desc, label, by_rank, per_rank, seq=seq, sigs=sigs,
                             count=count))
    return out


def _stuck(label: str, by_rank: Mapping[int, RankDump], per_rank: dict[int, dict[int, FrEntry]]
           ) -> list[Diagnosis]:
    """Every rank of the group in the same last collective and it did not complete. Only where
    the backend reports completion (NCCL: "completed" entries in the dump; gloo's entries stay
    "scheduled" whatever happened, so its states say nothing)."""
    last = {r: s[max(s)] for r, s in per_rank.items() if s}
    knows = {r for r in last if any(e.state == "completed"
                                    for e in by_rank[r].entries)}
    stuck = sorted(r for r, e in last.items() if r in knows and e.state in
                   ("scheduled", "started"))
    if not stuck:
        return []
    e = last[stuck[0]]
    alone = len(per_rank) == 1
    message = (f"{plural('rank', stuck)} entered collective #{e.seq} of {label} ({e.op}, input "
               f"sizes {json.dumps(e.input_sizes)}) and it had not completed ({e.state}) when "
               "the dump was taken")
    message += ("; no other rank's dump of this group was given, so whom it waited for cannot "
                "be told from the dumps" if alone else
                "; every rank with a dump entered it: the collective itself hung")
    evidence = tuple(Evidence(by_rank[r].source, last[r].index, f"rank {r}: {last[r].describe()}")
                     for r in stuck[:5])
    details: dict[str, Detail] = {
        "process_group": label, "collective_seq_id": e.seq, "op": e.op,
        "input_sizes": e.input_sizes, "state": e.state,
        "ranks_last": {str(r): _last_json(x) for r, x in sorted(last.items())}}
    return [Diagnosis(STUCK, Layer.COMMUNICATION, message, REMEDY_STUCK, evidence,
                      tuple(stuck), len(stuck), details)]


def _last_json(e: FrEntry | None) -> Detail:
    if e is None:
        return None
    return {"seq": e.seq, "op": e.op, "input_sizes": e.input_sizes,
            "output_sizes": e.output_sizes, "dtypes": e.input_dtypes, "state": e.state,
            "frame": e.frame}


def _not_joined(name: str, desc: str, label: str, by_rank: Mapping[int, RankDump],
                per_rank: dict[int, dict[int, FrEntry]], *, last: dict[int, int],
                behind: list[int]) -> Diagnosis:
    n = last[behind[0]] + 1
    entered = sorted(r for r, s in per_rank.items() if n in s)
    ref = per_rank[entered[0]][n] if entered else None
    what = (f"{ref.op} with input sizes {json.dumps(ref.input_sizes)}"
            f"{' at ' + ref.frame if ref.frame else ''}" if ref else "?")
    laggards_at_n = [r for r in behind if last[r] == last[behind[0]]]
    message = (f"{plural('rank', laggards_at_n)} never entered collective #{n} of {label}: "
               f"{what}, which {plural('rank', entered)} entered")
    lasts = []
    for r in behind:
        seqs = per_rank[r]
        e = seqs.get(last[r])
        lasts.append(f"rank {r}'s last there was " + (
            f"#{e.seq} {e.op}" if e else "none (it entered no collective of this group)"))
    message += "; " + "; ".join(lasts[:8])
    others = [r for r in behind if r not in laggards_at_n]
    if others:
        message += f"; {plural('rank', others)} stopped later but also behind"
    evidence: list[Evidence] = []
    if ref is not None:
        evidence.append(Evidence(by_rank[entered[0]].source, ref.index,
                                 f"rank {entered[0]}: {ref.describe()}"))
    for r in behind[:4]:
        e = per_rank[r].get(last[r])
        if e is not None:
            evidence.append(Evidence(by_rank[r].source, e.index, f"rank {r}: {e.describe()}"))
    details: dict[str, Detail] = {
        "process_group": {"name": name, "desc": desc}, "collective_seq_id": n,
        "op": ref.op if ref else None, "input_sizes": ref.input_sizes if ref else None,
        "output_sizes": ref.output_sizes if ref else None,
        "dtypes": ref.input_dtypes if ref else None, "frame": ref.frame if ref else None,
        "never_entered": behind, "entered": entered,
        "last_seq": {str(r): v for r, v in sorted(last.items())},
        "ranks_last": {str(r): _last_json(s.get(last[r])) for r, s in sorted(per_rank.items())},
    }
    return Diagnosis(NOT_JOINED, Layer.COMMUNICATION, message, REMEDY_NOT_JOINED,
                     tuple(evidence), tuple(behind), len(behind), details)


def _signature(e: FrEntry) -> tuple[str, str]:
    sizes = json.dumps(e.input_sizes) if e.short_op in SIZED_OPS else ""
    return e.short_op, sizes


def _first_mismatch(per_rank: dict[int, dict[int, FrEntry]]
                    ) -> tuple[int, dict[tuple[str, str], list[int]], int] | None:
    common = sorted(set().union(*(set(s) for s in per_rank.values())))
    count = 0
    first: tuple[int, dict[tuple[str, str], list[int]]] | None = None
    for seq in common:
        sigs: dict[tuple[str, str], list[int]] = {}
        for r, s in sorted(per_rank.items()):
            if seq in s:
                sigs.setdefault(_signature(s[seq]), []).append(r)
        if len(sigs) > 1:
            count += 1
            if first is None:
                first = (seq, sigs)
    return None if first is None else (first[0], first[1], count)


def _mismatch(name: str, desc: str, label: str, by_rank: Mapping[int, RankDump],
              per_rank: dict[int, dict[int, FrEntry]], *, seq: int,
              sigs: dict[tuple[str, str], list[int]], count: int) -> Diagnosis:
    ops = {op for op, _ in sigs}
    kind = "op" if len(ops) > 1 else "sizes"
    parts = []
    evidence = []
    for (_, sizes), ranks in sorted(sigs.items(), key=lambda kv: -len(kv[1])):
        e = per_rank[ranks[0]][seq]
        parts.append(f"{plural('rank', ranks)} ran {e.op}"
                     f"{' with input sizes ' + sizes if sizes else ''}")
        evidence.append(Evidence(by_rank[ranks[0]].source, e.index,
                                 f"rank {ranks[0]}: {e.describe()}"))
    variants = sorted(sigs.values(), key=len)
    # the ranks in the smallest variant are the odd ones out, unless the variants tie
    minority = sorted(variants[0]) if len(variants[0]) < len(variants[1]) else sorted(
        r for v in variants for r in v)
    message = (f"the ranks disagree on the {kind} of collective #{seq} of {label}: "
               + "; ".join(parts))
    if count > 1:
        message += f"; {count} collectives of this group disagree"
    details: dict[str, Detail] = {
        "process_group": {"name": name, "desc": desc}, "collective_seq_id": seq,
        "mismatch": kind, "variants": [{"op": per_rank[rs[0]][seq].op,
                                        "input_sizes": per_rank[rs[0]][seq].input_sizes,
                                        "ranks": rs} for rs in sigs.values()],
        "mismatched_collectives": count}
    return Diagnosis(MISMATCH, Layer.COMMUNICATION, message, REMEDY_MISMATCH,
                     tuple(evidence[:5]), tuple(minority), count, details)
