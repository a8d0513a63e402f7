"""``preflight explain``: read a failed job's torchrun / PyTorch / NCCL logs and say what broke,
in which layer (environment, communication, data, model; plus hardware), on which ranks, and how
to fix it (docs/explain.md).

Pure functions over lines (rules.py, ranks.py), a streaming classifier over blocks of lines
(classifier.py, reader.py) and renderers (output.py). Nothing here touches the node.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import BinaryIO

from preflight.explain.classifier import (
    Classifier,
    Evidence,
    Explanation,
    Finding,
    RankSummary,
    classify_texts,
    match_line,
)
from preflight.explain.reader import iter_blocks
from preflight.explain.rules import RULES, Layer, Rule


def explain_streams(streams: Iterable[tuple[str, BinaryIO]]) -> Explanation:
    """Classify ``(name, binary stream)`` pairs, streaming, in bounded memory."""
    c = Classifier()
    for name, stream in streams:
        c.begin(name)
        for block in iter_blocks(stream):
            c.feed(block)
    return c.finish()


__all__ = ["RULES", "Classifier", "Evidence", "Explanation", "Finding", "Layer", "RankSummary",
           "Rule", "classify_texts", "explain_streams", "iter_blocks", "match_line"]
