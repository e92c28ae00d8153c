"""Ahead-of-time export: a jitted function as ``lib<name>.so`` + ``<name>.h``, callable from C with
no Python at run time.

    lib = tessera.export(mlp, x, w, b, path="build", name="mlp")   # build/libmlp.so, build/mlp.h
    y, = lib.load()(x, w, b)                                        # the library through ctypes

The function is compiled for the CPU lane as ``tessera.compile`` does (the host CPU, or
``arch=``); the library holds its kernels' object code, a driver that runs the whole launch plan
(``plan.py``, ``driver.py``) and a CPU-feature check (``cpufeat.py``), linked with the bundled
``ld.lld`` (``link.py``).  Sizes are fixed at export time (those of the example arguments), but
for the axes named in ``dynamic=``: those sizes are arguments of the C functions.
"""
from __future__ import annotations

import ctypes
import keyword
import os
import re
from dataclasses import dataclass

import numpy as np

from tessera.errors import ExportError, LaneUnavailableError
from tessera.aotlib import cpufeat, driver, link, strided
from tessera.aotlib.header import header
from tessera.aotlib.plan import Plan, make_plan

_C_WORDS = {"auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
            "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
            "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
            "volatile", "while", "bool", "workspace", "size_t"}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Library:
    """An exported library: its files, its entry point and the plan it runs."""

    so_path: str
    header_path: str
    name: str
    plan: Plan
    cpu: str
    features: list[str]

    def load(self) -> "LoadedLibrary":
        return LoadedLibrary(self)


