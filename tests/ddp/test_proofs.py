"""The proofs of one DDP step, judged on literal rank reports: each true on a healthy report and
false on the report a broken run would send (no worker, no torch: fast)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.ddp import proofs

SAMPLES = 8


def _facts(rank: int, *, world: int = 2, **changes: Any) -> dict[str, Any]:
    """What a healthy gloo rank of a world of ``world`` reports: its half of 8 samples per
    epoch, in a new order each epoch."""
    mine = [i for i in range(SAMPLES * world // 2) if i % world == rank]
    base: dict[str, Any] = {
        "rank": rank, "local_rank": rank, "world_size": world, "backend": "gloo",
        "device": {"type": "cpu", "index": None, "bus_id": None, "name": None},
        "parameter_devices": ["cpu"], "samples": SAMPLES * world // 2,
        "digest_init": f"init{rank}", "digest_wrapped": "w0", "digest_final": "f0",
        "loss_before": 6.5, "loss_after": 0.9,
        "indices": [mine, mine[::-1], mine[1:] + mine[:1]],
        "iterations": 12, "parameters": 2, "params_with_grad_min": 2,
        "find_unused_parameters": False, "set_epoch": True, "repeats_without_set_epoch": True,
        "test_hooks": []}
    base.update(changes)
    return base


def _judge(*raw: dict[str, Any], **kwargs: Any) -> dict[str, proofs.Proof]:
    return {p.name: p for p in proofs.judge([proofs.parse_facts(r) for r in raw], **kwargs)}


def test_a_healthy_step_proves_everything_that_applies() -> None:
    got = _judge(_facts(0), _facts(1))
    assert {n: p.ok for n, p in got.items()} == {
        "device": None, "broadcast": True, "parameters_equal": True, "loss_down": True,
        "shards": True, "order_changed": True, "parameters_used": True}
    assert "2 different digests" in got["broadcast"].message
    assert "without set_epoch it would not have" in got["order_changed"].message
    assert "together all 8" in got["shards"].message


def test_a_rank_that_never_stepped_has_other_parameters() -> None:
    got = _judge(_facts(0), _facts(1, digest_final="stale", loss_after=6.5))
    assert got["parameters_equal"].ok is False
    assert "rank 1 differ from rank 0's" in got["parameters_equal"].message
    assert got["loss_down"].ok is False and "rank 1: 6.5 -> 6.5" in got["loss_down"].message
    assert got["broadcast"].ok is True  # the broadcast itself worked


def test_without_set_epoch_the_order_repeats_and_says_why() -> None:
    same = [[0, 2, 4, 6]] * 3
    got = _judge(_facts(0, indices=same, set_epoch=False),
                 _facts(1, indices=[[1, 3, 5, 7]] * 3, set_epoch=False))
    assert got["order_changed"].ok is False
    assert "epoch 1 repeated epoch 0" in got["order_changed"].message
    assert "set_epoch was not called" in got["order_changed"].message
    assert got["shards"].ok is True  # still disjoint and covering


@pytest.mark.parametrize(("rank1", "words"), [
    ([[0, 3, 5, 7]] * 1 + [[1, 3, 5, 7]] * 2, "ranks 0 and 1 both trained on 1 sample(s) (e.g. 0)"),
    ([[1, 3, 5]] + [[1, 3, 5, 7]] * 2, "1 of 8 samples on no rank (e.g. 7)"),
    ([[1, 3, 5, 9]] + [[1, 3, 5, 7]] * 2, "out of range"),
    ([[1, 1, 5, 7]] + [[1, 3, 5, 7]] * 2, "saw a sample twice"),
])
def test_shards_overlapping_or_missing_samples_fail(rank1: list[list[int]], words: str) -> None:
    r0 = _facts(0, indices=[[0, 2, 4, 6], [6, 4, 2, 0], [2, 4, 6, 0]])
    r1 = _facts(1, indices=[rank1[0], [7, 5, 3, 1], [3, 5, 7, 1]])
    got = _judge(r0, r1)
    assert got["shards"].ok is False
    assert words in got["shards"].message


def test_a_broadcast_that_did_not_reach_a_rank() -> None:
    got = _judge(_facts(0), _facts(1, digest_wrapped="w1", digest_final="f1"))
    assert got["broadcast"].ok is False and "rank 1" in got["broadcast"].message


def test_unused_parameters_and_uneven_iterations() -> None:
    got = _judge(_facts(0, params_with_grad_min=1), _facts(1, iterations=11))
    assert got["parameters_used"].ok is False
    assert "rank 0: 1 of 2 parameters" in got["parameters_used"].message
    assert "different numbers of iterations ([11, 12])" in got["parameters_used"].message


def test_one_rank_has_nothing_to_compare() -> None:
    got = _judge(_facts(0, world=1, samples=4, indices=[[0, 1, 2, 3], [3, 2, 1, 0],
                                                        [1, 2, 3, 0]]))
    assert got["parameters_equal"].ok is None and got["broadcast"].ok is None
    assert got["shards"].ok is True and got["loss_down"].ok is True


def test_the_single_step_trains_each_rank_alone() -> None:
    alone = {"digest_wrapped": None, "backend": None, "world_size": 1, "samples": 4,
             "indices": [[0, 1, 2, 3], [3, 2, 1, 0], [1, 2, 3, 0]]}
    gpu = {"device": {"type": "cuda", "index": 1, "bus_id": "0000:07:00.0", "name": "H100"},
           "parameter_devices": ["cuda:1"]}
    r0 = _facts(0, **alone, **{**gpu, "device": {**gpu["device"], "index": 0,
                                                   "bus_id": "0000:06:00.0"},
                               "parameter_devices": ["cuda:0"]})
    r1 = _facts(1, **alone, **gpu)
    got = _judge(r0, r1, expected={0: "00000000:06:00.0", 1: "00000000:07:00.0"}, cvd=None)
    assert got["parameters_equal"].ok is None and got["broadcast"].ok is None
    assert got["shards"].ok is True and "each rank alone covered all 4" in got["shards"].message
    assert got["device"].ok is True
    assert "rank 1 on cuda:1 = 0000:07:00.0" in got["device"].message
    assert got["parameters_used"].ok is True
    assert "find_unused_parameters" not in got["parameters_used"].message


def test_a_rank_on_another_gpu_than_cuda_visible_devices_maps_it_to() -> None:
    r0 = _facts(0, device={"type": "cuda", "index": 0, "bus_id": "0000:07:00.0", "name": "H100"},
                parameter_devices=["cuda:0"])
    got = _judge(r0, expected={0: "00000000:06:00.0"}, cvd="1")
    assert got["device"].ok is False
    assert "CUDA_VISIBLE_DEVICES=1 maps cuda:0 to 00000000:06:00.0" in got["device"].message


def test_a_rank_that_did_not_use_its_local_rank() -> None:
    r1 = _facts(1, device={"type": "cuda", "index": 0, "bus_id": "0000:06:00.0", "name": "H100"},
                parameter_devices=["cuda:0"])
    got = _judge(r1, expected=None, cvd=None)
    assert got["device"].ok is False and "not cuda:1" in got["device"].message


@pytest.mark.parametrize(("key", "value"), [
    ("samples", -1), ("indices", "nope"), ("indices", [[0, "x"]]), ("digest_final", None),
    ("loss_before", "1.0"), ("rank", True), ("parameters", 0), ("indices", [[0]] * 65),
])
def test_malformed_reports_are_refused_naming_the_field(key: str, value: object) -> None:
    raw = _facts(0)
    raw[key] = value
    with pytest.raises(ValueError, match=key.split("_", maxsplit=1)[0]):
        proofs.parse_facts(raw)


_ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_facts(0))), _ANY, max_size=8))
def test_any_report_is_parsed_or_refused_never_crashes(changes: dict[str, Any]) -> None:
    raw = copy.deepcopy(_facts(0))
    raw.update(changes)
    try:
        facts = proofs.parse_facts(raw)
    except ValueError:
        return
    for p in proofs.judge([facts]):
        assert p.ok in (True, False, None) and isinstance(p.message, str)
