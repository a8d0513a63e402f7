"""A test API server that speaks the Kubernetes API's protocol for Nodes and Events.

No real kube-apiserver can be installed offline (it needs etcd and release binaries from the
network), so the daemon's node-status writer is tested against this one. What it does as the real
server does, and the writer depends on:

* HTTPS only (its own CA, a server certificate for 127.0.0.1), ``Authorization: Bearer <token>``:
  no or an unknown token is 401 ``Unauthorized``; a verb the token's rules do not allow is 403
  ``Forbidden`` with the API server's wording. Errors are ``Status`` objects.
* ``GET /api/v1/nodes/NAME`` (404 ``NotFound``), ``GET /api/v1/nodes`` with ``labelSelector``
  (the selector grammar: ``k``, ``!k``, ``k=v``, ``k==v``, ``k!=v``, ``k in (..)``,
  ``k notin (..)``), as a NodeList, a PartialObjectMetadataList or a Table
  (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``, ``includeObject``).
* ``PATCH /api/v1/nodes/NAME`` and ``.../status`` in the three patch formats
  (tests/kube/patch.py; any other content type is 415): the main resource keeps the old status,
  the status subresource the old spec and metadata; a ``metadata.resourceVersion`` in a merge
  patch is a precondition (409 ``Conflict``); a JSON patch that does not apply is 422; the result
  is validated (condition status True/False/Unknown, taint effect and key/value syntax, no two
  taints with the same key and effect, label syntax: 422 ``Invalid``); each change bumps
  ``resourceVersion``.
* ``POST /api/v1/namespaces/NS/events``: an Event about a cluster-scoped object must be in
  ``default`` (or ``kube-system``) as the API's validation says, name unique (409
  ``AlreadyExists``), 201 with the object.
* ``unavailable = 503`` (or any status) answers every request with that ``Status``;
  ``delay_s`` answers late.

Every request is recorded (method, path, query, content type, body) for the tests to assert on.
"""

from __future__ import annotations

import copy
import json
import re
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.kube.patch import PatchError, definition, json_patch, merge_patch, strategic_merge

NODE_DEF = "io.k8s.api.core.v1.Node"
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
                        r"[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 / localhost signed by it (openssl)."""
    ca_key, ca = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
            "-subj", "/CN=test-kubernetes-ca")
    openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=kube-apiserver")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    user: str
    status: int = 0


@dataclass
class Account:
    """A token's identity and rules: ``{(verb, resource)}``, resource like ``nodes``,
    ``nodes/status``, ``events@default`` (namespaced: ``@namespace``)."""

    user: str
    rules: set[tuple[str, str]]


