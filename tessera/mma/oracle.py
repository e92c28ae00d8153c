"""The selector's oracle: LLVM itself (and ptxas) judge every record.

For every (arch, record) the tables declare legal on NVPTX, AMDGPU or x86, a minimal LLVM
function calling the record's intrinsic is compiled by llvmlite's LLVM for that CPU name —
in a subprocess, because LLVM aborts the process on an illegal intrinsic — and its
assembly must contain the record's mnemonic.  PTX is also assembled by ``ptxas`` for its sm.
wgmma has no LLVM intrinsic: its PTX is written directly and assembled by ``ptxas -arch=sm_90a``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from tessera import toolchain
from tessera.mma import nvidia, rocm
from tessera.mma import x86 as X
from tessera.mma.records import MmaRecord

TRIPLES = {"nvidia": "nvptx64-nvidia-cuda", "rocm": "amdgcn-amd-amdhsa", "x86": "x86_64-unknown-linux-gnu"}
X86_ORACLE_ARCHS = ("avx2", "avx512", "avx512_bf16", "avx512_vnni", "amx", "znver4", "sapphirerapids", "haswell")


@dataclass(frozen=True)
class Case:
    record: str
    target: str
    arch: str
    cpu: str
    features: str


def llvm_ir(rec: MmaRecord, target: str) -> str:
    args = list(rec.llvm_args)
    imms = [f"{rec.llvm_imm_type} {v}" for v in rec.llvm_imms]
    params = ", ".join(f"{a} %a{i}" for i, a in enumerate(args))
    call = ", ".join([f"{a} %a{i}" for i, a in enumerate(args)] + imms)
    decl = ", ".join(args + [rec.llvm_imm_type] * len(rec.llvm_imms))
    as1 = " addrspace(1)" if target == "rocm" else ""
    cc = "amdgpu_kernel " if target == "rocm" else ""
    ret = rec.llvm_ret
    body = (f"  %r = call {ret} @{rec.intrinsic}({call})\n  store {ret} %r, ptr{as1} %out\n" if ret != "void"
            else f"  call void @{rec.intrinsic}({call})\n")
    sep = ", " if params else ""
    return (f'target triple = "{TRIPLES[target]}"\ndeclare {ret} @{rec.intrinsic}({decl})\n'
            f"define {cc}void @k({params}{sep}ptr{as1} %out) {{\n{body}  ret void\n}}\n")


def _cases() -> list[tuple[Case, MmaRecord]]:
    out = []
    for r in nvidia.RECORDS_MMA + rocm.RECORDS:
        for arch in sorted(r.archs):
            feats = r.llvm_features
            if r.target == "nvidia":
                ptx = nvidia.ptx_version(arch, r)
                feats = f"+ptx{ptx[0]}{ptx[1]}"
            out.append((Case(r.id, r.target, arch, arch, feats), r))
    for arch in X86_ORACLE_ARCHS:
        name, cpu, feats = X.resolve(arch)
        for r in X.RECORDS:
            if set(r.features) <= feats:
                out.append((Case(r.id, "x86", arch, cpu, X.llvm_feature_string(feats)), r))
    return out


# The child compiles cases one by one and prints one JSON line per case before and after, so a
# crash is pinned on the case that caused it.
_CHILD = r'''
import json, sys
import llvmlite.binding as llvm
llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()
for line in sys.stdin:
    c = json.loads(line)
    print(json.dumps({"start": c["key"]}), flush=True)
    try:
        m = llvm.parse_assembly(c["ir"]); m.verify()
        tm = llvm.Target.from_triple(c["triple"]).create_target_machine(cpu=c["cpu"], features=c["features"])
        asm = tm.emit_assembly(m)
        print(json.dumps({"done": c["key"], "ok": True, "asm": asm}), flush=True)
    except Exception as e:
        print(json.dumps({"done": c["key"], "ok": False, "error": str(e).strip().splitlines()[-1]}), flush=True)
'''


def compile_cases(items: list[dict], timeout: float = 600) -> dict[str, dict]:
    """Compile {key, ir, triple, cpu, features} items in a child; a crash marks that item aborted."""
    results: dict[str, dict] = {}
    pending = list(items)
    while pending:
        p = subprocess.run([sys.executable, "-c", _CHILD], input="\n".join(json.dumps(i) for i in pending) + "\n",
                           capture_output=True, text=True, timeout=timeout)
        started = None
        for line in p.stdout.splitlines():
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
            else:
                results[msg["done"]] = msg
                started = None
        if started is not None:  # the child died on this one
            tail = (p.stderr.strip().splitlines() or [f"signal {-p.returncode}"])[-1]
            results[started] = {"done": started, "ok": False, "aborted": True, "returncode": p.returncode,
                                "error": tail}
        pending = [i for i in pending if i["key"] not in results]
        if p.returncode == 0 and pending:
            break
    return results


def ptxas_path() -> str | None:
    return toolchain.find_ptxas()


def ptxas(ptx: str, arch: str) -> tuple[bool, str]:
    exe = ptxas_path()
    if exe is None:
        return False, "ptxas not found"
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        p = subprocess.run([exe, f"-arch={arch}", src, "-o", os.path.join(d, "k.cubin")], capture_output=True,
                           text=True, timeout=120)
        return p.returncode == 0, (p.stderr.strip().splitlines() or [""])[-1]


def wgmma_ptx(rec: MmaRecord) -> str:
    """A minimal sm_90a kernel issuing one wgmma of this record (descriptors zero, scale-d true)."""
    m, n, k = rec.shape
    nd = n // 2  # f32 accumulator registers per thread: 64*n / 128
    regs = ", ".join(f"%f{i}" for i in range(nd))
    ptxt = rec.mnemonic.split(".")[-1]
    tail = "1, 1, 1, 0, 0" if k == 16 else "1, 1, 1"
    return f""".version 8.0
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 out)
{{
  .reg .f32 %f<{nd}>;
  .reg .b64 %d<2>;
  .reg .u64 %p;
  mov.b64 %d0, 0;
  mov.b64 %d1, 0;
  wgmma.fence.sync.aligned;
  wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptxt}.{ptxt} {{{regs}}}, %d0, %d1, {tail};
  wgmma.commit_group.sync.aligned;
  wgmma.wait_group.sync.aligned 0;
  ld.param.u64 %p, [out];
  st.global.f32 [%p], %f0;
  ret;
}}
"""


def run_legal() -> list[dict]:
    """Compile every legal (arch, record); one row per case with ok / mnemonic_found / ptxas."""
    import re
    cases = _cases()
    items = [{"key": f"{c.record}@{c.arch}", "ir": llvm_ir(r, c.target), "triple": TRIPLES[c.target], "cpu": c.cpu,
              "features": c.features} for c, r in cases]
    res = compile_cases(items)
    rows = []
    for (c, r), item in zip(cases, items):
        out = res.get(item["key"], {"ok": False, "error": "missing"})
        row = {"record": c.record, "arch": c.arch, "ok": bool(out.get("ok")), "error": out.get("error", "")}
        if row["ok"]:
            row["mnemonic_found"] = bool(re.search(r.asm_regex, out["asm"]))
            if c.target == "nvidia" and ptxas_path():
                row["ptxas"], row["ptxas_error"] = ptxas(out["asm"], c.arch)
        rows.append(row)
    for r in nvidia.RECORDS_WGMMA:
        if ptxas_path():
            ok, err = ptxas(wgmma_ptx(r), "sm_90a")
            rows.append({"record": r.id, "arch": "sm_90a", "ok": ok, "mnemonic_found": ok, "ptxas": ok,
                         "ptxas_error": err, "error": ""})
    return rows


def run_illegal(pairs: list[tuple[MmaRecord, str, str]]) -> dict[str, dict]:
    """Compile records on archs where they are illegal: LLVM must refuse (usually by aborting)."""
    items = []
    for rec, target, arch in pairs:
        if target == "x86":
            _, cpu, feats = X.resolve(arch)
            features = X.llvm_feature_string(feats)
        elif target == "nvidia":
            cpu, features = arch, "+ptx{}{}".format(*nvidia.ptx_version(arch, rec))
        else:
            cpu, features = arch, rec.llvm_features
        items.append({"key": f"{rec.id}@{arch}", "ir": llvm_ir(rec, target), "triple": TRIPLES[target], "cpu": cpu,
                      "features": features})
    return compile_cases(items)
