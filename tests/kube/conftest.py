"""A test API server (tests/kube/apiserver.py) with a small GPU fleet, and the daemon's token."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.apiserver import (
    ApiServer,
    Cluster,
    iter_rules,
    make_certificates,
    node_object,
    write_kubeconfig,
)

NODE = "gpu-1"
#: The label GPU feature discovery puts on GPU nodes; the guard compares GPU nodes with each other.
GPU_LABEL = "nvidia.com/gpu.present"
GPU_NODES = [f"gpu-{i}" for i in range(1, 11)]
#: A taint another tool put on the daemon's node (GPU operator style), and a cordon.
OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl makes the test server's certificates")
    return make_certificates(tmp_path_factory.mktemp("kube-ca"))


@pytest.fixture
def cluster(tmp_path: Path, certificates: tuple[Path, Path, Path]) -> Iterator[Cluster]:
    """Ten GPU nodes (the daemon runs on gpu-1, which carries another tool's taint), one CPU
    node, a token allowed what the chart's RBAC allows with the taint and the guard on."""
    server = ApiServer(certificates)
    for name in GPU_NODES:
        server.add_node(node_object(name, labels={GPU_LABEL: "true"},
                                    taints=[dict(OTHER_TAINT)] if name == NODE else None))
    server.add_node(node_object("cpu-1"))
    token = "daemon-token-0123456789"
    server.add_token(token, "system:serviceaccount:monitoring:pf-cluster-preflight",
                     set(iter_rules(taint=True, guard=True)))
    server.start()
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    try:
        yield Cluster(server, token, write_kubeconfig(tmp_path / "kubeconfig", server,
                                                      token_file),
                      extra={"token_file": token_file})
    finally:
        server.stop()
