"""``tessera aot FILE.py:fn --shape 8x16 --shape 16x32 ...``: export a function ahead of time as
``lib<name>.so`` + ``<name>.h`` (tessera/aotlib/)."""
from __future__ import annotations

import ast
import importlib.util
import os
import sys

import numpy as np

from tessera.errors import ArgumentError, ExportError


def add_parser(sub) -> None:
    a = sub.add_parser("aot", help="export a function as lib<name>.so + <name>.h (a C library; no Python at run time)")
    a.add_argument("target", metavar="FILE.py:fn", help="the Python file and the function in it")
    a.add_argument("--shape", action="append", default=[], metavar="DxD",
                   help="an array argument's shape, in argument order (8x16; a scalar array: '')")
    a.add_argument("--dtype", action="append", default=[], metavar="T",
                   help="the arrays' dtype (float32 unless given; once for all, or once per --shape)")
    a.add_argument("--static", action="append", default=[], metavar="K=V",
                   help="a keyword argument passed as a Python value (n_head=8)")
    a.add_argument("--dynamic", action="append", default=[], metavar="ARG:AXIS:SIZE",
                   help="leave an axis' size to run time: an int64_t argument SIZE of the C functions (x:0:rows; ARG "
                        "is the argument's name or index)")
    a.add_argument("--max", action="append", default=[], metavar="SIZE=N",
                   help="the largest value of a dynamic size (default: the --shape's)")
    a.add_argument("--out", default=".", help="the folder to write into (default: here)")
    a.add_argument("--name", default=None, help="the library name (default: the function's)")
    a.add_argument("--threads", type=int, default=1, help="the most threads a launch runs on (default 1)")
    a.add_argument("--arch", default=None, help="the CPU to compile for (default: this host)")
    a.set_defaults(func=main)


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.lower().split("x")) if text.strip() else ()
    except ValueError:
        raise ArgumentError(f"--shape {text!r}: expected sizes joined by x (8x16)") from None


def load_function(spec: str):
    path, sep, fn_name = spec.rpartition(":")
    if not sep or not path or not fn_name:
        raise ArgumentError(f"{spec!r}: expected FILE.py:function")
    if not os.path.isfile(path):
        raise ArgumentError(f"{path}: no such file")
    mspec = importlib.util.spec_from_file_location(f"tessera_aot_{abs(hash(path))}", path)
    mod = importlib.util.module_from_spec(mspec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        mspec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    fn = getattr(mod, fn_name, None)
    if fn is None:
        raise ArgumentError(f"{path} defines no {fn_name!r}")
    return fn


def main(args) -> int:
    from tessera.aotlib import export
    fn = load_function(args.target)
    if not args.shape:
        raise ExportError("give each array argument's shape with --shape (in argument order)")
    dtypes = args.dtype or ["float32"]
    if len(dtypes) not in (1, len(args.shape)):
        raise ArgumentError(f"{len(dtypes)} --dtype for {len(args.shape)} --shape: give one, or one per shape")
    rng = np.random.default_rng(0)   # the values do not matter: the sizes and dtypes are compiled in
    arrays = []
    for i, text in enumerate(args.shape):
        dt = np.dtype(dtypes[0] if len(dtypes) == 1 else dtypes[i])
        arrays.append(rng.standard_normal(_shape(text)).astype(dt))
    kwargs = {}
    for kv in args.static:
        k, sep, v = kv.partition("=")
        if not sep:
            raise ArgumentError(f"--static {kv!r}: expected NAME=VALUE")
        try:
            kwargs[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            kwargs[k] = v
    dynamic: dict = {}
    for text in args.dynamic:
        arg, ax, size = (text.split(":") + ["", ""])[:3]
        if not arg or not size or not ax.lstrip("-").isdigit():
            raise ArgumentError(f"--dynamic {text!r}: expected ARG:AXIS:SIZE (x:0:rows)")
        dynamic.setdefault(int(arg) if arg.isdigit() else arg, {})[int(ax)] = size
    max_sizes = {}
    for text in args.max:
        k, sep, v = text.partition("=")
        if not sep or not v.isdigit():
            raise ArgumentError(f"--max {text!r}: expected SIZE=N (rows=4096)")
        max_sizes[k] = int(v)
    lib = export(fn, *arrays, path=args.out, name=args.name, threads=args.threads, arch=args.arch,
                 dynamic=dynamic or None, max_sizes=max_sizes or None, **kwargs)
    print(f"wrote {lib.so_path} and {lib.header_path}: {len(lib.plan.launches)} launch(es), CPU {lib.cpu}, "
          f"workspace {lib.plan.arena_bytes()} bytes")
    return 0
