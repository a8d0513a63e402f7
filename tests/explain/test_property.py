"""Garbage, binary and adversarial input never crashes the parsers nor makes a regex crawl."""

from __future__ import annotations

import io
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.explain import RULES, explain_streams, match_line
from preflight.explain.classifier import Classifier
from preflight.explain.ranks import line_rank, progress_of

FRAGMENTS = [
    "[rank3]:", "[default1]:", "[Rank 2]", "node01:12:13 [0] ", "NCCL WARN ", "NET/IB : ",
    "rank 3 nranks 8", "iteration ", "step ", "SeqNum=", "OpType=", "Timeout(ms)=",
    "Watchdog caught collective operation timeout: WorkNCCL(", "Duplicate GPU detected : rank ",
    "(local_rank: ", "global_world_sizes=[", "Error", "\n", "9", " ", "ibv_", "/dev/shm",
    "Last error:", "failed (exitcode: -", ") local_rank: ", "exitcode  : -", " (pid: ",
    "Signal 9 (SIGKILL) received by PID ", "process 1 terminated with signal SIG",
    "Sending process 12 closing signal SIGTERM", "Connect to ", " failed : ",
    "client socket has failed to connect to ", "in store based barrier on rank: ", "rank      : ",
    "ValueError: ", "error: ", '  File "/job/train.py", line 3, in main\n', "\x1b]0;", "\x07",
]
soup = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=20)), max_size=60).map(
    "".join)


@settings(max_examples=300, deadline=None)
@given(soup)
def test_line_functions_never_raise_on_log_soup(text: str) -> None:
    line_rank(text)
    progress_of(text)
    match_line(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000), st.integers(min_value=1, max_value=512))
def test_classifier_survives_any_bytes_in_any_blocks(data: bytes, block: int) -> None:
    from preflight.explain import iter_blocks

    c = Classifier()
    c.begin("rank2.log")
    for b in iter_blocks(io.BytesIO(data), block_bytes=block, max_line_bytes=1024):
        c.feed(b)
    expl = c.finish()
    assert expl.bytes_read >= len(data)
    for f in expl.findings:
        assert all(len(e.text) <= 403 for e in f.evidence)


@settings(max_examples=100, deadline=None)
@given(soup)
def test_classifier_survives_log_soup(text: str) -> None:
    explain_streams([("-", io.BytesIO(text.encode("utf-8", "surrogatepass")))])


@settings(max_examples=200, deadline=None)
@given(soup)
def test_the_text_answer_never_carries_a_control_character(text: str) -> None:
    """Whatever a log holds, the text answer (findings or the first-error pointer) is printable:
    its control characters are escaped, and the pointer's line is cut like evidence."""
    from preflight.explain.output import render_text

    expl = explain_streams([("-", io.BytesIO(text.encode("utf-8", "surrogatepass")))])
    out = render_text(expl)
    assert not any(ch in out for ch in "\x1b\x07\x00\r\x08")
    if expl.first_error is not None:
        assert len(expl.first_error.line.text) <= 403


def _literals() -> list[str]:
    from preflight.explain.matching import _LITERALS
    return [lit for lit, _ in _LITERALS]


#: Every literal the pre-check tests, cut and joined with the log soup: near misses on purpose.
near = st.lists(st.one_of(st.sampled_from(_literals()), st.sampled_from(FRAGMENTS),
                          st.sampled_from(_literals()).map(lambda lit: lit[1:]),
                          st.sampled_from(_literals()).map(lambda lit: lit[:-1]),
                          st.text(max_size=12)), max_size=30).map("".join)


@settings(max_examples=500, deadline=None)
@given(near)
def test_the_literal_pre_check_never_changes_which_rule_a_line_matches(text: str) -> None:
    from preflight.explain.matching import match_line_every

    fast, every = match_line(text), match_line_every(text)
    assert (fast is None) == (every is None)
    if fast is not None and every is not None:
        assert fast[0] is every[0] and fast[1] is every[1]
        assert fast[2].span() == every[2].span()


def test_the_literal_pre_check_keeps_every_real_logs_matches() -> None:
    """Every line of every log kept under tests/explain matches the same rule either way."""
    from pathlib import Path

    from preflight.explain.matching import match_line_every

    lines = [line for path in sorted(Path(__file__).parent.rglob("*.log"))
             for line in path.read_text(errors="replace").splitlines()]
    assert len(lines) > 3000
    for line in lines:
        fast, every = match_line(line), match_line_every(line)
        assert (fast and (fast[1], fast[2].span())) == (every and (every[1], every[2].span()))


