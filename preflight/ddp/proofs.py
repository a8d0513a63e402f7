"""What one step of the DDP ladder proved, from what each rank reported (pure functions).

Each rank sends its facts (:data:`preflight.bench.worker.wire.DDP_FACTS`, written by
:mod:`preflight.bench.worker.ddp`); :func:`parse_facts` reads them as untrusted input (types,
bounds) and :func:`judge` turns the ranks' facts into :class:`Proof`\\ s, each true, false, or not
applying to this step:

- ``device``: each rank ran on ``cuda:LOCAL_RANK`` and that is the GPU the job's
  ``CUDA_VISIBLE_DEVICES`` maps it to (PCI bus id against NVML), its parameters there too;
- ``broadcast``: the parameters were equal on every rank right after ``DDP(...)``, though each
  rank started from its own (different) ones;
- ``parameters_equal``: bitwise equal on every rank after training (the gradient all-reduce);
- ``loss_down``: the loss over the whole data set went down on every rank;
- ``shards``: in every epoch the ranks' samples are disjoint and together the whole data set;
- ``order_changed``: each rank's order changed between consecutive epochs (``set_epoch``), while
  a sampler never given ``set_epoch`` repeats its order (shown on every rank);
- ``parameters_used``: ``find_unused_parameters=False`` and every parameter got a gradient in
  every iteration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from preflight.probes.pci import normalize_bus_id

#: Bounds on what a rank may report (the worker's data set is small; anything larger is noise).
MAX_SAMPLES = 1 << 20
MAX_EPOCHS = 64
MAX_HEX = 128

#: Every proof, in the order shown; the words a table prints for each.
TITLES = {
    "device": "each rank on the GPU its LOCAL_RANK maps to",
    "broadcast": "parameters equal after DDP(...) (its broadcast)",
    "parameters_equal": "parameters bitwise equal after training",
    "loss_down": "the loss went down",
    "shards": "DistributedSampler shards disjoint, covering the data set",
    "order_changed": "the order changed between epochs (set_epoch)",
    "parameters_used": "find_unused_parameters=False, every parameter used",
}


@dataclass(frozen=True)
class Proof:
    """One claim about a step: ``ok`` True / False, None where it does not apply (a CPU rank has
    no GPU to map; one rank has nobody to be equal to)."""

    name: str
    ok: bool | None
    message: str
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return TITLES.get(self.name, self.name)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title,
                "status": "n/a" if self.ok is None else "pass" if self.ok else "fail",
                "message": self.message, "figures": dict(self.figures)}


@dataclass(frozen=True)
class RankFacts:
    """What one rank showed in one step (see :mod:`preflight.bench.worker.ddp`)."""

    rank: int
    local_rank: int
    world_size: int
    backend: str | None
    device_type: str
    device_index: int | None
    bus_id: str | None
    device_name: str | None
    parameter_devices: tuple[str, ...]
    samples: int
    digest_init: str
    digest_wrapped: str | None
    digest_final: str
    loss_before: float
    loss_after: float
    indices: tuple[tuple[int, ...], ...]
    iterations: int
    parameters: int
    params_with_grad_min: int
    find_unused_parameters: bool | None
    set_epoch: bool
    repeats_without_set_epoch: bool
    test_hooks: tuple[str, ...] = ()


def _int(raw: Mapping[str, Any], key: str, lo: int = 0, hi: int = MAX_SAMPLES) -> int:
    v = raw.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"{key}: expected an integer {lo}..{hi}, got {v!r:.40}")
    return v


def _float(raw: Mapping[str, Any], key: str) -> float:
    v = raw.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise ValueError(f"{key}: expected a number, got {v!r:.40}")
    return float(v)


def _text(raw: Any, limit: int = MAX_HEX) -> str | None:
    return raw[:limit] if isinstance(raw, str) else None


def parse_facts(raw: Mapping[str, Any]) -> RankFacts:
    """One rank's facts; ValueError naming the first field that is missing or malformed."""
    samples = _int(raw, "samples", 1)
    device = raw.get("device") if isinstance(raw.get("device"), dict) else {}
    assert isinstance(device, dict)
    indices_raw = raw.get("indices")
    if not isinstance(indices_raw, list) or len(indices_raw) > MAX_EPOCHS or not all(
            isinstance(e, list) and len(e) <= samples for e in indices_raw):
        raise ValueError("indices: expected a list of epochs, each a list of sample indices")
    indices = tuple(tuple(i for i in epoch if isinstance(i, int) and not isinstance(i, bool))
                    for epoch in indices_raw)
    if any(len(a) != len(b) for a, b in zip(indices, indices_raw, strict=True)):
        raise ValueError("indices: not every sample index is an integer")
    final, init = _text(raw.get("digest_final")), _text(raw.get("digest_init"))
    if final is None or init is None:
        raise ValueError("digest_init / digest_final: expected text")
    backend = raw.get("backend")
    index = device.get("index")
    hooks = raw.get("test_hooks")
    places = raw.get("parameter_devices")
    unused = raw.get("find_unused_parameters")
    return RankFacts(
        rank=_int(raw, "rank"), local_rank=_int(raw, "local_rank"),
        world_size=_int(raw, "world_size", 1), backend=backend if isinstance(backend, str)
        else None, device_type=str(device.get("type") or "cpu")[:16],
        device_index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        bus_id=_text(device.get("bus_id"), 32), device_name=_text(device.get("name"), 100),
        parameter_devices=tuple(d[:32] for d in places if isinstance(d, str))[:16]
        if isinstance(places, list) else (),
        samples=samples, digest_init=init, digest_wrapped=_text(raw.get("digest_wrapped")),
        digest_final=final, loss_before=_float(raw, "loss_before"),
        loss_after=_float(raw, "loss_after"), indices=indices,
        iterations=_int(raw, "iterations"), parameters=_int(raw, "parameters", 1),
        params_with_grad_min=_int(raw, "params_with_grad_min"),
        find_unused_parameters=unused if isinstance(unused, bool) else None,
        set_epoch=raw.get("set_epoch") is not False,
        repeats_without_set_epoch=raw.get("repeats_without_set_epoch") is True,
        test_hooks=tuple(str(h)[:40] for h in hooks)[:8] if isinstance(hooks, list) else ())


