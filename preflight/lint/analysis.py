"""The static analysis behind ``preflight lint``: one module's AST, never its execution.

Everything is read from the syntax tree of one file: which names the imports bind, what each
name or attribute (``rank``, ``self.gpu_id``, ``args.rank``) was assigned in its scope, and which
of the file's own functions a value is passed to. Values are followed through assignments,
aliases (``Sampler = RandomSampler if single else DistributedSampler``) and the calls within the
file, a few levels deep; whatever comes from another module is unknown, and an unknown value
never makes a rule speak (precision first: a rule says "not sure" only where docs/lint.md says).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from preflight.lint.rules import Severity

#: Environment variables the launchers set, by what they hold.
GLOBAL_RANK_VARS = frozenset({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                              "PMIX_RANK"})
LOCAL_RANK_VARS = frozenset({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                             "MPI_LOCALRANKID"})
LOCAL_SIZE_VARS = frozenset({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                             "SLURM_NTASKS_PER_NODE"})
SIZE_VARS = frozenset({"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"})
NODE_VARS = frozenset({"NODE_RANK", "GROUP_RANK", "SLURM_NODEID", "NNODES", "SLURM_NNODES"})
RANK_LIKE_VARS = GLOBAL_RANK_VARS | LOCAL_RANK_VARS | LOCAL_SIZE_VARS | SIZE_VARS | NODE_VARS
#: Calls that make a script distributed (the last part of the called name).
DISTRIBUTED_CALLS = ("init_process_group", "DistributedDataParallel", "FullyShardedDataParallel",
                     "fully_shard", "DistributedSampler", "init_distributed", "spawn")

GLOBAL, LOCAL, LOCAL_SIZE = "global", "local", "local_size"

_PARAM = ast.Constant(value=None)  # marks "a parameter of the scope": its value comes from a call
_UNKNOWN = ast.Constant(value=None)  # marks an assignment whose value the rules cannot tell

_EVAL_WORDS = ("val", "valid", "validation", "test", "testing", "eval", "evaluation", "dev")
_GUARD_WORDS = ("rank", "distributed", "ddp", "world", "main", "master", "device_count", "gpu",
                "cuda", "local", "dist", "multi", "parallel", "fsdp", "nproc", "single")
_MULTI_NODE_WORDS = ("node_rank", "nnodes", "num_nodes", "n_nodes", "nodes", "node_count",
                     "num_machines", "machine_rank")
_LOCALHOST = re.compile(r"^(tcp://)?(localhost|127\.0\.0\.1|\[::1\]|::1)(:\d+)?/?$")
_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange",
                        "tensor", "as_tensor", "eye", "linspace", "zeros_like", "ones_like",
                        "empty_like", "full_like", "rand_like", "randn_like"})

Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
Loop = ast.For | ast.AsyncFor | ast.While


@dataclass(frozen=True, slots=True)
class LintFinding:
    """One mistake in a script at ``line``:``col`` (both 1-based, as flake8 prints them); not
    the node checks' :class:`preflight.core.result.Finding`."""

    rule: str
    line: int
    col: int
    message: str
    severity: Severity = Severity.ERROR

    @property
    def sure(self) -> bool:
        return self.severity is Severity.ERROR


