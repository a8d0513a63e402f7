"""The set-up and API-mistake rules, and a timeout or refused connection read by where the
traceback raised it (a collective or the ranks meeting).

Logs from public threads where one exists: the first fresh corpus (tests/explain/fresh, a
development set since its score guided these rules) and lines that people pasted into public
repositories' notes (found by the exact string in the code index, which names no repository).
Where neither has the line, it is the message as the program that prints it formats it (CUDA's
error strings, torch's ``TORCH_CHECK`` texts, Slurm's errors), inside a traceback of torch's
own frames.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.explain import classify_texts
from preflight.explain.classifier import Classifier
from preflight.explain.rules import BY_REASON
from preflight.explain.rules_setup import SETUP_RULES

FRESH = Path(__file__).parent / "fresh"
FRESH8 = Path(__file__).parent / "fresh8"


def reasons(text: str, name: str = "job.log") -> list[str]:
    return [f.reason for f in classify_texts([(name, text)]).findings]


def first(text: str) -> tuple[str, str]:
    f = classify_texts([("job.log", text)]).findings[0]
    return f.reason, f.message


FIRST_FRESH_LOGS = [
    # "RuntimeError: Socket Timeout" raised from dist.all_reduce: a collective that timed out
    ("dgl-3629.log", "CollectiveTimeout"),
    # gloo's bare "No route to host" while the ranks meet
    ("biggraph-99.log", "RendezvousTimeout"),
    # nvidia-smi's "Unable to determine the device handle for GPU ...: GPU is lost"
    ("owod-81.log", "GpuHardwareError"),
    ("trixie-58.log", "SlurmCredentialError"),
    ("llamafactory-1213.log", "PeerMappingExhausted"),
]


def test_a_socket_timeout_names_the_collective_that_raised_it() -> None:
    reason, message = first((FRESH / "dgl-3629.log").read_text())
    assert reason == "CollectiveTimeout"
    assert message.startswith("all_reduce timed out")


_C10D = "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py"
_INIT = f'''Traceback (most recent call last):
  File "train.py", line 40, in <module>
    dist.init_process_group("gloo")
  File "{_C10D}", line 1141, in init_process_group
    store, rank, world_size = next(rendezvous_iterator)
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/rendezvous.py", line 241, in _env_rendezvous_handler
    store = _create_c10d_store(master_addr, master_port, rank, world_size, timeout)
'''  # noqa: E501
_COLLECTIVE = f'''Traceback (most recent call last):
  File "train.py", line 88, in <module>
    dist.all_reduce(loss)
  File "{_C10D}", line 2050, in all_reduce
    work = group.allreduce([tensor], opts)
'''


@pytest.mark.parametrize(("error", "at_init", "in_collective"), [
    ("RuntimeError: Socket Timeout", "RendezvousTimeout", "CollectiveTimeout"),
    ("RuntimeError: Connection refused", "RendezvousTimeout", "PeerConnectionLost"),
    ("RuntimeError: No route to host", "RendezvousTimeout", "PeerConnectionLost"),
])
def test_a_bare_socket_error_is_read_by_where_it_was_raised(error: str, at_init: str,
                                                           in_collective: str) -> None:
    assert reasons(_INIT + error) == [at_init]
    assert reasons(_COLLECTIVE + error) == [in_collective]
    # a collective's frame far above (another traceback long before) says nothing of this one
    assert reasons(_COLLECTIVE + "step 1 loss 2.0\n" * 60 + error) == [at_init]
    # init's frames after a collective's: the later traceback is the ranks meeting
    assert reasons(_COLLECTIVE + "RuntimeError: boom\n" + _INIT + error)[:1] == [at_init]


def test_a_collective_frame_outside_torch_distributed_is_not_a_collective() -> None:
    own = '''Traceback (most recent call last):
  File "mylib/comm.py", line 12, in all_reduce
    return client.call("sum", x)
RuntimeError: Socket Timeout
'''
    assert reasons(own) == ["RendezvousTimeout"]


_CUDA = "/usr/local/lib/python3.10/dist-packages/torch/cuda/__init__.py"


def test_a_traceback_cut_inside_set_device_is_an_invalid_ordinal() -> None:
    cut = f'''Traceback (most recent call last):
  File "train.py", line 21, in <module>
    torch.cuda.set_device(args.local_rank)
  File "{_CUDA}", line 404, in set_device
    torch._C._cuda_setDevice(device)
'''
    assert reasons(cut) == ["InvalidDeviceOrdinal"]
    # with its last line the frame and the line are one finding
    full = classify_texts([("job.log", cut + "RuntimeError: CUDA error: invalid device ordinal\n")])
    assert [(f.reason, f.count) for f in full.findings] == [("InvalidDeviceOrdinal", 2)]


def test_a_traceback_cut_inside_cuda_init_is_no_usable_gpu() -> None:
    cut = f'''Traceback (most recent call last):
  File "train.py", line 9, in <module>
    model.cuda()
  File "{_CUDA}", line 298, in _lazy_init
    torch._C._cuda_init()
'''
    assert reasons(cut) == ["NoCudaDevice"]


def test_a_cut_traceback_in_the_store_based_barrier_is_a_rendezvous() -> None:
    cut = f'''  File "{_C10D}", line 627, in init_process_group
    _store_based_barrier(rank, store, timeout)
  File "{_C10D}", line 255, in _store_based_barrier
    worker_count = store.add(store_key, 0)
'''
    assert reasons(cut) == ["RendezvousTimeout"]


#: Lines pasted into public repositories' notes (exact-string search of the code index).
PUBLIC_NOTES = [
    ("RuntimeError: Exception occured in `DistributedTrainer` when calling event `before_fit`:  "
     "DDP expects same model across all ranks, but Rank 1 has 221 params, while rank 0 has "
     "inconsistent 0 params.", "ModelMismatch", "221 parameters on rank 1 but 0 on rank 0"),
    ("RuntimeError: Expected to mark a variable ready only once\nParameter at index 1051 with "
     "name encoder.layers.5.ffn.layers.1.shared_lora_b\nhas been marked as ready twice.",
     "ParameterReadyTwice", "marked a parameter's gradient ready twice"),
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running "
     "collective: CollectiveFingerPrint(OpType=ALLGATHER, TensorShape=[4], TensorDtypes=Float, "
     "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided "
     "(default))), but Rank 1 is running collective: CollectiveFingerPrint(OpType=ALLREDUCE)",
     "CollectiveMismatch", "rank 0 ran ALLGATHER"),
]


@pytest.mark.parametrize(("text", "reason", "said"), PUBLIC_NOTES,
                         ids=[r for _, r, _ in PUBLIC_NOTES])
def test_lines_people_posted(text: str, reason: str, said: str) -> None:
    got, message = first(text)
    assert got == reason
    assert said in message


def test_the_parameter_marked_twice_is_in_the_evidence() -> None:
    f = classify_texts([("job.log", PUBLIC_NOTES[1][0])]).findings[0]
    assert any("shared_lora_b" in e.text for e in f.evidence)


#: One line per pattern of the set-up rules, as the program that prints it writes it.
PROGRAM_LINES = [
    ("RuntimeError: CUDA error: no CUDA-capable device is detected", "NoCudaDevice"),
    ("RuntimeError: No CUDA GPUs are available", "NoCudaDevice"),
    ("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
     "GPU and installed a driver from http://www.nvidia.com/Download/index.aspx", "NoCudaDevice"),
    ("AssertionError: Torch not compiled with CUDA enabled", "NoCudaDevice"),
    ("RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
     "NoCudaDevice"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
     "that the latest NVIDIA driver is installed and running.", "NoCudaDevice"),
    ("RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, "
     "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start.", "NoCudaDevice"),
    ("OSError: libcuda.so.1: cannot open shared object file: No such file or directory",
     "NoCudaDevice"),
    ("RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
     "CudaDriverMismatch"),
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
     "update your GPU driver", "CudaDriverMismatch"),
    ("RuntimeError: CUDA error: system has unsupported display driver / cuda driver "
     "combination", "CudaDriverMismatch"),
    ("RuntimeError: CUDA error: forward compatibility was attempted on non supported HW",
     "CudaDriverMismatch"),
    ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
     "CudaDeviceBusy"),
    ("RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable",
     "CudaDeviceBusy"),
    ("ImportError: /opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: "
     "undefined symbol: ncclCommRegister", "LibraryMismatch"),
    ("ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory",
     "LibraryMismatch"),
    ("OSError: The detected CUDA version (11.8) mismatches the version that was used to compile "
     "PyTorch (12.1). Please make sure to use the same CUDA versions.", "LibraryMismatch"),
    ("RuntimeError: Distributed package doesn't have NCCL built in", "BackendUnsupported"),
    ("srun: error: Task launch for StepId=36.0 failed on node cn131: Invalid job credential",
     "SlurmCredentialError"),
    ("slurmd: error: Munge decode failed: Rewound credential", "SlurmCredentialError"),
    ("ValueError: Default process group has not been initialized, please make sure to call "
     "init_process_group.", "ProcessGroupNotInitialized"),
    ("RuntimeError: params[0] in this process with sizes [64, 3, 7, 7] appears not to match "
     "sizes of the same param in process 0.", "ModelMismatch"),
    ("RuntimeError: CUDA error: device-side assert triggered", "DeviceSideAssert"),
    ("RuntimeError: CUDA error: peer mapping resources exhausted", "PeerMappingExhausted"),
    ("RuntimeError: CUDA error: an illegal instruction was encountered", "IllegalMemoryAccess"),
    ("RuntimeError: CUDA error: unspecified launch failure", "IllegalMemoryAccess"),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
     "CudaOutOfMemory"),
    ("[rank0]:[E1201 10:00:00.000000000 ProcessGroupNCCL.cpp:1423] [PG ID 0 PG GUID 0(default_pg) "
     "Rank 0] Heartbeat monitor timed out! Process will be terminated after dumping debug info.",
     "CollectiveTimeout"),
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, invalid "
     "argument (run with NCCL_DEBUG=WARN for details), NCCL version 2.18.1", "NcclSystemError"),
    ("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
     "GpuHardwareError"),
]


PROGRAM_LINES += [
    ("docker: Error response from daemon: failed to create task for container: failed to create "
     "shim task: OCI runtime create failed: runc create failed: unable to start container "
     "process: error during container init: error running hook #0: error running hook: exit "
     "status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
     "initialization error: nvml error: driver not loaded: unknown.", "NoCudaDevice"),
    ("RuntimeError: Error building extension 'fused_adam'", "LibraryMismatch"),
    ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
     "op.preamble.length <= op.nbytes. 8773632 vs 4", "CollectiveMismatch"),
]
#: Lines of the older rules' new patterns, as their programs print them.
MORE_LINES = [
    ("train.py: error: unrecognized arguments: --local-rank=0", "ScriptException"),
    ("RuntimeError: module must have its parameters and buffers on device cuda:0 "
     "(device_ids[0]) but found one of them on device: cuda:1", "DeviceMismatch"),
    ("ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
     "single-device/multiple-device GPU modules or CPU modules, but got device_ids [0], "
     "output_device None, and module parameters {device(type='cpu')}.", "DeviceMismatch"),
    ("ValueError: You can't train a model that has been loaded in 8-bit precision on a different "
     "device than the one you're training on.", "DeviceMismatch"),
    ("RuntimeError: NCCL Error 5: invalid usage", "NcclSystemError"),
    ("  Message:      The node was low on resource: memory. Container train was using "
     "61Gi, which exceeds its request of 0.", "HostOutOfMemory"),
    ("ValueError: host not found: Name or service not known", "RendezvousTimeout"),
    ("[E socket.cpp:922] [c10d] The client socket has failed to connect to [master]:29500 "
     "(errno: 111 - Connection refused).", "RendezvousTimeout"),
]


def test_c10d_ipv6_localhost_warning_of_a_run_that_started_is_no_failure() -> None:
    for errno in ("99 - Cannot assign requested address",):
        warn = (f"[W socket.cpp:663] [c10d] The client socket has failed to connect to "
                f"[localhost]:29500 (errno: {errno}).")
        assert reasons(warn + "\nepoch 0 step 10 loss 1.9\n") == []
        assert reasons(f"[rank1]:[W1201 10:00:00.000000000 socket.cpp:752] {warn[19:]}") == []


def test_every_setup_pattern_has_a_program_line() -> None:
    lines = [line for line, _ in ALL_LINES] + [t for t, _, _ in PUBLIC_NOTES]
    lines += [(FRESH / n).read_text() for n in ("trixie-58.log", "llamafactory-1213.log")]
    lines += [(FRESH2 / n).read_text() for n in ("lightning-18728.log", "dct-3.log",
                                                 "efficientcomputing-90.log")]
    for rule in SETUP_RULES:
        for pat in rule.patterns:
            assert any(pat.regex.search(line) for line in lines), pat.regex.pattern


def test_setup_rules_are_origins_with_a_remedy() -> None:
    for rule in SETUP_RULES:
        assert BY_REASON[rule.reason] is rule
        assert rule.tier == 0 and len(rule.remedy) > 80


def test_a_run_that_ended_by_shutting_the_rendezvous_is_no_rendezvous_timeout() -> None:
    log = (FRESH / "wespeaker-171.log").read_text()
    assert "RendezvousTimeout" not in reasons(log, "wespeaker-171.log")


FRESH2 = Path(__file__).parent / "fresh2"


SECOND_FRESH_LOGS = [
    # the watchdog's C++ stack without its timeout line
    ("particleflow-390.log", "CollectiveTimeout"),
    # NCCL's WARN of a failed CUDA call, with nothing after it
    ("nccl-1283.log", "NcclSystemError"),
    ("autoreid-3.log", "LauncherNotFound"),
    ("lightning-18728.log", "CudaInitBeforeFork"),
    ("dct-3.log", "NoTrainableParameters"),
    ("efficientcomputing-90.log", "BackendUnsupported"),
    # gloo's own connect, its address on the next line
    ("colossalai-2407.log", "NcclConnectFailed"),
]


def test_gloo_connect_names_the_peer_and_keeps_the_next_line() -> None:
    one = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect "
           "[10.0.0.2]:29591: Connection refused")
    f = classify_texts([("job.log", one)]).findings[0]
    assert f.reason == "NcclConnectFailed"
    split = classify_texts([("x.log", (FRESH2 / "colossalai-2407.log").read_text())]).findings[0]
    assert any("Connection refused" in e.text for e in split.evidence)


ROUND3_LINES = [
    ("RuntimeError: CUDA error: the provided PTX was compiled with an unsupported toolchain.",
     "CudaDriverMismatch"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device",
     "GpuArchUnsupported"),
    ("node1:123:456 [1] include/alloc.h:48 NCCL WARN Cuda failure 'peer access is not supported "
     "between these two devices'", "P2PUnsupported"),
    ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
     "multiprocessing, you must use the 'spawn' start method", "CudaInitBeforeFork"),
    ("RuntimeError: DistributedDataParallel is not needed when a module doesn't have any "
     "parameter that requires a gradient.", "NoTrainableParameters"),
    ("RuntimeError: ProcessGroupGloo does not support reduce_scatter", "BackendUnsupported"),
    ("RuntimeError: Backend gloo does not support allgather_coalesced", "BackendUnsupported"),
    ("torch.distributed.DistStoreError: use_libuv was requested but PyTorch was build without "
     "libuv support", "BackendUnsupported"),
    ("/var/spool/slurmd/job123/slurm_script: line 12: torchrun: command not found",
     "LauncherNotFound"),
    ("FileNotFoundError: [Errno 2] No such file or directory: 'srun'", "LauncherNotFound"),
    ("RuntimeError: [enforce fail at inline_container.cc:595] . PytorchStreamWriter failed "
     "writing file data/12: file write failed", "DiskFull"),
    ("OSError: [Errno 122] Disk quota exceeded: '/home/u/ckpt/epoch_3.pt'", "DiskFull"),
    ("OSError: [Errno 28] No space left on device", "DiskFull"),
    ("[E ProcessGroupNCCL.cpp:475] Exception raised from checkTimeout at "
     "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:565 (most recent call first):",
     "CollectiveTimeout"),
    ("Killed", "RankKilled"),
]


def test_a_full_dev_shm_is_still_shm_not_a_full_disk() -> None:
    line = ("RuntimeError: unable to write to file </torch_1234_567_0>: No space left on device "
            "(28)")
    assert reasons(line) == ["ShmExhausted"]


def test_a_bare_killed_inside_a_line_is_no_kill() -> None:
    assert reasons("epoch 3: 12 jobs Killed by the user earlier, resuming") == []


def test_no_anchor_holds_another() -> None:
    """Each anchor is one pass over every block: one that holds another finds nothing more."""
    from preflight.explain.rules import ANCHORS

    assert len(set(ANCHORS)) == len(ANCHORS)
    assert [(a, b) for a in ANCHORS for b in ANCHORS if a != b and b in a] == []


ROUND4_LINES = [
    ("ValueError: TCP backend has been deprecated. Please use Gloo or MPI backends for collective "
     "operations on CPU tensors.", "BackendUnsupported"),
    ("ValueError: Error initializing torch.distributed using tcp:// rendezvous: rank parameter "
     "missing", "MissingLauncherEnv"),
    ("NameError: name '_ddp_dict' is not defined", "ScriptException"),
    ("[rank0]: SyntaxError: invalid syntax", "ScriptException"),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/data/imagenet/train'",
     "ScriptException"),
    ("AttributeError: 'DistributedDataParallel' object has no attribute 'generate'",
     "ScriptException"),
    ("AttributeError: module 'torch.distributed' has no attribute 'all_gather_into_tensor'",
     "ScriptException"),
]


_JOB_TRACEBACK = """Traceback (most recent call last):
  File "/home/u/proj/train.py", line 88, in <module>
    main()
  File "/home/u/proj/train.py", line 61, in main
    raise ValueError(f"unknown optimizer {name}")
