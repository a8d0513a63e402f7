"""The failure classes ``preflight explain`` recognises: one Rule per reason.

Each rule names its layer (environment, communication, data, model; plus hardware), the regexes
that recognise it in a line, the traceback frames that recognise it in a traceback cut short, a
message template and the remedy, citing PyTorch's and NCCL's public docs. Rules are plain data
(docs/explain.md and the tests walk them): what a rule's matches carry beyond their message is
named by its ``hook`` (implemented in facts.py) and its ``progress`` policy, never by the
classifier testing a reason's name.

Regexes run on one line at a time (a line is at most a few KiB after the reader's cut), use only
bounded repetitions or character classes followed by literals, and never nest quantifiers, so no
input can make them backtrack for long (tests/explain property-tests them on garbage).

``tier`` orders findings cause-first ("root cause first"): 0 an origin (a full /dev/shm, a
NIC error, an OOM), 1 a rank killed by a signal (the kill is the cause of what the other ranks
print, but a specific origin in the same log - an OOM, a full /dev/shm - says why it died), 2 an
error that usually wraps an origin (ncclSystemError, a rendezvous timeout, a refused NCCL
connect), 3 a symptom of another rank's death (the watchdog timeout, broken pipes).
"""

from __future__ import annotations

from preflight.explain.rules_setup import LAUNCHER_ARG, LAUNCHER_ARG_ALIAS, SETUP_RULES
from preflight.explain.ruletypes import (
    KILLED,
    ORIGIN,
    SYMPTOM,
    WRAPPER,
    Frame,
    Hook,
    Layer,
    Pattern,
    Rule,
)
from preflight.explain.ruletypes import frame as _f
from preflight.explain.ruletypes import pattern as _p

_LAUNCHER = ("torchrun itself received {name} and stopped all its workers: {hint}; if the job had "
             "hung before that, the rank that stopped printing first is the one to look at")

