"""cuda_devices: CUDA_VISIBLE_DEVICES as CUDA reads it, against fixture topologies."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.checks import cuda_devices
from preflight.core.result import Result, Status
from preflight.probes.gpu import GpuSnapshot
from tests import topologies
from tests.conftest import MakeCtx
from tests.helpers import cli_json, write_fixture

H200 = topologies.single_h200_vm()
H200_UUID = H200.gpus[0].uuid  # GPU-00a0c1f2-7d3e-4b5a-9c8d-0e1f2a3b4c00
H100 = topologies.healthy_8x_h100()
MIG = topologies.mig(2)
MIG0, MIG1 = (m.uuid for m in MIG.gpus[0].mig_instances)


def check(make_ctx: MakeCtx, snapshot: GpuSnapshot, **env: str) -> Result:
    return cuda_devices.run(make_ctx(snapshot=snapshot, env=env))


def visible_bus_ids(r: Result) -> list[str]:
    return [d["pci_bus_id"] for d in r.details["visible"]]


@settings(max_examples=200, deadline=None)
@given(text=st.one_of(st.none(), st.text()), local_rank=st.one_of(st.none(), st.text()),
       order=st.one_of(st.none(), st.sampled_from(["PCI_BUS_ID", "FASTEST_FIRST", "pci", ""])))
def test_check_never_raises_on_any_environment(text: str | None, local_rank: str | None,
                                               order: str | None) -> None:
    from preflight.core.config import Config
    from preflight.core.context import Context
    from preflight.probes.gpu import FixtureGpuProbe

    env = {k: v for k, v in (("CUDA_VISIBLE_DEVICES", text), ("LOCAL_RANK", local_rank),
                             ("CUDA_DEVICE_ORDER", order)) if v is not None}
    for snap in (H100, H200, topologies.no_driver()):
        ctx = Context(config=Config(), env=env, gpu_probe=FixtureGpuProbe(snap))
        r = cuda_devices.run(ctx)
        assert r.message and r.reason


# -- verdicts on the single H200 VM (what will be rerun on the real machine) -----------------

def test_unset_sees_every_gpu(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100)
    assert (r.status, r.reason) == (Status.PASS, "CvdOk")
    assert "CUDA sees all 8 GPUs" in r.message
    assert visible_bus_ids(r) == list(topologies.H100_BUS_IDS)


def test_index_zero_on_h200(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H200, CUDA_VISIBLE_DEVICES="0")
    assert r.status is Status.PASS
    assert r.message == "CUDA_VISIBLE_DEVICES=0: CUDA sees only GPU 0 (0000:00:07.0)"


def test_unique_uuid_prefix(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H200, CUDA_VISIBLE_DEVICES="GPU-00a0")
    assert r.status is Status.PASS
    assert r.details["visible"][0]["uuid"] == H200_UUID


def test_full_uuid_maps_by_uuid_not_index(make_ctx: MakeCtx) -> None:
    uuid = H100.gpus[5].uuid
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES=uuid)
    assert r.status is Status.PASS
    assert visible_bus_ids(r) == ["0000:ab:00.0"]


def test_prefix_without_gpu_dash_is_read_as_an_index(make_ctx: MakeCtx) -> None:
    # GPU 1's UUID starts 11a0c1f2; without "GPU-" CUDA reads index 11, out of range on 8 GPUs.
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="11a0c1f2")
    assert (r.status, r.reason) == (Status.FAIL, "CvdStopsEarly")
    assert "without 'GPU-'" in r.message and "GPU 1" in r.message
    assert r.remedy == "Write GPU-11a0c1f2"


def test_prefix_without_gpu_dash_hitting_another_gpu_fails(make_ctx: MakeCtx) -> None:
    snap = topologies.snapshot([topologies.h100(i, b, uuid=f"GPU-{i}{'f' * 7}-0000")
                                for i, b in enumerate(topologies.H100_BUS_IDS[:4])])
    # "3fff" would be GPU 3's prefix; CUDA reads index 3 = GPU 3: by luck the same GPU.
    r = check(make_ctx, snap, CUDA_VISIBLE_DEVICES="3fff")
    assert (r.status, r.reason) == (Status.WARN, "CvdUuidWithoutPrefix")
    assert "the same GPU by luck" in r.message


def test_duplicate_index_fails_with_nccl_text(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H200, CUDA_VISIBLE_DEVICES="0,0")
    assert (r.status, r.reason) == (Status.FAIL, "CvdDuplicate")
    assert "Duplicate GPU detected" in r.message
    assert r.remedy.endswith("export CUDA_VISIBLE_DEVICES=0")
    assert r.details["visible_count"] == 0


def test_duplicate_by_index_and_prefix_of_same_gpu(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="GPU-22a0,GPU-22a0c1f2")
    assert (r.status, r.reason) == (Status.FAIL, "CvdDuplicate")


def test_index_out_of_range_on_one_gpu(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H200, CUDA_VISIBLE_DEVICES="5")
    assert (r.status, r.reason) == (Status.FAIL, "CvdStopsEarly")
    assert "index 5 is out of range: the node has 1 GPU (valid: 0)" in r.message
    assert "sees no GPU" in r.message


def test_stop_at_minus_one_names_entry_and_what_remains(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="0,-1,1")
    assert (r.status, r.reason) == (Status.FAIL, "CvdStopsEarly")
    assert r.message.startswith("CUDA_VISIBLE_DEVICES=0,-1,1: CUDA stops at '-1' (entry 2")
    assert "sees only GPU 0 (0000:18:00.0)" in r.message and "ignored after it: '1'" in r.message
    assert r.remedy.endswith("export CUDA_VISIBLE_DEVICES=0,1")
    assert r.details["stopped_at_entry"] == 2


def test_stop_at_minus_one_on_h200(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H200, CUDA_VISIBLE_DEVICES="0,-1,1")
    assert r.status is Status.FAIL
    assert "sees only GPU 0 (0000:00:07.0)" in r.message
    assert visible_bus_ids(r) == ["0000:00:07.0"]


def test_trailing_terminator_hides_nothing(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="0,1,-1")
    assert (r.status, r.reason) == (Status.WARN, "CvdTerminator")
    assert len(r.details["visible"]) == 2


def test_kinds_do_not_mix(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES=f"0,{H100.gpus[1].uuid}")
    assert (r.status, r.reason) == (Status.FAIL, "CvdStopsEarly")
    assert "gpu-uuid entry after index entries" in r.message


def test_ambiguous_prefix(make_ctx: MakeCtx) -> None:
    snap = topologies.shared_uuid_prefix()
    r = check(make_ctx, snap, CUDA_VISIBLE_DEVICES="GPU-8932f9")
    assert (r.status, r.reason) == (Status.FAIL, "CvdAmbiguousPrefix")
    assert "fits 2 GPUs" in r.message
    ok = check(make_ctx, snap, CUDA_VISIBLE_DEVICES="GPU-8932f93")
    assert ok.status is Status.PASS and visible_bus_ids(ok) == [topologies.H100_BUS_IDS[0]]


def test_unknown_uuid(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="GPU-00a0,GPU-deadbeef,GPU-11a0")
    assert (r.status, r.reason) == (Status.FAIL, "CvdStopsEarly")
    assert "no GPU has a UUID starting with it" in r.message
    assert "sees only GPU 0" in r.message


def test_one_mig_uuid(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, MIG, CUDA_VISIBLE_DEVICES=MIG0)
    assert r.status is Status.PASS
    assert r.details["visible"][0]["mig_uuid"] == MIG0


def test_two_mig_uuids_only_first_usable(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, MIG, CUDA_VISIBLE_DEVICES=f"{MIG0},{MIG1}")
    assert (r.status, r.reason) == (Status.FAIL, "CvdMultipleMig")
    assert [d["mig_uuid"] for d in r.details["visible"]] == [MIG0]
    assert MIG1 in r.message


def test_gpu_in_mig_mode_named_whole_warns(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, MIG)
    assert (r.status, r.reason) == (Status.WARN, "CvdMigGpu")
    assert r.details["visible"][0]["mig_uuid"] == MIG0


def test_empty_string_sees_nothing(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="")
    assert (r.status, r.reason) == (Status.FAIL, "CvdEmpty")
    assert "CUDA sees no GPU; the node has 8" in r.message


def test_local_rank_beyond_visible_set(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H200, CUDA_VISIBLE_DEVICES="0", LOCAL_RANK="2", LOCAL_WORLD_SIZE="4")
    assert (r.status, r.reason) == (Status.FAIL, "LocalRankOutOfRange")
    assert "LOCAL_RANK=2 and LOCAL_WORLD_SIZE=4 but CUDA sees only 1 GPU (cuda:0)" in r.message
    assert "invalid device ordinal" in r.message
    assert "torch.cuda.set_device(local_rank)" in r.remedy
    assert "device_ids=[local_rank]" in r.remedy


def test_local_world_size_alone_too_big(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="2,3", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4")
    assert (r.status, r.reason) == (Status.FAIL, "LocalWorldSizeTooBig")


def test_reordered_list_maps_local_rank(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="1,0", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    assert r.status is Status.PASS
    assert visible_bus_ids(r) == ["0000:2a:00.0", "0000:18:00.0"]
    assert "LOCAL_RANK 1 -> cuda:1 = GPU 0 (0000:18:00.0)" in r.message


def test_mixed_node_index_is_ambiguous_without_pci_order(make_ctx: MakeCtx) -> None:
    snap = topologies.cuda_order_differs()
    r = check(make_ctx, snap, CUDA_VISIBLE_DEVICES="1")
    assert (r.status, r.reason) == (Status.WARN, "CudaOrderAmbiguous")
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in r.remedy
    fixed = check(make_ctx, snap, CUDA_VISIBLE_DEVICES="1", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert fixed.status is Status.PASS and visible_bus_ids(fixed) == ["0000:3a:00.0"]
    by_uuid = check(make_ctx, snap, CUDA_VISIBLE_DEVICES=snap.gpus[1].uuid)
    assert by_uuid.status is Status.PASS


def test_homogeneous_node_needs_no_order_advice(make_ctx: MakeCtx) -> None:
    assert check(make_ctx, H100, CUDA_VISIBLE_DEVICES="3").status is Status.PASS


def test_unknown_device_order_value(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_DEVICE_ORDER="pci")
    assert (r.status, r.reason) == (Status.WARN, "CudaOrderUnknown")


def test_blanks_and_suffixes_warn(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, H100, CUDA_VISIBLE_DEVICES="0,1gpu")
    assert (r.status, r.reason) == (Status.WARN, "CvdNotClean")
    assert "CUDA ignores 'gpu'" in r.message


def test_slurm_prolog_reads_physical_indices(make_ctx: MakeCtx) -> None:
    r = check(make_ctx, topologies.cuda_order_differs(), CUDA_VISIBLE_DEVICES="1",
              SLURM_SCRIPT_CONTEXT="prolog_slurmd", LOCAL_RANK="5")
    assert r.status is Status.PASS  # no order guess, no local-rank judgement in a prolog
    assert "physical GPU numbers" in r.message


def test_expect_gpus_zero_skips(make_ctx: MakeCtx) -> None:
    r = cuda_devices.run(make_ctx(env={"CUDA_VISIBLE_DEVICES": "0,0"}, expect_gpus=0))
    assert (r.status, r.reason) == (Status.SKIP, "NoGpuExpected")


def test_without_nvml_text_problems_warn_else_skip(make_ctx: MakeCtx) -> None:
    nodrv = topologies.no_driver()
    assert check(make_ctx, nodrv).status is Status.SKIP
    assert check(make_ctx, nodrv, CUDA_VISIBLE_DEVICES="0,1").status is Status.SKIP
    dup = check(make_ctx, nodrv, CUDA_VISIBLE_DEVICES="0,0")
    assert (dup.status, dup.reason) == (Status.WARN, "CvdDuplicate")
    stop = check(make_ctx, nodrv, CUDA_VISIBLE_DEVICES="0,-1,1")
    assert (stop.status, stop.reason) == (Status.WARN, "CvdStopsEarly")
    assert check(make_ctx, nodrv, CUDA_VISIBLE_DEVICES="").status is Status.WARN


# -- the real CLI --------------------------------------------------------------------------

def test_cli_json_and_exit_code(tmp_path: Path) -> None:
    fixture = write_fixture(tmp_path / "h200.json", H200)
    rc, report = cli_json(["check", "--only", "cuda_devices,launcher_env"], fixture=fixture,
                          env={"CUDA_VISIBLE_DEVICES": "0,-1,1"})
    assert rc == 1
    (cvd_r, launch_r) = report["results"]
    assert (cvd_r["check"], cvd_r["status"], cvd_r["reason"]) == \
        ("cuda_devices", "fail", "CvdStopsEarly")
    assert cvd_r["details"]["visible"][0]["pci_bus_id"] == "0000:00:07.0"
    assert (launch_r["check"], launch_r["status"]) == ("launcher_env", "skip")

    rc, report = cli_json(["check", "--only", "cuda_devices,launcher_env"], fixture=fixture,
                          env={"CUDA_VISIBLE_DEVICES": "0", "TORCHELASTIC_RUN_ID": "j1",
                               "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                               "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
                               "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1",
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    assert rc == 0, report
    assert [r["status"] for r in report["results"]] == ["pass", "pass"]

    rc, report = cli_json(["check", "--only", "cuda_devices,launcher_env"], fixture=fixture,
                          env={"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "2",
                               "LOCAL_WORLD_SIZE": "4"})
    assert rc == 1
    by = {r["check"]: r for r in report["results"]}
    assert by["cuda_devices"]["reason"] == "LocalRankOutOfRange"
    assert by["launcher_env"]["reason"] == "LauncherVarMissing"
    assert "RANK" in by["launcher_env"]["message"]