def node_object(name: str, *, labels: dict[str, str] | None = None,
                taints: list[dict[str, Any]] | None = None, unschedulable: bool = False,
                conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Node as the kubelet registers it (the fields the tests look at)."""
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status", "lastHeartbeatTime":
             "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-11-30T00:00:00Z"}
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "creationTimestamp": "2026-11-30T00:00:00Z",
                     "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {"conditions": [ready, *(conditions or [])],
                   "nodeInfo": {"kubeletVersion": "v1.33.1"}},
    }


def _match(selector: str, labels: dict[str, str]) -> bool:
    """The label selector grammar of the API (``k8s.io/apimachinery/pkg/labels``)."""
    parts: list[str] = []
    depth, current = 0, ""
    for ch in selector:
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        current += ch
    parts.append(current)
    for raw in (p.strip() for p in parts):
        if not raw:
            continue
        m = re.fullmatch(r"([^\s!=,()]+)\s+(in|notin)\s+\(([^)]*)\)", raw)
        if m:
            values = {v.strip() for v in m.group(3).split(",") if v.strip()}
            present = m.group(1) in labels and labels[m.group(1)] in values
            if present != (m.group(2) == "in"):
                return False
            continue
        m = re.fullmatch(r"([^\s!=]+)\s*(==|=|!=)\s*([^\s,]*)", raw)
        if m:
            equal = labels.get(m.group(1)) == m.group(3)
            if equal != (m.group(2) != "!="):
                return False
            continue
        m = re.fullmatch(r"(!?)([^\s!=]+)", raw)
        if m is None:
            raise PatchError(400, f"unable to parse requirement: {raw!r}")
        if (m.group(2) in labels) == bool(m.group(1)):
            return False
    return True


def _validate_node(node: dict[str, Any]) -> list[str]:
    errors = []
    for cond in node.get("status", {}).get("conditions") or ():
        if cond.get("status") not in ("True", "False", "Unknown"):
            errors.append(f"status.conditions[{cond.get('type')}].status: Unsupported value: "
                          f"{cond.get('status')!r}")
        if not cond.get("type"):
            errors.append("status.conditions.type: Required value")
    seen = set()
    for taint in node.get("spec", {}).get("taints") or ():
        key, effect = taint.get("key", ""), taint.get("effect", "")
        if not _QUALIFIED.match(key):
            errors.append(f"spec.taints.key: Invalid value: {key!r}")
        if not _VALUE.match(str(taint.get("value", ""))):
            errors.append(f"spec.taints.value: Invalid value: {taint.get('value')!r}")
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            errors.append(f"spec.taints.effect: Unsupported value: {effect!r}")
        if (key, effect) in seen:
            errors.append(f"spec.taints: Duplicate value: {key}:{effect}")
        seen.add((key, effect))
    for key, value in (node.get("metadata", {}).get("labels") or {}).items():
        if not _QUALIFIED.match(key) or not isinstance(value, str) or not _VALUE.match(value):
            errors.append(f"metadata.labels: Invalid value: {key}={value!r}")
    return errors


def _status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details, "code": code}


class ApiServer:
    """Start with :meth:`start`; ``url`` and ``ca`` say where and whom to trust."""

    def __init__(self, certificates: tuple[Path, Path, Path]) -> None:
        self.ca, self.cert, self.key = certificates
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.requests: list[Request] = []
        self.accounts: dict[str, Account] = {}
        self.unavailable: int | None = None
        self.delay_s = 0.0
        self.lock = threading.RLock()
        self._rv = 100
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        #: Called with (server, node name, is-status) before a PATCH of that node is applied: a
        #: concurrent writer.
        self.before_patch: list[Any] = []

    # ---- set-up ------------------------------------------------------------------------------

    def add_node(self, node: dict[str, Any]) -> None:
        with self.lock:
            self.nodes[node["metadata"]["name"]] = node

    def add_token(self, token: str, user: str, rules: set[tuple[str, str]]) -> None:
        self.accounts[token] = Account(user, set(rules))

    def node(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.nodes[name])

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        for c in self.node(name)["status"].get("conditions") or ():
            if c["type"] == type_:
                return dict(c)
        return None

    def writes(self) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method in ("PATCH", "POST", "PUT", "DELETE")]

    def next_rv(self) -> str:
        with self.lock:
            self._rv += 1
            return str(self._rv)

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"https://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> ApiServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_PATCH(self) -> None:
                server._handle(self, "PATCH")

            def do_POST(self) -> None:
                server._handle(self, "POST")

            def do_PUT(self) -> None:
                server._handle(self, "PUT")

            def do_DELETE(self) -> None:
                server._handle(self, "DELETE")

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    # ---- requests ----------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        ctype = (h.headers.get("Content-Type") or "").split(";")[0].strip()
        auth = h.headers.get("Authorization", "")
        account = self.accounts.get(auth[7:]) if auth.startswith("Bearer ") else None
        req = Request(method, url.path, query, ctype, None, account.user if account else "")
        try:
            req.body = json.loads(raw) if raw else None
        except ValueError:
            req.body = raw.decode(errors="replace")
        with self.lock:
            self.requests.append(req)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.unavailable is not None:
            code, body = self.unavailable, _status(self.unavailable, "ServiceUnavailable",
                                                   "the server is currently unable to handle "
                                                   "the request")
        elif account is None:
            code, body = 401, _status(401, "Unauthorized", "Unauthorized")
        else:
            try:
                code, body = self._route(method, url.path, query, ctype, raw, account,
                                         h.headers.get("Accept", ""))
            except PatchError as exc:
                code = exc.status
                reason = {400: "BadRequest", 409: "Conflict", 415: "UnsupportedMediaType",
                          422: "Invalid"}.get(code, "InternalError")
                body = _status(code, reason, str(exc))
        req.status = code
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _allowed(self, account: Account, verb: str, resource: str) -> bool:
        return (verb, resource) in account.rules

    def _forbidden(self, account: Account, verb: str, resource: str, name: str,
                   namespace: str = "") -> tuple[int, dict[str, Any]]:
        kind = resource.split("/", 1)[0]
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        message = (f'{kind} "{name}" is forbidden: User "{account.user}" cannot {verb} resource '
                   f'"{resource}" in API group "" {scope}')
        return 403, _status(403, "Forbidden", message, name=name, kind=kind)

    def _route(self, method: str, path: str, query: dict[str, str], ctype: str, raw: bytes,
               account: Account, accept: str) -> tuple[int, dict[str, Any]]:
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", path)
        if m:
            name, status = urllib.parse.unquote(m.group(1)), bool(m.group(2))
            resource = "nodes/status" if status else "nodes"
            verb = {"GET": "get", "PATCH": "patch", "PUT": "update"}.get(method, "")
            if not verb:
                return 405, _status(405, "MethodNotAllowed", f"{method} is not supported")
            if not self._allowed(account, verb, resource):
                return self._forbidden(account, verb, resource, name)
            with self.lock:
                if name not in self.nodes:
                    return 404, _status(404, "NotFound", f'nodes "{name}" not found',
                                        name=name, kind="nodes")
                if method == "GET":
                    return 200, copy.deepcopy(self.nodes[name])
                for hook in self.before_patch:
                    hook(self, name, status)
                return 200, self._patch(name, status, ctype, raw)
        if path == "/api/v1/nodes" and method == "GET":
            if not self._allowed(account, "list", "nodes"):
                return self._forbidden(account, "list", "nodes", "")
            return 200, self._list(query, accept)
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path)
        if m and method == "POST":
            namespace = m.group(1)
            if not self._allowed(account, "create", f"events@{namespace}"):
                return self._forbidden(account, "create", "events", "", namespace)
            return self._create_event(namespace, raw)
        return 404, _status(404, "NotFound", "the server could not find the requested resource")

    def _patch(self, name: str, status: bool, ctype: str, raw: bytes) -> dict[str, Any]:
        try:
            patch = json.loads(raw)
        except ValueError:
            raise PatchError(400, "the body of the request was in an unknown format") from None
        old = self.nodes[name]
        if ctype == "application/json-patch+json":
            new = json_patch(old, patch)
        elif ctype == "application/merge-patch+json":
            new = merge_patch(old, patch)
        elif ctype == "application/strategic-merge-patch+json":
            new = strategic_merge(old, patch, definition(NODE_DEF))
        else:
            raise PatchError(415, f"the body of the request was in an unknown format - accepted "
                                  f"media types include: application/json-patch+json, "
                                  f"application/merge-patch+json, application/apply-patch+yaml, "
                                  f"application/strategic-merge-patch+json (got {ctype!r})")
        wanted_rv = (patch.get("metadata") or {}).get("resourceVersion") \
            if isinstance(patch, dict) else None
        if wanted_rv is not None and wanted_rv != old["metadata"]["resourceVersion"]:
            raise PatchError(409, f'Operation cannot be fulfilled on nodes "{name}": the object '
                                  "has been modified; please apply your changes to the latest "
                                  "version and try again")
        if status:  # the status strategy: only status changes
            new = {**copy.deepcopy(old), "status": new.get("status", {})}
        else:  # the node strategy: status only through /status
            new["status"] = copy.deepcopy(old["status"])
            for immutable in ("name", "uid", "creationTimestamp"):
                new.setdefault("metadata", {})[immutable] = old["metadata"][immutable]
        errors = _validate_node(new)
        if errors:
            raise PatchError(422, f'Node "{name}" is invalid: {"; ".join(errors)}')
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new != old:
            new["metadata"]["resourceVersion"] = self.next_rv()
        self.nodes[name] = new
        return copy.deepcopy(new)

    def _list(self, query: dict[str, str], accept: str) -> dict[str, Any]:
        selector = query.get("labelSelector", "")
        with self.lock:
            items = [copy.deepcopy(n) for n in self.nodes.values()
                     if _match(selector, n["metadata"].get("labels") or {})]
            rv = str(self._rv)
        if "as=Table" in accept:
            include = query.get("includeObject", "Metadata")
            rows = []
            for n in items:
                ready = next((c["status"] for c in n["status"].get("conditions", ())
                              if c["type"] == "Ready"), "Unknown")
                state = "Ready" if ready == "True" else "NotReady"
                if n["spec"].get("unschedulable"):
                    state += ",SchedulingDisabled"
                obj: Any = None
                if include == "Object":
                    obj = n
                elif include == "Metadata":
                    obj = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                           "metadata": n["metadata"]}
                rows.append({"cells": [n["metadata"]["name"], state, "<none>", "1d",
                                       n["status"]["nodeInfo"]["kubeletVersion"]],
                             "object": obj})
            columns = [{"name": c, "type": "string", "format": "name" if c == "Name" else "",
                        "description": "", "priority": 0}
                       for c in ("Name", "Status", "Roles", "Age", "Version")]
            return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": rv}, "columnDefinitions": columns,
                    "rows": rows}
        if "as=PartialObjectMetadataList" in accept:
            return {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                    "metadata": {"resourceVersion": rv},
                    "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": n["metadata"]} for n in items]}
        return {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
                "items": items}

    def _create_event(self, namespace: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        try:
            event = json.loads(raw)
        except ValueError:
            raise PatchError(400, "the body of the request was in an unknown format") from None
        meta = event.setdefault("metadata", {})
        errors = []
        if meta.get("namespace") not in (None, "", namespace):
            errors.append("metadata.namespace: Invalid value: does not match the namespace of "
                          "the request")
        meta["namespace"] = namespace
        if not meta.get("name"):
            errors.append("metadata.name: Required value")
        obj = event.get("involvedObject") or {}
        if not obj.get("kind") or not obj.get("name"):
            errors.append("involvedObject: Required value")
        if not obj.get("namespace") and namespace not in ("default", "kube-system") \
                and not event.get("eventTime"):
            errors.append(f"involvedObject.namespace: Invalid value: \"\": does not match "
                          f"event.namespace {namespace!r}")
        if event.get("type") not in ("Normal", "Warning"):
            errors.append(f"type: Unsupported value: {event.get('type')!r}")
        if not event.get("reason"):
            errors.append("reason: Required value")
        if not (event.get("source") or {}).get("component") and not \
                event.get("reportingComponent"):
            errors.append("source.component: Required value")
        if errors:
            return 422, _status(422, "Invalid", f'Event "{meta.get("name")}" is invalid: '
                                f'{"; ".join(errors)}')
        with self.lock:
            if any(e["metadata"]["name"] == meta["name"] and e["metadata"]["namespace"] ==
                   namespace for e in self.events):
                return 409, _status(409, "AlreadyExists",
                                    f'events "{meta["name"]}" already exists')
            meta["uid"] = f"uid-event-{len(self.events)}"
            meta["resourceVersion"] = self.next_rv()
            self.events.append(event)
        return 201, copy.deepcopy(event)


@dataclass
class Cluster:
    """An API server with nodes and the token of the daemon's ServiceAccount."""

    server: ApiServer
    token: str
    kubeconfig: Path
    user: str = "system:serviceaccount:monitoring:pf-cluster-preflight"
    extra: dict[str, Any] = field(default_factory=dict)


def write_kubeconfig(path: Path, server: ApiServer, token_file: Path) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server.url,
                                                  "certificate-authority": str(server.ca)}}],
        "users": [{"name": "pf", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "pf"}}],
    }))
    return path


def iter_rules(*, taint: bool, guard: bool) -> Iterator[tuple[str, str]]:
    """The chart's RBAC for these settings, as (verb, resource) pairs (tests/k8s checks that
    the chart renders exactly these)."""
    yield ("get", "nodes")
    yield ("patch", "nodes/status")
    yield ("create", "events@default")
    if taint or guard:
        yield ("patch", "nodes")
    if guard:
        yield ("list", "nodes")


__all__ = ["ApiServer", "Cluster", "iter_rules", "make_certificates", "node_object",
           "write_kubeconfig"]
