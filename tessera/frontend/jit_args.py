"""How ``tessera.jit`` reads its arguments: Python numbers as runtime scalars (their keys and
dtypes), which positions are static (``static_argnums`` / ``static_argnames``), a call's
specialisation pattern, and the settings text of a report."""
from __future__ import annotations

import numpy as np

from tessera.errors import ArgumentError
from tessera.frontend.trace import SCALAR

_FINITE_MAX: dict[np.dtype, float] = {}   # dtype -> its largest finite value


def _scalar_key(a) -> tuple:
    """A static argument by type and value, a float by its bits: -0.0 == 0.0, but the compiled
    kernel bakes a static value in."""
    return (type(a).__name__, a.hex() if isinstance(a, float) else a)


def _is_number(a) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def _finite_max(dtype: np.dtype) -> float:
    m = _FINITE_MAX.get(dtype)
    if m is None:
        import ml_dtypes
        m = _FINITE_MAX[dtype] = float(ml_dtypes.finfo(dtype).max)
    return m


def to_scalar(a, dtype: np.dtype, i: int = 0) -> np.ndarray:
    """A Python number as the 0-d array a kernel reads, converted as numpy converts it (NEP 50: the
    number takes the array's dtype, and one beyond its range is +-inf, as ``x * 1e39`` is in f32)."""
    if dtype.kind in "iub":   # an int dtype (learned from the arrays a Python int met)
        if isinstance(a, float) and not a.is_integer() or dtype.kind == "b":
            raise ArgumentError(f"argument {i}: {a!r} cannot be passed as {dtype} (an int compiled for int "
                                "arrays); pass an int, or mark the argument static")
        info = np.iinfo(dtype)
        if not info.min <= a <= info.max:
            raise ArgumentError(f"argument {i}: the integer {a} is beyond the range of {dtype} (numpy raises "
                                "OverflowError too)")
        return np.asarray(int(a), dtype)
    try:
        m = _FINITE_MAX.get(dtype) or _finite_max(dtype)
        if -m <= a <= m:
            return np.asarray(a, dtype)
        with np.errstate(over="ignore"):
            return np.asarray(a, dtype)
    except OverflowError:
        raise ArgumentError(f"argument {i}: the integer {a} is beyond the range of {dtype} (numpy raises "
                            "OverflowError too)") from None


def _int_scalars(args, kinds) -> frozenset:
    """The positions of Python-int runtime scalars (a weak int and a weak float trace alike unless
    one meets an int or bool value: then the variant records which were ints, Variant.ints)."""
    return frozenset(i for i, (a, k) in enumerate(zip(args, kinds)) if k == SCALAR and isinstance(a, int))


def _pattern(kinds, arrays, ints=frozenset()) -> tuple:
    """Argument kinds, array dtypes and which numbers are ints: what the runtime scalars' dtype is
    learned for."""
    return (tuple(kinds), tuple(a.dtype for a in arrays), tuple(sorted(ints)))


def _as_tuple(v) -> tuple:
    return (v,) if isinstance(v, (int, str)) else tuple(v or ())


def _call_params(fn) -> list | None:
    """``fn``'s parameters in order, or None where keywords cannot be mapped to positions (no
    signature, ``*args`` or ``**kwargs``)."""
    import inspect
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return params


def _static_positions(fn, nums: tuple, names: tuple) -> frozenset:
    """The argument positions ``static_argnums`` and ``static_argnames`` name (a keyword-only
    parameter's position is its place in the signature)."""
    import inspect
    out = set()
    plain = _call_params(fn)
    try:
        params = [p.name for p in plain] if plain is not None else \
            [p.name for p in inspect.signature(fn).parameters.values()
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    for n in nums:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ArgumentError(f"static_argnums: {n!r} is not an argument position (an integer >= 0)")
        out.add(n)
    for name in names:
        if name not in params:
            raise ArgumentError(f"static_argnames: {getattr(fn, '__name__', 'fn')} has no parameter "
                                f"{name!r} (parameters: {', '.join(params) or 'none'})")
        out.add(params.index(name))
    return frozenset(out)


def _donate_positions(nums) -> tuple[int, ...]:
    """``donate_argnums`` checked: argument positions (integers >= 0)."""
    out = _as_tuple(nums)
    for n in out:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ArgumentError(f"donate_argnums: {n!r} is not an argument position (an integer >= 0)")
    return tuple(sorted(set(out)))


def _donated_indices(name: str, donated: tuple, kinds) -> dict[int, int]:
    """Donated argument positions -> their index among the kernel's arrays (a Python number is a
    fresh 0-d array: nothing of the caller's to reuse; a static argument is refused)."""
    from tessera.frontend.trace import ARRAY, STATIC
    index = {i: n for n, i in enumerate(i for i, k in enumerate(kinds) if k != STATIC)}
    out = {}
    for p in donated:
        if p >= len(kinds):
            raise ArgumentError(f"{name}: donate_argnums names argument {p}; the call passes {len(kinds)}")
        if kinds[p] == STATIC:
            raise ArgumentError(f"{name}: argument {p} is donated but static (compiled in): only arrays can be "
                                "donated")
        if kinds[p] == ARRAY:
            out[p] = index[p]
    return out


def _with_deterministic(schedule: dict | None, deterministic: bool) -> dict | None:
    """``deterministic=True`` is the schedule pin of that name (docs/numerics.md)."""
    return {**(schedule or {}), "deterministic": True} if deterministic else schedule


def _settings(d: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items() if v) or "no settings"


def _dynamic_hint(causes) -> str:
    """Sizes compiled in: the dynamic= way out (frontend/dynamic.py)."""
    if not any(c.startswith("sizes ") for c in causes):
        return ""
    return ("; a size compiled in compiles once per size: mark a dimension that varies from call to call dynamic, "
            "tessera.jit(dynamic={'x': 1}), to compile once per power-of-two bucket")
