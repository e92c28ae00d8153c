"""The tuning search space of the CPU schedule (``schedule-cpu``), one entry per kernel family.

Each family declares the Schedule IR attributes the tuner may pin, their legal values (the ranges
``bounds`` and the MMA selector enforce), and a ``VERSION``: bump it when the family's legal
choices change (not on every compiler edit), and every tuning-database entry of the old version is
ignored.

- ``gemm`` (version 2): ``register_tile`` (MR x NR instructions whose accumulators, B vectors and
  A broadcast fit the vector register file: the selector's ``ranked_register_tiles``, ordered by
  its cost model), ``tile_k`` (KC), ``tile_m`` (MC), ``tile_n`` (NC).  MC and NC follow KC as the
  pass derives them (an A block of half of L2, a B panel of an eighth of L3);
  a candidate whose B micro-panel (KC x NR*W) exceeds a quarter of L2, whose A block (MC x KC)
  exceeds L2 or whose B panel (KC x NC) exceeds half of L3 is pruned before any compile.  The
  thread split (version 2): ``parallel`` (``m``: rows handed out in chunks from a work counter,
  B panels shared; ``b*m``: a contiguous range of row tiles per thread, private panels) and
  ``split`` (row chunks per thread at least, 1..16; the model's 4), for 2-D GEMMs on more than one
  thread.
- ``decode`` (version 1): the split-K decode attention kernel (a few query rows against a long KV
  cache): ``tile_n`` (keys per block, 16..2048) and ``split`` (key chunks per (batch, kv head) at
  most, 1..256; the model's: chosen at run time, chunks of at least two blocks).
- ``attention`` (version 1): ``register_tile`` (schedule-cpu's measured ``ATTENTION_TILES`` that
  fit the register file), ``tile_m`` (query block: a multiple of lcm(MR, NR*W)), ``tile_n`` (key
  block: a multiple of MR), blocks of about 64, 128 and 256 (``_attention``'s rule).
- ``row`` (version 1): ``chunk``, columns per step of rowwise / elementwise kernels: W, 2W, 4W
  and 8W within the register file (``bounds.check_chunk``).

``candidates`` lists the pins to try, the cost model's own choice (``{}``) first; ``check``
refuses a pin the family cannot take with ``SCHEDULE_ILLEGAL``.
"""
from __future__ import annotations

from dataclasses import dataclass

from tessera import host
from tessera.errors import MmaSelectorError, ScheduleIllegalError
from tessera.ir.schedule import SPLIT_MAX
from tessera.mma.selector import get_isa, ranked_register_tiles, register_tile, select_mma
from tessera.passes.schedule import bounds


@dataclass(frozen=True)
class Family:
    name: str
    version: int
    attrs: tuple[str, ...]
    doc: str
    kinds: tuple[str, ...] = ()   # the kernel kinds its pins apply to (schedule-cpu's pin_kinds)
    numeric: tuple[str, ...] = ()  # the attributes whose choice changes the numerics (ERROR_BUDGET)

    @property
    def pin_kinds(self) -> str:
        return "+".join(self.kinds)


FAMILIES = {
    "gemm": Family("gemm", 2, ("register_tile", "tile_k", "tile_m", "tile_n", "parallel", "split"),
                   "register tile within the vector registers; KC/MC/NC within L2/L3; thread split: parallel m "
                   "or b*m, row chunks per thread 1..16", ("gemm",)),
    "attention": Family("attention", 1, ("register_tile", "tile_m", "tile_n"),
                        "register tile (the measured defaults per register file); query block a multiple "
                        "of lcm(MR, NR*W), key block a multiple of MR, 64-256", ("attention",), ("tile_n",)),
    "decode": Family("decode", 1, ("tile_n", "split"), "keys per block 16..2048; key chunks per (batch, kv head) "
                     "1..256", ("attention",), ("tile_n", "split")),
    "row": Family("row", 1, ("chunk",), "columns per step: 1, 2, 4 or 8 vector registers",
                  ("rowwise", "rowreduce", "elementwise"), ("chunk",)),
}
GEMM_PARALLEL = ("m", "b*m")            # the thread splits a 2-D GEMM may take
GEMM_SPLITS = (1,)                      # row chunks per thread tried (the model's: 4)
DECODE_BLOCKS = (64, 128, 512)          # keys per block tried (the model's: 256)
DECODE_SPLITS = (1, 8)                  # key chunks per (batch, kv head) tried (the model's: at run time)
KC_CHOICES = (128, 256, 512, 1024)