ValueError: unknown optimizer adamw8
"""


def test_an_exception_raised_in_the_jobs_own_file_is_the_jobs() -> None:
    f = classify_texts([("job.log", _JOB_TRACEBACK)]).findings
    assert [d.reason for d in f] == ["ScriptException"]
    assert "ValueError at train.py:61: unknown optimizer adamw8" in f[0].message


def test_a_library_rejecting_what_the_job_passed_names_the_jobs_call() -> None:
    lib = _JOB_TRACEBACK.replace(
        '  File "/home/u/proj/train.py", line 61, in main\n',
        '  File "/home/u/proj/train.py", line 61, in main\n    opt = build(name)\n'
        '  File "/opt/venv/lib/python3.11/site-packages/mylib/optim.py", line 9, in build\n')
    f = classify_texts([("job.log", lib)]).findings
    assert [d.reason for d in f] == ["ScriptException"]
    assert f[0].message == ("the job's call at train.py:61 made installed code (optim.py) raise "
                            "ValueError: unknown optimizer adamw8")
    # a library's own failure under the same call is not the job's
    assert reasons(lib.replace("ValueError: unknown optimizer adamw8",
                               "RuntimeError: CUDA driver returned 999")) == []


def _importing(line: str) -> str:
    return _JOB_TRACEBACK.replace("ValueError: unknown optimizer adamw8", line)


def test_a_package_that_is_not_installed_is_the_environments_not_the_jobs_bug() -> None:
    """The Python that ran cannot find the package: the node's environment or the launch, not
    the job's code; the message names the module and the fix names the Python to check."""
    f = classify_texts([("job.log", _importing("ModuleNotFoundError: No module named 'apex'"))]
                       ).findings
    assert [d.reason for d in f] == ["MissingPackage"]
    assert f[0].layer.value == "environment"
    assert f[0].message == "the module apex is not installed in the Python that ran the job"
    assert "which python" in f[0].remedy and "PYTHONPATH" in f[0].remedy
    # a module of the package's name shadows it: another install, or a file beside the script
    f = classify_texts([("job.log", _importing(
        "ModuleNotFoundError: No module named 'torch.distributed.run'; 'torch.distributed' is "
        "not a package"))]).findings
    assert [d.reason for d in f] == ["MissingPackage"]
    assert f[0].message.startswith("torch.distributed is a module, not the package "
                                   "torch.distributed.run needs")


@pytest.mark.parametrize("line", [
    # torch's own warning when numpy is absent: the run goes on
    "/opt/venv/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:368: "
    "UserWarning: Failed to initialize NumPy: No module named 'numpy' (Triggered internally)",
    # torch.load given a TorchScript archive: no package is missing
    "ModuleNotFoundError: No module named '__torch__'",
    # a library's log line that mentions the words
    "INFO: xformers not found (No module named 'xformers'), using the math kernel",
])
def test_words_about_a_missing_module_that_are_no_failed_import(line: str) -> None:
    assert reasons(line + "\nepoch 1 loss 0.5\n") == []


