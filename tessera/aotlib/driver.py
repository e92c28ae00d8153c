"""LLVM IR of an exported library's C entry points: the launch plan (``plan.py``) as native code.

For a library ``name`` (every symbol below is exported; nothing else is):

* ``int name(<inputs>, <outputs>, <sizes>)``: allocates the workspace arena with ``malloc``, runs,
  frees; ``<sizes>`` are the dynamic sizes (``int64_t``, each 1..its maximum, else
  ``ERR_SIZE``), none for a library exported with every size fixed;
* ``int name_run(<inputs>, <outputs>, <sizes>, void *workspace)``: the same in the caller's arena
  of at least ``name_workspace_size()`` bytes (any alignment: it is aligned here; laid out for
  the maximum sizes);
* ``int name_strided(<inputs>, <outputs>, <sizes>, const int64_t *strides)``: the same for
  buffers with strides in elements (``strided.py``: contiguous ones used in place, others copied
  once);
* ``size_t name_workspace_size(void)``, ``int name_check_cpu(void)``,
  ``int name_set_num_threads(int)`` / ``int name_get_num_threads(void)``,
  ``const char *name_strerror(int)``.

Each launch zeroes its team buffer's header, fills ``<kernel>.entry``'s argument words and
calls it.  A launch with enough work (the rule the Python runtime applies) runs on
``name_get_num_threads()`` threads: the calling thread as tid 0 and threads started with
``pthread_create`` for that launch and joined at its end (no persistent pool).  Started threads
wait on a gate word; if a ``pthread_create`` fails, the launch runs on the threads that did
start (the thread-count word is set before the gate opens), so a failure never deadlocks a
barrier and never changes results (every kernel gives the same bits for every thread count:
docs/numerics.md).  Nothing calls back into Python: the only external symbols are libc's
(``malloc``, ``free``, ``memcpy``, ``memset``, ``pthread_create``, ``pthread_join``,
``sched_yield``) and those the kernels' object needs (checked at link time).
"""
from __future__ import annotations

from tessera.aotlib import cpufeat, strided
from tessera.aotlib.plan import Buffer, Plan

# the C error codes (the header defines them as <NAME>_OK, <NAME>_ERR_...)
OK, ERR_CPU, ERR_NOMEM, ERR_NULL, ERR_THREADS, ERR_SIZE, ERR_STRIDE = 0, 1, 2, 3, 4, 5, 6
MESSAGES = {OK: "success",
            ERR_CPU: "this CPU lacks a feature the library was compiled for (see <NAME>_CPU_FEATURES)",
            ERR_NOMEM: "the workspace could not be allocated",
            ERR_NULL: "a buffer pointer is NULL",
            ERR_THREADS: "the thread count must be between 1 and <NAME>_MAX_THREADS",
            ERR_SIZE: "a dynamic size is below 1 or above its maximum (<NAME>_MAX_<SIZE>)",
            ERR_STRIDE: "an output's strides put two of its elements in one place (a zero stride on an axis longer "
                        "than 1)"}
ENTRY_SUFFIX = ".entry"


def _q(sym: str) -> str:
    return '@"' + sym + '"'


