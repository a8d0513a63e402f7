"""RankKilled: a rank ended by a signal, named with the signal, ordered against other findings."""

from __future__ import annotations

from preflight.explain import classify_texts

SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_10:00:01
  host      : node01
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 902)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 902
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_10:00:00
  host      : node01
  rank      : 0 (local_rank: 0)
  exitcode  : -{sig} (pid: 901)
  error_file: <N/A>
  traceback : Signal {sig} ({name}) received by PID 901
============================================================
"""
TERM = ("W1130 10:00:01.000000 900 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 902 closing signal SIGTERM\n")
WATCHDOG = ("[rank0]:[E1130 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1024, "
            "NumelOut=1024, Timeout(ms)=15000) ran for 15002 milliseconds before timing out.\n"
            "[default1]:rank 1: iteration 2\n")
OOM = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
       "has a total capacity of 79.19 GiB of which 1.21 GiB is free.\n")


def reasons(text: str) -> list[str]:
    return [f.reason for f in classify_texts([("job.log", text)]).findings]


def test_the_root_cause_rank_is_named_with_its_signal_and_torchruns_sigterm_is_not() -> None:
    expl = classify_texts([("job.log", TERM + SUMMARY.format(sig=9, name="SIGKILL"))])
    (killed,) = expl.findings
    assert killed.reason == "RankKilled"
    assert killed.ranks == (0,)
    assert "rank 0 (pid 901) was killed by SIGKILL" in killed.message
    assert "OOM killer" in killed.message
    assert "SIGTERM" not in killed.message
    assert expl.ranks.root_cause == 0


def test_a_sigterm_torchrun_did_not_send_is_a_kill_from_outside() -> None:
    expl = classify_texts([("job.log", SUMMARY.format(sig=15, name="SIGTERM"))])
    assert expl.findings[0].reason == "RankKilled"
    assert expl.findings[0].ranks == (1, 0)
    assert "from outside" in expl.findings[0].message


def test_a_specific_cause_comes_before_the_kill() -> None:
    assert reasons(OOM + TERM + SUMMARY.format(sig=9, name="SIGKILL")) == [
        "CudaOutOfMemory", "RankKilled"]


def test_the_watchdogs_own_abort_goes_after_the_timeout() -> None:
    got = reasons(WATCHDOG + TERM + SUMMARY.format(sig=6, name="SIGABRT"))
    assert got == ["CollectiveTimeout", "RankKilled"]


def test_an_abort_beside_another_ranks_timeout_goes_after_it() -> None:
    """Rank 3's watchdog timed out; rank 0 aborted with no line of its own in the log. Every
    rank's watchdog aborts in a hung collective (and torch's heartbeat monitor aborts the
    others), and torchrun stops the rest as soon as one rank fails: a timeout printed by
    another rank means the hang came first. The timeout, which names the ranks it waited for,
    is the first finding."""
    text = WATCHDOG.replace("[rank0]:", "[rank3]:").replace("[Rank 0]", "[Rank 3]")
    assert reasons(text + TERM + SUMMARY.format(sig=6, name="SIGABRT")) == [
        "CollectiveTimeout", "RankKilled"]


def test_an_abort_beside_a_lost_connection_is_still_the_first_finding() -> None:
    """The peers lost their connection to a rank that aborted: the abort is what happened
    first, the lost connections its consequence."""
    lost = "[rank1]: RuntimeError: Connection reset by peer\n"
    assert reasons(lost + TERM + SUMMARY.format(sig=6, name="SIGABRT")) == [
        "RankKilled", "PeerConnectionLost"]


def test_mp_spawn_and_old_torch_phrasings() -> None:
    for line in ("torch.multiprocessing.spawn.ProcessExitedException: process 2 terminated "
                 "with signal SIGSEGV", "Exception: process 2 terminated with signal SIGSEGV"):
        expl = classify_texts([("job.log", line + "\n")])
        assert [f.reason for f in expl.findings] == ["RankKilled"]
        assert expl.findings[0].ranks == (2,)
        assert "crashed" in expl.findings[0].message


def test_an_exception_in_a_spawned_process_is_not_a_kill() -> None:
    assert reasons("-- Process 0 terminated with the following error:\nTraceback (most recent "
                   "call last):\nValueError: bad config\n") == []


# torchrun (the elastic agent) itself stopped from outside (a time limit, `timeout`, preemption, a
# closed ssh session), as torch 2.x prints it: the agent's warning, then its own traceback.
AGENT = ("W1130 10:05:00.000000 900 torch/distributed/elastic/agent/server/api.py:739] Received "
         "{sig} death signal, shutting down workers\n"
         "W1130 10:05:00.001000 900 torch/distributed/elastic/multiprocessing/api.py:1012] "
         "Sending process 901 closing signal SIGTERM\n"
         "torch.distributed.elastic.multiprocessing.api.SignalException: Process 900 got "
         "signal: {sig}\n")


def test_torchrun_stopped_from_outside_is_named_when_nothing_else_failed() -> None:
    expl = classify_texts([("job.log", "[default0]:rank 0: iteration 1\n"
                            + AGENT.format(sig=15))])
    (killed,) = expl.findings
    assert killed.reason == "RankKilled"
    assert "torchrun itself received SIGTERM" in killed.message
    assert "from outside" in killed.message
    assert killed.ranks == ()


def test_sighup_of_torchrun_points_at_the_closed_session() -> None:
    (killed,) = classify_texts([("job.log", AGENT.format(sig=1))]).findings
    assert "torchrun itself received SIGHUP" in killed.message
    assert "ssh session" in killed.message


def test_torchrun_stopped_after_a_real_failure_goes_after_it() -> None:
    # a stop from outside is the end of the job, not why it failed: every other finding first
    assert reasons(WATCHDOG + AGENT.format(sig=15)) == ["CollectiveTimeout", "RankKilled"]
    # but a rank's own kill in the same log keeps its place
    got = reasons(WATCHDOG + AGENT.format(sig=15) + SUMMARY.format(sig=9, name="SIGKILL"))
    assert got[0] == "RankKilled"


def test_torchruns_own_stop_signal_after_a_failure_summary_names_no_rank() -> None:
    summary = SUMMARY.replace("exitcode  : -{sig} (pid: 901)", "exitcode  : 1 (pid: 901)")
    summary = summary.replace("Signal {sig} ({name}) received by PID 901", "<N/A>")
    expl = classify_texts([("job.log", summary + AGENT.format(sig=15))])
    assert expl.ranks.root_cause == 0
    stop = [f for f in expl.findings if "torchrun itself" in f.message]
    assert len(stop) == 1
    assert 0 not in stop[0].ranks


def test_an_interrupt_goes_after_what_the_user_was_reacting_to() -> None:
    """Ctrl-C on a job that hung or failed: the interrupt is the user's answer to the other
    findings, not their cause; alone, it is still named."""
    connect = ("node1:11:12 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
               "10.0.0.2<43251> failed : Connection timed out\n")
    interrupted = ("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated "
                   "with signal SIGINT\n")
    assert reasons(connect + interrupted) == ["NcclConnectFailed", "RankKilled"]
    (alone,) = classify_texts([("job.log", interrupted)]).findings
    assert alone.reason == "RankKilled" and "SIGINT" in alone.message
    # a kill from outside keeps its place before a wrapper
    assert reasons(connect + interrupted.replace("SIGINT", "SIGKILL"))[0] == "RankKilled"
