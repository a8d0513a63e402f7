"""The GPU worker: one process per GPU (or per gloo rank on the CPU) that runs a plan.

A plan is a list of steps run in order in one process and one CUDA context: the per-GPU speed
measurements (``speed``), then the timed all-reduce (``allreduce``); ``preflight bench``,
``bench --gpu``, the ``gpu_speed`` and ``allreduce`` checks and ``preflight cluster`` give the
same worker different plans; ``preflight ddp`` gives it the DDP ladder's steps instead
(:mod:`.ddp`). The parent (:mod:`preflight.bench.parent`) starts
``PYTHON .../worker/start.py``, where PYTHON is the training environment's interpreter
(``--python``) or preflight's own.

Everything in this directory is standard library only at import time and runs on Python >= 3.8:
the training environment has none of preflight's dependencies, and its engines (torch, nccl4py,
cuda-bindings) are imported inside the steps. ``start.py`` loads this directory as a package of
its own name (``_preflight_worker``) and takes the directory off ``sys.path``, so the worker
imports nothing else from preflight's environment. The parent imports :mod:`.wire` and
:mod:`.engines` as ordinary modules: one definition of the messages, events and engine choice on
both sides.

Modules: ``wire`` (messages, progress pipe, heartbeat, death signal, control lines, the table of
iterations), ``engines`` (what an interpreter can import; the one choice of engine), ``main``
(the plan and its steps), ``cudadrv`` (CUDA driver API helpers, the PTX kernels of
``kernels.ptx``), ``speed`` (copy and matrix multiply engines), ``allreduce`` (the all-reduce
engines: nccl4py and torch; the torch rendezvous store), ``ddp`` (the field guide's minimal DDP
training as steps that report what they prove).
"""
