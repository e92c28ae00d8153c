"""The cost-aware MMA selector, the same for every target.

``get_isa(target, arch)`` gathers the records legal on one (target, arch);
``select_mma`` picks one for a dtype (on a CPU the highest throughput per core,
from each record's ``cycles``; on a GPU the cheapest accumulator footprint first, then
the most work per instruction) and refuses every illegal request with an error
that says what is legal instead; ``register_tile`` chooses how many instructions
a register tile unrolls (MR x NR), ranked by a cost model calibrated by
``tessera bench tiles`` (``calibration.json``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tessera.errors import MmaNoLoweringError, MmaSelectorError, UnknownArchError
from tessera.mma import x86 as X
from tessera.mma.records import DTYPE_BYTES, KNOWN_DTYPES, MmaIsa, MmaRecord

TARGETS = ("x86", "nvidia", "rocm", "apple")


def _gpu_modules():
    from tessera.mma import apple, nvidia, rocm
    return {"nvidia": nvidia, "rocm": rocm, "apple": apple}


def all_records() -> tuple[MmaRecord, ...]:
    mods = _gpu_modules()
    return X.RECORDS + mods["nvidia"].RECORDS + mods["rocm"].RECORDS + mods["apple"].RECORDS


def record_by_id(rid: str) -> MmaRecord:
    for r in all_records():
        if r.id == rid:
            return r
    raise MmaSelectorError(f"unknown MMA record {rid!r}")


@lru_cache(maxsize=None)
def get_isa(target: str, arch: str | None) -> MmaIsa:
    """The records legal on (target, arch).  ``arch`` is required except x86 (None = host)."""
    if target not in TARGETS:
        raise UnknownArchError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    if target == "x86":
        try:
            name, cpu, feats = X.resolve(arch)
        except KeyError:
            raise UnknownArchError(f"unknown x86 arch {arch!r}; known: {', '.join(X.known_archs())}") from None
        recs = tuple(r for r in X.RECORDS if set(r.features) <= feats)
        return MmaIsa("x86", name, recs, X.register_budget(feats), llvm_cpu=cpu,
                      llvm_features=X.llvm_feature_string(feats), features=feats)
    mod = _gpu_modules()[target]
    if arch is None:
        raise UnknownArchError(f"target {target!r} needs an explicit arch (no default chip); "
                               f"known: {', '.join(mod.ARCHS)}")
    if arch not in mod.ARCHS:
        raise UnknownArchError(f"unknown {target} arch {arch!r}; known: {', '.join(mod.ARCHS)}")
    return mod.isa(arch)


# --------------------------------------------------------------------------- footprint
def accumulator_regs_per_lane(record: MmaRecord) -> float | None:
    """32-bit registers each lane holds for one instruction's accumulator:
    M*N*blocks*bytes(acc) / (4*lanes).  CPU vector records count a vector's 32-bit
    lanes as the lanes (one f32 accumulator vector -> 1).  AMX (tile registers) -> None."""
    lanes = record.lanes
    if lanes is None and record.vector_width is not None:
        lanes = record.vector_width * DTYPE_BYTES[record.acc_dtype] / 4   # the vector's 32-bit lanes
    if lanes is None:
        return None
    return record.m * record.n * record.blocks * DTYPE_BYTES[record.acc_dtype] / (4 * lanes)


def _flops(r: MmaRecord) -> int:
    return 2 * r.m * r.n * r.k * r.blocks


def _check_dtype(isa: MmaIsa, dtype: str, what: str = "dtype") -> None:
    """A known dtype name, or "AxB" for mixed inputs (u8xs8)."""
    if dtype in KNOWN_DTYPES:
        return
    if not all(part in KNOWN_DTYPES for part in dtype.split("x", 1)):
        raise MmaSelectorError(f"unknown {what} {dtype!r}; known dtypes: {', '.join(KNOWN_DTYPES)}")


def _matching(isa: MmaIsa, dtype: str, out_dtype: str | None = None) -> list[MmaRecord]:
    _check_dtype(isa, dtype)
    if out_dtype is not None:
        _check_dtype(isa, out_dtype, "out_dtype")
    recs = [r for r in isa.records if r.accepts(dtype)]
    if not recs:
        raise MmaSelectorError(f"{isa.target}:{isa.arch} has no matrix instruction for {dtype}; "
                               f"legal dtypes there: {', '.join(isa.dtypes()) or 'none'}")
    if out_dtype is not None:
        outs = sorted({r.acc_dtype for r in recs})
        recs = [r for r in recs if r.acc_dtype == out_dtype]
        if not recs:
            raise MmaSelectorError(f"{isa.target}:{isa.arch}: {dtype} inputs accumulate into "
                                   f"{', '.join(outs)}, not {out_dtype}")
    return recs


def rank_shapes_by_footprint(isa: MmaIsa, dtype: str, out_dtype: str | None = None) -> list[MmaRecord]:
    """Records for ``dtype`` (and accumulator ``out_dtype``), cheapest first: smallest
    accumulator footprint per lane, then most work per instruction."""
    recs = _matching(isa, dtype, out_dtype)

    def key(r: MmaRecord):
        fp = accumulator_regs_per_lane(r)
        return (math.inf if fp is None else fp, -_flops(r), r.id)

    return sorted(recs, key=key)


def throughput(r: MmaRecord) -> float | None:
    """Peak flops per cycle on one core (CPU records with a ``cycles`` figure), else None."""
    return _flops(r) / r.cycles if r.cycles else None


def rank_records(isa: MmaIsa, dtype: str, out_dtype: str | None = None) -> list[MmaRecord]:
    """Best first: on a CPU by peak throughput per core (AMX's tile multiply beats a vector
    dot product by 8x on the same core), on a GPU by accumulator footprint."""
    ranked = rank_shapes_by_footprint(isa, dtype, out_dtype)
    if isa.target == "x86":
        ranked.sort(key=lambda r: -(throughput(r) or 0.0))
    return ranked


def cheapest_shape(isa: MmaIsa, dtype: str) -> tuple[int, int, int]:
    return rank_shapes_by_footprint(isa, dtype)[0].shape


@dataclass(frozen=True)
class MmaSelection:
    record: MmaRecord
    shape: tuple[int, int, int]
    a_layout: str
    b_layout: str
    pack_width: int            # input elements per 32-bit register
    acc_dtype: str
    regs_per_lane: float | None

    @property
    def lowered_by(self) -> str | None:
        return self.record.lowered_by

    def to_dict(self) -> dict:
        return {"record": self.record.id, "mnemonic": self.record.mnemonic, "shape": list(self.shape),
                "a_layout": self.a_layout, "b_layout": self.b_layout, "pack_width": self.pack_width,
                "acc": self.acc_dtype, "regs_per_lane": self.regs_per_lane, "lowered_by": self.lowered_by}


def select_mma(isa: MmaIsa, dtype: str, *, out_dtype: str | None = None, math_mode: str | None = None,
               prefer_shape: tuple[int, int, int] | None = None, wave: int | None = None,
               family: str | None = None, lowering: str | None = None) -> MmaSelection:
    """The cheapest legal record for ``dtype``; every illegal request raises ``MmaSelectorError``
    saying what is legal.  With ``lowering``, only records that pass implements are chosen (a
    cheaper one it lacks, e.g. wgmma on sm_90a, is skipped); none left is ``MMA_NO_LOWERING``."""
    ranked = rank_records(isa, dtype, out_dtype)
    if family is not None:
        fams = sorted({r.family for r in isa.records})
        if family not in fams:
            raise MmaSelectorError(f"{isa.target}:{isa.arch} has no {family} instructions; its matrix instruction "
                                   f"families: {', '.join(fams) or 'none'}")
        hit = [r for r in ranked if r.family == family]
        if not hit:
            raise MmaSelectorError(f"{isa.target}:{isa.arch}: no {family} instruction takes {dtype}; "
                                   f"{dtype} runs on: {', '.join(sorted({r.family for r in ranked}))}")
        ranked = hit
    if isa.target == "rocm":
        # the wave size comes from the arch (RDNA: wave32, CDNA: wave64), never a default
        if wave is None:
            wave = isa.wave_sizes[0]
        if wave not in isa.wave_sizes:
            raise MmaSelectorError(f"rocm:{isa.arch} runs wave{'/wave'.join(map(str, isa.wave_sizes))} only; "
                                   f"wave{wave} is not legal there")
        ranked = [r for r in ranked if r.lanes == wave]
        if not ranked:
            raise MmaSelectorError(f"rocm:{isa.arch}: no {dtype} matrix instruction runs in wave{wave}")
    modes = sorted({r.math_mode for r in ranked if r.math_mode})
    if math_mode is None:
        plain = [r for r in ranked if r.math_mode is None]
        if not plain and lowering is not None:   # a pass asks: its users have no math_mode to pass
            ok = sorted({r.a_dtype for r in isa.records if r.math_mode is None and r.lowered_by == lowering})
            raise MmaSelectorError(f"{isa.target}:{isa.arch}: {dtype} matrix instructions there need math_mode "
                                   f"{' or '.join(modes)} (reduced precision), used only when asked for: "
                                   f"schedule={{'math_mode': '{modes[0]}'}}; input dtypes {lowering} lowers "
                                   f"here without one: {', '.join(ok) or 'none'}")
        if not plain:
            raise MmaSelectorError(f"{isa.target}:{isa.arch}: {dtype} matrix instructions need an explicit "
                                   f"math_mode ({' or '.join(modes)}); pass math_mode=...")
        ranked = plain
    else:
        with_mode = [r for r in ranked if r.math_mode == math_mode]
        if not with_mode:
            raise MmaSelectorError(f"{isa.target}:{isa.arch}: math_mode {math_mode!r} is not legal for {dtype}; "
                                   f"legal: {', '.join(modes) or 'none (plain)'}")
        ranked = with_mode
    if prefer_shape is not None:
        prefer_shape = tuple(prefer_shape)  # type: ignore[assignment]
        hit = [r for r in ranked if r.shape == prefer_shape]
        if not hit:
            legal = sorted({r.shape for r in ranked})
            raise MmaSelectorError(f"{isa.target}:{isa.arch}: shape {prefer_shape} is not legal for {dtype}"
                                   f"{' -> ' + out_dtype if out_dtype else ''}; legal for {dtype}: "
                                   f"{', '.join('x'.join(map(str, s)) for s in legal)}")
        ranked = hit
    if lowering is not None:
        done = [r for r in ranked if r.lowered_by == lowering]
        if not done:
            best = ranked[0]
            raise MmaNoLoweringError(f"{best.id} ({best.mnemonic}) has no lowering in {lowering} yet"
                                     + (f" (it is lowered by {best.lowered_by})" if best.lowered_by else "")
                                     + f"; {lowering} implements none of the {isa.target}:{isa.arch} records for "
                                       f"{dtype}")
        ranked = done
    r = ranked[0]
    pack = max(1, int(4 // DTYPE_BYTES[r.a_dtype])) if DTYPE_BYTES[r.a_dtype] >= 1 else 8
    return MmaSelection(r, r.shape, r.a_layout, r.b_layout, pack, r.acc_dtype, accumulator_regs_per_lane(r))


def require_lowering(sel: MmaSelection, lowering: str) -> None:
    """Refuse a compile that needs an instruction ``lowering`` does not implement."""
    if sel.record.lowered_by != lowering:
        raise MmaNoLoweringError(
            f"{sel.record.id} ({sel.record.mnemonic}) has no lowering in {lowering}"
            + (f" (it is lowered by {sel.record.lowered_by})" if sel.record.lowered_by else " yet"))


# --------------------------------------------------------------------------- register tiles
CALIBRATION = Path(__file__).with_name("calibration.json")


@lru_cache(maxsize=1)
def _calibration() -> dict:
    try:
        return json.loads(CALIBRATION.read_text())
    except (OSError, ValueError):
        return {}


@dataclass(frozen=True)
class RegisterTile:
    mr: int            # instruction rows (broadcast A registers / rows of the tile)
    nr: int            # instruction columns (B vectors per k step)
    registers: int     # vector registers used: accumulators + B vectors + A broadcast
    score: float       # predicted (or measured) GFLOP/s per core
    source: str        # "model" or "calibrated"

    def to_dict(self) -> dict:
        return {"mr": self.mr, "nr": self.nr, "registers": self.registers, "score": round(self.score, 1),
                "source": self.source}


def _model_score(sel: MmaSelection, mr: int, nr: int, ghz: float = 3.6) -> float:
    """A throughput model for a CPU register tile (GFLOP/s per core).

    Per k step the tile issues mr*nr FMAs (or dot products), nr vector loads and mr
    broadcasts.  Zen 4 / Skylake-class cores retire two 256-bit FMAs and two loads
    per cycle (a 512-bit op counts as two halves), and each accumulator's dependent
    chain allows one k step per FMA latency (4 cycles).  Each k step also costs about
    one cycle of address and loop bookkeeping.  Larger tiles waste more on edges of a
    random shape (a small linear penalty).  Measured figures (calibration.json) take
    precedence over this model."""
    r = sel.record
    if r.register_file:
        # AMX: each tile product occupies the TMUL for ``cycles``; each operand tile is a 1 KiB
        # load (about 12 cycles from L1/L2).  Per k step a tile issues mr*nr products and mr+nr
        # loads; the smaller term hides under the larger, and fewer loads per product win ties.
        cycles = max(mr * nr * r.cycles, 12.0 * (mr + nr)) + 0.25 * (mr + nr)
        return _flops(r) * mr * nr / cycles * ghz
    w = r.vector_width or 1
    halves = max(1, int(w * DTYPE_BYTES[r.acc_dtype] * 8) // 256)   # 256-bit halves of one vector
    fma_cycles = mr * nr * halves / 2
    load_cycles = (nr * halves + mr) / 2
    cycles = max(fma_cycles, load_cycles, 4.0) + 1.0
    gflops = 2 * mr * nr * w * r.k / cycles * ghz
    # Tiles that leave LLVM fewer than ~8 free vector registers spill in the unrolled k-loop
    # (measured: 9x3 and 14x2 run at half speed on Zen 4 while 4x2..11x2 are within 5%).
    regs = mr * nr + nr + 1
    spill = 0.6 if regs > 24 else 1.0
    return gflops * spill * (1.0 - 0.004 * (mr - 1) - 0.01 * (nr - 1))


def _registers(r: MmaRecord, mr: int, nr: int) -> int:
    """Registers an MR x NR tile holds.  Vector records: MR*NR accumulators, NR B vectors and
    one A broadcast; tile-register records (AMX): MR*NR accumulator tiles, MR A tiles and NR B
    tiles, all in the instruction's own register file."""
    return mr * nr + mr + nr if r.register_file else mr * nr + nr + 1


