"""Render an Explanation for a person (text) or a script (JSON).

Everything a log or a dump put into the answer (evidence lines, messages built from them, file
names, notes) can hold control characters: a crafted log could set the terminal's title or clear
the screen. The text form escapes them (``\\e``, ``\\x07``, ``\\x00``...: core.textsafe); the JSON
form keeps the data and escapes them as JSON does (``\\u001b``).
"""

from __future__ import annotations

import json
from typing import Any

from preflight.core.textsafe import escape
from preflight.explain.matching import file_name
from preflight.explain.model import Explanation
from preflight.explain.ranks import compress


def to_json(expl: Explanation) -> str:
    """``{"findings": [{reason, layer, message, remedy, evidence, ranks...}], "ranks": {...}}``."""
    data: dict[str, Any] = expl.to_json()
    return json.dumps(data, indent=2)


def _first_error(expl: Explanation) -> list[str]:
    """Where to start reading a log no rule knows, when it shows an error at all."""
    first = expl.first_error
    if first is None:
        return []
    whose_line = f"rank {first.rank}'s" if first.rank is not None else "the"
    what = "first exception" if first.exception is not None else "first line that says error"
    out = [f"start reading at {whose_line} {what} (no rule knows it):",
           f"  {escape(first.line.source)}:{first.line.line}: {escape(first.line.text)}"]
    if first.frame is not None:
        file, no, function = first.frame
        name = file_name(file)
        whose = "installed code" if first.installed else "the job's own code"
        out.append(f"  raised in {escape(function)} at {escape(name)}:{no} ({whose})")
    return out


def render_text(expl: Explanation) -> str:
    """The on-call view: each finding cause-first with evidence and fix, then the ranks."""
    size_mb = expl.bytes_read / 1e6
    head = (f"read {len(expl.sources)} file{'s' if len(expl.sources) != 1 else ''}, "
            f"{expl.lines} lines, {size_mb:.1f} MB")
    tail = [f"not read: {escape(src)}: {escape(why)}" for src, why in expl.unread]
    tail += [f"note: {escape(n)}" for n in expl.notes]
    if not expl.findings:
        return "\n".join([f"{head}", "nothing recognised: no known failure class in these logs",
                          *_first_error(expl), *tail])
    out = [f"{head}; {len(expl.findings)} finding{'s' if len(expl.findings) != 1 else ''}, "
           "root cause first:", ""]
    for i, f in enumerate(expl.findings, 1):
        ranks = f"  ranks {compress(f.ranks)}" if f.ranks else ""
        out.append(f"{i}. {f.reason} [{f.layer.value}]{ranks}")
        out.append(f"   {escape(f.message)}")
        out.append("   evidence:")
        out.extend(f"     {escape(e.source)}:{e.line}: {escape(e.text)}" for e in f.evidence)
        out.append(f"   fix: {escape(f.remedy)}")
        out.append("")
    r = expl.ranks
    facts: list[str] = []
    if r.world_size is not None:
        facts.append(f"world size {r.world_size}")
    if r.seen:
        facts.append(f"seen {compress(r.seen)}")
    if r.failed:
        facts.append("failed " + ", ".join(str(x) for x in r.failed))
    if r.root_cause is not None:
        facts.append(f"torchrun root cause rank {r.root_cause}")
    if r.stalled:
        top = max(r.progress.values())
        facts.append("stopped first " + ", ".join(
            f"{x} (at {r.progress[x]}, others {top})" for x in r.stalled))
    if r.never_reported:
        facts.append(f"never reported progress {compress(r.never_reported)}")
    if facts:
        out.append("ranks: " + "; ".join(facts))
    out.extend(tail)
    return "\n".join(out).rstrip()
