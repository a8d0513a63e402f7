"""Shapes of failure logs read by structure, each on a real log from a public thread, most of them
cut where the poster cut them (tests/explain/logs/shapes; the URL beside each file name)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.explain import classify_texts

SHAPES = Path(__file__).parent / "logs" / "shapes"

#: file -> (source thread, the reasons explain must give, cause first)
CASES: dict[str, tuple[str, list[str]]] = {
    # a traceback cut before its ValueError: the raising line names the variable
    "cut-env-pytorch-39832.log": ("https://github.com/pytorch/pytorch/issues/39832",
                                  ["MissingLauncherEnv"]),
    # a traceback cut inside TCPStore's construction in torchelastic's c10d backend
    "cut-tcpstore-pytorch-69197.log": ("https://github.com/pytorch/pytorch/issues/69197",
                                       ["RendezvousTimeout"]),
    # torchelastic's rendezvous errors
    "rdzv-conn-pytorch-107021.log": ("https://github.com/pytorch/pytorch/issues/107021",
                                     ["RendezvousTimeout"]),
    "cut-rdzv-torchtune-2676.log": ("https://github.com/meta-pytorch/torchtune/issues/2676",
                                    ["RendezvousTimeout"]),
    # NCCL's Last error detail outranks the generic code (the fix was NCCL_SOCKET_IFNAME=em4)
    "lasterror-hkproj-1.log": (
        "https://github.com/hkproj/pytorch-transformer-distributed/issues/1",
        ["NcclConnectFailed", "NcclSystemError"]),
    # the launchers' own words for a killed rank
    "deepspeed-kill-3232.log": ("https://github.com/deepspeedai/DeepSpeed/issues/3232",
                                ["RankKilled"]),
    "accelerate-kill-swin-267.log": ("https://github.com/microsoft/Swin-Transformer/issues/267",
                                     ["RankKilled"]),
    "mp-spawn-kill-hrnet-47.log": (
        "https://github.com/HRNet/HigherHRNet-Human-Pose-Estimation/issues/47", ["RankKilled"]),
    # Lightning's process observer and its rank prefix; two logs pasted into public
    # repositories' notes, found by the exact string "Forcefully terminating all other
    # processes" (the index that found them names no repository)
    "lightning-kill.log": ("public notes (exact-string search)", ["RankKilled"]),
    "lightning-watchdog-abort.log": ("public notes (exact-string search)",
                                     ["CollectiveTimeout", "RankKilled"]),
    # host memory evidence for a SIGKILL
    "srun-oom-arjuna-52.log": ("https://github.com/ArjunaCluster/ArjunaUsers/issues/52",
                               ["HostOutOfMemory", "RankKilled"]),
    "dmesg-oom-qaconv-19.log": ("https://github.com/ShengcaiLiao/QAConv/issues/19",
                                ["HostOutOfMemory"]),
    # DeepSpeed stopping its subprocesses after one ended (the end of the job, named last), and
    # a memory report at 22.6 %: no evidence of the host's memory
    "deepspeed-memory-3160.log": ("https://github.com/deepspeedai/DeepSpeed/issues/3160",
                                  ["RankKilled"]),
}


def reasons_of(name: str) -> list[str]:
    expl = classify_texts([(name, (SHAPES / name).read_text())])
    return [f.reason for f in expl.findings]


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape_is_recognised_cause_first(name: str) -> None:
    assert reasons_of(name) == CASES[name][1]


def test_every_shape_log_is_listed() -> None:
    assert sorted(p.name for p in SHAPES.glob("*.log")) == sorted(CASES)


def test_the_cut_traceback_names_the_variable() -> None:
    (f,) = classify_texts([("x", (SHAPES / "cut-env-pytorch-39832.log").read_text())]).findings
    assert "MASTER_ADDR" in f.message


def test_the_specific_nccl_cause_names_the_peer_and_the_interface_fix() -> None:
    first = classify_texts([("x", (SHAPES / "lasterror-hkproj-1.log").read_text())]).findings[0]
    assert "192.168.19.14<52822>" in first.message and "No route to host" in first.message
    assert "NCCL_SOCKET_IFNAME" in first.remedy


def test_the_deepspeed_kill_names_sigkill_and_the_oom_killer() -> None:
    (f,) = classify_texts([("x", (SHAPES / "deepspeed-kill-3232.log").read_text())]).findings
    assert "SIGKILL" in f.message and "OOM killer" in f.message


def test_a_frame_deeper_in_the_same_traceback_wins() -> None:
    """Written here: init_process_group's rendezvous frame, then the env handler's frame (cut
    before the ValueError): one finding, the missing variable, not a rendezvous failure."""
    text = ('  File "/x/torch/distributed/distributed_c10d.py", line 1892, in init_process_group\n'
            "    store, rank, world_size = next(rendezvous_iterator)\n"
            '  File "/x/torch/distributed/rendezvous.py", line 276, in _env_rendezvous_handler\n'
            '    master_addr = _get_env_or_raise("MASTER_ADDR")\n')
    assert [f.reason for f in classify_texts([("x", text)]).findings] == ["MissingLauncherEnv"]


def test_a_memory_report_counts_only_beside_a_kill() -> None:
    """Written here (no public log had both): DeepSpeed's memory report at 91 % is evidence for
    a SIGKILL that follows, and says nothing without one."""
    report = ("[INFO] [utils.py:838:see_memory_usage] CPU Virtual Memory:  used = 950.31 GB, "
              "percent = 91.2%\n")
    kill = "[ERROR] [launch.py:434:sigkill_handler] ['python'] exits with return code = -9\n"
    assert [f.reason for f in classify_texts([("x", report)]).findings] == []
    got = classify_texts([("x", report + kill)]).findings
    assert [f.reason for f in got] == ["HostOutOfMemory", "RankKilled"]
    assert "91.2%" in got[0].message
    # the launcher's own stop of its ranks after one ended, the memory report before it
    stop = "[INFO] [launch.py:318:sigkill_handler] Killing subprocess 80\n"
    got = classify_texts([("x", report + stop)]).findings
    assert [f.reason for f in got] == ["HostOutOfMemory", "RankKilled"]
    assert "launcher stopped its ranks" in got[1].message