def test_a_real_log_of_a_package_not_installed_on_the_nodes() -> None:
    """Co-DETR's dist_train.sh: both ranks fail at ``from mmdet import __version__``."""
    f = classify_texts([("log", (FRESH8 / "codetr-205.log").read_text())]).findings
    assert [d.reason for d in f] == ["MissingPackage"]
    assert f[0].message.startswith("the module mmdet is not installed in the Python that ran "
                                   "the job")


@pytest.mark.parametrize("line", [
    "ModuleNotFoundError: No module named 'torch._six'",
    "ImportError: cannot import name 'FusedAdam' from 'apex' "
    "(/opt/conda/lib/python3.10/site-packages/apex/__init__.py)",
])
def test_an_import_of_a_part_the_installed_package_lacks_is_the_jobs_code(line: str) -> None:
    """The package was found and lacks what the job's code imports: the code was written for
    another version of it, which the job (not the node) must install or drop."""
    f = classify_texts([("job.log", _importing(line))]).findings
    assert [d.reason for d in f] == ["ScriptException"]
    assert f"at train.py:61: {line.split(': ', 1)[1][:60]}" in f[0].message
    assert "module, attribute or API the installed version lacks" in f[0].remedy


_DECODING = """Traceback (most recent call last):
  File "/home/u/proj/train.py", line 61, in main
    cfg = json.load(open(path))
  File "/usr/lib/python3.10/json/decoder.py", line 355, in raw_decode
    raise JSONDecodeError("Expecting value", s, err.value) from None
"""


@pytest.mark.parametrize("cls", ["json.decoder.JSONDecodeError", "yaml.scanner.ScannerError",
                                 "UnicodeDecodeError", "_pickle.UnpicklingError"])
def test_a_decode_error_of_the_jobs_input_is_taken_as_the_value_error_it_is(cls: str) -> None:
    """Raised in installed code under the job's call (json.load of a file that is not JSON, a
    YAML config that does not parse), the job's call and its input are where to look."""
    f = classify_texts([("job.log", _DECODING + f"{cls}: Expecting value: line 1 column 1\n")]
                       ).findings
    assert [d.reason for d in f] == ["ScriptException"]
    assert "the job's call at train.py:61 made installed code (decoder.py) raise" in f[0].message


def test_an_error_a_library_raises_for_itself_is_still_not_the_jobs() -> None:
    """Only the decode errors are taken as ValueError: a library's own error class is not."""
    assert reasons(_DECODING + "requests.exceptions.ConnectionError: Max retries exceeded\n") == []


def test_a_specific_cause_goes_before_the_jobs_exception() -> None:
    log = _JOB_TRACEBACK + "RuntimeError: CUDA error: out of memory\n"
    assert reasons(log) == ["CudaOutOfMemory", "ScriptException"]


def test_a_python_exception_far_below_the_frame_is_not_read_as_its_end() -> None:
    far = _JOB_TRACEBACK.replace("ValueError: unknown", "step 1\nstep 2\nstep 3\nstep 4\n"
                                 "ValueError: unknown")
    assert reasons(far) == []


FRESH4 = Path(__file__).parent / "fresh4"


FOURTH_FRESH_LOGS = [
    # a bare AssertionError after the job's own frame
    ("mmdetection-6588.log", "ScriptException"),
    # torch 1.x's device words
    ("amodalsegmentationbasedonvisibleregionsegmentationandshapeprior-6.log", "DeviceMismatch"),
    # the kernel's assertion lines, without the "device-side assert triggered" line
    ("megatronllama-14.log", "DeviceSideAssert"),
]


ROUND5_LINES = [
    ("/pytorch/aten/src/ATen/native/cuda/Loss.cu:242: nll_loss_forward_reduce_cuda_kernel_2d: "
     "block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.",
     "DeviceSideAssert"),
    ("RuntimeError: Expected object of device type cuda but got device type cpu for argument #1 "
     "'self' in call to _th_addmm", "DeviceMismatch"),
]


ROUND6_LINES = [
    # SageMaker's data-parallel backend, and torch's MPI backend on an MPI without CUDA
    ('ErrorMessage "RuntimeError: SMDDP does not support: ReduceOp', "BackendUnsupported"),
    ("RuntimeError: CUDA tensor detected and the MPI used doesn't have CUDA-aware MPI support",
     "BackendUnsupported"),
]


def test_a_bare_exception_line_says_it_had_no_message() -> None:
    bare = _JOB_TRACEBACK.replace("ValueError: unknown optimizer adamw8", "AssertionError")
    f = classify_texts([("job.log", bare)]).findings
    assert [d.reason for d in f] == ["ScriptException"]
    assert f[0].message.startswith("the job's code raised AssertionError at train.py:61 (no ")


def test_a_c_assert_of_another_program_is_no_cuda_kernel_assert() -> None:
    assert reasons("python: malloc.c:2379: sysmalloc: Assertion `(old_top == initial_top (av) "
                   "&& old_size == 0)' failed.") == []


FRESH5 = Path(__file__).parent / "fresh5"


FIFTH_FRESH_LOGS = [
    # SageMaker's flattened error message, and the MPI backend's line alone
    ("pytorchlightning-20409.log", "BackendUnsupported"),
    ("rocmpytorch-453.log", "BackendUnsupported"),
]


FRESH6 = Path(__file__).parent / "fresh6"


SIXTH_FRESH_LOGS = [
    # dash's words for a missing command, accelerate's own port check, DDP's list of names alone
    ("llamafactory-5217.log", "LauncherNotFound"),
    ("kohyass-2138.log", "PortInUse"),
    ("diffsynthstudio-912.log", "UnusedParameters"),
]


ROUND7_LINES = [
    ("/bin/sh: 1: torchrun: not found", "LauncherNotFound"),
    ("sh: line 3: srun: not found", "LauncherNotFound"),
    ("ConnectionError: Tried to launch distributed communication on port `29500`, but another "
     "process is utilizing it. Please specify a different port", "PortInUse"),
    ("Parameters which did not receive grad for rank 1: module.head.weight, module.head.bias",
     "UnusedParameters"),
    ("Parameter indices which did not receive grad for rank 0: 3 7", "UnusedParameters"),
]


FRESH7 = Path(__file__).parent / "fresh7"


SEVENTH_FRESH_LOGS = [
    # torch 2.5+'s heartbeat monitor alone, and the store's connect timeout cut mid-word
    ("llamafactory-9496.log", "CollectiveTimeout"),
    ("llamafactory-6575.log", "RendezvousTimeout"),
]


ROUND8_LINES = [
    ("[rank0]:[E725 02:39:41.236667746 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) "
     "Rank 0] Received a dump signal due to a collective timeout from this local rank and we "
     "will try our best to dump the debug info. Last enqueued NCCL work: 39892, last completed "
     "NCCL work: 39891.This is most likely caused by incorrect usages of collectives",
     "CollectiveTimeout"),
    ("[E108 20:04:34.467642512 socket.cpp:957] [c10d] The client socket has timed out after 900s "
     "whi", "RendezvousTimeout"),
]


def test_the_dump_signal_names_the_work_that_did_not_complete() -> None:
    f = classify_texts([("log", ROUND8_LINES[0][0])]).findings
    assert "the last NCCL work enqueued is 39892, the last completed 39891" in f[0].message


def test_a_dump_signal_from_another_rank_does_not_call_this_rank_timed_out() -> None:
    # rank 5 got the signal from rank 7: rank 7 timed out, rank 5 did not time out itself
    (f,) = classify_texts([("log", "[rank5]:[E703 17:54:18.884528282 ProcessGroupNCCL.cpp:1987] "
                                   "[PG ID 0 PG GUID 0(default_pg) Rank 5] Received a dump signal "
                                   "due to a collective timeout from  rank 7 and we will try our "
                                   "best to dump the debug info.")]).findings
    assert f.reason == "CollectiveTimeout" and f.ranks == (7,)


def test_a_missing_file_the_shell_did_not_find_is_no_missing_launcher() -> None:
    assert reasons("/bin/sh: 1: ./prepare_data.sh: not found") == []


ROUND9_LINES = [
    ("ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.29' not found "
     "(required by /opt/venv/lib/python3.8/site-packages/google/protobuf/pyext/"
     "_message.cpython-38-x86_64-linux-gnu.so)", "LibraryMismatch"),
    ("/usr/bin/python3: /lib64/libc.so.6: version `GLIBC_2.34' not found (required by "
     "/opt/conda/lib/libstdc++.so.6)", "LibraryMismatch"),
    ("IsADirectoryError: [Errno 21] Is a directory: 'OpenFlamingo-9B'", "ScriptException"),
    ("NotADirectoryError: [Errno 20] Not a directory: 'data/train.jsonl/shard0'",
     "ScriptException"),
    ("/usr/bin/python3: can't open file '/workspace/train.py': [Errno 2] No such file or "
     "directory", "ScriptException"),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (128x768 and 1536x2)",
     "ScriptException"),
    ("RuntimeError: The size of tensor a (4) must match the size of tensor b (8) at "
     "non-singleton dimension 1", "ScriptException"),
    ("RuntimeError: Error(s) in loading state_dict for VisionTransformer:", "ScriptException"),
    ("ValueError: Expected input batch_size (32) to match target batch_size (64).",
     "ScriptException"),
    ("RuntimeError: shape '[-1, 400]' is invalid for input of size 1000", "ScriptException"),
    ("RuntimeError: Given groups=1, weight of size [64, 3, 7, 7], expected input[16, 1, 224, "
     "224] to have 3 channels, but got 1 channels instead", "ScriptException"),
]


def test_the_loader_names_the_library_and_the_version_it_lacks() -> None:
    f = classify_texts([("log", ROUND9_LINES[0][0])]).findings[0]
    assert f.message.startswith("/lib/x86_64-linux-gnu/libstdc++.so.6 is older than ")
    assert "(it lacks GLIBCXX_3.4.29)" in f.message


def test_a_checkpoint_that_does_not_fit_shows_its_parameters() -> None:
    log = ("RuntimeError: Error(s) in loading state_dict for Net:\n"
           "\tsize mismatch for fc.weight: copying a param with shape torch.Size([10, 512]) "
           "from checkpoint, the shape in current model is torch.Size([1000, 512]).\n")
    f = classify_texts([("log", log)]).findings[0]
    assert f.reason == "ScriptException" and "does not fit the model Net" in f.message
    assert any("size mismatch for fc.weight" in e.text for e in f.evidence)


