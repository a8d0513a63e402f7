"""The gate: the example training Jobs of deploy/kubernetes/. Valid Kubernetes (strict), the init
container's command accepted by the real CLI, and each verdict's exit code mapped by the Job's
podFailurePolicy to what docs/kubernetes.md promises."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

from preflight.core.result import ExitCode
from tests.helpers import run_cli, write_fixture
from tests.k8s.conftest import EXAMPLES, KUBE_VERSIONS, kubernetes_validate
from tests.topologies import healthy_8x_h100, lost_gpu

JOBS = sorted(EXAMPLES.glob("*.yaml"))
#: podFailurePolicy rules with onExitCodes alone validate from 1.29 on (docs/kubernetes.md).
EXAMPLE_KUBE_VERSIONS = ("1.29.0", KUBE_VERSIONS[-1])
#: What each verdict of the node gate does to the pod (docs/kubernetes.md).
NODE_GATE = {ExitCode.FAILED: "Ignore", ExitCode.USAGE: "FailJob", ExitCode.UNDECIDED: "Count"}


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def job(path: Path) -> dict[str, Any]:
    """The example's Job; for a JobSet, the Job its one replicated job creates."""
    docs = load(path)
    sets = [d for d in docs if d["kind"] == "JobSet"]
    if sets:
        (jobset,) = sets
        (replicated,) = jobset["spec"]["replicatedJobs"]
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": f"{jobset['metadata']['name']}-{replicated['name']}-0"},
                "spec": replicated["template"]["spec"]}
    (found,) = [d for d in docs if d["kind"] == "Job"]
    return found


def action(job_: dict[str, Any], container: str, code: int) -> str | None:
    """The first podFailurePolicy rule that matches an exit code of a container, as the Job
    controller evaluates them (in order; a rule without containerName matches any container)."""
    for rule in job_["spec"]["podFailurePolicy"]["rules"]:
        on = rule.get("onExitCodes")
        if on is None or on.get("containerName", container) != container:
            continue
        if (code in on["values"]) == (on["operator"] == "In"):
            return str(rule["action"])
    return None


def init(job_: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in job_["spec"]["template"]["spec"]["initContainers"]
                if c["name"] == name]
    return found


def test_examples_exist() -> None:
    assert [p.name for p in JOBS] == ["gang-job.yaml", "training-job.yaml"]


@pytest.mark.parametrize("version", EXAMPLE_KUBE_VERSIONS)
def test_the_example_jobs_are_valid_kubernetes(version: str, tmp_path: Path) -> None:
    """Every core object strict-valid; the JobSet (a CRD, no schema in kubernetes-validate) by
    the Job it creates, and its own fields by the gang test below."""
    files = []
    for path in JOBS:
        core = [d for d in load(path) if d["kind"] != "JobSet"]
        if len(core) != len(load(path)):
            core.append(job(path))
        out = tmp_path / path.name
        out.write_text(yaml.safe_dump_all(core))
        files.append(out)
    proc = kubernetes_validate(files, version)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_each_verdict_of_the_node_gate_does_what_the_docs_say(path: Path) -> None:
    j = job(path)
    assert j["spec"]["template"]["spec"]["restartPolicy"] == "Never", "podFailurePolicy needs it"
    for code, expected in NODE_GATE.items():
        assert action(j, "preflight", code) == expected, (path.name, code)
    # the trainer's own exit codes are not touched by the gate's rules
    assert action(j, "trainer", 1) is None


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_the_gate_sees_the_trainers_gpus_and_shm(path: Path) -> None:
    spec = job(path)["spec"]["template"]["spec"]
    gate = init(job(path), "preflight")
    (trainer,) = spec["containers"]
    assert gate["resources"]["limits"]["nvidia.com/gpu"] == trainer["resources"]["limits"][
        "nvidia.com/gpu"]

    def shm(c: dict[str, Any]) -> str:
        (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        return str(m["name"])

    assert shm(gate) == shm(trainer)
    (vol,) = [v for v in spec["volumes"] if v["name"] == shm(gate)]
    assert vol["emptyDir"]["medium"] == "Memory", "a pod's default /dev/shm is 64 MiB"
    expect = gate["args"][gate["args"].index("--expect-gpus") + 1]
    assert int(expect) == trainer["resources"]["limits"]["nvidia.com/gpu"]


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.stem)
def test_the_gates_command_passes_a_good_node_and_fails_a_bad_one(path: Path,
                                                                  tmp_path: Path) -> None:
    """The init container's exact arguments, run by the real CLI on a replayed node: a healthy
    node exits 0 (the trainer starts), a node with a lost GPU exits 1 (the pod is replaced)."""
    args = init(job(path), "preflight")["args"]
    shm = tmp_path / "dev" / "shm"
    shm.mkdir(parents=True)
    good = write_fixture(tmp_path / "good.json", healthy_8x_h100())
    proc = run_cli([*args, "--root", str(tmp_path)], fixture=good)
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    bad = write_fixture(tmp_path / "bad.json", lost_gpu(3))
    proc = run_cli([*args, "--root", str(tmp_path)], fixture=bad)
    assert proc.returncode == ExitCode.FAILED, proc.stdout + proc.stderr
    assert "gpu_visible" in proc.stdout
    assert action(job(path), "preflight", proc.returncode) == "Ignore"
    proc = run_cli([*args, "--expect-gpus", "eight"], fixture=good)
    assert proc.returncode == ExitCode.USAGE
    assert action(job(path), "preflight", proc.returncode) == "FailJob"


