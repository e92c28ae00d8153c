"""The CPU lane's worker threads: woken in microseconds, not in a scheduler's time.

A kernel launch on N threads runs thread 0 on the caller and threads 1..N-1 on workers.
Waking a sleeping thread (a futex, then the kernel scheduler, then on a VM a halted vCPU)
measured 100-500 us here — more than a 400^3 GEMM's whole share.  So, as BLAS libraries do,
a worker that finished a job keeps watching for the next one for a short while
(``SPIN_SECONDS``), and only then sleeps on a futex on the generation word (natively, with
a sleep flag a publisher reads to know it must wake it: the way back never needs the GIL,
which a worker sleeping on a Python condition had to take before it could run a job).  The watching and the
jobs themselves run in native code (``tsr_worker``, compiled by LLVM at first use and
entered through ctypes, so the GIL is released): a job is a kernel's ``<kernel>.entry``
address and its argument words, and a worker calls it without returning to Python.  On a
2-vCPU VM every hand-over of the GIL cost 1-4 ms (a 1024^3 GEMM's whole time on two
threads is 5), so no Python runs between a job's publication and its end.  The caller
publishes a job by bumping a generation counter and waits for the workers' done counter
the same way.  Every element is computed by the same instructions whatever the thread
count, so which thread runs what never changes a result.

After ``fork()`` only the forking thread exists in the child: the pool's workers are gone (a
launch would wait for their done count forever) and a lock another thread held stays held.
The child drops the pool (``os.register_at_fork``) and its first launch starts a new one,
reusing the compiled helpers.

The floating-point environment (MXCSR: flush-to-zero, denormals-are-zero, rounding) is per
thread, and a thread inherits its creator's when it starts.  So that it is the same on every
thread of a launch, publishing a job records the caller's MXCSR (``tsr_publish``) and each
worker loads it before it runs the job: a caller that set FTZ/DAZ (``torch.set_flush_denormal``,
a library built with ``-ffast-math``) after the pool started would otherwise get flushed rows
from thread 0 and unflushed ones from the workers, which differ from run to run as rows are
claimed.  Each kernel's entry then sets the mode it runs in (codegen/x86.py: ``add_entry``).
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import numpy as np

from tessera import forksafe
from tessera.ir.target.x86 import MXCSR_DAZ, MXCSR_DEFAULT, MXCSR_FTZ  # noqa: F401  (re-exported)

SPIN_SECONDS = 0.002          # how long an idle worker keeps polling before it sleeps
_GEN, _DONE = 0, 8            # int64 slots (64 bytes apart: separate cache lines)

_SPIN = r"""
define i64 @{name}(ptr %p, i64 %ref, i64 %limit) nounwind {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%n, %body]
  %v = load atomic i64, ptr %p acquire, align 8
  %wait = icmp {keep_waiting} i64 %v, %ref
  %more = icmp slt i64 %i, %limit
  %go = and i1 %wait, %more
  br i1 %go, label %body, label %exit
body:
  call void @llvm.x86.sse2.pause()
  %n = add i64 %i, 1
  br label %loop
exit:
  ret i64 %v
}}
"""
# spin while *p == ref (a new generation) / while *p < ref (workers still running), at most limit pauses
_IR = ("declare void @llvm.x86.sse2.pause()\n" + _SPIN.format(name="tsr_spin_changed", keep_waiting="eq")
       + _SPIN.format(name="tsr_spin_reached", keep_waiting="slt") + r"""
; a worker's wait for the next generation: tsr_spin_changed that also bumps its heartbeat word
; every pause, so a caller can tell a worker that is on a core now from one the OS has parked
define i64 @tsr_spin_beat(ptr %p, i64 %ref, i64 %limit, ptr %beat) nounwind {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%n, %body]
  %v = load atomic i64, ptr %p acquire, align 8
  %wait = icmp eq i64 %v, %ref
  %more = icmp slt i64 %i, %limit
  %go = and i1 %wait, %more
  br i1 %go, label %body, label %exit
body:
  %b = load atomic i64, ptr %beat monotonic, align 8
  %b1 = add i64 %b, 1
  store atomic i64 %b1, ptr %beat monotonic, align 8
  call void @llvm.x86.sse2.pause()
  %n = add i64 %i, 1
  br label %loop
exit:
  ret i64 %v
}

define i64 @tsr_add(ptr %p, i64 %d) nounwind {
  %old = atomicrmw add ptr %p, i64 %d acq_rel
  ret i64 %old
}

declare void @llvm.x86.sse.stmxcsr(ptr)
declare void @llvm.x86.sse.ldmxcsr(ptr)

; publish a job: the caller's MXCSR into slot 19, then the next generation (release)
define void @tsr_publish(ptr %ctl) nounwind {
  %m = getelementptr i64, ptr %ctl, i64 19
  store i64 0, ptr %m
  call void @llvm.x86.sse.stmxcsr(ptr %m)
  %old = atomicrmw add ptr %ctl, i64 1 acq_rel
  ret void
}