def _launch_helper(max_threads: int) -> str:
    """``tsr_launch(entry, words, nthreads_at, n, team)`` and the started threads' ``tsr_thread``."""
    return f"""
%tsr.ctx = type {{ ptr, ptr, i64, ptr }}
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_join(i64, ptr)
declare i32 @sched_yield()
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare ptr @malloc(i64)
declare void @free(ptr)

define internal ptr @tsr_thread(ptr %c) nounwind {{
entry:
  %gp = getelementptr %tsr.ctx, ptr %c, i32 0, i32 3
  %gate = load ptr, ptr %gp
  br label %wait
wait:
  %g = load atomic i64, ptr %gate acquire, align 8
  %shut = icmp eq i64 %g, 0
  br i1 %shut, label %spin, label %go
spin:
  %y = call i32 @sched_yield()
  br label %wait
go:
  %fp = getelementptr %tsr.ctx, ptr %c, i32 0, i32 0
  %f = load ptr, ptr %fp
  %wp = getelementptr %tsr.ctx, ptr %c, i32 0, i32 1
  %w = load ptr, ptr %wp
  %tp = getelementptr %tsr.ctx, ptr %c, i32 0, i32 2
  %t = load i64, ptr %tp
  call void %f(ptr %w, i64 %t)
  ret ptr null
}}

define internal void @tsr_launch(ptr %kfn, ptr %words, i64 %at, i64 %n, ptr %team) nounwind {{
entry:
  call void @llvm.memset.p0.i64(ptr align 64 %team, i8 0, i64 192, i1 false)
  %ntp = getelementptr i64, ptr %words, i64 %at
  %multi = icmp sgt i64 %n, 1
  br i1 %multi, label %spawn, label %single
single:
  store i64 1, ptr %ntp
  call void %kfn(ptr %words, i64 0)
  ret void
spawn:
  %ctx = alloca [{max_threads} x %tsr.ctx], align 16
  %tids = alloca [{max_threads} x i64], align 16
  %gate = alloca i64, align 64
  store atomic i64 0, ptr %gate release, align 8
  br label %create
create:
  %k = phi i64 [ 1, %spawn ], [ %k1, %created ]
  %more = icmp slt i64 %k, %n
  br i1 %more, label %one, label %open
one:
  %c = getelementptr [{max_threads} x %tsr.ctx], ptr %ctx, i64 0, i64 %k
  %c0 = getelementptr %tsr.ctx, ptr %c, i32 0, i32 0
  store ptr %kfn, ptr %c0
  %c1 = getelementptr %tsr.ctx, ptr %c, i32 0, i32 1
  store ptr %words, ptr %c1
  %c2 = getelementptr %tsr.ctx, ptr %c, i32 0, i32 2
  store i64 %k, ptr %c2
  %c3 = getelementptr %tsr.ctx, ptr %c, i32 0, i32 3
  store ptr %gate, ptr %c3
  %tp = getelementptr [{max_threads} x i64], ptr %tids, i64 0, i64 %k
  %rc = call i32 @pthread_create(ptr %tp, ptr null, ptr @tsr_thread, ptr %c)
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %open, label %created
created:
  %k1 = add i64 %k, 1
  br label %create
open:
  %started = phi i64 [ %k, %create ], [ %k, %one ]
  store i64 %started, ptr %ntp
  store atomic i64 1, ptr %gate release, align 8
  call void %kfn(ptr %words, i64 0)
  br label %join
join:
  %j = phi i64 [ 1, %open ], [ %j1, %joined ]
  %jmore = icmp slt i64 %j, %started
  br i1 %jmore, label %joinone, label %done
joinone:
  %jp = getelementptr [{max_threads} x i64], ptr %tids, i64 0, i64 %j
  %th = load i64, ptr %jp
  %jr = call i32 @pthread_join(i64 %th, ptr null)
  br label %joined
joined:
  %j1 = add i64 %j, 1
  br label %join
done:
  ret void
}}
"""


def _ptr_list(n: int, prefix: str) -> list[str]:
    return [f"%{prefix}{i}" for i in range(n)]


