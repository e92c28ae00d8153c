"""The lane report: what the compiler did and which lane ran (``tessera.explain``)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class LaneReport:
    function: str
    lane: str
    target: str
    arch: str
    cpu: str
    features: list[str]
    layers: list[str]
    passes: list[dict]
    kernels: list[dict]
    compile_ms: dict
    cache: str
    pipeline: str
    copies: list[str] = field(default_factory=list)
    specialised: list[str] = field(default_factory=list)
    reason: str = ""
    compiles: list[str] = field(default_factory=list)   # the function's compiles so far, each with its cause
    notes: list[str] = field(default_factory=list)      # what a call changes from the schedule (a thread cap)
    schedule: str = ""   # where the schedule's pins came from: tuning database, cost model, caller (frontend/tune.py)
    saved: list[str] = field(default_factory=list)   # a gradient's forward values kept for the backward (remat.py)
    saved_bytes: int = 0
    donated: list[str] = field(default_factory=list)   # per donated argument: honoured or refused, and why

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @property
    def fusion_groups(self) -> list[dict]:
        return [{"kernel": k["kernel"], "kind": k["kind"], "ops": k["ops"]} for k in self.kernels]

    def __str__(self) -> str:
        lines = [f"tessera lane report: {self.function}",
                 f"  lane      {self.lane}" + (f"   ({self.reason})" if self.reason else ""),
                 f"  arch      {self.arch} (LLVM cpu {self.cpu}); features {', '.join(self.features) or '-'}",
                 f"  layers    {' -> '.join(self.layers)}",
                 f"  pipeline  {self.pipeline}",
                 f"  cache     {self.cache}; compile ms {self.compile_ms}"]
        if self.copies:
            lines.append(f"  copies    {'; '.join(self.copies)}")
        if self.specialised:
            lines.append(f"  static    {'; '.join(self.specialised)}")
        if self.schedule:
            lines.append(f"  schedule  {self.schedule}")
        for n in self.notes:
            lines.append(f"  note      {n}")
        for s in self.saved:
            lines.append(f"  saved     {s}")
        for s in self.donated:
            lines.append(f"  donated   {s}")
        if len(self.compiles) > 1:
            lines.append(f"  compiles  {len(self.compiles)} for this function; the last: {self.compiles[-1]}")
        if self.passes:
            lines.append("  passes")
            w = max(len(p["pass"]) for p in self.passes)
            for p in self.passes:
                ch = "changed" if p["changed"] else "unchanged"
                lines.append(f"    {p['pass']:<{w}}  {ch:<9}  ops {p['ops_in']:>5} -> {p['ops_out']:<5}"
                             f"  +{','.join(p['produced']) or '-'}  -{','.join(p['consumed']) or '-'}")
        if self.kernels:
            lines.append("  kernels")
            for k in self.kernels:
                mma = k.get("mma")
                sel = (f"{mma['record']} ({mma['mnemonic']}) register tile {'x'.join(map(str, k['register_tile']))}"
                       if mma else f"vector {k['vector']}")
                tiles = ", ".join(f"{a}={b}" for a, b in k["tiles"].items())
                lines.append(f"    {k['kernel']:<18} {k['kind']:<11} tiles [{tiles}] parallel {k['parallel']} "
                             f"threads {k['threads']}; {sel}")
                lines.append(f"      fused: {', '.join(k['ops'])}")
                res = {key: k[key] for key in ("lds_bytes", "vgprs", "sgprs", "agprs", "wavefront_size", "registers",
                                                "smem_bytes", "spill_stores", "spill_loads") if k.get(key) is not None}
                if res:
                    lines.append("      resources: " + ", ".join(f"{a} {b}" for a, b in res.items()))
        return "\n".join(lines)
