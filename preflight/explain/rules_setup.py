"""Rules for set-up and API mistakes: the driver, the GPUs a process can see, the libraries it
loads, the scheduler's credentials, and the checks DDP and torch.distributed make of the caller.

Each pattern follows the text of the program that prints it (CUDA's error strings, torch's
``TORCH_CHECK`` messages in reducer.cpp and distributed_c10d.py, Slurm's and munge's errors), so
that a phrasing nobody has posted yet is still the one matched. They are origins: the failure is
the first thing that went wrong, on the node (driver, GPU, clock) or in the job (its code, its
environment); the layer says which.
"""

from __future__ import annotations

from preflight.explain.ruletypes import ORIGIN, Layer, Rule
from preflight.explain.ruletypes import frame as _f
from preflight.explain.ruletypes import pattern as _p

#: The arguments of torchrun's and torch.distributed.launch's own parsers that a launch script
#: fills from a variable (``--master_port=$MASTER_PORT``, ``--node_rank $NODE_RANK``), and the
#: alias spelling argparse prints after a slash: MissingLauncherEnv reads those parsers' errors
#: about them, and the job's-script pattern below leaves exactly those errors to it.
LAUNCHER_ARG = r"--(?:master|node|nnodes|nproc|rdzv|max)[\w-]{0,30}"
LAUNCHER_ARG_ALIAS = r"(?:/--[\w-]{1,40})?"

