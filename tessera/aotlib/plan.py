"""The launch plan of an exported library: a CPU program's host steps with every size fixed.

The CPU lane's host program (``runtime/cpu.py``: ``HostProgram``) is run by Python: per call it
binds the symbolic sizes, allocates results and intermediates and calls each kernel's
``<kernel>.entry(words, tid)``.  An exported library runs the same steps from native code, so
everything the Python runtime works out per call is worked out here once, for the example
arguments' sizes:

* each step's argument words (``codegen/x86.py``: ``add_entry``): the buffers (arguments,
  results), the sizes, the thread count, the team buffer and one workspace per thread;
* where every value lives: an argument is the caller's pointer, a result the caller's output
  pointer, an intermediate a slot of one workspace arena (with the team buffer and the
  per-thread kernel workspaces), each 64-byte aligned;
* the copies a result needs when it is an argument returned as is, or a value returned twice.

Nothing here runs code; ``driver.py`` turns a plan into LLVM IR.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera.errors import ExportError
from tessera.ir import dims as D
from tessera.ir.target.x86 import TEAM_HEADER
from tessera.runtime.cpu import HostProgram, TensorSpec, _eval, launch_work

ALIGN = 64

# numpy dtype string -> (C type, bytes, what the header says)
C_TYPES = {"<f4": ("float", 4, "float32"), "<f8": ("double", 8, "float64"),
           "<f2": ("uint16_t", 2, "float16 bits (IEEE binary16)"), "<V2": ("uint16_t", 2, "bfloat16 bits"),
           "|i1": ("int8_t", 1, "int8"), "|u1": ("uint8_t", 1, "uint8"), "<i4": ("int32_t", 4, "int32"), "<i8": ("int64_t", 8, "int64"),
           "|b1": ("uint8_t", 1, "bool (0 or 1 per byte)")}


def _up(n: int) -> int:
    return n + (-n % ALIGN)


@dataclass(frozen=True)
class Buffer:
    """Where a value lives: ``("in", i)`` argument i, ``("out", i)`` result i, ``("arena", off)``."""

    kind: str
    index: int


# A size known only at run time: ``(coef, names)`` is ``coef`` times the product of the library's
# size parameters ``names`` (its dynamic sizes); a fixed size is an ``int``.
Size = int | tuple[int, tuple[str, ...]]


@dataclass
class Launch:
    kernel: str                  # the kernel; its entry is ``kernel + ".entry"``
    buffers: list[Buffer]        # arguments then outputs, in the words' order
    sizes: list[Size]
    workspace: int               # bytes per thread
    team: int                    # team buffer bytes (its first TEAM_HEADER bytes zeroed per launch)
    threaded: bool               # may use more than one thread (parallel and enough work)


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]       # the largest shape (the dynamic sizes at their maximum)
    dtype: str                   # numpy dtype string (TensorSpec.dtype)
    dims: tuple[int | str, ...] = ()   # per axis: a fixed size, or the name of a dynamic size

    def shape_for(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims) if self.dims else self.shape

    @property
    def ctype(self) -> str:
        return C_TYPES[self.dtype][0]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * C_TYPES[self.dtype][1]


@dataclass
class Plan:
    inputs: list[Tensor]
    outputs: list[Tensor]
    launches: list[Launch]
    copies: list[tuple[Buffer, Buffer, Size]]  # (destination, source, bytes) after the launches
    team_bytes: int              # the team buffer: at arena offset 0
    ws_bytes: int                # one kernel workspace per thread, after the team buffer
    data_bytes: int              # intermediates, after the workspaces
    max_threads: int
    notes: list[str] = field(default_factory=list)
    sizes: list[tuple[str, int]] = field(default_factory=list)   # the dynamic sizes: (name, maximum)

    def arena_bytes(self, threads: int | None = None) -> int:
        """The arena for ``threads`` threads (default: the most the library runs), plus alignment slack."""
        n = self.max_threads if threads is None else threads
        return self.team_bytes + n * self.ws_bytes + self.data_bytes + ALIGN

    def data_offset(self) -> int:
        return self.team_bytes + self.max_threads * self.ws_bytes


def _static_env(program: HostProgram, shapes: list[tuple[int, ...]]) -> dict[str, int]:
    env: dict[str, int] = {}
    for i, (spec, shape) in enumerate(zip(program.inputs, shapes)):
        for axis, (d, n) in enumerate(zip(spec.dims, shape)):
            if isinstance(d, int):
                continue
            syms = D.symbols(d)
            if len(syms) == 1 and D.canon(d) == syms[0]:
                env.setdefault(syms[0], n)
    return env


def _dynamic_symbols(program: HostProgram, shapes, names: list[str], dynamic) -> dict[str, str]:
    """symbol -> the dynamic size's name, for ``dynamic``: {(input index, axis): name}.  Each marked
    axis must be a size of its own in the program (a symbol, not specialised), and every axis of
    that size must be marked."""
    sym_of: dict[str, str] = {}
    for (i, axis), nm in dynamic.items():
        spec = program.inputs[i]
        if not -len(spec.dims) <= axis < len(spec.dims):
            raise ExportError(f"dynamic: {names[i]} has no axis {axis} (rank {len(spec.dims)})")
        d = spec.dims[axis]
        syms = [] if isinstance(d, int) else D.symbols(d)
        if len(syms) != 1 or D.canon(d) != syms[0]:
            raise ExportError(f"dynamic: axis {axis} of {names[i]} is compiled for the fixed size {shapes[i][axis]} "
                              "(a size 1 in the example, or one the program reads as a number or splits): "
                              "export with an example larger than 1 there, or keep that axis fixed")
        if sym_of.get(syms[0], nm) != nm:
            raise ExportError(f"dynamic: axis {axis} of {names[i]} must equal the size {sym_of[syms[0]]!r} in this "
                              f"program (they are one size): give both the same name, not {nm!r}")
        sym_of[syms[0]] = nm
    for i, spec in enumerate(program.inputs):
        for axis, d in enumerate(spec.dims):
            if isinstance(d, str) and D.canon(d) in sym_of and (i, axis) not in dynamic \
                    and (i, axis - len(spec.dims)) not in dynamic:
                raise ExportError(f"dynamic: axis {axis} of {names[i]} has the size {sym_of[D.canon(d)]!r} in this "
                                  "program: mark it dynamic too")
    return sym_of


def make_plan(program: HostProgram, shapes: list[tuple[int, ...]], names: list[str], max_threads: int = 1,
              dynamic: dict[tuple[int, int], str] | None = None, max_sizes: dict[str, int] | None = None) -> Plan:
    """The launch plan of ``program`` for arguments of ``shapes`` (the example arguments').
    ``dynamic`` ({(input index, axis): size name}) leaves those sizes to run time, each up to
    ``max_sizes[name]``: the arena is laid out, and threading decided, for the maxima."""
    if any(s.grid or s.block for s in program.steps):
        raise ExportError("this program was compiled for a GPU lane; export writes CPU libraries (target='cpu')")
    if len(shapes) != len(program.inputs):
        raise ExportError(f"the program takes {len(program.inputs)} arrays, {len(shapes)} shapes given")
    env = _static_env(program, shapes)
    sym_of = _dynamic_symbols(program, shapes, names, dynamic or {})
    maxima = dict(max_sizes or {})
    for sym, nm in sym_of.items():
        top = maxima.setdefault(nm, env[sym])
        if isinstance(top, bool) or not isinstance(top, int) or top < env[sym]:
            raise ExportError(f"max size of {nm!r} is {top!r}: expected an int at least the example's {env[sym]}")
        env[sym] = top                             # the layout's sizes: the largest
    for spec in program.inputs:
        for d in spec.dims:
            if not isinstance(d, int) and any(s not in env for s in D.symbols(d)):
                raise ExportError(f"size {d!r} of an argument is not fixed by the example arguments; an exported "
                                  "library has sizes fixed at export time")
    for spec in list(program.inputs) + [t for s in program.steps for t in s.out_types]:
        if spec.dtype not in C_TYPES:
            raise ExportError(f"dtype {spec.dtype} has no C type in an exported library; supported: "
                              f"{', '.join(v[2] for v in C_TYPES.values())}")

    def shape(spec: TensorSpec) -> tuple[int, ...]:
        return tuple(_eval(d, env) for d in spec.dims)

    def size(d) -> Size:
        """A size word: an int, or (coef, dynamic size names) when it depends on one."""
        if isinstance(d, int):
            return d
        coef, syms = D._factors(D.parse_dim(d))
        dyn = tuple(sorted(sym_of[x] for x in syms if x in sym_of))
        for x in syms:
            coef *= 1 if x in sym_of else env[x]
        return (coef, dyn) if dyn else coef

    def dims(spec: TensorSpec) -> tuple[int | str, ...]:
        out = []
        for d in spec.dims:
            s = size(d)
            if isinstance(s, int):
                out.append(s)
            elif s[0] == 1 and len(s[1]) == 1:
                out.append(s[1][0])
            else:
                raise ExportError(f"a result's size {d!r} is a product of the dynamic sizes; exported results have "
                                  "each axis of one dynamic size or fixed")
        return tuple(out)

    inputs = [Tensor(n, shape(spec), spec.dtype, dims(spec)) for n, spec in zip(names, program.inputs)]
    example: dict[str, int] = {}
    for (i, ax), nm in (dynamic or {}).items():
        if example.setdefault(nm, shapes[i][ax]) != shapes[i][ax]:
            raise ExportError(f"dynamic: the example arguments give the size {nm!r} two values "
                              f"({example[nm]} and {shapes[i][ax]})")
    for t, sh in zip(inputs, shapes):
        if t.shape_for(example) != tuple(sh):
            raise ExportError(f"argument {t.name} has shape {tuple(sh)}; the program expects {t.shape_for(example)}")
    where: dict[int, Buffer] = {vid: Buffer("in", i) for i, vid in enumerate(program.input_ids)}
    result_of: dict[int, int] = {}                 # value id -> the first result index returning it
    for r, vid in enumerate(program.results):
        result_of.setdefault(vid, r)
    types: dict[int, TensorSpec] = dict(zip(program.input_ids, program.inputs))
    data, launches, notes = 0, [], []
    for s in program.steps:
        for expr, bound in ([(e, int(n)) for e, n in (lim.split("<=") for lim in s.limits)]):
            if _eval(expr, env) > bound:
                raise ExportError(f"kernel {s.kernel} supports {expr} <= {bound}, got {_eval(expr, env)}")
        for o, t in zip(s.outs, s.out_types):
            types[o] = t
            if o in result_of and o not in program.input_ids:
                where[o] = Buffer("out", result_of[o])
            else:
                where[o] = Buffer("arena", data)
                data += _up(math.prod(shape(t)) * (C_TYPES[t.dtype][1]))
        if any(math.prod(shape(t)) == 0 for t in s.out_types):
            notes.append(f"{s.kernel}: an empty result, not launched")
            continue
        gemm, work = launch_work(s, env, [_eval(d, env) for d in s.dims])
        threaded = s.parallel != "none" and work >= ((1 << 21) if gemm else (1 << 15))
        launches.append(Launch(s.kernel, [where[v] for v in s.args + s.outs], [size(d) for d in s.dims],
                               s.workspace, s.team, threaded))
    outputs = [Tensor(f"out{r}" if len(program.results) > 1 else "out", shape(types[vid]), types[vid].dtype,
                      dims(types[vid])) for r, vid in enumerate(program.results)]
    copies = []
    for r, vid in enumerate(program.results):
        src = where[vid]
        if src != Buffer("out", r):                # an argument returned as is, or a value returned twice
            t = types[vid]
            nbytes = size(D.product([C_TYPES[t.dtype][1]] + list(t.dims)))
            copies.append((Buffer("out", r), src, nbytes))
    team = _up(max([TEAM_HEADER] + [ln.team for ln in launches]))
    ws = _up(max([ALIGN] + [ln.workspace for ln in launches]))
    used = sorted(set(sym_of.values()), key=lambda nm: list(sym_of.values()).index(nm))
    return Plan(inputs, outputs, launches, copies, team, ws, data, max(1, max_threads), notes,
                [(nm, maxima[nm]) for nm in used])
