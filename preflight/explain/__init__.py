"""``preflight explain``: read a failed job's torchrun / PyTorch / NCCL logs (and PyTorch's flight
recorder dumps) and say what broke, in which layer (environment, communication, data, model;
plus hardware), on which ranks, and how to fix it (docs/explain.md).

Rules are plain data (rules.py); line matching (matching.py), block windows (blocks.py), rank
facts and rule hooks (facts.py), progress (progress.py) and the assembly (classifier.py) work on
blocks of lines from the reader (reader.py), after decoding (decode.py: gzip, zstd, UTF-16/32);
flight recorder dumps are read as plain data and matched across ranks (flightrec.py); sources.py
tells the inputs apart. Output types in model.py, renderers in output.py.
Nothing here touches the node, and nothing here depends on anything but the standard library.
"""

from __future__ import annotations

from preflight.explain.classifier import Classifier, classify_texts
from preflight.explain.matching import match_line
from preflight.explain.model import Diagnosis, Evidence, Explanation, RankSummary
from preflight.explain.reader import iter_blocks
from preflight.explain.rules import RULES, Layer, Rule
from preflight.explain.sources import explain_streams

__all__ = ["RULES", "Classifier", "Diagnosis", "Evidence", "Explanation", "Layer",
           "RankSummary", "Rule", "classify_texts", "explain_streams", "iter_blocks",
           "match_line"]
