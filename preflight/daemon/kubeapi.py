"""A small Kubernetes API client on the standard library: credentials, HTTPS, deadlines.

Why not the official ``kubernetes`` package: version 37.0.2 installs 163 MB with 27 packages
(aiohttp, pydantic, requests, ...), takes 1.7 to 3.8 s to import and adds 48 MiB of resident
memory, measured on the CI machine (docs/kubernetes.md). The daemon idles at about 30 MB and makes
a handful of requests an hour: GET and PATCH of its own Node, one list of node names, POST of an
Event. Those need HTTPS with a bearer token or a client certificate, a deadline per request and a
bounded answer; nothing more.

Credentials are found as client-go and kubectl find them:

* **in a pod**: ``KUBERNETES_SERVICE_HOST`` / ``KUBERNETES_SERVICE_PORT`` and the ServiceAccount
  files under ``/var/run/secrets/kubernetes.io/serviceaccount`` (``token``, ``ca.crt``). The
  token is re-read before every request: a projected token is rotated by the kubelet (hourly by
  default) and a token read once at start would expire.
* **else** ``$KUBECONFIG`` (a ``:``-separated list, merged as kubectl merges it: the first file
  that sets a name or ``current-context`` wins), else ``~/.kube/config``: the current context's
  cluster (``server``, ``certificate-authority[-data]``, ``insecure-skip-tls-verify``,
  ``tls-server-name``) and user (``token``, ``tokenFile``, ``client-certificate[-data]`` +
  ``client-key[-data]``). ``exec`` and ``auth-provider`` plugins run other programs and are not
  supported: such a kubeconfig is a clear error at start.

Every response is bounded (:data:`MAX_RESPONSE_BYTES`) and every request has one deadline for the
whole exchange, connect included. Nothing here retries: the caller decides (preflight.daemon.kube).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import socket
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from preflight.core.boundedio import read_bounded
from preflight.core.textsafe import escape

#: Where the kubelet mounts a pod's ServiceAccount credentials.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Largest answer read from the API server (a Table of 5,000 node names is about 1 MiB).
MAX_RESPONSE_BYTES = 8 << 20
#: Largest token, certificate or kubeconfig file read.
MAX_CREDENTIAL_BYTES = 1 << 20
#: Content types of the three patch formats the API server accepts (and server-side apply).
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
#: The server-side printed form of a list: names and a few columns, no objects
#: (https://kubernetes.io/docs/reference/using-api/api-concepts/#receiving-resources-as-tables).
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


class KubeConfigError(ValueError):
    """No usable credentials: the message says what was looked at and what is missing."""


class KubeApiError(RuntimeError):
    """A request did not succeed: the API server answered an error status, or did not answer.

    Attributes:
        status: the HTTP status, or 0 when there was no answer (refused, deadline, TLS).
        reason: the ``Status`` object's reason (``Conflict``, ``Forbidden``...) when given.
    """

    def __init__(self, message: str, *, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are.

    Attributes:
        server: ``https://host:port`` (a path prefix is kept).
        token: a bearer token given inline; ``token_file`` is read before each request instead.
        token_file: a file holding the bearer token (ServiceAccount, kubeconfig ``tokenFile``).
        ca_file: the CA bundle that signs the server's certificate; None = the system's.
        ca_data: the same as PEM text (kubeconfig ``certificate-authority-data``).
        cert_file / key_file: a client certificate and its key (PEM files).
        cert_data / key_data: the same as PEM text.
        insecure: skip the server certificate check (kubeconfig ``insecure-skip-tls-verify``).
        tls_server_name: the name the certificate must carry when it differs from the host.
        source: where these came from, for messages (``in-cluster``, a kubeconfig path).
    """

    server: str
    token: str | None = None
    token_file: str | None = None
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: str | None = None
    key_data: str | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    source: str = ""


def _text(path: str | Path) -> str:
    try:
        return read_bounded(path, max_bytes=MAX_CREDENTIAL_BYTES).decode()
    except UnicodeDecodeError:
        raise KubeConfigError(f"{path}: not UTF-8 text") from None


