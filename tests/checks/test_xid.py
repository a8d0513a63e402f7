"""The ``xid`` verdicts on kernel logs under ``--root`` (records in /dev/kmsg's own format), GPUs
named through the fixture NVML probe, and the CLI's exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.checks import xid
from preflight.core.result import Status
from preflight.probes.kernlog import XID_TABLE, XidClass, XidEvent
from tests import topologies
from tests.conftest import MakeCtx
from tests.helpers import cli_json, write_fixture

BOOT = "6,0,0,-;Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)\n"


def kmsg_root(tmp_path: Path, *records: tuple[float, str], uptime_s: float = 90000.0) -> Path:
    """A host root whose /dev/kmsg holds ``records`` (seconds since boot, text) after a boot line,
    and whose /proc/uptime says ``uptime_s``."""
    (tmp_path / "dev").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc").mkdir(exist_ok=True)
    lines = [BOOT] + [f"3,{i + 1},{int(t * 1e6)},-;{text}\n" for i, (t, text) in
                      enumerate(records)]
    (tmp_path / "dev" / "kmsg").write_text("".join(lines))
    (tmp_path / "proc" / "uptime").write_text(f"{uptime_s:.2f} 1000.00\n")
    return tmp_path


# GPU 3 of the 8x H100 fixture sits at 0000:5d:00.0, GPU 0 at 0000:18:00.0.
FELL_OFF_GPU3 = "NVRM: Xid (PCI:0000:5d:00): 79, pid=2231, GPU has fallen off the bus."
DBE_GPU0 = "NVRM: Xid (PCI:0000:18:00): 48, pid=4410, An uncorrectable double bit error (DBE)"
MMU_GPU0 = ("NVRM: Xid (PCI:0000:18:00): 31, pid=918, name=python, Ch 00000008, intr 00000000. "
            "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f8e_1a000000.")


def test_clean_log_passes(make_ctx: MakeCtx, tmp_path: Path) -> None:
    r = xid.run(make_ctx(root=kmsg_root(tmp_path, (2.0, "nvidia: module loaded"))))
    assert (r.status, r.reason) == (Status.PASS, "NoXid")
    assert "since boot" in r.message


def test_fell_off_the_bus_fails_naming_gpu_and_action(make_ctx: MakeCtx, tmp_path: Path) -> None:
    r = xid.run(make_ctx(root=kmsg_root(tmp_path, (7200.0, FELL_OFF_GPU3))))
    assert (r.status, r.reason) == (Status.FAIL, "XidNodeFault")
    assert "GPU 3 (0000:5d:00): Xid 79 x1, GPU has fallen off the bus (last 2.0 h after boot)" \
        in r.message
    assert r.remedy.startswith("GPU 3 (0000:5d:00) (Xid 79): drain the node and reboot it")
    assert r.details["xids"][0]["gpu"] == "3"


def test_job_xid_is_reported_and_never_fails(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (100.0, MMU_GPU0), (130.0, MMU_GPU0), (200.0,
                     "NVRM: Xid (PCI:0000:18:00): 13, Graphics SM Warp Exception"))
    r = xid.run(make_ctx(root=root))
    assert (r.status, r.reason) == (Status.PASS, "XidJobOnly")
    assert "GPU 0 (0000:18:00): Xid 31 x2" in r.message
    assert "reported only" in r.message


def test_node_fault_wins_over_job_xids_and_both_are_listed(make_ctx: MakeCtx,
                                                           tmp_path: Path) -> None:
    r = xid.run(make_ctx(root=kmsg_root(tmp_path, (100.0, MMU_GPU0), (300.0, DBE_GPU0))))
    assert r.status is Status.FAIL
    assert "Xid 48 x1" in r.message and "Xid 31 x1" in r.message
    assert "Xid 31" not in r.remedy  # a job's fault asks nothing of the operator


def test_gpu_missing_from_nvml_is_named_by_bus_id(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (50.0, FELL_OFF_GPU3))
    r = xid.run(make_ctx(root=root, snapshot=topologies.lost_gpu(3)))
    assert r.status is Status.FAIL
    assert "GPU at 0000:5d:00 (not seen by NVML)" in r.message


def test_unknown_code_warns(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (50.0, "NVRM: Xid (PCI:0000:18:00): 9999, something new"))
    r = xid.run(make_ctx(root=root))
    assert (r.status, r.reason) == (Status.WARN, "XidUnknown")


def test_since_window_drops_old_xids(make_ctx: MakeCtx, tmp_path: Path) -> None:
    root = kmsg_root(tmp_path, (1000.0, FELL_OFF_GPU3), uptime_s=90000.0)
    assert xid.run(make_ctx(root=root)).status is Status.FAIL
    r = xid.run(make_ctx(root=root, xid_since_s=3600.0))
    assert (r.status, r.reason) == (Status.PASS, "NoXid")
    assert "in the last 3600 s" in r.message


def test_ring_buffer_that_lost_the_boot_says_since_when(make_ctx: MakeCtx, tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "kmsg").write_text("6,9000,36000000000,-;eth0: link up\n")
    r = xid.run(make_ctx(root=tmp_path))
    assert "since 10.0 h after boot" in r.message


def test_unreadable_log_warns_with_the_systemd_fix(make_ctx: MakeCtx, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "journalctl").write_text("#!/bin/sh\nexit 1\n")
    (bindir / "journalctl").chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    r = xid.run(make_ctx(root=tmp_path / "host"))
    assert (r.status, r.reason) == (Status.WARN, "KernelLogUnreadable")
    assert "ProtectKernelLogs=no" in r.remedy


def test_cli_exit_codes_under_root(tmp_path: Path) -> None:
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    bad = kmsg_root(tmp_path / "bad", (60.0, FELL_OFF_GPU3))
    rc, report = cli_json(["check", "--only", "xid", "--root", str(bad)], fixture=fixture)
    assert rc == 1 and report["results"][0]["reason"] == "XidNodeFault"
    job = kmsg_root(tmp_path / "job", (60.0, MMU_GPU0))
    rc, report = cli_json(["check", "--only", "xid", "--root", str(job)], fixture=fixture)
    assert rc == 0 and report["results"][0]["reason"] == "XidJobOnly"


JOB_CODES = sorted(c for c, i in XID_TABLE.items() if i.cls is XidClass.JOB)


@given(st.lists(st.tuples(st.sampled_from(["0000:18:00", "0000:5d:00", "0000:99:00"]),
                          st.sampled_from(JOB_CODES), st.floats(0, 1e7)), max_size=50))
def test_job_caused_xids_never_fail_the_node(events: list[tuple[str, int, float]]) -> None:
    evs = [XidEvent(bus, code, "detail", t) for bus, code, t in events]
    r = xid.judge(xid.count(evs, {"0000:18:00": 0, "0000:5d:00": 3}), span="since boot",
                  source="/dev/kmsg")
    assert r.status is Status.PASS
    assert r.reason == ("XidJobOnly" if events else "NoXid")


# -- Xids that stay fixed: resets and acknowledgements (preflight xid) ----------------------

BOOT_ID = "0d7e0c6e-1a2b-4c3d-8e9f-001122334455"


def _acked_root(tmp_path: Path, *records: tuple[float, str], uptime_s: float) -> Path:
    root = kmsg_root(tmp_path, *records, uptime_s=uptime_s)
    (root / "proc/sys/kernel/random").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT_ID + "\n")
    return root


def _xid(tmp_path: Path, root: Path, *args: str) -> tuple[int, dict[str, object], str]:
    from tests.helpers import run_cli

    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    proc = run_cli(["xid", "--root", str(root), "--json", *args], fixture=fixture,
                   env={"PREFLIGHT_STATE_DIR": str(tmp_path / "state")})
    assert "Traceback" not in proc.stderr
    import json

    return proc.returncode, (json.loads(proc.stdout) if proc.stdout else {}), proc.stderr


def test_an_acknowledged_xid_stops_failing_and_a_new_one_fails_again(tmp_path: Path) -> None:
    root = _acked_root(tmp_path, (7200.0, FELL_OFF_GPU3), uptime_s=9000.0)
    rc, report, _ = _xid(tmp_path, root)
    assert rc == 1 and report["results"][0]["reason"] == "XidNodeFault"  # type: ignore[index]

    rc, report, err = _xid(tmp_path, root, "--ack", "--gpu", "5d:00.0")
    assert rc == 0, err
    result = report["results"][0]  # type: ignore[index]
    assert result["reason"] == "XidAcknowledged"
    assert "GPU 3 (0000:5d:00): Xid 79 x1 (acknowledged at 2.5 h after boot)" in result["message"]
    assert "GPU 0000:5d:00: Xids logged up to now (acknowledged at 2.5 h after boot)" in err

    # The prolog's check sees the same record; a new Xid after it fails again.
    again = _acked_root(tmp_path, (7200.0, FELL_OFF_GPU3), (9500.0, FELL_OFF_GPU3),
                        uptime_s=9600.0)
    rc, report = cli_json(["check", "--only", "xid", "--root", str(again)],
                          fixture=tmp_path / "nvml.json",
                          env={"PREFLIGHT_STATE_DIR": str(tmp_path / "state")})
    result = report["results"][0]  # type: ignore[index]
    assert rc == 1 and result["reason"] == "XidNodeFault"
    assert "GPU 3 (0000:5d:00): Xid 79 x1, GPU has fallen off the bus" in result["message"]
    assert result["details"]["xids"][0]["acknowledged"] == 1


def test_an_ack_covers_its_gpu_only_and_this_boot_only(tmp_path: Path) -> None:
    root = _acked_root(tmp_path, (7200.0, FELL_OFF_GPU3), uptime_s=9000.0)
    rc, _, _ = _xid(tmp_path, root, "--ack", "--gpu", "0000:18:00.0")
    assert rc == 1  # GPU 0's ack says nothing about GPU 3
    rc, _, _ = _xid(tmp_path, root, "--ack")
    assert rc == 0  # every GPU
    (root / "proc/sys/kernel/random/boot_id").write_text("11111111-2222-3333-4444-555555555555\n")
    rc, _, _ = _xid(tmp_path, root)
    assert rc == 1  # a record of another boot is not this boot's


def test_reset_runs_nvidia_smi_and_records_only_when_it_worked(tmp_path: Path) -> None:
    root = _acked_root(tmp_path, (7200.0, FELL_OFF_GPU3), uptime_s=9000.0)
    calls = tmp_path / "smi-calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "GPU 00000000:5D:00.0 is in use" '
                   '>&2\nexit "${SMI_EXIT:-0}"\n')
    smi.chmod(0o755)
    from tests.helpers import run_cli

    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    env = {"PREFLIGHT_STATE_DIR": str(tmp_path / "state"), "SMI_EXIT": "3"}
    proc = run_cli(["xid", "--root", str(root), "--reset", "--gpu", "0000:5d:00.0",
                    "--nvidia-smi", str(smi)], fixture=fixture, env=env)
    assert proc.returncode == 2
    assert ("nvidia-smi --gpu-reset exit 3: GPU 00000000:5D:00.0 is in use; nothing recorded"
            in proc.stderr)
    assert not (tmp_path / "state" / "xid-acks.json").exists()
    rc, report, _ = _xid(tmp_path, root, "--reset", "--gpu", "0000:5d:00.0", "--nvidia-smi",
                         str(smi))
    assert rc == 0
    assert "(GPU reset at 2.5 h after boot)" in report["results"][0]["message"]  # type: ignore
    assert calls.read_text().splitlines() == ["--gpu-reset -i 0000:5d:00.0"] * 2


@pytest.mark.parametrize("args", [["--gpu", "gpu3", "--ack"], ["--reset"]])
def test_xid_usage_errors_exit_2(tmp_path: Path, args: list[str]) -> None:
    root = _acked_root(tmp_path, uptime_s=100.0)
    rc, _, err = _xid(tmp_path, root, *args)
    assert rc == 2 and "configuration error" in err


@given(st.lists(st.floats(0, 1e6), max_size=20), st.floats(0, 1e6))
def test_an_ack_covers_exactly_what_was_logged_before_it(times: list[float], at: float) -> None:
    from preflight.core.xidacks import Ack

    evs = [XidEvent("0000:5d:00", 79, "", t) for t in times] + [XidEvent("0000:5d:00", 79, "")]
    [c] = xid.count(evs, {"0000:5d:00": 3}, [Ack("0000:5d:00", at, 0.0)])
    assert c.acknowledged == sum(1 for t in times if t <= at)
    assert c.active >= 1  # an Xid without a time is never acknowledged
