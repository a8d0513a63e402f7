"""The seven rules, each a function from a :class:`Module` to its findings."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from preflight.lint.analysis import (
    _FACTORIES,
    _GUARD_WORDS,
    _PARAM,
    _UNKNOWN,
    DISTRIBUTED_CALLS,
    GLOBAL,
    LOCAL,
    LOCAL_SIZE,
    RANK_LIKE_VARS,
    LintFinding,
    Module,
    _argument,
    _is_eval_name,
    _short,
    key_of,
    mentions,
)
from preflight.lint.rules import Severity

_LOOP_DEPTH = 4  # how many calls deep a loader is followed through the file's own functions


def _at(rule: str, node: ast.AST, message: str, severity: Severity = Severity.ERROR) -> LintFinding:
    return LintFinding(rule, getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1,
                       message, severity)


def _tail(m: Module, node: ast.AST) -> str:
    qual = m.qualname(node)
    if qual is not None:
        return qual.rsplit(".", 1)[-1]
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


# -- DDP101 -------------------------------------------------------------------------------

def _is_sampler_class(m: Module, node: ast.AST, depth: int = 0) -> bool:
    """``DistributedSampler`` itself, or a name bound to it (also as one branch of an ``if``)."""
    qual = m.qualname(node) or ""
    if qual.startswith(("torch.", "torchvision.")) and qual.endswith(".DistributedSampler"):
        return True
    if isinstance(node, ast.IfExp):
        return _is_sampler_class(m, node.body, depth + 1) or \
            _is_sampler_class(m, node.orelse, depth + 1)
    key = key_of(node)
    if key is None or depth > 3 or key in m.imports:
        return False
    found = m.values(key, node) or []
    return any(v is not _PARAM and v is not _UNKNOWN and _is_sampler_class(m, v, depth + 1)
               for v in found)


def _shuffle_on(m: Module, sampler: ast.Call, via: ast.Call | None) -> bool:
    """Shuffling unless ``shuffle=False`` is written (at the call, or at the call of the file's
    function that builds the sampler from its ``shuffle`` parameter)."""
    value = _kw(sampler, "shuffle")
    if value is None and len(sampler.args) >= 4:
        value = sampler.args[3]
    if value is None:
        return True
    if isinstance(value, ast.Constant):
        return bool(value.value)
    if via is not None and isinstance(value, ast.Name):
        func = m.local_function(via)
        if func is not None:
            params = [a.arg for a in func.args.args]
            arg = _argument(via, params, value.id)
            if isinstance(arg, ast.Constant):
                return bool(arg.value)
    return True


def _sampler_builders(m: Module) -> dict[str, ast.Call]:
    """The file's functions that return a DistributedSampler: name -> the sampler call."""
    out: dict[str, ast.Call] = {}
    for ret in m.returns:
        scope = m.scope_of(ret)
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) and \
                len(m.functions.get(scope.name, ())) == 1 and \
                isinstance(ret.value, ast.Call) and _is_sampler_class(m, ret.value.func):
            out[scope.name] = ret.value
    return out


def _sampler_sites(m: Module) -> list[tuple[ast.Call, ast.Call, bool]]:
    cached = m.__dict__.get("_sampler_sites")
    if cached is None:
        cached = m.__dict__["_sampler_sites"] = list(_find_sampler_sites(m))
    return cached  # type: ignore[no-any-return]


def _find_sampler_sites(m: Module) -> Iterator[tuple[ast.Call, ast.Call, bool]]:
    """(where it is created, the DistributedSampler call itself, shuffle on)."""
    if "DistributedSampler".lower() not in m.identifiers:
        return
    builders = _sampler_builders(m)
    for call in m.calls:
        if _is_sampler_class(m, call.func):
            if not any(isinstance(a, ast.Return) and a.value is call
                       for a in m.ancestors(call)) or m.scope_of(call) is m.tree:
                yield call, call, _shuffle_on(m, call, None)
        else:
            name = m.callee_name(call)
            if name in builders and m.local_function(call) is not None:
                yield call, builders[name], _shuffle_on(m, builders[name], call)


