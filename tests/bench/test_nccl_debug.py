"""The NCCL_DEBUG=INFO summary on literal log text."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from preflight.bench.nccl_debug import summarize

LOG = """\
h200:4242:4242 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>
h200:4242:4242 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
NCCL version 2.21.5+cuda12.4
h200:4242:4301 [0] NCCL INFO NET/IB : No device found.
h200:4242:4301 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0> [1]eth1:10.1.0.5<0>
h200:4242:4301 [0] NCCL INFO Using network Socket
h200:4242:4301 [0] NCCL INFO Channel 00/24 :    0   1
h200:4242:4301 [0] NCCL INFO Channel 23/24 :    0   1
h200:4242:4301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
h200:4242:4301 [0] NCCL INFO Channel 01/0 : 0[18000] -> 1[2a000] via P2P/CUMEM/read
h200:4243:4302 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct
h200:4242:4301 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels
h200:4242:4301 [0] NCCL WARN Cuda failure 'out of memory'
"""


def test_summary_names_version_transport_interface_channels() -> None:
    s = summarize(LOG)
    assert s.version == "2.21.5+cuda12.4"
    assert s.network == "Socket"
    assert s.interfaces == ["eth0", "eth1"]
    assert s.bootstrap == "eth0:10.0.0.5<0>"
    assert s.transports == ["P2P/CUMEM/read", "SHM/direct/direct"]
    assert s.channels == 24 and s.nvls_channels == 0
    assert s.env == {"NCCL_SOCKET_IFNAME": "eth0"}
    assert s.warnings == ["Cuda failure 'out of memory'"]
    text = s.text()
    assert "NCCL 2.21.5+cuda12.4" in text and "24 channels" in text
    assert "network Socket via eth0, eth1" in text and "NCCL_SOCKET_IFNAME=eth0" in text


def test_channel_count_from_ring_lines_when_the_total_is_not_printed() -> None:
    log = "\n".join(line for line in LOG.splitlines() if "coll channels" not in line)
    assert summarize(log).channels == 24


def test_nothing_from_nccl() -> None:
    s = summarize("Traceback (most recent call last):\nRuntimeError: boom\n")
    assert s.empty
    assert "printed nothing" in s.text()


@given(st.text())
def test_never_raises(text: str) -> None:
    summarize(text).text()
    summarize("NCCL INFO " + text).to_json()