def library_ir(plan: Plan, name: str, triple: str, cpu_features: list[str]) -> str:
    """The driver module for ``plan`` (its kernels are declared; their object is linked beside it)."""
    T = plan.max_threads
    ins, outs = _ptr_list(len(plan.inputs), "in"), _ptr_list(len(plan.outputs), "out")
    szs = [f"%sz_{nm}" for nm, _ in plan.sizes]
    params = ", ".join([f"ptr {p}" for p in ins + outs] + [f"i64 {z}" for z in szs])
    kernels = sorted({ln.kernel for ln in plan.launches})
    nwords = max([len(ln.buffers) + len(ln.sizes) + 2 + T for ln in plan.launches] + [1])
    arena = plan.arena_bytes()
    out = [f'target triple = "{triple}"', ""]
    out += [f"declare void {_q(k + ENTRY_SUFFIX)}(ptr, i64)" for k in kernels]
    out.append(_launch_helper(T))
    out.append(cpufeat.check_ir(f"{name}_check_cpu", cpu_features, ERR_CPU))
    out.append(f"@{name}.threads = internal global i64 {T}")
    out.append(f"""
define i64 @{name}_workspace_size() nounwind {{
  ret i64 {arena}
}}

define i32 @{name}_get_num_threads() nounwind {{
  %t = load atomic i64, ptr @{name}.threads monotonic, align 8
  %r = trunc i64 %t to i32
  ret i32 %r
}}

define i32 @{name}_set_num_threads(i32 %n) nounwind {{
  %low = icmp slt i32 %n, 1
  %high = icmp sgt i32 %n, {T}
  %bad = or i1 %low, %high
  br i1 %bad, label %no, label %yes
no:
  ret i32 {ERR_THREADS}
yes:
  %w = sext i32 %n to i64
  store atomic i64 %w, ptr @{name}.threads monotonic, align 8
  ret i32 0
}}
""")
    # strerror
    strs = []
    for code, msg in MESSAGES.items():
        text = msg.replace("<NAME>", name.upper()).encode() + b"\0"
        esc = "".join(chr(c) if 32 <= c < 127 and c not in (34, 92) else f"\\{c:02X}" for c in text)
        strs.append(f'@{name}.msg{code} = private unnamed_addr constant [{len(text)} x i8] c"{esc}"')
    unknown = b"unknown error code\0"
    strs.append(f'@{name}.msgx = private unnamed_addr constant [{len(unknown)} x i8] c"unknown error code\\00"')
    out += strs
    cases = " ".join(f"i32 {c}, label %m{c}" for c in MESSAGES)
    body = [f"define ptr @{name}_strerror(i32 %code) nounwind {{", "entry:",
            f"  switch i32 %code, label %mx [ {cases} ]"]
    for c in MESSAGES:
        body += [f"m{c}:", f"  ret ptr @{name}.msg{c}"]
    body += ["mx:", f"  ret ptr @{name}.msgx", "}"]
    out.append("\n".join(body))
    out.append(_run_fn(plan, name, params, ins, outs, nwords))
    args = ", ".join([f"ptr {p}" for p in ins + outs] + [f"i64 {z}" for z in szs])
    out.append(f"""
define i32 @{name}({params}) nounwind {{
entry:
  %ok = call i32 @{name}_check_cpu()
  %bad = icmp ne i32 %ok, 0
  br i1 %bad, label %fail, label %alloc
fail:
  ret i32 %ok
alloc:
  %ws = call ptr @malloc(i64 {arena})
  %none = icmp eq ptr %ws, null
  br i1 %none, label %nomem, label %run
nomem:
  ret i32 {ERR_NOMEM}
run:
  %r = call i32 @{name}_run({args}, ptr %ws)
  call void @free(ptr %ws)
  ret i32 %r
}}
""")
    out += [strided.copy_helper(e) for e in strided.element_sizes(plan)]
    out.append(strided.strided_fn(plan, name, ERR_STRIDE, ERR_NOMEM))
    return "\n".join(out) + "\n"