define i64 @tsr_get_mxcsr() nounwind {
  %p = alloca i32
  call void @llvm.x86.sse.stmxcsr(ptr %p)
  %v = load i32, ptr %p
  %w = zext i32 %v to i64
  ret i64 %w
}

define void @tsr_set_mxcsr(i64 %v) nounwind {
  %p = alloca i32
  %t = trunc i64 %v to i32
  store i32 %t, ptr %p
  call void @llvm.x86.sse.ldmxcsr(ptr %p)
  ret void
}

declare i64 @syscall(i64, ...)

; wake every worker asleep on the generation word (futex, FUTEX_WAKE_PRIVATE)
define void @tsr_wake(ptr %ctl) nounwind {
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %ctl, i64 129, i64 2147483647, ptr null, ptr null, i64 0)
  ret void
}

; run published jobs; after ``limit`` pauses without one, sleep on the generation word (a futex:
; no Python, no GIL on the way back) with its sleep flag set, until a publisher wakes it
define i64 @tsr_worker(ptr %ctl, i64 %tid, i64 %seen0, i64 %limit) {
entry:
  %donep = getelementptr i64, ptr %ctl, i64 8
  %fnp = getelementptr i64, ptr %ctl, i64 16
  %argp = getelementptr i64, ptr %ctl, i64 17
  %np = getelementptr i64, ptr %ctl, i64 18
  %mxp = getelementptr i64, ptr %ctl, i64 19
  %bt = mul i64 %tid, 8
  %bi = add i64 %bt, 16                        ; this worker's heartbeat: word 24 + 8 (tid - 1)
  %beatp = getelementptr i64, ptr %ctl, i64 %bi
  %si = add i64 %bi, 1
  %sleepp = getelementptr i64, ptr %ctl, i64 %si
  br label %wait
wait:
  %seen = phi i64 [%seen0, %entry], [%g, %ran], [%seen, %idle]
  %g = call i64 @tsr_spin_beat(ptr %ctl, i64 %seen, i64 %limit, ptr %beatp)
  %new = icmp ne i64 %g, %seen
  br i1 %new, label %run, label %idle
run:
  %fn = load i64, ptr %fnp
  %args = load i64, ptr %argp
  %n = load i64, ptr %np
  %mine = icmp slt i64 %tid, %n
  br i1 %mine, label %call, label %ran
call:
  call void @llvm.x86.sse.ldmxcsr(ptr %mxp)   ; the caller's floating-point mode
  %f = inttoptr i64 %fn to ptr
  %a = inttoptr i64 %args to ptr
  call void %f(ptr %a, i64 %tid)
  br label %ran
ran:
  %d = atomicrmw add ptr %donep, i64 1 acq_rel
  br label %wait
idle:
  store atomic i64 1, ptr %sleepp seq_cst, align 8
  fence seq_cst                                ; the flag before the generation's re-check (publishers
  %lo = and i64 %seen, 4294967295              ; bump it, then read the flags: one side sees the other)
  %r = call i64 (i64, ...) @syscall(i64 202, ptr %ctl, i64 128, i64 %lo, ptr null, ptr null, i64 0)
  store atomic i64 0, ptr %sleepp seq_cst, align 8
  br label %wait
}
""")
_FN, _ARGS, _NTHREADS, _MXCSR = 16, 17, 18, 19   # the job: entry address, argument words, thread count, MXCSR
_BEAT, _ASLEEP = 24, 25   # + 8 (tid - 1): worker tid's heartbeat (bumped while it spins), 1 while it sleeps
PRESENT_SECONDS = 10e-6   # a spinning worker's heartbeat moves within this; one that does not is off its core


class _Native:
    """The helpers, compiled once for the host."""

    def __init__(self):
        from tessera.codegen import jit
        from tessera.mma import x86 as X
        name, cpu, feats = X.resolve(None)
        oc = jit.emit(f'target triple = "{jit.host_triple()}"\n' + _IR, cpu, X.llvm_feature_string(feats))
        self.loaded = jit.LoadedObject(oc.obj, ["tsr_spin_changed", "tsr_spin_reached", "tsr_add", "tsr_worker",
                                                "tsr_publish", "tsr_get_mxcsr", "tsr_set_mxcsr", "tsr_wake"])
        a = self.loaded.addresses
        sig = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
        self.spin_changed = sig(a["tsr_spin_changed"])
        self.spin_reached = sig(a["tsr_spin_reached"])
        self.add = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)(a["tsr_add"])
        self.publish = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(a["tsr_publish"])
        self.wake = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(a["tsr_wake"])
        self.get_mxcsr = ctypes.CFUNCTYPE(ctypes.c_int64)(a["tsr_get_mxcsr"])
        self.set_mxcsr = ctypes.CFUNCTYPE(None, ctypes.c_int64)(a["tsr_set_mxcsr"])
        self.worker = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_int64)(a["tsr_worker"])
        self.entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)   # <kernel>.entry(args, tid)


def _pauses_per_second(native: _Native) -> int:
    """The fastest of several short trials: on a loaded machine a trial the OS interrupts
    counts its time off the core, and one long trial measured here 10x too few pauses a
    second (a worker then slept after 0.2 ms of watching, not ``SPIN_SECONDS``)."""
    probe = np.zeros(1, np.int64)
    n, best = 4000, float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        native.spin_changed(probe.ctypes.data, 0, n)
        best = min(best, time.perf_counter() - t0)
    return max(1000, int(n / max(best, 1e-7)))


class WorkerPool:
    def __init__(self, workers: int, native: _Native | None = None):
        self.native = native or _Native()
        pps = _pauses_per_second(self.native)
        self.spins = int(SPIN_SECONDS * pps)
        self.present_spins = max(16, int(PRESENT_SECONDS * pps))
        # generation at [0], done count at [8], the job at [16..19], then a cache line per worker
        self.ctl = np.zeros(_BEAT + 8 * workers, np.int64)
        self.addr = self.ctl.ctypes.data
        self.lock = threading.Lock()                # one launch at a time
        self.job = None
        self.threads = []
        for tid in range(1, workers + 1):
            t = threading.Thread(target=self._worker, args=(tid,), name=f"tessera-{tid}", daemon=True)
            t.start()
            self.threads.append(t)

    @property
    def size(self) -> int:
        return len(self.threads)

    def _worker(self, tid: int) -> None:
        self.native.worker(self.addr, tid, 0, self.spins)   # jobs and sleeps run here, GIL released; never returns

    def ready(self, wanted: int, wake: bool) -> int:
        """How many of workers 1..``wanted`` (in order) a launch should use now.  A long launch
        (``wake``) takes them all, asleep or not (``run`` wakes the sleepers).  A short one takes
        only workers spinning on a core (the heartbeat moves within ``PRESENT_SECONDS``): a worker
        asleep on its futex, or spinning with its heartbeat standing still (parked by the OS: more
        runnable threads than cores), would make it wait a wake-up or a scheduler slice (3-8 ms
        measured on a loaded 2-vCPU VM) for a share worth tens of microseconds."""
        if wake:
            # waiting a scheduler slice for a worker is cheap next to a long launch, running without
            # it is not (the models bench at 26cd4dd, when a long launch also left out a worker whose
            # heartbeat stalled for 10 us or that took over 1 ms to wake: gpt2 large on 2 threads
            # 456 -> 504 ms)
            return min(wanted, self.size)
        n = 0
        for tid in range(1, min(wanted, self.size) + 1):
            at = 8 * (tid - 1)
            beat = self.addr + 8 * (_BEAT + at)
            b0 = int(self.ctl[_BEAT + at])
            if self.ctl[_ASLEEP + at] or self.native.spin_changed(beat, b0, self.present_spins) == b0:
                break
            n += 1
        return n

    def run(self, entry: int, args: int, nthreads: int, call=None) -> None:
        """``<kernel>.entry(args, tid)`` for tid = 0..nthreads-1: 0 on the caller, the rest on
        the workers; ``args`` (the address of the argument words) must outlive the call.
        ``call``: the caller's ctypes function for ``entry`` (made here when not given)."""
        nthreads = min(nthreads, self.size + 1)
        with self.lock:
            target = int(self.ctl[_DONE]) + self.size
            self.ctl[_FN], self.ctl[_ARGS], self.ctl[_NTHREADS] = entry, args, nthreads
            self.native.publish(self.addr)   # the caller's MXCSR, then the job (release)
            if self.ctl[_ASLEEP::8].any():   # read after the generation's bump (a locked add)
                self.native.wake(self.addr)
            (call or self.native.entry(entry))(args, 0)
            done_addr = self.addr + 8 * _DONE
            while self.native.spin_reached(done_addr, target, self.spins) < target:
                time.sleep(0)   # workers that had gone to sleep are on their way


