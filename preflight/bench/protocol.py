"""The parent's side of the wire: a worker's progress lines applied to its
:class:`~preflight.bench.records.WorkerState` (no I/O; :mod:`preflight.bench.worker.wire`
defines the events on both sides)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from preflight.bench.records import DDP_TIMES, PHASE_TIMES, SPEED_TIMES, WorkerState, progress_order
from preflight.bench.worker import wire
from preflight.probes.pyenv import nccl_version_text

#: Bytes a partial line may grow to before it is dropped (a worker writes lines of ~1 KiB).
MAX_LINE = 1 << 20
_PHASES = {wire.START: wire.START_PHASES, wire.SPEED: wire.SPEED_PHASES,
           wire.ALLREDUCE: wire.ALLREDUCE_PHASES,
           **{step: wire.DDP_PHASES for step in wire.DDP_STEPS}}


def messages(st: WorkerState, chunk: bytes, now: float) -> Iterator[dict[str, Any]]:
    """The complete message lines of ``st``'s pipe, ``chunk`` being what just arrived (a partial
    last line waits in ``st.buffer``); each one counts as a heartbeat."""
    st.buffer += chunk
    *lines, st.buffer = st.buffer.split(b"\n")
    if len(st.buffer) > MAX_LINE:
        st.buffer = b""
    for raw in lines:
        msg = wire.decode(raw)
        if msg is not None:
            st.last_beat, st.heard = now, True
            yield msg


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _times(raw: Any, keys: tuple[str, ...]) -> dict[str, float]:
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in ((k, _num(raw[k])) for k in raw if k in keys) if v is not None}


def apply(st: WorkerState, msg: dict[str, Any], now: float, sizes: tuple[int, ...],
          on_phase: Callable[[WorkerState], None] | None = None) -> dict[str, Any] | None:
    """Apply one message to ``st``; return what rank 0 published for the others (``{"port": N}``
    or ``{"uid": HEX}``), if this message is that."""
    ev = msg.get("ev")
    if ev == wire.STARTED:
        t_main = _num(msg.get("t_main"))
        if t_main is not None and st.spawned_wall:
            st.start_times["interpreter"] = max(0.0, t_main - st.spawned_wall)
        st.pid = int(msg.get("pid") or st.pid or 0)
    elif ev == wire.PHASE:
        step, phase = str(msg.get("step")), str(msg.get("phase"))
        if phase in _PHASES.get(step, ()):
            size = msg.get("size")
            st.step, st.phase = step, phase
            st.size = int(size) if isinstance(size, int) else None
            st.order, st.entered = progress_order(step, phase, st.size, sizes), now
            if on_phase is not None:
                on_phase(st)
    elif ev == wire.DEVICE:
        st.device = {k: v for k, v in msg.items() if k not in ("ev", "t")}
        st.pci_bus_id = str(msg["bus_id"]) if msg.get("bus_id") else st.pci_bus_id
    elif ev == wire.ENGINE:
        if msg.get("step") == wire.SPEED:
            st.speed_engine, st.dtype = str(msg.get("engine")), str(msg.get("dtype"))
        else:
            st.engine = str(msg.get("engine"))
            code = msg.get("nccl_code")
            st.nccl_version = (nccl_version_text(code) if isinstance(code, int) else
                               str(msg["nccl"]) if msg.get("nccl") else None)
    elif ev == wire.MISSING:
        step = str(msg.get("step"))
        st.missing[step] = str(msg.get("need"))[:300]
        if msg.get("why"):
            st.missing_why[step] = str(msg["why"])[:1000]
    elif ev == wire.PUBLISH:
        if "port" in msg:
            return {wire.PORT: int(msg["port"])}
        if "uid" in msg:
            return {wire.UID: str(msg["uid"])}
    elif ev == wire.MEASURED:
        if "kind" in msg:
            st.figures[str(msg["kind"])] = float(msg["value"])
        else:
            st.times[int(msg["size"])] = float(msg["time_s"])
            first = _num(msg.get("first_allreduce_s"))
            if first is not None:
                st.first_allreduce_s = first
    elif ev == wire.VERIFIED:
        st.verified[int(msg["size"])] = msg
    elif ev == wire.STEP_DONE:
        step = str(msg.get("step"))
        st.steps_done.add(step)
        if step == wire.START:
            st.start_times.update(_times(msg.get("times"), PHASE_TIMES))
        elif step == wire.SPEED:
            st.speed_times = _times(msg.get("times"), SPEED_TIMES)
        elif step == wire.ALLREDUCE:
            st.allreduce_times = _times(msg.get("times"), PHASE_TIMES)
        elif step in wire.DDP_STEPS:
            st.ddp_times[step] = _times(msg.get("times"), DDP_TIMES)
    elif ev == wire.DDP_FACTS:
        step = str(msg.get("step"))
        if step in wire.DDP_STEPS:
            # Kept as sent; preflight.ddp.proofs reads every field as untrusted.
            st.ddp[step] = {k: v for k, v in msg.items() if k not in ("ev", "t", "step")}
    elif ev == wire.LOADED:
        st.loaded = {k: v for k, v in msg.items() if k not in ("ev", "t")}
    elif ev == wire.DONE:
        st.phase, st.size, st.order, st.entered = wire.DONE_PHASE, None, \
            progress_order(st.step, wire.DONE_PHASE, None, sizes), now
    elif ev == wire.ERROR:
        st.error = str(msg.get("error"))[:1000]
        st.traceback = str(msg.get("traceback", ""))[-4000:]
    return None
