"""Rendering the Helm chart with Helm's own engine (helm-python-sdk embeds Helm v4's library; no
helm binary), and validating manifests with kubernetes-validate --strict."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import REPO

CHART = REPO / "helm" / "cluster-preflight"
EXAMPLES = REPO / "deploy" / "kubernetes"
RULES = REPO / "deploy" / "prometheus" / "preflight-rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "preflight-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "preflight-dashboard.json"
#: Kinds of the Prometheus operator: no schema in kubernetes-validate, checked on their own.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
#: The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema known.
KUBE_VERSIONS = ("1.26.0", "1.37.0")
ALL_ON = {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
          "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
          "dashboard": {"enabled": True}, "runtimeClassName": "nvidia",
          "priorityClassName": "system-node-critical",
          "imagePullSecrets": [{"name": "regcred"}],
          "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
              "nodeSelectorTerms": [{"matchExpressions": [
                  {"key": "nvidia.com/gpu.product", "operator": "Exists"}]}]}}},
          "podAnnotations": {"example.com/team": "ml-infra"},
          "podLabels": {"example.com/cost-centre": "gpu"},
          "extraArgs": ["--bandwidth-interval", "7200"],
          "env": [{"name": "PREFLIGHT_LOG_LEVEL", "value": "info"}],
          "extraVolumes": [{"name": "golden", "configMap": {"name": "golden-fingerprint"}}],
          "extraVolumeMounts": [{"name": "golden", "mountPath": "/etc/preflight-golden",
                                 "readOnly": True}],
          "kernelLog": {"source": "journal", "hostPath": "/run/log", "groups": [4, 101]},
          "bandwidthTest": {"enabled": True, "gpusPerNode": 4, "memoryBaseMi": 256,
                            "memoryPerGpuMi": 768},
          "nodeStatus": {"enabled": True, "failRuns": 2, "passRuns": 4, "taint": True,
                         "maxMarkedFraction": 0.2, "guardSelector": "example.com/pool=a100",
                         "heartbeatSeconds": 120},
          "kubeRbacProxy": {"enabled": True, "tlsSecret": "preflight-proxy-tls"}}

helm = pytest.importorskip("helm_python", reason="helm-python-sdk not installed (test extra)")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")


def render(values: dict[str, Any] | None = None, *, name: str = "pf",
           namespace: str = "monitoring") -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would print it."""
    chart = helm.Chart.load(str(CHART))
    out: dict[str, str] = chart.render(values or {}, name=name, namespace=namespace,
                                       is_install=True)
    return out


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def kubernetes_validate(files: Iterable[Path], version: str) -> subprocess.CompletedProcess[str]:
    """The kubernetes-validate command line, strict (unknown fields are errors)."""
    exe = Path(sys.executable).with_name("kubernetes-validate")
    return subprocess.run([str(exe), "--strict", "--no-warn", "-k", version,
                           *map(str, files)], capture_output=True, text=True, timeout=120,
                          check=False)


def write_docs(path: Path, docs: Iterable[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return path