def test_a_missing_script_is_not_a_missing_launcher() -> None:
    # torchrun found, the script it was given not: the job's path, not the node's install
    assert reasons("/env/bin/python: can't open file '/home/u/BLIP2/train.py': [Errno 2] No "
                   "such file or directory\nERROR:torch.distributed.elastic.multiprocessing."
                   "api:failed (exitcode: 2) local_rank: 0 (pid: 3169136) of binary: "
                   "/env/bin/python") == ["ScriptException"]


FRESH10 = Path(__file__).parent / "fresh10"


TENTH_FRESH_LOGS = [
    # a loader's version refusal inside an ImportError; a path handed to torch.load that is a
    # directory; a shape error raised in torch's own frames under the job's
    ("store-42645328347.log", "LibraryMismatch"),
    ("store-3934154932.log", "ScriptException"),
    ("store-30528053516.log", "ScriptException"),
]


ROUND10_LINES = [
    ("NotImplementedError: Using RTX 4000 series doesn't support faster communication broadband "
     "via P2P or IB. Please set `NCCL_P2P_DISABLE=\"1\"` and `NCCL_IB_DISABLE=\"1\" or use "
     "`accelerate launch` which will do this automatically.", "P2PUnsupported"),
    ("RuntimeError: Gloo connectFullMesh failed: Connection refused, remote=[127.0.1.1]:17308",
     "NcclConnectFailed"),
    ("RuntimeError: Gloo connectFullMesh failed: Connection refused", "NcclConnectFailed"),
    # the other words of a failed full-mesh connect stay the rendezvous' ("no error": round 16)
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:446] Connection closed by peer [10.0.0.2]:6236", "RendezvousTimeout"),
]


ROUND11_LINES = [
    # bash's job control for a crashed command, and an interactive shell's bare words
    ("/var/spool/slurmd/job1234/slurm_script: line 20: 98765 Segmentation fault      (core "
     "dumped) python train.py", "RankKilled"),
    ("run.sh: line 7:  4242 Aborted                 (core dumped) torchrun --nproc_per_node 8 "
     "train.py", "RankKilled"),
    ("Segmentation fault (core dumped)", "RankKilled"),
    # NCCL's socket transport (net_socket.cc) when the peers' sizes differ
    ("node02:5678:5700 [1] transport/net_socket.cc:540 NCCL WARN NET/Socket : peer "
     "10.0.0.1<45678> message truncated : receiving 1048576 bytes instead of 65536. If you "
     "believe your socket network is in healthy state, there may be a mismatch in collective "
     "sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks",
     "CollectiveMismatch"),
    # torch's lazy CUDA init, its older words for a tensor on the wrong device, its CPU
    # allocator, and NCCL 2.19's end of connect retries
    ("torch.cuda.DeferredCudaCallError: CUDA call failed lazily at initialization with error: "
     "device >= 0 && device < num_gpus INTERNAL ASSERT FAILED at \"../aten/src/ATen/cuda/"
     "CUDAContext.cpp\":50, please report a bug to PyTorch. device=1, num_gpus=1",
     "InvalidDeviceOrdinal"),
    ("RuntimeError: Tensor for argument #2 'mat1' is on CPU, but expected it to be on GPU (while "
     "checking arguments for addmm)", "DeviceMismatch"),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't "
     "allocate memory: you tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate "
     "memory)", "HostOutOfMemory"),
    ("node1:123:456 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: exceeded retries "
     "(20000)", "NcclConnectFailed"),
]


ROUND12_LINES = [
    # Python's words for a module it found nowhere: Python 3 (behind a launcher's prefix, and
    # indented as a paste of a nested traceback), Python 2, and a module that shadows a package
    ("[rank3]: ModuleNotFoundError: No module named 'deepspeed'", "MissingPackage"),
    ("    ModuleNotFoundError: No module named 'torch'", "MissingPackage"),
    ("ImportError: No module named apex", "MissingPackage"),
    ("ModuleNotFoundError: No module named 'torch.distributed.elastic'; 'torch.distributed' is "
     "not a package", "MissingPackage"),
    # torch's words for tensors whose dtypes do not fit one op: the job's mixed precision
    ("RuntimeError: Found dtype Half but expected Float", "ScriptException"),
    ("RuntimeError: expected scalar type Float but found BFloat16", "ScriptException"),
    ("RuntimeError: expected mat1 and mat2 to have the same dtype, but got: c10::Half != float",
     "ScriptException"),
    ("RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) "
     "should be the same", "ScriptException"),
    ("RuntimeError: result type Float can't be cast to the desired output type Long",
     "ScriptException"),
    ("RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'", "ScriptException"),
    # the same words when the input and the weights are on different devices
    ("RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) "
     "should be the same", "DeviceMismatch"),
    ("RuntimeError: Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) "
     "should be the same or input should be a MKLDNN tensor and weight is a dense tensor",
     "DeviceMismatch"),
]


ROUND13_LINES = [
    # gloo's words for a collective it lacks
    ("RuntimeError: no support for _allgather_base in Gloo process group", "BackendUnsupported"),
    # transformers' words for an optional package it did not find
    ("ImportError: FlashAttention2 has been toggled on, but it cannot be used due to the "
     "following error: the package flash_attn seems to be not installed. Please refer to the "
     "documentation of https://huggingface.co/docs/transformers/perf_infer_gpu_one#flashattention"
     "-2 to install Flash Attention 2.", "MissingPackage"),
    ("ImportError: LlamaTokenizer requires the protobuf library but it was not found in your "
     "environment. Checkout the instructions on the installation page of its repo",
     "MissingPackage"),
    # torch's newer words for a layer's input and bias of two dtypes
    ("[rank1]: RuntimeError: Input type (float) and bias type (c10::Half) should be the same",
     "ScriptException"),
    # autograd's words for a loss with no graph, Python's for a call that does not fit
    ("RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
     "ScriptException"),
    # Hugging Face's words for a path that is not there, diffusers' version check
    ("huggingface_hub.utils._validators.HFValidationError: Repo id must use alphanumeric chars "
     "or '-', '_', '.', '--' and '..' are forbidden, '-' and '.' cannot start or end the name, "
     "max length is 96: '/data/models/llama-7b'.", "ScriptException"),
    ("OSError: /data/models/llama-7b is not a local folder and is not a valid model identifier "
     "listed on 'https://huggingface.co/models'", "ScriptException"),
    ("ImportError: This example requires a minimum version of 0.15.0.dev0, but the version "
     "found is 0.14.0.", "ScriptException"),
]


ROUND14_LINES = [
    # NCCL's check of the rings it built, as a WARN line and as an error's detail
    ("hetml-a100:69967:69967 [3] graph/rings.cc:51 NCCL WARN Error : ring 1 does not contain "
     "rank 0", "P2PUnsupported"),
    ("node1:123:123 [1] graph/rings.cc:38 NCCL WARN Error : ring 1 does not loop back to start "
     "(3 != 1)", "P2PUnsupported"),
    # torch's words for tensors that hold NaN or inf
    ("RuntimeError: normal expects all elements of std >= 0.0", "ScriptException"),
    ("RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
     "ScriptException"),
    ("RuntimeError: Function 'MulBackward0' returned nan values in its 0th output.",
     "ScriptException"),
    # transformers on a checkpoint of a model type it does not know
    ("[rank0]: ValueError: The checkpoint you are trying to load has model type `ursa` but "
     "Transformers does not recognize this architecture. This could be because of an issue with "
     "the checkpoint, or because your version of Transformers is out of date.",
     "ScriptException"),
    # the job's own script's argparse, behind torchrun's rank prefix too
    ("finetune_stylegan.py: error: the following arguments are required: path",
     "ScriptException"),
    ("[default3]:run_etu_h200.py: error: unrecognized arguments: true", "ScriptException"),
]


ROUND15_LINES = [
    # ROCm's runtime on an AMD GPU that stopped, and on a kernel's bad access
    ("HW Exception by GPU node-9 (Agent handle: 0x64ff272d8ab0) reason :GPU Hang",
     "GpuHardwareError"),
    ("Memory access fault by GPU node-2 (Agent handle: 0x55d1c9a2e3f0) on address "
     "0x7f2b3c000000. Reason: Page not present or supervisor privilege.", "IllegalMemoryAccess"),
    # torch's heartbeat monitor on a rank that received another rank's timeout
    ("[rank4]:[E703 15:37:17.178360488 ProcessGroupNCCL.cpp:1987] [PG ID 0 PG GUID "
     "0(default_pg) Rank 4] Received a dump signal due to a collective timeout from  rank 7 and "
     "we will try our best to dump the debug info. Last enqueued NCCL work: 56118, last "
     "completed NCCL work: 56117.", "CollectiveTimeout"),
]


def test_the_heartbeat_monitors_dump_signal_names_the_rank_that_timed_out() -> None:
    """Every other rank prints "from rank 7": rank 7 timed out, the printers did not, and
    they are where the collective waited."""
    line = ROUND15_LINES[2][0]
    text = "\n".join(line.replace("[rank4]", f"[rank{r}]").replace("Rank 4]", f"Rank {r}]")
                     for r in (1, 3, 4)) + "\n[rank0]: step 5\n"
    (f,) = classify_texts([("job.log", text)]).findings
    assert f.reason == "CollectiveTimeout"
    assert f.ranks == (7,)
    assert f.message.startswith("a collective timed out on one rank; the others received its "
                                "dump signal (rank 7)")
    assert "ranks 0-1,3-4 did not time out" in f.message


@pytest.mark.parametrize("line", [
    # torch.distributed.launch's and torchrun's own parsers are the launcher's, not the job's
    "launch.py: error: unrecognized arguments: --use_env",
    "run.py: error: the following arguments are required: training_script, training_script_args",
    # a program's error that is no argparse refusal of a script
    "accelerate <command> [<args>] launch: error: argument --num_processes: invalid int value",
])
def test_a_launchers_own_parser_is_not_the_jobs_script(line: str) -> None:
    assert reasons(line + "\n") == []


def test_the_jobs_argparse_refusal_names_the_script_and_its_words() -> None:
    reason, message = first(ROUND14_LINES[-2][0])
    assert reason == "ScriptException"
    assert message == ("the job's script finetune_stylegan.py refused its command line: the "
                       "following arguments are required: path")


