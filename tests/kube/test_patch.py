"""The test API server's patch semantics on literal documents (so the writer's tests stand on
the API's rules), and the client's kubeconfig reading."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from preflight.daemon.kubeapi import KubeConfigError, find_credentials, from_kubeconfig
from tests.kube.patch import PatchError, definition, json_patch, merge_patch, strategic_merge

NODE = definition("io.k8s.api.core.v1.Node")
BASE = {
    "metadata": {"name": "n", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
    "spec": {"taints": [{"key": "t1", "effect": "NoSchedule"}]},
    "status": {"conditions": [{"type": "Ready", "status": "True"},
                              {"type": "DiskPressure", "status": "False"}]},
}


def test_strategic_merge_merges_conditions_by_type_and_replaces_taints() -> None:
    patch = {"status": {"conditions": [{"type": "PreflightFailed", "status": "True"},
                                       {"type": "Ready", "reason": "KubeletReady"}]},
             "spec": {"taints": [{"key": "t2", "effect": "NoExecute"}]},
             "metadata": {"labels": {"a": None, "c": "3"}, "finalizers": ["y"]}}
    out = strategic_merge(BASE, patch, NODE)
    assert out["status"]["conditions"] == [
        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
        {"type": "DiskPressure", "status": "False"},
        {"type": "PreflightFailed", "status": "True"}]
    assert out["spec"]["taints"] == [{"key": "t2", "effect": "NoExecute"}], "atomic list"
    assert out["metadata"]["labels"] == {"b": "2", "c": "3"}, "null deletes a map key"
    assert out["metadata"]["finalizers"] == ["x", "y"], "a set merges"
    assert BASE["status"]["conditions"][0] == {"type": "Ready", "status": "True"}, "no mutation"


def test_strategic_merge_directives() -> None:
    out = strategic_merge(BASE, {"status": {"conditions": [
        {"type": "DiskPressure", "$patch": "delete"}]}}, NODE)
    assert [c["type"] for c in out["status"]["conditions"]] == ["Ready"]
    out = strategic_merge(BASE, {"metadata": {"labels": {"$patch": "replace", "z": "9"}}}, NODE)
    assert out["metadata"]["labels"] == {"z": "9"}
    out = strategic_merge(BASE, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}},
                          NODE)
    assert out["metadata"]["finalizers"] == []
    out = strategic_merge(BASE, {"status": {"$setElementOrder/conditions": [
        {"type": "DiskPressure"}, {"type": "Ready"}]}}, NODE)
    assert [c["type"] for c in out["status"]["conditions"]] == ["DiskPressure", "Ready"]
    with pytest.raises(PatchError) as err:
        strategic_merge(BASE, {"status": {"conditions": [{"status": "True"}]}}, NODE)
    assert err.value.status == 400 and "merge key" in str(err.value)


def test_json_patch_is_all_or_nothing_and_a_failed_test_is_422() -> None:
    ops = [{"op": "add", "path": "/spec/taints/-", "value": {"key": "t3", "effect": "NoSchedule"}},
           {"op": "test", "path": "/metadata/name", "value": "other"}]
    with pytest.raises(PatchError) as err:
        json_patch(BASE, ops)
    assert err.value.status == 422
    assert len(BASE["spec"]["taints"]) == 1
    out = json_patch(BASE, [
        {"op": "add", "path": "/metadata/labels/cluster-preflight~1node-fault", "value": "X"},
        {"op": "remove", "path": "/spec/taints/0"},
        {"op": "move", "from": "/metadata/labels/a", "path": "/metadata/labels/moved"},
        {"op": "copy", "from": "/metadata/name", "path": "/metadata/labels/copied"},
        {"op": "replace", "path": "/status/conditions/1/status", "value": "True"}])
    assert out["metadata"]["labels"] == {"b": "2", "cluster-preflight/node-fault": "X",
                                         "moved": "1", "copied": "n"}
    assert out["spec"]["taints"] == []
    assert out["status"]["conditions"][1]["status"] == "True"
    with pytest.raises(PatchError) as err:
        json_patch(BASE, [{"op": "remove", "path": "/spec/nothing"}])
    assert err.value.status == 422
    with pytest.raises(PatchError) as err:
        json_patch(BASE, {"op": "add"})
    assert err.value.status == 400


def test_merge_patch_replaces_lists() -> None:
    out = merge_patch(BASE, {"status": {"conditions": [{"type": "X", "status": "True"}]},
                             "metadata": {"labels": {"b": None}}})
    assert out["status"]["conditions"] == [{"type": "X", "status": "True"}]
    assert out["metadata"]["labels"] == {"a": "1"}


def _kubeconfig(path: Path, **user: object) -> Path:
    path.write_text(json.dumps({
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443",
                                               "certificate-authority": "ca.crt"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_kubeconfig_reading(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first = _kubeconfig(tmp_path / "a" / "config", tokenFile="token")
    creds = from_kubeconfig([str(first)])
    assert creds.server == "https://10.0.0.1:6443"
    assert creds.ca_file == str(tmp_path / "a" / "ca.crt"), "relative to the kubeconfig"
    assert creds.token_file == str(tmp_path / "a" / "token")
    # merged as kubectl merges $KUBECONFIG: the first file that names a context wins
    second = tmp_path / "second"
    second.write_text(json.dumps({"current-context": "other", "contexts": [
        {"name": "c", "context": {"cluster": "elsewhere", "user": "u"}}]}))
    creds = from_kubeconfig([str(tmp_path / "missing"), str(first), str(second)])
    assert creds.server == "https://10.0.0.1:6443"
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    data = _kubeconfig(tmp_path / "data", **{
        "client-certificate-data": base64.b64encode(pem.encode()).decode(),
        "client-key-data": base64.b64encode(b"key").decode()})
    assert from_kubeconfig([str(data)]).cert_data == pem


@pytest.mark.parametrize(("user", "message"), [
    ({"exec": {"command": "aws"}}, "exec plugin"),
    ({"auth-provider": {"name": "gcp"}}, "auth-provider plugin"),
    ({"client-key-data": "not base64!"}, "not base64"),
])
def test_kubeconfig_refusals_are_clear(tmp_path: Path, user: dict[str, object],
                                       message: str) -> None:
    with pytest.raises(KubeConfigError, match=message):
        from_kubeconfig([str(_kubeconfig(tmp_path / "config", **user))])


def test_no_credentials_at_all_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError) as err:
        find_credentials({"HOME": str(tmp_path)}, account_dir=tmp_path / "sa")
    assert "ServiceAccount token" in str(err.value)
    assert str(tmp_path / ".kube" / "config") in str(err.value)
