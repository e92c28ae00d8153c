"""A seeded generator of random Tessera programs and their float64 oracle (issue 26, section 3).

A program is a straight-line list of steps over ``ts.ops`` (elementwise binary ops with
broadcasting and scalars, unary ops, softmax / layer_norm / rms_norm, reductions, matmul,
transpose).  Input shapes are templates over symbolic sizes ('a'..'e') and literal 1s
(broadcast dims): Tessera specialises only on which dims are 1, so one compiled program is
run at several odd sizes (3, 5, 7, 17, 33, 65).

The generator keeps an interval for every value so no value can overflow (exp of a bounded
argument, division by a value bounded away from zero, sqrt of a positive value).  The oracle
evaluates the same steps in float64 and, beside each value, a first-order bound ``M`` on the
error a correct implementation may make (each op's own rounding plus how it propagates its
inputs' errors): a result passes when ``|got - ref| <= C * eps(dtype) * M + C * tiny(dtype)``.

Every program is also printed as Python source (``Program.source``), which is what a failure
shows, so a failing program can be pasted and rerun.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import oracle as o
import tessera as ts
from tessera.errors import TesseraError

SIZES = (3, 5, 7, 17, 33, 65)
MAX_SIZE = max(SIZES)
SYMBOLS = "abcde"
CONSTS = (0.5, 1.5, 2.0, -0.75, 3.0, 0.25, -1.25)
DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
          "float64": np.float64}
LIMIT = {"float32": 1e4, "bfloat16": 1e4, "float16": 2e3, "float64": 1e4}  # |value| bound
C = 16.0                      # ulps of slack per unit of the error bound
MAX_ELEMENTS = 40_000         # per value, per binding

BINARY = ("add", "sub", "mul", "div", "maximum")
UNARY = ("neg", "exp", "tanh", "erf", "relu", "silu", "sqrt", "gelu")
REDUCE = ("reduce_sum", "reduce_max", "reduce_mean")
OPERATOR = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

# refusals that are documented and legitimate for a valid program: (code, why, applies(program))
LEGITIMATE_REFUSALS = (
    ("MMA_SELECTOR", "x86 has no f16 matrix instruction (docs/mma.md)",
     lambda p: p.dtype == "float16" and p.has("matmul")),
)


@dataclass
class Val:
    name: str
    dims: tuple            # each a symbol (str) or the literal 1
    lo: float
    hi: float

    @property
    def bound(self) -> float:
        return max(abs(self.lo), abs(self.hi))


@dataclass
class Step:
    out: str
    op: str
    args: list             # value names (str) or float constants
    attrs: dict = field(default_factory=dict)
    form: str = "call"     # "call": ts.ops.<op>(...); "operator": a + b, -a, a @ b


@dataclass
class Program:
    seed: int
    dtype: str
    inputs: list           # [Val]
    steps: list            # [Step]
    outputs: list          # [str]
    vals: dict = field(default_factory=dict)

    def has(self, op: str) -> bool:
        return any(s.op == op for s in self.steps)

    @property
    def name(self) -> str:
        return f"prog_{self.seed}"

    @property
    def source(self) -> str:
        lines = [f"# seed {self.seed}, dtype {self.dtype}; inputs: "
                 + ", ".join(f"{v.name}{_dims_text(v.dims)}" for v in self.inputs),
                 f"def {self.name}({', '.join(v.name for v in self.inputs)}):"]
        for s in self.steps:
            lines.append(f"    {s.out} = {_expr(s)}")
        lines.append(f"    return {', '.join(self.outputs)}")
        return "\n".join(lines) + "\n"

    def function(self):
        ns = {"ts": ts}
        exec(compile(self.source, f"<{self.name}>", "exec"), ns)  # noqa: S102 - our own generated source
        return ns[self.name]


def _dims_text(dims) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _arg(a) -> str:
    return a if isinstance(a, str) else repr(float(a))


def _expr(s: Step) -> str:
    a = [_arg(x) for x in s.args]
    if s.form == "operator":
        if s.op in OPERATOR:
            return f"{a[0]} {OPERATOR[s.op]} {a[1]}"
        if s.op == "neg":
            return f"-{a[0]}"
        if s.op == "matmul":
            return f"{a[0]} @ {a[1]}"
    kw = "".join(f", {k}={v!r}" for k, v in s.attrs.items())
    return f"ts.ops.{s.op}({', '.join(a)}{kw})"


# ---------------------------------------------------------------------------------- generator
def _bcast(d1: tuple, d2: tuple) -> tuple | None:
    n = max(len(d1), len(d2))
    d1, d2 = (1,) * (n - len(d1)) + d1, (1,) * (n - len(d2)) + d2
    out = []
    for x, y in zip(d1, d2):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def _count(dims) -> int:
    return math.prod(MAX_SIZE if d != 1 else 1 for d in dims)


def _mul_iv(a, b):
    ps = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
    return min(ps), max(ps)


class _Gen:
    def __init__(self, seed: int, dtype: str, n_ops: int):
        self.r = random.Random(seed)
        self.seed, self.dtype, self.n_ops = seed, dtype, n_ops
        self.inputs: list[Val] = []
        self.vals: dict[str, Val] = {}
        self.steps: list[Step] = []
        self.limit = LIMIT[dtype]

    # values ----------------------------------------------------------------------------
    def new_input(self, dims: tuple, lo=-2.0, hi=2.0) -> Val:
        v = Val(f"x{len(self.inputs)}", tuple(dims), lo, hi)
        self.inputs.append(v)
        self.vals[v.name] = v
        return v

    def fresh_dims(self, rank: int) -> tuple:
        return tuple(1 if self.r.random() < 0.2 else self.r.choice(SYMBOLS) for _ in range(rank))

    def emit(self, op: str, args: list, dims: tuple, lo: float, hi: float, form="call", **attrs) -> Val | None:
        if not (math.isfinite(lo) and math.isfinite(hi)) or max(abs(lo), abs(hi)) > self.limit:
            return None
        v = Val(f"v{len(self.steps)}", tuple(dims), lo, hi)
        self.steps.append(Step(v.name, op, list(args), attrs, form))
        self.vals[v.name] = v
        return v

    def pick(self, pred=lambda v: True) -> Val | None:
        cands = [v for v in self.vals.values() if pred(v)]
        if not cands:
            return None
        recent = [v for v in cands if v.name.startswith("v")][-3:]
        return self.r.choice(recent) if recent and self.r.random() < 0.6 else self.r.choice(cands)

    def derived_dims(self, dims: tuple) -> tuple:
        d = [1 if self.r.random() < 0.3 else x for x in dims]
        if len(d) > 1 and self.r.random() < 0.3:
            d = d[self.r.randint(1, len(d) - 1):]
        elif len(d) < 3 and self.r.random() < 0.15:     # a new leading dim: outside dims' rank only
            d = [self.r.choice((1, *SYMBOLS))] + d
        return tuple(d)

    def positive(self, v: Val) -> Val | None:
        """v itself if bounded away from zero (> 0.25), else v * v + c (emitted)."""
        if v.lo > 0.25:
            return v
        sq = self.emit("mul", [v.name, v.name], v.dims, 0.0, v.bound ** 2, form=self.form())
        if sq is None:
            return None
        c = self.r.choice((0.5, 1.5, 2.0))
        return self.emit("add", [sq.name, c], sq.dims, sq.lo + c, sq.hi + c, form=self.form())

    def form(self) -> str:
        return "operator" if self.r.random() < 0.5 else "call"

    # ops -------------------------------------------------------------------------------
    def op_binary(self) -> Val | None:
        op = self.r.choice(BINARY)
        a = self.pick()
        if a is None:
            return None
        u = self.r.random()
        if u < 0.25:                                 # a scalar operand
            c = self.r.choice(CONSTS)
            if op == "div" and self.r.random() < 0.5:
                b_iv, b_arg = (c, c), c
                if a.lo <= 0.25 and a.hi >= -0.25:
                    return None                      # c / a needs a bounded-away a: the next try
                args, dims, iv = [c, a.name], a.dims, self._iv(op, (c, c), (a.lo, a.hi))
            elif op != "div" and self.r.random() < 0.3:   # 2.0 - x: the reflected operators
                args, dims, iv = [c, a.name], a.dims, self._iv(op, (c, c), (a.lo, a.hi))
            else:
                args, dims, iv = [a.name, c], a.dims, self._iv(op, (a.lo, a.hi), (c, c))
            if op == "maximum" or self.r.random() < 0.5:
                return self.emit(op, args, dims, *iv)
            return self.emit(op, args, dims, *iv, form="operator")
        if u < 0.6:
            b = self.pick(lambda v: v is not a and _bcast(v.dims, a.dims) is not None)
        else:
            b = None
        if b is None:
            b = self.new_input(self.derived_dims(a.dims))
        if self.r.random() < 0.5:
            a, b = b, a
        if op == "div":
            b = self.positive(b)
            if b is None:
                return None
        dims = _bcast(a.dims, b.dims)
        iv = self._iv(op, (a.lo, a.hi), (b.lo, b.hi))
        form = "call" if op == "maximum" else self.form()
        return self.emit(op, [a.name, b.name], dims, *iv, form=form)

    @staticmethod
    def _iv(op, a, b):
        if op == "add":
            return a[0] + b[0], a[1] + b[1]
        if op == "sub":
            return a[0] - b[1], a[1] - b[0]
        if op == "mul":
            return _mul_iv(a, b)
        if op == "div":
            if b[0] <= 0 <= b[1]:
                return -math.inf, math.inf
            return _mul_iv(a, (1 / b[1], 1 / b[0]))
        return max(a[0], b[0]), max(a[1], b[1])      # maximum

    def op_unary(self) -> Val | None:
        op = self.r.choice(UNARY)
        a = self.pick()
        if a is None:
            return None
        lo, hi = a.lo, a.hi
        attrs = {}
        if op == "neg":
            return self.emit(op, [a.name], a.dims, -hi, -lo, form=self.form())
        if op == "exp":
            if hi > 8:
                return None
            return self.emit(op, [a.name], a.dims, math.exp(lo), math.exp(hi))
        if op == "sqrt":
            a = self.positive(a)
            if a is None:
                return None
            return self.emit(op, [a.name], a.dims, math.sqrt(a.lo), math.sqrt(a.hi))
        if op in ("tanh", "erf"):
            return self.emit(op, [a.name], a.dims, -1.0, 1.0)
        if op == "gelu":
            attrs["approximate"] = self.r.choice(("tanh", "erf"))
        lo2 = {"relu": max(lo, 0.0), "silu": -0.28, "gelu": -0.17}[op]
        return self.emit(op, [a.name], a.dims, min(lo2, max(hi, 0.0)), max(hi, 0.0), **attrs)

    def op_row(self) -> Val | None:
        a = self.pick(lambda v: len(v.dims) >= 1)
        if a is None:
            return None
        op = self.r.choice(("softmax", "layer_norm", "rms_norm"))
        if op == "softmax":
            axis = -1 if len(a.dims) == 1 or self.r.random() < 0.8 else self.r.randrange(len(a.dims))
            return self.emit(op, [a.name], a.dims, 0.0, 1.0, axis=axis)
        n = MAX_SIZE if a.dims[-1] != 1 else 1
        vecs, gain, shift = [], 1.0, 0.0
        k = self.r.choice((0, 1, 2) if op == "layer_norm" else (0, 1))   # scale, then bias (positional)
        for role in ("scale", "bias")[:k]:
            w = self.pick(lambda v: v.dims == (a.dims[-1],)) if self.r.random() < 0.5 else None
            w = w or self.new_input((a.dims[-1],))
            vecs.append(w.name)
            if role == "scale":
                gain = w.bound
            else:
                shift = w.bound
        top = math.sqrt(n) * gain + shift
        eps = self.r.choice((None, None, 1e-3))
        attrs = {} if eps is None else {"eps": eps}
        return self.emit(op, [a.name, *vecs], a.dims, -top, top, **attrs)

    def op_reduce(self) -> Val | None:
        a = self.pick(lambda v: len(v.dims) >= 1)
        if a is None:
            return None
        op = self.r.choice(REDUCE)
        rank = len(a.dims)
        u = self.r.random()
        if u < 0.2:
            axes, axis = tuple(range(rank)), None
        elif u < 0.7 or rank == 1:
            ax = self.r.randrange(rank)
            axes, axis = (ax,), ax - rank if self.r.random() < 0.3 else ax
        else:
            axes = tuple(sorted(self.r.sample(range(rank), 2)))
            axis = axes
        keep = self.r.random() < 0.3
        dims = tuple((1 if i in axes else d) for i, d in enumerate(a.dims) if keep or i not in axes)
        n = _count([a.dims[i] for i in axes])
        lo, hi = (a.lo * n, a.hi * n) if op == "reduce_sum" else (a.lo, a.hi)
        attrs = {"axis": axis}
        if keep:
            attrs["keepdims"] = True
        return self.emit(op, [a.name], dims, lo, hi, **attrs)

    def op_matmul(self) -> Val | None:
        a = self.pick(lambda v: len(v.dims) >= 1)
        if a is None:
            return None
        k = a.dims[-1]
        if len(a.dims) == 1 and self.r.random() < 0.5:
            return None                                 # vector @ matrix: rarely
        b = None
        if self.r.random() < 0.4:
            b = self.pick(lambda v: len(v.dims) >= 2 and v.dims[-2] == k and v is not a
                          and _bcast(v.dims[:-2], a.dims[:-2]) is not None)
        if b is None:
            n = self.r.choice((1, *SYMBOLS)) if self.r.random() < 0.9 else None
            if n is None:
                dims = (k,)                              # matrix @ vector
            else:
                batch = tuple(self.derived_dims(a.dims[:-2])) if len(a.dims) > 2 and self.r.random() < 0.5 else ()
                dims = (*batch, k, n)
            b = self.new_input(dims)
        if len(b.dims) == 1 and len(a.dims) == 1:
            return None
        batch = _bcast(a.dims[:-2], b.dims[:-2])
        if batch is None:
            return None
        dims = batch + (() if len(a.dims) == 1 else (a.dims[-2],)) + (() if len(b.dims) == 1 else (b.dims[-1],))
        kn = MAX_SIZE if k != 1 else 1
        lo, hi = _mul_iv((a.lo, a.hi), (b.lo, b.hi))
        return self.emit("matmul", [a.name, b.name], dims, lo * kn, hi * kn, form=self.form())

    def op_transpose(self) -> Val | None:
        a = self.pick(lambda v: len(v.dims) >= 2)
        if a is None:
            return None
        perm = list(range(len(a.dims)))
        while perm == list(range(len(a.dims))):
            self.r.shuffle(perm)
        if len(perm) == 2 and self.r.random() < 0.5:
            return self.emit("transpose", [a.name], tuple(reversed(a.dims)), a.lo, a.hi)
        return self.emit("transpose", [a.name], tuple(a.dims[p] for p in perm), a.lo, a.hi, axes=tuple(perm))

    def build(self, allow_matmul: bool) -> Program:
        self.new_input(self.fresh_dims(self.r.choice((1, 2, 2, 2, 3, 3))))
        kinds = [("binary", 4), ("unary", 3), ("row", 2), ("reduce", 1.2), ("transpose", 0.8)]
        if allow_matmul:
            kinds.append(("matmul", 1.5))
        names, weights = zip(*kinds)
        made = 0
        for _ in range(self.n_ops * 8):
            if made >= self.n_ops:
                break
            kind = self.r.choices(names, weights)[0]
            if getattr(self, f"op_{kind}")() is not None:
                made += 1
        outs = [s.out for s in self.steps][-1:] or [self.emit("neg", ["x0"], self.inputs[0].dims, -2, 2).name]
        others = [s.out for s in self.steps[:-1] if s.out not in outs]
        if others and self.r.random() < 0.25:
            outs.append(self.r.choice(others))
        return Program(self.seed, self.dtype, self.inputs, self.steps, outs, self.vals)


def generate(seed: int, dtype: str = "float32", ops: tuple[int, int] = (2, 7)) -> Program:
    """The program of ``seed``: ops[0]..ops[1] steps (plus the v * v + c a sqrt or div may add).
    float16 programs have no matmul (x86 has no f16 matrix instruction: MMA_SELECTOR)."""
    r = random.Random(seed * 7919 + 1)
    return _Gen(seed, dtype, r.randint(*ops)).build(allow_matmul=dtype != "float16")


# ---------------------------------------------------------------------------------- oracle
def _red_factor(n: int) -> float:
    return max(1.0, math.sqrt(n) / 4)


def _erf_d(x):
    return 2 / math.sqrt(math.pi) * np.exp(-x * x)


def _eval_step(s: Step, env: dict) -> tuple[np.ndarray, np.ndarray]:
    """(value, error bound M) of one step in float64."""
    def get(a):
        if isinstance(a, str):
            return env[a]
        return np.float64(a), np.float64(0.0)
    xs = [get(a) for a in s.args]
    op = s.op
    if op in BINARY:
        (a, ma), (b, mb) = xs
        r = ORACLE[op](a, b)
        if op in ("add", "sub"):
            m = ma + mb
        elif op == "mul":
            m = ma * np.abs(b) + np.abs(a) * mb
        elif op == "div":
            m = ma / np.abs(b) + np.abs(a) * mb / (b * b)
        else:
            m = np.maximum(ma, mb)
        return r, m + np.abs(r)
    if op == "matmul":
        (a, ma), (b, mb) = xs
        r = ORACLE[op](a, b)
        k = a.shape[-1]
        m = (np.matmul(np.abs(a), mb) + np.matmul(ma, np.abs(b)) + np.matmul(np.abs(a), np.abs(b))) * _red_factor(k)
        return r, m + np.abs(r)
    (a, ma) = xs[0]
    if op in UNARY:
        r = ORACLE[op](a, **s.attrs)
        deriv = {"neg": 1.0, "exp": np.abs(r), "tanh": 1 - r * r, "erf": _erf_d(a), "relu": 1.0,
                 "silu": 1.1, "gelu": 1.13}.get(op)
        if op == "sqrt":
            deriv = 0.5 / r
        return r, deriv * ma + np.abs(r)
    if op == "softmax":
        ax = s.attrs.get("axis", -1)
        r = ORACLE[op](a, axis=ax)
        span = np.abs(a - a.max(axis=ax, keepdims=True))
        return r, r * (ma + ma.max(axis=ax, keepdims=True) + span + 1)
    if op in ("layer_norm", "rms_norm"):
        vecs = xs[1:]
        eps = s.attrs.get("eps", 1e-5 if op == "layer_norm" else 1e-6)
        if op == "layer_norm":
            c = a - a.mean(-1, keepdims=True)
        else:
            c = a
        sig = np.sqrt((c * c).mean(-1, keepdims=True) + eps)
        xh = c / sig
        mm = ma.mean(-1, keepdims=True)
        dxh = (ma + (mm if op == "layer_norm" else 0) + np.abs(xh) * (np.abs(xh) * ma).mean(-1, keepdims=True)) / sig
        dxh = dxh * _red_factor(a.shape[-1])
        r = ORACLE[op](a, *[v for v, _ in vecs], eps=eps)
        g, mg = vecs[0] if vecs else (1.0, 0.0)
        m = np.abs(g) * (dxh + np.abs(xh)) + mg * np.abs(xh)
        if len(vecs) > 1:
            m = m + vecs[1][1]
        return r, m + np.abs(r)
    if op in REDUCE:
        axis = s.attrs.get("axis")
        keep = s.attrs.get("keepdims", False)
        r = ORACLE[op](a, axis=axis, keepdims=keep)
        n = a.size // max(r.size, 1) if r.size else 1
        if op == "reduce_max":
            return r, np.max(ma, axis=axis, keepdims=keep)
        m = (np.sum if op == "reduce_sum" else np.mean)(ma, axis=axis, keepdims=keep) * _red_factor(n)
        return r, m + np.abs(r)
    if op == "transpose":
        ax = s.attrs.get("axes")
        return ORACLE[op](a, ax), np.transpose(ma, ax)
    raise AssertionError(f"no oracle for {op}")


ORACLE = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
    "neg": np.negative, "exp": np.exp, "tanh": np.tanh, "erf": o.erf, "relu": lambda x: np.maximum(x, 0.0),
    "silu": o.silu, "sqrt": np.sqrt,
    "gelu": lambda x, approximate="tanh": o.gelu_tanh(x) if approximate == "tanh" else o.gelu_erf(x),
    "softmax": o.softmax,
    "layer_norm": lambda x, *v, eps: o.layer_norm(x, *v, eps=eps),
    "rms_norm": lambda x, *v, eps: o.rms_norm(x, *v, eps=eps),
    "reduce_sum": np.sum, "reduce_max": np.max, "reduce_mean": np.mean,
    "matmul": np.matmul, "transpose": np.transpose,
}


def evaluate(p: Program, args: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    env = {v.name: (np.asarray(a, np.float64), np.abs(np.asarray(a, np.float64))) for v, a in zip(p.inputs, args)}
    for s in p.steps:
        env[s.out] = _eval_step(s, env)
    return [env[n] for n in p.outputs]


# ---------------------------------------------------------------------------------- driver
def bind(p: Program, r: random.Random) -> dict:
    """Sizes for the symbols, every value at most MAX_ELEMENTS elements."""
    for _ in range(50):
        sizes = {s: r.choice(SIZES) for s in SYMBOLS}
        if all(math.prod(sizes.get(d, 1) for d in v.dims) <= MAX_ELEMENTS for v in p.vals.values()):
            return sizes
    return {s: 3 for s in SYMBOLS}


def shape(dims, sizes) -> tuple:
    return tuple(sizes.get(d, 1) for d in dims)


def inputs(p: Program, sizes: dict, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for v in p.inputs:
        x = rng.uniform(v.lo, v.hi, shape(v.dims, sizes))
        out.append(np.asarray(x).astype(DTYPES[p.dtype]))
    return out


def check(p: Program, got, args) -> str:
    """'' when every output is within its bound, else what differs."""
    ref = evaluate(p, args)
    got = list(got) if isinstance(got, tuple) else [got]
    if len(got) != len(ref):
        return f"{len(got)} outputs, expected {len(ref)}"
    dt = DTYPES[p.dtype]
    eps, tiny = float(np.finfo(dt).eps), float(np.finfo(dt).tiny)
    for i, (g, (r, m)) in enumerate(zip(got, ref)):
        g = np.asarray(g)
        if g.shape != r.shape:
            return f"output {i}: shape {g.shape}, expected {r.shape}"
        if g.dtype != dt:
            return f"output {i}: dtype {g.dtype}, expected {np.dtype(dt)}"
        g64 = g.astype(np.float64)
        err = np.abs(g64 - r)
        tol = C * eps * m + C * tiny
        bad = ~(err <= tol)
        if bad.any():
            j = np.unravel_index(np.argmax(np.where(bad, err / np.maximum(tol, 1e-300), 0)), r.shape) if r.ndim else ()
            return (f"output {i}: {int(bad.sum())} of {r.size} elements off; at {tuple(int(t) for t in j)} got "
                    f"{g64[j]!r}, float64 oracle {r[j]!r} (error {err[j]:.3g}, allowed {tol[j]:.3g})")
    return ""


@dataclass
class Outcome:
    program: Program
    status: str            # "ok", "refused", "mismatch", "error"
    detail: str = ""
    runs: int = 0


def run(p: Program, rng: np.random.Generator, bindings: int = 2) -> Outcome:
    """Compile once, run at ``bindings`` size bindings, check each against the oracle."""
    r = random.Random(p.seed)
    try:
        fn = ts.jit(p.function())
    except Exception as e:  # noqa: BLE001 - a generator defect is a failure too
        return Outcome(p, "error", f"the source does not run: {type(e).__name__}: {e}")
    n = 0
    for _ in range(bindings):
        sizes = bind(p, r)
        args = inputs(p, sizes, rng)
        try:
            got = fn(*args)
        except TesseraError as e:
            for code, why, applies in LEGITIMATE_REFUSALS:
                if e.code == code and applies(p):
                    return Outcome(p, "refused", f"{code}: {why}", n)
            return Outcome(p, "error", f"{type(e).__name__}: {e} (shapes {[a.shape for a in args]})", n)
        except Exception as e:  # noqa: BLE001
            return Outcome(p, "error", f"uncoded {type(e).__name__}: {e} (shapes {[a.shape for a in args]})", n)
        n += 1
        with np.errstate(all="ignore"):
            bad = check(p, got, args)
        if bad:
            return Outcome(p, "mismatch", f"{bad} (shapes {[a.shape for a in args]})", n)
    return Outcome(p, "ok", "", n)


def report(outcomes: list[Outcome]) -> str:
    """Every failing program with its source, for an assertion message."""
    fails = [o for o in outcomes if o.status in ("mismatch", "error")]
    return "\n".join(f"--- {o.status}: {o.detail}\n{o.program.source}" for o in fails)
