"""LLVM IR of an exported library's strided entry point (``driver.py`` appends it):

``int name_strided(<inputs>, <outputs>, <sizes>, const int64_t *strides)``

``strides`` holds, for every input then every output, one stride per axis in elements (not
bytes; negative and, for inputs, zero strides allowed), or is NULL for contiguous row-major
buffers (then it is ``name``).  A buffer whose strides are its contiguous ones (axes of size 1
ignored) is used in place; any other is copied once: an input into a contiguous buffer before
the run, an output's contiguous result into its strided place after it.  An output with a zero
stride on an axis longer than 1 would write two elements to one place: ``ERR_STRIDE``.
Staging buffers and the workspace come from ``malloc`` and are freed before returning.
"""
from __future__ import annotations

from tessera.aotlib.plan import C_TYPES, Plan, Tensor

MAX_RANK = 16
CHECK_STRIDES = True   # False plants a bug (every buffer taken as contiguous): tests/test_aot_strided.py


def copy_helper(esize: int) -> str:
    """``tsr_copy<E>(contig, strided, rank, dims, strides, to_contig)``: every element of a strided
    array (E bytes each) to or from its place in row-major order; an odometer over the axes."""
    ty = f"i{8 * esize}"
    return f"""
define internal void @tsr_copy{esize}(ptr %c, ptr %s, i64 %rank, ptr %dims, ptr %st, i1 %toc) nounwind {{
entry:
  %idx = alloca [{MAX_RANK} x i64], align 8
  call void @llvm.memset.p0.i64(ptr %idx, i8 0, i64 {8 * MAX_RANK}, i1 false)
  br label %tot
tot:
  %td = phi i64 [ 0, %entry ], [ %td1, %totb ]
  %tn = phi i64 [ 1, %entry ], [ %tn1, %totb ]
  %tmore = icmp slt i64 %td, %rank
  br i1 %tmore, label %totb, label %totd
totb:
  %tdp = getelementptr i64, ptr %dims, i64 %td
  %tdv = load i64, ptr %tdp
  %tn1 = mul i64 %tn, %tdv
  %td1 = add i64 %td, 1
  br label %tot
totd:
  %empty = icmp sle i64 %tn, 0
  br i1 %empty, label %done, label %elem
elem:
  %k = phi i64 [ 0, %totd ], [ %k1, %next ]
  br label %off
off:
  %od = phi i64 [ 0, %elem ], [ %od1, %offb ]
  %ov = phi i64 [ 0, %elem ], [ %ov1, %offb ]
  %omore = icmp slt i64 %od, %rank
  br i1 %omore, label %offb, label %move
offb:
  %oip = getelementptr i64, ptr %idx, i64 %od
  %oi = load i64, ptr %oip
  %osp = getelementptr i64, ptr %st, i64 %od
  %os = load i64, ptr %osp
  %om = mul i64 %oi, %os
  %ov1 = add i64 %ov, %om
  %od1 = add i64 %od, 1
  br label %off
move:
  %ps = getelementptr {ty}, ptr %s, i64 %ov
  %pc = getelementptr {ty}, ptr %c, i64 %k
  br i1 %toc, label %gather, label %scatter
gather:
  %g = load {ty}, ptr %ps, align 1
  store {ty} %g, ptr %pc, align 1
  br label %step
scatter:
  %h = load {ty}, ptr %pc, align 1
  store {ty} %h, ptr %ps, align 1
  br label %step
step:
  %k1 = add i64 %k, 1
  %last = icmp eq i64 %k1, %tn
  br i1 %last, label %done, label %bump
bump:
  %bd0 = sub i64 %rank, 1
  br label %inc
inc:
  %bd = phi i64 [ %bd0, %bump ], [ %bdn, %carry ]
  %bip = getelementptr i64, ptr %idx, i64 %bd
  %bi = load i64, ptr %bip
  %bi1 = add i64 %bi, 1
  %bdp = getelementptr i64, ptr %dims, i64 %bd
  %bdv = load i64, ptr %bdp
  %wrap = icmp sge i64 %bi1, %bdv
  br i1 %wrap, label %carry, label %keep
keep:
  store i64 %bi1, ptr %bip
  br label %next
carry:
  store i64 0, ptr %bip
  %bdn = sub i64 %bd, 1
  br label %inc
next:
  br label %elem
done:
  ret void
}}
"""


def _dim(d) -> str:
    return f"%sz_{d}" if isinstance(d, str) else str(d)


