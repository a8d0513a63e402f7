"""The three forms of ``preflight lint``'s result: flake8-style text, JSON and SARIF 2.1.0."""

from __future__ import annotations

import os
from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from preflight import __version__
from preflight.core.textsafe import escape
from preflight.lint import FileResult, Summary
from preflight.lint.rules import RULES, RULES_BY_ID

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL_NAME = "preflight-lint"


def render_text(summary: Summary) -> str:
    """``path:line:col: DDP101 message`` per finding (as flake8 prints), file and message made
    printable; nothing for a clean run."""
    lines = []
    for result in summary.results:
        path = escape(result.path, 300)
        for f in result.findings:
            lines.append(f"{path}:{f.line}:{f.col}: {f.rule} {escape(f.message, 400)}")
    return "\n".join(lines)


def render_skipped(result: FileResult) -> str:
    return f"preflight lint: {escape(result.path, 300)}: {escape(result.error or '', 300)}"


def to_json(summary: Summary) -> dict[str, Any]:
    return {
        "files": summary.files,
        "findings": [
            {"path": r.path, "line": f.line, "column": f.col, "rule": f.rule,
             "name": RULES_BY_ID[f.rule].name, "severity": f.severity.value, "sure": f.sure,
             "message": f.message, "fix": RULES_BY_ID[f.rule].fix}
            for r in summary.results for f in r.findings],
        "skipped": [{"path": r.path, "reason": r.error} for r in summary.skipped],
    }


def _uri(path: str) -> tuple[str, bool]:
    """A URI reference for ``path``: relative (to the working directory, the repository root
    in CI) when it is under it, else an absolute ``file://`` URI."""
    absolute = os.path.abspath(path)
    try:
        rel = os.path.relpath(absolute)
    except ValueError:
        rel = None
    if rel is not None and not rel.startswith(".."):
        return quote(PurePath(rel).as_posix()), True
    return "file://" + quote(PurePath(absolute).as_posix()), False


def _location(path: str, line: int, col: int) -> dict[str, Any]:
    uri, relative = _uri(path)
    artifact: dict[str, Any] = {"uri": uri}
    if relative:
        artifact["uriBaseId"] = "%SRCROOT%"
    return {"physicalLocation": {"artifactLocation": artifact,
                                 "region": {"startLine": max(1, line),
                                            "startColumn": max(1, col)}}}


def to_sarif(summary: Summary) -> dict[str, Any]:
    """One SARIF 2.1.0 run: every rule in the driver (with its fix as help), one result per
    finding (``error`` when sure, ``warning`` when not), files that could not be linted as
    tool notifications."""
    index = {rule.id: i for i, rule in enumerate(RULES)}
    results = []
    for r in summary.results:
        for f in r.findings:
            results.append({
                "ruleId": f.rule, "ruleIndex": index[f.rule], "level": f.severity.value,
                "message": {"text": f.message},
                "locations": [_location(r.path, f.line, f.col)],
            })
    notifications = [{"level": "warning", "message": {"text": f"{r.path}: {r.error}"},
                      "locations": [_location(r.path, 1, 1)]} for r in summary.skipped]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": TOOL_NAME, "version": __version__, "semanticVersion": __version__,
                "rules": [{
                    "id": rule.id, "name": rule.name,
                    "shortDescription": {"text": rule.summary.split(":")[0]},
                    "fullDescription": {"text": rule.summary},
                    "help": {"text": f"Fix: {rule.fix}.",
                             "markdown": f"**Fix:** {rule.fix}. See docs/lint.md#"
                                         f"{rule.id.lower()}."},
                    "defaultConfiguration": {"level": "error"},
                } for rule in RULES]}},
            "originalUriBaseIds": {"%SRCROOT%": {
                "uri": "file://" + quote(PurePath(os.path.abspath(os.curdir)).as_posix()) +
                       "/"}},
            "results": results,
            "invocations": [{"executionSuccessful": True,
                             "toolExecutionNotifications": notifications}],
        }],
    }


__all__ = ["SARIF_SCHEMA", "render_skipped", "render_text", "to_json", "to_sarif"]