def _target_key(m: Module, node: ast.AST) -> str | None:
    """The key an expression is assigned to (through an ``x if c else None``)."""
    parent = m.parents.get(node)
    if isinstance(parent, ast.IfExp):
        return _target_key(m, parent)
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return key_of(parent.targets[0])
    if isinstance(parent, ast.AnnAssign | ast.NamedExpr):
        return key_of(parent.target)
    return None


def _loader_of(m: Module, site: ast.Call, sampler_key: str | None) -> ast.Call | None:
    """The DataLoader call that takes the sampler (inline, or by its name)."""
    parent = m.parents.get(site)
    if isinstance(parent, ast.keyword) and parent.arg in ("sampler", "batch_sampler"):
        loader = m.parents.get(parent)
        return loader if isinstance(loader, ast.Call) else None
    if sampler_key is None:
        return None
    scope = m.scope_of(site)
    for call in m.calls:
        if not _tail(m, call.func).endswith("Loader"):
            continue
        for kw in call.keywords:
            if kw.arg in ("sampler", "batch_sampler") and mentions(kw.value, sampler_key) and \
                    (m.scope_of(call) is scope or sampler_key.startswith("self.")):
                return call
    return None


def _known_sampler_keys(m: Module) -> set[str]:
    return {k for site, _s, _on in _sampler_sites(m) if (k := _target_key(m, site))}


def _set_epoch_covers(m: Module, sampler_key: str | None, loader_key: str | None) -> bool:
    """Whether some ``X.set_epoch(...)`` in the file may be on this sampler: on it, on its
    loader's ``.sampler``, or on something the file cannot tell apart from it."""
    others = _known_sampler_keys(m) - {sampler_key}
    for call in m.calls:
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "set_epoch"):
            continue
        receiver = key_of(call.func.value)
        if receiver is None:
            return True
        if receiver == sampler_key or (loader_key and receiver.startswith(loader_key)):
            return True
        if receiver not in others:
            return True
    return False


def _iterates(m: Module, use: ast.AST) -> bool:
    """``for b in loader``, ``enumerate(loader)``, ``iter(loader)``, ``zip(loader, ...)``."""
    node: ast.AST = use
    for _ in range(3):
        parent = m.parents.get(node)
        if isinstance(parent, ast.For | ast.AsyncFor) and parent.iter is node:
            return True
        if isinstance(parent, ast.comprehension) and parent.iter is node:
            return True
        if isinstance(parent, ast.Call) and node in parent.args and \
                isinstance(parent.func, ast.Name) and \
                parent.func.id in ("iter", "enumerate", "zip", "tqdm", "next", "list", "cycle"):
            if parent.func.id in ("iter", "next", "list", "cycle"):
                return True
            node = parent
            continue
        if isinstance(parent, ast.Call) and node in parent.args and \
                _tail(m, parent.func) in ("tqdm", "enumerate", "cycle", "islice"):
            node = parent
            continue
        return False
    return False


def _uses(m: Module, key: str, scope: ast.AST) -> Iterator[ast.AST]:
    for node in ast.walk(scope):
        if isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load) and \
                key_of(node) == key and (m.scope_of(node) is scope or key.startswith("self.")):
            yield node