_pool: WorkerPool | None = None
_pool_lock = forksafe.lock(sys.modules[__name__], "_pool_lock")   # renewed in a forked child


_native: _Native | None = None   # the helpers outlive a pool (a larger one, or the child's after fork)


def pool(workers: int) -> WorkerPool:
    global _pool, _native
    with _pool_lock:
        if _pool is None or _pool.size < workers:
            _pool = WorkerPool(workers, _native)
            _native = _pool.native
        return _pool


def _after_fork_in_child() -> None:
    """The child of a fork has none of the pool's threads: forget the pool (its launch lock
    and condition may be held by a thread that is not there either); the next launch makes one."""
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _after_fork_in_child())   # looked up at fork time


def _helpers() -> _Native:
    global _native
    with _pool_lock:
        if _native is None:
            _native = _Native()
        return _native


def get_mxcsr() -> int:
    """The calling thread's MXCSR (the x86 floating-point control and status register)."""
    return int(_helpers().get_mxcsr())


def set_mxcsr(value: int) -> None:
    """Load ``value`` into the calling thread's MXCSR (e.g. ``MXCSR_DEFAULT | MXCSR_FTZ | MXCSR_DAZ``
    to flush subnormals as ``torch.set_flush_denormal(True)`` does)."""
    _helpers().set_mxcsr(int(value))