def key_of(node: ast.AST) -> str | None:
    """``rank``, ``self.gpu_id``, ``args.rank``, ``opt['rank']``: the name an expression reads
    or writes, None when it is not a plain name/attribute/constant-subscript chain."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = key_of(node.value)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
            isinstance(node.slice.value, str | int):
        base = key_of(node.value)
        return None if base is None else f"{base}[{node.slice.value!r}]"
    return None


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", text.lower()) if w]


def _is_eval_name(text: str) -> bool:
    return any(w.startswith(_EVAL_WORDS) for w in _words(text))


def _short(node: ast.AST, limit: int = 40) -> str:
    try:
        text = ast.unparse(node)
    except (ValueError, TypeError, AttributeError, RecursionError):
        return "..."
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


#: Fields that never hold a child node (names, flags, the shared Load/Store context): the walk
#: does not look into them.
_LEAF_FIELDS = frozenset({"ctx", "id", "attr", "name", "arg", "module", "type_comment", "kind",
                          "level", "is_async", "conversion", "simple", "tag"})
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
#: The nodes that bind a name or import one, handled in the walk's order after it.
_BINDERS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.Assign,
            ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.For, ast.AsyncFor,
            ast.comprehension, ast.withitem)
_BINDER_SET = frozenset(_BINDERS)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)


def _child_fields(cls: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = _CHILD_FIELDS[cls] = tuple(
            f for f in getattr(cls, "_fields", ()) if f not in _LEAF_FIELDS)
    return fields


class Module:
    """One parsed file with the indexes the rules share, built in one walk of the tree."""

    def __init__(self, tree: ast.Module) -> None:
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.imports: dict[str, str] = {}
        self.functions: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
        self.assigns: dict[ast.AST, dict[str, list[ast.AST]]] = {}
        self.class_assigns: dict[ast.ClassDef, dict[str, list[ast.AST]]] = {}
        self._scopes: dict[ast.AST, Scope] = {}
        self._quals: dict[ast.AST, str | None] = {}
        self._values: dict[tuple[str, ast.AST], list[ast.AST] | None] = {}
        self._environ_copies: dict[tuple[str, ast.AST], bool] = {}
        self.by_type: dict[type, list[ast.AST]] = {}
        self._index()
        self.calls: list[ast.Call] = self.by_type.get(ast.Call, [])  # type: ignore[assignment]
        self.compares: list[ast.Compare] = \
            self.by_type.get(ast.Compare, [])  # type: ignore[assignment]
        self.returns: list[ast.Return] = self.by_type.get(ast.Return, [])  # type: ignore[assignment]

    # -- indexing -------------------------------------------------------------------------
    def _index(self) -> None:
        """One walk: every node's parent, the nodes by type (in the walk's order), then the
        imports and bindings."""
        parents = self.parents
        by_type = self.by_type
        binders: list[ast.AST] = []
        stack: list[ast.AST] = [self.tree]
        pop, push = stack.pop, stack.append
        fields_of = _CHILD_FIELDS.get
        node_type = ast.AST
        while stack:
            node = pop()
            cls = type(node)
            bucket = by_type.get(cls)
            if bucket is None:
                by_type[cls] = [node]
            else:
                bucket.append(node)
            if cls in _BINDER_SET:
                binders.append(node)
            fields = fields_of(cls)
            if fields is None:
                fields = _child_fields(cls)
            for name in fields:
                value = getattr(node, name, None)
                if type(value) is list:
                    for child in value:
                        if isinstance(child, node_type):
                            parents[child] = node
                            push(child)
                elif isinstance(value, node_type):
                    parents[value] = node
                    push(value)
        for node in binders:
            self._index_binder(node)

    def _index_binder(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.imports[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    self.imports[root] = root
        elif isinstance(node, ast.ImportFrom):
            if node.module and not node.level:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            self.functions.setdefault(node.name, []).append(node)
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                        *([args.vararg] if args.vararg else []),
                        *([args.kwarg] if args.kwarg else [])]:
                self.assigns.setdefault(node, {}).setdefault(arg.arg, []).append(_PARAM)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind(target, node.value, node)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self._bind(node.target, node.value, node)
        elif isinstance(node, ast.AugAssign):
            self._bind(node.target, _UNKNOWN, node)
        elif isinstance(node, ast.NamedExpr):
            self._bind(node.target, node.value, node)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            self._bind(node.target, _UNKNOWN, node)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bind(node.optional_vars, _UNKNOWN, node.optional_vars)

    def nodes_of(self, *kinds: type) -> list[ast.AST]:
        """The file's nodes of these types (each type in the walk's order)."""
        if len(kinds) == 1:
            return self.by_type.get(kinds[0], [])
        return [n for kind in kinds for n in self.by_type.get(kind, ())]

    @functools.cached_property
    def strings(self) -> list[ast.Constant]:
        return [c for c in self.by_type.get(ast.Constant, ())  # type: ignore[misc]
                if isinstance(c.value, str)]  # type: ignore[attr-defined]

    @functools.cached_property
    def identifiers(self) -> frozenset[str]:
        """Every name and attribute name, lowercased."""
        names = {n.id.lower() for n in self.by_type.get(ast.Name, ())}  # type: ignore[attr-defined]
        names.update(n.attr.lower()  # type: ignore[attr-defined]
                     for n in self.by_type.get(ast.Attribute, ()))
        return frozenset(names)

    def _bind(self, target: ast.AST, value: ast.AST, at: ast.AST) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            values = value.elts if isinstance(value, ast.Tuple | ast.List) and \
                len(value.elts) == len(target.elts) else None
            for i, elt in enumerate(target.elts):
                self._bind(elt, values[i] if values else _UNKNOWN, at)
            return
        if isinstance(target, ast.Starred):
            self._bind(target.value, _UNKNOWN, at)
            return
        key = key_of(target)
        if key is None:
            return
        scope = self.scope_of(at)
        self.assigns.setdefault(scope, {}).setdefault(key, []).append(value)
        if key.startswith("self."):
            cls = self.class_of(scope)
            if cls is not None:
                self.class_assigns.setdefault(cls, {}).setdefault(key, []).append(value)

    # -- navigation -----------------------------------------------------------------------
    def scope_of(self, node: ast.AST) -> Scope:
        """The nearest enclosing function, lambda or the module (remembered on the way up)."""
        known = self._scopes.get(node)
        if known is not None:
            return known
        path = [node]
        cur = self.parents.get(node)
        scope: Scope = self.tree
        while cur is not None:
            if isinstance(cur, _SCOPES):
                scope = cur
                break
            known = self._scopes.get(cur)
            if known is not None:
                scope = known
                break
            path.append(cur)
            cur = self.parents.get(cur)
        for seen in path:
            self._scopes[seen] = scope
        return scope

    def class_of(self, scope: ast.AST) -> ast.ClassDef | None:
        parent = self.parents.get(scope)
        return parent if isinstance(parent, ast.ClassDef) else None

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        """Enclosing nodes up to (not past) the node's scope."""
        cur = self.parents.get(node)
        while cur is not None:
            yield cur
            if isinstance(cur, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.Module):
                return
            cur = self.parents.get(cur)

    def enclosing_loops(self, node: ast.AST) -> list[Loop]:
        loops: list[Loop] = []
        child: ast.AST = node
        for anc in self.ancestors(node):
            # The loop's own iterable (`for b in loader`) runs once: only its body repeats.
            if isinstance(anc, ast.While | ast.For | ast.AsyncFor) and \
                    not (isinstance(anc, ast.For | ast.AsyncFor) and child is anc.iter):
                loops.append(anc)
            child = anc
        return loops

    def qualname(self, node: ast.AST) -> str | None:
        """``torch.utils.data.DistributedSampler`` for ``DistributedSampler`` (from its import),
        ``torch.distributed.get_rank`` for ``dist.get_rank``; None when the root is not an
        import."""
        if isinstance(node, ast.Name):
            return self.imports.get(node.id)
        if not isinstance(node, ast.Attribute):
            return None
        quals = self._quals
        if node in quals:
            return quals[node]
        base = self.qualname(node.value)
        qual = quals[node] = None if base is None else f"{base}.{node.attr}"
        return qual

    def values(self, key: str, at: ast.AST) -> list[ast.AST] | None:
        """What ``key`` was assigned where ``at`` reads it; None when nothing in the file
        assigns it (an import, a builtin, a name from elsewhere). Remembered per scope."""
        scope = self.scope_of(at)
        memo = (key, scope)
        if memo in self._values:
            return self._values[memo]
        found = self._values[memo] = self._values_in(key, scope)
        return found

    def _values_in(self, key: str, scope: Scope) -> list[ast.AST] | None:
        if key.startswith("self."):
            cls = self.class_of(scope)
            if cls is None:
                return None
            found = self.class_assigns.get(cls, {}).get(key)
            if found is None and key.count(".") == 1:
                found = self._property_returns(cls, key[len("self."):])
            return found
        cur: ast.AST | None = scope
        while cur is not None:
            found = self.assigns.get(cur, {}).get(key)
            if found:
                return found
            cur = self.scope_of(cur) if cur is not self.tree else None
        if "." in key or "[" in key:  # `args.rank = ...` in another function of the file
            collected = [v for table in self.assigns.values() for v in table.get(key, [])]
            return collected or None
        return None

    def _property_returns(self, cls: ast.ClassDef, name: str) -> list[ast.AST] | None:
        """What ``self.name`` gives when ``name`` is a ``@property`` of the class: the values
        its body returns (read in the property's own scope)."""
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == name and any(
                    (isinstance(d, ast.Name) and d.id == "property") or
                    (isinstance(d, ast.Attribute) and d.attr == "cached_property")
                    for d in item.decorator_list):
                returns: list[ast.AST] = [r.value for r in self.returns
                                          if r.value is not None and self.scope_of(r) is item]
                return returns or None
        return None

    def constructor(self, call: ast.Call) -> ast.FunctionDef | None:
        """``__init__`` of the file's own class that ``call`` instantiates (``Trainer(...)``)."""
        func = call.func
        if not isinstance(func, ast.Name) or func.id in self.imports:
            return None
        classes = [n for n in self.by_type.get(ast.ClassDef, ())
                   if n.name == func.id]  # type: ignore[attr-defined]
        if len(classes) != 1:
            return None
        inits = [n for n in classes[0].body  # type: ignore[attr-defined]
                 if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        return inits[0] if len(inits) == 1 else None

    def called_in_loop(self, func: ast.AST) -> bool:
        """Whether the file calls ``func`` (by its name, or as ``self.name``) inside a loop."""
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            return False
        for call in self.calls:
            if self.callee_name(call) == func.name and self.enclosing_loops(call):
                return True
        return False

    @staticmethod
    def callee_name(call: ast.Call) -> str | None:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and \
                func.value.id in ("self", "cls"):
            return func.attr
        return None

    def local_function(self, call: ast.Call) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        name = self.callee_name(call)
        if name is None or name in self.imports:
            return None
        defs = self.functions.get(name)
        return defs[0] if defs and len(defs) == 1 else None

    # -- value classification -------------------------------------------------------------
    def env_var(self, node: ast.AST) -> str | None:
        """``RANK`` for ``os.environ["RANK"]``, ``os.environ.get("RANK", 0)``, ``os.getenv``,
        or a subscript of a dict copied from os.environ: the raw ``str`` read."""
        key: ast.AST | None = None
        source: ast.AST | None = None
        if isinstance(node, ast.Subscript):
            key, source = node.slice, node.value
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            qual = self.qualname(node.func)
            if qual in ("os.getenv", "os.environ.get"):
                key, source = node.args[0], None
            elif node.func.attr == "get":
                key, source = node.args[0], node.func.value
        elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Name) and \
                self.imports.get(node.func.id) == "os.getenv":
            key, source = node.args[0], None
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            return None
        if source is not None and not self._is_environ(source, node):
            return None
        return key.value

    def _is_environ(self, node: ast.AST, at: ast.AST) -> bool:
        """``os.environ`` itself, or a name every assignment of which involves it (a copy)."""
        if self.qualname(node) == "os.environ":
            return True
        name = key_of(node)
        if name is None:
            return False
        memo = (name, self.scope_of(at))
        known = self._environ_copies.get(memo)
        if known is None:
            found = self.values(name, at) or []
            known = self._environ_copies[memo] = bool(found) and all(
                v is not _PARAM and v is not _UNKNOWN and any(
                    self.qualname(n) == "os.environ" for n in ast.walk(v))
                for v in found)
        return known

    def rank_kind(self, node: ast.AST, depth: int = 0) -> str | None:
        """``global`` (RANK, dist.get_rank()), ``local`` (LOCAL_RANK) or ``local_size`` (GPUs
        of one node) when every way the value can take says so; None otherwise."""
        if depth > 6:
            return None
        if isinstance(node, ast.Call):
            qual = self.qualname(node.func) or ""
            if isinstance(node.func, ast.Name) and node.func.id == "int" and len(node.args) == 1:
                return self.rank_kind(node.args[0], depth + 1)
            var = self.env_var(node)
            if var is not None:
                return _kind_of_var(var)
            tail = qual.rsplit(".", 1)[-1]
            if qual.startswith(("torch.distributed", "deepspeed")) and not node.args and \
                    not node.keywords:
                if tail in ("get_rank", "get_global_rank"):
                    return GLOBAL
                if tail in ("get_node_local_rank", "get_local_rank"):
                    return LOCAL
            if qual == "torch.cuda.device_count":
                return LOCAL_SIZE
            return None
        if isinstance(node, ast.Subscript):
            var = self.env_var(node)
            if var is not None:
                return _kind_of_var(var)
        if isinstance(node, ast.IfExp):
            kinds = {self.rank_kind(node.body, depth + 1), self.rank_kind(node.orelse, depth + 1)}
            return kinds.pop() if len(kinds) == 1 else None
        if isinstance(node, ast.BoolOp):
            kinds = {self.rank_kind(v, depth + 1) for v in node.values
                     if not isinstance(v, ast.Constant)}
            return kinds.pop() if len(kinds) == 1 else None
        name = key_of(node)
        if name is None:
            return None
        found = self.values(name, node)
        if not found:
            return _kind_by_name(name)
        seen: set[str | None] = set()
        for value in found:
            if value is _UNKNOWN:
                return None
            if value is _PARAM:
                seen.add(self._param_kind(name, node, depth))
            else:
                seen.add(self.rank_kind(value, depth + 1))
        return seen.pop() if len(seen) == 1 else None

    def _param_kind(self, name: str, at: ast.AST, depth: int) -> str | None:
        """The kind every call of the enclosing function passes for parameter ``name``."""
        func = self.scope_of(at)
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
        if params and params[0] in ("self", "cls") and self.class_of(func) is not None:
            params = params[1:]
        kinds: set[str | None] = set()
        for call in self.calls:
            if self.callee_name(call) != func.name:
                continue
            arg = _argument(call, params, name)
            kinds.add(None if arg is None else self.rank_kind(arg, depth + 1))
        if not kinds:
            return _kind_by_name(name)
        return kinds.pop() if len(kinds) == 1 else None

    # -- whole-file facts -----------------------------------------------------------------
    @functools.cached_property
    def env_subscripts(self) -> list[tuple[ast.Subscript, str]]:
        """Every ``os.environ[...]`` (or a copy of it) subscript, with the variable."""
        if "environ" not in self.identifiers:
            return []
        out: list[tuple[ast.Subscript, str]] = []
        for node in self.by_type.get(ast.Subscript, ()):
            var = self.env_var(node)
            if var is not None and isinstance(node, ast.Subscript):
                out.append((node, var))
        return out

    @functools.cached_property
    def distributed(self) -> bool:
        return self.is_distributed()

    def is_distributed(self) -> bool:
        for call in self.calls:
            qual = self.qualname(call.func) or ""
            tail = qual.rsplit(".", 1)[-1]
            if tail in DISTRIBUTED_CALLS:
                return True
            var = self.env_var(call)
            if var in RANK_LIKE_VARS:
                return True
        return any(var in RANK_LIKE_VARS for _n, var in self.env_subscripts)

    def single_node(self) -> bool:
        """The file itself pins one node: MASTER_ADDR set to the loopback, an init_method /
        rendezvous address on the loopback, or CUDA_VISIBLE_DEVICES set to a fixed list."""
        return self._single_node

    @functools.cached_property
    def _single_node(self) -> bool:
        for sub, var in self.env_subscripts:
            parent = self.parents.get(sub)
            if not (isinstance(parent, ast.Assign) and sub in parent.targets):
                continue
            if var == "MASTER_ADDR" and _is_localhost(parent.value):
                return True
            # `os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"`: the script picks GPUs of the one
            # machine it was written for (a value from an option or elsewhere does not count).
            if var == "CUDA_VISIBLE_DEVICES" and isinstance(parent.value, ast.Constant) and \
                    isinstance(parent.value.value, str):
                return True
        for call in self.calls:
            for kw in call.keywords:
                if kw.arg == "init_method" and _is_localhost(kw.value):
                    return True
        return False

    def multi_node(self) -> bool:
        """The file reads a node rank or a node count (or names one), so it is meant to run on
        several nodes."""
        return self._multi_node

    @functools.cached_property
    def _multi_node(self) -> bool:
        if any(word in self.identifiers for word in _MULTI_NODE_WORDS):
            return True
        for const in self.strings:
            text = str(const.value).lower().lstrip("-").replace("-", "_")
            if text in _MULTI_NODE_WORDS or text in {v.lower() for v in NODE_VARS}:
                return True
        return False

    def writes_cuda_visible_devices(self) -> bool:
        return any(isinstance(n.ctx, ast.Store) and var == "CUDA_VISIBLE_DEVICES"
                   for n, var in self.env_subscripts)


