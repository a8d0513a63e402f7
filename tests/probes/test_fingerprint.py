"""The fingerprint's pure parts: path hashing, the canonical sha256, diff wording, parsing."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.probes import fingerprint as fpm

# --------------------------------------------------------------------------- hash_path


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def test_file_hash_is_plain_sha256(tmp_path: Path) -> None:
    f = tmp_path / "train.py"
    f.write_bytes(b"print('hi')\n")
    assert fpm.hash_path(f) == hashlib.sha256(b"print('hi')\n").hexdigest()


def test_tree_hash_is_deterministic_and_sensitive(tmp_path: Path) -> None:
    files = {"a.py": b"1", "pkg/b.py": b"2", "pkg/sub/c.txt": b"3"}
    one = _tree(tmp_path / "one", files)
    two = _tree(tmp_path / "two", dict(reversed(files.items())))  # other creation order
    os.utime(two / "a.py", (1, 1))  # other times
    (two / "pkg" / "__pycache__").mkdir()  # bytecode caches differ between identical copies
    (two / "pkg" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert fpm.hash_path(one) == fpm.hash_path(two)

    (two / "pkg/b.py").write_bytes(b"2 ")
    assert fpm.hash_path(one) != fpm.hash_path(two)
    (two / "pkg/b.py").write_bytes(b"2")
    (two / "pkg/b.py").rename(two / "pkg/b2.py")
    assert fpm.hash_path(one) != fpm.hash_path(two)
    (two / "pkg/b2.py").rename(two / "pkg/b.py")
    (two / "empty").mkdir()
    assert fpm.hash_path(one) != fpm.hash_path(two)


def test_tree_symlinks_hashed_as_links_and_loops_end(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t", {"x": b"1"})
    (root / "loop").symlink_to(root)
    first = fpm.hash_path(root)
    assert len(first) == 64
    (root / "loop").unlink()
    (root / "loop").symlink_to(tmp_path)
    assert fpm.hash_path(root) != first


def test_missing_and_too_large(tmp_path: Path) -> None:
    assert fpm.hash_path(tmp_path / "nope") == "<missing>"
    root = _tree(tmp_path / "t", {f"f{i}": b"x" for i in range(5)})
    assert fpm.hash_path(root, max_files=3).startswith("<too large: more than 3 files")
    assert fpm.hash_path(root, max_bytes=4).startswith("<too large: more than 4 B")
    assert len(fpm.hash_path(root, max_files=5, max_bytes=5)) == 64


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(b"x")
    f.chmod(0)
    assert fpm.hash_path(f).startswith("<unreadable: ")


# --------------------------------------------------------------------------- build / sha256


ENV: dict[str, Any] = {
    "python": "3.11.7", "python_implementation": "CPython", "executable": "/venv/bin/python",
    "prefix": "/venv", "nccl": "2.21.5", "nccl_source": "wheel", "cudnn": "9.1.0.70",
    "torch": {"__version__": "2.4.0+cu121", "cuda": "12.1", "git_version": "abc"},
    "packages": {"torch": "2.4.0+cu121", "scikit-learn": "1.3.2", "numpy": "1.26.4"},
}
WATCHED = ["torch", "numpy", "scikit-learn", "deepspeed"]


def make(**changes: Any) -> dict[str, Any]:
    env = {**ENV, **{k: v for k, v in changes.items() if k in ENV}}
    return fpm.build(env, driver=changes.get("driver", "570.124.06"), driver_cuda=12080,
                     hashes=changes.get("hashes", {}), watched=changes.get("watched", WATCHED),
                     meta=changes.get("meta"))


def test_build_shape() -> None:
    fp = make()
    assert (fp["torch"], fp["cuda"], fp["nccl"], fp["driver"], fp["driver_cuda"]) == \
        ("2.4.0+cu121", "12.1", "2.21.5", "570.124.06", "12.8")
    assert list(fp["packages"]) == sorted(fp["packages"])
    assert fp["sha256"] == fpm.canonical_sha256(fp)
    json.dumps(fp)  # JSON-able


def test_sha256_ignores_meta_only() -> None:
    base = make()
    assert make(meta={"host": "other-node", "created_s": 5})["sha256"] == base["sha256"]
    assert make(watched=["torch"])["sha256"] == base["sha256"]
    assert make(nccl="2.28.9")["sha256"] != base["sha256"]
    assert make(packages={**ENV["packages"], "scikit-learn": "1.5.0"})["sha256"] != base["sha256"]
    assert make(hashes={"/srv/code": "0" * 64})["sha256"] != base["sha256"]


# --------------------------------------------------------------------------- diff


def texts(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [d.describe() for d in fpm.diff(a, b)]


def test_diff_same_is_empty() -> None:
    assert fpm.diff(make(), make(meta={"host": "b"})) == []


def test_diff_names_each_difference() -> None:
    a = make()
    b = make(nccl="2.28.9", packages={**ENV["packages"], "scikit-learn": "1.5.0",
                                      "deepspeed": "0.14.0"})
    assert texts(a, b) == ["NCCL: 2.21.5 on A, 2.28.9 on B",
                           "only on B: deepspeed 0.14.0",
                           "scikit-learn: 1.3.2 on A, 1.5.0 on B"]
    assert texts(b, a)[1] == "only on A: deepspeed 0.14.0"
    check = [d.describe("on this node", "in golden") for d in fpm.diff(a, b)]
    assert check[2] == "scikit-learn: 1.3.2 on this node, 1.5.0 in golden"


def test_diff_torch_said_once_and_components_first() -> None:
    b = make(torch={**ENV["torch"], "__version__": "2.5.1"},
             packages={**ENV["packages"], "torch": "2.5.1"}, driver="550.54.15")
    assert texts(make(), b) == ["torch: 2.4.0+cu121 on A, 2.5.1 on B",
                                "driver: 570.124.06 on A, 550.54.15 on B"]


def test_diff_hash_and_missing_component() -> None:
    a = make(hashes={"/srv/code": "a" * 64}, nccl=None)
    b = make(hashes={"/srv/code": "b" * 64})
    assert texts(a, b) == ["NCCL: none on A, 2.21.5 on B",
                           f"sha256 of /srv/code: {'a' * 12}… on A, {'b' * 12}… on B"]


def test_diff_skips_packages_the_other_side_never_watched() -> None:
    a = make(watched=["torch", "numpy", "scikit-learn"])  # made with a shorter watch list
    b = make(packages={**ENV["packages"], "deepspeed": "0.14.0"})
    assert texts(a, b) == []
    a2 = make()  # watched deepspeed and did not find it: a real difference
    assert texts(a2, b) == ["only on B: deepspeed 0.14.0"]


# --------------------------------------------------------------------------- parse / load


def test_parse_accepts_a_check_report() -> None:
    fp = make()
    report = {"schema_version": 1, "results": [], "fingerprint": fp}
    assert fpm.parse(report, source="r.json") is fp
    with pytest.raises(fpm.FingerprintError, match="without a fingerprint"):
        fpm.parse({**report, "fingerprint": None}, source="r.json")


@pytest.mark.parametrize(("data", "match"), [
    ([], "expected a JSON object"),
    ({}, "fingerprint_version is None"),
    ({"fingerprint_version": 2}, "fingerprint_version is 2"),
    ({"fingerprint_version": True}, "fingerprint_version is True"),
    ({"fingerprint_version": 1, "packages": ["numpy"]}, "'packages' must be an object"),
    ({"fingerprint_version": 1, "packages": {"numpy": 1}}, "'packages' must be an object"),
    ({"fingerprint_version": 1, "meta": 3}, "'meta' must be an object"),
])
def test_parse_rejects(data: Any, match: str) -> None:
    with pytest.raises(fpm.FingerprintError, match=match) as err:
        fpm.parse(data, source="golden.json")
    assert str(err.value).startswith("golden.json: ")


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    cases = {"missing.json": None, "bad.json": b"{not json", "bin.json": b"\xff\xfe\x00",
             "deep.json": b"[" * 100_000 + b"]" * 100_000}
    for name, content in cases.items():
        p = tmp_path / name
        if content is not None:
            p.write_bytes(content)
        with pytest.raises(fpm.FingerprintError) as err:
            fpm.load(p)
        assert str(err.value).startswith(f"{p}: "), err.value
    with pytest.raises(fpm.FingerprintError, match="is a directory"):
        fpm.load(tmp_path)


# --------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20)
fingerprint_like = st.fixed_dictionaries(
    {"fingerprint_version": st.just(1) | json_values},
    optional={"packages": st.dictionaries(st.text(max_size=6), st.text(max_size=6)) | json_values,
              "hashes": st.dictionaries(st.text(max_size=6), st.text(max_size=6)) | json_values,
              "meta": st.fixed_dictionaries({}, optional={"watched": json_values}) | json_values,
              "nccl": json_values, "torch": json_values, "extra": json_values})


@settings(max_examples=200, deadline=None)
@given(st.one_of(json_values, fingerprint_like), st.one_of(json_values, fingerprint_like))
def test_parse_and_diff_arbitrary_json_never_traceback(a: Any, b: Any) -> None:
    """Any JSON: either a clear FingerprintError or a list of differences, whose texts render."""
    try:
        pa, pb = fpm.parse(a, source="A"), fpm.parse(b, source="B")
    except fpm.FingerprintError as exc:
        assert str(exc).startswith(("A: ", "B: "))
        return
    for d in fpm.diff(pa, pb):
        assert isinstance(d.describe(), str)
        json.dumps(d.to_json())
    assert fpm.diff(pa, pa) == []


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_load_arbitrary_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.json"
        p.write_bytes(data)
        try:
            fpm.load(p)
        except fpm.FingerprintError as exc:
            assert str(exc).startswith(f"{p}: ")


versions = st.text("0123456789.", min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(WATCHED), versions),
       st.dictionaries(st.sampled_from(WATCHED), versions),
       st.sampled_from(["2.21.5", "2.28.9", None]), st.sampled_from(["2.21.5", "2.28.9", None]))
def test_diff_empty_exactly_when_sha256_equal(pa: dict[str, str], pb: dict[str, str],
                                              na: str | None, nb: str | None) -> None:
    """For fingerprints watching the same packages, "no difference" and "same sha256" agree."""
    a, b = make(packages=pa, nccl=na), make(packages=pb, nccl=nb)
    assert (fpm.diff(a, b) == []) == (a["sha256"] == b["sha256"])
