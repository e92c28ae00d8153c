"""``torch.compile(model, backend="tessera")``: a TorchDynamo backend built on AOTAutograd.

AOTAutograd hands over the forward and the backward ATen graphs (``aot_autograd`` with a
compiler for each); for each graph:

1. every ``call_function`` node is checked against the op table (``torch_aten.py``): the op must
   be mapped, its tensors float32/float64 on the CPU with static sizes, and the op's own check
   must pass (e.g. a max-pool whose indices are saved for backward does not map: Tessera's kernel
   makes no indices).  Each node that fails is recorded in the explain table (graph, node, ATen
   op, why);
2. torch's ``CapabilityBasedPartitioner`` groups the covered nodes into maximal connected runs
   (no cycle through an uncovered node); a run of views alone is left to ATen (no kernel);
3. each run becomes a Tessera subgraph: a Python function that replays its FX nodes through
   ``tessera.ops`` under ``tessera.jit`` (one Graph IR program, compiled on first call); every
   replayed node's shape and dtype are checked against the FX node's fake tensor at trace time.

A graph with symbolic sizes (Dynamo's dynamic shapes, after a second input shape) is traced again
at each concrete shape it is called with (``make_fx``) and partitioned as a static graph
(``PerShape``): one Tessera compile per shape, as ``tessera.jit`` specialises anyway.

At run time the subgraph's tensors go to the jitted function as numpy views (no copy), its
results come back with the strides the ATen graph promised.  ``check="first"`` (the default)
also runs the ATen subgraph on the first call and compares (max |diff| <= 1e-3 of the largest
magnitude): a mismatch raises ``TorchBackendMismatchError``, never a silent wrong result;
``check="always"`` compares every call, ``"off"`` never.  A run that Tessera refuses to compile
(a coded ``TesseraError``) falls back to its ATen nodes and is recorded in the explain table.
Every subgraph call is in ``tessera.lane_log`` as ``torch_<graph>_<n>``.
"""
from __future__ import annotations

import itertools
import operator
import warnings
from dataclasses import dataclass, field

import numpy as np

from tessera.errors import TesseraError, TorchBackendMismatchError
from tessera.frontend import torch_aten

CHECK_MODES = ("first", "always", "off")
CHECK_RTOL = 1e-3
# plus this much of the largest finite |input|: a result that cancels to about zero (a bias
# gradient through a normalisation) is rounding noise on both sides, not a relative error
CHECK_ATOL = 1e-4
_FLOATS = ("torch.float32", "torch.float64")
_INDICES = ("torch.int64", "torch.int32")   # where the table's INDEX_ARGS allow an index tensor
_IDS = itertools.count()


@dataclass
class Row:
    graph: str        # "forward", "backward" or "inference" (and the graph's number)
    node: str         # the FX node's name
    op: str           # the ATen overload
    reason: str


@dataclass
class ExplainTable:
    """What the backend left to ATen (``rows``) and what it compiled (``partitions``: graph,
    subgraph name, number of nodes, ATen ops)."""
    rows: list[Row] = field(default_factory=list)
    partitions: list[tuple[str, str, int, list[str]]] = field(default_factory=list)

    @property
    def unsupported_ops(self) -> set[str]:
        return {r.op for r in self.rows}

    def __str__(self) -> str:
        out = [f"tessera torch.compile backend: {len(self.partitions)} Tessera subgraph(s), "
               f"{len(self.rows)} node(s) left to ATen"]
        for g, name, n, opnames in self.partitions:
            out.append(f"  [{g}] {name}: {n} nodes ({', '.join(sorted(set(opnames)))})")
        if self.rows:
            g, n, w = (max(len(h), *(len(getattr(r, f)) for r in self.rows))
                       for h, f in (("graph", "graph"), ("node", "node"), ("ATen op", "op")))
            out.append(f"  {'graph':<{g}}  {'node':<{n}}  {'ATen op':<{w}}  why")
            out += [f"  {r.graph:<{g}}  {r.node:<{n}}  {r.op:<{w}}  {r.reason}" for r in self.rows]
        return "\n".join(out)


def _val(n):
    return n.meta.get("val") if hasattr(n, "meta") else None


def _tensor_reason(v, what: str, index: bool = False) -> str | None:
    import torch
    if isinstance(v, (list, tuple)):
        for x in v:
            r = _tensor_reason(x, what, index)
            if r:
                return r
        return None
    if v is None or isinstance(v, (bool, int, float)):
        return None
    if isinstance(v, torch.SymInt) or isinstance(v, torch.SymFloat):
        return f"{what} is a symbolic size"
    if not isinstance(v, torch.Tensor):
        return f"{what} is a {type(v).__name__}"
    if v.device.type != "cpu":
        return f"{what} is on {v.device} (the backend runs the CPU lane)"
    if str(v.dtype) not in _FLOATS and not (index and str(v.dtype) in _INDICES):
        return f"{what} has dtype {v.dtype} (float32 and float64 map)"
    if any(not isinstance(s, int) for s in v.shape):
        return f"{what} has symbolic sizes"
    if v.numel() == 0:
        return f"{what} is empty"
    return None


