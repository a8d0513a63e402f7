"""``preflight ddp``: the field guide's minimal DDP run, and its ladder of one variable at a time.

The field guide's method (its sections 6.1 and 6.3): when a distributed job fails, run a minimal
DDP training script, then change one variable at a time: one GPU alone, then the gloo backend,
then every GPU of the node with NCCL, then several nodes. The step that fails first names the
layer: the environment (CUDA, the driver, the torch build), communication (the rendezvous,
gloo's sockets), NCCL, or the network between nodes; when every step passes, the node and the
launcher are fine and the model and data are next.

Modules: :mod:`.ladder` (the plan, the run through the GPU workers' machinery, the verdict),
:mod:`.proofs` (what each step proves, from what each rank reported: pure), :mod:`.verdict`
(the result, the layers, the table and JSON), :mod:`.check` (the ``ddp`` check of
``check --ddp`` and ``prolog --ddp``). The worker's side is
:mod:`preflight.bench.worker.ddp`; docs/ddp.md explains it all.
"""

from __future__ import annotations

from preflight.ddp.ladder import DdpUsageError, LadderPlan, plan, run, run_ladder
from preflight.ddp.verdict import LadderResult, StepResult, render_table

__all__ = ["DdpUsageError", "LadderPlan", "LadderResult", "StepResult", "plan", "render_table",
           "run", "run_ladder"]
