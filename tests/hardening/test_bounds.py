"""Numbers and names from the command line and the job's environment: bounded, judged, never a
crash (issue #11 points 4 and 6)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from preflight.jobenv.netvars import ParseError, parse_master_addr
from tests.helpers import cli_json, run_cli


@pytest.mark.parametrize(("args", "words"), [
    (["bench", "--nproc", "100000"], "argument --nproc: '100000' ranks: expected 1..64"),
    (["bench", "--nproc", "9" * 5000], "expected 1..64"),
    (["bench", "--timeout", "inf"], "bench_timeout_s must be a finite number"),
    (["bench", "--max-bytes", "1T"], "expected 4 bytes .. 64G"),
    (["bench", "--min-busbw", "nan"], "min_busbw_gbps must be a finite number"),
    (["check", "--timeout", "inf"], "check_timeout_s must be a finite number"),
    (["check", "--expect-gpus", "100000"], "expect_gpus must be a finite number in 0..1024"),
    (["serve", "--interval", "inf"], "interval_s must be a finite number"),
    (["serve", "--listen", "127.0.0.1:99999"], "listen must be HOST:PORT with a port in"),
])
def test_out_of_range_arguments_exit_2_before_doing_anything(args: list[str],
                                                             words: str) -> None:
    started = time.monotonic()
    proc = run_cli(args, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 20  # no worker was started


def test_master_addr_with_an_empty_label_is_a_fail_with_the_reason() -> None:
    rc, report = cli_json(["check", "--only", "network,master_port", "--expect-gpus", "0",
                           "--multi-node"],
                          env={"MASTER_ADDR": "a..b", "MASTER_PORT": "29500", "RANK": "1",
                               "WORLD_SIZE": "2"})
    assert rc == 1
    by_check = {r["check"]: r for r in report["results"]}
    # One fault, one owner: master_port reports the address; network does not repeat it.
    assert by_check["master_port"]["status"] == "fail", by_check["master_port"]
    assert by_check["master_port"]["reason"] == "MasterAddrInvalid"
    assert "empty label" in by_check["master_port"]["message"]
    assert by_check["network"]["status"] != "fail", by_check["network"]


@pytest.mark.parametrize("value", ["a..b", ".a", "a" * 64 + ".example", "..", ".", "é" * 60])
def test_parse_master_addr_rejects_bad_labels(value: str) -> None:
    with pytest.raises(ParseError, match="not a valid hostname"):
        parse_master_addr(value)


@pytest.mark.parametrize("value", ["node-1", "node-1.cluster.local", "node-1.cluster.local.",
                                   "a" * 63 + ".b"])
def test_parse_master_addr_keeps_good_names(value: str) -> None:
    assert parse_master_addr(value).kind == "hostname"


@given(st.text(max_size=300))
def test_parse_master_addr_raises_only_parse_error(value: str) -> None:
    """Any text: ParseError or a name getaddrinfo can take (what it accepts encodes as IDNA)."""
    try:
        addr = parse_master_addr(value)
    except ParseError:
        return
    if addr.kind == "hostname":
        value.encode("idna")  # raises UnicodeError for the names that crashed the check