def in_cluster(env: Mapping[str, str], *,
               account_dir: Path = SERVICE_ACCOUNT_DIR) -> Credentials | None:
    """The pod's ServiceAccount credentials, or None outside a pod (no service host variable
    or no token file)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    token = account_dir / "token"
    if not host or not token.is_file():
        return None
    shown = f"[{host}]" if ":" in host else host
    ca = account_dir / "ca.crt"
    return Credentials(server=f"https://{shown}:{port}", token_file=str(token),
                       ca_file=str(ca) if ca.is_file() else None,
                       source=f"in-cluster ServiceAccount ({account_dir})")


def _named(items: Any, kind: str, path: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            body = item.get(kind)
            if not isinstance(body, dict):
                raise KubeConfigError(f"{path}: {kind} {item['name']!r} has no {kind} mapping")
            out.setdefault(item["name"], body)
    return out


def _resolve(value: Any, base: Path, key: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise KubeConfigError(f"{key} must be a string")
    return str((base / value) if not os.path.isabs(value) else Path(value))


def from_kubeconfig(paths: Sequence[str]) -> Credentials:
    """The current context's cluster and user from the kubeconfig files ``paths``, merged as
    kubectl merges ``$KUBECONFIG`` (the first file to set a name or the current context wins;
    relative file names are relative to the file that holds them)."""
    clusters: dict[str, tuple[dict[str, Any], Path]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    contexts: dict[str, dict[str, Any]] = {}
    current: str | None = None
    read: list[str] = []
    for name in paths:
        path = Path(name).expanduser()
        if not path.exists():
            continue  # kubectl skips a missing file of the list
        try:
            data = yaml.safe_load(_text(path))
        except yaml.YAMLError as exc:
            raise KubeConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())[:200]}"
                                  ) from None
        except OSError as exc:
            raise KubeConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
        if not isinstance(data, dict):
            raise KubeConfigError(f"{path}: not a kubeconfig (expected a mapping)")
        read.append(str(path))
        for cname, body in _named(data.get("clusters"), "cluster", path).items():
            clusters.setdefault(cname, (body, path.parent))
        for uname, body in _named(data.get("users"), "user", path).items():
            users.setdefault(uname, (body, path.parent))
        for xname, body in _named(data.get("contexts"), "context", path).items():
            contexts.setdefault(xname, body)
        if current is None and isinstance(data.get("current-context"), str) and \
                data["current-context"]:
            current = data["current-context"]
    if not read:
        raise KubeConfigError(f"no kubeconfig file found ({', '.join(paths) or 'none given'})")
    where = ", ".join(read)
    if current is None:
        raise KubeConfigError(f"{where}: no current-context")
    context = contexts.get(current)
    if context is None:
        raise KubeConfigError(f"{where}: current-context {current!r} is not defined")
    cluster_name, user_name = str(context.get("cluster", "")), str(context.get("user", ""))
    if cluster_name not in clusters:
        raise KubeConfigError(f"{where}: cluster {cluster_name!r} of context {current!r} is not "
                              "defined")
    cluster, cbase = clusters[cluster_name]
    user, ubase = users.get(user_name, ({}, Path()))
    for plugin in ("exec", "auth-provider"):
        if user.get(plugin):
            raise KubeConfigError(
                f"{where}: user {user_name!r} authenticates through an {plugin} plugin, which "
                "preflight does not run; give it a token, a tokenFile or a client certificate "
                "(or run in a pod with a ServiceAccount)")
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{where}: cluster {cluster_name!r} has no https:// server")
    token = user.get("token")
    return Credentials(
        server=server.rstrip("/"),
        token=token if isinstance(token, str) and token else None,
        token_file=_resolve(user.get("tokenFile"), ubase, "tokenFile"),
        ca_file=_resolve(cluster.get("certificate-authority"), cbase, "certificate-authority"),
        ca_data=_b64(cluster.get("certificate-authority-data"), "certificate-authority-data"),
        cert_file=_resolve(user.get("client-certificate"), ubase, "client-certificate"),
        key_file=_resolve(user.get("client-key"), ubase, "client-key"),
        cert_data=_b64(user.get("client-certificate-data"), "client-certificate-data"),
        key_data=_b64(user.get("client-key-data"), "client-key-data"),
        insecure=cluster.get("insecure-skip-tls-verify") is True,
        tls_server_name=cluster.get("tls-server-name") or None,
        source=f"kubeconfig {where}, context {current}")


def _b64(value: Any, key: str) -> str | None:
    if value is None or value == "":
        return None
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise KubeConfigError(f"{key} is not base64 of PEM text") from None


def find_credentials(env: Mapping[str, str], *,
                     account_dir: Path = SERVICE_ACCOUNT_DIR) -> Credentials:
    """In-cluster first, else ``$KUBECONFIG``, else ``~/.kube/config`` (client-go's order)."""
    found = in_cluster(env, account_dir=account_dir)
    if found is not None:
        return found
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if not listed:
        home = env.get("HOME") or str(Path.home())
        listed = [str(Path(home) / ".kube" / "config")]
    try:
        return from_kubeconfig(listed)
    except KubeConfigError as exc:
        raise KubeConfigError(f"no Kubernetes credentials: not in a pod with a ServiceAccount "
                              f"token ({account_dir}/token), and {exc}") from None


def _status_message(body: bytes) -> tuple[str, str]:
    """(message, reason) of a ``Status`` answer; the raw text when it is not one."""
    try:
        data = json.loads(body)
    except ValueError:
        return escape(body.decode(errors="replace"), 200), ""
    if isinstance(data, dict) and data.get("kind") == "Status":
        return escape(str(data.get("message", "")), 300), str(data.get("reason", ""))
    return escape(body.decode(errors="replace"), 200), ""


class _Connection(http.client.HTTPSConnection):
    """An HTTPS connection whose certificate must name ``server_name`` (kubeconfig
    ``tls-server-name``; the host otherwise)."""

    def __init__(self, host: str, port: int, *, timeout: float, context: ssl.SSLContext,
                 server_name: str) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._context_ = context
        self._server_name = server_name

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            self.sock = self._context_.wrap_socket(sock, server_hostname=self._server_name)
        except BaseException:
            sock.close()
            raise


class KubeClient:
    """HTTPS requests to the API server with a deadline each; JSON in, JSON out.

    Args:
        creds: where the server is and how to authenticate.
        timeout_s: deadline of one whole request (connect, TLS, send, answer).
        user_agent: sent as ``User-Agent`` (API server audit logs show it).
    """

    def __init__(self, creds: Credentials, *, timeout_s: float = 10.0,
                 user_agent: str = "cluster-preflight") -> None:
        url = urllib.parse.urlsplit(creds.server)
        if url.scheme != "https":
            raise KubeConfigError(f"{creds.source}: the server {creds.server} is not https://; "
                                  "preflight sends its token over TLS only")
        if not url.hostname:
            raise KubeConfigError(f"{creds.source}: the server {creds.server} has no host")
        self.creds = creds
        self.host = url.hostname
        self.port = url.port or 443
        self.prefix = url.path.rstrip("/")
        self.timeout_s = timeout_s
        self.user_agent = user_agent
        self._ssl = self._context()

    def _context(self) -> ssl.SSLContext:
        c = self.creds
        try:
            ctx = ssl.create_default_context(cafile=c.ca_file, cadata=c.ca_data)
            if c.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if c.cert_file or c.cert_data:
                self._load_client_cert(ctx)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise KubeConfigError(f"{c.source}: cannot use its TLS files: {exc}") from None
        return ctx

    def _load_client_cert(self, ctx: ssl.SSLContext) -> None:
        c = self.creds
        if c.cert_file and c.key_file:
            ctx.load_cert_chain(c.cert_file, c.key_file)
            return
        if not (c.cert_data or c.cert_file) or not (c.key_data or c.key_file):
            raise ValueError("a client certificate needs its key")
        # ssl loads certificates from files only: a private directory that lives for the call.
        with tempfile.TemporaryDirectory(prefix="preflight-kube-") as tmp:
            cert = c.cert_file or os.path.join(tmp, "cert.pem")
            key = c.key_file or os.path.join(tmp, "key.pem")
            for path, data in ((cert, c.cert_data), (key, c.key_data)):
                if data is not None and path.startswith(tmp):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "w") as f:
                        f.write(data)
            ctx.load_cert_chain(cert, key)

    def _token(self) -> str | None:
        if self.creds.token_file:
            try:
                token = _text(self.creds.token_file).strip()
            except (OSError, KubeConfigError) as exc:
                raise KubeApiError(f"cannot read the token {self.creds.token_file}: {exc}"
                                   ) from None
            return token or None
        return self.creds.token

    def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                body: Any = None, content_type: str = "application/json",
                accept: str = "application/json") -> Any:
        """``method path`` with ``body`` as JSON; the decoded JSON answer.

        Raises:
            KubeApiError: an error status (with the server's message and reason), no answer
                within ``timeout_s``, a refused connection, a TLS failure, or an answer that is
                not JSON or larger than :data:`MAX_RESPONSE_BYTES`.
        """
        target = self.prefix + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        headers = {"Accept": accept, "User-Agent": self.user_agent}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        deadline = time.monotonic() + self.timeout_s
        what = f"{method} {path}"
        conn = _Connection(self.host, self.port, timeout=self.timeout_s, context=self._ssl,
                           server_name=self.creds.tls_server_name or self.host)
        try:
            conn.request(method, target, body=data, headers=headers)
            resp = conn.getresponse()
            raw = self._read(resp, deadline, what)
        except TimeoutError:
            raise KubeApiError(f"{what}: {self.creds.server} did not answer within "
                               f"{self.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise KubeApiError(f"{what}: {self.creds.server}: {type(exc).__name__}: "
                               f"{escape(str(exc), 300)}") from None
        finally:
            with contextlib.suppress(OSError):
                conn.close()
        if resp.status >= 300:
            message, reason = _status_message(raw)
            raise KubeApiError(f"{what}: {resp.status} {reason or resp.reason}: {message}",
                               status=resp.status, reason=reason)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise KubeApiError(f"{what}: the answer is not JSON", status=resp.status) from None

    def _read(self, resp: http.client.HTTPResponse, deadline: float, what: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            chunk = resp.read(65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise KubeApiError(f"{what}: the answer is larger than {MAX_RESPONSE_BYTES} bytes",
                                   status=resp.status)
            chunks.append(chunk)


__all__ = ["JSON_PATCH", "MERGE_PATCH", "STRATEGIC_MERGE", "TABLE", "Credentials", "KubeApiError",
           "KubeClient", "KubeConfigError", "find_credentials", "from_kubeconfig", "in_cluster"]