def _ranks(items: Sequence[int]) -> str:
    return f"rank{'s' if len(items) > 1 else ''} {', '.join(map(str, items))}"


def _short(digest: str) -> str:
    return digest[:12]


def device_proof(facts: Sequence[RankFacts], expected: Mapping[int, str] | None,
                 cvd: str | None, *, expected_note: str = "") -> Proof:
    """``expected``: local rank -> the PCI bus id of the GPU the job's CUDA_VISIBLE_DEVICES
    maps cuda:LOCAL_RANK to (None: NVML could not say)."""
    if not facts or all(f.device_type != "cuda" for f in facts):
        return Proof("device", None, "the ranks run on the CPU: no GPU to map")
    under = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
    bad, seen = [], []
    for f in facts:
        want = f"cuda:{f.local_rank}"
        got_bus = normalize_bus_id(f.bus_id) if f.bus_id else None
        exp = expected.get(f.local_rank) if expected else None
        exp_bus = normalize_bus_id(exp) if exp else None
        where = f"{want} = {f.bus_id or 'unknown bus'}"
        seen.append(f"rank {f.rank} on {where}")
        if f.device_type != "cuda" or f.device_index != f.local_rank:
            bad.append(f"rank {f.rank} (LOCAL_RANK={f.local_rank}) ran on "
                       f"{f.device_type}:{f.device_index}, not {want}")
        elif exp_bus is not None and got_bus != exp_bus:
            bad.append(f"rank {f.rank} (LOCAL_RANK={f.local_rank}) ran on {f.bus_id}, but "
                       f"{under} maps {want} to {exp} (NVML)")
        elif set(f.parameter_devices) != {want}:
            bad.append(f"rank {f.rank}'s parameters are on {', '.join(f.parameter_devices)}, "
                       f"not {want}")
    figures = {"ranks": {str(f.rank): {"local_rank": f.local_rank, "device": f.device_index,
                                       "bus_id": f.bus_id, "name": f.device_name,
                                       "expected_bus_id": (expected or {}).get(f.local_rank)}
                         for f in facts}}
    if bad:
        return Proof("device", False, "; ".join(bad), figures)
    note = f"; {expected_note}" if expected_note else ""
    return Proof("device", True, f"{'; '.join(seen)}: each the GPU its LOCAL_RANK maps to "
                 f"({under}{note})", figures)