def _kind_of_var(var: str) -> str | None:
    if var in GLOBAL_RANK_VARS:
        return GLOBAL
    if var in LOCAL_RANK_VARS:
        return LOCAL
    if var in LOCAL_SIZE_VARS:
        return LOCAL_SIZE
    return None


def _kind_by_name(name: str) -> str | None:
    """Only for values nothing in the file assigns (argparse options, parameters no call of the
    file fills): a name that says local rank or GPUs per node."""
    last = name.rsplit(".", 1)[-1].rsplit("[", 1)[-1].strip("'\"]").lower()
    if last in ("local_rank", "localrank", "local_process_index"):
        return LOCAL
    if last in ("ngpus_per_node", "gpus_per_node", "nproc_per_node", "local_world_size",
                "n_gpus_per_node", "num_gpus_per_node"):
        return LOCAL_SIZE
    return None


def _is_localhost(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        bool(_LOCALHOST.match(node.value.strip()))


def _argument(call: ast.Call, params: list[str], name: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if name in params:
        i = params.index(name)
        if i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
            return call.args[i]
    return None


def mentions(node: ast.AST, key: str) -> bool:
    return any(key_of(n) == key for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute))


def iter_nodes(node: ast.AST, kinds: type | tuple[type, ...]) -> Iterable[ast.AST]:
    return (n for n in ast.walk(node) if isinstance(n, kinds))


__all__ = ["DISTRIBUTED_CALLS", "GLOBAL", "LOCAL", "LOCAL_SIZE", "LintFinding", "Module",
           "iter_nodes", "key_of", "mentions"]