_FIRST: tuple[Rule, ...] = (
    Rule(
        "PortInUse", Layer.ENVIRONMENT, ORIGIN,
        "another process (often a previous job on the default port 29500) holds MASTER_PORT: "
        "see who with `ss -ltnp 'sport = :29500'`, or give each job its own port: "
        "`export MASTER_PORT=$((RANDOM + 20000))` / `torchrun --master_port=29501` "
        "(https://pytorch.org/docs/stable/elastic/run.html); every node must use the same port",
        (
            _p(r"failed to listen on any local network address\. port: (?P<port>\d{1,5})",
               "the TCPStore (MASTER_PORT) could not listen on port {port}: address already in "
               "use"),
            _p(r"failed to bind to (?P<addr>\S{1,300}) \(errno: 98",
               "the TCPStore (MASTER_PORT) could not bind {addr}: address already in use"),
            _p(r"(?i:address already in use)|EADDRINUSE",
               "a socket could not bind: address already in use (MASTER_PORT or the store)"),
            # accelerate launch checks the port itself before torch does
            _p(r"Tried to launch distributed communication on port `?(?P<port>\d{1,5})`?, but "
               r"another process is utilizing it",
               "accelerate found port {port} (main_process_port) taken by another process"),
            # SGLang waits for its port range to be free, then gives up
            _p(r"port_base at (?P<port>\d{1,5}) is not available in \d{1,6} seconds",
               "SGLang's port range from {port} is held by another process (two servers on one "
               "node given the same ports): give each its own port range"),
        ),
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
        "message: address already in use",
        progress=False,
    ),
    Rule(
        "MissingLauncherEnv", Layer.ENVIRONMENT, ORIGIN,
        "launch with torchrun (`torchrun --nproc_per_node=N train.py`), which sets RANK, "
        "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; with mp.spawn or a notebook pass "
        "rank= and world_size= to init_process_group and export MASTER_ADDR/MASTER_PORT "
        "(https://pytorch.org/docs/stable/distributed.html#environment-variable-initialization); "
        "under srun map SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID",
        (
            _p(r"using (?P<scheme>tcp|file|env)://[^:\n]{0,40}: (?P<what>rank|world size) "
               r"parameter missing",
               "init_process_group got no {what} ({scheme}:// rendezvous): pass rank= and "
               "world_size=, or launch with torchrun and use env://"),
            _p(r"environment variable (?P<var>[A-Z_]{2,40}) expected, but not set",
               "the launcher variable {var} is not set (env:// rendezvous)"),
            _p(r"Invalid environment variable:? (?P<var>[A-Z_]{2,40})",
               "the launcher variable {var} is not set or not valid"),
            _p(r"KeyError: '(?P<var>RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|"
               r"MASTER_PORT|GROUP_RANK)'",
               "the script reads {var} from the environment but the launcher did not set it"),
            # the raising line of torch.distributed.rendezvous, when the traceback was cut
            # before the ValueError itself
            _p(r"(?:_env_error|_get_env_or_raise)\(\s{0,4}[\"'](?P<var>[A-Z_]{2,40})[\"']\)",
               "the launcher variable {var} is not set (env:// rendezvous; from the "
               "traceback's raising line)"),
            # the launcher's own parser given no value: a launch script that passes
            # --master_port=$MASTER_PORT (or --node_rank $NODE_RANK) with the variable unset
            _p(r"(?:torchrun|launch\.py|run\.py|__main__\.py): error: argument "
               r"(?P<arg>" + LAUNCHER_ARG + ")" + LAUNCHER_ARG_ALIAS + r": "
               r"(?:invalid int value: ''|expected one argument)",
               "the launcher got no value for {arg}: the variable the launch script passes "
               "there (e.g. $MASTER_PORT, $NODE_RANK) is empty or not set on this node"),
            # ... or given a variable's name, never expanded: written in single quotes, or passed
            # by a scheduler's job definition that runs no shell
            _p(r"(?:torchrun|launch\.py|run\.py|__main__\.py): error: argument "
               r"(?P<arg>" + LAUNCHER_ARG + ")" + LAUNCHER_ARG_ALIAS + r": "
               r"invalid int value: '\$\{?(?P<var>[A-Za-z_]\w{0,60})\}?'",
               "the launcher got the text ${var} for {arg}, not its value: nothing expanded "
               "the variable (single quotes, or a job definition that runs no shell): expand it "
               "in a shell (`--node_rank=\"${var}\"`) or pass the number"),
        ),
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
        "variable RANK expected, but not set",
        frames=(
            # torch.distributed.rendezvous: 1.x raises _env_error("VAR") in the handler itself,
            # 2.x calls _get_env_or_raise("VAR") from it; either names the variable
            _f("_env_rendezvous_handler",
               r"(?:_env_error|_get_env_or_raise)\(\s{0,4}[\"'](?P<var>[A-Z_]{2,40})[\"']",
               "the launcher variable {var} is not set (env:// rendezvous; from the traceback's "
               "frames)"),
        ),
        progress=False,
    ),
    Rule(
        "InvalidDeviceOrdinal", Layer.ENVIRONMENT, ORIGIN,
        "select the GPU by LOCAL_RANK, not RANK: `torch.cuda.set_device(int(os.environ"
        "[\"LOCAL_RANK\"]))` and `DDP(model, device_ids=[local_rank])`; after "
        "CUDA_VISIBLE_DEVICES=2,3,4,5 the visible GPUs are 0-3 (CUDA_VISIBLE_DEVICES: "
        "https://docs.nvidia.com/cuda/cuda-c-programming-guide/#env-vars); keep "
        "--nproc_per_node <= visible GPUs (`preflight check --only cuda_devices`)",
        (
            _p(r"invalid device ordinal",
               "a process asked for a CUDA device that does not exist (invalid device ordinal)"),
            # torch's lazy CUDA init when the index is past the visible GPUs
            _p(r"device >= 0 && device < num_gpus INTERNAL ASSERT FAILED[^\n]{0,300}?"
               r"device=(?P<dev>\d{1,4}), num_gpus=(?P<n>\d{1,4})",
               "a process asked for CUDA device {dev} and sees {n} GPU(s)"),
            # Lightning's (and Fabric's) own check of the devices asked for against the visible
            # ones: "You requested gpu: [0, 1]\n But your machine only has: [0]"
            _p(r"You requested (?:gpus?|GPUs?|devices?): ?(?P<asked>\[[\d, ]{1,80}\])",
               "the job asked Lightning for GPUs {asked} and this process sees fewer (a launch "
               "script or CUDA_VISIBLE_DEVICES narrows them, or the node has fewer)",
               follow=1),
        ),
        "RuntimeError: CUDA error: invalid device ordinal",
        frames=(
            # a traceback cut inside torch.cuda.set_device: the index asked for is not there
            _f("set_device", r"torch\._C\._cuda_setDevice\(",
               "torch.cuda.set_device failed: the GPU index is not visible to this process "
               "(from the traceback's frames)"),
        ),
    ),
    Rule(
        "DuplicateGpu", Layer.ENVIRONMENT, ORIGIN,
        "two ranks use the same GPU: call `torch.cuda.set_device(local_rank)` before "
        "init_process_group (or pass device_id=torch.device('cuda', local_rank)), and check that "
        "CUDA_VISIBLE_DEVICES does not give every rank the same single GPU",
        (
            _p(r"Duplicate GPU detected ?: rank (?P<a>\d{1,7}) and rank (?P<b>\d{1,7}) both on "
               r"CUDA device (?P<dev>[0-9a-fA-F]{1,16})",
               "ranks {a} and {b} are both on the GPU with bus id {dev}"),
            _p(r"Duplicate GPU detected", "two ranks of one communicator are on the same GPU"),
        ),
        "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000",
    ),
    Rule(
        "NoSocketInterface", Layer.COMMUNICATION, ORIGIN,
        "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME names no usable interface: list them with "
        "`ip -br addr` and set the data NIC, e.g. `export NCCL_SOCKET_IFNAME=eth0 "
        "GLOO_SOCKET_IFNAME=eth0` (a prefix matches eth0, eth1...; `=eth0` is exact; no spaces "
        "after commas) "
        "(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname)",
        (
            _p(r"Bootstrap ?: no (?:NCCL_SOCKET_IFNAME )?socket interface found|"
               r"no NCCL_SOCKET_IFNAME interface found",
               "NCCL's bootstrap found no socket interface to use"),
            _p(r"with family \d{1,6} is neither AF_INET\(2\) nor AF_INET6\(10\)",
               "NCCL got no address for its socket interface (NCCL_SOCKET_IFNAME names an "
               "interface this host does not have)"),
            _p(r"NET/Socket ?: no interface found|No usable listening interface found",
               "NCCL's socket transport found no interface to use"),
            _p(r"Unable to find address for:? (?P<ifname>\S{1,64})",
               "gloo found no address for interface {ifname} (GLOO_SOCKET_IFNAME)"),
            # gloo without GLOO_SOCKET_IFNAME takes the address the host's name resolves to and
            # looks for the interface that holds it: none does when /etc/hosts or DNS gives
            # the name another host's (or a bogus) address
            _p(r"Unable to find interface for:? \[?(?P<addr>[0-9A-Fa-f.:]{1,64})\]?",
               "gloo found no interface of this host that holds {addr}, the address this "
               "host's name resolves to: set GLOO_SOCKET_IFNAME to the data NIC, or make the "
               "host name resolve to one of this host's addresses (/etc/hosts, `hostname -i`)"),
            # Transformer Engine's userbuffers take the interface from NVTE_UB_SOCKET_IFNAME,
            # NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME as an exact name, not NCCL's prefix
            _p(r"Invalid network interface: (?P<ifname>[\w.:@-]{1,64})",
               "Transformer Engine found no interface named {ifname} (it reads "
               "NVTE_UB_SOCKET_IFNAME, NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME as an exact "
               "name, not a prefix): set NVTE_UB_SOCKET_IFNAME to the full name, e.g. eth0"),
        ),
        "node01:4102:4102 [0] NCCL WARN Bootstrap : no socket interface found",
        hook=Hook.SOCKET_IFNAME,
    ),
    Rule(
        "ShmExhausted", Layer.COMMUNICATION, ORIGIN,
        "/dev/shm is too small or full: give the container more, `docker run --shm-size=16g "
        "--ulimit memlock=-1` (Kubernetes: an emptyDir with medium: Memory at /dev/shm), then "
        "`preflight check --only shm`; workarounds: `export NCCL_SHM_DISABLE=1` for NCCL, fewer "
        "DataLoader num_workers for data loading; ranks of one node in separate containers must "
        "share one /dev/shm (`docker run --ipc=host`) "
        "(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html)",
        (
            # /dev/shm is there but this user may not create files in it (its mode, a mount)
            _p(r"Call to shm_open failed ?: Permission denied",
               "NCCL may not create files in /dev/shm (shm_open: Permission denied): `ls -ld "
               "/dev/shm` should show drwxrwxrwt; restore it with `chmod 1777 /dev/shm`, or "
               "set NCCL_SHM_DISABLE=1"),
            _p(r"Error while creating shared memory segment (?P<path>\S{1,300}) \(size "
               r"(?P<size>\d{1,20})\)",
               "NCCL could not create the shared-memory segment {path} ({size} B) in /dev/shm"),
            _p(r"Error while attaching to shared memory segment (?P<path>\S{1,300}) \(size "
               r"(?P<size>\d{1,20})\)",
               "NCCL could not attach the shared-memory segment {path} ({size} B) another rank "
               "created: the ranks do not share one /dev/shm, or it was removed"),
            _p(r"failed to extend (?P<path>\S{1,300}) to (?P<size>\d{1,20}) bytes",
               "NCCL could not grow {path} to {size} B: /dev/shm is full"),
            _p(r"posix_fallocate failed ?: No space left on device",
               "NCCL could not allocate a shared-memory segment: /dev/shm is full"),
            _p(r"DataLoader worker \(pid \d{1,10}\) is killed by signal: Bus error",
               "a DataLoader worker died of a bus error: /dev/shm is out of space",
               layer=Layer.DATA),
            _p(r"Unexpected bus error encountered in worker",
               "a DataLoader worker hit a bus error: insufficient shared memory (/dev/shm)",
               layer=Layer.DATA),
            _p(r"unable to (?:write to|mmap \d{1,20} bytes from) file </torch_",
               "PyTorch could not put a tensor in shared memory (/dev/shm full)",
               layer=Layer.DATA),
            _p(r"No space left on device[^\n]{0,40}/dev/shm|/dev/shm[^\n]{0,300}No space left",
               "no space left in /dev/shm", layer=Layer.DATA),
        ),
        "node01:4102:4187 [2] NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-7xQm2L (size 9637888)",
    ),
    Rule(
        "NcclIbError", Layer.HARDWARE, ORIGIN,
        "an InfiniBand/RoCE link or HCA failed: check the port (`ibstat`, `ibv_devinfo`: State "
        "Active) and its error counters, reseat/replace the cable or drain the node; exclude a bad "
        "HCA with `export NCCL_IB_HCA==mlx5_0,mlx5_1`; on a flaky fabric raise "
        "`NCCL_IB_TIMEOUT=22`; for ibv_reg_mr failures raise the memlock limit "
        "(`ulimit -l unlimited`, docker `--ulimit memlock=-1`); NCCL_IB_DISABLE=1 only to confirm "
        "(it falls back to slow sockets)",
        (
            _p(r"NET/IB ?: Got completion (?:from peer (?P<peer>\S{1,80}) )?with "
               r"(?:status|error)[= ](?P<code>\d{1,4})",
               "an InfiniBand work completion failed with status {code}"),
            _p(r"NET/IB[^\n]{0,200}(?:failed|[Ee]rror)",
               "the NCCL InfiniBand transport reported an error", layer=Layer.COMMUNICATION),
            _p(r"(?:Call to )?(?P<call>ibv_\w{1,40})[^\n]{0,80}failed",
               "the verbs call {call} failed", layer=Layer.COMMUNICATION),
        ),
        "node02:5120:5301 [3] NCCL WARN NET/IB : Got completion from peer 10.1.0.12<49152> with "
        "status 12 opcode 0 len 0 vendor err 129 (Recv)",
    ),
    Rule(
        "GpuHardwareError", Layer.HARDWARE, ORIGIN,
        "the GPU itself failed: drain the node, read `dmesg | grep -i xid` and `nvidia-smi -q -d "
        "ECC,ROW_REMAPPER`, reset the GPU or send it for repair; `preflight check --only "
        "gpu_visible` must pass before the node takes jobs again",
        (
            _p(r"NVRM: Xid \((?P<pci>[^)\n]{1,40})\): (?P<xid>\d{1,4})",
               "the NVIDIA driver reported Xid {xid} on GPU {pci}"),
            _p(r"uncorrectable ECC error", "a GPU reported an uncorrectable ECC error"),
            # ROCm's runtime (HSA) on an AMD GPU that stopped: "HW Exception by GPU node-9
            # (Agent handle: 0x...) reason :GPU Hang"
            _p(r"HW Exception by GPU node-(?P<node>\d{1,5})[^\n]{0,80}?reason ?: ?"
               r"(?P<why>[A-Za-z][\w ]{1,60})",
               "the AMD GPU (ROCm node {node}) raised a hardware exception: {why}"),
            _p(r"fallen off the bus|GPU is lost", "a GPU fell off the bus (lost)"),
            _p(r"Unable to determine the device handle for GPU ?(?P<pci>[0-9A-Fa-f:.]{4,20}): "
               r"(?P<why>[A-Za-z][A-Za-z ]{2,40})",
               "nvidia-smi cannot reach GPU {pci}: {why}"),
            _p(r"GPU requires reset|NVML_ERROR_GPU_IS_LOST",
               "a GPU is lost and needs a reset"),
            _p(r"uncorrectable NVLink error", "an NVLink link reported an uncorrectable error"),
        ),
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=4102, name=python, GPU has fallen off the bus.",
    ),
    Rule(
        "CudaOutOfMemory", Layer.MODEL, ORIGIN,
        "the rank ran out of GPU memory: lower the per-GPU batch size, use activation "
        "checkpointing or mixed precision; for fragmentation `export PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True`; if several ranks share one GPU (set_device(rank) instead of "
        "local_rank) or another process holds memory, fix that first (`nvidia-smi`)",
        (
            _p(r"CUDA out of memory\. Tried to allocate (?P<size>[\d.]{1,12} ?[KMGT]i?B)",
               "CUDA out of memory while allocating {size}"),
            _p(r"CUDA out of memory|CUDA error: out of memory|Cuda failure 'out of memory'|"
               r"OutOfMemoryError",
               "CUDA out of memory"),
            # a CUDA runtime call's own words ("cudaFuncSetAttribute(kernel_entry, ...): out of
            # memory"), as a library that calls CUDA itself reports them
            _p(r"(?P<call>cuda[A-Z]\w{2,60})\([^\n]{0,400}\): out of memory",
               "the CUDA call {call} failed with out of memory (GPU memory full; from "
               "cudaFuncSetAttribute, a kernel asked for more shared memory than this GPU has)"),
            _p(r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED",
               "cuBLAS/cuDNN could not allocate its workspace (GPU memory full)"),
        ),
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a "
        "total capacity of 79.19 GiB of which 1.21 GiB is free.",
    ),
    Rule(
        "IllegalMemoryAccess", Layer.MODEL, ORIGIN,
        "a kernel read or wrote outside its memory: rerun with `CUDA_LAUNCH_BLOCKING=1` to see "
        "the failing op (or under `compute-sanitizer`); check indices/custom kernels; if `dmesg` "
        "shows Xid 48/79 instead of 13/31/43 it is the hardware, drain the node",
        (
            _p(r"an illegal memory access was encountered",
               "a CUDA kernel made an illegal memory access"),
            _p(r"misaligned address", "a CUDA kernel made a misaligned memory access"),
            # ROCm's runtime's words for the same on an AMD GPU
            _p(r"Memory access fault by GPU node-(?P<node>\d{1,5})",
               "a kernel on the AMD GPU (ROCm node {node}) made an illegal memory access"),
            _p(r"an illegal instruction was encountered",
               "a CUDA kernel executed an illegal instruction"),
            _p(r"unspecified launch failure",
               "a CUDA kernel failed (unspecified launch failure: a kernel fault, or the GPU; "
               "read the Xid in `dmesg`)"),
        ),
        "RuntimeError: CUDA error: an illegal memory access was encountered",
    ),
    Rule(
        "DeviceMismatch", Layer.MODEL, ORIGIN,
        "derive every device from LOCAL_RANK (`device = torch.device('cuda', local_rank)`), call "
        "`torch.cuda.set_device(local_rank)` before creating any tensor, move the model before "
        "wrapping it in DDP and move each batch with `.to(device)`; never hard-code cuda:0 "
        "(https://pytorch.org/docs/stable/notes/ddp.html)",
        (
            _p(r"Expected all tensors to be on the same device",
               "an op got tensors on different devices"),
            # FSDP's and DDP's check that the module they wrap lives on one device: part of the
            # model is still on the CPU (or on another GPU) when it is wrapped
            _p(r"FSDP only supports single device modules,? but got params on (?P<devs>\{[^\n]"
               r"{1,200}?\})",
               "FSDP was given a module whose parameters are on several devices {devs}: move the "
               "whole model to the rank's GPU (or pass device_id) before wrapping it"),
            _p(r"must be on the same type of devices, but input module parameters locate in "
               r"(?P<devs>\{[^\n]{1,200}?\})",
               "DDP was given a module whose parameters are on several kinds of device {devs}"),
            # FSDP's CPU offload given a module the job already moved to a GPU (torch's words;
            # fairscale's is the bare assert below, read from its frame)
            _p(r"An FSDP-managed module with parameter CPU offloading enabled has parameters on "
               r"(?P<dev>cuda:\d{1,4})",
               "FSDP's CPU offload was given a module already on {dev}: leave the module on "
               "the CPU (no `.cuda()` / `.to(device)` before wrapping) and pass `device_id`"),
            # an index tensor (embedding lookup, fancy indexing) on another GPU than the tensor
            # it indexes, and an RNN's input and weights apart
            _p(r"indices should be either on cpu or on the same device as the indexed tensor "
               r"\((?P<dev>cuda:\d{1,4}|cpu)\)",
               "an index tensor is on another device than the tensor it indexes (on {dev}): a "
               "model or buffer left on one GPU while the rank's inputs are on its own"),
            _p(r"Input and parameter tensors are not at the same device, found input tensor at "
               r"(?P<inp>cuda:\d{1,4}|cpu) and parameter tensor at (?P<par>cuda:\d{1,4}|cpu)",
               "a layer's input is on {inp} and its weights on {par}"),
            _p(r"expected input to be on (?P<want>cuda|cpu)\b",
               "an op expected its input on {want} and got it elsewhere"),
            # torch 1.x's words for the same
            _p(r"Expected object of backend (?P<want>CUDA|CPU) but got backend (?P<got>CUDA|CPU) "
               r"for argument #\d{1,3} '(?P<arg>\w{1,40})'",
               "an op expected its argument {arg} on the {want} and got it on the {got}"),
            # the optimizers' foreach grouping: a parameter's grad or state on another device
            _p(r"Tensors of the same index must be on the same device and the same dtype",
               "the optimizer found a parameter's gradient or state on another device or dtype "
               "than the parameter (a model moved after the optimizer was built, optimizer "
               "state loaded onto another device, or FSDP gradients accumulated outside "
               "no_sync)"),
            # torch 1.x's words
            _p(r"Tensor for argument #\d{1,3} '(?P<arg>\w{1,40})' is on (?P<got>CPU|GPU), but "
               r"expected it to be on (?P<want>CPU|GPU)",
               "an op expected its argument {arg} on the {want} and got it on the {got}"),
            # torch 1.x's check of an op's output against its inputs
            _p(r"to have the same device as tensor for argument #\d{1,3} '(?P<arg>\w{1,40})'; "
               r"but device (?P<x>\d{1,4}) does not equal (?P<y>\d{1,4})",
               "an op got tensors on two GPUs ({arg} on GPU {y}, another on GPU {x})"),
            _p(r"expected device (?P<want>cuda:\d{1,4}|cpu) but got device "
               r"(?P<got>cuda:\d{1,4}|cpu)",
               "an op expected {want} but got a tensor on {got}"),
            _p(r"Expected object of device type (?P<want>\w{1,10}) but got device type "
               r"(?P<got>\w{1,10})",
               "an op expected a {want} tensor but got a {got} one"),
            # a layer's input and weights on different devices (the dtype case is the job's
            # mixed precision: ScriptException)
            _p(r"Input type \(torch\.cuda\.\w{1,40}\) and weight type \(torch\.(?!cuda)\w{1,40}\)"
               r"|Input type \(torch\.(?!cuda)\w{1,40}\) and weight type \(torch\.cuda\.\w{1,40}\)",
               "a layer's input and its weights are on different devices (one on the GPU, one "
               "on the CPU)"),
            _p(r"Tensors must be CUDA and dense|No backend type associated with device type cpu",
               "a CPU tensor was passed to an NCCL collective"),
            _p(r"module must have its parameters and buffers on device (?P<want>cuda:\d{1,4})",
               "the model is not on {want}, the device DataParallel/DDP was given"),
            _p(r"device_ids and output_device arguments only work with single-device",
               "DDP got device_ids for a model that is not on that GPU (move it with "
               "`.to(local_rank)` before wrapping)"),
            # accelerate / Trainer with a model loaded by device_map="auto" or in 8 bit
            _p(r"You can't train a model that has been loaded (?:in 8-bit precision on a "
               r"different device|with `?device_map='auto'`? in any distributed mode)",
               "a model spread over GPUs by device_map (or loaded in 8 bit elsewhere) cannot "
               "be trained with one process per GPU: load it with "
               "device_map={{'': local_rank}}"),
        ),
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cuda:1!",
        frames=(
            # fairscale's FSDP with cpu_offload=True and the model already on the GPU
            _f("_init_param_attributes",
               r"assert p\._fp32_shard\.device == torch\.device\(\"cpu\"\)",
               "fairscale's FSDP with cpu_offload found a parameter on the GPU: leave the model "
               "on the CPU before wrapping it (from the traceback's frames)"),
        ),
    ),
    Rule(
        "UnusedParameters", Layer.MODEL, ORIGIN,
        "some parameters got no gradient this iteration: find them with "
        "`TORCH_DISTRIBUTED_DEBUG=DETAIL` (it names them), then make every parameter take part "
        "in the loss or move the unused part out of the DDP-wrapped module; "
        "`DDP(..., find_unused_parameters=True)` works but slows every step; "
        "move the model to the GPU before wrapping it in DDP "
        "(https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html)",
        (
            # DDP's reducer given no gradient for a sparse parameter (find_unused_parameters
            # does not cover sparse ones)
            _p(r"Expected sparse gradient to be defined",
               "DDP got no gradient for a sparse parameter (an embedding with sparse=True that "
               "took no part in this step's loss; find_unused_parameters does not cover sparse "
               "parameters): make it take part, e.g. add 0 * its output to the loss"),
            _p(r"Expected to have finished reduction in the prior iteration",
               "DDP finished an iteration without gradients for every parameter (unused "
               "parameters)"),
            _p(r"Parameter indices which did not receive grad for rank (?P<rank>\d{1,7}): "
               r"(?P<idx>[\d ]{1,200})",
               "rank {rank}: parameters {idx} received no gradient"),
            # TORCH_DISTRIBUTED_DEBUG's list of names, posted without the sentence above it
            _p(r"Parameters which did not receive grad for rank (?P<rank>\d{1,7})",
               "rank {rank}: parameters received no gradient (DDP lists them by name)"),
        ),
        "RuntimeError: Expected to have finished reduction in the prior iteration before "
        "starting a new one. This error indicates that your module has parameters that were not "
        "used in producing loss.",
    ),
    Rule(
        "DataLoaderWorkerDied", Layer.DATA, ORIGIN,
        "a DataLoader worker process died: if it was SIGKILL check the host's memory (`dmesg | "
        "grep -i oom`) and lower num_workers / prefetch_factor; run once with num_workers=0 to "
        "see the real exception of the dataset code",
        (
            _p(r"DataLoader worker \(pid\(?s?\)? ?[\d, ]{1,60}\) (?:exited unexpectedly|is killed "
               r"by signal: (?:Killed|Segmentation fault|Aborted))",
               "a DataLoader worker process died"),
        ),
        "RuntimeError: DataLoader worker (pid(s) 51234) exited unexpectedly",
    ),
    Rule(
        "HostOutOfMemory", Layer.ENVIRONMENT, ORIGIN,
        "the host (or the job's memory limit) ran out of memory: the kernel killed a rank or "
        "an allocation failed; "
        "see `dmesg -T | grep -i -E 'killed process|out of memory'`, `sacct -j JOB -o MaxRSS`, "
        "`kubectl describe pod` (OOMKilled); lower host memory per rank: fewer DataLoader "
        "num_workers / prefetch_factor, no pin_memory on a full host, load the checkpoint with "
        "`map_location` and `mmap=True` or rank by rank, raise the job's memory limit "
        "(`--mem`, the pod's limits)",
        (
            _p(r"Memory cgroup out of memory: Kill(?:ed)? process (?P<pid>\d{1,10}) "
               r"\((?P<comm>[^)\n]{1,64})\)",
               "the memory cgroup (a job or container memory limit) killed process {pid} "
               "({comm})"),
            _p(r"Out of memory: Kill(?:ed)? process (?P<pid>\d{1,10}) \((?P<comm>[^)\n]{1,64})\)",
               "the kernel's OOM killer killed process {pid} ({comm})"),
            _p(r"Killed process (?P<pid>\d{1,10}) \((?P<comm>[^)\n]{1,64})\) total-vm",
               "the kernel's OOM killer killed process {pid} ({comm})"),
            _p(r"srun: error: (?P<host>[\w.-]{1,253}): tasks? (?P<tasks>[\d,-]{1,60}): Out Of "
               r"Memory", "srun task {tasks} on {host} ran out of memory (its cgroup limit)"),
            _p(r"oom-kill:constraint=(?P<c>CONSTRAINT_[A-Z]{1,20})",
               "the kernel's OOM killer acted ({c})"),
            _p(r"Detected (?P<n>\d{1,6}) oom[_-]kill events?",
               "Slurm saw {n} oom-kill event(s) in the job step (its cgroup memory limit)"),
            _p(r"\bOOMKilled\b", "the container was OOMKilled (its memory limit)"),
            # torch's CPU allocator (a checkpoint loaded whole on every rank, a large batch)
            _p(r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to "
               r"allocate (?P<n>\d{1,20}) bytes",
               "torch could not allocate {n} bytes of host memory"),
            _p(r"The node was low on resource: memory",
               "Kubernetes evicted the pod: the node was low on memory"),
            # DeepSpeed's see_memory_usage: evidence for a SIGKILL, not a failure by itself
            _p(r"CPU Virtual Memory: {0,4}used = (?P<used>[\d.]{1,12} ?GB), percent = "
               r"(?P<pct>(?:8\d|9\d|100)(?:\.\d{1,3})?)%",
               "host memory was at {pct}% ({used} used) in the launcher's memory report",
               only_with="RankKilled"),
        ),
        "Out of memory: Killed process 48213 (python) total-vm:412331628kB, "
        "anon-rss:250112412kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:493512kB",
    ),
)