def broadcast_proof(facts: Sequence[RankFacts]) -> Proof:
    if any(f.digest_wrapped is None for f in facts):
        return Proof("broadcast", None, "no DDP in this step")
    if len(facts) < 2:
        return Proof("broadcast", None, "one rank: nothing to broadcast")
    wrapped = {f.digest_wrapped for f in facts}
    initial = len({f.digest_init for f in facts})
    figures = {"initial_distinct": initial, "after_wrap_distinct": len(wrapped)}
    if len(wrapped) > 1:
        odd = [f.rank for f in facts if f.digest_wrapped != facts[0].digest_wrapped]
        return Proof("broadcast", False, f"after DDP(...) the parameters of {_ranks(odd)} differ "
                     "from rank 0's: DDP's broadcast of rank 0's parameters did not reach them",
                     figures)
    return Proof("broadcast", True, f"each of the {len(facts)} ranks started from its own "
                 f"parameters ({initial} different digests); right after DDP(...) all equal rank "
                 "0's", figures)


def equal_proof(facts: Sequence[RankFacts]) -> Proof:
    if any(f.digest_wrapped is None for f in facts):
        return Proof("parameters_equal", None, "each rank trains alone (no DDP): nothing to be "
                     "equal to")
    if len(facts) < 2:
        return Proof("parameters_equal", None, "one rank: nothing to compare (the gradient "
                     "all-reduce ran over one rank)")
    ref = facts[0]
    odd = [f for f in facts if f.digest_final != ref.digest_final]
    figures = {"digests": {str(f.rank): f.digest_final for f in facts}}
    iters = ref.iterations
    if odd:
        return Proof("parameters_equal", False, f"after {iters} iterations the parameters of "
                     f"{_ranks([f.rank for f in odd])} differ from rank {ref.rank}'s (sha256 "
                     f"{_short(odd[0].digest_final)}... against {_short(ref.digest_final)}...): "
                     "the ranks no longer train one model (a rank that skipped "
                     "optimizer.step(), or gradients averaged wrongly)", figures)
    return Proof("parameters_equal", True, f"after {iters} iterations bitwise equal on all "
                 f"{len(facts)} ranks (sha256 {_short(ref.digest_final)}...)", figures)


def loss_proof(facts: Sequence[RankFacts]) -> Proof:
    bad = [f for f in facts if not (math.isfinite(f.loss_before) and math.isfinite(f.loss_after)
                                    and f.loss_after < f.loss_before)]
    figures = {"ranks": {str(f.rank): {"before": f.loss_before, "after": f.loss_after}
                         for f in facts}}
    if bad:
        return Proof("loss_down", False, "; ".join(
            f"rank {f.rank}: {f.loss_before:.4g} -> {f.loss_after:.4g}, not lower"
            for f in bad) + " (mean squared error over the whole data set)", figures)
    lo, hi = min(f.loss_after for f in facts), max(f.loss_after for f in facts)
    after = f"{lo:.4g}" if lo == hi else f"{lo:.4g}..{hi:.4g}"
    return Proof("loss_down", True, f"mean squared error over the whole data set from "
                 f"{facts[0].loss_before:.4g} to {after} on every rank", figures)


def shards_proof(facts: Sequence[RankFacts]) -> Proof:
    """Disjoint and covering in every epoch, over the ranks of one training (a step without a
    process group: each rank is a training of its own, covering the data set alone)."""
    groups = [[f] for f in facts] if any(f.digest_wrapped is None for f in facts) else [
        list(facts)]
    problems: list[str] = []
    for group in groups:
        samples = group[0].samples
        epochs = min(len(f.indices) for f in group)
        if epochs == 0 or any(len(f.indices) != epochs for f in group):
            problems.append(f"{_ranks([f.rank for f in group])} reported different epochs")
            continue
        if any(f.samples != samples for f in group):
            problems.append("the ranks disagree on the data set's size")
            continue
        for e in range(epochs):
            sets = [set(f.indices[e]) for f in group]
            union = set().union(*sets)
            out = sorted(i for i in union if not 0 <= i < samples)
            if out:
                problems.append(f"epoch {e}: sample indices out of range ({out[:3]})")
                break
            shared = [(a.rank, b.rank, sorted(sa & sb)) for i, (a, sa) in
                      enumerate(zip(group, sets, strict=True))
                      for b, sb in list(zip(group, sets, strict=True))[i + 1:] if sa & sb]
            if shared:
                r0, r1, both = shared[0]
                problems.append(f"epoch {e}: ranks {r0} and {r1} both trained on {len(both)} "
                                f"sample(s) (e.g. {', '.join(map(str, both[:3]))})")
                break
            dup = [f.rank for f, s in zip(group, sets, strict=True) if len(s) != len(f.indices[e])]
            if dup:
                problems.append(f"epoch {e}: {_ranks(dup)} saw a sample twice")
                break
            missing = sorted(set(range(samples)) - union)
            if missing:
                problems.append(f"epoch {e}: {len(missing)} of {samples} samples on no rank "
                                f"(e.g. {', '.join(map(str, missing[:3]))})")
                break
    sizes = sorted({len(f.indices[0]) for f in facts if f.indices})
    figures = {"samples": facts[0].samples if facts else 0, "shard_sizes": sizes,
               "epochs": min((len(f.indices) for f in facts), default=0)}
    if problems:
        return Proof("shards", False, "; ".join(problems), figures)
    if len(groups) > 1:
        return Proof("shards", True, f"each rank alone covered all {facts[0].samples} samples "
                     f"once per epoch, in {figures['epochs']} epochs", figures)
    return Proof("shards", True, f"every epoch: {len(facts)} shard(s) of "
                 f"{'/'.join(map(str, sizes))} samples, disjoint, together all "
                 f"{facts[0].samples}", figures)


