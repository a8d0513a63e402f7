"""A short paste whose lines hold no anchor word is read again, every line a candidate; a
job's log too big to keep is read once, and a log the first pass explained is not changed."""

from __future__ import annotations

import io

from preflight.explain import classify_texts, explain_streams
from preflight.explain.classifier import REREAD_BYTES

#: torch's words for a CPU target given to a CUDA loss, pasted without their "RuntimeError:".
BARE = ("Expected object of backend CUDA but got backend CPU for argument #2 'target' in call "
        "to _thnn_nll_loss_forward\n")
HEALTHY = "".join(f"epoch 1 step {i} loss 0.{i % 97:02d} lr 3e-4\n" for i in range(40))


def reasons_of(data: str) -> list[str]:
    expl = explain_streams([("job.log", io.BytesIO(data.encode()))])
    return [f.reason for f in expl.findings]


def test_a_short_paste_without_an_anchor_word_is_read_line_by_line() -> None:
    assert reasons_of(BARE) == ["DeviceMismatch"]
    assert [f.reason for f in classify_texts([("job.log", BARE)]).findings] == ["DeviceMismatch"]
    # its evidence is the line itself, numbered as in the file
    f = explain_streams([("job.log", io.BytesIO((HEALTHY + BARE).encode()))]).findings[0]
    assert [(e.line, e.text) for e in f.evidence] == [(41, BARE.rstrip())]


def test_a_short_healthy_log_stays_clean_when_read_again() -> None:
    assert reasons_of(HEALTHY) == []


def test_a_log_too_big_to_keep_is_read_once() -> None:
    filler = HEALTHY * (REREAD_BYTES // len(HEALTHY) + 1)
    assert len(filler.encode()) > REREAD_BYTES
    assert reasons_of(filler + BARE) == []
    # the limit counts every log of one run together
    expl = explain_streams([("a.log", io.BytesIO(filler.encode())),
                            ("b.log", io.BytesIO(BARE.encode()))])
    assert expl.findings == ()


def test_a_log_the_first_pass_explained_is_not_read_again() -> None:
    text = BARE + "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert reasons_of(text) == ["CudaOutOfMemory"]
