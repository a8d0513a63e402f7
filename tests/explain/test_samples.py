"""Log samples written for the project (tests/explain/logs) in the formats torchrun, PyTorch and
NCCL print: each must give the failure classes a person would name, cause first, with ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.explain import RULES, Explanation, classify_texts, match_line

LOGS = Path(__file__).parent / "logs"


def explain(*names: str) -> Explanation:
    return classify_texts((str(LOGS / n), (LOGS / n).read_text()) for n in names)


def reasons(expl: Explanation) -> list[str]:
    return [f.reason for f in expl.findings]


@pytest.mark.parametrize(("name", "expected", "ranks"), [
    ("port_in_use.log", ["PortInUse"], {}),
    ("missing_env.log", ["MissingLauncherEnv"], {}),
    ("invalid_ordinal.log", ["InvalidDeviceOrdinal"], {"InvalidDeviceOrdinal": [5, 4]}),
    ("duplicate_gpu.log", ["DuplicateGpu", "NcclSystemError"], {"DuplicateGpu": [1, 0]}),
    ("no_socket_iface.log", ["NoSocketInterface", "NcclSystemError"], {}),
    ("gloo_iface.log", ["NoSocketInterface"], {}),
    ("unused_params.log", ["UnusedParameters"], {"UnusedParameters": [1, 0]}),
    ("device_mismatch.log", ["DeviceMismatch"], {"DeviceMismatch": [1]}),
    ("ib_error.log", ["NcclIbError"], {"NcclIbError": [11]}),
    ("oom_broken_pipe.log", ["CudaOutOfMemory", "PeerConnectionLost"],
     {"CudaOutOfMemory": [3], "PeerConnectionLost": [0, 1, 2]}),
    ("illegal_memory.log", ["IllegalMemoryAccess"], {"IllegalMemoryAccess": [6]}),
    ("rendezvous_timeout.log", ["RendezvousTimeout"], {}),
    ("shm_then_watchdog.log", ["ShmExhausted", "NcclSystemError", "CollectiveTimeout"],
     {"ShmExhausted": [2], "CollectiveTimeout": [0, 1, 3]}),
    ("stall_watchdog.log", ["CollectiveTimeout"], {"CollectiveTimeout": [0, 1, 2]}),
    # apex installed without its compiled extensions: the module amp_C is not there
    ("import_error.log", ["MissingPackage"], {}),
])
def test_sample_gives_expected_findings_cause_first(name: str, expected: list[str],
                                                    ranks: dict[str, list[int]]) -> None:
    expl = explain(name)
    assert reasons(expl) == expected
    by = {f.reason: f for f in expl.findings}
    for reason, want in ranks.items():
        assert list(by[reason].ranks) == want
    for f in expl.findings:
        assert f.remedy and f.message and f.evidence


@pytest.mark.parametrize("name", ["healthy_nccl_info.log", "healthy_training.log"])
def test_negative_samples_give_no_finding(name: str) -> None:
    assert explain(name).findings == ()


def test_evidence_line_numbers_point_at_the_lines() -> None:
    lines = (LOGS / "shm_then_watchdog.log").read_text().splitlines()
    for f in explain("shm_then_watchdog.log").findings:
        for e in f.evidence:
            assert lines[e.line - 1].startswith(e.text.removesuffix("..."))


def test_nccl_last_error_detail_is_in_the_evidence() -> None:
    f = explain("no_socket_iface.log").findings[1]
    assert f.reason == "NcclSystemError"
    assert any("Bootstrap : no socket interface found" in e.text for e in f.evidence)


def test_watchdog_timeout_names_waiting_and_suspect_ranks() -> None:
    expl = explain("shm_then_watchdog.log")
    timeout = expl.findings[-1]
    assert timeout.details["timed_out_ranks"] == [0, 1, 3]
    assert timeout.details["not_timed_out_ranks"] == [2]
    assert timeout.details["watchdog"] == {str(r): {"seq": 1, "op": "ALLREDUCE"} for r in (0, 1, 3)}
    assert "600000 ms" in timeout.message
    assert expl.ranks.root_cause == 2
    assert expl.ranks.failed[0] == 2
    assert expl.ranks.world_size == 4


def test_rank_that_never_printed_iteration_10_is_named() -> None:
    """The article's section 3.1 example: ranks 0-2 printed iteration 10, rank 3 did not."""
    expl = explain("stall_watchdog.log")
    assert expl.ranks.stalled == (3,)
    assert expl.ranks.progress == {0: 10, 1: 10, 2: 10, 3: 9}
    f = expl.findings[0]
    assert "rank 3 stopped progressing first" in f.message
    assert f.details["not_timed_out_ranks"] == [3]


def test_socket_ifname_from_the_log_is_quoted() -> None:
    f = explain("no_socket_iface.log").findings[0]
    assert "NCCL_SOCKET_IFNAME=ens9f1" in f.message


def test_consequence_printed_before_its_cause_is_still_ordered_after_it() -> None:
    """Per-rank files in any order: a peer's broken pipe never outranks the OOM behind it."""
    pipe = "[rank1]: BrokenPipeError: [Errno 32] Broken pipe\n"
    oom = ("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. "
           "GPU 3 has a total capacity of 79.19 GiB of which 0.90 GiB is free.\n")
    expl = classify_texts([("rank1.log", pipe), ("rank3.log", oom)])
    assert reasons(expl) == ["CudaOutOfMemory", "PeerConnectionLost"]
    assert "1.50 GiB" in expl.findings[0].message


def test_file_name_gives_the_rank_of_unprefixed_lines() -> None:
    text = ("iteration 7 loss 1.0\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    expl = classify_texts([("logs/attempt_0/5/stderr.log", text),
                           ("logs/attempt_0/4/stderr.log", "iteration 8 loss 1.0\n")])
    assert expl.findings[0].ranks == (5,)
    assert expl.ranks.progress == {5: 7, 4: 8}
    assert expl.ranks.stalled == (5,)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.reason)
def test_every_rule_example_is_recognised_as_its_own_reason(rule: object) -> None:
    hit = match_line(rule.example)  # type: ignore[attr-defined]
    assert hit is not None and hit[0] is rule


def test_docs_page_lists_every_reason_with_its_example() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "explain.md").read_text()
    for rule in RULES:
        assert f"### `{rule.reason}`" in doc
        assert rule.example in doc


def test_docs_reasons_section_is_the_one_the_rules_give() -> None:
    import importlib.util

    script = Path(__file__).parents[2] / "scripts" / "explain_reasons.py"
    spec = importlib.util.spec_from_file_location("explain_reasons", script)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = (Path(__file__).parents[2] / "docs" / "explain.md").read_text()
    assert doc[doc.index("## Reasons\n"):] == mod.section(), (
        "run: python scripts/explain_reasons.py --write")
