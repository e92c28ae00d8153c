"""The CPU-feature check an exported library runs before any kernel: CPUID (and XGETBV for the
state the operating system enables), as LLVM IR with no library call.

A library is compiled for an LLVM CPU name and feature string (the host's, or an ``arch=``
table's).  Code for a feature the running CPU lacks dies of SIGILL at its first instruction, so
``<name>_check_cpu()`` compares the features in ``FEATURES`` that the library was compiled for
with CPUID and returns the library's ``CPU`` error code instead (every entry point calls it
first).  The features checked: those of the feature string in the table below, plus the ones an
x86-64 micro-architecture level implies (``x86-64-v3`` implies AVX2, FMA, BMI2, ...; a CPU
name with AVX2 or AVX-512 in its table is taken at that level).  Features outside the table
(``clzero``, ``sahf``, ...) are not checked; the header lists exactly what is.
"""
from __future__ import annotations

# name -> (leaf, subleaf, register 0..3 = eax ebx ecx edx, bit)
FEATURES: dict[str, tuple[int, int, int, int]] = {
    "sse3": (1, 0, 2, 0), "pclmul": (1, 0, 2, 1), "ssse3": (1, 0, 2, 9), "fma": (1, 0, 2, 12),
    "cx16": (1, 0, 2, 13), "sse4.1": (1, 0, 2, 19), "sse4.2": (1, 0, 2, 20), "movbe": (1, 0, 2, 22),
    "popcnt": (1, 0, 2, 23), "aes": (1, 0, 2, 25), "xsave": (1, 0, 2, 26), "avx": (1, 0, 2, 28),
    "f16c": (1, 0, 2, 29),
    "cmov": (1, 0, 3, 15), "fxsr": (1, 0, 3, 24), "sse": (1, 0, 3, 25), "sse2": (1, 0, 3, 26),
    "bmi": (7, 0, 1, 3), "avx2": (7, 0, 1, 5), "bmi2": (7, 0, 1, 8), "avx512f": (7, 0, 1, 16),
    "avx512dq": (7, 0, 1, 17), "adx": (7, 0, 1, 19), "avx512ifma": (7, 0, 1, 21), "avx512cd": (7, 0, 1, 28),
    "avx512bw": (7, 0, 1, 30), "avx512vl": (7, 0, 1, 31),
    "avx512vbmi": (7, 0, 2, 1), "avx512vbmi2": (7, 0, 2, 6), "gfni": (7, 0, 2, 8), "vaes": (7, 0, 2, 9),
    "vpclmulqdq": (7, 0, 2, 10), "avx512vnni": (7, 0, 2, 11), "avx512bitalg": (7, 0, 2, 12),
    "avx512vpopcntdq": (7, 0, 2, 14),
    "amx-bf16": (7, 0, 3, 22), "avx512fp16": (7, 0, 3, 23), "amx-tile": (7, 0, 3, 24), "amx-int8": (7, 0, 3, 25),
    "avxvnni": (7, 1, 0, 4), "avx512bf16": (7, 1, 0, 5),
    "lzcnt": (0x80000001, 0, 2, 5), "sse4a": (0x80000001, 0, 2, 6), "xop": (0x80000001, 0, 2, 11),
    "fma4": (0x80000001, 0, 2, 16),
}
# state the OS must enable (XCR0 bits): YMM for AVX, opmask/ZMM for AVX-512, tile data for AMX
XCR0_AVX = 0x6
XCR0_AVX512 = 0xE6
XCR0_AMX = 0x60000