@settings(max_examples=300, deadline=None)
@given(near)
def test_the_re2_literal_set_finds_the_literals_the_in_tests_do(text: str) -> None:
    """With google-re2 one set search over a line names the literals it holds; they are those
    of one ``in`` test each (non-ASCII text, a lone surrogate)."""
    from preflight.explain import matching

    if matching._SET is None:
        pytest.skip("google-re2 not installed (the re2 extra)")
    for line in (text, text + "\udc80", "\u00e9" + text):
        assert matching._held(line) == [ix for lit, ix in matching._LITERALS if lit in line]


def _anchor_soup() -> st.SearchStrategy[bytes]:
    from preflight.explain.rules import ANCHORS

    parts = st.one_of(st.sampled_from(ANCHORS), st.sampled_from([b"\n", b"\r\n", b" ", b"x"]),
                      st.sampled_from([a[:k] for a in ANCHORS for k in (1, len(a) - 1)]),
                      st.binary(max_size=12))
    return st.lists(parts, max_size=80).map(b"".join).map(lambda b: b + b"\n")


@settings(max_examples=300, deadline=None)
@given(_anchor_soup(), st.integers(min_value=1, max_value=64))
def test_the_one_pass_anchor_scan_finds_the_lines_the_finds_do(block: bytes, chunk: int) -> None:
    """With google-re2 a block's stretches without an anchor are skipped by one search; the
    candidate lines are exactly those of one ``bytes.find`` pass per anchor, whatever the
    stretch length (chunk boundaries, anchors cut in two, invalid UTF-8, CRLF)."""
    from preflight.explain import blocks
    from preflight.explain.rules import ANCHORS

    scan = blocks.AnchorScan(ANCHORS)
    if not scan.one_pass:
        pytest.skip("google-re2 not installed (the re2 extra)")
    plain = blocks.AnchorScan(ANCHORS, one_pass=False)
    saved, blocks.SCAN_CHUNK = blocks.SCAN_CHUNK, chunk
    try:
        assert scan.starts(block) == plain.starts(block)
    finally:
        blocks.SCAN_CHUNK = saved


def test_the_one_pass_anchor_scan_keeps_every_real_logs_lines() -> None:
    """Every log kept under tests/explain, as one block: the same candidate lines either way,
    and the classifier (which uses the one-pass scan where it can) gives the same answer as
    with the finds alone."""
    from pathlib import Path

    from preflight.explain import blocks, classifier
    from preflight.explain.rules import ANCHORS

    if not classifier.SCAN.one_pass:
        pytest.skip("google-re2 not installed (the re2 extra)")
    plain = blocks.AnchorScan(ANCHORS, one_pass=False)
    logs = sorted(Path(__file__).parent.rglob("*.log"))
    assert len(logs) > 300
    for path in logs:
        data = path.read_bytes()
        data += b"" if data.endswith(b"\n") else b"\n"
        assert classifier.SCAN.starts(data) == plain.starts(data), path
        fast = Classifier()
        fast.feed(data)
        saved, classifier.SCAN = classifier.SCAN, plain
        try:
            slow = Classifier()
            slow.feed(data)
        finally:
            classifier.SCAN = saved
        assert ([(d.reason, d.message, d.evidence) for d in fast.finish().findings]
                == [(d.reason, d.message, d.evidence) for d in slow.finish().findings]), path


def test_adversarial_long_lines_stay_fast() -> None:
    """Near-misses repeated over a megabyte line: bounded regexes keep it well under a second
    (0.15 s here). A regex that backtracks over such a line takes minutes to hours, so the 30 s
    bound tells the two apart on any machine; speed itself is measured in benchmarks/."""
    bad = ["ibv_" + "a" * 39, "NET/IB " * 30, "Watchdog caught collective operation timeout: "
           "WorkNCCL(SeqNum=1, OpType=X" + "(" * 300, "[" + "a" * 30 + "1" * 7, "Rendezvous ",
           "rank 1 nranks ", "/dev/shm" + " " * 290, "Timed out after 1 seconds waiting ",
           "client socket has failed to connect to " + "x(" * 70, "socketPollConnect" + " " * 170,
           "Connect to " + "a" * 85 + " failed : ", "Last error: " * 3, "exitcode : -" * 20]
    line = ("".join(bad) * 2000).encode()[:1 << 20] + b"\n"
    start = time.perf_counter()
    explain_streams([("-", io.BytesIO(line * 3))])
    for rule in RULES:
        for pat in rule.patterns:
            pat.regex.search(line.decode()[:4096])
    assert time.perf_counter() - start < 30