def test_a_loss_with_no_graph_says_what_to_change() -> None:
    reason, message = first(ROUND13_LINES[4][0])
    assert reason == "ScriptException"
    assert "use_reentrant=False" in message and "no_grad" in message


def test_a_dtype_error_names_both_dtypes_and_the_fix() -> None:
    reason, message = first("RuntimeError: Found dtype Half but expected Float")
    assert reason == "ScriptException"
    assert message.startswith("an op got a Half tensor where Float was expected")
    assert "autocast" in message


def test_the_shells_words_for_a_crash_name_the_signal() -> None:
    _, message = first(ROUND11_LINES[0][0])
    assert message.startswith("process 98765 ended with SIGSEGV (the shell says Segmentation "
                              "fault)")
    _, message = first("Bus error (core dumped)")
    assert "SIGBUS" in message and "/dev/shm" in message


def test_a_stores_wait_for_clients_cut_before_its_count_is_still_read() -> None:
    """A terminal's width or a paste puts the count on the next line."""
    reason, message = first("torch.distributed.DistStoreError: Timed out after 3601 seconds "
                            "waiting for clients. \n1/16 clients joined.\n")
    assert reason == "RendezvousTimeout"
    assert message.startswith("the store on MASTER_ADDR waited 3601 s and not every rank joined")


def test_a_refused_gloo_connect_without_its_address_names_none() -> None:
    _, message = first("RuntimeError: Gloo connectFullMesh failed: Connection refused")
    assert message == "gloo's connection to a peer was refused"


def _traceback(*frames: str, last: str) -> str:
    out = ["Traceback (most recent call last):"]
    for f in frames:
        out += [f"  {f}", "    x = call(y)"]
    return "\n".join([*out, last]) + "\n"


JOB = 'File "/work/job/train.py", line 40, in main'
LIB = 'File "/opt/venv/lib/python3.11/site-packages/lib/tables.py", line 31, in get'


def test_what_the_job_passed_to_a_library_is_the_jobs_call() -> None:
    f = classify_texts([("log", _traceback(JOB, LIB, last="KeyError: 'no_such_set'"))]).findings
    assert [x.reason for x in f] == ["ScriptException"]
    assert f[0].message.startswith("the job's call at train.py:40 made installed code "
                                   "(tables.py) raise KeyError: 'no_such_set'")


@pytest.mark.parametrize("last", ["RuntimeError: something in the library broke",
                                  "OSError: [Errno 5] Input/output error"])
def test_a_librarys_own_failure_under_the_jobs_call_is_not_the_jobs(last: str) -> None:
    assert reasons(_traceback(JOB, LIB, last=last)) == []


def test_a_traceback_of_installed_frames_only_is_not_the_jobs() -> None:
    assert reasons(_traceback(LIB, LIB, last="ValueError: bad value")) == []


def test_a_job_frame_of_an_earlier_traceback_does_not_count() -> None:
    log = (_traceback(JOB, last="Warning: retrying") + "step 1\nstep 2\nstep 3\nstep 4\n"
           + "".join(f"  {LIB}\n    x = call(y)\n" for _ in range(2))
           + "ValueError: bad value\n")
    assert reasons(log) == []


FRESH11 = Path(__file__).parent / "fresh11"


ELEVENTH_FRESH_LOGS = [
    # a dataset name the job's config gives, a tensor shape the job's model passes: raised in
    # installed code under the job's frame; accelerate's P2P refusal; a refused gloo connect
    ("store-58774153207.log", "ScriptException"),
    ("store-1859146110.log", "ScriptException"),
    ("store-12064442746.log", "P2PUnsupported"),
    ("store-56982347547.log", "NcclConnectFailed"),
]

FRESH12 = Path(__file__).parent / "fresh12"


TWELFTH_FRESH_LOGS = [
    # a decode error of the job's data under its call; an import of a part torch no longer has;
    # a store's wait for clients wrapped before its count
    ("medusa-12.log", "ScriptException"),
    ("store-11265493140.log", "ScriptException"),
    ("store-44501004734.log", "RendezvousTimeout"),
]


#: Real logs of the fresh corpora (development sets since their score guided these rules).
DEV_LOGS = ([(FRESH / n, e) for n, e in FIRST_FRESH_LOGS]
            + [(FRESH2 / n, e) for n, e in SECOND_FRESH_LOGS]
            + [(FRESH4 / n, e) for n, e in FOURTH_FRESH_LOGS]
            + [(FRESH5 / n, e) for n, e in FIFTH_FRESH_LOGS]
            + [(FRESH6 / n, e) for n, e in SIXTH_FRESH_LOGS]
            + [(FRESH7 / n, e) for n, e in SEVENTH_FRESH_LOGS]
            + [(FRESH10 / n, e) for n, e in TENTH_FRESH_LOGS]
            + [(FRESH11 / n, e) for n, e in ELEVENTH_FRESH_LOGS]
            + [(FRESH12 / n, e) for n, e in TWELFTH_FRESH_LOGS])


@pytest.mark.parametrize(("path", "expected"), DEV_LOGS,
                         ids=[f"{p.parent.name}/{p.name}" for p, _ in DEV_LOGS])
def test_real_logs_of_the_fresh_corpora(path: Path, expected: str) -> None:
    assert reasons(path.read_text(), path.name)[:1] == [expected]


#: Every line above, with the reason it must give first.
ROUND16_LINES = [
    # torchrun's own parser given an empty value ("--master-port=$MASTER_PORT", unset)
    ("torchrun: error: argument --master-port/--master_port: invalid int value: ''",
     "MissingLauncherEnv"),
    ("launch.py: error: argument --master_port: expected one argument", "MissingLauncherEnv"),
    # the ranks met, then gloo's pairs did not connect: an address not reachable from here
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:144] no error", "NcclConnectFailed"),
]
ROUND19_LINES = [
    # torch 2.4's agent names the signal; earlier torch printed its number
    ("W0823 16:54:02.337000 139733055988160 torch/distributed/elastic/agent/server/api.py:688] "
     "Received Signals.SIGTERM death signal, shutting down workers", "RankKilled"),
    # the watchdog's line broken by a paste before "operation timeout"
    ("operation timeout: WorkNCCL(SeqNum=691, OpType=ALLGATHER, Timeout(ms)=1800000) ran for "
     "1801053 milliseconds before timing out.", "CollectiveTimeout"),
    ("RuntimeError: :0: cudaFuncSetAttribute(kernel_entry, "
     "cudaFuncAttributeMaxDynamicSharedMemorySize, integer_cast<int32_t>(launch_configs[0]."
     "smemSizeInBytes)): out of memory", "CudaOutOfMemory"),
    ("RuntimeError: Expected tensor for 'out' to have the same device as tensor for argument "
     "#2 'mat1'; but device 1 does not equal 3 (while checking arguments for addmm)",
     "DeviceMismatch"),
    ("Caught error during NCCL init (attempt 0 of 5): trying to initialize the default process "
     "group twice!", "ScriptException"),
    ("ValueError: You selected an invalid strategy name: `strategy=<lightning.pytorch.strategies."
     "ddp.DDPStrategy object at 0x7f0>`. It must be either a string or an instance of "
     "`pytorch_lightning.strategies.Strategy`.", "ScriptException"),
    ("ValueError: Please correct the following DeepSpeed config values that mismatch "
     "TrainingArguments values:", "ScriptException"),
]
ROUND20_LINES = [
    # torch 0.4's THD backend, from a source build that had not found NCCL 2
    ("RuntimeError: the distributed NCCL backend is not available; try to recompile the THD "
     "package with CUDA and NCCL 2+ support at /home/u/pytorch/torch/lib/THD/process_group/"
     "General.cpp:17", "BackendUnsupported"),
    # autograd given a loss per sample or per GPU
    ("RuntimeError: grad can be implicitly created only for scalar outputs", "ScriptException"),
    ("ValueError: You may use too small dataset and our distributed sampler cannot pad your "
     "dataset correctly. We highly recommend you to use fewer GPUs to finish your work",
     "ScriptException"),
]
ROUND21_LINES = [
    # c10d's own error line, which says neither error nor timeout in words
    ("[E socket.cpp:610] [c10d] The client socket has failed to connect to any network address "
     "of (192.168.1.99, 1234).", "RendezvousTimeout"),
    # a logger's ERROR level (capitals) with vLLM's own words for a library it opens itself
    ("ERROR 04-22 15:53:32 pynccl.py:44] Failed to load NCCL library from libnccl.so.2 .It is "
     "expected if you are not running on NVIDIA/AMD GPUs.", "LibraryMismatch"),
    ("[rank1]: OSError: Invalid network interface: eth", "NoSocketInterface"),
    ("ValueError: port_base at 30234 is not available in 30 seconds. port_base is used by a "
     "process already.", "PortInUse"),
    ("node08:27106:27302 [0] include/shm.h:27 NCCL WARN Call to shm_open failed : Permission "
     "denied", "ShmExhausted"),
]
ROUND22_LINES = [
    # a scheduler's variable passed to torchrun as its name, never expanded
    ("main/0 torchrun: error: argument --node-rank/--node_rank: invalid int value: "
     "'$AWS_BATCH_JOB_NODE_INDEX'", "MissingLauncherEnv"),
    ("RuntimeError: Tensors of the same index must be on the same device and the same dtype "
     "except `step` tensors that can be CPU and float32/64 notwithstanding", "DeviceMismatch"),
    ("ValueError: persistent_workers option needs num_workers > 0", "ScriptException"),
]
ROUND23_LINES = [
    ("`init.cc:1247 NCCL WARN Mismatched collective detected, please check your collective "
     "calls at and around rank 39. You can use NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS=COLL to "
     "see the collective logs`", "CollectiveMismatch"),
    ("RuntimeError: expected input to be on cuda", "DeviceMismatch"),
    ("RuntimeError: Expected sparse gradient to be defined.", "UnusedParameters"),
    ("ValueError: Install Accelerate from main branch", "ScriptException"),
]
ROUND24_LINES = [
    ("RuntimeError: Optimizer state has not been consolidated on this rank.                 "
     "Please call `consolidate_state_dict()` on all ranks beforehand if you meant to save the "
     "global state", "ScriptException"),
    ("RuntimeError: Incoming model is an instance of torch.nn.parallel.DistributedDataParallel. "
     "Parallel wrappers should only be applied to the model(s) AFTER", "ScriptException"),
    # the exception class a paste leaves off is not needed when it names itself
    ("allennlp.common.checks.ConfigurationError: \"Multiple cuda devices need to be configured "
     "to run distributed training.\"", "ScriptException"),
    ("RuntimeError: Expected object of backend CUDA but got backend CPU for argument #2 "
     "'target' in call to _thnn_nll_loss_forward", "DeviceMismatch"),
    ("AttributeError: module 'torch.distributed' has no attribute 'init_process_group'",
     "BackendUnsupported"),
]
ROUND25_LINES = [
    # CUDA's error 3 in the main process: the driver (in a forked child: the test below)
    ("RuntimeError: CUDA error: initialization error", "NoCudaDevice"),
    ("RuntimeError: cuda runtime error (3) : initialization error at "
     "/pytorch/aten/src/THC/generic/THCStorage.c:60", "NoCudaDevice"),
]
ROUND26_LINES = [
    # NCCL's line for two ranks on one GPU, pasted alone (no word of an error beside it)
    ("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 1a000", "DuplicateGpu"),
    # gloo without GLOO_SOCKET_IFNAME: the host's name resolves to an address no NIC holds
    ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:208] "
     "ifa != nullptr. Unable to find interface for: [0.0.8.34]", "NoSocketInterface"),
    # torch.distributed.rpc used before init_rpc
    ("RuntimeError: RPC has not been initialized. Call init_rpc(name) first.",
     "ProcessGroupNotInitialized"),
    # the open-files limit: Python's errno, a DataLoader worker's descriptor, a C library's
    ("OSError: [Errno 24] Too many open files", "TooManyOpenFiles"),
    ("RuntimeError: received 0 items of ancdata", "TooManyOpenFiles"),
    ("accept: Too many open files", "TooManyOpenFiles"),
    # torch.distributed.launch's --local-rank refused by the job's own argparse (no script
    # name before it: a launcher's prefix cut it)
    ("error: unrecognized arguments: --local_rank=1", "ScriptException"),
]
ROUND27_LINES = [
    # DeepSpeed's runner checks each host of its hostfile over ssh before it starts
    ("subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no 192.168.3.100 "
     "hostname' returned non-zero exit status 255.", "SshLaunchFailed"),
    # pdsh (DeepSpeed's multi-node launcher) and ssh's own words
    ("pdsh@node01: node02: ssh exited with exit code 255", "SshLaunchFailed"),
    ("node02: root@node02: Permission denied (publickey,password).", "SshLaunchFailed"),
    ("node02: Host key verification failed.", "SshLaunchFailed"),
    ("ssh: connect to host node02 port 22: Connection refused", "SshLaunchFailed"),
    ("ssh: Could not resolve hostname node02: Name or service not known", "SshLaunchFailed"),
    # webdataset's check for a pipeline that gives every node the same shards
    ("ValueError: you need to add an explicit nodesplitter to your input pipeline for "
     "multi-node training", "ScriptException"),
    ("ValueError: input pipeline needs to be reconfigured for multinode training",
     "ScriptException"),
    # autograd's check of a saved tensor changed in place
    ("RuntimeError: one of the variables needed for gradient computation has been modified by "
     "an inplace operation: [torch.cuda.FloatTensor [512]] is at version 4; expected version 3 "
     "instead.", "ScriptException"),
]
ROUND28_LINES = [
    # UCC's status for a collective it has no algorithm for (CPU tensors on its UCP transport)
    ("RuntimeError: [/opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupUCC.cpp:463] [Rank 0]"
     "[ProcessGroupUCC-0][READY]failed to init collective, error code -1: Operation is not "
     "supported, system error code 11", "BackendUnsupported"),
    # Lightning's check of the GPUs asked for against the visible ones (two lines)
    ("lightning_fabric.utilities.exceptions.MisconfigurationException: You requested gpu: "
     "[0, 1, 2, 3]\n But your machine only has: [0, 1]", "InvalidDeviceOrdinal"),
    ("pytorch_lightning.utilities.exceptions.MisconfigurationException: You requested GPUs: "
     "[1]\n But your machine only has: [0]", "InvalidDeviceOrdinal"),
    # deepspeed.comm used before deepspeed.init_distributed()
    ("AssertionError: DeepSpeed backend not set, please initialize it using "
     "init_process_group()", "ProcessGroupNotInitialized"),
    # Megatron's parallel state used before initialize_model_parallel
    ("AssertionError: data parallel group is not initialized", "ProcessGroupNotInitialized"),
    ("AssertionError: pipeline_model parallel group is not initialized",
     "ProcessGroupNotInitialized"),
    # FSDP's and DDP's check that the wrapped module is on one device
    ("RuntimeError: FSDP only supports single device modules but got params on "
     "{device(type='cuda', index=3), device(type='cpu')}", "DeviceMismatch"),
    ("AssertionError: DistributedDataParallel's input module must be on the same type of "
     "devices, but input module parameters locate in {'cuda', 'cpu'}.", "DeviceMismatch"),
    ("ValueError: DistributedDataParallel device_ids and output_device arguments only work with "
     "single-device/multiple-device GPU modules or CPU modules, but got device_ids [1], "
     "output_device 1, and module parameters {device(type='cpu')}.", "DeviceMismatch"),
]


