"""PyTorch flight recorder dumps: real ones (tests/explain/fr, the torch version in each folder's
torch.txt), read without executing anything, matched across ranks, joined with the logs."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.cli import main
from preflight.explain import explain_streams
from preflight.explain.flightrec import DumpRefused, analyse, load_dump

FR = Path(__file__).parent / "fr"
CPU = FR / "torch-2.13.0-cpu-gloo"
GPU = sorted(FR.glob("torch-2.11*"))


def dumps(folder: Path) -> list[tuple[str, io.BytesIO]]:
    return [(str(p), io.BytesIO(p.read_bytes())) for p in sorted(folder.glob("rank_*"))]


def test_the_cpu_dumps_were_written_by_the_torch_they_say() -> None:
    for case in ("skip", "mismatch"):
        assert (CPU / case / "torch.txt").read_text().startswith("torch 2.13.0+cpu\n")
        for p in (CPU / case).glob("rank_?"):
            assert load_dump(p.read_bytes(), str(p)).version == "2.10"


@pytest.mark.parametrize("form", ["skip", "skip-json"])
def test_the_rank_that_skipped_a_collective_is_named_with_the_collective(form: str) -> None:
    expl = explain_streams(dumps(CPU / form))
    (f,) = expl.findings
    assert f.reason == "CollectiveNotJoined" and f.layer.value == "communication"
    assert f.ranks == (1,)
    d = f.details
    assert d["collective_seq_id"] == 4 and d["op"] == "gloo:all_reduce"
    assert d["input_sizes"] == [[16]] and d["dtypes"] == ["Float"]
    assert d["process_group"] == {"name": "0", "desc": "default_pg"}
    assert d["entered"] == [0] and d["never_entered"] == [1]
    assert d["ranks_last"]["1"]["seq"] == 3 and d["ranks_last"]["1"]["input_sizes"] == [[4, 8]]
    assert "rank 1 never entered collective #4 of process group 0 (default_pg)" in f.message


@pytest.mark.parametrize("form", ["mismatch", "mismatch-json"])
def test_a_size_mismatch_between_ranks_is_named(form: str) -> None:
    (f,) = explain_streams(dumps(CPU / form)).findings
    assert f.reason == "CollectiveMismatch"
    assert f.details["mismatch"] == "sizes" and f.details["collective_seq_id"] == 4
    sizes = sorted(json.dumps(v["input_sizes"]) for v in f.details["variants"])
    assert sizes == ["[[16]]", "[[8]]"]
    assert set(f.ranks) == {0, 1}  # two ranks, two variants: neither is the odd one out


def test_a_directory_of_dumps_and_logs_gives_one_answer_in_one_json(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``preflight explain DIR``: the dumps and each rank's log, findings in one list."""
    assert main(["explain", "--json", str(CPU / "skip")]) == 1
    data = json.loads(capsys.readouterr().out)
    reasons = [f["reason"] for f in data["findings"]]
    assert reasons == ["CollectiveNotJoined", "CollectiveTimeout"]
    assert data["findings"][0]["layer"] == "communication"
    assert data["unread"] == []


def test_fr_trace_and_explain_agree_on_the_cpu_dumps_once_fr_trace_can_read_them(
        tmp_path: Path) -> None:
    """torch's own analyser stops on gloo's dumps (torch 2.13 records an empty process group
    config for gloo: KeyError); with the default group written in, it names the same rank and
    the same collective."""
    pytest.importorskip("torch")
    for p in sorted((CPU / "skip").glob("rank_?")):
        data = pickle.loads(p.read_bytes())  # our own test data
        data["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
        (tmp_path / p.name).write_bytes(pickle.dumps(data))
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path),
         "-p", "rank_"], capture_output=True, text=True, timeout=120, check=False)
    said = out.stdout + out.stderr  # fr_trace reports through its logger
    assert "missing ranks: {1}" in said and "sequence number: 4" in said, said
    raw = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(CPU / "skip"),
         "-p", "rank_"], capture_output=True, text=True, timeout=120, check=False)
    assert "KeyError" in raw.stderr


def test_a_truncated_dump_is_refused_in_one_line(tmp_path: Path) -> None:
    data = (CPU / "skip" / "rank_0").read_bytes()
    cut = tmp_path / "rank_0"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(DumpRefused, match="truncated"):
        load_dump(cut.read_bytes(), str(cut))
    proc = subprocess.run([sys.executable, "-m", "preflight", "explain", str(cut)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("not read:")]
    assert "not a whole pickle" in line


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("EXECUTED",))


def test_a_pickle_that_names_a_class_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    evil = tmp_path / "rank_0"
    payload = {"version": "2.10", "entries": [], "pg_config": {}, "x": _Boom()}
    evil.write_bytes(pickle.dumps(payload, protocol=2))  # plain data plus one reduce
    with pytest.raises(DumpRefused, match=r"names the class __builtin__\.print"):
        load_dump(evil.read_bytes(), str(evil))
    proc = subprocess.run([sys.executable, "-m", "preflight", "explain", str(evil)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert "EXECUTED" not in proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("not read:")]
    assert "names the class __builtin__.print: refused, nothing executed" in line


def test_a_plain_pickle_that_is_no_dump_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DumpRefused, match="no list of entries"):
        load_dump(pickle.dumps({"entries": "x"}, protocol=2), str(tmp_path / "rank_3"))


def test_the_first_dump_layout_a_bare_list_with_seq_id_is_read() -> None:
    """Written here after the layout of torch 2.2's first dumps (a list of entries, ``seq_id``
    and ``sizes``, no process-group names): no real dump of it was at hand."""
    def entry(seq: int, sizes: list[list[int]]) -> dict[str, object]:
        return {"seq_id": seq, "profiling_name": "nccl:all_reduce", "sizes": sizes,
                "state": "completed" if seq < 3 else "scheduled", "pg_id": 0}
    r0 = pickle.dumps([entry(1, [[4]]), entry(2, [[4]]), entry(3, [[8]])], protocol=2)
    r1 = pickle.dumps([entry(1, [[4]]), entry(2, [[4]])], protocol=2)
    found, _ = analyse([load_dump(r0, "trace_0"), load_dump(r1, "trace_1")])
    assert [f.reason for f in found] == ["CollectiveNotJoined"]
    assert found[0].ranks == (1,) and found[0].details["collective_seq_id"] == 3


@pytest.mark.skipif(not GPU, reason="tests/explain/fr/torch-2.11*: the NCCL dumps from the GPU "
                                    "machine (scripts/device/explain_fr.sh) are not committed yet")
def test_the_gpu_dumps_from_another_torch_version() -> None:
    folder = GPU[0]
    timeout = folder / "nccl-timeout"
    (f,) = [x for x in explain_streams(dumps(timeout)).findings if x.reason.startswith("Coll")]
    assert f.reason == "CollectiveStuck" and f.ranks == (0,)
    assert f.details["op"].endswith("all_reduce")
    skip = explain_streams(dumps(folder / "skip")).findings
    assert skip[0].reason == "CollectiveNotJoined" and skip[0].ranks == (1,)
