"""``tessera.onnx.load``: an ONNX model as a jitted function.

The model is read and checked once (``onnx.checker``; every node against the op registry of
``convert.py`` and, outside opsets 13..21, its op's version there (``versions.py``): every
unsupported node is listed in one ``ONNX_UNSUPPORTED`` error).  Nodes over constants alone (shape arithmetic, ``Constant``) are folded with numpy at
load time.  The rest is replayed through ``tessera.ops`` inside one ``tessera.jit`` function
whose arguments are the graph inputs followed by the *bound* initializers (weights): those
are passed to the kernels on every call, never compiled into the code, so
``fn.weights[name] = new_array`` swaps a weight without a recompile.  Initializers read only
as shapes or axes, and one-element ones, are constants of the trace.
"""
from __future__ import annotations

import os

import numpy as np

from tessera import dtypes as dt
from tessera.errors import ArgumentError, DtypeError, DynamicShapeError, OnnxImportError, OnnxUnsupportedError, \
    ScalarSpecialize, ShapeMismatchError, TesseraError
from tessera.onnx import ops_attention, ops_einsum, ops_extra, ops_math, ops_nn, ops_norm, ops_resize, ops_rotary, \
    ops_qlinear, ops_quant, ops_scatter, ops_shape, ops_spatial, versions  # noqa: F401 - they register their ops
from tessera.onnx.convert import ONNX_DTYPES, ONNX_TYPE_NAMES, OPS, WHY_NOT, Ctx, describe, materialise

OPSETS = versions.MAPPED       # the default-domain opsets whose semantics are mapped (others: per node)
# ops folded with numpy at load time when every input is a constant (shape arithmetic)
FOLDABLE = {"Shape", "Constant", "ConstantOfShape", "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Reshape",
            "Flatten", "Cast", "Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "Where", "Not", "And", "Or",
            "Neg", "Abs", "Sqrt", "Identity", "Expand", "Transpose", "Split", "Range"}
FOLD_ANY_SIZE = {"Constant", "ConstantOfShape", "Shape", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                 "Cast", "Slice", "Split"}


def _read(model):
    import onnx
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model))
        if isinstance(model, (str, os.PathLike)):
            if not os.path.isfile(model):
                raise OnnxImportError(f"tessera.onnx.load: no file {os.fspath(model)!r}")
            return onnx.load(os.fspath(model))
    except OnnxImportError:
        raise
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends: a corrupt file
        raise OnnxImportError(f"tessera.onnx.load: cannot read the model ({type(e).__name__}: {e})") from None
    raise OnnxImportError(f"tessera.onnx.load takes a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def _attrs(node) -> dict:
    from onnx import AttributeProto, helper, numpy_helper
    out = {}
    for a in node.attribute:
        if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR):
            out[a.name] = None             # refused by the attribute check (no handler reads it)
            continue
        v = helper.get_attribute_value(a)
        if a.type == AttributeProto.TENSOR:
            v = numpy_helper.to_array(v)
        elif isinstance(v, bytes):
            v = v.decode()
        out[a.name] = v
    return out


def _dims(vi) -> tuple[int, tuple]:
    t = vi.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return t.elem_type, dims


