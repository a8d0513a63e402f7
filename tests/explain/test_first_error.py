"""When no rule knows a log, explain says where to start reading: its first exception, or else
its first line that says ``error:``, with the frame that raised it. Real logs from the fresh
corpora, whose causes no reason covers; the pointer is no finding (exit 0, no reason)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from preflight.cli import main
from preflight.explain import classify_texts
from preflight.explain.output import render_text

HERE = Path(__file__).parent


def _explain_json(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["explain", "--json", str(path)]) == 0  # a pointer is not a finding
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    assert data["findings"] == []
    return data


#: OpenCV imported in an image without the system's libGL: a cause no reason covers.
_LIBGL = """Traceback (most recent call last):
  File "/workspace/tools/train.py", line 16, in <module>
    import cv2
  File "/usr/local/lib/python3.10/dist-packages/cv2/__init__.py", line 181, in <module>
    bootstrap()
  File "/usr/local/lib/python3.10/dist-packages/cv2/__init__.py", line 153, in bootstrap
    native_module = importlib.import_module("cv2")
  File "/usr/lib/python3.10/importlib/__init__.py", line 126, in import_module
    return _bootstrap._gcd_import(name[level:], package, level)
ImportError: libGL.so.1: cannot open shared object file: No such file or directory
"""


def test_an_exception_no_rule_knows_points_at_its_line_and_the_frame(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "job.log"
    log.write_text(_LIBGL)
    first = _explain_json(log, capsys)["first_error"]
    text = "ImportError: libGL.so.1: cannot open shared object file: No such file or directory"
    assert first == {"source": str(log), "line": 10, "text": text,
                     "exception": "ImportError",
                     "frame": {"file": "/usr/lib/python3.10/importlib/__init__.py", "line": 126,
                               "function": "import_module", "installed": True},
                     "rank": None}
    assert main(["explain", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "nothing recognised: no known failure class in these logs",
        "start reading at the first exception (no rule knows it):",
        f"  {log}:10: {text}",
        "  raised in import_module at __init__.py:126 (installed code)"]


def test_an_exception_in_the_jobs_own_frame_says_so() -> None:
    expl = classify_texts([("job.log", 'Traceback (most recent call last):\n'
                            '  File "/workspace/tools/train.py", line 16, in <module>\n'
                            '    import cv2\n' + _LIBGL.splitlines()[-1] + "\n")])
    assert not expl.findings
    assert expl.first_error is not None and expl.first_error.installed is False
    assert "raised in <module> at train.py:16 (the job's own code)" in render_text(expl)


def test_an_exception_raised_in_installed_code_is_named_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a traceback with no frame of the job's own file: the library's, not the job's call
    first = _explain_json(HERE / "fresh11" / "store-5140062711.log", capsys)["first_error"]
    assert isinstance(first, dict)  # cut above its last frame's file: no frame known
    assert first["exception"] == "ValueError" and first["frame"] is None
    assert "Tokenizer class LLaMATokenizer does not exist" in first["text"]
    expl = classify_texts([("job.log", 'Traceback (most recent call last):\n'
                            '  File "/opt/venv/lib/python3.11/site-packages/tok/auto.py", line 8, '
                            'in load\n    raise ValueError(name)\nValueError: LLaMATokenizer\n')])
    assert not expl.findings
    assert expl.first_error is not None and expl.first_error.installed is True
    assert expl.first_error.frame == ("/opt/venv/lib/python3.11/site-packages/tok/auto.py", 8,
                                      "load")


def test_a_library_rejecting_the_jobs_arguments_is_the_jobs_call() -> None:
    expl = classify_texts([("log", (HERE / "fresh8" / "openinstruct-620.log").read_text())])
    assert [f.reason for f in expl.findings] == ["ScriptException"]
    assert "made installed code (hf_argparser.py) raise ValueError" in expl.findings[0].message
    assert expl.first_error is None


def test_a_launchers_own_error_line_when_there_is_no_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    first = _explain_json(HERE / "fresh6" / "lorascriptsnext-324.log", capsys)["first_error"]
    assert isinstance(first, dict)
    assert first["exception"] is None and first["frame"] is None
    assert "error: argument --num_cpu_threads_per_process" in first["text"]
    expl = classify_texts([("job.log", (HERE / "fresh6" / "lorascriptsnext-324.log")
                            .read_text())])
    assert "start reading at the first line that says error" in render_text(expl)


def test_a_shells_complaint_about_its_script_is_a_pointer(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a launch script whose line continuation broke: bash ran the rest as a command
    first = _explain_json(HERE / "fresh10" / "store-12428240452.log", capsys)["first_error"]
    assert isinstance(first, dict)
    assert first["text"] == "./ddp.sh: line 6: --name: command not found"
    assert first["exception"] is None


def test_torchruns_report_of_a_workers_exit_is_not_the_first_error() -> None:
    expl = classify_texts([("log", "ERROR:torch.distributed.elastic.multiprocessing.api:failed "
                                   "(exitcode: 2) local_rank: 0 (pid: 31) of binary: /bin/py\n"
                                   "train: error: unknown flag --lr\n")])
    assert expl.first_error is not None
    assert expl.first_error.line.text == "train: error: unknown flag --lr"


_IPV6 = ("[W socket.cpp:663] [c10d] The IPv6 network addresses of (node01, 29500) cannot be "
         "retrieved (gai error: -3 - Temporary failure in name resolution).")


@pytest.mark.parametrize("warning", [_IPV6, "[rank0]:[W1203 10:00:00.000000 1234 socket.cpp:"
                                            "663] [c10d] a warning that says error: quoted"])
def test_c10s_warning_that_quotes_an_error_is_neither_a_finding_nor_a_pointer(
        warning: str) -> None:
    """Healthy runs print c10d's IPv6 warning; it names the resolver's error, not a failure."""
    expl = classify_texts([("job.log", f"{warning}\nepoch 1 loss 0.5\n")])
    assert expl.findings == () and expl.first_error is None
    # the same words in an error are still read
    failed = classify_texts([("job.log", "torch.distributed.DistNetworkError: gai error: -3 - "
                                         "Temporary failure in name resolution\n")])
    assert [f.reason for f in failed.findings] == ["RendezvousTimeout"]


def test_a_log_with_nothing_that_reads_as_an_error_gets_no_pointer() -> None:
    expl = classify_texts([("job.log", "epoch 1 loss 0.5\nepoch 2 loss 0.4\nterror in the "
                                       "dataset name is not an error line\n")])
    assert expl.findings == () and expl.first_error is None
    assert "start reading" not in render_text(expl)


def test_no_pointer_beside_a_finding() -> None:
    expl = classify_texts([("job.log",
                            "KeyError: 'llama'\n"
                            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 "
                            "GiB\n")])
    assert [f.reason for f in expl.findings] == ["CudaOutOfMemory"]
    assert expl.first_error is None
    assert expl.to_json()["first_error"] is None


def test_the_launchers_wrapper_is_not_the_first_exception() -> None:
    log = ("Traceback (most recent call last):\n"
           '  File "/opt/conda/lib/python3.10/subprocess.py", line 526, in run\n'
           "    raise CalledProcessError(retcode, process.args,\n"
           "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero "
           "exit status 1.\n")
    assert classify_texts([("launcher.log", log)]).first_error is None
    rank = ("[rank3]: Traceback (most recent call last):\n"
            '[rank3]:   File "/job/train.py", line 7, in <module>\n'
            "[rank3]:     import mylib\n"
            "[rank3]: ImportError: libfoo.so.1 version mismatch in mylib\n")
    first = classify_texts([("launcher.log", log + rank)]).first_error
    assert first is not None and first.exception == "ImportError" and first.rank == 3
    assert first.frame == ("/job/train.py", 7, "<module>") and not first.installed
    assert "start reading at rank 3's first exception" in render_text(
        classify_texts([("launcher.log", log + rank)]))


def test_the_first_file_read_comes_first() -> None:
    later = "\n" * 40 + "ZeroDivisionError: division by zero\n"
    earlier = "KeyError: 'model'\n"
    first = classify_texts([("a.log", later), ("b.log", earlier)]).first_error
    assert first is not None and first.line.source == "a.log" and first.line.line == 41


def test_an_exception_beats_an_earlier_error_word() -> None:
    first = classify_texts([("job.log", "ERROR: could not reach the metrics server\n"
                                        "AttributeError: 'Model' has no attribute 'module'\n")]
                           ).first_error
    assert first is not None and first.exception == "AttributeError" and first.line.line == 2


def test_control_characters_from_the_log_are_escaped() -> None:
    expl = classify_texts([("job.log", "ValueError: bad \x1b]0;owned\x07 \x1b[2J value\n")])
    out = render_text(expl)
    assert "\x1b" not in out and "\x07" not in out
    assert r"\e]0;owned" in out
    assert expl.first_error is not None and "\x1b" in expl.first_error.line.text  # JSON keeps it


def _healthy() -> list[Path]:
    logs = []
    for manifest in sorted(HERE.glob("fresh*/manifest.jsonl")):
        for line in manifest.read_text().splitlines():
            rec = json.loads(line)
            if rec["expected"] is None:
                logs.append(manifest.parent / rec["file"])
    return logs


@pytest.mark.parametrize("log", _healthy(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_healthy_log_from_the_fresh_corpora_gets_no_pointer(log: Path) -> None:
    expl = classify_texts([(log.name, log.read_text(errors="replace"))])
    assert expl.findings == () and expl.first_error is None
