"""``tessera.profile``: where a compiled CPU call spends its time, per kernel and per kernel
family (GEMM, row kernels, elementwise, attention, ...), measured by timing every launch of a
few calls (``runtime.cpu.STEP_TIMES``) after a warm-up call."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tessera.errors import ArgumentError

# kernel kind -> the family a report groups it in
FAMILY = {"gemm": "gemm", "attention": "attention", "attention_bwd": "attention", "rowwise": "row", "rowreduce": "row", "reduce": "row", "elementwise": "elementwise",
          "transpose": "copy", "concat": "copy"}


@dataclass
class Profile:
    name: str
    kernels: list[dict] = field(default_factory=list)   # kernel, kind, family, median seconds per call
    call_s: float = 0.0                                   # median seconds of a whole call

    @property
    def families(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.kernels:
            out[k["family"]] = out.get(k["family"], 0.0) + k["seconds"]
        return out

    def __str__(self) -> str:
        lines = [f"tessera profile: {self.name} ({self.call_s * 1e3:.3f} ms per call)"]
        for fam, sec in sorted(self.families.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {fam:12s} {sec * 1e3:9.3f} ms  {sec / max(self.call_s, 1e-12):6.1%}")
        for k in self.kernels:
            lines.append(f"    {k['kernel']:18s} {k['kind']:12s} {k['seconds'] * 1e3:9.3f} ms")
        return "\n".join(lines)


def profile(fn, *args, rounds: int = 5, **kwargs) -> Profile:
    """Time ``fn(*args, **kwargs)`` (a ``tessera.jit`` function on the CPU lane) ``rounds`` times
    after one warm-up call; every kernel launch is timed."""
    import time

    from tessera.frontend.jit import JitFunction
    from tessera.runtime import cpu
    if not isinstance(fn, JitFunction):
        raise ArgumentError("tessera.profile takes a tessera.jit function")
    if fn.target != "cpu":
        raise ArgumentError(f"tessera.profile times the CPU lane; {fn.name} is compiled for {fn.target}")
    rep = fn.explain(*args, **kwargs)
    kinds = {k["kernel"]: k["kind"] for k in rep.kernels}
    fn(*args, **kwargs)
    per: dict[str, list[float]] = {k: [] for k in kinds}
    calls = []
    for _ in range(max(rounds, 1)):
        cpu.STEP_TIMES = []
        try:
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            calls.append(time.perf_counter() - t0)
            seen: dict[str, float] = {}
            for name, sec in cpu.STEP_TIMES:
                seen[name] = seen.get(name, 0.0) + sec
        finally:
            cpu.STEP_TIMES = None
        for name, sec in seen.items():
            per.setdefault(name, []).append(sec)
    kernels = [{"kernel": k, "kind": kinds.get(k, "?"), "family": FAMILY.get(kinds.get(k, ""), "other"),
                "seconds": statistics.median(v)} for k, v in per.items() if v]
    return Profile(fn.name, kernels, statistics.median(calls))


__all__ = ["FAMILY", "Profile", "profile"]