class OnnxFunction:
    """The loaded model: call it with the graph inputs (by position or by ONNX name); it returns
    the graph's outputs (one array, or a tuple in graph order).  ``input_names``,
    ``output_names``, ``weights`` (the bound initializers), ``jitted`` (the ``tessera.jit``
    function, called with the inputs then the weights) and ``dynamic`` (the dims compiled once
    per bucket, empty once specialised) describe it."""

    def __init__(self, mp, *, target=None, arch=None):
        import onnx
        from onnx import numpy_helper
        self.model = mp
        opset = [o.version for o in mp.opset_import if o.domain in ("", "ai.onnx")]
        if not opset:
            raise OnnxImportError("tessera.onnx.load: the model imports no default-domain (ai.onnx) opset")
        self.model_opset = opset[0]
        self.opset = versions.effective(self.model_opset)   # what the handlers are told
        g = mp.graph
        consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        inits = set(consts)
        problems = []
        self.inputs = []                              # (name, dtype, dims) of the inputs the caller gives
        for vi in g.input:
            if vi.name in consts:
                continue                              # an initializer listed as an input: its default is used
            code, dims = _dims(vi)
            if code not in ONNX_DTYPES:
                problems.append(f"graph input {vi.name!r}: element type {ONNX_TYPE_NAMES.get(code, code)}")
                continue
            self.inputs.append((vi.name, ONNX_DTYPES[code], dims))
        self.input_names = [n for n, _, _ in self.inputs]
        self.output_names = [o.name for o in g.output]
        self.plan = []                                # (node, spec, attrs, folded at load)
        bound: list[str] = []
        for node in g.node:
            spec, attrs = OPS.get(node.op_type), _attrs(node)
            reason = None
            if node.domain not in ("", "ai.onnx"):
                reason = f"domain {node.domain!r} is not mapped"
            elif spec is None:
                reason = WHY_NOT.get(node.op_type, "op type not mapped")
            elif versions.problem(node.op_type, self.model_opset, attrs):
                reason = versions.problem(node.op_type, self.model_opset, attrs)
            elif not spec.inputs[0] <= len(node.input) <= spec.inputs[1]:
                lo, hi = spec.inputs
                reason = f"{len(node.input)} inputs (takes {lo if lo == hi else f'{lo}..{hi}'})"
            elif len(node.output) > spec.outputs:
                reason = f"{len(node.output)} outputs (gives {spec.outputs})"
            else:
                extra = sorted(set(attrs) - spec.attrs)
                reason = (f"attribute{'s' if len(extra) > 1 else ''} {', '.join(extra)} not mapped" if extra
                          else spec.check(attrs, self.opset) if spec.check else None)
            if reason:
                problems.append(f"{describe(node)}: {reason}")
                continue
            folded = self._fold(node, spec, attrs, consts)
            if not folded:
                for i, nm in enumerate(node.input):
                    if nm in consts and i not in spec.static and self._bind(nm, consts, inits) and nm not in bound:
                        bound.append(nm)
            self.plan.append((node, spec, attrs, folded))
        if problems:
            raise OnnxUnsupportedError(f"tessera.onnx.load: {len(problems)} node(s) not supported:\n  " +
                                       "\n  ".join(problems))
        try:
            onnx.checker.check_model(mp)
        except Exception as e:  # noqa: BLE001 - onnx.checker.ValidationError
            raise OnnxImportError(f"tessera.onnx.load: the model fails onnx.checker: {e}") from None
        for nm in self.output_names:
            if nm in consts and self._bind(nm, consts, inits) and nm not in bound:
                bound.append(nm)
        bad = [f"{nm!r} ({consts[nm].dtype})" for nm in bound if consts[nm].dtype not in set(ONNX_DTYPES.values())]
        if bad:
            raise OnnxUnsupportedError(f"tessera.onnx.load: initializers of unsupported element type: {', '.join(bad)}")
        self.consts = consts
        self.weights = {nm: np.ascontiguousarray(consts[nm]) for nm in bound}
        self._bound = bound
        self._jit_opts = {"target": target, "arch": arch}
        self.dynamic = {}
        for i, (name, _, dims) in enumerate(self.inputs):
            axes = {a: (d if isinstance(d, str) else f"{name}_{a}") for a, d in enumerate(dims)
                    if not isinstance(d, int)}
            if axes:
                self.dynamic[i] = axes
        self.dynamic_fallback = None                  # why the bucketed compile was given up, if it was
        self._static_jit = None
        self.jitted = self._make_jit(self.dynamic or None)

    @staticmethod
    def _bind(nm, consts, inits) -> bool:
        """A constant read as data is a bound argument unless it is one element, or computed (not
        an initializer) with every element equal: those are built in the trace (``materialise``)."""
        v = consts[nm]
        if v.size <= 1:
            return False
        return nm in inits or not (v.reshape(-1) == v.reshape(-1)[0]).all()

    def _fold(self, node, spec, attrs, consts) -> bool:
        if node.op_type not in FOLDABLE:
            return False
        names = [nm for nm in node.input if nm]
        if not all(nm in consts for nm in names):
            return False
        if node.op_type not in FOLD_ANY_SIZE and any(consts[nm].size > 4096 for nm in names):
            return False
        ins = [consts[nm] if nm else None for nm in node.input]
        try:
            outs = [np.asarray(v) if isinstance(v, np.generic) else v      # a numpy fold where the op has one
                    for v in (spec.fold or spec.fn)(Ctx(node, attrs, self.opset, len(node.output)), ins)]
        except (ValueError, IndexError, TypeError) as e:
            raise OnnxImportError(f"tessera.onnx.load: {describe(node)}: malformed ({e})") from None
        if not all(isinstance(v, np.ndarray) for v in outs):
            return False
        for nm, v in zip(node.output, outs):
            if nm:
                consts[nm] = v
        return True

    # ------------------------------------------------------------------ the traced function
    def _replay(self, *args):
        n = len(self.inputs)
        env = dict(zip(self.input_names, args[:n]))
        env.update(zip(self._bound, args[n:]))
        local = dict(self.consts)
        for node, spec, attrs, folded in self.plan:
            if folded:
                continue
            ins = []
            for i, nm in enumerate(node.input):
                if not nm:
                    ins.append(None)
                elif i in spec.static:
                    ins.append(local[nm] if nm in local else env[nm])
                else:
                    ins.append(env[nm] if nm in env else local[nm])
            last = max((i + 1 for i, nm in enumerate(node.output) if nm), default=0)
            ctx = Ctx(node, attrs, self.opset, last)
            try:
                outs = [np.asarray(v) if isinstance(v, np.generic) else v for v in spec.fn(ctx, ins)]
            except (DynamicShapeError, ScalarSpecialize, OnnxImportError):
                raise
            except TesseraError as e:            # name the node in the op's own coded error
                e.message = f"tessera.onnx: {describe(node)}: {e.message}"
                e.args = (e.message,)
                raise
            except (ValueError, IndexError, TypeError) as e:     # numpy folding shapes that do not fit
                raise OnnxImportError(f"tessera.onnx: {describe(node)}: malformed ({e})") from None
            for nm, v in zip(node.output, outs):
                if nm:
                    (local if isinstance(v, np.ndarray) else env)[nm] = v
        res = []
        for nm in self.output_names:
            v = env[nm] if nm in env else local[nm]
            res.append(v if not isinstance(v, np.ndarray) else
                       materialise(Ctx(_Output(nm), {}, self.opset, 1), v))
        return res[0] if len(res) == 1 else tuple(res)

    def _make_jit(self, dynamic):
        from tessera.frontend.jit import jit

        def replay(*args):
            return self._replay(*args)
        replay.__name__ = replay.__qualname__ = "onnx_" + "".join(c if c.isalnum() else "_" for c in
                                                                   (self.model.graph.name or "graph"))
        return jit(replay, dynamic=dynamic, **self._jit_opts)

    # ------------------------------------------------------------------ calls
    def _args(self, args, kwargs) -> list:
        if len(args) > len(self.inputs):
            raise ArgumentError(f"tessera.onnx: the model takes {len(self.inputs)} inputs "
                                f"({', '.join(self.input_names)}), got {len(args)}")
        vals = list(args) + [None] * (len(self.inputs) - len(args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise ArgumentError(f"tessera.onnx: the model has no input {k!r} "
                                    f"(inputs: {', '.join(self.input_names)})")
            i = self.input_names.index(k)
            if i < len(args):
                raise ArgumentError(f"tessera.onnx: input {k!r} given by position and by name")
            vals[i] = v
        missing = [self.input_names[i] for i, v in enumerate(vals) if v is None]
        if missing:
            raise ArgumentError(f"tessera.onnx: missing input(s) {', '.join(missing)}")
        for i, ((name, d, dims), v) in enumerate(zip(self.inputs, vals)):
            if isinstance(v, (int, float, bool, np.number, np.bool_)):
                v = vals[i] = np.asarray(v, dtype=d)
            if isinstance(v, np.ndarray):
                if v.dtype != d:
                    raise DtypeError(f"tessera.onnx: input {name!r} is {dt.name(d)} in the model, "
                                     f"got {dt.name(v.dtype)}")
                if v.ndim != len(dims) or any(isinstance(m, int) and m != s for m, s in zip(dims, v.shape)):
                    shown = tuple(m if m is not None else "?" for m in dims)
                    raise ShapeMismatchError(f"tessera.onnx: input {name!r} has shape {shown} in the model, got "
                                             f"{v.shape}")
        return vals + [self.weights[nm] for nm in self._bound]

    def __call__(self, *args, **kwargs):
        vals = self._args(args, kwargs)
        if self._static_jit is not None:
            return self._static_jit(*vals)
        try:
            return self.jitted(*vals)
        except DynamicShapeError as e:
            if not self.dynamic:
                raise
            # the graph cannot be bucketed along its dynamic dims: specialise on each shape instead
            self.dynamic_fallback = e.message
            self.dynamic = {}
            self._static_jit = self.jitted = self._make_jit(None)
            return self._static_jit(*vals)

    def explain(self, *args, **kwargs):
        from tessera.frontend.jit import explain
        return explain(self.jitted, *self._args(args, kwargs))

    def __repr__(self) -> str:
        return (f"<tessera.onnx model {self.model.graph.name!r}: inputs {self.input_names}, outputs "
                f"{self.output_names}, {len(self.weights)} bound weights, opset {self.model_opset}>")


class _Output:
    """Stands in for a node when a graph output is a constant built while tracing."""

    def __init__(self, name):
        self.name, self.op_type = f"output {name}", "graph output"


def load(model, *, target: str | None = None, arch: str | None = None) -> OnnxFunction:
    """Load an ONNX model (a path, its bytes, or an ``onnx.ModelProto``) as a jitted function.
    ``target`` / ``arch`` are ``tessera.jit``'s.  Raises ``ONNX_IMPORT`` for a model that cannot
    be read or checked, and ``ONNX_UNSUPPORTED`` listing every node it cannot map."""
    return OnnxFunction(_read(model), target=target, arch=arch)