_LATER: tuple[Rule, ...] = (
    Rule(
        "RankKilled", Layer.ENVIRONMENT, KILLED,
        "SIGKILL (-9): the kernel's OOM killer or the scheduler (memory limit, time limit, "
        "preemption) killed the rank: `dmesg -T | grep -i -E 'killed process|out of memory'` or "
        "`journalctl -k`, the job's memory accounting (`sacct -j JOB -o MaxRSS`, `kubectl "
        "describe pod`: OOMKilled); lower host memory use (DataLoader num_workers, "
        "pin_memory, loading the checkpoint on every rank at once). SIGSEGV (-11), SIGABRT (-6), "
        "SIGBUS (-7): the rank crashed: read that rank's last lines (a native stack, a CUDA or "
        "NCCL abort; SIGBUS is often a full /dev/shm), rerun with `PYTHONFAULTHANDLER=1`. "
        "SIGTERM (-15) / SIGINT: something stopped it from outside (scheduler time limit, "
        "preemption, torchrun after another rank failed). torchrun itself stopped by a signal "
        "(\"Received 15 death signal\", \"SignalException ... got signal\"): the job was stopped "
        "from outside (`sacct -j JOB -o State,Elapsed,Timelimit`, `kubectl describe pod`; "
        "SIGHUP: the ssh session closed, use tmux / nohup); if it had hung before that, rerun "
        "with the flight recorder on (`TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
        "TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_`; torch < 2.8: `TORCH_NCCL_TRACE_BUFFER_SIZE`) "
        "and a process-group timeout shorter than the job's limit, then `preflight explain "
        "/shared/fr/` names the rank that did not join",
        (
            _p(r"failed \(exitcode: -(?P<sig>\d{1,2})\) local_rank: (?P<local>\d{1,7})",
               "local rank {local} was killed by {name}: {hint}"),
            _p(r"Signal (?P<sig>\d{1,2}) \((?P<name>SIG[A-Z]{2,8})\) received by PID "
               r"(?P<pid>\d{1,10})",
               "{who} was killed by {name}: {hint}"),
            _p(r"exitcode\s{0,8}: -(?P<sig>\d{1,2}) \(pid: (?P<pid>\d{1,10})\)",
               "{who} was killed by {name}: {hint}"),
            _p(r"process (?P<rank>\d{1,7}) terminated with signal (?P<name>SIG[A-Z]{2,8})",
               "process {rank} (mp.spawn) was killed by {name}: {hint}"),
            # torch.distributed.launch (1.x), accelerate and DeepSpeed run their workers with
            # subprocess: CalledProcessError "... died with <Signals.SIGKILL: 9>."
            _p(r"died with <Signals\.(?P<name>SIG[A-Z]{2,8}): (?P<sig>\d{1,2})>",
               "a process the launcher started was killed by {name}: {hint}"),
            # DeepSpeed's launcher: "[launch.py:...:sigkill_handler] [...] exits with return
            # code = -9"
            _p(r"exits with return code = -(?P<sig>\d{1,2})\b",
               "a rank DeepSpeed's launcher started was killed by {name}: {hint}"),
            # DeepSpeed's launcher (and torch.distributed.launch 1.x) stopping the other ranks once
            # one ended: "[launch.py:318:sigkill_handler] Killing subprocess 94984". How that
            # rank ended is in another line (its return code); on its own this is the end of
            # the job, the cause only when nothing else is found
            _p(r"Killing subprocess (?P<pid>\d{1,10})",
               "the launcher stopped its ranks after one of them ended ({who} among them): the "
               "rank that ended first says why; a host memory report near 100 % before it "
               "points at the OOM killer", last=True),
            # Lightning's process observer: "Child process with PID 12 terminated with code -9"
            _p(r"Child process with PID (?P<pid>\d{1,10}) terminated with code -(?P<sig>\d{1,2})",
               "{who} (Lightning) was killed by {name}: {hint}"),
            # srun: "srun: error: node01: task 3: Killed", "tasks 0-3: Segmentation fault"
            _p(r"srun: error: (?P<host>[\w.-]{1,253}): tasks? (?P<tasks>[\d,-]{1,60}): "
               r"(?P<word>Killed|Segmentation fault|Aborted|Bus error|Terminated)",
               "srun task {tasks} on {host} was killed by {name}: {hint}"),
            # the shell's job control ("line 28:  8156 Killed   python3 main.py") and an IDE's
            # "exit code 137 (interrupted by signal 9: SIGKILL)"
            _p(r"(?P<pid>\d{1,10}) Killed\s{1,40}(?:python|torchrun|deepspeed|accelerate)",
               "{who} was killed by SIGKILL (the shell says Killed): likely the host's OOM killer "
               "or the scheduler (check `dmesg` / `journalctl -k`)"),
            # ... and its words for a crash ("line 20: 98765 Segmentation fault      (core
            # dumped) python train.py"), or the bare words of an interactive shell
            _p(r"(?P<pid>\d{1,10}) (?P<word>Segmentation fault|Aborted|Bus error)"
               r"(?:\s{1,30}\(core dumped\))?\s{1,40}(?:python|torchrun|deepspeed|accelerate)",
               "{who} ended with {name} (the shell says {word}): {hint}"),
            _p(r"^\s{0,8}(?P<word>Segmentation fault|Aborted|Bus error)(?:\s{1,12}"
               r"\(core dumped\))?\s{0,4}$",
               "a process ended with {name} (the shell says {word}): {hint}", last=True),
            # the shell's bare "Killed": the cause when nothing else is found, after everything
            # else when something is (a launcher that ended its own processes prints it too)
            _p(r"^\s{0,8}Killed\s{0,4}$",
               "a process was killed by SIGKILL (the shell says Killed): likely the host's OOM "
               "killer or the scheduler (check `dmesg` / `journalctl -k`)", last=True),
            _p(r"exit code 137 \(interrupted by signal (?P<sig>\d{1,2}): ?"
               r"(?P<name>SIG[A-Z]{2,8})\)",
               "the process was killed by {name}: {hint}"),
            # Slurm itself ended the job or step: a stop from outside, like torchrun's own
            _p(r"\*\*\* (?:JOB|STEP) (?P<job>[\d.]{1,30}) ON (?P<host>\S{1,253}) CANCELLED AT "
               r"\S{1,40} DUE TO (?P<why>TIME LIMIT|PREEMPTION)",
               "Slurm cancelled job {job} on {host} due to {why}: the job was stopped from "
               "outside", last=True),
            # a node of the job failed (Slurm lost contact with it): the node's trouble, not
            # the job's; srun names the node that failed, slurmstepd the node it ran on
            _p(r"srun: error: Node failure on (?P<host>[\w.-]{1,253})",
               "Slurm lost the node {host} (node failure) and ended the job's step: the node, "
               "not the job, stopped it; `scontrol show node {host}` (State, Reason) and "
               "slurmctld's log say why; drain it and rerun on other nodes", last=True),
            _p(r"\*\*\* (?:JOB|STEP) (?P<job>[\d.]{1,30}) ON (?P<host>\S{1,253}) CANCELLED AT "
               r"\S{1,40} DUE TO NODE FAILURE",
               "Slurm cancelled job {job} on {host} because a node of the job failed: the "
               "node, not the job, stopped it (srun's `Node failure on` line names it; "
               "`scontrol show node`, slurmctld's log)", last=True),
            # torchrun (the elastic agent) itself stopped by a signal, every torch 2.x: "Received
            # 15 death signal, shutting down workers" and "SignalException: Process PID got
            # signal: 15". Nothing in the job failed by itself: a time limit, preemption,
            # `timeout`, a closed ssh session; often the end of a hang.
            # torch 2.4+ names the signal ("Received Signals.SIGTERM death signal"), earlier
            # torch its number
            _p(r"Received (?:(?P<sig>\d{1,2})|Signals\.(?P<name>SIG[A-Z]{2,8})) death signal, "
               r"shutting down workers",
               _LAUNCHER, last=True),
            _p(r"SignalException: Process (?P<pid>\d{1,10}) got signal: (?P<sig>\d{1,2})",
               _LAUNCHER, last=True),
        ),
        "E1129 10:12:58.835000 803 torch/distributed/elastic/multiprocessing/api.py:986] failed "
        "(exitcode: -9) local_rank: 1 (pid: 825) of binary: /opt/torch/.venv/bin/python",
        hook=Hook.SIGNAL,
    ),
    Rule(
        "NcclSystemError", Layer.COMMUNICATION, WRAPPER,
        "read the NCCL WARN line and the 'Last error:' detail above it; rerun with "
        "`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET` to see the interface and transport NCCL "
        "picked; usual causes: wrong NCCL_SOCKET_IFNAME, a firewall between nodes, a full "
        "/dev/shm, an IB port down; to isolate, run the same code with backend='gloo' "
        "(docs/explain.md) and `preflight check` on every node",
        (
            _p(r"unhandled system error|ncclSystemError",
               "NCCL reported a system error (a socket, shared memory or device call failed)",
               follow=2),
            _p(r"ncclInternalError|internal error - please report this issue to the NCCL|"
               r"NCCL (?:error in: [^\n]{1,300}, |Error 3: )internal error",
               "NCCL reported an internal error", follow=2),
            _p(r"ncclUnhandledCudaError|unhandled cuda error",
               "NCCL reported a CUDA call failure", follow=2),
            _p(r"NCCL WARN Cuda failure (?:\d{1,4} )?'(?P<what>[^'\n]{1,80})'",
               "an NCCL call to CUDA failed: {what}"),
            _p(r"ncclInvalidUsage|invalid usage \(run with NCCL_DEBUG|"
               r"NCCL error in: [^\n]{1,300}, invalid usage",
               "NCCL reported invalid usage", follow=2),
            _p(r"ncclInvalidArgument|invalid argument \(run with NCCL_DEBUG",
               "NCCL reported an invalid argument", follow=2),
            # torch 1.x: "NCCL Error 5: invalid usage", "NCCL Error 4: invalid argument"
            _p(r"NCCL Error \d{1,2}: (?P<what>invalid usage|invalid argument|remote error)",
               "NCCL reported {what}", follow=2),
        ),
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "NCCLUtils.hpp:317, unhandled system error (run with NCCL_DEBUG=INFO for details), "
        "NCCL version 2.21.5",
        hook=Hook.NCCL_DETAIL,
        generic=True,
    ),
    Rule(
        "RendezvousClosed", Layer.ENVIRONMENT, SYMPTOM,
        "the elastic rendezvous was closed by another node's agent (it failed, or finished, or "
        "ran out of restarts): read the other nodes' logs for the first failure and fix that; "
        "every node must run the same `--rdzv_id` and `--max_restarts`",
        (
            _p(r"RendezvousClosedError", "torchelastic's rendezvous was closed by another node"),
            _p(r"has failed to shutdown the rendezvous",
               "torchelastic could not shut the rendezvous down as the run ended (the store "
               "was already gone): a consequence of how the run ended"),
        ),
        "torch.distributed.elastic.rendezvous.api.RendezvousClosedError",
        progress=False,
    ),
    Rule(
        "RendezvousTimeout", Layer.ENVIRONMENT, WRAPPER,
        "the ranks never met: every node needs the same MASTER_ADDR and MASTER_PORT, the master "
        "must be reachable (`nc -zv $MASTER_ADDR $MASTER_PORT` from each node, open the port in "
        "the firewall), and all --nnodes nodes must start; pin the interface with "
        "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME on multi-homed hosts "
        "(https://pytorch.org/docs/stable/distributed.html#common-environment-variables)",
        (
            _p(r"Timed out after (?P<s>\d{1,9}) seconds waiting for clients\. "
               r"(?P<n>\d{1,7})/(?P<w>\d{1,7}) clients joined",
               "the store on MASTER_ADDR waited {s} s but only {n} of {w} ranks joined"),
            # the same message wrapped (a terminal's width, a paste) before its count
            _p(r"Timed out after (?P<s>\d{1,9}) seconds waiting for clients\.\s{0,4}$",
               "the store on MASTER_ADDR waited {s} s and not every rank joined"),
            _p(r"client socket has timed out after (?P<t>\d{1,12}m?s) while trying to connect "
               r"to \((?P<host>[^,\n]{1,255}), (?P<port>\d{1,5})\)",
               "a rank could not connect to the store at {host}:{port} within {t}"),
            _p(r"(?i:timed out initializing process group in store based barrier)"
               r"(?: on rank:? (?P<rank>\d{1,7}))?",
               "the ranks did not all reach the store-based barrier of init_process_group "
               "(torch 1.x)"),
            _p(r"client socket has timed out after (?P<t>\d{1,12}m?s) while trying to connect",
               "a rank could not connect to the store (MASTER_ADDR:MASTER_PORT) within {t}"),
            _p(r"\[c10d\] The client socket has timed out after (?P<t>\d{1,12}m?s)",
               "a rank could not connect to the store (MASTER_ADDR:MASTER_PORT) within {t}"),
            # (not c10d's warning that the IPv6 loopback could not be used, "[W socket.cpp:663]
            # ... to [localhost]:29500 (errno: 99 - Cannot assign requested address).", which a
            # run that goes on to train prints)
            _p(r"^(?!(?:\[rank\d{1,7}\]:)?\[W[\d ][^\n]{0,300}errno: 99 - Cannot assign)"
               r"[^\n]{0,300}?"
               r"client socket has failed to connect to (?:any network address of )?"
               r"(?P<addr>\([^()\n]{1,120}\)|\[[^\]\n]{1,255}\]:\d{1,5}|[^\n]{1,120}?)"
               r"(?: \((?:errno|system error): (?P<errno>\d{1,5}) - (?P<why>[^)\n]{1,80})\)|"
               r"\.|$)",
               "a rank could not connect to the store at {addr}"),
            # (not c10d's warning that a host has no IPv6 address, which healthy runs print:
            # "The IPv6 network addresses of (node01, 29500) cannot be retrieved (gai error: -3
            # - Temporary failure in name resolution)"), nor an HTTP client's (urllib3,
            # requests: a download from a model hub or a logging service on a node without
            # internet; the rendezvous never goes through them)
            _p(r"^(?![^\n]{0,300}The IPv6 network addresses of )"
               r"(?![^\n]{0,3000}(?:HTTPS?ConnectionPool|NameResolutionError|urllib3|"
               r"requests\.exceptions))[^\n]{0,3000}?"
               r"(?:Name or service not known|Temporary failure in name resolution|nodename nor "
               r"servname provided|No address associated with hostname)",
               "a host name (MASTER_ADDR or --rdzv_endpoint) could not be resolved"),
            _p(r"wait timeout after (?P<t>\d{1,12})ms, keys:",
               "a rank waited {t} ms for the other ranks' keys in the store"),
            _p(r"connect\(\) timed out\. Original timeout was (?P<ms>\d{1,12}) ms",
               "a rank could not connect to the store within {ms} ms"),
            _p(r"RendezvousConnectionError|[Tt]he connection to the C10d store has failed",
               "torchelastic could not reach the c10d rendezvous store (--rdzv_endpoint)"),
            _p(r"RendezvousTimeoutError|[Rr]endezvous[^\n]{0,120}timed out|"
               r"Initialization timed out|"
               r"connectFullMesh failed(?![^\n]{0,80}(?:Connection refused|\] no error))",
               "the rendezvous (store or gloo connect) timed out"),
            # the store's and gloo's bare socket errors: while the ranks meet (init, the first
            # store access) they are the rendezvous; raised from a collective, a collective
            # that timed out or a peer that went away
            _p(r"Socket Timeout",
               "the rendezvous (store or gloo connect) timed out",
               in_collective=("CollectiveTimeout",
                              "{op} timed out in the store or gloo's transport (Socket Timeout): "
                              "a rank did not join it")),
            _p(r"(?:RuntimeError|DistNetworkError|DistStoreError|Error): (?P<why>No route to host|"
               r"Connection refused|Connection timed out|Network is unreachable)\s{0,4}$",
               "a rank could not reach the store or a peer while the ranks met: {why}",
               in_collective=("PeerConnectionLost",
                              "a peer could not be reached during {op}: {why}")),
        ),
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
        "3/4 clients joined.",
        frames=(
            _f("_create_tcp_store", r"\bTCPStore\(",
               "torchelastic's c10d rendezvous store at --rdzv_endpoint could not be created or "
               "reached (from the traceback's frames)"),
            _f("_create_c10d_store", r"\bTCPStore\(",
               "the TCPStore at MASTER_ADDR:MASTER_PORT could not be created or reached (from "
               "the traceback's frames)"),
            _f("init_process_group", r"next\(\s{0,4}rendezvous_iterator",
               "init_process_group failed in its rendezvous (from the traceback's frames)"),
            _f("next_rendezvous", r"\S",
               "torchelastic's rendezvous of the nodes failed (from the traceback's frames)"),
            _f("_store_based_barrier", r"\S",
               "the ranks did not all reach init_process_group's store-based barrier (from the "
               "traceback's frames)"),
        ),
        progress=False,
    ),
    Rule(
        "NcclConnectFailed", Layer.COMMUNICATION, WRAPPER,
        "a rank could not open NCCL's TCP connection to a peer (bootstrap or proxy): the address "
        "in the message must be the peer node's data NIC (`ip -br addr` there; pin it with "
        "`NCCL_SOCKET_IFNAME`, e.g. `=eth0`, on every node), the peer must be reachable "
        "(`ping`, `nc -zv ADDR PORT`; a firewall must let the nodes reach each other on any TCP "
        "port, NCCL listens on ephemeral ports) and alive: if a finding above says the peer "
        "died first, fix that (NCCL troubleshooting guide, section Networking issues)",
        (
            _p(r"Connect to (?P<peer>\S{1,80}) failed ?: (?P<why>[A-Za-z][A-Za-z ]{2,60})",
               "NCCL could not connect to {peer}: {why}"),
            _p(r"Call to connect failed ?: (?P<why>[A-Za-z][A-Za-z ]{2,60})",
               "NCCL could not connect to a peer: {why}"),
            _p(r"Call to connect returned (?P<why>[A-Za-z][A-Za-z ]{2,60}), retrying",
               "NCCL's connect was refused or timed out and is retrying: {why}"),
            # gloo's own TCP connect to a peer ("pair.cc:799] connect [10.0.0.2]:29591:
            # Connection refused"; the address may be on the next line)
            _p(r"gloo/transport/tcp/pair\.cc:\d{1,6}\] connect(?: \[?(?P<peer>[^\]\s]{1,80})\]?:"
               r"(?P<port>\d{1,5}): (?P<why>[A-Z][A-Za-z ]{2,40}))?",
               "gloo could not open its TCP connection to a peer", follow=1),
            # gloo's full-mesh connect refused by a peer (a 127.x address there: the host
            # name resolves to loopback in /etc/hosts, so gloo listens on lo)
            _p(r"connectFullMesh failed[^\n]{0,80}?Connection refused, remote="
               r"\[(?P<peer>[^\]\s]{1,80})\]:(?P<port>\d{1,5})",
               "gloo's connection to a peer ({peer}:{port}) was refused (a 127.x address means "
               "a host name resolves to loopback in /etc/hosts: fix it, or set "
               "GLOO_SOCKET_IFNAME to the data NIC)"),
            _p(r"connectFullMesh failed[^\n]{0,80}?Connection refused",
               "gloo's connection to a peer was refused"),
            # the ranks met in the store and swapped addresses, but gloo's pairs did not
            # connect (gloo's words: "[.../pair.cc:144] no error"): a published address this
            # rank cannot reach, most often gloo picking another interface than the data NIC
            _p(r"connectFullMesh failed[^\n]{0,120}?\] no error",
               "gloo's connections to its peers failed after the ranks met (\"no error\": an "
               "address a peer published is not reachable from here; set GLOO_SOCKET_IFNAME to "
               "the data NIC on every node)"),
            _p(r"socketPollConnect[^\n]{0,160}?(?P<why>Connection timed out|Connection refused|"
               r"No route to host)",
               "NCCL's connect to a peer failed: {why}"),
            # NCCL >= 2.19 gives up retrying a refused or timed-out connect
            _p(r"socketStartConnect: exceeded retries \((?P<n>\d{1,9})\)",
               "NCCL gave up connecting to a peer after {n} retries"),
        ),
        "node01:4102:4190 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
        "10.1.0.12<43211> failed : Connection refused",
    ),
    Rule(
        "CollectiveTimeout", Layer.COMMUNICATION, SYMPTOM,
        "a collective waited past the process-group timeout: the ranks that did NOT time out (or "
        "stopped printing first) are the suspects, look at their log and GPU; rerun with "
        "`NCCL_DEBUG=INFO` and the flight recorder (`TORCH_FR_BUFFER_SIZE=2000 "
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_`; torch < 2.8: "
        "`TORCH_NCCL_TRACE_BUFFER_SIZE`), then `preflight explain /shared/fr/`; raise "
        "init_process_group(timeout=timedelta(minutes=60)) only once you know the step is slow, "
        "not dead "
        "(https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group)",
        (
            _p(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d{1,20}),"
               r" OpType=(?P<op>\w{1,40})[^\n]{0,400}?Timeout\(ms\)=(?P<ms>\d{1,12})\)",
               "the NCCL watchdog aborted {op} SeqNum={seq} after its {ms} ms timeout"),
            # the work's own words, for a paste that broke the line above them ("Watchdog
            # caught collective" / "operation timeout: WorkNCCL(...) ran for ...")
            _p(r"WorkNCCL\(SeqNum=(?P<seq>\d{1,20}), OpType=(?P<op>\w{1,40})[^\n]{0,400}?"
               r"Timeout\(ms\)=(?P<ms>\d{1,12})\) ran for \d{1,15} milliseconds before timing out",
               "the NCCL watchdog aborted {op} SeqNum={seq} after its {ms} ms timeout"),
            # torch 2.5+'s heartbeat monitor on the rank that timed out
            _p(r"Received a dump signal due to a collective timeout from this local rank and we "
               r"will try our best to dump the debug info\. Last enqueued NCCL work: "
               r"(?P<enq>\d{1,20}), last completed NCCL work: (?P<done>\d{1,20})",
               "a collective timed out on this rank: the last NCCL work enqueued is {enq}, the "
               "last completed {done}"),
            _p(r"Received a dump signal due to a collective timeout from this local rank",
               "a collective timed out on this rank; ProcessGroupNCCL dumps its debug info"),
            # the same monitor on every other rank, naming the rank that timed out (the
            # printer did not: the finding's rank is the one named)
            _p(r"Received a dump signal due to a collective timeout from\s{1,3}rank "
               r"(?P<rank>\d{1,7})",
               "a collective timed out on one rank; the others received its dump signal",
               names_rank=True),
            _p(r"Heartbeat monitor timed out",
               "ProcessGroupNCCL's heartbeat monitor timed out (the watchdog hung in an NCCL "
               "call)"),
            _p(r"watchdog got stuck for (?P<s>\d{1,9}) seconds",
               "the ProcessGroupNCCL watchdog made no progress for {s} s (an NCCL call hangs)"),
            _p(r"Watchdog caught collective operation timeout",
               "the NCCL watchdog aborted a collective after its timeout"),
            # the stack the watchdog's timeout exception prints (a paste may hold only that)
            _p(r"WorkNCCL::checkTimeout|Exception raised from checkTimeout",
               "the NCCL watchdog's timeout check raised (the stack of a collective timeout)"),
            _p(r"Timed out waiting (?P<ms>\d{1,12})ms for (?:recv|send) operation",
               "a gloo collective timed out after {ms} ms"),
            _p(r"failed to pass monitoredBarrier", "ranks failed to reach a monitored barrier"),
        ),
        "[rank0]:[E1129 10:42:17.118263522 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=4127, OpType=ALLREDUCE, NumelIn=2359296, "
        "NumelOut=2359296, Timeout(ms)=600000) ran for 600046 milliseconds before timing out.",
        hook=Hook.WATCHDOG,
    ),
    Rule(
        "PeerConnectionLost", Layer.COMMUNICATION, SYMPTOM,
        "a peer process went away: this is a consequence, look for the first rank that failed "
        "(the findings above, torchrun's 'Root Cause' block) and fix that",
        (
            _p(r"ncclRemoteError|remote process exited", "NCCL lost a remote peer",
               follow=2),
            _p(r"Broken pipe|Connection reset by peer|Connection closed by (?:remote )?peer",
               "a connection to another rank or the store broke (peer gone)"),
        ),
        "[rank1]:[E1129 10:42:18.004120811 ProcessGroupNCCL.cpp:1684] [PG ID 0 PG GUID 0"
        "(default_pg) Rank 1] Process group watchdog thread terminated with exception: "
        "Connection reset by peer",
    ),
)

#: Every rule, in the order a line is tried (the first that matches names it): the origins, then
#: the kills, wrappers and symptoms.
RULES: tuple[Rule, ...] = _FIRST + SETUP_RULES + _LATER

#: Substrings that every line a rule (or a rank fact) can match contains at least one of. The
#: classifier looks only at lines holding one of them (blocks.AnchorScan): almost every error
#: line holds "rror" (XxxError:, error) or NCCL's "WARN"; the detail lines NCCL puts around "Last
#: error:" are run through the rules by the classifier's detail window. With google-re2 one search
#: covers them all; without it each anchor costs one ``bytes.find`` pass over the block, a long
#: one less than a short one (the search skips by its length), so the anchors are as long as the
#: texts allow.
ANCHORS: tuple[bytes, ...] = (
    b"rror", b"WARN", b"imed out", b"imeout", b"already in use", b"peer", b"NVRM: Xid",
    b"fallen off the bus", b"ncclCommInitRank", b"global_world_sizes", b"(local_rank:",
    b"SOCKET_IFNAME set", b"exitcode", b"Connection refused",
    # c10d's own log line ("[E socket.cpp:610] [c10d] The client socket has failed to connect
    # to any network address of (host, port)."), which says neither error nor timeout
    b"failed to connect",
    # traceback frames (``File "...", line N, in f``) and the launchers' words for a kill or
    # the host's memory: srun's "Killed", the kernel's "Killed process", DeepSpeed's "Killing
    # subprocess", "return code" and memory report, Lightning's "terminated with code"
    # (Slurm's oom-kill and CANCELLED lines and subprocess's "<Signals." come with "error")
    b'", line ', b"Kill", b"return code", b"CPU Virtual Memory", b"terminated with",
    b"GPU is lost", b"SMI has failed", b"low on resource",
    # NCCL's own line for two ranks on one GPU, often pasted alone; the shells' and C
    # libraries' words for the open-files limit ("accept: Too many open files")
    b"Duplicate GPU", b"any open files",
    # pdsh's and ssh's words for a node the launcher could not log in to
    b"ssh exited with", b"Permission denied (publickey", b"verification failed",
    b"ssh: connect to host", b"ssh: Could not resolve",
    # lines of a failure that hold none of the words above (each anchor is a pass over every
    # block, about 2 % of the time: a phrasing seen once is not worth one)
    b"ommand not found", b"Assertion `", b"did not receive grad",
    # the POSIX shell's (dash's) "sh: 1: torchrun: not found"
    b": not found",
    # the dynamic loader's "version `GLIBCXX_3.4.29' not found (required by ...)" and Python's
    # "can't open file 'train.py': [Errno 2]", which hold none of the words above
    b"not found (required by", b"can't open file",
    # one pass for mp.spawn's "terminated with signal", torchrun's "closing signal" and its own
    # "Received 15 death signal" / "got signal: 15"
    b" signal",
    # the shell's words for a crashed process: "Segmentation fault", "Aborted (core dumped)"
    b"egmentation fault", b"core dumped)",
    # ROCm's runtime on an AMD GPU: "HW Exception by GPU node-N", "Memory access fault by GPU
    # node-N" (no "rror" in either)
    b"by GPU node-",
    # a logger's ERROR level ("ERROR 04-22 15:53:32 pynccl.py:44] Failed to load NCCL library
    # ..."), whose words may hold none of the above
    b"ERROR",
    # a library's exception class named ...Exception, not ...Error (Lightning's
    # "MisconfigurationException: You requested gpu: [0, 1]"): an exception line by its form
    b"xception: ",
)

BY_REASON: dict[str, Rule] = {r.reason: r for r in RULES}
#: The rule that takes an exception the job's own code raised (``Rule.job_frames``), if any.
JOB_EXCEPTION_RULE: Rule | None = next((r for r in RULES if r.job_frames), None)

#: Signal numbers torchrun prints as a negative exit code (``exitcode: -9``), and the likely
#: cause ``RankKilled`` names for each.
SIGNAL_NAMES: dict[int, str] = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT",
                                7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV",
                                13: "SIGPIPE", 15: "SIGTERM"}
