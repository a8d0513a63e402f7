"""``checks.job_gpus``: one order for "how many GPUs does this job expect?" (gpu_visible, shm)."""

from __future__ import annotations

import pytest

from preflight.checks.job_gpus import expected_gpus, job_gpu_count
from tests.conftest import MakeCtx


@pytest.mark.parametrize(("env", "config", "count", "source"), [
    ({"LOCAL_WORLD_SIZE": "4", "SLURM_JOB_GPUS": "0,1"}, {"expect_gpus": 8}, 8, "expect_gpus"),
    ({"LOCAL_WORLD_SIZE": "4", "SLURM_JOB_GPUS": "0,1"}, {}, 2, "SLURM_JOB_GPUS"),
    ({"LOCAL_WORLD_SIZE": "4"}, {}, 4, "LOCAL_WORLD_SIZE"),
    ({"LOCAL_WORLD_SIZE": "four"}, {}, None, ""),
    ({}, {}, None, ""),
])
def test_one_order_of_lookup(make_ctx: MakeCtx, env: dict[str, str], config: dict[str, object],
                             count: int | None, source: str) -> None:
    ctx = make_ctx(env=env, **config)
    got = expected_gpus(ctx)
    assert (got.count, got.source) == (count, source)
    # Nobody says: the job takes every GPU NVML sees (8 on the fixture node).
    assert job_gpu_count(ctx) == (count if count is not None else 8)