def strided_fn(plan: Plan, name: str, err_stride: int, err_nomem: int) -> str:
    """``name_strided``: checks each buffer's strides, stages the non-contiguous ones, runs
    ``name`` on contiguous buffers, scatters the staged outputs, frees."""
    tensors: list[tuple[str, Tensor, str]] = [("in", t, f"%in{i}") for i, t in enumerate(plan.inputs)]
    tensors += [("out", t, f"%out{i}") for i, t in enumerate(plan.outputs)]
    params = ", ".join([f"ptr {p}" for _, _, p in tensors] + [f"i64 %sz_{nm}" for nm, _ in plan.sizes])
    b = [f"define i32 @{name}_strided({params}, ptr %strides) nounwind {{", "entry:",
         "  %nostr = icmp eq ptr %strides, null",
         "  br i1 %nostr, label %plain, label %check",
         "plain:"]
    plain_args = ", ".join([f"ptr {p}" for _, _, p in tensors] + [f"i64 %sz_{nm}" for nm, _ in plan.sizes])
    b += [f"  %pr = call i32 @{name}({plain_args})", "  ret i32 %pr",
          "badstride:", f"  ret i32 {err_stride}",
          "check:"]
    at = 0        # the tensor's first stride in the strides array
    staged = []   # per tensor: (contiguous pointer to pass, needs-staging flag, dims array, strides ptr, bytes)
    for n, (kind, t, p) in enumerate(tensors):
        dims = list(t.dims or t.shape)
        r = len(dims)
        esize = C_TYPES[t.dtype][1]
        b.append(f"  %dims{n} = alloca [{max(r, 1)} x i64], align 8")
        for k, d in enumerate(dims):
            b += [f"  %dp{n}_{k} = getelementptr i64, ptr %dims{n}, i64 {k}", f"  store i64 {_dim(d)}, ptr %dp{n}_{k}"]
        b.append(f"  %sp{n} = getelementptr i64, ptr %strides, i64 {at}")
        # contiguous: each axis longer than 1 has the stride of the axes after it
        flag, want = "false", "1"
        for k in reversed(range(r if CHECK_STRIDES else 0)):
            b += [f"  %sv{n}_{k} = load i64, ptr %dp{n}_{k}",
                  f"  %stp{n}_{k} = getelementptr i64, ptr %strides, i64 {at + k}",
                  f"  %stv{n}_{k} = load i64, ptr %stp{n}_{k}",
                  f"  %long{n}_{k} = icmp sgt i64 %sv{n}_{k}, 1",
                  f"  %same{n}_{k} = icmp eq i64 %stv{n}_{k}, {want}",
                  f"  %diff{n}_{k} = xor i1 %same{n}_{k}, true",
                  f"  %bad{n}_{k} = and i1 %long{n}_{k}, %diff{n}_{k}",
                  f"  %f{n}_{k} = or i1 {flag}, %bad{n}_{k}"]
            flag = f"%f{n}_{k}"
            if kind == "out":   # a zero stride on a long axis: two results in one place
                b += [f"  %zero{n}_{k} = icmp eq i64 %stv{n}_{k}, 0",
                      f"  %alias{n}_{k} = and i1 %long{n}_{k}, %zero{n}_{k}",
                      f"  br i1 %alias{n}_{k}, label %badstride, label %ok{n}_{k}", f"ok{n}_{k}:"]
            b.append(f"  %w{n}_{k} = mul i64 {want}, %sv{n}_{k}")
            want = f"%w{n}_{k}"
        numel = want   # the product of the dims
        b += [f"  %stage{n} = or i1 {flag}, false",
              f"  %bytes{n} = mul i64 {numel}, {esize}"]
        staged.append((n, kind, p, esize, r))
        at += r
    # one staging allocation for every buffer that needs one (64-byte aligned slices of it)
    total = "0"
    for n, kind, p, esize, r in staged:
        b += [f"  %pad{n} = add i64 %bytes{n}, 63", f"  %al{n} = and i64 %pad{n}, -64",
              f"  %need{n} = select i1 %stage{n}, i64 %al{n}, i64 0",
              f"  %off{n} = add i64 {total}, 0", f"  %tot{n} = add i64 {total}, %need{n}"]
        total = f"%tot{n}"
    b += [f"  %any = icmp sgt i64 {total}, 0", "  br i1 %any, label %alloc, label %ready",
          "alloc:", f"  %buf = call ptr @malloc(i64 {total})", "  %bufnull = icmp eq ptr %buf, null",
          "  br i1 %bufnull, label %nomem, label %ready",
          "nomem:", f"  ret i32 {err_nomem}",
          "ready:", "  %stg = phi ptr [ null, %check_end ], [ %buf, %alloc ]"]
    for n, kind, p, esize, r in staged:
        b += [f"  %slot{n} = getelementptr i8, ptr %stg, i64 %off{n}",
              f"  %use{n} = select i1 %stage{n}, ptr %slot{n}, ptr {p}"]
        if kind == "in":
            b += [f"  br i1 %stage{n}, label %ga{n}, label %gad{n}", f"ga{n}:",
                  f"  call void @tsr_copy{esize}(ptr %use{n}, ptr {p}, i64 {r}, ptr %dims{n}, ptr %sp{n}, i1 true)",
                  f"  br label %gad{n}", f"gad{n}:"]
    args = ", ".join([f"ptr %use{n}" for n, *_ in staged] + [f"i64 %sz_{nm}" for nm, _ in plan.sizes])
    b += [f"  %rc = call i32 @{name}({args})", "  %rcok = icmp eq i32 %rc, 0",
          "  br i1 %rcok, label %scatter, label %free", "scatter:"]
    for n, kind, p, esize, r in staged:
        if kind == "out":
            b += [f"  br i1 %stage{n}, label %sc{n}, label %scd{n}", f"sc{n}:",
                  f"  call void @tsr_copy{esize}(ptr %use{n}, ptr {p}, i64 {r}, ptr %dims{n}, ptr %sp{n}, i1 false)",
                  f"  br label %scd{n}", f"scd{n}:"]
    b += ["  br label %free", "free:", "  br i1 %any, label %release, label %out",
          "release:", "  call void @free(ptr %stg)", "  br label %out",
          "out:", "  ret i32 %rc", "}"]
    # the block that branches on %any: the last one of the checks
    text = "\n".join(b)
    last = [ln.strip()[:-1] for ln in b[:b.index("  %any = icmp sgt i64 " + total + ", 0")] if ln.strip().endswith(":")][-1]
    return text.replace("%check_end ]", f"%{last} ]")


def element_sizes(plan: Plan) -> list[int]:
    return sorted({C_TYPES[t.dtype][1] for t in plan.inputs + plan.outputs})


def max_rank(plan: Plan) -> int:
    return max([len(t.dims or t.shape) for t in plan.inputs + plan.outputs] + [0])
