"""NCCL's multi-line errors: the cause on the line after "Last error:" wins over the generic
first line, wherever other ranks' output put it."""

from __future__ import annotations

import io

import pytest

from preflight.explain import Classifier, classify_texts, iter_blocks

HEAD = ("[rank0]: torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/"
        "c10d/"
        "ProcessGroupNCCL.cpp:1691, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL "
        "version 2.21.5\n[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL "
        "library.\n[rank0]: Last error:\n")
DETAIL = "[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1b000\n"
OTHER = "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 9\n"


@pytest.mark.parametrize("text", [
    HEAD + DETAIL,                       # as NCCL prints it
    HEAD + OTHER + DETAIL,               # another rank's lines in between
    "".join(reversed((HEAD + DETAIL).splitlines(keepends=True))),  # pasted in reverse
], ids=["adjacent", "interleaved", "reversed"])
def test_duplicate_gpu_detail_wins_over_invalid_usage(text: str) -> None:
    expl = classify_texts([("job.log", text)])
    assert [f.reason for f in expl.findings] == ["DuplicateGpu", "NcclSystemError"]
    assert expl.findings[0].ranks == (0, 1)


@pytest.mark.parametrize("block", [1, 40, 120])
def test_the_detail_is_found_across_block_edges(block: int) -> None:
    data = (HEAD + OTHER + DETAIL).encode()
    c = Classifier()
    c.begin("job.log")
    for b in iter_blocks(io.BytesIO(data), block_bytes=block, max_line_bytes=4096):
        c.feed(b)
    assert [f.reason for f in c.finish().findings] == ["DuplicateGpu", "NcclSystemError"]


def test_a_detail_far_from_any_last_error_is_not_taken() -> None:
    """A detail line that holds no anchor word is read only near a "Last error:"."""
    detail = "[rank0]: Bootstrap : no socket interface found\n"
    near = classify_texts([("job.log", HEAD + detail)])
    assert [f.reason for f in near.findings] == ["NoSocketInterface", "NcclSystemError"]
    filler = "".join(f"[rank1]: step {i}\n" for i in range(10))
    expl = classify_texts([("job.log", HEAD + filler + detail)])
    assert [f.reason for f in expl.findings] == ["NcclSystemError"]


def test_duplicate_gpu_is_read_on_its_own_line() -> None:
    """NCCL's words for two ranks on one GPU name the cause wherever they are (they are
    often pasted alone)."""
    filler = "".join(f"[rank1]: step {i}\n" for i in range(10))
    for text in (DETAIL, HEAD + filler + DETAIL):
        expl = classify_texts([("job.log", text)])
        assert [f.reason for f in expl.findings][:1] == ["DuplicateGpu"]