def _run_fn(plan: Plan, name: str, params: str, ins: list[str], outs: list[str], nwords: int) -> str:
    T = plan.max_threads
    b = [f"define i32 @{name}_run({params}, ptr %ws) nounwind {{", "entry:",
         f"  %ok = call i32 @{name}_check_cpu()",
         "  %cpubad = icmp ne i32 %ok, 0",
         "  br i1 %cpubad, label %fail, label %checknull",
         "fail:", "  ret i32 %ok",
         "null:", f"  ret i32 {ERR_NULL}",
         "checknull:"]
    nulls = []
    for i, p in enumerate(ins + outs + ["%ws"]):
        b.append(f"  %isnull{i} = icmp eq ptr {p}, null")
        nulls.append(f"%isnull{i}")
    acc = nulls[0]
    for i, v in enumerate(nulls[1:]):
        b.append(f"  %anynull{i} = or i1 {acc}, {v}")
        acc = f"%anynull{i}"
    b += [f"  br i1 {acc}, label %null, label %sizes", "sizes:"]
    for k, (nm, top) in enumerate(plan.sizes):   # each dynamic size in 1..its maximum (unsigned compare)
        b += [f"  %szm{k} = sub i64 %sz_{nm}, 1",
              f"  %szok{k} = icmp ult i64 %szm{k}, {top}",
              f"  br i1 %szok{k}, label %size{k}, label %badsize", f"size{k}:"]
    b += ["  br label %go", "badsize:", f"  ret i32 {ERR_SIZE}", "go:",
          "  %wsi = ptrtoint ptr %ws to i64",
          "  %wsa = add i64 %wsi, 63",
          "  %base = and i64 %wsa, -64",
          "  %team = inttoptr i64 %base to ptr",
          f"  %words = alloca [{nwords} x i64], align 16",
          f"  %tset = load atomic i64, ptr @{name}.threads monotonic, align 8"]
    addr = {}
    for i, p in enumerate(ins):
        b.append(f"  %ia{i} = ptrtoint ptr {p} to i64")
        addr[Buffer("in", i)] = f"%ia{i}"
    for i, p in enumerate(outs):
        b.append(f"  %oa{i} = ptrtoint ptr {p} to i64")
        addr[Buffer("out", i)] = f"%oa{i}"
    data0 = plan.data_offset()
    n = 0

    def arena(off: int) -> str:
        nonlocal n
        n += 1
        b.append(f"  %aa{n} = add i64 %base, {off}")
        return f"%aa{n}"

    def size(v) -> str:
        """An operand for a size word: a constant, or coef times the dynamic sizes (run time)."""
        if isinstance(v, int):
            return str(v)
        nonlocal n
        coef, names = v
        cur = str(coef)
        for nm in names:
            n += 1
            b.append(f"  %sw{n} = mul i64 {cur}, %sz_{nm}")
            cur = f"%sw{n}"
        return cur

    ws_words = [arena(plan.team_bytes + t * plan.ws_bytes) for t in range(T)]
    for li, ln in enumerate(plan.launches):
        vals = []
        for buf in ln.buffers:
            vals.append(addr[buf] if buf.kind != "arena" else arena(data0 + buf.index))
        vals += [size(s) for s in ln.sizes]
        at = len(vals)
        vals += ["1", "%base"] + ws_words
        for wi, v in enumerate(vals):
            b.append(f"  %wp{li}_{wi} = getelementptr [{nwords} x i64], ptr %words, i64 0, i64 {wi}")
            b.append(f"  store i64 {v}, ptr %wp{li}_{wi}")
        nt = "%tset" if ln.threaded and T > 1 else "1"
        b.append(f"  call void @tsr_launch(ptr {_q(ln.kernel + ENTRY_SUFFIX)}, ptr %words, i64 {at}, i64 {nt}, "
                 "ptr %team)")
    for ci, (dst, src, nbytes) in enumerate(plan.copies):
        s = addr[src] if src.kind != "arena" else arena(data0 + src.index)
        b += [f"  %cd{ci} = inttoptr i64 {addr[dst]} to ptr", f"  %cs{ci} = inttoptr i64 {s} to ptr",
              f"  call void @llvm.memcpy.p0.p0.i64(ptr %cd{ci}, ptr %cs{ci}, i64 {size(nbytes)}, i1 false)"]
    b += ["  ret i32 0", "}"]
    return "\n".join(b)
