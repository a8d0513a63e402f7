"""The Xid line parser and the two kernel log forms, on literal strings and with hypothesis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from preflight.probes.kernlog import (
    XID_TABLE,
    LogLine,
    XidClass,
    classify,
    gpu_key,
    parse_journal,
    parse_kmsg,
    parse_xid,
    scan,
    xids,
)

# Lines as drivers print them (NVIDIA's docs and public bug reports quote these forms).
FELL_OFF = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
REMAP = ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
         "reset gpu to activate.")
MMU = ("NVRM: Xid (PCI:0000:08:00): 31, Ch 0000003b, intr 10000000. MMU Fault: ENGINE GRAPHICS "
       "HUBCLIENT_SCC faulted @ 0x0_04687000. Fault is of type FAULT_PDE ACCESS_TYPE_READ")
OLD_DRIVER = "NVRM: Xid (0000:01:00): 13, 0001 00000000 0000c197 00001b0c 00000000 00000000"


def test_fell_off_the_bus() -> None:
    x = parse_xid(LogLine(FELL_OFF, 12.5))
    assert x is not None
    assert (x.bus_id, x.code, x.uptime_s) == ("0000:2b:00", 79, 12.5)
    assert x.detail == "GPU has fallen off the bus."
    assert x.info.cls is XidClass.NODE


def test_pid_detail_and_job_class() -> None:
    remap, mmu = parse_xid(LogLine(REMAP)), parse_xid(LogLine(MMU))
    assert remap is not None and mmu is not None
    assert (remap.bus_id, remap.code, remap.info.cls) == ("0000:10:1c", 63, XidClass.NODE)
    assert remap.detail.startswith("pid=1896, Row Remapper")
    assert (mmu.code, mmu.info.cls) == (31, XidClass.JOB)


def test_old_driver_form_without_pci_prefix() -> None:
    x = parse_xid(LogLine(OLD_DRIVER))
    assert x is not None and (x.bus_id, x.code) == ("0000:01:00", 13)


def test_not_xid_lines() -> None:
    for text in ("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014", "NVRM: Xid (PCI:0000:2b:00): ",
                 "Xid 79 in a user's message without NVRM", "", "NVRM: Xid (PCI:zz:2b:00): 79,"):
        assert parse_xid(LogLine(text)) is None, text


def test_issue_codes_classified_as_the_issue_says() -> None:
    for code in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120):
        assert classify(code).cls is XidClass.NODE, code
    for code in (13, 31, 43):
        assert classify(code).cls is XidClass.JOB, code
    assert classify(9999).cls is XidClass.UNKNOWN
    assert all(info.action for info in XID_TABLE.values())


def test_kmsg_records_with_continuations() -> None:
    text = ("6,1,0,-;Linux version 6.8.0\n"
            f"3,512,3600000000,-;{FELL_OFF}\n"
            " SUBSYSTEM=pci\n"
            " DEVICE=+pci:0000:2b:00.0\n"
            "4,513,3600500000,c;NVRM: Xid (PCI:0000:2b:00): 79, \\x1b[1mbold\\x1b[0m\n")
    lines = list(parse_kmsg(text))
    assert [ln.uptime_s for ln in lines] == [0.0, 3600.0, 3600.5]
    found = xids(lines)
    assert [(x.code, x.uptime_s) for x in found] == [(79, 3600.0), (79, 3600.5)]
    assert "\x1b" in found[1].detail  # \xNN escapes undone


def test_journal_short_monotonic() -> None:
    text = ("-- Boot 1c2d --\n"
            f"[ 7200.123456] gpu-node-7 kernel: {REMAP}\n"
            "[    1.000000] gpu-node-7 kernel: Linux version 6.8.0\n")
    found = xids(parse_journal(text))
    assert [(x.code, x.uptime_s) for x in found] == [(63, 7200.123456)]


def test_gpu_key_matches_nvml_form() -> None:
    assert gpu_key("00000000:2B:00.0") == "0000:2b:00"
    assert gpu_key("0000:2b:00.0") == "0000:2b:00"


hexes = st.text(alphabet="0123456789abcdefABCDEF", min_size=1, max_size=2)


@given(domain=st.text(alphabet="0123456789abcdef", min_size=1, max_size=8), bus=hexes,
       dev=hexes, code=st.integers(0, 99999), pci=st.booleans(),
       detail=st.text(max_size=300).filter(lambda s: "\n" not in s and "\r" not in s),
       prefix=st.text(max_size=40).filter(lambda s: "NVRM" not in s))
def test_any_well_formed_xid_line_parses(domain: str, bus: str, dev: str, code: int, pci: bool,
                                         detail: str, prefix: str) -> None:
    line = f"{prefix}NVRM: Xid ({'PCI:' if pci else ''}{domain}:{bus}:{dev}): {code}, {detail}"
    x = parse_xid(LogLine(line))
    assert x is not None
    assert x.code == code
    assert x.bus_id == f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"
    assert len(x.detail) <= 240


@given(st.text(max_size=2000))
def test_arbitrary_text_never_raises(text: str) -> None:
    for line in [*parse_kmsg(text), *parse_journal(text)]:
        x = parse_xid(line)
        assert x is None or x.code >= 0


record = st.one_of(
    st.builds(lambda t, code: f"3,1,{t},-;NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, x",
              st.integers(0, 10**12), st.integers(0, 200)),
    st.builds(lambda t, text: f"6,2,{t},-;{text}", st.integers(0, 10**12),
              st.text(max_size=60).filter(lambda s: "\n" not in s and "\r" not in s)),
    st.just(" SUBSYSTEM=pci"))


@given(st.lists(record, max_size=40))
def test_scan_finds_what_the_full_parse_finds(records: list[str]) -> None:
    text = "\n".join(records)
    full = list(parse_kmsg(text))
    found, first = scan(text, "kmsg")
    assert found == xids(full)
    if full and full[0].uptime_s is not None and records[0][0] != " ":
        assert first == full[0].uptime_s
