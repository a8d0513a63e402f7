"""No input makes ``preflight lint`` print a traceback: any bytes, any Python the parser
accepts, a syntax error, a 10 MB file, non-UTF-8, a directory of symlink loops."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preflight.lint import FileResult, LintError, Summary, lint_source
from preflight.lint.output import render_text

REPO = Path(__file__).resolve().parents[2]

NAMES = st.sampled_from(["rank", "local_rank", "sampler", "loader", "model", "args.rank",
                         "self.gpu", "opt", "device", "dist", "torch", "os", "x"])
EXPRS = st.sampled_from([
    "int(os.environ['RANK'])", "os.environ['LOCAL_RANK']", "os.environ.get('RANK', 0)",
    "dist.get_rank()", "DistributedSampler(ds, rank={n}, shuffle={b})",
    "DataLoader(ds, sampler={n})", "torch.device(f'cuda:{{{n}}}')", "{n}.cuda()",
    "{n}.cuda(0)", "FSDP({n})", "torch.optim.AdamW({n}.parameters())", "{n} % 8",
    "RandomSampler if {n} else DistributedSampler", "{n}({n})", "'cuda:0'", "[0]", "None",
    "iter({n})", "lambda: {n}", "{n} == 0", "{n}.set_epoch(1)", "torch.cuda.set_device({n})",
    "{n}.to('cuda')", "fully_shard({n})", "os.getenv('WORLD_SIZE')"])
HEADER = ("import os, torch\nimport torch.distributed as dist\n"
          "from torch.utils.data import DataLoader, DistributedSampler, RandomSampler\n"
          "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n")


@st.composite
def programs(draw: st.DrawFn) -> str:
    lines = [HEADER]
    indent = 0
    for _ in range(draw(st.integers(1, 25))):
        name = draw(NAMES)
        expr = draw(EXPRS).format(n=draw(NAMES), b=draw(st.sampled_from(["True", "False"])))
        kind = draw(st.sampled_from(["assign", "expr", "for", "while", "def", "if", "dedent",
                                     "return"]))
        pad = "    " * indent
        if (kind == "assign" and "." not in name) or (kind == "assign" and name.count(".") == 1):
            lines.append(f"{pad}{name} = {expr}")
        elif kind in ("for", "while", "if", "def") and indent < 5:
            head = {"for": f"for {draw(NAMES).split('.')[0]} in {expr}:",
                    "while": f"while {expr}:", "if": f"if {expr}:",
                    "def": f"def f{draw(st.integers(0, 3))}({draw(NAMES).split('.')[0]}):"}
            lines.append(pad + head[kind])
            lines.append(pad + "    pass")
            indent += 1
        elif kind == "dedent" and indent:
            indent -= 1
        else:
            lines.append(f"{pad}{expr}")
    return "\n".join(lines) + "\n"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2000))
def test_any_bytes_give_findings_or_a_clear_error(data: bytes) -> None:
    try:
        findings = lint_source(data, "x.py")
    except LintError as exc:
        assert exc.reason and exc.reason.isprintable()
    else:
        assert all(f.line >= 1 and f.col >= 1 for f in findings)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_any_parsable_python_is_analysed(src: str) -> None:
    try:
        ast.parse(src)
    except SyntaxError:
        return
    for f in lint_source(src, "gen.py"):
        assert f.rule.startswith("DDP1") and f.message


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_any_text_with_a_syntax_error(text: str) -> None:
    src = text + "\ndef (:\n"
    try:
        lint_source(src)
    except LintError as exc:
        assert exc.reason.isprintable()


def test_deep_nesting_is_a_clear_error() -> None:
    for src in ("x = " + "(" * 100_000 + ")" * 100_000, "x = " + "-" * 200_000 + "1",
                "x = " + "[" * 5000 + "]" * 5000):
        try:
            lint_source(src)
        except LintError as exc:
            assert exc.reason.isprintable()


def test_control_characters_in_paths_and_messages_are_escaped() -> None:
    text = render_text(Summary(1, [FileResult("a\x1b[2J\n.py", ())]))
    assert text == ""
    lint = lint_source("import os\nif os.environ['RANK'] == 0:\n    pass\n")
    text = render_text(Summary(1, [FileResult("bad\x1b[2J\nname.py", tuple(lint))]))
    assert "\x1b" not in text and "\n" not in text and "bad\\e[2J\\nname.py:2:4: DDP105" in text


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "preflight", "lint", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          check=False, text=True, timeout=120)


def test_big_non_utf8_and_symlink_loops_through_the_cli(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_bytes(b"device = 1\n" * (10 * 1024 * 1024 // 11 + 1))
    (tmp_path / "latin1.py").write_bytes(b"environ = '\xe9t\xe9'\n")
    (tmp_path / "nul.py").write_bytes(b"environ = 1\x00\n")
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "self").symlink_to(loop)
    (loop / "a.py").symlink_to(loop / "b.py")
    (loop / "b.py").symlink_to(loop / "a.py")
    out = _cli(".", cwd=tmp_path)
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr
    err = out.stderr.splitlines()
    assert any("big.py: larger than 4,194,304 bytes" in line for line in err)
    assert any("latin1.py: not valid Python" in line for line in err)
    assert any("nul.py: not valid Python" in line for line in err)
    assert any("a.py: broken or looping symlink" in line for line in err)
    assert _cli("loop/a.py", cwd=tmp_path).returncode == 3
    bad = _cli("big.py", "--max-bytes", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