def order_proof(facts: Sequence[RankFacts]) -> Proof:
    same = [(f.rank, e) for f in facts for e in range(1, len(f.indices))
            if f.indices[e] == f.indices[e - 1]]
    control = all(f.repeats_without_set_epoch for f in facts)
    without = ("without set_epoch it would not have: a sampler never given set_epoch repeated "
               "its order on every rank" if control else
               "(a sampler never given set_epoch did not repeat its order here: this torch's "
               "DistributedSampler shuffles differently)")
    figures = {"repeats_without_set_epoch": control,
               "set_epoch_called": all(f.set_epoch for f in facts)}
    if same:
        not_called = [f.rank for f in facts if not f.set_epoch]
        why = (" (set_epoch was not called: the test hook no_set_epoch)" if not_called else "")
        ranks = sorted({r for r, _ in same})
        return Proof("order_changed", False, f"{_ranks(ranks)} trained on the same order in "
                     f"consecutive epochs (first: epoch {same[0][1]} repeated epoch "
                     f"{same[0][1] - 1}){why}: every epoch sees the same shuffle, as without "
                     "sampler.set_epoch(epoch)", figures)
    epochs = min((len(f.indices) for f in facts), default=0)
    return Proof("order_changed", True, f"each rank's order differed in each of its {epochs} "
                 f"epochs with sampler.set_epoch(epoch); {without}", figures)


def used_proof(facts: Sequence[RankFacts]) -> Proof:
    ddp = all(f.digest_wrapped is not None for f in facts)
    bad = [f for f in facts if f.params_with_grad_min < f.parameters]
    flag = [f for f in facts if ddp and f.find_unused_parameters is not False]
    iters = sorted({f.iterations for f in facts})
    figures = {"parameters": facts[0].parameters if facts else 0, "iterations": iters}
    if bad or flag or len(iters) > 1:
        parts = [f"rank {f.rank}: {f.params_with_grad_min} of {f.parameters} parameters got a "
                 "gradient in some iteration" for f in bad]
        parts += [f"rank {f.rank} ran with find_unused_parameters={f.find_unused_parameters}"
                  for f in flag]
        if len(iters) > 1:
            parts.append(f"the ranks ran different numbers of iterations ({iters}): DDP waits "
                         "for the gradients of the missing ones")
        return Proof("parameters_used", False, "; ".join(parts), figures)
    what = "find_unused_parameters=False and all" if ddp else "all"
    return Proof("parameters_used", True, f"{what} {facts[0].parameters} parameters got a "
                 f"gradient in each of the {iters[0]} iterations on every rank", figures)


def judge(facts: Sequence[RankFacts], *, expected: Mapping[int, str] | None = None,
          cvd: str | None = None, expected_note: str = "") -> tuple[Proof, ...]:
    """Every proof of one step from its ranks' facts (in rank order)."""
    facts = sorted(facts, key=lambda f: f.rank)
    return (device_proof(facts, expected, cvd, expected_note=expected_note),
            broadcast_proof(facts), equal_proof(facts), loss_proof(facts), shards_proof(facts),
            order_proof(facts), used_proof(facts))
