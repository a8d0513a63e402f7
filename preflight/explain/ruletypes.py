"""The shapes of ``preflight explain``'s rules: a Rule per reason, its Patterns (one line) and
Frames (a traceback frame), the Hook that says what its matches carry, and the cause-first tiers.

Plain data, no rules here: the catalogue is rules.py (the first rules written) and
rules_setup.py (set-up and API mistakes: driver, device, libraries, the scheduler's credentials,
DDP's checks), joined in ``rules.RULES``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Layer(str, enum.Enum):
    """Where a failure lives: environment, communication, data, model, plus hardware."""

    ENVIRONMENT = "environment"
    COMMUNICATION = "communication"
    DATA = "data"
    MODEL = "model"
    HARDWARE = "hardware"


@dataclass(frozen=True)
class Pattern:
    """One way a failure class shows up in a log.

    Attributes:
        regex: searched in one decoded line.
        message: ``str.format`` template over the regex's named groups (all must be in the regex
            and always participate in a match).
        layer: overrides the rule's layer for this pattern (``ShmExhausted`` is communication for
            NCCL, data for a DataLoader worker).
        follow: how many following lines to add to the evidence (NCCL's "Last error:" detail).
        last: a finding that only such patterns hit goes after every other finding (torchrun
            itself stopped by a signal from outside: the cause only when nothing else is found).
        only_with: a finding that only such patterns hit counts only when the log also has a
            finding of this reason (a launcher's memory report is evidence for a kill, not a
            failure by itself).
        in_collective: ``(reason, message)`` a hit counts as instead when the traceback it
            ends runs through a collective of torch.distributed (a bare ``Socket Timeout`` is
            a rendezvous that timed out, raised from ``all_reduce`` it is a collective that did;
            the message may name the collective as ``{op}``).
        in_child: ``(reason, message)`` a hit counts as instead when the traceback it ends ran
            in a process multiprocessing started (``_bootstrap`` in its ``process.py``, a
            DataLoader worker's ``_worker_loop``): CUDA's ``initialization error`` is the
            driver's in the main process, CUDA initialised before a fork in such a child.
        names_rank: the finding's rank is the one the line names (its group ``rank``), not
            the rank that printed it (torch's heartbeat monitor on every other rank: "a
            collective timeout from rank 7": rank 7 timed out, the printer did not).
    """

    regex: re.Pattern[str]
    message: str
    layer: Layer | None = None
    follow: int = 0
    last: bool = False
    only_with: str = ""
    in_collective: tuple[str, str] | None = None
    names_rank: bool = False
    in_child: tuple[str, str] | None = None


@dataclass(frozen=True)
class Frame:
    """A Python traceback frame that names a failure class even when the traceback was cut
    before its last line (people paste what fits). It is a guess from where the traceback went:
    when its own exception line follows and a pattern of another rule knows it, the exception's
    words win and the frame's guess is dropped.

    Attributes:
        function: the frame's function (``File "...", line N, in FUNCTION``).
        source: searched in the frame's source line (the line below, the code that raised).
        message: ``str.format`` template over ``source``'s named groups.
    """

    function: str
    source: re.Pattern[str]
    message: str


class Hook(str, enum.Enum):
    """What a rule's matches carry beyond their message (facts.py implements each).

    ``signal``: the signal of a killed process is named (number, name or a launcher's word for
    it); a launcher's own stop of the other ranks is no kill; a failure summary lends its rank;
    a kill that is the watchdog's own abort (of a rank another finding names, or of any rank
    beside a collective timeout or an NCCL error) goes last.
    ``watchdog``: per-rank SeqNum/OpType, the ranks that timed out and those that did not.
    ``socket_ifname``: the ``*_SOCKET_IFNAME`` the log shows set.
    ``nccl_detail``: what NCCL itself said (its WARN lines, the ``Last error:`` detail).
    """

    NONE = "none"
    SIGNAL = "signal"
    WATCHDOG = "watchdog"
    SOCKET_IFNAME = "socket_ifname"
    NCCL_DETAIL = "nccl_detail"


@dataclass(frozen=True)
class Rule:
    """A failure class: reason token, layer, cause-first tier, remedy, patterns, an example line.

    Attributes:
        frames: traceback frames that recognise the class without its last line.
        hook: what its matches carry beyond the message (:class:`Hook`).
        progress: a cause that lists the ranks that stopped progressing first beside it (off
            for failures before training starts, where progress says nothing).
        generic: an error code that wraps a more specific cause (ncclSystemError): any other
            finding of its tier goes before it.
        job_frames: it also takes a traceback's last line that no pattern knows, when that
            line is a plain Python exception raised in a frame of the job's own file (not
            installed code): the job's code raised it.
    """

    reason: str
    layer: Layer
    tier: int
    remedy: str
    patterns: tuple[Pattern, ...]
    example: str
    frames: tuple[Frame, ...] = ()
    hook: Hook = Hook.NONE
    progress: bool = True
    generic: bool = False
    job_frames: bool = False


def pattern(regex: str, message: str, *, layer: Layer | None = None, follow: int = 0,
            last: bool = False, only_with: str = "",
            in_collective: tuple[str, str] | None = None, names_rank: bool = False,
            in_child: tuple[str, str] | None = None) -> Pattern:
    """A :class:`Pattern` from its regex's text."""
    return Pattern(re.compile(regex), message, layer, follow, last, only_with, in_collective,
                   names_rank, in_child)


def frame(function: str, source: str, message: str) -> Frame:
    """A :class:`Frame` from its source regex's text."""
    return Frame(function, re.compile(source), message)


#: torch.distributed's collectives, as their frames name them (``distributed_c10d.py``, ``in
#: all_reduce``): a traceback through one of them failed in a collective, not while the ranks
#: met. The frames of rendezvous and init (``init_process_group``, ``_store_based_barrier``, a
#: store's construction) reset it.
COLLECTIVE_FUNCTIONS = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "all_gather_object",
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
    "broadcast_object_list", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
    "allreduce", "wait",
})
RENDEZVOUS_FUNCTIONS = frozenset({
    "init_process_group", "_store_based_barrier", "rendezvous", "_env_rendezvous_handler",
    "_tcp_rendezvous_handler", "_create_c10d_store", "_create_tcp_store", "next_rendezvous",
    "_new_process_group_helper", "new_group",
})


ORIGIN, KILLED, WRAPPER, SYMPTOM = 0, 1, 2, 3

