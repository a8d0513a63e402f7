"""Real PyTorch (CPU, gloo, TCPStore) errors, produced here, are recognised: the samples' formats
are checked against the installed torch, not only against our own writing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from preflight.explain import classify_texts

pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import datetime, os, socket, sys, traceback
    import torch.distributed as dist

    def free_port():
        s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
        return p

    def case(name, fn):
        print(f"=== {name}", file=sys.stderr, flush=True)
        try:
            fn()
        except Exception:
            traceback.print_exc()
        sys.stderr.flush()

    def env():
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(k, None)
        dist.init_process_group("gloo", init_method="env://")

    held = socket.socket(); held.bind(("127.0.0.1", 0)); held.listen()
    def port():
        dist.TCPStore("127.0.0.1", held.getsockname()[1], 1, True,
                      timeout=datetime.timedelta(seconds=1))

    def connect():
        dist.TCPStore("127.0.0.1", free_port(), 2, False, timeout=datetime.timedelta(seconds=1))

    def iface():
        os.environ.update(GLOO_SOCKET_IFNAME="nosuch9", RANK="0", WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo")

    for name, fn in (("env", env), ("port", port), ("connect", connect), ("iface", iface)):
        case(name, fn)
    held.close()
''')


def test_real_torch_errors_are_classified() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=90, check=False)
    parts = {}
    for chunk in proc.stderr.split("=== ")[1:]:
        name, _, body = chunk.partition("\n")
        parts[name.strip()] = body
    assert set(parts) == {"env", "port", "connect", "iface"}, proc.stderr[-2000:]
    want = {"env": "MissingLauncherEnv", "port": "PortInUse", "connect": "RendezvousTimeout",
            "iface": "NoSocketInterface"}
    for name, reason in want.items():
        expl = classify_texts([(name, parts[name])])
        assert [f.reason for f in expl.findings][:1] == [reason], parts[name][-1500:]