#: A launcher's word for how a task ended (srun: "task 3: Killed").
SIGNAL_WORDS: dict[str, str] = {"Killed": "SIGKILL", "Segmentation fault": "SIGSEGV",
                                "Aborted": "SIGABRT", "Bus error": "SIGBUS",
                                "Terminated": "SIGTERM"}
SIGNAL_HINTS: dict[str, str] = {
    "SIGKILL": "likely the host's OOM killer or the scheduler (check `dmesg` / `journalctl -k`)",
    "SIGSEGV": "the rank crashed (look at that rank's last lines)",
    "SIGABRT": "the rank aborted (look at that rank's last lines: a CUDA or NCCL abort)",
    "SIGBUS": "the rank crashed on a bus error (often a full /dev/shm)",
    "SIGTERM": "something stopped it from outside (scheduler time limit or preemption)",
    "SIGINT": "it was interrupted (Ctrl-C or the scheduler)",
    "SIGHUP": "the terminal or ssh session that started it closed (use tmux, nohup or the "
              "scheduler)",
}

__all__ = ["ANCHORS", "BY_REASON", "JOB_EXCEPTION_RULE", "KILLED", "ORIGIN", "RULES",
           "SIGNAL_HINTS", "SIGNAL_NAMES", "SIGNAL_WORDS", "SYMPTOM", "WRAPPER", "Frame", "Hook",
           "Layer", "Pattern", "Rule"]