def _epochs(m: Module, key: str, scope: ast.AST, depth: int, seen: set[tuple[str, int]]) \
        -> tuple[ast.AST | None, ast.AST | None]:
    """Where the loader bound to ``key`` is iterated over several epochs (sure), or handed to a
    function of another module inside a loop (not sure)."""
    if depth > _LOOP_DEPTH or (key, id(scope)) in seen:
        return None, None
    seen.add((key, id(scope)))
    root: ast.AST = scope
    if key.startswith("self."):
        cls = m.class_of(scope)
        root = cls if cls is not None else scope
    unsure: ast.AST | None = None
    for use in _uses(m, key, root):
        use_scope = m.scope_of(use)
        loops = m.enclosing_loops(use)
        if _iterates(m, use):
            if loops or m.called_in_loop(use_scope):
                return use, None
            continue
        parent = m.parents.get(use)
        returned = _returned_to(m, use, use_scope)
        if returned:
            for caller_key, caller_scope in returned:
                inner_sure, inner_unsure = _epochs(m, caller_key, caller_scope, depth + 1, seen)
                if inner_sure is not None:
                    return inner_sure, None
                unsure = unsure or inner_unsure
            continue
        alias = _alias_target(m, use)
        if alias is not None:  # `self.train_loader = train_loader`, `loader = train_loader`
            inner_sure, inner_unsure = _epochs(m, alias, use_scope, depth + 1, seen)
            if inner_sure is not None:
                return inner_sure, None
            unsure = unsure or inner_unsure
            continue
        call = parent if isinstance(parent, ast.Call) and use in parent.args else None
        if call is None and isinstance(parent, ast.keyword):
            grand = m.parents.get(parent)
            call = grand if isinstance(grand, ast.Call) else None
        if call is None:
            continue
        init = m.constructor(call)
        func = init or m.local_function(call)
        if func is not None:
            params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
            if params and params[0] in ("self", "cls") and (
                    init is not None or isinstance(call.func, ast.Attribute)):
                params = params[1:]
            param = None
            if isinstance(parent, ast.keyword):
                param = parent.arg
            elif use in call.args:
                i = call.args.index(use)  # type: ignore[arg-type]
                param = params[i] if i < len(params) else None
            if param is None:
                continue
            inner_sure, inner_unsure = _epochs(m, param, func, depth + 1, seen)
            if inner_sure is not None:
                return inner_sure, None
            if _param_iterated(m, param, func) and (loops or m.called_in_loop(use_scope)):
                return use, None
            unsure = unsure or inner_unsure
        elif loops and not _tail(m, call.func).endswith(("Loader", "Sampler", "DDP")):
            unsure = unsure or use
    return None, unsure


def _alias_target(m: Module, use: ast.AST) -> str | None:
    """The key a plain assignment ``key = use`` copies the value to (one target, the value
    itself, not part of an expression)."""
    parent = m.parents.get(use)
    if isinstance(parent, ast.Assign) and parent.value is use and len(parent.targets) == 1:
        return key_of(parent.targets[0])
    if isinstance(parent, ast.AnnAssign) and parent.value is use:
        return key_of(parent.target)
    return None