LEVELS = {
    "x86-64": ["cmov", "fxsr", "sse", "sse2"],
    "x86-64-v2": ["cx16", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3"],
    "x86-64-v3": ["avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"],
    "x86-64-v4": ["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
}
_ORDER = ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"]


def _implied(cpu: str, listed: set[str]) -> set[str]:
    top = (cpu if cpu in LEVELS else "x86-64-v4" if "avx512f" in listed else
           "x86-64-v3" if "avx2" in listed else "x86-64")
    out: set[str] = set()
    for level in _ORDER[:_ORDER.index(top) + 1]:
        out.update(LEVELS[level])
    return out


def required(cpu: str, features: str) -> list[str]:
    """The checked features of code compiled for LLVM CPU ``cpu`` and ``features`` (``+a,-b``)."""
    listed = {f[1:] for f in features.split(",") if f.startswith("+")}
    return sorted((listed | _implied(cpu, listed)) & set(FEATURES))


def _xcr0_need(feats: list[str]) -> int:
    need = 0
    for f in feats:
        if f.startswith("amx"):
            need |= XCR0_AMX | XCR0_AVX
        if f.startswith("avx512"):
            need |= XCR0_AVX512
        if f.startswith(("avx", "fma", "f16c", "vaes", "vpclmul", "gfni", "xop")):
            need |= XCR0_AVX
    return need


_CPUID = ('call {{ i32, i32, i32, i32 }} asm sideeffect "cpuid", '
          '"={{ax}},={{bx}},={{cx}},={{dx}},{{ax}},{{cx}},~{{dirflag}},~{{fpsr}},~{{flags}}"(i32 {leaf}, i32 {sub})')


def check_ir(symbol: str, feats: list[str], code: int) -> str:
    """``i32 @symbol()``: 0 when the CPU (and the OS's enabled state) has every one of ``feats``,
    else ``code``; computed once and cached in an internal global."""
    masks: dict[tuple[int, int, int], int] = {}
    for f in feats:
        leaf, sub, reg, bit = FEATURES[f]
        masks[(leaf, sub, reg)] = masks.get((leaf, sub, reg), 0) | (1 << bit)
    xcr0 = _xcr0_need(feats)
    if xcr0:       # XGETBV is only legal where the OS set CR4.OSXSAVE (leaf 1 ecx bit 27)
        masks[(1, 0, 2)] = masks.get((1, 0, 2), 0) | (1 << 27)
    lines = [f"@{symbol}.state = internal global i32 -1",
             f"define i32 @{symbol}() nounwind {{",
             "entry:",
             f"  %cached = load atomic i32, ptr @{symbol}.state monotonic, align 4",
             "  %known = icmp sge i32 %cached, 0",
             "  br i1 %known, label %done, label %probe",
             "done:",
             "  ret i32 %cached",
             "probe:",
             "  " + "%l0 = " + _CPUID.format(leaf=0, sub=0),
             "  %max = extractvalue { i32, i32, i32, i32 } %l0, 0",
             "  " + "%e0 = " + _CPUID.format(leaf=0x80000000, sub=0),
             "  %emax = extractvalue { i32, i32, i32, i32 } %e0, 0"]
    ok = "true"
    n = 0
    for (leaf, sub, reg), mask in sorted(masks.items()):
        n += 1
        top, bound = ("%emax", leaf) if leaf >= 0x80000000 else ("%max", leaf)
        # a leaf above the CPU's maximum reads as zeros: a select, not a branch (the probe is straight-line)
        lines += [f"  %r{n} = " + _CPUID.format(leaf=leaf, sub=sub),
                  f"  %v{n} = extractvalue {{ i32, i32, i32, i32 }} %r{n}, {reg}",
                  f"  %has{n} = icmp uge i32 {top}, {bound}",
                  f"  %w{n} = select i1 %has{n}, i32 %v{n}, i32 0",
                  f"  %m{n} = and i32 %w{n}, {mask}",
                  f"  %ok{n} = icmp eq i32 %m{n}, {mask}",
                  f"  %all{n} = and i1 {ok}, %ok{n}"]
        ok = f"%all{n}"
    if xcr0:
        lines += [f"  br i1 {ok}, label %xcr, label %record",
                  "xcr:",
                  '  %x = call { i32, i32 } asm sideeffect "xgetbv", "={ax},={dx},{cx},~{dirflag},~{fpsr},~{flags}"(i32 0)',
                  "  %xlo = extractvalue { i32, i32 } %x, 0",
                  f"  %xm = and i32 %xlo, {xcr0}",
                  f"  %xok = icmp eq i32 %xm, {xcr0}",
                  "  br label %record",
                  "record:",
                  "  %final = phi i1 [ false, %probe ], [ %xok, %xcr ]"]
        ok = "%final"
    lines += [f"  %res = select i1 {ok}, i32 0, i32 {code}",
              f"  store atomic i32 %res, ptr @{symbol}.state monotonic, align 4",
              "  ret i32 %res",
              "}"]
    return "\n".join(lines) + "\n"
