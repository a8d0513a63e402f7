"""The Xid alert rule follows the Xid table; the docs' table is the code's table."""

from __future__ import annotations

import re

import yaml

from preflight.probes.kernlog import XID_TABLE, XidClass
from tests.helpers import REPO


def test_alert_matches_exactly_the_node_fault_codes() -> None:
    data = yaml.safe_load((REPO / "deploy/prometheus/preflight-rules.yaml").read_text())
    (rule,) = [r for g in data["groups"] for r in g["rules"]
               if r.get("alert") == "PreflightGpuXidFault"]
    m = re.search(r'xid=~"([0-9|]+)"', rule["expr"])
    assert m is not None
    node = {c for c, info in XID_TABLE.items() if info.cls is XidClass.NODE}
    assert {int(c) for c in m.group(1).split("|")} == node
    assert not {13, 31, 43} & node


def test_docs_table_lists_every_code_with_its_class() -> None:
    text = (REPO / "docs/checks.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (node|job) \|", text, re.M))
    assert {int(c): cls for c, cls in rows.items()} == {c: i.cls.value for c, i in
                                                        XID_TABLE.items()}