def test_the_gang_is_a_jobset_admitted_whole_by_kueue() -> None:
    """A JobSet (one Indexed Job, one pod per node) with Kueue's queue label, so that the gang is
    admitted only when all its pods fit; JobSet's headless Service names pod 0."""
    (jobset,) = load(EXAMPLES / "gang-job.yaml")
    assert (jobset["apiVersion"], jobset["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    spec = jobset["spec"]
    assert spec["network"]["enableDNSHostnames"] is True
    assert spec["network"]["publishNotReadyAddresses"] is True, "init containers run before Ready"
    (replicated,) = spec["replicatedJobs"]
    assert replicated["replicas"] == 1
    j = job(EXAMPLES / "gang-job.yaml")
    assert j["spec"]["completionMode"] == "Indexed"
    assert "subdomain" not in j["spec"]["template"]["spec"], "JobSet sets it"
    args = init(j, "preflight-cluster")["args"]
    opt = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}
    # <jobset>-<replicatedJob>-<job index>-<pod index>.<subdomain = the JobSet's name>
    assert opt["--master-addr"] == f"{jobset['metadata']['name']}-{replicated['name']}-0-0." \
                                   f"{jobset['metadata']['name']}"
    assert int(opt["--nnodes"]) == j["spec"]["completions"] == j["spec"]["parallelism"]
    assert opt["--node-rank"] == "$(NODE_RANK)"
    (trainer,) = j["spec"]["template"]["spec"]["containers"]
    assert f"--master-addr={opt['--master-addr']}" in trainer["command"]
    assert f"--master-port={opt['--master-port']}" in trainer["command"]
    # every pod gets the same cluster verdict: a cluster FAIL is counted, never ignored forever
    assert action(j, "preflight-cluster", ExitCode.FAILED) == "Count"
    assert action(j, "preflight-cluster", ExitCode.UNDECIDED) == "Count"
    assert action(j, "preflight-cluster", ExitCode.USAGE) == "FailJob"
    # a config error ends the whole JobSet; any other Job failure restarts the gang, bounded
    (rule,) = spec["failurePolicy"]["rules"]
    assert (rule["action"], rule["onJobFailureReasons"]) == ("FailJobSet", ["PodFailurePolicy"])
    assert 0 < spec["failurePolicy"]["maxRestarts"] <= 5


@pytest.mark.skipif(importlib.util.find_spec("preflight.commands.cluster") is None,
                    reason="`preflight cluster` is not on this branch yet (issue 12)")
def test_the_gangs_cluster_options_exist() -> None:
    args = init(job(EXAMPLES / "gang-job.yaml"), "preflight-cluster")["args"]
    proc = run_cli(["cluster", "--help"])
    assert proc.returncode == 0, proc.stderr
    for opt in (a for a in args if a.startswith("--")):
        assert opt in proc.stdout, f"preflight cluster has no {opt}"