# Accuracy budgets, the one place they are declared: the largest error a candidate may show against
# the float64 reference on the tuning data (max |got - ref| over every output, relative to the
# reference's largest finite magnitude, at least 1) to be eligible, per kernel family and dtype.  A
# candidate over it is recorded as rejected with its measured error and never wins, however fast.
# The attributes that change numerics (``Family.numeric``) are what the budget is for: a different
# key block re-scales flash attention's online softmax at other points, the decode kernel's key
# chunks merge partial softmaxes in another order, a row kernel's chunk sums its partials in
# another order; KC, MC, NC, register tiles and the thread split keep every element's k-order.
ERROR_BUDGET: dict[str, dict[str, float]] = {
    "gemm": {"f64": 1e-9, "f32": 2e-4, "bf16": 3e-2, "f16": 3e-3},
    "attention": {"f64": 1e-9, "f32": 2e-4, "bf16": 3e-2, "f16": 3e-3},
    "decode": {"f64": 1e-9, "f32": 2e-4, "bf16": 3e-2, "f16": 3e-3},
    "row": {"f64": 1e-9, "f32": 2e-4, "bf16": 3e-2, "f16": 3e-3},
}
ERROR_BUDGET_OTHER = 1e-3   # a dtype a family's row does not name


def error_budget(family: str, dtype: str) -> float:
    """The family's accuracy budget for ``dtype`` (``ERROR_BUDGET``)."""
    return ERROR_BUDGET.get(family, {}).get(dtype, ERROR_BUDGET_OTHER)
ATTENTION_BLOCK_CHOICES = (64, 128, 256)   # query / key blocks (ATTENTION_BLOCKS 128 x 128 is the model's)