def _encodings() -> st.SearchStrategy[str]:
    return st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32", "utf-32-be"])


def _encode(text: str, encoding: str) -> bytes:
    bom = {"utf-16-be": b"\xfe\xff", "utf-32-be": b"\x00\x00\xfe\xff"}.get(encoding, b"")
    return bom + text.encode(encoding, "surrogatepass")


@settings(max_examples=100, deadline=None)
@given(soup, _encodings(), st.sampled_from(["plain", "gzip", "zstd"]))
def test_decoded_and_compressed_logs_give_the_plain_answer(text: str, encoding: str,
                                                           packing: str) -> None:
    """The same log, saved in another encoding or compressed, gives the same findings."""
    import gzip

    text = text.encode("utf-8", "replace").decode("utf-8")  # what a UTF-8 reader sees
    plain = explain_streams([("job.log", io.BytesIO(text.encode()))])
    data = _encode(text, encoding)
    if packing == "gzip":
        data = gzip.compress(data)
    elif packing == "zstd":
        zstandard = pytest.importorskip("zstandard")
        data = zstandard.ZstdCompressor().compress(data)
    other = explain_streams([("job.log", io.BytesIO(data))])
    assert [(f.reason, f.ranks, f.count) for f in other.findings] == [
        (f.reason, f.ranks, f.count) for f in plain.findings]
    assert other.unread == ()


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=3000), st.sampled_from([b"", b"\x1f\x8b", b"\x28\xb5\x2f\xfd",
                                                  b"\xff\xfe", b"\x00\x00\xfe\xff",
                                                  b"\x80\x02", b'{"version"']),
       st.integers(min_value=0, max_value=3000))
def test_truncated_or_forged_containers_never_raise(data: bytes, magic: bytes, cut: int) -> None:
    """Garbage behind a gzip/zstd/BOM/pickle/JSON header, cut anywhere: an answer, with the
    input named in ``unread`` when it could not be read, never an exception."""
    import gzip

    for blob in (magic + data, (gzip.compress(data) if magic == b"\x1f\x8b" else magic + data)
                 [:cut]):
        expl = explain_streams([("x", io.BytesIO(blob))])
        assert all(len(why.splitlines()) == 1 for _, why in expl.unread)


@pytest.mark.parametrize(("regex", "need"), [
    (r"Connect to (?P<peer>\S{1,80}) failed", ("Connect to ",)),
    (r"foo(?:barbar)?bazz", ("bazz",)),       # the optional part is never required
    (r"abcd(?:xyzw){0,3}", ("abcd",)),
    (r"(?:wxyz){2}", ("wxyz",)),              # a repeat of at least one holds its literal
    (r"Broken pipe|Connection reset", ("Broken pipe", "Connection reset")),
    (r"Broken pipe|\d+ reset", ("Broken pipe", " reset")),
    (r"Broken pipe|\d+x", None),              # an alternative without a literal: nothing certain
    (r"(?i:address in use)|EADDRINUSE", None),
    (r"(?i)timed out", None),
    (r"ab|cd", None),                         # too short to be worth a test
    (r"[Rr]endezvous timed out", ("endezvous timed out",)),
])
def test_the_required_text_is_what_every_match_holds(regex: str, need: tuple[str, ...] | None
                                                     ) -> None:
    import re

    from preflight.explain.matching import required_text

    assert required_text(re.compile(regex)) == need


def test_nearly_every_pattern_has_a_literal_to_pre_check() -> None:
    """On this Python the parser is read as expected: the pre-check is in force (a line
    holding none of the literals is searched with only a few patterns)."""
    from preflight.explain.matching import _ALWAYS, _FLAT

    assert len(_FLAT) > 100 and len(_ALWAYS) <= 5