def node_reason(node) -> str | None:
    """Why ``node`` stays ATen (None: it maps)."""
    if node.target is operator.getitem:
        return node_reason(node.args[0])
    name = str(node.target)
    if name not in torch_aten.TABLE:
        return "no mapping to tessera.ops"
    check = torch_aten.CHECKS.get(name)
    try:
        r = check(node) if check is not None else None
    except (AttributeError, IndexError, KeyError, TypeError) as e:
        r = f"arguments of an unexpected form ({type(e).__name__}: {e})"
    if r:
        return r
    index_pos = torch_aten.INDEX_ARGS.get(name, set())
    view = name in torch_aten.VIEWS   # a view passes an integer tensor through as it is
    for a in node.all_input_nodes:
        index = view or any(node.args[i] is a for i in index_pos if i < len(node.args))
        r = _tensor_reason(_val(a), f"input {a.name}", index)
        if r:
            return r
    val = _val(node)
    if isinstance(val, (list, tuple)):   # a tuple result: the outputs read by a getitem
        used = {u.args[1] for u in node.users if u.target is operator.getitem}
        val = [v for k, v in enumerate(val) if k in used]
    r = _tensor_reason(val, "its result", view or name in torch_aten.INDEX_RESULTS)
    if r:
        return r
    return None


def _replay_fn(sub, name: str):
    """A Python function that replays ``sub``'s FX nodes through ``tessera.ops`` (traced by
    ``tessera.jit``); each result is checked against its node's fake tensor."""
    import torch

    from tessera import dtypes as dt
    from tessera.frontend.torch_op import _torch_dtypes
    to_np = _torch_dtypes()
    nodes = list(sub.graph.nodes)

    def expect(n, got):
        want = _val(n)
        if isinstance(want, torch.Tensor):
            if got is None or tuple(got.shape) != tuple(want.shape) or \
                    np.dtype(got.dtype) != np.dtype(to_np[want.dtype]):
                shown = None if got is None else (tuple(got.shape), dt.name(got.dtype))
                raise TorchBackendMismatchError(
                    f"torch.compile backend: the mapping of {n.target} (node {n.name}) gave {shown}; ATen's "
                    f"fake tensor is {tuple(want.shape)} {want.dtype}")
        elif isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
            for w, g in zip(want, got):
                if isinstance(w, torch.Tensor) and g is not None and tuple(g.shape) != tuple(w.shape):
                    raise TorchBackendMismatchError(f"torch.compile backend: the mapping of {n.target} (node "
                                                    f"{n.name}) gave shape {tuple(g.shape)}, ATen {tuple(w.shape)}")

    def replay(*args):
        env, it = {}, iter(args)
        look = lambda a: torch.fx.node.map_arg(a, lambda m: env[m])  # noqa: E731
        for n in nodes:
            if n.op == "placeholder":
                env[n] = next(it)
            elif n.op == "call_function" and n.target is operator.getitem:
                env[n] = env[n.args[0]][n.args[1]]
            elif n.op == "call_function":
                env[n] = torch_aten.TABLE[str(n.target)](n, *look(n.args), **look(n.kwargs))
                expect(n, env[n])
            elif n.op == "output":
                out = look(n.args[0])
                return tuple(out) if isinstance(out, (list, tuple)) else out
    replay.__name__ = replay.__qualname__ = name
    return replay


