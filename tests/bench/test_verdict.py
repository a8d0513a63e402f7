"""Verdicts on made-up runs: slow vs stalled vs dead vs wrong, and the stalled-rank naming."""

from __future__ import annotations

import dataclasses

from preflight.bench.diagnosis import late
from preflight.bench.options import BenchOptions, Deadlines, RunOptions, WorldSpec
from preflight.bench.records import Failure, RunRecord, WorkerState, progress_order
from preflight.bench.verdict import judge, render_table
from preflight.core.result import Status
from tests import topologies

GiB = 1 << 30
SIZES = (256 << 20, 512 << 20, GiB)


def _record(times: dict[int, float], *, nproc: int = 2, sizes: tuple[int, ...] = SIZES,
            backend: str = "nccl", failure: Failure | None = None,
            verified: dict[int, dict[str, object]] | None = None) -> RunRecord:
    opts = BenchOptions(backend=backend, nproc=nproc, sizes=sizes, timeout_s=120)
    ranks = []
    for r in range(nproc):
        st = WorkerState(rank=r, label=f"GPU {r}, 0000:0{r}:00.0", reduces=True, pid=100 + r)
        st.times = dict(times)
        st.verified = {s: {"ok": True, "mismatches": 0} for s in times}
        if verified and r in verified:
            st.verified.update(verified[r])  # type: ignore[arg-type]
        ranks.append(st)
    return RunRecord(opts, tuple(ranks), failure, 40000, None, 1.0)


def _time_for(busbw_gbps: float, size: int, n: int = 2) -> float:
    return size / (busbw_gbps * 1e9 / (2 * (n - 1) / n))


TWO_H200 = topologies.snapshot([
    topologies.h100(0, "0000:00:07.0", name="NVIDIA H200"),
    topologies.h100(1, "0000:00:08.0", name="NVIDIA H200")]).gpus


def test_pass_at_reference_with_link_efficiency() -> None:
    rec = _record({s: _time_for(330, s) for s in SIZES})
    res = judge(rec, gpus=TWO_H200)
    assert res.status is Status.PASS, res.message
    assert res.busbw_gbps == 330.0 and res.expected_busbw_gbps == 330.0
    assert res.link_efficiency == round(330 / 450, 4)
    assert "link efficiency 0.73 of 18 active NVLinks x 25 GB/s = 450 GB/s" in res.message


def test_slow_at_1gib_fails_below_0_9_of_expected() -> None:
    res = judge(_record({s: _time_for(290, s) for s in SIZES}), gpus=TWO_H200)
    assert res.status is Status.FAIL and res.reason == "BusbwLow"
    assert "busbw 290.00 GB/s at 1 GiB over 2 ranks" in res.message
    assert "floor 297 GB/s" in res.message
    ok = judge(_record({s: _time_for(300, s) for s in SIZES}), gpus=TWO_H200)
    assert ok.status is Status.PASS


def test_small_largest_size_is_not_failed_against_the_1gib_reference() -> None:
    sizes = (1 << 20, 64 << 20)
    res = judge(_record({s: _time_for(200, s) for s in sizes}, sizes=sizes), gpus=TWO_H200)
    assert res.status is Status.WARN and res.reason == "BusbwUnjudged"
    assert "--max-bytes 1G" in res.remedy


def test_a_run_across_nodes_is_not_held_to_this_nodes_nvlink_or_table() -> None:
    one_gpu_each = TWO_H200[:1]
    rec = _record({s: _time_for(3, s) for s in SIZES}, nproc=1)
    world = WorldSpec("10.0.0.1", 29400, "pfx", rank_offset=0, world_size=2)
    rec = dataclasses.replace(rec, options=dataclasses.replace(rec.options, world=world))
    res = judge(rec, gpus=one_gpu_each)
    assert res.status is Status.WARN and res.reason == "NoReference", res.message
    assert "across nodes" in res.message and "link efficiency" not in res.message
    assert "preflight cluster --min-busbw" in res.remedy
    assert judge(rec, gpus=one_gpu_each, min_busbw_gbps=2).status is Status.PASS


def test_unknown_model_warns_and_explicit_floor_judges() -> None:
    gpus = topologies.cuda_order_differs().gpus
    rec = _record({s: _time_for(20, s) for s in SIZES})
    res = judge(rec, gpus=gpus)
    assert res.status is Status.WARN and res.reason == "NoReference"
    assert "--min-busbw" in res.remedy
    assert judge(rec, gpus=gpus, min_busbw_gbps=25).status is Status.FAIL
    assert judge(rec, gpus=gpus, min_busbw_gbps=15).status is Status.PASS


def test_link_down_shows_in_the_verdict() -> None:
    snap = topologies.nvlink_down(index=1, links=16)
    res = judge(_record({s: _time_for(300, s) for s in SIZES}), gpus=snap.gpus[:2])
    assert res.status is Status.WARN and res.reason == "LinksDegraded"
    assert "GPU 1 (0000:2a:00.0): 16 active NVLinks" in res.message