def version(family: str) -> int:
    return FAMILIES[family].version


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _round_down(v: int, m: int) -> int:
    return max(m, v // m * m)


def _gemm_selection(arch: str | None, dtype: str):
    isa = get_isa("x86", arch)
    sel = select_mma(isa, dtype, out_dtype="f64" if dtype == "f64" else "f32")
    return isa, sel


def _width(isa, dtype: str) -> int:
    w = 16 if "avx512f" in isa.features else 8
    return w // 2 if dtype == "f64" else w


def check(family: str, pins: dict, *, arch: str | None = None, dtype: str = "f32") -> None:
    """Refuse (``ScheduleIllegalError``) a pin outside the family's legal space on ``arch``."""
    if family not in FAMILIES:
        raise ScheduleIllegalError(f"no tuning space for kernel family {family!r}; families: {', '.join(FAMILIES)}")
    extra = set(pins) - set(FAMILIES[family].attrs)
    if extra:
        raise ScheduleIllegalError(f"tuning space {family!r} has no attribute {', '.join(sorted(extra))}; "
                                   f"attributes: {', '.join(FAMILIES[family].attrs)}")
    bounds.check_static(pins, "cpu", f"tuning space {family}: ")
    if family == "gemm":
        isa, sel = _gemm_selection(arch, dtype)
        if pins.get("register_tile"):
            try:
                register_tile(isa, sel, prefer_tile=tuple(pins["register_tile"]))
            except MmaSelectorError as e:
                raise ScheduleIllegalError(f"tuning space gemm: {e.message}") from None
        par, split = pins.get("parallel"), pins.get("split")
        if par is not None and par not in GEMM_PARALLEL:
            raise ScheduleIllegalError(f"tuning space gemm: parallel={par!r}; legal: {', '.join(GEMM_PARALLEL)}")
        if split is not None and (par == "b*m" or not 1 <= split <= SPLIT_MAX["gemm"]):
            raise ScheduleIllegalError(f"tuning space gemm: split={split}; legal: 1..{SPLIT_MAX['gemm']} with "
                                       "parallel m (row chunks per thread)")
    elif family == "decode":
        lo, hi = bounds.DECODE_BLOCK_RANGE
        bkv, split = pins.get("tile_n"), pins.get("split")
        if bkv is not None and not lo <= bkv <= hi:
            raise ScheduleIllegalError(f"tuning space decode: key block tile_n={bkv}; legal: {lo}..{hi}")
        if split is not None and not 1 <= split <= SPLIT_MAX["attention"]:
            raise ScheduleIllegalError(f"tuning space decode: split={split}; legal: 1..{SPLIT_MAX['attention']}")
    elif family == "attention":
        _attention_check(pins, arch, dtype)
    elif pins.get("chunk"):
        isa = get_isa("x86", arch)
        bounds.check_chunk(pins["chunk"], _width(isa, dtype), isa.register_budget, "row")


def gemm_candidates(shape: tuple[int, int, int], *, arch: str | None = None, dtype: str = "f32",
                    tiles: int = 3, kcs: int = 2, limit: int = 6, threads: int = 1,
                    batched: bool = False) -> list[dict]:
    """Pins for a GEMM of ``shape`` = (M, N, K): the model's choice (``{}``) first, then the best
    ``tiles`` register tiles by the cost model, each with up to ``kcs`` KC blockings (KC values
    beyond K collapse into one), pruned by cache footprint, at most ``limit``; then, on more than one
    thread (a 2-D GEMM), the model's blocking with each other thread split (``thread_splits``)."""
    k = shape[-1]
    isa, sel = _gemm_selection(arch, dtype)
    rec = sel.record
    esize = rec.packed_bytes
    caches = host.cache_sizes()
    out: list[dict] = [{}]
    seen: set = set()
    for t in ranked_register_tiles(isa, sel)[:tiles]:
        mrr, nrw = t.mr * rec.m, t.nr * rec.n
        kunit = rec.k * 4
        kc_opts = []
        for kc in KC_CHOICES:
            kc = min(_round_down(kc, kunit), _round_up(k, kunit))
            if kc not in kc_opts:
                kc_opts.append(kc)
        for kc in kc_opts[-kcs:] if len(kc_opts) > kcs else kc_opts:
            # MC and NC as schedule-cpu derives them for this KC (a block larger than the matrix is
            # clamped at run time; not capping keeps the model's own choice recognisable)
            mc = _round_down(caches["L2"] // 2 // (kc * esize), mrr)
            nc = _round_down(min(caches["L3"] // 8 // (kc * esize), 4096), nrw)
            if not fits(kc, mc, nc, nrw, esize, caches):
                continue
            pins = {"register_tile": (t.mr, t.nr), "tile_k": kc, "tile_m": mc, "tile_n": nc}
            key = tuple(sorted(pins.items()))
            if key not in seen:
                seen.add(key)
                out.append(pins)
    return out[:limit] + (thread_splits() if threads > 1 and not batched else [])


def thread_splits() -> list[dict]:
    """The GEMM thread splits other than the model's (parallel m, 4 row chunks per thread at least)."""
    return [{"split": n} for n in GEMM_SPLITS] + [{"parallel": p} for p in GEMM_PARALLEL if p != "m"]


def decode_candidates(shape: tuple[int, ...], *, limit: int = 6) -> list[dict]:
    """Pins for decode attention of ``shape`` = (B*H, Sq, Skv, D): the model's (``{}``) first, then
    other key blocks (``DECODE_BLOCKS`` below the cache's length) and key-chunk splits."""
    skv = shape[2] if len(shape) >= 3 else None
    out: list[dict] = [{}]
    out += [{"tile_n": b} for b in DECODE_BLOCKS if skv is None or b < skv]
    out += [{"split": n} for n in DECODE_SPLITS]
    return out[:limit]


def _attention_tiles(arch: str | None, dtype: str):
    """(isa, selection, the register tiles to try): schedule-cpu's measured defaults
    (``ATTENTION_TILES``) that fit this register file, as the selector legalises them."""
    from tessera.passes.schedule.schedule_cpu import ScheduleCpu
    acc = "f64" if dtype == "f64" else "f32"
    isa = get_isa("x86", arch)
    sel = select_mma(isa, acc, out_dtype=acc)
    tiles = []
    for budget, t in sorted(ScheduleCpu.ATTENTION_TILES.items(), reverse=True):
        if budget <= isa.register_budget:
            try:
                rt = register_tile(isa, sel, prefer_tile=t)
            except MmaSelectorError:
                continue
            if (rt.mr, rt.nr) not in tiles:
                tiles.append((rt.mr, rt.nr))
    return isa, sel, tiles


def _attention_check(pins: dict, arch: str | None, dtype: str) -> None:
    """schedule-cpu's ``_attention`` rule: query block a multiple of lcm(MR, NR*W), key block of MR."""
    import math
    isa, sel, tiles = _attention_tiles(arch, dtype)
    t = tuple(pins.get("register_tile") or (tiles[0] if tiles else (1, 1)))
    try:
        rt = register_tile(isa, sel, prefer_tile=t)
    except MmaSelectorError as e:
        raise ScheduleIllegalError(f"tuning space attention: {e.message}") from None
    w = sel.record.vector_width or _width(isa, dtype)
    qunit = math.lcm(rt.mr, rt.nr * w)
    bq, bkv = pins.get("tile_m"), pins.get("tile_n")
    if bq is not None and bq % qunit or bkv is not None and bkv % rt.mr:
        raise ScheduleIllegalError(f"tuning space attention: query block {bq} must be a multiple of lcm(MR, NR*W) = "
                                   f"{qunit} and key block {bkv} of MR={rt.mr}")


def attention_candidates(shape: tuple[int, ...], *, arch: str | None = None, dtype: str = "f32",
                         limit: int = 6) -> list[dict]:
    """Pins for flash attention of ``shape`` = (B*H, Sq, Skv, D): the model's choice (``{}``)
    first, then each legal register tile with query / key blocks of about 64, 128 and 256 rounded
    to the verifier's units (blocks beyond the sequence collapse into one), at most ``limit``."""
    import math
    isa, sel, tiles = _attention_tiles(arch, dtype)
    w = sel.record.vector_width or _width(isa, dtype)
    sq, skv = (shape[1], shape[2]) if len(shape) >= 3 else (None, None)
    out: list[dict] = [{}]
    for mr, nr in tiles:
        qunit = math.lcm(mr, nr * w)
        for blk in ATTENTION_BLOCK_CHOICES:
            bq = qunit * max(1, round(blk / qunit))
            bkv = mr * -(-blk // mr)
            if sq is not None:
                bq = min(bq, _round_up(sq, qunit))
                bkv = min(bkv, _round_up(skv, mr))
            pins = {"register_tile": (mr, nr), "tile_m": bq, "tile_n": bkv}
            if pins not in out:
                out.append(pins)
    return out[:limit]


def fits(kc: int, mc: int, nc: int, nrw: int, esize: int, caches: dict) -> bool:
    """The cost model's cache footprints: B micro-panel within L2/4, A block within L2, B panel
    within L3/2."""
    return kc * nrw * esize <= caches["L2"] // 4 and mc * kc * esize <= caches["L2"] \
        and kc * nc * esize <= caches["L3"] // 2


def row_candidates(*, arch: str | None = None, dtype: str = "f32", cols: int | None = None,
                   limit: int = 4) -> list[dict]:
    """Pins for a row kernel: the model's chunk (``{}``: 4 registers) first, then 1, 2 and 8
    registers' worth where the register file holds them (and the row is that wide)."""
    isa = get_isa("x86", arch)
    w = _width(isa, dtype)
    out: list[dict] = [{}]
    for regs in (2, 8, 1):
        chunk = regs * w
        wide_enough = cols is None or chunk <= _round_up(cols, w)
        if chunk <= w * isa.register_budget and chunk <= bounds.CHUNK_MAX and wide_enough:
            out.append({"chunk": chunk})
    return out[:limit]


def candidates(family: str, shape: tuple[int, ...], *, arch: str | None = None, dtype: str = "f32",
               limit: int = 6, threads: int = 1) -> list[dict]:
    if family == "gemm":
        return gemm_candidates(tuple(shape[-3:]), arch=arch, dtype=dtype, limit=limit, threads=threads,
                               batched=len(shape) > 3)
    if family == "decode":
        return decode_candidates(tuple(shape), limit=limit)
    if family == "attention":
        return attention_candidates(tuple(shape), arch=arch, dtype=dtype, limit=limit)
    if family == "row":
        return row_candidates(arch=arch, dtype=dtype, cols=shape[-1] if shape else None, limit=limit)
    raise ScheduleIllegalError(f"no tuning space for kernel family {family!r}; families: {', '.join(FAMILIES)}")
