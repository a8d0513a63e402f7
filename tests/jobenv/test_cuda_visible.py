"""CUDA_VISIBLE_DEVICES read as CUDA reads it (jobenv.cuda_visible), on literal strings and
fixture topologies: the parser and the walk, without the check around them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.jobenv import cuda_visible
from preflight.jobenv.cuda_visible import ORDER_PCI, Kind, parse, resolve_devices, text_problems
from tests import topologies

H200 = topologies.single_h200_vm()
H100 = topologies.healthy_8x_h100()
MIG = topologies.mig(2)
MIG0, MIG1 = (m.uuid for m in MIG.gpus[0].mig_instances)


def bus_ids(text: str | None, snap: object = H100, **kw: object) -> list[str]:
    res = resolve_devices(parse(text), snap, **kw)  # type: ignore[arg-type]
    return [d.gpu.pci_bus_id for d in res.devices]


@pytest.mark.parametrize(("text", "kind", "index", "trailing"), [
    ("0", Kind.INDEX, 0, ""),
    (" 3", Kind.INDEX, 3, ""),
    ("+2", Kind.INDEX, 2, ""),
    ("-1", Kind.INDEX, -1, ""),
    ("1gpu2", Kind.INDEX, 1, "gpu2"),  # strtoul: "1gpu2,2ampere" is "1,2"
    ("", Kind.INVALID, None, ""),
    ("abc", Kind.INVALID, None, ""),
    ("GPU-", Kind.INVALID, None, ""),
    ("GPU-8932f937", Kind.GPU_UUID, None, ""),
    ("MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/2", Kind.MIG, None, ""),
    ("MIG-GPU-8932f937/x/2", Kind.INVALID, None, ""),
    ("MIG-4f1c2b3a", Kind.MIG, None, ""),
])
def test_entry_kinds(text: str, kind: cuda_visible.Kind, index: int | None, trailing: str) -> None:
    e = cuda_visible.parse_entry(1, text)
    assert (e.kind, e.index, e.trailing) == (kind, index, trailing)


def test_unset_and_empty_differ() -> None:
    assert cuda_visible.parse(None).unset and cuda_visible.parse(None).entries is None
    assert cuda_visible.parse("").empty and cuda_visible.parse("").entries == ()


def test_mig_gi_ci_form_resolves_to_the_instance() -> None:
    parent = MIG.gpus[0].uuid
    res = cuda_visible.resolve_devices(cuda_visible.parse(f"MIG-{parent}/2/0"), MIG)
    assert [d.mig.uuid for d in res.devices if d.mig] == [MIG1]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.text(), st.lists(
    st.sampled_from(["0", "1", "-1", "7", "", " 2", "GPU-", "GPU-00a0", "GPU-11a0c1f2", "MIG-",
                     f"MIG-{MIG0}", f"MIG-{MIG1}", "MIG-GPU-00a0c1f2/1/0", "x", "1a", "00a0c1f2",
                     "99999999999999999999999"]), max_size=6).map(",".join)))
def test_any_text_resolves_without_exception(text: str | None) -> None:
    parsed = cuda_visible.parse(text)
    for snap in (H100, MIG, H200, topologies.cuda_order_differs(),
                 topologies.shared_uuid_prefix()):
        res = cuda_visible.resolve_devices(parsed, snap)
        # CUDA never exposes more devices than the node has, nor one device twice.
        keys = [(d.gpu.uuid, d.mig.uuid if d.mig else None) for d in res.devices]
        assert len(keys) == len(set(keys)) <= len(snap.gpus) + sum(
            len(g.mig_instances) for g in snap.gpus)
        assert sum(1 for d in res.devices if d.mig) <= 1
        assert [d.cuda_index for d in res.devices] == list(range(len(res.devices)))
    cuda_visible.text_problems(parsed)


def test_entries_keep_their_text_and_position() -> None:
    parsed = parse("3, 1,GPU-x")
    assert [(e.position, e.raw) for e in parsed.entries or ()] == [(1, "3"), (2, " 1"),
                                                                   (3, "GPU-x")]


def test_indices_map_to_pci_order_and_cuda_numbers_them_from_zero() -> None:
    res = resolve_devices(parse("3,1"), H100)
    assert [(d.cuda_index, d.gpu.index) for d in res.devices] == [(0, 3), (1, 1)]
    assert res.stop is None and res.uses_indices


def test_enumeration_stops_at_the_first_invalid_entry() -> None:
    res = resolve_devices(parse("0,2,-1,1"), H100)
    assert [d.gpu.index for d in res.devices] == [0, 2]
    assert res.stop is not None and res.stop.entry.raw == "-1"
    assert [e.raw for e in res.stop.dropped] == ["1"]
    assert not res.stop.harmless  # "1" is hidden behind the stop


def test_a_trailing_minus_one_is_a_harmless_terminator() -> None:
    res = resolve_devices(parse("0,1,-1"), H100)
    assert res.stop is not None and res.stop.harmless


def test_out_of_range_index_names_the_valid_range() -> None:
    res = resolve_devices(parse("1"), H200)
    assert res.devices == () and res.stop is not None
    assert res.stop.why == "index 1 is out of range: the node has 1 GPU (valid: 0)"


def test_a_second_kind_ends_the_list() -> None:
    res = resolve_devices(parse(f"0,{H100.gpus[1].uuid}"), H100)
    assert [d.gpu.index for d in res.devices] == [0]
    assert res.stop is not None and "after index entries" in res.stop.why


def test_a_device_listed_twice_exposes_nothing() -> None:
    res = resolve_devices(parse("0,1,0"), H100)
    assert res.devices == () and res.duplicate is not None
    assert [e.position for e in res.duplicate] == [1, 3]


def test_text_after_an_index_is_ignored_with_a_note() -> None:
    res = resolve_devices(parse("1gpu"), H100)
    assert [d.gpu.index for d in res.devices] == [1]
    assert res.notes == ((1, "entry 1 '1gpu' reads as index 1: CUDA ignores 'gpu'"),)


def test_uuid_prefix_that_fits_two_gpus_is_ambiguous() -> None:
    snap = topologies.shared_uuid_prefix()
    res = resolve_devices(parse("GPU-8932f9"), snap)
    assert res.devices == () and res.ambiguous is not None
    assert len(res.ambiguous[1]) == 2
    assert bus_ids("GPU-8932f93", snap) == [snap.gpus[0].pci_bus_id]


def test_mixed_models_make_fastest_first_a_guess_and_pci_bus_id_exact() -> None:
    snap = topologies.cuda_order_differs()
    assert resolve_devices(parse("0"), snap).order_ambiguous
    exact = resolve_devices(parse("0"), snap, device_order=ORDER_PCI)
    assert not exact.order_ambiguous and exact.order == ORDER_PCI


def test_a_prolog_reads_physical_nvml_indices() -> None:
    res = resolve_devices(parse("1"), topologies.cuda_order_differs(), physical_indices=True)
    assert [d.gpu.index for d in res.devices] == [1] and res.physical_indices


def test_a_whole_mig_gpu_exposes_its_first_instance() -> None:
    res = resolve_devices(parse("0"), MIG)
    assert [d.mig.uuid for d in res.devices if d.mig] == [MIG0]
    assert res.mig_parents == (MIG.gpus[0],)


def test_only_the_first_mig_instance_is_usable() -> None:
    res = resolve_devices(parse(f"{MIG0},{MIG1}"), MIG)
    assert [d.mig.uuid for d in res.devices if d.mig] == [MIG0]
    assert [e.raw for e in res.mig_dropped] == [MIG1]


@pytest.mark.parametrize(("text", "stop_raw", "duplicate"), [
    ("0,1", None, None),
    ("0,x,1", "x", None),
    ("0,-1", "-1", None),
    ("0,GPU-ab", "GPU-ab", None),
    ("2,2", None, ("2", "2")),
])
def test_text_problems_need_no_gpus(text: str, stop_raw: str | None,
                                    duplicate: tuple[str, str] | None) -> None:
    stop, dup = text_problems(parse(text))
    assert (stop.entry.raw if stop else None) == stop_raw
    assert ((dup[0].raw, dup[1].raw) if dup else None) == duplicate