class LoadedLibrary:
    """The library loaded with ctypes (in this process): call it with numpy arrays."""

    def __init__(self, lib: Library):
        self.lib = lib
        self.dll = ctypes.CDLL(_loadable_path(lib.so_path))
        n = len(lib.plan.inputs) + len(lib.plan.outputs)
        self.entry = getattr(self.dll, lib.name)
        self.entry.restype = ctypes.c_int
        self.entry.argtypes = [ctypes.c_void_p] * n + [ctypes.c_int64] * len(lib.plan.sizes)
        self.strerror = getattr(self.dll, lib.name + "_strerror")
        self.strerror.restype, self.strerror.argtypes = ctypes.c_char_p, [ctypes.c_int]
        for fn in ("check_cpu", "get_num_threads"):
            getattr(self.dll, f"{lib.name}_{fn}").restype = ctypes.c_int
        self.set_threads = getattr(self.dll, lib.name + "_set_num_threads")
        self.set_threads.restype, self.set_threads.argtypes = ctypes.c_int, [ctypes.c_int]

    def check_cpu(self) -> int:
        return getattr(self.dll, self.lib.name + "_check_cpu")()

    def call_raw(self, *arrays, sizes: dict[str, int] | None = None) -> tuple[int, list[np.ndarray]]:
        """(the return code, the outputs) for ``arrays`` (converted to the library's dtypes, C order).
        The dynamic sizes are read off the arrays' shapes (``sizes`` overrides them, unchecked: a
        test of the library's own size check)."""
        plan = self.lib.plan
        if len(arrays) != len(plan.inputs):
            raise ExportError(f"{self.lib.name} takes {len(plan.inputs)} arrays, got {len(arrays)}")
        ins, got = [], {}
        for t, a in zip(plan.inputs, arrays):
            a = np.require(np.asarray(a, dtype=_np_dtype(t.dtype)), requirements=["C"])   # 0-d stays 0-d
            for d, n in zip(t.dims, a.shape):
                if isinstance(d, str):
                    got.setdefault(d, n)
            want = t.shape_for(got) if len(a.shape) == len(t.shape) else t.shape
            if a.shape != want:
                raise ExportError(f"{self.lib.name}: {t.name} has shape {a.shape}; the library was exported "
                                  f"for {t.dims or t.shape}" + (f" with {got}" if got else ""))
            ins.append(a)
        if sizes:
            got.update(sizes)
        outs = [np.empty(t.shape_for({k: max(v, 0) for k, v in got.items()}), _np_dtype(t.dtype))
                for t in plan.outputs]
        rc = self.entry(*[a.ctypes.data for a in ins + outs], *[got[nm] for nm, _ in plan.sizes])
        return rc, outs

    def call_strided(self, *arrays, out: list[np.ndarray] | None = None) -> int:
        """``name_strided`` on numpy arrays as they are (any strides, in place: inputs of the
        library's dtypes, not converted) writing into ``out`` (arrays of the output shapes, any
        strides); returns the return code.  Element strides are the byte strides / itemsize."""
        plan = self.lib.plan
        fn = getattr(self.dll, self.lib.name + "_strided")
        fn.restype = ctypes.c_int
        got: dict[str, int] = {}
        for t, a in zip(plan.inputs, arrays):
            for d, n in zip(t.dims, a.shape):
                if isinstance(d, str):
                    got.setdefault(d, n)
        bufs = list(arrays) + list(out or [])
        strides = [s // a.itemsize for a in bufs for s in a.strides]
        arr = (ctypes.c_int64 * max(1, len(strides)))(*strides)
        return fn(*[ctypes.c_void_p(a.ctypes.data) for a in bufs],
                  *[ctypes.c_int64(got[nm]) for nm, _ in plan.sizes], arr)

    def __call__(self, *arrays) -> list[np.ndarray]:
        rc, outs = self.call_raw(*arrays)
        if rc != driver.OK:
            raise LaneUnavailableError(f"lib{self.lib.name}.so returned {rc}: {self.strerror(rc).decode()}")
        return outs


_LOADED: dict[str, tuple[int, int]] = {}   # path -> (device, inode) of the file dlopen'ed from it here


def _loadable_path(path: str) -> str:
    """A path dlopen will load ``path``'s current file from.  dlopen returns the library it already
    loaded from the same path string even when the file was replaced since (an export again under
    that name): that one is loaded from a private copy instead."""
    import shutil
    import tempfile
    path = os.path.abspath(path)
    st = os.stat(path)
    ident = (st.st_dev, st.st_ino)
    if _LOADED.setdefault(path, ident) == ident:
        return path
    d = tempfile.mkdtemp(prefix="tessera-lib-")
    copy = os.path.join(d, os.path.basename(path))
    shutil.copyfile(path, copy)
    return copy


def _np_dtype(s: str) -> np.dtype:
    if s == "<V2":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(s)


def _c_name(text: str, what: str) -> str:
    if not _IDENT.match(text) or text in _C_WORDS or keyword.iskeyword(text):
        raise ExportError(f"{what} {text!r} is not usable as a C identifier (letters, digits, _; not a keyword)")
    return text


def _input_names(fn, n: int) -> list[str]:
    """The Python parameter names of the kernel's arrays where they can be told, else in0, in1, ..."""
    params = getattr(fn, "_params", None)
    static = set(getattr(fn, "_static", ())) | set(getattr(fn, "_learned", {}))
    if params:
        cand = [p.name for i, p in enumerate(params) if i not in static and p.kind in (p.POSITIONAL_ONLY,
                                                                                     p.POSITIONAL_OR_KEYWORD)]
        ok = (len(cand) == n and len(set(cand)) == n and all(_IDENT.match(c) and c not in _C_WORDS
                                                               and not c.startswith("out") for c in cand))
        if ok:
            return cand
    return [f"in{i}" for i in range(n)]


def _source(fn) -> str:
    """``name (file.py:line)`` of the exported Python function, for the header's first line."""
    code = getattr(fn.fn, "__code__", None)
    if code is None:
        return fn.name
    return f"{fn.name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def _kernel_objects(art) -> list[bytes]:
    """The objects the CPU lane loaded for this artifact, from the compile cache's entry (the same
    LLVM IR: no second LLVM run), else LLVM's object for its IR again (``art.binary()``)."""
    from tessera.frontend.compile import entry_ok
    from tessera.runtime import cache
    c = art.compiled
    try:
        entry = cache.load(c.key, validate=lambda e: entry_ok(e, "cpu") and e.get("llvm_ir") == c.llvm_ir)
    except Exception:  # noqa: BLE001 - an unreadable or untrusted cache: compile the object again
        entry = None
    objs = entry.get("objs") if entry else None
    if isinstance(objs, list) and objs and all(isinstance(o, bytes) for o in objs):
        return list(objs)
    return [art.binary()]


def _dynamic_axes(dynamic, names: list[str], shapes) -> dict[tuple[int, int], str]:
    """``dynamic`` ({argument name or index: {axis: size name}}) as {(input index, axis >= 0): name}."""
    out: dict[tuple[int, int], str] = {}
    if not dynamic:
        return out
    if not isinstance(dynamic, dict):
        raise ExportError(f"dynamic={dynamic!r}: expected {{argument: {{axis: size name}}}}")
    for arg, axes in dynamic.items():
        i = arg if isinstance(arg, int) and not isinstance(arg, bool) else names.index(arg) if arg in names else None
        if i is None or not 0 <= i < len(names):
            raise ExportError(f"dynamic: no array argument {arg!r} (the library's arrays: {', '.join(names)})")
        if not isinstance(axes, dict):
            raise ExportError(f"dynamic[{arg!r}]={axes!r}: expected {{axis: size name}}")
        rank = len(shapes[i])
        for ax, nm in axes.items():
            if isinstance(ax, bool) or not isinstance(ax, int) or not -rank <= ax < rank:
                raise ExportError(f"dynamic: {names[i]} has no axis {ax!r} (rank {rank})")
            out[(i, ax % rank)] = _c_name(nm, "dynamic size name") if isinstance(nm, str) else _c_name(
                str(nm), "dynamic size name")
    clash = {nm for nm in out.values()} & (set(names) | {f"out{k}" for k in range(64)} | {"out"})
    if clash:
        raise ExportError(f"dynamic size name {sorted(clash)[0]!r} is also a buffer's name")
    return out


def export_artifact(art, path: str = ".", name: str | None = None, threads: int = 1, dynamic=None,
                    max_sizes: dict[str, int] | None = None) -> Library:
    """Write ``lib<name>.so`` and ``<name>.h`` for a compiled CPU artifact into folder ``path``.
    ``dynamic`` / ``max_sizes``: as :func:`export`."""
    from tessera import __version__
    from tessera.codegen import jit as cj
    from tessera.mma.selector import record_by_id

    from tessera.frontend.dynamic import BucketArtifact
    fn, v = art.fn, art.variant
    if fn.target != "cpu":
        raise ExportError(f"{fn.name} is compiled for the {fn.target} lane; export writes CPU libraries "
                          "(target='cpu'): a GPU code object is art.binary()")
    if getattr(fn, "dynamic", None) or isinstance(art, BucketArtifact):
        raise ExportError(f"{fn.name} has dynamic shapes (jit(dynamic=...)); an exported library has every size "
                          "fixed at export time: export a function without dynamic=")
    if v.compiled is None:
        raise ExportError(f"{fn.name} runs on the reference lane ({v.reason}); there is no compiled code to export")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256:
        raise ExportError(f"threads={threads!r}: expected an int from 1 to 256")
    c = v.compiled
    name = _c_name(name or fn.name, "library name")
    if any(record_by_id(k["mma"]["record"]).family == "amx" for k in c.meta["kernels"] if "mma" in k):
        raise ExportError("the kernels use AMX tiles, which need a per-process permission (arch_prctl) an exported "
                          "library does not request; export with schedule or dtypes that do not select AMX")
    program = c.executable.program
    shapes = art.example_shapes
    if shapes is None:
        raise ExportError("this artifact does not record the sizes it was compiled for; export it with "
                          "tessera.export(fn, *example_args) or from tessera.compile(fn, *example_args)")
    names = _input_names(fn, len(program.inputs))
    plan = make_plan(program, shapes, names, threads, _dynamic_axes(dynamic, names, shapes), max_sizes)
    if strided.max_rank(plan) > strided.MAX_RANK:
        raise ExportError(f"an array of rank {strided.max_rank(plan)}: exported libraries take ranks up to "
                          f"{strided.MAX_RANK} (the strided entry point's index)")
    feats = cpufeat.required(c.cpu, c.features)
    ir = driver.library_ir(plan, name, cj.host_triple(), feats)
    cj.init()
    import llvmlite.binding as llvm
    llvm.initialize_native_asmparser()   # the CPUID / XGETBV inline assembly of the feature check
    drv = cj.emit(ir, c.cpu, c.features, opt=2).obj
    os.makedirs(path, exist_ok=True)
    so_path = os.path.join(path, f"lib{name}.so")
    api = [name, f"{name}_run", f"{name}_strided", f"{name}_workspace_size", f"{name}_check_cpu", f"{name}_set_num_threads",
           f"{name}_get_num_threads", f"{name}_strerror"]
    link.link(_kernel_objects(art) + [drv], so_path, api, f"lib{name}.so")
    h_path = os.path.join(path, f"{name}.h")
    with open(h_path, "w") as f:
        f.write(header(plan, name, source=_source(fn), cpu=c.cpu,
                       features=feats, version=__version__))
    return Library(so_path, h_path, name, plan, c.cpu, feats)


def export(fn, *example_args, path: str = ".", name: str | None = None, threads: int = 1, target: str = "cpu",
           arch: str | None = None, schedule: dict | None = None, deterministic: bool = False,
           dynamic: dict | None = None, max_sizes: dict[str, int] | None = None, **example_kwargs) -> Library:
    """Compile ``fn`` for the example arguments and write ``lib<name>.so`` + ``<name>.h`` into ``path``
    (``name``: the function's name).  ``threads``: the most threads a launch may run on (the
    library's default too; ``<name>_set_num_threads`` lowers it).  ``arch``: the CPU to compile
    for (default the host); the library refuses (``<NAME>_ERR_CPU``) to run on a CPU without its
    features.  ``dynamic={"x": {0: "batch"}, "mask": {0: "batch"}}`` leaves those axes' sizes to
    run time: the C entry points take ``int64_t batch`` after the buffers (the kernels are
    compiled for symbolic sizes already; nothing is padded); ``max_sizes={"batch": 4096}`` bounds
    each (default: the example's size), and the workspace is laid out for the maxima.  Other
    keywords are ``fn``'s."""
    from tessera.frontend.jit import compile as ts_compile
    from tessera.frontend.artifact import Artifact
    decorated = getattr(fn.fn if isinstance(fn, Artifact) else fn, "target", None)
    if decorated not in (None, "cpu"):
        target = decorated           # a function jitted for a GPU lane
    if target != "cpu":
        raise ExportError(f"target={target!r}: export writes CPU libraries (target='cpu'); the GPU lanes' code "
                          "objects are tessera.compile(...).binary() with their launch contracts in .abi()")
    if getattr(fn, "dynamic", None):
        raise ExportError(f"{getattr(fn, 'name', fn)} has jit(dynamic=...) buckets (padded and masked calls); an "
                          "exported library takes its dynamic sizes as C arguments instead: export the function "
                          "without jit's dynamic= and pass tessera.export(..., dynamic=...)")
    art = ts_compile(fn, *example_args, target="cpu", arch=arch, schedule=schedule, deterministic=deterministic,
                     **example_kwargs)
    return export_artifact(art, path, name, threads, dynamic, max_sizes)


aot = export

__all__ = ["export", "aot", "export_artifact", "Library", "LoadedLibrary"]
