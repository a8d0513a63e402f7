"""The fresh corpora's gathering tools (gather.py): the exclusion checks and the merge."""

from __future__ import annotations

import json
from pathlib import Path

from tests.explain import gather

HERE = Path(__file__).parent


def test_a_thread_used_before_is_found_in_either_form() -> None:
    # fresh28 took hosseinshn/GradNorm#6 (an issue) and Azure/MS-AMP PR#37
    gh = "https://github.com"
    assert "fresh28/manifest.jsonl" in gather.used_in(f"{gh}/hosseinshn/GradNorm/issues/6")
    assert "fresh28/manifest.jsonl" in gather.used_in(f"{gh}/azure/ms-amp/issues/37")
    # another number that starts the same is another thread
    assert gather.used_in(f"{gh}/hosseinshn/GradNorm/issues/60") == []


def test_three_lines_the_same_as_a_log_here_are_found(tmp_path: Path) -> None:
    log = (HERE / "fresh28" / "gradnorm-6.log").read_text()
    copy = tmp_path / "copy.log"
    copy.write_text("an unrelated first line\n\n" + log)
    assert gather.shared_lines(copy, [HERE])
    other = tmp_path / "other.log"
    other.write_text("RuntimeError: a line no log here holds\nand a second\nand a third\n")
    assert gather.shared_lines(other, [HERE]) == {}


def _share(root: Path, name: str, takes: list[tuple[str, int, str | None, str]],
           rejected: list[tuple[str, int]] | None = None) -> Path:
    d = root / name
    d.mkdir()
    with open(d / "manifest.jsonl", "w") as f:
        for url, query, expected, text in takes:
            file = url.rsplit("/", 3)[1] + "-" + url.rsplit("/", 1)[1] + ".log"
            (d / file).write_text(text)
            f.write(json.dumps({"file": file, "url": url, "query": query,
                                "expected": expected, "why": "test"}) + "\n")
    with open(d / "rejected.jsonl", "w") as f:
        for url, query in rejected or []:
            f.write(json.dumps({"url": url, "query": query, "criterion": "b",
                                "why": "test"}) + "\n")
    (d / "skipped.jsonl").write_text("")
    return d


def _lines(tag: str) -> str:
    return "".join(f"{tag} line {i} that no earlier log holds\n" for i in range(4))


def test_the_merge_moves_what_a_later_call_took_again(tmp_path: Path) -> None:
    gh = "https://github.com"
    one = _share(tmp_path, "part1", [
        (f"{gh}/a/x/issues/1", 1, "ShmExhausted", _lines("one")),
        (f"{gh}/a/x/issues/2", 2, "PortInUse", _lines("two")),
        (f"{gh}/b/y/issues/3", 3, "DiskFull", _lines("three")),
    ], rejected=[(f"{gh}/c/z/issues/9", 4)])
    two = _share(tmp_path, "part2", [
        (f"{gh}/a/x/issues/1", 13, "ShmExhausted", _lines("again")),  # the same thread
        (f"{gh}/a/x/issues/4", 14, "PortInUse", _lines("four")),      # a third from a/x
        (f"{gh}/d/w/issues/5", 15, "DiskFull", _lines("three")),      # three's lines
        (f"{gh}/e/v/issues/6", 16, None, _lines("healthy")),
    ], rejected=[(f"{gh}/c/z/issues/9", 17), (f"{gh}/e/v/issues/6", 18)])
    merged = gather.merge([one, two])
    assert [str(r["url"]).rsplit("/", 1)[1] for r, _ in merged.kept] == ["1", "2", "3", "6"]
    moved = {str(m["url"]).rsplit("/", 1)[1]: str(m["why"]) for m in merged.moved}
    assert moved.keys() == {"1", "4", "5"}
    assert "earlier call" in moved["1"] and "per-repository" in moved["4"]
    assert "three consecutive lines" in moved["5"]
    assert all(m["criterion"] == "a" for m in merged.moved)
    # a thread set aside twice keeps its earlier row; one the merge took is not set aside
    assert [r["query"] for r in merged.rejected if str(r["url"]).endswith("/9")] == [4]
    assert merged.dropped_taken == [f"{gh}/e/v/issues/6", f"{gh}/a/x/issues/1"]
    merged_urls = {str(r["url"]) for r, _ in merged.kept}
    assert not merged_urls & {str(r["url"]) for r in merged.rejected}


def test_a_committed_corpus_split_into_shares_merges_back_to_itself(tmp_path: Path) -> None:
    src = HERE / "fresh28"
    shares = []
    for k, (lo, hi) in enumerate([(1, 12), (13, 24), (25, 36), (37, 48)], 1):
        d = tmp_path / f"part{k}"
        d.mkdir()
        for name in ("manifest.jsonl", "rejected.jsonl", "skipped.jsonl"):
            picked = [r for r in gather.rows(src / name) if lo <= int(str(r["query"])) <= hi]
            (d / name).write_text("".join(json.dumps(r) + "\n" for r in picked))
            for r in picked if name == "manifest.jsonl" else []:
                (d / str(r["file"])).write_text((src / str(r["file"])).read_text())
        shares.append(d)
    merged = gather.merge(shares)
    assert [r["file"] for r, _ in merged.kept] == [r["file"] for r in
                                                   sorted(gather.rows(src / "manifest.jsonl"),
                                                          key=lambda r: int(str(r["query"])))]
    assert merged.moved == []
    gather.write(merged, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.log")) == sorted(
        p.name for p in src.glob("*.log"))