def _returned_to(m: Module, use: ast.AST, scope: ast.AST) -> list[tuple[str, ast.AST]]:
    """Where a value the function returns lands: ``a, b = make_loaders()`` gives, for the
    value returned second, the key ``b`` in the caller's scope."""
    parent = m.parents.get(use)
    position: int | None = None
    if isinstance(parent, ast.Tuple) and isinstance(m.parents.get(parent), ast.Return):
        position = parent.elts.index(use)  # type: ignore[arg-type]
        parent = m.parents.get(parent)
    if not isinstance(parent, ast.Return) or not isinstance(
            scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return []
    out: list[tuple[str, ast.AST]] = []
    for call in m.calls:
        if m.callee_name(call) != scope.name or m.local_function(call) is not scope:
            continue
        assign = m.parents.get(call)
        if not isinstance(assign, ast.Assign) or len(assign.targets) != 1:
            continue
        target = assign.targets[0]
        if position is None:
            key = key_of(target)
        elif isinstance(target, ast.Tuple | ast.List) and len(target.elts) > position:
            key = key_of(target.elts[position])
        else:
            key = None
        if key is not None:
            out.append((key, m.scope_of(call)))
    return out


def _param_iterated(m: Module, param: str, func: ast.AST) -> bool:
    return any(_iterates(m, use) for use in _uses(m, param, func))


def check_ddp101(m: Module) -> Iterator[LintFinding]:
    for site, _sampler, shuffle in _sampler_sites(m):
        if not shuffle:
            continue
        sampler_key = _target_key(m, site)
        loader = _loader_of(m, site, sampler_key)
        if loader is None:
            continue
        loader_key = _target_key(m, loader)
        names = " ".join(filter(None, [sampler_key, loader_key,
                                       _short(loader.args[0]) if loader.args else None]))
        if _is_eval_name(names) or loader_key is None:
            continue
        if _set_epoch_covers(m, sampler_key, loader_key):
            continue
        sure, unsure = _epochs(m, loader_key, m.scope_of(loader), 0, set())
        who = sampler_key or "the sampler"
        if sure is not None:
            yield _at("DDP101", site,
                      f"DistributedSampler {who} shuffles and {loader_key} is iterated over "
                      f"several epochs (line {getattr(sure, 'lineno', '?')}), but set_epoch is "
                      f"never called: every epoch repeats one order; call "
                      f"{sampler_key or loader_key + '.sampler'}.set_epoch(epoch) at the start "
                      f"of each epoch")
        elif unsure is not None:
            yield _at("DDP101", site,
                      f"not sure: DistributedSampler {who} shuffles and {loader_key} goes to "
                      f"{_short(m.parents.get(unsure) or unsure, 30)} inside a loop (line "
                      f"{getattr(unsure, 'lineno', '?')}), and nothing in this file calls "
                      f"set_epoch; if that loop runs epochs, call set_epoch(epoch) in it",
                      Severity.WARNING)


# -- DDP102 -------------------------------------------------------------------------------

def check_ddp102(m: Module) -> Iterator[LintFinding]:
    if "distributedsampler" not in m.identifiers or m.single_node():
        return
    severity = Severity.ERROR if m.multi_node() else Severity.WARNING
    for call in m.calls:
        if not _is_sampler_class(m, call.func):
            continue
        rank = _kw(call, "rank") or (call.args[2] if len(call.args) >= 3 else None)
        replicas = _kw(call, "num_replicas") or (call.args[1] if len(call.args) >= 2 else None)
        what = None
        if rank is not None and m.rank_kind(rank) == LOCAL:
            what = f"rank={_short(rank)} (the rank within one node)"
        elif replicas is not None and m.rank_kind(replicas) == LOCAL_SIZE:
            what = f"num_replicas={_short(replicas)} (the GPUs of one node)"
        if what is None:
            continue
        prefix = "" if severity is Severity.ERROR else \
            "not sure (nothing here says how many nodes): "
        yield _at("DDP102", call,
                  f"{prefix}DistributedSampler sharded by {what}: on several nodes every node "
                  f"reads the same shards; pass the global rank and world size "
                  f"(dist.get_rank(), dist.get_world_size()) or neither", severity)


# -- DDP103 / DDP104 ----------------------------------------------------------------------

def _device_args(m: Module) -> Iterator[tuple[ast.AST, ast.AST, str]]:
    """(site, the expression that picks a device index, how) for every device choice."""
    for call in m.calls:
        func = call.func
        qual = m.qualname(func) or ""
        tail = _tail(m, func)
        if qual in ("torch.cuda.set_device", "torch.accelerator.set_device_index",
                    "torch.cuda.device") and call.args:
            yield call, call.args[0], f"{qual.removeprefix('torch.')}()"
        elif isinstance(func, ast.Attribute) and func.attr == "cuda" and call.args and \
                m.qualname(func) is None:
            yield call, call.args[0], ".cuda()"
        elif isinstance(func, ast.Attribute) and func.attr == "to" and call.args and \
                m.qualname(func) is None:
            yield call, call.args[0], ".to()"
        elif qual == "torch.device" and len(call.args) >= 2:
            yield call, call.args[1], "torch.device()"
        elif qual == "torch.device" and call.args:
            yield call, call.args[0], "torch.device()"
        if tail in ("DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP"):
            for kw in call.keywords:
                if kw.arg == "device_ids" and isinstance(kw.value, ast.List | ast.Tuple) and \
                        len(kw.value.elts) == 1:
                    yield call, kw.value.elts[0], "device_ids="
                elif kw.arg in ("output_device", "device_id"):
                    yield call, kw.value, f"{kw.arg}="
        for kw in call.keywords:
            if kw.arg in ("device", "map_location") and tail not in ("device",):
                yield call, kw.value, f"{kw.arg}="


def _index_in(m: Module, node: ast.AST) -> ast.AST | None:
    """The device index inside ``f"cuda:{x}"``, ``"cuda:%d" % x``, ``"cuda:{}".format(x)``, or
    the expression itself when it is not a string."""
    if isinstance(node, ast.JoinedStr):
        parts = node.values
        if parts and isinstance(parts[0], ast.Constant) and \
                str(parts[0].value).startswith("cuda:") and len(parts) == 2 and \
                isinstance(parts[1], ast.FormattedValue):
            return parts[1].value
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and \
            isinstance(node.left, ast.Constant) and str(node.left.value).startswith("cuda:"):
        return node.right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "format" and isinstance(node.func.value, ast.Constant) and \
            str(node.func.value.value).startswith("cuda:") and len(node.args) == 1:
        return node.args[0]
    if isinstance(node, ast.Call) and (m.qualname(node.func) == "torch.device"):
        if len(node.args) >= 2:
            return node.args[1]
        return _index_in(m, node.args[0]) if node.args else None
    if isinstance(node, ast.Constant):
        return None
    return node


def check_ddp103(m: Module) -> Iterator[LintFinding]:
    if m.single_node():
        return
    seen: set[int] = set()
    for site, arg, how in _device_args(m):
        index = _index_in(m, arg)
        if index is None or getattr(site, "lineno", 0) in seen:
            continue
        # `.to(rank)` moves to GPU `rank` only when the value is an int; a plain `.to(x)` is
        # usually a device object, so only the forms that build a device are judged.
        if how == ".to()" and not isinstance(arg, ast.JoinedStr | ast.Call | ast.BinOp) and \
                (m.rank_kind(index) != GLOBAL or not _int_like(m, index)):
            continue
        if m.rank_kind(index) == GLOBAL:
            seen.add(site.lineno)  # type: ignore[attr-defined]
            yield _at("DDP103", site,
                      f"{how} picks the device by the global rank {_short(index)}: on the "
                      f"second node that index is past the node's GPUs (invalid device "
                      f"ordinal); use the local rank (int(os.environ['LOCAL_RANK']))")


def _int_like(m: Module, node: ast.AST) -> bool:
    key = key_of(node)
    if key is None:
        return isinstance(node, ast.Call)
    found = m.values(key, node) or []
    return any(isinstance(v, ast.Call) for v in found) or not found or \
        any(v is _PARAM for v in found)


def _cuda0(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "cuda:0" or (type(node.value) is int and node.value == 0)
    return False


def _guarded(m: Module, node: ast.AST) -> bool:
    """Inside an ``if``/``while`` whose test is about ranks, distribution or devices (rank 0
    only, the single-process branch), or in a function for one process (eval, export)."""
    for anc in m.ancestors(node):
        test = getattr(anc, "test", None)
        if isinstance(anc, ast.If | ast.IfExp | ast.While) and test is not None:
            text = _short(test, 400).lower()
            if any(word in text for word in _GUARD_WORDS):
                return True
        if isinstance(anc, ast.FunctionDef | ast.AsyncFunctionDef) and _is_eval_name(anc.name):
            return True
    return False


def check_ddp104(m: Module) -> Iterator[LintFinding]:
    if not m.distributed or m.writes_cuda_visible_devices():
        return
    seen: set[int] = set()
    for site, arg, how in _device_args(m):
        hit = _cuda0(arg) or (isinstance(arg, ast.Call) and
                              m.qualname(arg.func) == "torch.device" and
                              any(_cuda0(a) for a in arg.args[:2]) and
                              not (len(arg.args) == 1 and isinstance(arg.args[0], ast.Constant)
                                   and arg.args[0].value == 0))
        if how in (".to()",) and isinstance(arg, ast.Constant) and type(arg.value) is int:
            hit = False  # `.to(0)` is rare and often a dtype/index of something else
        if not hit or site.lineno in seen or _guarded(m, site):  # type: ignore[attr-defined]
            continue
        seen.add(site.lineno)  # type: ignore[attr-defined]
        yield _at("DDP104", site,
                  f"{how} hard-codes GPU 0 in code every rank runs: all ranks use (or load "
                  f"onto) GPU 0; use the local rank (torch.device('cuda', local_rank))")


# -- DDP105 -------------------------------------------------------------------------------

def _env_str(m: Module, node: ast.AST, depth: int = 0) -> str | None:
    """The variable name when ``node`` is a rank/size read from os.environ and never made an
    int on the way."""
    var = m.env_var(node)
    if var is not None:
        return var if var in RANK_LIKE_VARS else None
    key = key_of(node)
    if key is None or depth > 3:
        return None
    found = m.values(key, node)
    if not found:
        return None
    names = {(_env_str(m, v, depth + 1) if v is not _PARAM and v is not _UNKNOWN else None)
             for v in found}
    return names.pop() if len(names) == 1 else None


def _int_const(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _int_const(node.operand)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return bool(node.elts) and all(_int_const(e) for e in node.elts)
    return False


def check_ddp105(m: Module) -> Iterator[LintFinding]:
    for cmp in m.compares:
        operands = [cmp.left, *cmp.comparators]
        for i, op in enumerate(cmp.ops):
            left, right = operands[i], operands[i + 1]
            for env, other in ((left, right), (right, left)):
                var = _env_str(m, env)
                if var is None or not _int_const(other):
                    continue
                if isinstance(op, ast.In | ast.NotIn) and other is left:
                    continue
                never = "never" if isinstance(op, ast.Eq | ast.In) else "always"
                yield _at("DDP105", cmp,
                          f"{_short(env)} is the str from os.environ[{var!r}], compared with "
                          f"the int {_short(other)}: this is {never} true; convert it where "
                          f"it is read (int(os.environ[{var!r}]))")
                break
            else:
                continue
            break


# -- DDP106 -------------------------------------------------------------------------------

def _wrap_target(m: Module, call: ast.Call) -> str | None:
    tail = _tail(m, call.func)
    qual = m.qualname(call.func) or ""
    if not ((tail in ("FullyShardedDataParallel", "fully_shard") and
             qual.startswith("torch.distributed")) or
            (tail == "FSDP" and "fsdp" in qual.lower())):
        return None
    if not call.args:
        return None
    arg: ast.AST = call.args[0]
    while isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and \
            arg.func.attr in ("to", "cuda", "half", "bfloat16", "float"):
        arg = arg.func.value
    return key_of(arg)


def _is_optimizer(m: Module, call: ast.Call) -> bool:
    qual = m.qualname(call.func) or ""
    tail = _tail(m, call.func)
    if qual.startswith("torch.optim.") and tail[:1].isupper():
        return True
    return tail in ("configure_optimizers", "create_optimizer", "build_optimizer")


def _optimizer_mentions(m: Module, call: ast.Call, model: str) -> bool:
    if isinstance(call.func, ast.Attribute) and key_of(call.func.value) == model:
        return True
    for node in ast.walk(call):
        if node is call.func:
            continue
        key = key_of(node) if isinstance(node, ast.Name | ast.Attribute) else None
        if key is None:
            continue
        if key == model or key.startswith(model + "."):
            return True
        found = m.values(key, node) if isinstance(node, ast.Name) else None
        if found and any(v is not _PARAM and v is not _UNKNOWN and mentions(v, model)
                         for v in found):
            return True
    return False


def check_ddp106(m: Module) -> Iterator[LintFinding]:
    wraps = [(call, key) for call in m.calls if (key := _wrap_target(m, call))]
    if not wraps:
        return
    optimizers = [c for c in m.calls if _is_optimizer(m, c)]
    for opt in optimizers:
        scope = m.scope_of(opt)
        for wrap, model in wraps:
            if m.scope_of(wrap) is not scope or wrap.lineno <= opt.lineno:
                continue
            if not _optimizer_mentions(m, opt, model):
                continue
            rebuilt = any(o.lineno > wrap.lineno and m.scope_of(o) is scope and
                          _optimizer_mentions(m, o, model) for o in optimizers)
            if rebuilt:
                continue
            yield _at("DDP106", opt,
                      f"the optimizer is built from {model}'s parameters before "
                      f"{_short(wrap.func)}({model}) on line {wrap.lineno}: it holds the "
                      f"unsharded originals, so training does not update what FSDP computes "
                      f"with; build it after the wrap, from the wrapped model")
            break


# -- DDP107 -------------------------------------------------------------------------------

def _default_cuda_alloc(m: Module, call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "cuda" and not call.args and \
            not call.keywords and m.qualname(func) is None:
        return True
    if isinstance(func, ast.Attribute) and func.attr == "to" and call.args and \
            m.qualname(func) is None and _is_cuda_literal(m, call.args[0]):
        return True
    qual = m.qualname(func) or ""
    if qual.startswith("torch.") and qual.rsplit(".", 1)[-1] in _FACTORIES:
        device = _kw(call, "device")
        return device is not None and _is_cuda_literal(m, device)
    return False


def _is_cuda_literal(m: Module, node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "cuda"
    if isinstance(node, ast.Call) and m.qualname(node.func) == "torch.device" and \
            len(node.args) == 1 and isinstance(node.args[0], ast.Constant):
        return node.args[0].value == "cuda"
    return False


def check_ddp107(m: Module) -> Iterator[LintFinding]:
    by_scope: dict[int, tuple[ast.Call, list[ast.Call]]] = {}
    for call in sorted(m.calls, key=lambda c: (c.lineno, c.col_offset)):
        scope = m.scope_of(call)
        qual = m.qualname(call.func) or ""
        entry = by_scope.setdefault(id(scope), (None, []))  # type: ignore[arg-type]
        if qual in ("torch.cuda.set_device", "torch.accelerator.set_device_index"):
            if entry[0] is None:
                by_scope[id(scope)] = (call, entry[1])
        elif entry[0] is None and _default_cuda_alloc(m, call):
            entry[1].append(call)
    for set_device, allocs in by_scope.values():
        if set_device is None or not allocs:
            continue
        first = allocs[0]
        yield _at("DDP107", set_device,
                  f"torch.cuda.set_device comes after {_short(first, 30)} on line "
                  f"{first.lineno} already put it on the default device (GPU 0 of every "
                  f"rank); call set_device first, before anything goes to CUDA")


Check = Callable[[Module], Iterator[LintFinding]]

CHECKS: tuple[Check, ...] = (
    check_ddp101, check_ddp102, check_ddp103, check_ddp104, check_ddp105, check_ddp106,
    check_ddp107)

_ENV = ("environ", "getenv")
#: What a finding of each rule needs written in the file: one word of each group. Each word is
#: an identifier the rule resolves by name (an import, an attribute, a called name), and the
#: parser keeps identifiers as written (after NFKC normalization), so a file without them
#: cannot give that rule a finding and the rule is not run on it. Kept next to the rules:
#: tests/lint/test_speed_paths.py checks on real and generated files that gating changes no
#: finding.
NEEDS: dict[Check, tuple[tuple[str, ...], ...]] = {
    # _is_sampler_class: a qualified name ending in .DistributedSampler
    check_ddp101: (("DistributedSampler",),),
    check_ddp102: (("DistributedSampler",),),
    # rank_kind(...) == GLOBAL: RANK & co. from the environment, or dist.get_rank()
    check_ddp103: ((*_ENV, "get_rank", "get_global_rank"),),
    # Module.distributed: one of the distributed calls, or a rank variable read
    check_ddp104: ((*DISTRIBUTED_CALLS, *_ENV),),
    # _env_str: a rank or size read from os.environ / os.getenv
    check_ddp105: (_ENV,),
    # _wrap_target and _is_optimizer (torch.optim.*, configure_optimizers, build_optimizer...)
    check_ddp106: (("FullyShardedDataParallel", "fully_shard", "FSDP"), ("optim",)),
    # torch.cuda.set_device / torch.accelerator.set_device_index
    check_ddp107: (("set_device",),),
}


def checks_for(text: str | bytes) -> tuple[Check, ...]:
    """The rules that can find something in a file with this text (see :data:`NEEDS`); the
    text must be the source as Python reads it (decoded by its coding cookie, NFKC-normalized
    where it is not ASCII), as :func:`preflight.lint.gate_text` makes it."""
    needs = _NEEDS_BYTES if isinstance(text, bytes) else NEEDS
    return tuple(check for check in CHECKS
                 if all(any(w in text for w in group) for group in needs[check]))  # type: ignore[operator]


_NEEDS_BYTES = {check: tuple(tuple(w.encode() for w in group) for group in groups)
                for check, groups in NEEDS.items()}


__all__ = ["CHECKS", "GLOBAL", "LOCAL", "NEEDS", "Check", "checks_for"]