ROUND29_LINES = [
    # a library's own ModuleNotFoundError, and an ImportError that names the install command
    ("[rank0]: ModuleNotFoundError: A compatible nvidia-resiliency-ext installation is required "
     "for", "MissingPackage"),
    ("ModuleNotFoundError: flash_attn is required for this model, please install it",
     "MissingPackage"),
    ("ImportError: Using `bitsandbytes` 8-bit quantization requires Accelerate: `pip install "
     "accelerate`", "MissingPackage"),
    # an index tensor, or an RNN's input, on another device
    ("[rank2]: RuntimeError: indices should be either on cpu or on the same device as the "
     "indexed tensor (cpu)", "DeviceMismatch"),
    ("RuntimeError: Input and parameter tensors are not at the same device, found input tensor "
     "at cuda:1 and parameter tensor at cuda:0", "DeviceMismatch"),
    # DeepSpeed's tensor-parallel inference with no policy for the model: the job's setting
    ("AssertionError: Not able to determine model policy automatically. Please provide policy.",
     "ScriptException"),
]
#: Short pastes with no anchor word (read line by line, classifier.reread).
ROUND29_SHORT_LINES = [
    ("bash: tools/dist_train.sh: Permission denied", "LauncherNotFound"),
    ("/bin/sh: 1: /opt/venv/bin/torchrun: Permission denied", "LauncherNotFound"),
]


LONG_LOG_LINES = ROUND28_LINES + ROUND29_LINES


@pytest.mark.parametrize(("line", "reason"), LONG_LOG_LINES, ids=[r for _, r in LONG_LOG_LINES])
def test_a_librarys_own_words_are_found_in_a_long_log(line: str, reason: str) -> None:
    """Past the short paste read line by line, the line is found by its anchor."""
    steps = "".join(f"[rank0]: step {i} loss 2.{i % 97:02d} lr 3e-4 grad_norm 0.91\n"
                    for i in range(2000))
    assert len(steps) > 64 * 1024
    assert reasons(steps + line + "\n" + steps[:4000])[:1] == [reason]


@pytest.mark.parametrize("line", [
    # an upgrade is a version too old, not a missing package
    "ImportError: This model requires transformers>=4.40: pip install -U transformers",
    # a redirect into a file the user may not write is no launcher
    "bash: /data/out/train.log: Permission denied",
])
def test_near_misses_of_the_twenty_ninth_round_are_not_named_so(line: str) -> None:
    assert not {"MissingPackage", "LauncherNotFound"} & set(reasons(line + "\n"))


ROUND30_LINES = [
    # Slurm refusing the job's request before anything ran
    ("sbatch: error: Batch job submission failed: Requested node configuration is not "
     "available", "SlurmRequestRejected"),
    ("srun: error: Unable to allocate resources: Invalid account or account/partition "
     "combination specified", "SlurmRequestRejected"),
    ("sbatch: error: Failed to validate job spec. --gpus-per-task or --tres-per-task used "
     "without either --gpus or -n/--ntasks is not allowed.", "SlurmRequestRejected"),
    ("salloc: error: Invalid generic resource (gres) specification", "SlurmRequestRejected"),
    # a library's check of the job's call or settings
    ("ValueError: You have to specify the number of GPUs you would like to use, add "
     "`num_processes=...` to your call.", "ScriptException"),
    ("pydantic.error_wrappers.ValidationError: 1 validation error for DeepSpeedZeroConfig",
     "ScriptException"),
    ("pydantic_core._pydantic_core.ValidationError: 2 validation errors for "
     "DeepSpeedConfigModel", "ScriptException"),
]


def test_a_step_slurm_launched_and_lost_its_credential_is_not_a_rejected_request() -> None:
    line = "srun: error: Task launch for StepId=36.0 failed on node cn131: Job credential expired"
    assert reasons(line + "\n")[:1] == ["SlurmCredentialError"]


ROUND31_LINES = [
    # Lightning's FSDP strategy and an optimizer built before the model was wrapped
    ("ValueError: The optimizer does not seem to reference any FSDP parameters. HINT: Make sure "
     "to create the optimizer after setting up the model by referencing "
     "`self.trainer.model.parameters()` in the `configure_optimizers()` hook.", "ScriptException"),
    # Open MPI's banner for MPI initialised twice in one process (pasted on its own)
    ("Open MPI has detected that this process has attempted to initialize\nMPI (via MPI_INIT or "
     "MPI_INIT_THREAD) more than once.  This is\nerroneous.", "ScriptException"),
]


ROUND32_LINES = [
    # torch's own warnings at CUDA init for a GPU its build has no kernels for
    ("    Found GPU1 Tesla V100-PCIE-16GB which is of cuda capability 7.0.\n    PyTorch no "
     "longer supports this GPU because it is too old.", "GpuArchUnsupported"),
    ("    Found GPU0 NVIDIA GeForce RTX 5090 which is of compute capability (CC) 12.0.",
     "GpuArchUnsupported"),
    ("NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current "
     "PyTorch installation.", "GpuArchUnsupported"),
    # Slurm's step daemon could not start the step's command
    ("slurmstepd: error: execve(): torchrun: No such file or directory", "LauncherNotFound"),
    ("slurmstepd: error: execve(): ./train.sh: Permission denied", "LauncherNotFound"),
    # a non-leaf tensor pickled to another process
    ("RuntimeError: Cowardly refusing to serialize non-leaf tensor which requires_grad, since "
     "autograd does not support crossing process boundaries.", "ScriptException"),
    # FSDP's CPU offload given a model already on the GPU
    ("RuntimeError: An FSDP-managed module with parameter CPU offloading enabled has parameters "
     "on cuda:0. Make sure to not move the module from CPU when offloading parameters.",
     "DeviceMismatch"),
]