SETUP_RULES: tuple[Rule, ...] = (
    Rule(
        "NoCudaDevice", Layer.ENVIRONMENT, ORIGIN,
        "the process sees no usable GPU: `nvidia-smi` on the node must list them (if it cannot "
        "talk to the driver, load the driver or reboot); in a container run with `--gpus all` "
        "(Kubernetes: a `nvidia.com/gpu` limit) and do not set CUDA_VISIBLE_DEVICES to an empty "
        "or wrong list; `python -c 'import torch; print(torch.version.cuda, "
        "torch.cuda.device_count())'` must show a CUDA build and the GPUs "
        "(`preflight check --only gpu_visible,cuda_devices`)",
        (
            _p(r"no CUDA-capable device is detected",
               "the process found no CUDA-capable device"),
            _p(r"No CUDA GPUs are available", "torch found no CUDA GPU in this process"),
            _p(r"Found no NVIDIA driver on your system",
               "torch found no NVIDIA driver on this system"),
            _p(r"Torch not compiled with CUDA enabled",
               "this torch is a CPU-only build (it has no CUDA)"),
            _p(r"ProcessGroupNCCL is only supported with GPUs, no GPUs found",
               "backend='nccl' was asked for in a process that sees no GPU"),
            _p(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
               "nvidia-smi cannot talk to the NVIDIA driver (not loaded, or a driver/kernel "
               "mismatch after an update)"),
            _p(r"CUDA driver initialization failed|CUDA unknown error - this may be due to an "
               r"incorrectly set up environment",
               "CUDA could not initialise in this process (the driver, /dev/nvidia* or "
               "CUDA_VISIBLE_DEVICES changed after start)"),
            # CUDA's error 3 (cudaErrorInitializationError): the driver in the main process; in
            # a process multiprocessing forked, CUDA initialised in the parent before the fork
            _p(r"(?:cuda runtime error \(3\) : |CUDA error: )initialization error",
               "CUDA could not initialise in this process (initialization error: the driver or "
               "/dev/nvidia*)",
               in_child=("CudaInitBeforeFork",
                         "a process multiprocessing started could not initialise CUDA "
                         "(initialization error): CUDA was initialised before it was forked")),
            _p(r"nvidia-container-cli: (?:initialization|device|detection) error: "
               r"(?P<why>[^\n]{1,120})",
               "the container runtime could not give the container its GPUs: {why}"),
            _p(r"libcuda\.so(?:\.1)?: cannot open shared object file",
               "libcuda.so (the driver's library) is not there: no driver in this host or "
               "container"),
        ),
        "RuntimeError: No CUDA GPUs are available",
        frames=(
            # a traceback cut inside torch's lazy CUDA init: it could not initialise CUDA
            _f("_lazy_init", r"torch\._C\._cuda_init\(\)",
               "CUDA could not initialise in this process (from the traceback's frames)"),
        ),
        progress=False,
    ),
    Rule(
        "CudaDriverMismatch", Layer.ENVIRONMENT, ORIGIN,
        "the NVIDIA driver is older than the CUDA runtime torch was built with: update the "
        "driver, or install the torch build for the driver's CUDA (`nvidia-smi` shows the "
        "highest CUDA the driver supports; `python -c 'import torch; print(torch.version.cuda)'` "
        "the one torch needs; https://pytorch.org/get-started/locally/); in a container the "
        "host's driver is the one used, whatever the image has",
        (
            _p(r"CUDA driver version is insufficient for CUDA runtime version",
               "the NVIDIA driver is too old for this CUDA runtime"),
            _p(r"The NVIDIA driver on your system is too old \(found version (?P<ver>\d{1,8})\)",
               "the NVIDIA driver is too old for this torch (the driver supports CUDA "
               "version code {ver})"),
            _p(r"system has unsupported display driver / cuda driver combination",
               "the kernel driver and the CUDA driver library do not match (a driver update "
               "without a reboot, or a container's mismatched libcuda)"),
            _p(r"the provided PTX was compiled with an unsupported toolchain",
               "a kernel was compiled by a newer CUDA than the driver supports"),
            _p(r"forward compatibility was attempted on non supported HW",
               "CUDA forward compatibility was attempted on a GPU that does not support it (the "
               "image's compat libcuda is newer than the host's driver)"),
        ),
        "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
        progress=False,
    ),
    Rule(
        "CudaDeviceBusy", Layer.ENVIRONMENT, ORIGIN,
        "the GPU refused a new context: it is in Exclusive Process compute mode and another "
        "process holds it (`nvidia-smi -q -d COMPUTE`; `nvidia-smi --query-compute-apps="
        "pid,name --format=csv` shows who), or it is in a bad state (drain and reset it); give "
        "every rank its own GPU (`torch.cuda.set_device(local_rank)`), and set "
        "`nvidia-smi -c DEFAULT` where sharing is intended",
        (
            _p(r"(?:all )?CUDA-capable device\(?s?\)? (?:is/are|are|is) busy or unavailable",
               "the GPU is busy or unavailable (Exclusive Process mode held by another "
               "process, or a GPU in a bad state)"),
        ),
        "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
        progress=False,
    ),
    Rule(
        "PeerMappingExhausted", Layer.ENVIRONMENT, ORIGIN,
        "one process peer-mapped more GPUs than CUDA allows (at most 8 peers per GPU): use one "
        "process per GPU with torchrun and DDP instead of nn.DataParallel over every visible "
        "GPU (a Trainer wraps the model in DataParallel when a process sees several GPUs), or "
        "give each process fewer GPUs with CUDA_VISIBLE_DEVICES; if it persists at <= 8, reboot "
        "the node (the driver's peer state)",
        (
            _p(r"peer mapping resources exhausted",
               "CUDA ran out of peer-mapping resources (one process peer-mapped too many GPUs)"),
        ),
        "RuntimeError: CUDA error: peer mapping resources exhausted",
    ),
    Rule(
        "LibraryMismatch", Layer.ENVIRONMENT, ORIGIN,
        "a library the job loads is missing or of another version than torch was built with: "
        "do not put a system NCCL or CUDA in front of torch's own (`LD_LIBRARY_PATH`, "
        "`LD_PRELOAD`; `python -c 'import torch; print(torch.cuda.nccl.version())'`), install "
        "torch, its CUDA libraries and the extensions (DeepSpeed, apex, flash-attn) for one CUDA "
        "version, and run the same image on every node (`preflight cluster` compares them)",
        (
            _p(r"undefined symbol: (?P<sym>(?:nccl|cuda|cu|cublas|cudnn|c10|_ZN)\w{0,200})",
               "a library lacks the symbol {sym}: torch, NCCL/CUDA or an extension of another "
               "version is loaded"),
            _p(r"(?P<lib>lib(?:nccl|cudart|cublas|cublasLt|cudnn\w{0,20}|cufft|curand|cusparse|"
               r"nvrtc|nvJitLink|torch\w{0,20}|c10\w{0,10})\.so[\d.]{0,20}): cannot open shared "
               r"object file",
               "the library {lib} cannot be loaded (not installed, or not on the library path)"),
            # vLLM (and projects that copied its pynccl) open libnccl.so.2 themselves
            _p(r"Failed to load NCCL library from (?P<lib>\S{1,200}?)(?: ?\.(?=\s|It\b|$)|\s|$)",
               "the NCCL library {lib} could not be loaded (not there, or built for another "
               "platform): point VLLM_NCCL_SO_PATH at the libnccl.so.2 torch uses (`python -c "
               "'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))'`)"),
            _p(r"The detected CUDA version \((?P<found>[\d.]{1,10})\) mismatches the version "
               r"that was used to compile\s{1,4}PyTorch \((?P<built>[\d.]{1,10})\)",
               "an extension is being built with CUDA {found} but torch was built with CUDA "
               "{built}"),
            # the dynamic loader's words for a library older than a compiled package needs
            _p(r"(?P<lib>[^\s:'\"`]{0,300}?lib[\w+-]{1,40}\.so[\d.]{0,12}): version "
               r"`(?P<ver>(?:GLIBCXX|GLIBC|CXXABI|GCC)_[\d.]{1,12})' not found \(required by "
               r"(?P<by>[^)\n]{1,300})\)",
               "{lib} is older than {by} needs (it lacks {ver}): install a newer one in the "
               "image (`strings {lib} | grep {ver}`; conda: `conda install -c conda-forge "
               "libstdcxx-ng`) or the package built for this system"),
            _p(r"Error building extension '(?P<ext>[\w.-]{1,80})'",
               "the extension {ext} could not be built (its CUDA toolkit or compiler does not "
               "match torch's: read the compiler's first error above)"),
        ),
        "ImportError: /opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so: "
        "undefined symbol: ncclCommRegister",
        progress=False,
    ),
    Rule(
        "SlurmCredentialError", Layer.ENVIRONMENT, ORIGIN,
        "Slurm refused the step's credential: the clocks of the nodes disagree (check "
        "`chronyc tracking` / `timedatectl` on the controller and the named node) or munge's "
        "key differs (`munge -n | ssh NODE unmunge`); this is the node's fault, not the job's: "
        "fix the clock or the key, then resubmit",
        (
            _p(r"Job credential expired", "Slurm's job credential had expired when the task "
               "launched (the nodes' clocks disagree, or the launch was very slow)"),
            _p(r"Invalid job credential", "Slurm rejected the job credential (munge key or "
               "clock)"),
            _p(r"[Mm]unge decode failed: (?P<why>Expired credential|Rewound credential|Invalid "
               r"credential|Replayed credential)",
               "munge refused a credential ({why}): the nodes' clocks or munge keys differ"),
        ),
        "srun: error: Task launch for StepId=36.0 failed on node cn131: Job credential expired",
        progress=False,
    ),
    Rule(
        "SlurmRequestRejected", Layer.ENVIRONMENT, ORIGIN,
        "Slurm refused the job's resource request before anything ran: this is the job "
        "script's request, not the node's fault: read the reason Slurm gives and check the "
        "request against what the cluster has (`sinfo -o '%P %G %D %c'` for partitions, GPUs "
        "and CPUs, `scontrol show partition`, `sacctmgr show assoc user=$USER` for accounts and "
        "QOS); on newer Slurm `--gpus-per-task` needs `--ntasks` (or `--gpus`), and a GPU "
        "request must name a gres this cluster defines (`--gres=gpu:N`)",
        (
            _p(r"(?:sbatch|srun|salloc): error: (?:Batch job submission failed|Unable to "
               r"allocate resources|Job submit/allocate failed|Failed to validate job spec)"
               r"[:.] (?P<why>[^\n]{3,200}?)\s{0,4}$",
               "Slurm refused the job's request: {why}"),
            _p(r"(?:sbatch|srun|salloc): error: Invalid generic resource \(gres\) specification",
               "Slurm does not know the job's GPU request (a gres name or count this cluster "
               "does not define)"),
        ),
        "sbatch: error: Batch job submission failed: Requested node configuration is not "
        "available",
        progress=False,
    ),
    Rule(
        "ProcessGroupNotInitialized", Layer.MODEL, ORIGIN,
        "torch.distributed was used before `dist.init_process_group(...)` in this process: call "
        "it first in every process (with torchrun: `init_process_group(backend='nccl')`), "
        "guard the single-process path with `dist.is_initialized()`, and with mp.spawn call it "
        "inside the spawned function, not before the spawn",
        (
            _p(r"Default process group has not been initialized|Default process group is not "
               r"initialized",
               "a torch.distributed call ran before init_process_group"),
            # torch.distributed.rpc's own agent, which init_rpc starts
            _p(r"RPC has not been initialized",
               "a torch.distributed.rpc call ran before `rpc.init_rpc(name, rank=..., "
               "world_size=...)` in this process"),
            # DeepSpeed's own communication layer (deepspeed.comm): since 0.6 deepspeed.initialize
            # expects the job to have called deepspeed.init_distributed() (or to be launched so
            # that it does)
            _p(r"DeepSpeed backend not set, please initiali[sz]e it using init_process_group",
               "a deepspeed.comm call ran before DeepSpeed's process group was set up: call "
               "`deepspeed.init_distributed()` first (DeepSpeed 0.6 and later no longer do it "
               "for a job that sets up torch.distributed its own way)"),
            # Megatron's parallel state: its groups are made by initialize_model_parallel
            _p(r"(?P<group>data|tensor model|pipeline model|pipeline_model|model|context|expert "
               r"model) parallel group is not initiali[sz]ed",
               "Megatron's {group} parallel group was used before "
               "`initialize_model_parallel(...)` (after init_process_group) in this process"),
        ),
        "ValueError: Default process group has not been initialized, please make sure to call "
        "init_process_group.",
        progress=False,
    ),
    Rule(
        "ModelMismatch", Layer.MODEL, ORIGIN,
        "DDP compared the model across ranks and it differs: build the same model on every rank "
        "(same config, same code, no rank-dependent layers) before wrapping it; when a rank "
        "reports 0 params, that rank never reached the same check (it was still loading, or "
        "failed): look at that rank's log first",
        (
            _p(r"DDP expects same model across all ranks, but Rank (?P<rank>\d{1,7}) has "
               r"(?P<n>\d{1,12}) params, while rank (?P<other>\d{1,7}) has inconsistent "
               r"(?P<m>\d{1,12}) params",
               "DDP found {n} parameters on rank {rank} but {m} on rank {other}"),
            _p(r"DDP expects same model across all ranks",
               "DDP found different models (parameter counts) on different ranks"),
            _p(r"in this process with sizes \[[\d, ]{0,120}\] appears not to match (?:sizes|"
               r"strides) of the same param in process (?P<other>\d{1,7})",
               "a parameter's shape differs from rank {other}'s (DDP's model check)"),
        ),
        "RuntimeError: DDP expects same model across all ranks, but Rank 1 has 338 params, "
        "while rank 0 has inconsistent 0 params.",
        progress=False,
    ),
    Rule(
        "ParameterReadyTwice", Layer.MODEL, ORIGIN,
        "DDP saw one parameter's gradient twice in one backward: with activation checkpointing "
        "use `use_reentrant=False` (`gradient_checkpointing_kwargs={'use_reentrant': False}`) "
        "or `DDP(..., static_graph=True)`; do not share a parameter between modules that run "
        "in several forward passes per step, and do not use parameters outside `forward` "
        "(`TORCH_DISTRIBUTED_DEBUG=DETAIL` names the parameter)",
        (
            # the lines after it name the parameter (with TORCH_DISTRIBUTED_DEBUG=DETAIL)
            _p(r"Expected to mark a variable ready only once",
               "DDP marked a parameter's gradient ready twice in one iteration", follow=3),
        ),
        "RuntimeError: Expected to mark a variable ready only once. This error is caused by one "
        "of the following reasons: 1) Use of a module parameter outside the `forward` function.",
    ),
    Rule(
        "CollectiveMismatch", Layer.COMMUNICATION, ORIGIN,
        "the ranks called different collectives (or the same one with different sizes) at the "
        "same point: a rank-dependent branch around a collective (`if rank == 0: dist.broadcast"
        "(...)`), a rank that skipped a step (an empty batch, an early stop on one rank) or "
        "uneven inputs (`DDP.join()`); the fingerprints in the message show what each rank ran",
        (
            _p(r"Detected mismatch between collectives on ranks\. Rank (?P<a>\d{1,7}) is running "
               r"collective: [^\n]{0,200}?OpType=(?P<op>\w{1,40})",
               "rank {a} ran {op} while another rank ran a different collective or size"),
            _p(r"Detected mismatch between collectives on ranks",
               "the ranks ran different collectives at the same point"),
            # NCCL's own check (NCCL_CHECK_MODE / its debug build): names a rank near the
            # mismatch
            _p(r"NCCL WARN Mismatched collective detected[^\n]{0,80}?around rank (?P<near>\d{1,7})",
               "NCCL found the ranks calling different collectives at the same point, at or "
               "near rank {near}"),
            _p(r"NCCL WARN Mismatched collective detected",
               "NCCL found the ranks calling different collectives at the same point"),
            # gloo received more bytes than the buffer it posted: the ranks' sizes differ
            _p(r"op\.preamble\.length <= op\.nbytes\. (?P<got>\d{1,15}) vs (?P<want>\d{1,15})",
               "gloo received {got} bytes into a {want}-byte buffer: the ranks ran the "
               "collective with different sizes"),
            # NCCL's transports say the same: "NET/Socket : peer A message truncated :
            # receiving N bytes instead of M", NET/IB's "Message truncated : received N bytes"
            _p(r"[Mm]essage truncated ?: receiv(?:ing|ed) (?P<got>\d{1,15}) bytes instead of "
               r"(?P<want>\d{1,15})",
               "NCCL received {got} bytes where a peer's collective expected {want}: the ranks "
               "ran it with different sizes, or NCCL_PROTO / NCCL_ALGO differ between them"),
        ),
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST, "
        "TensorShape=[1], TensorDtypes=Long), but Rank 1 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE, TensorShape=[1]).",
    ),
    Rule(
        "DeviceSideAssert", Layer.MODEL, ORIGIN,
        "a CUDA kernel's assertion failed, almost always an index out of range: class labels "
        "outside [0, num_classes) for the loss, token ids >= the embedding size, a bad gather "
        "index; rerun with `CUDA_LAUNCH_BLOCKING=1` (or on the CPU) to get the failing op and "
        "check the data",
        (
            _p(r"device-side assert triggered", "a CUDA kernel's device-side assertion failed"),
            # the kernel's own line (printed before the error, or alone in a paste)
            _p(r"(?P<file>\w{1,80}\.cu):\d{1,6}: (?P<kernel>\w{1,120}): block: \[[\d,]{1,30}\], "
               r"thread: \[[\d,]{1,30}\] Assertion .(?P<cond>[^`'\n]{1,120}). failed",
               "the CUDA kernel {kernel} ({file}) failed its assertion `{cond}`"),
        ),
        "RuntimeError: CUDA error: device-side assert triggered",
    ),
    Rule(
        "GpuArchUnsupported", Layer.ENVIRONMENT, ORIGIN,
        "this torch (or an extension) has no kernels for the GPU's architecture: install a torch "
        "build whose CUDA supports it (a new GPU needs a recent CUDA: H100 sm_90 needs CUDA >= "
        "11.8; `python -c 'import torch; print(torch.cuda.get_arch_list())'` lists the built "
        "ones), and rebuild extensions with `TORCH_CUDA_ARCH_LIST` naming it",
        (
            _p(r"no kernel image is available for execution on the device",
               "no kernel of this build runs on this GPU's architecture"),
            # torch's own warning at CUDA init for a GPU its build has no kernels for, old and
            # new wording ("PyTorch no longer supports this GPU because it is too old", "Minimum
            # and Maximum cuda capability supported by this version of PyTorch is (7.0) - (9.0)")
            _p(r"Found GPU(?P<gpu>\d{1,4}) (?P<name>[^\n]{1,80}?) which is of (?:cuda|compute) "
               r"capability (?:\(CC\) )?(?P<cc>\d{1,2}\.\d{1,2})",
               "this torch has no kernels for GPU {gpu} ({name}, compute capability {cc})",
               follow=2),
            _p(r"(?P<name>[\w -]{1,80}?) with CUDA capability (?P<sm>sm_\d{2,3}) is not "
               r"compatible with the current PyTorch installation",
               "this torch has no kernels for the {name} ({sm})"),
            _p(r"PyTorch no longer supports this GPU because it is too old",
               "this torch has dropped the GPU's architecture (too old for this build)"),
        ),
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        progress=False,
    ),
    Rule(
        "P2PUnsupported", Layer.HARDWARE, ORIGIN,
        "CUDA peer-to-peer access between these GPUs is not supported or broken: check it with "
        "`nvidia-smi topo -p2p r`; on GPUs or hosts without working P2P (many consumer GPUs, "
        "PCIe ACS or an IOMMU in the way, some VMs) run with `NCCL_P2P_DISABLE=1` (slower), or "
        "disable ACS / set the IOMMU to passthrough on the host",
        (
            _p(r"peer access is not supported between these two devices",
               "CUDA peer access is not supported between two of the GPUs"),
            # NCCL's check of the rings it built (graph/rings.cc): the ranks did not agree on
            # the paths between the GPUs, most often P2P that some see and others do not (two
            # NVLink islands with no P2P route between them, ACS, a VM)
            _p(r"ring (?P<ring>\d{1,3}) does not (?:contain rank \d{1,6}|loop back "
               r"to start)",
               "NCCL's rings do not agree across the ranks (ring {ring} is broken): the GPUs' "
               "P2P paths differ between ranks (no P2P route between two NVLink islands, ACS "
               "or an IOMMU); NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL works around it"),
            # accelerate refuses to start on GPUs whose P2P / IB it knows not to work
            _p(r"Using RTX (?P<gpu>[\w ]{1,40}?) series doesn.t support faster communication",
               "accelerate refuses P2P and InfiniBand on RTX {gpu} series GPUs: set "
               "NCCL_P2P_DISABLE=1 and NCCL_IB_DISABLE=1 (`accelerate launch` sets them)"),
        ),
        "RuntimeError: CUDA error: peer access is not supported between these two devices",
    ),
    Rule(
        "CudaInitBeforeFork", Layer.MODEL, ORIGIN,
        "CUDA was initialised in the parent before the worker processes were forked: do not "
        "touch CUDA (`torch.cuda.*`, `.cuda()`, `.to('cuda')`) before the workers start; use "
        "the 'spawn' start method (`mp.spawn`, `multiprocessing.set_start_method('spawn')`, "
        "DataLoader `multiprocessing_context='spawn'`) or launch with torchrun, which starts "
        "fresh processes",
        (
            _p(r"Cannot re-initialize CUDA in forked subprocess",
               "a forked process tried to use CUDA that its parent had initialised"),
            _p(r"Lightning can.t create new processes if CUDA is already initialized",
               "Lightning could not fork its processes: CUDA was already initialised"),
        ),
        "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
        "multiprocessing, you must use the 'spawn' start method",
        progress=False,
    ),
    Rule(
        "NoTrainableParameters", Layer.MODEL, ORIGIN,
        "DDP was given a module with no parameter that requires a gradient (a frozen model, a "
        "loss or a helper such as an SMPL layer): do not wrap it in DistributedDataParallel, "
        "only the trainable model; freeze parameters after wrapping, not the whole module",
        (
            _p(r"DistributedDataParallel is not needed when a module doesn't have any parameter "
               r"that requires a gradient",
               "DDP was given a module with no trainable parameter"),
            _p(r"Expected at least one parameter",
               "DDP was given a module with no parameter (torch 1.x's reducer)"),
        ),
        "RuntimeError: DistributedDataParallel is not needed when a module doesn't have any "
        "parameter that requires a gradient.",
        progress=False,
    ),
    Rule(
        "BackendUnsupported", Layer.ENVIRONMENT, ORIGIN,
        "the process group's backend cannot do what was asked: use backend='nccl' for CUDA "
        "tensors on Linux (gloo takes no `device_ids` and lacks some collectives), a backend "
        "that has the op, or the CPU tensors gloo (and an MPI without CUDA) wants; on Windows "
        "(gloo only) drop device_ids and, for torchrun on torch 2.4+, set `USE_LIBUV=0`",
        (
            _p(r"not supported for the selected backend (?P<backend>\w{1,20})",
               "the {backend} backend does not support an argument it was given"),
            _p(r"ProcessGroup(?P<backend>NCCL|Gloo|MPI|UCC) does not support (?P<op>\w{1,40})",
               "the {backend} backend does not support {op}"),
            # UCC's own status for a collective it has no algorithm for (UCC_ERR_NOT_SUPPORTED;
            # its UCP transport has no collectives on CPU tensors of some kinds)
            _p(r"ProcessGroup(?P<backend>UCC|MPI)[^\n]{0,200}?failed to init collective, error "
               r"code -?\d{1,4}: Operation is not supported",
               "the {backend} backend has no way to run this collective on these tensors "
               "(UCC's 'Operation is not supported': for CPU tensors use gloo, or CUDA tensors "
               "with UCC's CUDA transport)"),
            _p(r"Backend (?P<backend>\w{1,20}) does not support (?P<op>\w{1,40})",
               "the {backend} backend does not support {op}"),
            # ProcessGroupGloo's words for a collective it lacks (torch 1.x-2.x)
            _p(r"no support for (?P<op>\w{1,40}) in (?P<backend>Gloo|NCCL|MPI|UCC) process group",
               "the {backend} backend does not support {op}"),
            # SageMaker's data-parallel backend names itself: "SMDDP does not support: ReduceOp"
            _p(r"\b(?P<backend>SMDDP|smddp|NCCL|Gloo|MPI|UCC) does not support: (?P<op>\w{1,40})",
               "the {backend} backend does not support {op}"),
            _p(r"CUDA tensor detected and the MPI used doesn't have CUDA-aware MPI support",
               "the MPI backend was given GPU tensors and this MPI is not CUDA-aware: use "
               "backend='nccl' for CUDA tensors, or an MPI built with CUDA support"),
            # a torch built without torch.distributed at all (macOS wheels before 1.7, some
            # source and mobile builds): the module has none of its functions
            _p(r"module 'torch\.distributed' has no attribute '(?P<fn>init_process_group|"
               r"is_initialized|get_rank|get_world_size|barrier|all_reduce)'",
               "this torch was built without torch.distributed (`torch.distributed."
               "is_available()` is False; macOS wheels before 1.7): install a build that has it"),
            # torch 0.4's THD backend, built without the backend it was asked for (a source
            # build that did not find NCCL 2 used its bundled NCCL 1)
            _p(r"the distributed (?P<backend>NCCL|Gloo|MPI|gloo|mpi|nccl) backend is not "
               r"available",
               "this torch was built without the {backend} backend (a source build that did not "
               "find the library): rebuild with it found (for NCCL 2, NCCL_ROOT_DIR) or install "
               "a release build"),
            _p(r"Distributed package doesn't have NCCL bu(?:il|li)t in",
               "this torch has no NCCL (a CPU, Windows or macOS build): use backend='gloo' or "
               "a CUDA build of torch on Linux"),
            _p(r"TCP backend has been deprecated",
               "the 'tcp' backend was removed from torch.distributed long ago: use 'gloo' "
               "(CPU) or 'nccl' (GPU)"),
            _p(r"use_libuv was requested but PyTorch was buil[dt] without libuv support",
               "torchrun's store asked for libuv, which this torch (Windows) lacks: set "
               "USE_LIBUV=0"),
        ),
        "RuntimeError: ProcessGroupGloo does not support reduce_scatter",
        progress=False,
    ),
    Rule(
        "MissingPackage", Layer.ENVIRONMENT, ORIGIN,
        "the Python that ran the job cannot find a module it imports: on each node run the "
        "job's Python as the launcher starts it (`which python`, `python -c 'import NAME'` with "
        "the job's environment) and install the package there or in the image; activate the "
        "environment in the job script itself (srun, DeepSpeed's pdsh and ssh start a new "
        "shell on each node, without your shell's venv or conda env); for the job's own "
        "modules start it from the project's directory or set PYTHONPATH, and rename a file "
        "beside the script that has a package's name",
        (
            # Python's words for a top-level name it found nowhere (Python 2 without quotes).
            # Not a dotted name (raised in the job's own file, a part the installed package
            # lacks: the job's code), nor a dunder one (``'__torch__'``: torch.load given a
            # TorchScript file), nor a warning that quotes it (torch's "Failed to initialize
            # NumPy: No module named 'numpy'")
            _p(r"(?:^\s{0,8}|[\]:|)]\s{0,2})(?:ModuleNotFoundError|ImportError): No module "
               r"named '?(?!__)(?P<mod>\w{1,80})'?\s{0,4}$",
               "the module {mod} is not installed in the Python that ran the job"),
            _p(r"No module named '(?P<mod>[\w.]{1,160})'; '(?P<pkg>[\w.]{1,160})' is not a "
               r"package",
               "{pkg} is a module, not the package {mod} needs: a file of that name (beside the "
               "script, or on PYTHONPATH) or another install shadows the package"),
            # a library's own ModuleNotFoundError, worded its own way ("A compatible
            # nvidia-resiliency-ext installation is required for ..."): still a module the
            # Python that ran the job cannot find
            _p(r"ModuleNotFoundError: (?!No module named)(?P<msg>[^\n]{8,160}?)\s{0,4}$",
               "a package the job needs is not installed in the Python that ran it: {msg}"),
            # an ImportError that names the install command ("... requires Accelerate: `pip
            # install accelerate`"); not an upgrade (a version too old is not a missing package)
            _p(r"ImportError: [^\n]{0,200}?\b(?:pip|conda) install (?!-U\b|--upgrade)"
               r"[`'\"]?(?P<mod>[A-Za-z][\w.\[\]-]{0,80})",
               "the package {mod} is not installed in the Python that ran the job"),
            # transformers' own words for an optional package it needs and did not find
            _p(r"the package (?P<mod>[\w.-]{1,80}) seems to be not installed",
               "the package {mod} is not installed in the Python that ran the job"),
            _p(r"requires the (?P<mod>[\w.-]{1,80}) library but it was not found in your "
               r"environment",
               "the package {mod} is not installed in the Python that ran the job"),
        ),
        "ModuleNotFoundError: No module named 'deepspeed'",
        progress=False,
    ),
    Rule(
        "SshLaunchFailed", Layer.ENVIRONMENT, ORIGIN,
        "the launcher (DeepSpeed's runner, pdsh, mpirun) could not start the job on another node "
        "over ssh: from the launching node, as the job's user, `ssh -o "
        "PasswordAuthentication=no HOST hostname` must print the host's name without a prompt: "
        "install a key (`ssh-copy-id HOST`), accept the host's key once (known_hosts), check "
        "that each name in the hostfile resolves and answers on the ssh port (sshd running in "
        "the container?); or start one launcher per node instead (torchrun on each node, or srun)",
        (
            # DeepSpeed's runner checks every host of the hostfile before it starts anything
            _p(r"Command 'ssh -o PasswordAuthentication=no (?P<host>[\w.:@-]{1,100})"
               r"(?: -p \d{1,5})? hostname' returned non-zero exit status (?P<rc>\d{1,3})",
               "the launcher could not log in to {host} over ssh without a password (ssh exit "
               "status {rc})"),
            # 255 is ssh's own failure; any other code is the remote command's, passed on
            _p(r"pdsh@[\w.-]{1,100}: (?P<host>[\w.-]{1,100}): ssh exited with exit code 255",
               "pdsh could not log in to {host} over ssh (ssh's own exit code 255)"),
            _p(r"(?:^|\s)(?:[\w.-]{1,64}@)?(?P<host>[\w.-]{1,100}): (?:Permission denied "
               r"\(publickey|Host key verification failed)",
               "ssh to {host} was refused (no key it accepts, or a host key not yet trusted)"),
            _p(r"ssh: connect to host (?P<host>[\w.:-]{1,100}) port (?P<port>\d{1,5}): "
               r"(?P<why>Connection refused|No route to host|Connection timed out)",
               "ssh could not reach {host} on port {port}: {why}"),
            _p(r"ssh: Could not resolve hostname (?P<host>[\w.-]{1,100})",
               "ssh could not resolve the host name {host} (hostfile or /etc/hosts)"),
        ),
        "subprocess.CalledProcessError: Command 'ssh -o PasswordAuthentication=no node02 "
        "hostname' returned non-zero exit status 255.",
        progress=False,
    ),
    Rule(
        "LauncherNotFound", Layer.ENVIRONMENT, ORIGIN,
        "the launcher the job calls cannot be run here (not installed, not on PATH, or a "
        "launch script without its execute bit): install it (Slurm's "
        "`srun` comes with the slurm client, and only works inside an allocation), activate "
        "the environment that has torchrun / deepspeed / accelerate, or call it as "
        "`python -m torch.distributed.run`; under sudo, which resets PATH, call it by its full "
        "path; on a machine without Slurm launch with torchrun; `chmod +x` a launch script "
        "(or start it as `bash script.sh`)",
        (
            # Slurm's step daemon could not start the step's command on the node
            _p(r"slurmstepd: error: execve\(\): (?P<cmd>[\w./+-]{1,200}): (?P<why>No such file or "
               r"directory|Permission denied)",
               "Slurm could not start {cmd} on the node ({why}): it is not on the step's PATH "
               "there (activate the environment in the batch script, or give its full path)"),
            # a launch script (dist_train.sh) or launcher the shell may not execute
            _p(r"\b(?:ba|z|da)?sh: (?:(?:line )?\d{1,6}: )?(?P<cmd>[\w./-]{0,200}\.sh|"
               r"[\w./-]{0,200}?(?:torchrun|deepspeed|accelerate|srun|mpirun)): Permission denied",
               "the shell may not execute {cmd}: it has no execute permission (`chmod +x "
               "{cmd}`, or start it as `bash {cmd}`)"),
            _p(r"(?P<cmd>srun|sbatch|salloc|torchrun|deepspeed|accelerate|mpirun|mpiexec): "
               r"command not found",
               "the command {cmd} is not installed or not on PATH"),
            _p(r"No such file or directory: '(?P<cmd>srun|torchrun|deepspeed|accelerate|mpirun)'",
               "the command {cmd} is not installed or not on PATH"),
            # dash (/bin/sh) words it "sh: 1: torchrun: not found"; sudo's reset PATH is a
            # common way there
            _p(r"\bsh: (?:line )?\d{1,6}: (?P<cmd>srun|sbatch|salloc|torchrun|deepspeed|"
               r"accelerate|mpirun|mpiexec): not found",
               "the shell found no command {cmd} on PATH (under sudo the environment's PATH is "
               "reset)"),
            # Ubuntu's command-not-found hook, old and new wording
            _p(r"The program '(?P<cmd>srun|sbatch|salloc|torchrun|deepspeed|accelerate|mpirun|"
               r"mpiexec)' is currently not installed",
               "the command {cmd} is not installed on this node"),
            _p(r"Command '(?P<cmd>srun|sbatch|salloc|torchrun|deepspeed|accelerate|mpirun|"
               r"mpiexec)' not found",
               "the command {cmd} is not installed on this node"),
        ),
        "bash: srun: command not found",
        progress=False,
    ),
    Rule(
        "DiskFull", Layer.ENVIRONMENT, ORIGIN,
        "a disk filled up (a checkpoint, a cache, the logs): `df -h` on the path it wrote "
        "(the checkpoint dir, $TMPDIR, ~/.cache), free space or point it elsewhere; save on "
        "rank 0 only (or with torch.distributed.checkpoint) and keep fewer checkpoints",
        (
            _p(r"PytorchStreamWriter failed writing file (?P<file>\S{1,200}): file write failed",
               "torch.save could not write {file}: the disk is full"),
            _p(r"Disk quota exceeded", "the disk quota is exceeded"),
            _p(r"No space left on device", "a write failed: no space left on device"),
        ),
        "OSError: [Errno 28] No space left on device",
        progress=False,
    ),
    Rule(
        "TooManyOpenFiles", Layer.ENVIRONMENT, ORIGIN,
        "a process ran out of file descriptors (its open-files limit, `ulimit -n`, often 1024): "
        "raise it for the job (`ulimit -n 65536` in the launch script; Docker `--ulimit "
        "nofile=65536:65536`; a systemd service's LimitNOFILE=; Slurm passes the submitting "
        "shell's limit, PropagateResourceLimits), or let DataLoader workers share tensors "
        "through files instead of one descriptor each: "
        "`torch.multiprocessing.set_sharing_strategy('file_system')`",
        (
            _p(r"\[Errno 24\] Too many open files",
               "a process hit its open-files limit (EMFILE)"),
            # torch's DataLoader: a worker's tensor arrives as a file descriptor over a Unix
            # socket, and none can be received once the limit is reached
            _p(r"received 0 items of ancdata",
               "a DataLoader worker's tensor could not be passed to the main process: its file "
               "descriptor did not fit under the open-files limit"),
            _p(r"Too many open files", "a process hit its open-files limit"),
        ),
        "OSError: [Errno 24] Too many open files",
        progress=False,
    ),
    Rule(
        "ScriptException", Layer.MODEL, ORIGIN,
        "the job's own Python code raised it: read the traceback's last frame of the job's own "
        "file (the file and line named) and fix the script or its input (a path or dataset "
        "that is not there, a module, attribute or API the installed version lacks: pin the "
        "versions the code was written for; tensor shapes or dtypes that do not fit: the model, "
        "its config, its checkpoint, its data and its precision settings (autocast, .half(), "
        "bf16) must agree); it is the job's fault, not the node's",
        (
            _p(r"(?:^|[\]:]\s{0,2})(?P<cls>NameError|SyntaxError|IndentationError|"
               r"UnboundLocalError): (?P<msg>[^\n]{1,200})",
               "the job's code raised {cls}: {msg}"),
            _p(r"FileNotFoundError: (?P<msg>[^\n]{1,200})",
               "a file or directory the job needs is not there: {msg}"),
            _p(r"(?P<cls>IsADirectoryError|NotADirectoryError): (?P<msg>[^\n]{1,200})",
               "the job gave a path of the wrong kind ({cls}): {msg}"),
            # Python's own words when the script torchrun (or python) is given is not there
            _p(r"can't open file '(?P<path>[^'\n]{1,300})': \[Errno 2\] No such file or "
               r"directory",
               "the script {path} is not there (a wrong path or working directory on this node)"),
            # torch's words for tensor shapes that do not fit: the model, its config or its
            # data disagree (a bug or a setting of the job, on every node alike)
            _p(r"mat1 and mat2 shapes cannot be multiplied \((?P<x>\d{1,9}x\d{1,9}) and "
               r"(?P<y>\d{1,9}x\d{1,9})\)",
               "the model's layers do not fit: a matrix product of {x} by {y} (the model's "
               "config and its layers or checkpoint disagree)"),
            _p(r"The size of tensor a \((?P<x>\d{1,12})\) must match the size of tensor b "
               r"\((?P<y>\d{1,12})\) at non-singleton dimension (?P<d>\d{1,3})",
               "two tensors' shapes do not fit ({x} against {y} in dimension {d}): the model, "
               "its config or its data disagree"),
            _p(r"Error\(s\) in loading state_dict for (?P<model>[\w.]{1,120}):",
               "the checkpoint does not fit the model {model} (missing, unexpected or "
               "differently shaped parameters: another model config or version)", follow=3),
            _p(r"Expected input batch_size \((?P<x>\d{1,12})\) to match target batch_size "
               r"\((?P<y>\d{1,12})\)",
               "the model's output and the labels have different batch sizes ({x} and {y})"),
            _p(r"shape '(?P<shape>\[[-\d, ]{1,80}\])' is invalid for input of size "
               r"(?P<n>\d{1,15})",
               "a reshape to {shape} does not fit {n} elements: the model, its config or its "
               "data disagree"),
            _p(r"Given groups=\d{1,6}, weight of size (?P<w>\[[\d, ]{1,60}\]), expected "
               r"input(?P<i>\[[\d, ]{1,60}\]) to have (?P<x>\d{1,9}) channels, but got "
               r"(?P<y>\d{1,9}) channels instead",
               "a convolution expects {x} input channels and got {y}: the model and its data "
               "disagree"),
            # torch's words for tensors of dtypes that do not fit one op: the job's mixed
            # precision (autocast, .half(), bf16 settings) or its data
            _p(r"Found dtype (?P<got>\w{1,20}) but expected (?P<want>\w{1,20})",
               "an op got a {got} tensor where {want} was expected (the job's mixed precision "
               "or its data: cast the tensors, or keep the op under autocast)"),
            _p(r"expected scalar type (?P<want>\w{1,20}) but found (?P<got>\w{1,20})",
               "an op expected {want} tensors and got {got} (the job's mixed precision or its "
               "data: cast the tensors, or keep the op under autocast)"),
            _p(r"expected (?:mat1 and mat2|both vectors|m1 and m2) to have the same dtype, but "
               r"got:? (?P<x>[\w:]{1,30}) != (?P<y>[\w:]{1,30})",
               "a matrix product got tensors of two dtypes ({x} and {y}): the job's mixed "
               "precision casts one and not the other"),
            _p(r"Input type \((?P<x>[\w.:]{1,60})\) and (?P<what>weight|bias) type "
               r"\((?P<y>[\w.:]{1,60})\) should be the same",
               "a layer's input is {x} and its {what} {y}: the job's mixed precision casts one "
               "and not the other"),
            _p(r"result type (?P<x>\w{1,20}) can't be cast to the desired output type "
               r"(?P<y>\w{1,20})",
               "an in-place op would turn {x} into {y} (the job's tensors' dtypes disagree)"),
            _p(r"\"(?P<op>\w{1,60})\" not implemented for '(?P<dtype>\w{1,20})'",
               "the op {op} has no kernel for {dtype} (a half-precision model left on the CPU, "
               "or a dtype the op lacks)"),
            # autograd's words for a loss with no graph behind it: every parameter frozen, the
            # forward under no_grad, or reentrant checkpointing whose inputs need no grad
            _p(r"element 0 of tensors does not require grad and does not have a grad_fn",
               "backward() was called on a tensor with no graph behind it (every parameter "
               "frozen, the forward run under no_grad, or reentrant gradient checkpointing "
               "whose inputs need no grad: `model.enable_input_require_grads()` or "
               "`use_reentrant=False`)"),
            # torch's words for a tensor that holds NaN or inf where an op cannot take it: the
            # job's training diverged (or its data holds them)
            _p(r"normal expects all elements of std >= 0\.0|probability tensor contains either "
               r"`inf`, `nan` or element < 0|Function '\w{1,80}' returned nan values",
               "the job's tensors hold NaN or inf (training diverged: a learning rate too high, "
               "fp16 overflow, or bad data; `torch.autograd.set_detect_anomaly(True)` finds "
               "the op)"),
            # torch.load's words for a file that is not a whole checkpoint archive: cut short
            # (read by another rank before rank 0 finished saving it, a save killed or out of
            # disk, an unfinished download); the job's input, not the node
            _p(r"PytorchStreamReader failed (?:reading zip archive: failed finding central "
               r"directory|reading file (?P<file>[^\s:]{1,200}): (?:invalid header or archive "
               r"is corrupted|file read failed))",
               "torch.load read a file that is not a whole checkpoint (cut short: another rank "
               "loaded it before rank 0 finished saving it, a save that was killed or ran out of "
               "disk, or a download that did not finish): load only after a dist.barrier() "
               "that follows the save, or save to a temporary name and rename it"),
            # a second init_process_group in one process (a notebook cell run twice, the job
            # and a library each initialising the group)
            _p(r"trying to initialize the default process group twice",
               "init_process_group was called in a process whose default group already exists "
               "(a notebook cell run twice, or the job and a library each initialising it): "
               "call it once, or guard it with `dist.is_initialized()`"),
            # Lightning's words for a strategy object it does not take: most often one of the
            # `lightning` package given to a `pytorch_lightning` Trainer, or the reverse
            _p(r"You selected an invalid strategy name: ",
               "the Trainer was given a strategy it does not take (often a strategy from the "
               "`lightning` package given to a `pytorch_lightning` Trainer, or the reverse: "
               "import both from one package)"),
            # transformers' check of a DeepSpeed config against the Trainer's own arguments
            # (the values are on the next lines)
            _p(r"DeepSpeed config values that mismatch TrainingArguments values",
               "the DeepSpeed config and the Trainer's arguments disagree (the lines below "
               "name the values): set those DeepSpeed values to \"auto\" or make them agree"),
            # the DataLoader's own check of its arguments
            _p(r"persistent_workers option needs num_workers > 0",
               "the DataLoader was given persistent_workers=True with num_workers=0: give it "
               "workers, or set persistent_workers=False where num_workers is 0"),
            # autograd's words for backward() on a tensor that is not one number: a loss per
            # sample or per GPU (a DataParallel habit carried into DDP), or a missing reduction
            _p(r"grad can be implicitly created only for scalar outputs",
               "backward() was called on a loss that is not a single number (a loss per sample "
               "or per GPU, as DataParallel gathers it): reduce it first, e.g. "
               "`loss.mean().backward()`"),
            # OpenMMLab's distributed sampler (mmedit, mmcv) given fewer samples than the ranks
            # need between them
            _p(r"You may use too small dataset and our distributed sampler cannot pad your "
               r"dataset",
               "the dataset is smaller than the ranks need between them (samples per GPU times "
               "the number of GPUs), so the distributed sampler cannot pad it: use fewer GPUs, "
               "fewer samples per GPU, or a larger dataset"),
            # transformers' words for a checkpoint of a model type it does not know
            _p(r"has model type `(?P<type>[\w.-]{1,80})` but Transformers does not recognize "
               r"this architecture",
               "the installed transformers does not know the model type {type} (too old for "
               "the checkpoint, or a custom model that needs trust_remote_code=True)"),
            # Lightning's FSDP strategy: the optimizer was built from the unwrapped model
            _p(r"The optimizer does not seem to reference any FSDP parameters",
               "the optimizer was built from the model's parameters before FSDP wrapped it: "
               "build it from the wrapped model (in Lightning, `self.trainer.model.parameters()` "
               "in configure_optimizers)"),
            # Open MPI's banner for a second MPI_Init in one process (mpi4py's MPI.Init() and
            # then init_process_group("mpi"), which initialises MPI itself)
            _p(r"Open MPI has detected that this process has attempted to initiali[sz]e",
               "MPI was initialised twice in one process (often mpi4py's MPI.Init() and then "
               "init_process_group('mpi'), which initialises MPI itself): initialise it once: "
               "call init_process_group('mpi') first and use mpi4py after it "
               "(`mpi4py.rc.initialize = False`)", follow=2),
            # a non-leaf tensor that requires grad pickled to another process (mp.spawn's
            # arguments, a queue; weight_norm's computed weight on the model)
            _p(r"Cowardly refusing to serialize non-leaf tensor which requires_grad",
               "a tensor that requires grad and is not a leaf (computed from parameters; "
               "`nn.utils.weight_norm`'s weight) was sent to another process: `.detach()` it, "
               "build the model inside each process, or use "
               "`torch.nn.utils.parametrizations.weight_norm`"),
            # accelerate's notebook_launcher called without the number of processes
            _p(r"You have to specify the number of GPUs you would like to use, add "
               r"`?num_processes=",
               "accelerate's notebook_launcher was called without the number of processes: "
               "pass `num_processes=N` (the GPUs to use) to notebook_launcher"),
            # a config a library validates with pydantic (DeepSpeed's ZeRO, optimizer and other
            # sections): a key the installed release does not know, or a wrong value
            _p(r"ValidationError: (?P<n>\d{1,4}) validation errors? for (?P<cls>\w{1,80})",
               "the job's settings do not validate against {cls} ({n} error(s)): a key the "
               "installed release does not know (an option from a newer release: upgrade it, "
               "or drop the key) or a value of the wrong type"),
            # DeepSpeed's tensor-parallel inference (AutoTP) with no policy for the model
            _p(r"Not able to determine model policy automatically\. Please provide policy|AutoTP "
               r"not supported for model\. Please use kernel injection",
               "DeepSpeed's tensor-parallel inference found no policy for this model: pass "
               "`injection_policy={{Block: ('attn.out_proj', 'mlp.down_proj')}}` (the model's own "
               "layer names) to deepspeed.init_inference, or `replace_with_kernel_inject=True` "
               "where DeepSpeed has kernels for the model"),
            # webdataset refuses a pipeline that would give every node the same shards
            _p(r"you need to add an explicit nodesplitter to your input pipeline|input pipeline "
               r"needs to be reconfigured for multinode training",
               "the job's webdataset pipeline does not split its shards between the nodes: "
               "pass `nodesplitter=wds.split_by_node` (and `workersplitter=wds.split_by_worker`) "
               "to WebDataset, or `wds.split_by_node` as a pipeline stage"),
            # autograd's check that a tensor it saved for backward was not changed in place
            _p(r"one of the variables needed for gradient computation has been modified by an "
               r"inplace operation",
               "a tensor autograd saved for backward was changed in place before backward() "
               "(an in-place op in the model, `x += ...`, `relu(inplace=True)`; under DDP also "
               "BatchNorm's buffers broadcast by a second forward before the backward: "
               "`broadcast_buffers=False` or SyncBatchNorm); "
               "`torch.autograd.set_detect_anomaly(True)` names the op"),
            # torch.distributed.launch passes --local-rank=N (torch >= 2.0; --local_rank before)
            # to a script whose own argparse does not take that spelling: the script's words
            _p(r"unrecognized arguments: (?P<arg>--local[-_]rank)",
               "the script does not accept the {arg} argument torch.distributed.launch passes "
               "(torch >= 2.0 spells it --local-rank): launch it with torchrun and read "
               "LOCAL_RANK from the environment, or accept both spellings"),
            # the job's own script's argument parser (argparse: "train.py: error: ...") refused
            # the command line every rank was given; not torch.distributed.launch's or
            # torchrun's own parser (launch.py, run.py with its training_script, a launcher
            # argument given no value: MissingLauncherEnv)
            _p(r"(?:^|[\]:|]\s{0,2})(?!launch\.py:)"
               r"(?!(?:run|__main__)\.py: error: argument " + LAUNCHER_ARG + LAUNCHER_ARG_ALIAS
               + r": (?:invalid int value: '(?:\$[\w{}]{1,62})?'|expected one argument))"
               r"(?P<prog>[\w.-]{1,120}\.py): error: "
               r"(?![^\n]{0,200}training_script)(?P<msg>[^\n]{1,200})",
               "the job's script {prog} refused its command line: {msg}"),
            # Hugging Face's words for a model or dataset path that is not there: read as a
            # Hub repo id, which it is not
            _p(r"HFValidationError: Repo id must",
               "a model or dataset path that does not exist here was read as a Hugging Face Hub "
               "repo id (a wrong path in the job's config, or a directory missing on this "
               "node)"),
            _p(r"(?P<name>[^\s']{1,200}) is not a local folder and is not a valid model "
               r"identifier",
               "{name} is neither a directory here nor a model on the Hub (a wrong path in the "
               "job's config, or a directory missing on this node)"),
            # fairscale's sharded optimizer saved without gathering its shards first
            _p(r"Optimizer state has not been consolidated on this rank",
               "the job saved a sharded optimizer's state without gathering it: call "
               "`optimizer.consolidate_state_dict()` on every rank before rank 0 saves it"),
            # apex's amp given a model already wrapped in DDP
            _p(r"Incoming model is an instance of torch\.nn\.parallel\.DistributedDataParallel",
               "apex's amp.initialize was given a model already wrapped in DDP: call "
               "amp.initialize first, then wrap the model it returns"),
            # allennlp's check of its distributed config
            _p(r"Multiple cuda devices need to be configured to run distributed training",
               "allennlp's config asks for distributed training with one cuda device: list one "
               "device per process in distributed.cuda_devices, or train without distributed"),
            # transformers' check of the installed accelerate
            _p(r"Install Accelerate from main branch",
               "the installed transformers needs a newer accelerate than the one installed: "
               "`pip install -U accelerate` (or the version its release names)"),
            # diffusers' examples check the installed version at start-up
            _p(r"This example requires a (?:source install from HuggingFace diffusers|minimum "
               r"version of [\w.]{1,40})",
               "the example needs a newer diffusers than the one installed (install it from "
               "source, as the example's README says)"),
            # Python's own words for a name the code uses that the object or module lacks
            _p(r"AttributeError: '(?P<obj>\w{1,80})' object has no attribute '(?P<attr>\w{1,80})'",
               "the job's code asked a {obj} for {attr}, which it has not"),
            _p(r"AttributeError: module '(?P<mod>[\w.]{1,80})' has no attribute "
               r"'(?P<attr>\w{1,80})'",
               "{mod} has no {attr}: the installed version is not the one the code was written "
               "for"),
        ),
        "NameError: name '_ddp_dict' is not defined",
        frames=(
            # multiprocessing's own raise, when the paste stops above its exception line: the
            # job set the start method twice
            _f("set_start_method", r"raise RuntimeError\(\s{0,4}['\"]context has already been "
               r"set",
               "the job set the multiprocessing start method a second time (set_start_method "
               "in code that runs again, or after a library set it): call it once under `if "
               "__name__ == '__main__':`, or pass force=True (from the traceback's frames)"),
        ),
        progress=False,
        generic=True,
        job_frames=True,
    ),
)