def _close(got, want, in_scale: float = 0.0) -> tuple[bool, float]:
    """(whether ``got`` passes for ``want``, the max |diff| off the places they agree exactly).
    Equal infinities and NaN at the same places agree; the rest within CHECK_RTOL of the largest
    finite |want| plus CHECK_ATOL of ``in_scale`` (the largest finite |input|)."""
    import torch
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, float("nan")
    if not got.dtype.is_floating_point:
        return torch.equal(got, want), 0.0
    g, w = got.double(), want.double()
    agree = (g == w) | (torch.isnan(g) & torch.isnan(w))
    if bool(agree.all()):
        return True, 0.0
    g, w = g[~agree], w[~agree]
    if not bool(torch.isfinite(g).all() and torch.isfinite(w).all()):
        return False, float("inf")
    finite = want.double()[torch.isfinite(want)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    err = (g - w).abs().max().item()
    return err <= CHECK_RTOL * max(scale, 1e-6) + CHECK_ATOL * in_scale, err


def _finite_max(t) -> float:
    import torch
    v = t.detach()
    v = v[torch.isfinite(v)]
    return v.abs().max().item() if v.numel() else 0.0


def _dense(t) -> bool:
    """Whether ``t``'s strides lay its elements out one each, without gaps (some permutation of
    C-contiguous): a layout a fresh tensor can be given."""
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return True


class Subgraph:
    """One covered run: calls the jitted replay on the tensors; ``sub`` is the ATen original
    (for the first-call check and the compile-failure fallback)."""

    def __init__(self, sub, name: str, graph: str, table: ExplainTable, check: str):
        import torch
        from tessera.frontend.jit import jit
        self.sub, self.name, self.graph, self.table, self.check = sub, name, graph, table, check
        self.fn = jit(_replay_fn(sub, name))
        out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
        self.multi = isinstance(out, (list, tuple))
        outs = list(out) if self.multi else [out]
        self.want = [_val(o) if isinstance(o, torch.fx.Node) else None for o in outs]
        self.fallback = False
        self.calls = 0

    def __call__(self, *args):
        import torch
        if self.fallback:
            return self.sub(*args)
        arrays = [a.detach().resolve_neg().numpy() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            res = self.fn(*arrays)
        except TorchBackendMismatchError:
            raise
        except TesseraError as e:
            if self.calls:
                raise
            self.fallback = True
            self.table.rows.append(Row(self.graph, self.name, "(subgraph)", f"Tessera refused it, left to ATen: "
                                                                             f"{e.code}: {e}"))
            warnings.warn(f"tessera backend: {self.name} left to ATen ({e.code}): {e}", stacklevel=2)
            return self.sub(*args)
        res = list(res) if self.multi else [res]
        outs = [self._torch(r, w, arrays) for r, w in zip(res, self.want)]
        if self.check == "always" or (self.check == "first" and self.calls == 0):
            self._compare(outs, args)
        self.calls += 1
        return tuple(outs) if self.multi else outs[0]

    @staticmethod
    def _torch(r, want, arrays):
        import torch
        if not isinstance(r, np.ndarray):
            r = np.asarray(r)
        if any(isinstance(a, np.ndarray) and np.may_share_memory(r, a) for a in arrays):
            r = r.copy()   # never hand back an input's memory as a result
        t = torch.from_numpy(r if r.flags.c_contiguous else r.copy(order="C"))   # (ascontiguousarray makes 0-d 1-d)
        if isinstance(want, torch.Tensor) and t.numel() > 1 and t.stride() != want.stride() and _dense(want):
            t = torch.empty_strided(t.shape, want.stride(), dtype=t.dtype).copy_(t)   # the promised strides
        # (an expanded result, strides 0, comes back dense: the same values, one element each)
        return t

    def _compare(self, outs, args):
        import torch
        with torch.no_grad():
            ref = self.sub(*args)
        ref = list(ref) if self.multi else [ref]
        in_scale = max([_finite_max(a) for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()],
                       default=0.0)
        for k, (g, w) in enumerate(zip(outs, ref)):
            if not isinstance(w, torch.Tensor):
                continue
            ok, err = _close(g, w, in_scale)
            if not ok:
                raise TorchBackendMismatchError(
                    f"torch.compile backend: {self.name} ({self.graph} graph) output {k} ({tuple(g.shape)} "
                    f"{g.dtype}) differs from ATen's ({tuple(w.shape)} {w.dtype}): max "
                    f"|diff| {err:.3g} over tolerance {CHECK_RTOL} x max |ATen| + {CHECK_ATOL} x max |input| (ops: "
                    f"{', '.join(sorted({str(n.target) for n in self.sub.graph.nodes if n.op == 'call_function'}))})")


def compile_graph(gm, example_inputs, *, graph: str, table: ExplainTable, check: str = "first"):
    """One ATen graph, compiled: partitioned now where its sizes are static; one with symbolic
    sizes (Dynamo's dynamic shapes) is specialised per concrete shape at run time (``PerShape``)."""
    if _symbolic(gm):
        return PerShape(gm, graph, table, check)
    from torch._functorch.aot_autograd import make_boxed_func
    return make_boxed_func(_partition(gm, graph=graph, table=table, check=check))


def _symbolic(gm) -> bool:
    import torch
    for n in gm.graph.nodes:
        v = _val(n)
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return True
            if isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape):
                return True
    return False


class PerShape:
    """A graph with symbolic sizes: at each new set of argument shapes (and strides, and the values
    of its integer arguments) it is traced again with those concrete sizes (``make_fx``, fake
    tensors) and partitioned as a static graph; at most MAX_SHAPES kept, oldest dropped."""
    MAX_SHAPES = 16

    def __init__(self, gm, graph: str, table: ExplainTable, check: str):
        self.gm, self.graph, self.table, self.check = gm, graph, table, check
        self._boxed_call = True   # AOTAutograd passes the arguments as one list (an instance attribute:
        # the wrapper torch puts around a backward copies the instance's __dict__ only)
        self.compiled: dict[tuple, object] = {}

    def __call__(self, args):
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx
        key = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
            with torch.no_grad():
                static = make_fx(self.gm, tracing_mode="fake")(*plain)
            sizes = ",".join("x".join(map(str, a.shape)) for a in args if isinstance(a, torch.Tensor))
            sizes = sizes if len(sizes) <= 40 else sizes[:37] + "..."
            fn = _partition(static, graph=f"{self.graph} [{sizes}]", table=self.table, check=self.check)
            if len(self.compiled) >= self.MAX_SHAPES:
                self.compiled.pop(next(iter(self.compiled)))
            self.compiled[key] = fn
        return fn(*args)


def _partition(gm, *, graph: str, table: ExplainTable, check: str):
    """Partition one static ATen graph: covered runs become Tessera subgraphs, the rest stays ATen."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupport

    reasons = {}

    class Support(OperatorSupport):
        def is_node_supported(self, submodules, node) -> bool:
            if node.op != "call_function":
                return False
            if node not in reasons:
                reasons[node] = node_reason(node)
            return reasons[node] is None

    part = CapabilityBasedPartitioner(gm, Support(), allows_single_node_partition=True)
    found = part.propose_partitions()
    keep = [p for p in found if any(str(n.target) not in torch_aten.VIEWS for n in p.nodes)]
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is not operator.getitem and reasons.get(n, node_reason(n)):
            table.rows.append(Row(graph, n.name, str(n.target), reasons.get(n) or node_reason(n)))
    fused = part.fuse_partitions(keep) if keep else gm
    for n in list(fused.graph.nodes):
        if n.op == "call_module" and n.target.startswith("fused_"):
            sub = getattr(fused, n.target)
            name = f"torch_{graph.split(' [')[0].replace(' ', '_')}_{next(_IDS)}"
            ops_in = ["getitem" if m.target is operator.getitem else str(m.target) for m in sub.graph.nodes
                      if m.op == "call_function"]
            table.partitions.append((graph, name, len(ops_in), ops_in))
            setattr(fused, n.target, _as_module(Subgraph(sub, name, graph, table, check)))
    fused.recompile()
    return fused


def _as_module(sg: Subgraph):
    import torch

    class TesseraSubgraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.subgraph = sg

        def forward(self, *args):
            return self.subgraph(*args)
    return TesseraSubgraph()


class TesseraBackend:
    """The backend callable: ``torch.compile(model, backend=TesseraBackend(check=...))``; the
    string ``"tessera"`` names a shared instance.  ``.table`` accumulates the explain table of
    every graph it compiled."""

    def __init__(self, check: str = "first"):
        if check not in CHECK_MODES:
            from tessera.errors import ArgumentError
            raise ArgumentError(f"tessera backend: check={check!r}; legal: {', '.join(CHECK_MODES)}")
        self.check = check
        self.table = ExplainTable()
        self.__name__ = "tessera"
        self._graphs = itertools.count()

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd
        k = next(self._graphs)

        def comp(kind):
            return lambda g, ex: compile_graph(g, ex, graph=f"{kind} {k}", table=self.table, check=self.check)
        return aot_autograd(fw_compiler=comp("forward"), bw_compiler=comp("backward"),
                            inference_compiler=comp("inference"))(gm, example_inputs)


tessera_backend = TesseraBackend()   # the `torch_dynamo_backends` entry point and register_backend()'s


def register_backend(name: str = "tessera") -> None:
    """Register ``tessera_backend`` with TorchDynamo under ``name`` (what the package's
    ``torch_dynamo_backends`` entry point does in an installed wheel; an editable or source
    checkout whose metadata predates it calls this).  Registering twice is a no-op."""
    from torch._dynamo.backends import registry
    if name in registry._COMPILER_FNS:
        return
    registry.register_backend(compiler_fn=tessera_backend, name=name)


def explain_backend(fn, *args, backward: bool = True, check: str = "first") -> ExplainTable:
    """Compile ``fn`` with a fresh backend instance, run it on ``args`` (and, where a result
    requires grad and ``backward``, the backward of the sum of its float results), and return
    that instance's explain table."""
    import torch
    be = TesseraBackend(check=check)
    out = torch.compile(fn, backend=be)(*args)
    outs = [o for o in (out if isinstance(out, (list, tuple)) else [out])
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if backward and outs:
        sum(o.sum() for o in outs).backward()
    return be.table
