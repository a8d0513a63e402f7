"""The three patch formats of the Kubernetes API, applied with their real semantics.

* JSON patch (RFC 6902, ``application/json-patch+json``): add / remove / replace / move / copy /
  test on JSON pointers (RFC 6901).
* JSON merge patch (RFC 7386, ``application/merge-patch+json``): maps merge, ``null`` deletes, a
  list replaces the list.
* Strategic merge patch (``application/strategic-merge-patch+json``, apimachinery's
  ``strategicpatch``): a list merges or is replaced according to the field's
  ``x-kubernetes-patch-strategy`` / ``x-kubernetes-patch-merge-key`` in the Kubernetes OpenAPI
  schema (read from kubernetes-validate's copy of the 1.37 schema, not typed in here):
  ``status.conditions`` and ``status.addresses`` merge by ``type``, ``metadata.finalizers`` as
  a set, ``spec.taints`` (``x-kubernetes-list-type: atomic``, no strategy) is replaced whole.
  Directives: ``$patch: delete`` / ``replace`` / ``merge``, ``$setElementOrder/<list>``,
  ``$deleteFromPrimitiveList/<list>``, ``$retainKeys``.

Errors are :class:`PatchError` with the HTTP status the API server answers: 400 for a patch it
cannot decode, 422 for one that does not apply (a failed ``test``, a missing path).
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate

SCHEMA = (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / "v1.37.0-local"
          / "_definitions.json")


class PatchError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@cache
def _defs() -> dict[str, Any]:
    defs: dict[str, Any] = json.loads(SCHEMA.read_text())["$defs"]
    return defs


def _resolve(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    while schema is not None and "$ref" in schema:
        schema = _defs()[schema["$ref"].rsplit("/", 1)[1]]
    if schema is not None and "allOf" in schema and len(schema["allOf"]) == 1:
        return _resolve(schema["allOf"][0])
    return schema


def definition(name: str) -> dict[str, Any]:
    found = _resolve({"$ref": f"#/$defs/{name}"})
    assert found is not None
    return found


# ---- JSON pointer and JSON patch ----

def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(400, f"JSON pointer {pointer!r} does not start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Any, pointer: str, op: str) -> tuple[Any, str]:
    tokens = _tokens(pointer)
    if not tokens:
        raise PatchError(422, f"jsonpatch {op} operation does not apply: the whole document")
    node = doc
    for t in tokens[:-1]:
        node = _child(node, t, op, pointer)
    return node, tokens[-1]


def _child(node: Any, token: str, op: str, pointer: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    raise PatchError(422, f"jsonpatch {op} operation does not apply: doc is missing path: "
                          f"{pointer!r}")


def _get(doc: Any, pointer: str, op: str) -> Any:
    node = doc
    for t in _tokens(pointer):
        node = _child(node, t, op, pointer)
    return node


def _add(doc: Any, pointer: str, value: Any, op: str = "add") -> None:
    parent, key = _parent(doc, pointer, op)
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list):
        if key == "-":
            parent.append(value)
        elif key.isdigit() and int(key) <= len(parent):
            parent.insert(int(key), value)
        else:
            raise PatchError(422, f"jsonpatch {op} operation does not apply: index {key} out of "
                                  f"range at {pointer!r}")
    else:
        raise PatchError(422, f"jsonpatch {op} operation does not apply: doc is missing path: "
                              f"{pointer!r}")


def _remove(doc: Any, pointer: str, op: str = "remove") -> Any:
    parent, key = _parent(doc, pointer, op)
    if isinstance(parent, dict) and key in parent:
        return parent.pop(key)
    if isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
        return parent.pop(int(key))
    raise PatchError(422, f"jsonpatch {op} operation does not apply: doc is missing path: "
                          f"{pointer!r}")


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902: every operation in order, all or nothing."""
    if not isinstance(ops, list):
        raise PatchError(400, "json patch must be a list of operations")
    out = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or not isinstance(op.get("op"), str) or \
                not isinstance(op.get("path"), str):
            raise PatchError(400, f"invalid json patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(400, f"jsonpatch {kind} operation has no value")
        if kind == "add":
            _add(out, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(out, path)
        elif kind == "replace":
            _remove(out, path, "replace")
            _add(out, path, copy.deepcopy(op["value"]), "replace")
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchError(400, f"jsonpatch {kind} operation has no from")
            value = _remove(out, source, kind) if kind == "move" else copy.deepcopy(
                _get(out, source, kind))
            _add(out, path, value, kind)
        elif kind == "test":
            try:
                actual = _get(out, path, "test")
            except PatchError:
                raise PatchError(422, f"testing value {path} failed: no such path") from None
            if actual != op["value"]:
                raise PatchError(422, f"testing value {path} failed")
        else:
            raise PatchError(400, f"unexpected json patch operation {kind!r}")
    return out


# ---- JSON merge patch ----

def merge_patch(doc: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# ---- strategic merge patch ----

def _field(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if schema is None:
        return None
    props = schema.get("properties")
    if isinstance(props, dict) and key in props:
        return props[key]  # type: ignore[no-any-return]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def strategic_merge(doc: Any, patch: Any, schema: dict[str, Any] | None) -> Any:
    """apimachinery's strategic merge of ``patch`` into ``doc`` for an object of ``schema``."""
    if not isinstance(patch, dict):
        raise PatchError(400, "a strategic merge patch must be a JSON object")
    return _merge_map(doc if isinstance(doc, dict) else {}, patch, _resolve(schema))


def _merge_map(doc: dict[str, Any], patch: dict[str, Any],
               schema: dict[str, Any] | None) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "delete":
        return {}
    if directive == "replace":
        return {k: v for k, v in copy.deepcopy(patch).items() if k != "$patch"}
    if directive not in (None, "merge"):
        raise PatchError(400, f"unknown patch type: {directive!r}")
    out = copy.deepcopy(doc)
    retain = patch.get("$retainKeys")
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    deletes = {k.split("/", 1)[1]: v for k, v in patch.items()
               if k.startswith("$deleteFromPrimitiveList/")}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
            continue
        sub = _resolve(_field(schema, key))
        if isinstance(value, dict):
            base = out.get(key)
            out[key] = _merge_map(base if isinstance(base, dict) else {}, value, sub)
        elif isinstance(value, list):
            base = out.get(key)
            out[key] = _merge_list(base if isinstance(base, list) else [], value, sub)
        else:
            out[key] = copy.deepcopy(value)
    for key, items in deletes.items():
        if isinstance(out.get(key), list):
            out[key] = [v for v in out[key] if v not in items]
    for key, order in orders.items():
        sub = _resolve(_field(schema, key))
        merge_key = sub.get("x-kubernetes-patch-merge-key") if sub else None
        if isinstance(out.get(key), list) and isinstance(order, list):
            out[key] = _reorder(out[key], order, merge_key)
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _reorder(items: list[Any], order: list[Any], merge_key: str | None) -> list[Any]:
    def ident(v: Any) -> Any:
        return v.get(merge_key) if merge_key and isinstance(v, dict) else json.dumps(v)

    wanted = [ident(v) for v in order]
    ranked = sorted(items, key=lambda v: wanted.index(ident(v)) if ident(v) in wanted
                    else len(wanted))
    return ranked


def _merge_list(doc: list[Any], patch: list[Any], schema: dict[str, Any] | None) -> list[Any]:
    strategy = str((schema or {}).get("x-kubernetes-patch-strategy", ""))
    merge_key = (schema or {}).get("x-kubernetes-patch-merge-key")
    if "merge" not in strategy.split(","):
        # No patch strategy (atomic lists, spec.taints among them): the patch replaces the list.
        return [v for v in copy.deepcopy(patch) if not (isinstance(v, dict) and "$patch" in v)]
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [v for v in copy.deepcopy(patch) if not (isinstance(v, dict) and "$patch" in v)]
    item_schema = _resolve((schema or {}).get("items"))
    if merge_key is None:  # a list of primitives with strategy merge: a union, order kept
        out = copy.deepcopy(doc)
        out += [v for v in patch if v not in out]
        return out
    out = copy.deepcopy(doc)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise PatchError(400, f"map: {item!r} does not contain declared merge key: "
                                  f"{merge_key}")
        at = next((i for i, v in enumerate(out) if isinstance(v, dict)
                   and v.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                out.pop(at)
            continue
        if at is None:
            out.append({k: v for k, v in copy.deepcopy(item).items() if k != "$patch"})
        else:
            out[at] = _merge_map(out[at], item, item_schema)
    return out


__all__ = ["PatchError", "definition", "json_patch", "merge_patch", "strategic_merge"]