def test_wrong_sum_names_size_and_rank() -> None:
    bad = {512 << 20: {"ok": False, "mismatches": 3, "elements": 134217728, "first_index": 7,
                       "got": 5.0, "want": 3.0}}
    res = judge(_record({s: _time_for(330, s) for s in SIZES}, verified={1: bad}), gpus=TWO_H200)
    assert res.status is Status.FAIL and res.reason == "AllreduceWrongSum"
    assert res.message.startswith("the all-reduce of 512 MiB gave a wrong sum on rank 1 "
                                  "(GPU 1, 0000:01:00.0): 3 of 134217728 elements wrong, first at "
                                  "element 7: got 5, expected 3")
    assert "  " + str(512 << 20) in render_table(res)


def test_stall_is_fail_and_death_is_error() -> None:
    stall = judge(_record({}, failure=Failure("stalled", "rank 1 (GPU 1) stalled", (1,))))
    assert stall.status is Status.FAIL and stall.stalled_ranks == (1,)
    died = judge(_record({}, failure=Failure("died", "rank 0 (GPU 0) killed by SIGKILL", (0,))))
    assert died.status is Status.ERROR and died.reason == "WorkerDied"


STEPS = {"spawn": "start", "imports": "start", "init": "allreduce", "warmup": "allreduce",
         "measure": "allreduce", "verify": "allreduce"}


def _ranks(*where: tuple[str, int | None, float, float]) -> list[WorkerState]:
    out = []
    for r, (phase, size, entered, beat) in enumerate(where):
        step = STEPS[phase]
        out.append(WorkerState(rank=r, label="CPU", reduces=True, step=step, phase=phase,
                               size=size, order=progress_order(step, phase, size, SIZES),
                               entered=entered, last_beat=beat, heard=True))
    return out


D = Deadlines.from_timeout(120)
LIMITS = RunOptions(allreduce=BenchOptions("gloo", 2, SIZES, 120)).limits()


def _stalled(ranks: list[WorkerState], now: float) -> Failure | None:
    return late(ranks, LIMITS, now, {"allreduce": 0.0})


def test_deadlines_from_timeout() -> None:
    assert (D.spawn_s, D.init_s, D.step_s) == (60, 60, 30)
    assert Deadlines.from_timeout(4).step_s == 2


def test_the_rank_behind_is_named() -> None:
    now = 100.0
    ranks = _ranks(("warmup", GiB, 60.0, now), ("verify", 512 << 20, 58.0, 60.0),
                   ("warmup", GiB, 61.0, now))
    f = _stalled(ranks, now)
    assert f is not None and f.kind == "stalled" and f.ranks == (1,)
    assert f.message == ("rank 1 (CPU) stalled in verify of 512 MiB after 42 s (no heartbeat for "
                         "40 s: the process is frozen); ranks 0, 2 reached warm-up of 1 GiB")


def test_same_step_frozen_rank_vs_hung_collective() -> None:
    now = 100.0
    frozen = _ranks(("measure", GiB, 60.0, now), ("measure", GiB, 60.0, 65.0))
    f = _stalled(frozen, now)
    assert f is not None and f.ranks == (1,)
    assert f.message.startswith("rank 1 (CPU) stopped in measure of 1 GiB (no heartbeat for 35 s")
    hung = _ranks(("measure", GiB, 60.0, now), ("measure", GiB, 60.0, now))
    f = _stalled(hung, now)
    assert f is not None and f.kind == "hung" and "collective itself hangs" in f.message
    assert _stalled(hung, 80.0) is None  # 20 s < 30 s: still just slow


def test_where_the_others_waited_follows_the_phase() -> None:
    """A rank frozen before init keeps the others at the rendezvous, not in a collective (seen on
    the H200: one rank SIGSTOPped while torch was still loading)."""
    now = 100.0
    early = _ranks(("init", None, 30.0, 40.0), ("init", None, 31.0, now))
    f = _stalled(early, now)
    assert f is not None and f.ranks == (0,)
    assert f.message.endswith("the others waited 70 s at the rendezvous"), f.message
    frozen = _ranks(("measure", GiB, 60.0, now), ("measure", GiB, 60.0, 65.0))
    f = _stalled(frozen, now)
    assert f is not None and f.message.endswith("the others waited 40 s in the collective")
    # Alone and frozen while still starting (heard from, then silent): named as stalled there.
    alone = _ranks(("imports", None, 30.0, 40.0))
    f = _stalled(alone, now)
    assert f is not None and f.kind == "stalled"
    assert f.message == ("rank 0 (CPU) stalled in import after 70.0 s (deadline 60 s) (no "
                         "heartbeat for 60 s: the process is frozen)")