def test_fairscales_cpu_offload_assert_is_named_from_its_frame() -> None:
    log = ('  File "/env/site-packages/fairscale/nn/data_parallel/fully_sharded_data_parallel.py", '
           'line 698, in _init_param_attributes\n'
           '    assert p._fp32_shard.device == torch.device("cpu")\n'
           'AssertionError\n')
    assert reasons(log) == ["DeviceMismatch"]


#: Lines with no anchor word, read because the paste is short (classifier.reread).
REREAD_LINES = [
    ("The program 'srun' is currently not installed. To run 'srun' please ask your "
     "administrator to install the package 'slurm-client'", "LauncherNotFound"),
    ("Command 'torchrun' not found, but can be installed with:", "LauncherNotFound"),
    ("CUDA driver version is insufficient for CUDA runtime version at "
     "horovod/torch/cuda_util.cc:32", "CudaDriverMismatch"),
    ("Multiple cuda devices need to be configured to run distributed training.",
     "ScriptException"),
]
ROUND18_LINES = [
    # torch.load of a checkpoint another rank had not finished saving
    ("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
     "directory", "ScriptException"),
    ("RuntimeError: PytorchStreamReader failed reading file data/0: file read failed",
     "ScriptException"),
]


@pytest.mark.parametrize(("line", "arg"), [
    ("torchrun: error: argument --master-port/--master_port: invalid int value: ''",
     "--master-port"),
    ("run.py: error: argument --node_rank/--node-rank: invalid int value: ''", "--node_rank"),
])
def test_an_empty_launcher_argument_names_the_argument_and_the_variable(line: str,
                                                                        arg: str) -> None:
    reason, message = first(line + "\n")
    assert reason == "MissingLauncherEnv"
    assert message.startswith(f"the launcher got no value for {arg}: the variable")


@pytest.mark.parametrize("line", [
    # the job's own script given an empty value: its own parser, its own command line
    "train.py: error: argument --master_port: invalid int value: ''",
    # torchrun's parser refusing another argument of the job's is the job's script's words
    "run.py: error: argument --lr: invalid float value: ''",
])
def test_an_empty_value_for_the_jobs_own_script_stays_the_jobs(line: str) -> None:
    assert first(line + "\n")[0] == "ScriptException"


def test_a_full_mesh_connect_with_no_error_points_at_gloos_interface() -> None:
    reason, message = first(ROUND16_LINES[-1][0] + "\n")
    assert reason == "NcclConnectFailed"
    assert "GLOO_SOCKET_IFNAME" in message


#: transformers' words when flash-attention 2 is asked for and not installed: the exception's
#: message goes on on the next line, which holds the cause (a fresh corpus' cut log)
CONTINUED = ("ImportError: FlashAttention2 has been toggled on, but it cannot be used due to the "
             "following error:\nthe package flash_attn seems to be not installed.\n")


def test_an_exception_message_continued_below_is_read_on_its_next_line() -> None:
    (f,) = classify_texts([("job.log", CONTINUED)]).findings
    assert f.reason == "MissingPackage"
    assert f.message == "the package flash_attn is not installed in the Python that ran the job"
    assert [e.line for e in f.evidence] == [2]


def test_a_continued_message_split_across_blocks_is_read_the_same() -> None:
    data = ("[rank0]: step 1\n" * 50 + CONTINUED).encode()
    cut = data.index(b"\nthe package") + 1
    c = Classifier()
    c.begin("job.log")
    c.feed(data[:cut])
    c.feed(data[cut:])
    (f,) = c.finish().findings
    assert (f.reason, [e.line for e in f.evidence]) == ("MissingPackage", [52])


def test_only_a_message_that_ends_in_a_colon_reads_the_next_line() -> None:
    """The line after a complete exception message is not taken as part of it (one pass of
    the classifier: a paste this short is then read again line by line, classifier.reread)."""
    text = CONTINUED.replace("following error:", "following error.")
    c = Classifier()
    c.begin("job.log")
    c.feed_text(text)
    assert [f.reason for f in c.finish().findings] != ["MissingPackage"]


#: A traceback pasted from below the job's own frame (a fresh corpus' thread): only the code
#: line of that frame is left, then torchvision's resnet and torch's batchnorm input check.
LAYER_REFUSED = """\
    z1 = self.encoder(x1)  # NxC
  File "/p/site-packages/torch/nn/modules/module.py", line 493, in __call__
    result = self.forward(*input, **kwargs)
  File "/p/site-packages/torchvision/models/resnet.py", line 204, in forward
    x = self.fc(x)
  File "/p/site-packages/torch/nn/modules/batchnorm.py", line 425, in _check_input_dim
    .format(input.dim()))
ValueError: expected at least 3D input (got 2D input)
"""


def test_a_torch_layer_refusing_its_input_is_the_models_with_no_job_frame_left() -> None:
    (f,) = classify_texts([("job.log", LAYER_REFUSED)]).findings
    assert f.reason == "ScriptException"
    assert f.message == ("torch's batchnorm.py:425 (_check_input_dim) refused what the model "
                         "gave it: ValueError: expected at least 3D input (got 2D input)")
    assert [e.line for e in f.evidence] == [8]


def test_a_layer_refusing_its_input_on_windows_paths_reads_the_same() -> None:
    text = LAYER_REFUSED.replace("/p/site-packages/",
                                 "C:\\Users\\u\\envs\\pt\\Lib\\site-packages\\").replace(
        "torch/nn/modules/", "torch\\nn\\modules\\").replace("torchvision/models/",
                                                         "torchvision\\models\\")
    assert reasons(text) == ["ScriptException"]


@pytest.mark.parametrize("last_frame, line", [
    # another library's ValueError, no job frame: not known to be the job's input
    ("site-packages/transformers/modeling_utils.py", "ValueError: expected at least 3D input"),
    # a torch layer's RuntimeError is as often CUDA's or the node's as the model's
    ("site-packages/torch/nn/modules/conv.py", "RuntimeError: expected at least 3D input"),
    # torch's collectives are not model code
    ("site-packages/torch/distributed/distributed_c10d.py", "ValueError: expected a tensor"),
])
def test_only_torchs_layers_and_optimizers_are_taken_as_the_models_input(
        last_frame: str, line: str) -> None:
    text = LAYER_REFUSED.replace("site-packages/torch/nn/modules/batchnorm.py", last_frame)
    text = text.replace("ValueError: expected at least 3D input (got 2D input)", line)
    assert "ScriptException" not in reasons(text)


@pytest.mark.parametrize("line", [
    # a fresh corpus' one-line log: rank 0 still saving while the other ranks loaded it
    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
    "directory",
    "RuntimeError: PytorchStreamReader failed reading file data/0: invalid header or archive "
    "is corrupted",
])
def test_a_checkpoint_that_is_not_a_whole_archive_is_the_jobs_input(line: str) -> None:
    (f,) = classify_texts([("job.log", line + "\n")]).findings
    assert f.reason == "ScriptException"
    assert "not a whole checkpoint" in f.message and "dist.barrier()" in f.message


def test_a_checkpoint_cut_short_by_a_full_disk_is_the_disks() -> None:
    text = ("RuntimeError: [enforce fail at inline_container.cc:595] . PytorchStreamWriter "
            "failed writing file data/3: file write failed\n"
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding "
            "central directory\n")
    assert reasons(text)[0] == "DiskFull"


SLURM_NODE_FAILURE = """\
srun: error: Node failure on gpu-node37
srun: Job step aborted: Waiting up to 62 seconds for job step to finish.
slurmstepd: error: *** STEP 1943824.0 ON gpu-node17 CANCELLED AT 2023-03-06T03:17:51 DUE TO \
NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***
"""


def test_a_slurm_node_failure_names_the_node_that_failed() -> None:
    (f,) = classify_texts([("job.log", SLURM_NODE_FAILURE)]).findings
    assert f.reason == "RankKilled"
    assert f.message.startswith("Slurm lost the node gpu-node37 (node failure)")
    assert "scontrol show node gpu-node37" in f.message
    assert [e.line for e in f.evidence] == [1, 3]


def test_torchruns_named_death_signal_is_a_stop_from_outside() -> None:
    (f,) = classify_texts([("job.log", ROUND19_LINES[0][0] + "\n")]).findings
    assert f.message.startswith("torchrun itself received SIGTERM and stopped all its workers")


def test_a_watchdog_line_broken_by_the_paste_still_names_the_collective() -> None:
    text = ("RuntimeError: NCCL communicator was aborted on rank 0.  Original reason for failure "
            "was: [Rank 0] Watchdog caught collective \n" + ROUND19_LINES[1][0] + "\n")
    (f,) = classify_texts([("job.log", text)]).findings
    assert f.message == ("the NCCL watchdog aborted ALLGATHER SeqNum=691 after its 1800000 ms "
                         "timeout")


def test_a_slurm_time_limit_is_still_a_stop_from_outside() -> None:
    text = SLURM_NODE_FAILURE.splitlines()[2].replace("NODE FAILURE", "TIME LIMIT")
    (f,) = classify_texts([("job.log", text + "\n")]).findings
    assert f.message.startswith("Slurm cancelled job 1943824.0 on gpu-node17 due to TIME LIMIT")


#: a node without internet: the Hugging Face Hub's host name could not be resolved (cut)
_HUB_OFFLINE = (
    "[rank0]: requests.exceptions.ConnectionError: (MaxRetryError('HTTPSConnectionPool(host="
    "\\'huggingface.co\\', port=443): Max retries exceeded with url: /api/models/org/model/tree/"
    "main (Caused by NameResolutionError(\"<urllib3.connection.HTTPSConnection object at 0x7f>: "
    "Failed to resolve \\'huggingface.co\\' ([Errno -3] Temporary failure in name resolution)"
    "\"))'), '(Request ID: 3e1c)')\n"
    "[2025-07-18 13:36:48,709] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 4994\n")


def test_a_download_that_cannot_resolve_its_host_is_not_the_rendezvous() -> None:
    """An HTTP client's name-resolution error is a download (a model hub, a logger) on a node
    without internet, not MASTER_ADDR: the launcher's report of the stop is what stays."""
    assert reasons(_HUB_OFFLINE) == ["RankKilled"]
    # the resolver's same words from the store are still the rendezvous
    assert reasons("torch.distributed.DistNetworkError: [c10d] The hostname of the client "
                   "socket cannot be retrieved. err=-3 Temporary failure in name resolution\n"
                   )[:1] == ["RendezvousTimeout"]