def _budget(isa: MmaIsa, r: MmaRecord, budget: int | None) -> int:
    """The register file a tile of ``r`` must fit: its own (AMX), else the caller's or the arch's."""
    return r.register_file or (isa.register_budget if budget is None else budget)


def _tile_candidates(r: MmaRecord, budget: int) -> list[tuple[int, int, int]]:
    """(MR, NR, registers) within the budget."""
    max_mr = 4 if r.register_file else 16
    return [(mr, nr, _registers(r, mr, nr)) for mr in range(1, max_mr + 1) for nr in range(1, 5)
            if _registers(r, mr, nr) <= budget]


def register_tile(isa: MmaIsa, sel: MmaSelection, budget: int | None = None,
                  prefer_tile: tuple[int, int] | None = None) -> RegisterTile:
    """Choose MR x NR instructions per register tile within the register budget."""
    r = sel.record
    budget = _budget(isa, r, budget)
    if r.target != "x86" or (r.vector_width is None and not r.register_file):
        raise MmaSelectorError(f"register_tile applies to CPU register records; {r.id} is a {r.family} "
                               "instruction (its warp/wave tile comes from the GPU schedule)")
    cands = _tile_candidates(r, budget)
    cal = _calibration().get(isa.arch, {}).get(r.id, {})
    scored = []
    for mr, nr, regs in cands:
        key = f"{mr}x{nr}"
        if key in cal:
            scored.append(RegisterTile(mr, nr, regs, float(cal[key]), "calibrated"))
        else:
            scored.append(RegisterTile(mr, nr, regs, _model_score(sel, mr, nr), "model"))
    if prefer_tile is not None:
        for t in scored:
            if (t.mr, t.nr) == tuple(prefer_tile):
                return t
        legal = sorted({(t.mr, t.nr) for t in scored})
        kind = "tile" if r.register_file else "vector"
        raise MmaSelectorError(
            f"register tile {prefer_tile[0]}x{prefer_tile[1]} of {r.id} needs {_registers(r, *prefer_tile)} {kind} "
            f"registers; {isa.arch} has {budget}. Legal MRxNR: {', '.join(f'{a}x{b}' for a, b in legal[:40])}"
            + ("..." if len(legal) > 40 else ""))
    # measured tiles outrank modelled ones only when measured; otherwise the model ranks
    calibrated = [t for t in scored if t.source == "calibrated"]
    pool = calibrated or scored
    return max(pool, key=lambda t: (t.score, -t.registers, t.mr))


def ranked_register_tiles(isa: MmaIsa, sel: MmaSelection, budget: int | None = None) -> list[RegisterTile]:
    budget = _budget(isa, sel.record, budget)
    out = [register_tile(isa, sel, budget, (mr, nr)) for mr, nr, _ in _tile_candidates(sel.record, budget)]
    return sorted(out, key=lambda t: -t.score)