@pytest.mark.parametrize(("line", "named"), [
    (ROUND21_LINES[0][0], "the store at (192.168.1.99, 1234)"),
    ("[W socket.cpp:663] [c10d] The client socket has failed to connect to [kubernetes.docker."
     "internal]:54941 (system error: 10049 - The requested address is not valid in its "
     "context.).", "the store at [kubernetes.docker.internal]:54941"),
])
def test_the_store_address_c10d_could_not_reach_is_named_whole(line: str, named: str) -> None:
    reason, message = first(line + "\n")
    assert reason == "RendezvousTimeout"
    assert message.startswith(f"a rank could not connect to {named}")


@pytest.mark.parametrize("value", ["'$AWS_BATCH_JOB_NODE_INDEX'", "'${AWS_BATCH_JOB_NODE_INDEX}'"])
def test_a_launcher_variable_never_expanded_is_named(value: str) -> None:
    line = ROUND22_LINES[0][0].replace("'$AWS_BATCH_JOB_NODE_INDEX'", value)
    reason, message = first(line + "\n")
    assert reason == "MissingLauncherEnv"
    assert message.startswith("the launcher got the text $AWS_BATCH_JOB_NODE_INDEX for "
                              "--node-rank, not its value")
    # the job's own script given the same unexpanded text is still the job's
    assert first(f"train.py: error: argument --node_rank: invalid int value: {value}\n")[0] \
        == "ScriptException"


#: the job's init_dist setting the start method again; the paste stops at multiprocessing's
#: raise, above its exception line (cut)
_START_METHOD_TWICE = """\
Traceback (most recent call last):
  File "train.py", line 22, in init_dist
    mp.set_start_method('spawn')
  File "/home/ai/anaconda3/lib/python3.7/multiprocessing/context.py", line 242, in set_start_method
    raise RuntimeError('context has already been set')
"""


def test_a_start_method_set_twice_is_read_from_the_frames() -> None:
    (f,) = classify_texts([("job.log", _START_METHOD_TWICE)]).findings
    assert f.reason == "ScriptException"
    assert f.message.startswith("the job set the multiprocessing start method a second time")
    # the same frame raising something else is not this
    other = _START_METHOD_TWICE.replace("context has already been set", "cannot find context")
    assert [x.reason for x in classify_texts([("job.log", other)]).findings] == []


def test_a_torch_without_distributed_is_not_the_jobs_code() -> None:
    reason, message = first(ROUND24_LINES[-1][0] + "\n")
    assert reason == "BackendUnsupported"
    assert "built without torch.distributed" in message
    # another module's missing name is still a version the code was not written for
    assert first("AttributeError: module 'torch.distributed' has no attribute 'tensor'\n")[0] \
        == "ScriptException"


FORKED_SET_DEVICE = """\
Traceback (most recent call last):
  File "/usr/lib/python3.7/multiprocessing/process.py", line 297, in _bootstrap
    self.run()
  File "/usr/lib/python3.7/multiprocessing/process.py", line 99, in run
    self._target(*self._args, **self._kwargs)
  File "dist_bug.py", line 5, in run
    torch.cuda.set_device(rank)
  File "/opt/torch/cuda/__init__.py", line 265, in set_device
    torch._C._cuda_setDevice(device)
"""


def test_cuda_initialization_error_in_a_forked_process_is_cuda_before_the_fork() -> None:
    """Error 3 raised in a process multiprocessing forked (its ``_bootstrap`` frame, or a
    DataLoader worker's ``_worker_loop``) is CUDA initialised before the fork; the
    set_device frame above it does not make it an index that is not there."""
    text = FORKED_SET_DEVICE + ("RuntimeError: cuda runtime error (3) : initialization error "
                                "at ../torch/csrc/cuda/Module.cpp:33\n")
    assert reasons(text) == ["CudaInitBeforeFork"]
    worker = ("RuntimeError: Caught RuntimeError in DataLoader worker process 0.\n"
              "Original Traceback (most recent call last):\n"
              '  File "/opt/torch/utils/data/_utils/worker.py", line 308, in _worker_loop\n'
              "    data = fetcher.fetch(index)\n"
              '  File "/job/data.py", line 12, in __getitem__\n'
              "    x = x.cuda()\n"
              "RuntimeError: CUDA error: initialization error\n")
    assert reasons(worker)[0] == "CudaInitBeforeFork"
    # the same words after the traceback of another process (no child frame) are the driver's
    plain = ('  File "/job/train.py", line 3, in main\n    x = x.cuda()\n'
             "RuntimeError: CUDA error: initialization error\n")
    # (and the cut traceback above it keeps its own guess: those words are not its own)
    assert sorted(reasons(FORKED_SET_DEVICE + "\n" * 8 + plain)) == ["InvalidDeviceOrdinal",
                                                                    "NoCudaDevice"]


def test_the_exception_words_outrank_the_frames_guess() -> None:
    """A traceback through ``torch._C._cuda_setDevice`` cut there is an index that is not there
    (the frame's guess); when its own exception line follows and another rule knows it, that
    rule is the finding and the guess is dropped."""
    assert reasons(FORKED_SET_DEVICE) == ["InvalidDeviceOrdinal"]
    busy = FORKED_SET_DEVICE + ("RuntimeError: CUDA error: all CUDA-capable devices are busy or "
                                "unavailable\n")
    assert reasons(busy) == ["CudaDeviceBusy"]
    # an exception line the rules know nothing of leaves the guess standing
    odd = FORKED_SET_DEVICE + "RuntimeError: something no rule knows\n"
    assert reasons(odd)[0] == "InvalidDeviceOrdinal"


@pytest.mark.parametrize("tail", [" .It is expected", ". It is expected", " .", ""])
def test_the_nccl_library_vllm_could_not_load_is_named_whole(tail: str) -> None:
    line = f"ERROR 04-22 15:53:32 pynccl.py:44] Failed to load NCCL library from libnccl.so.2{tail}"
    reason, message = first(line + "\n")
    assert reason == "LibraryMismatch"
    assert message.startswith("the NCCL library libnccl.so.2 could not be loaded")


def test_dev_shm_that_may_not_be_written_is_not_called_full() -> None:
    reason, message = first(ROUND21_LINES[-1][0] + "\n")
    assert reason == "ShmExhausted"
    assert "Permission denied" in message and "chmod 1777 /dev/shm" in message


def test_transformer_engines_interface_check_names_its_own_variable() -> None:
    reason, message = first(ROUND21_LINES[2][0] + "\n")
    assert reason == "NoSocketInterface"
    assert "NVTE_UB_SOCKET_IFNAME" in message and "named eth " in message


def test_a_loss_that_is_not_a_number_names_the_reduction() -> None:
    reason, message = first(ROUND20_LINES[1][0] + "\n")
    assert reason == "ScriptException"
    assert "loss.mean().backward()" in message


ALL_LINES = (PROGRAM_LINES + MORE_LINES + ROUND3_LINES + ROUND4_LINES + ROUND5_LINES
             + ROUND6_LINES + ROUND7_LINES + ROUND8_LINES + ROUND9_LINES
             + ROUND10_LINES + ROUND11_LINES + ROUND12_LINES + ROUND13_LINES
             + ROUND14_LINES + ROUND15_LINES + ROUND16_LINES + ROUND18_LINES + ROUND19_LINES
             + ROUND20_LINES + ROUND21_LINES + ROUND22_LINES + ROUND23_LINES
             + ROUND24_LINES + ROUND25_LINES + ROUND26_LINES + REREAD_LINES
             + ROUND27_LINES + ROUND28_LINES + ROUND29_LINES + ROUND29_SHORT_LINES
             + ROUND30_LINES + ROUND31_LINES + ROUND32_LINES)


@pytest.mark.parametrize(("line", "reason"), ALL_LINES, ids=[r for _, r in ALL_LINES])
def test_program_lines_name_their_reason(line: str, reason: str) -> None:
    assert reasons(line)[:1] == [reason]


@pytest.mark.parametrize("prefix", [
    "worker-0: ",                               # pdsh, DeepSpeed's multi-node launcher
    "0: ",                                      # srun --label
    "[1,0]<stderr>:",                           # Open MPI's --tag-output
    "(RayTrainWorker pid=1234, ip=10.0.0.2) ",  # Ray
    "2024-05-01T10:00:00.123456789Z ",          # kubectl logs --timestamps
    "node-1  | ",                               # docker compose
    "0: [rank0]: ",                             # two of them
])
def test_a_launchers_line_prefix_does_not_hide_the_jobs_exception(prefix: str) -> None:
    lines = _JOB_TRACEBACK.splitlines()
    f = classify_texts([("job.log", "".join(f"{prefix}{line}\n" for line in lines))]).findings
    assert [d.reason for d in f] == ["ScriptException"]
    assert "ValueError at train.py:61: unknown optimizer adamw8" in f[0].message


def test_an_exception_class_is_not_read_as_a_prefix() -> None:
    """``RuntimeError: ValueError: x`` is a RuntimeError (not taken from installed code), not a
    ValueError behind a host name."""
    log = _traceback(JOB, LIB, last="RuntimeError: ValueError: wrapped")
    assert reasons(log) == []


def test_a_remote_commands_exit_code_passed_on_by_pdsh_is_not_an_ssh_failure() -> None:
    """ssh exits 255 for its own failure; any other code is the remote command's own (a rank
    that failed on that node), which pdsh only passes on."""
    assert "SshLaunchFailed" not in reasons("pdsh@node01: node02: ssh exited with exit code 1\n")


def test_a_message_names_only_its_patterns_groups() -> None:
    """A message is a ``str.format`` template: a brace it means as text is doubled, so that no
    fix text falls back to the raw template (and no field goes unfilled)."""
    import string

    from preflight.explain.rules import RULES
    from preflight.explain.ruletypes import Hook

    for rule in RULES:
        if rule.hook is not Hook.NONE:  # its hook fills fields of its own
            continue
        for regex, message in ([(p.regex, p.message) for p in rule.patterns]
                               + [(f.source, f.message) for f in rule.frames]):
            fields = {f for _, f, _, _ in string.Formatter().parse(message) if f is not None}
            assert fields <= set(regex.groupindex), (rule.reason, message)
