"""Legal ranges of the schedule options, shared by ``schedule-cpu`` / ``schedule-gpu`` (checked when a
pipeline is parsed, so ``tessera-opt`` refuses before any IR is read) and ``tessera.jit(schedule=...)``.

Each bound is what a target can use; beyond it a pin only makes the compiler slower and the code
larger (``unroll=100000`` once ran for minutes and past 4 GB):

- ``unroll``: the gemm/attention k loop, 1..16 (16 x a 6x4 register tile is 384 FMAs per step;
  measured gains stop at 4);
- ``chunk``: columns per step of row kernels, a multiple of the vector width W up to the vector
  register file (W x 16 on AVX2, W x 32 on AVX-512: 128 / 512 floats); the arch-free check allows
  the widest (512), the pass the arch's;
- ``threads``: 1..256 workers per kernel;
- ``split``: 1..256 (the Schedule IR verifier's per-kind range: gemm row chunks per thread at
  least 1..16, decode attention key chunks per (batch, kv head) at most 1..256); a decode
  kernel's key block (``tile-n``) 16..2048 (``DECODE_BLOCK_RANGE``);
- ``tile-m`` / ``tile-k`` (CPU): at most 8192, ``tile-n`` at most 65536, and the packing
  buffers of one gemm kernel (a tile-m x tile-k A block per thread, a tile-k x tile-n B panel) at
  most 1 GiB;
- GPU: ``tile-m`` / ``tile-n`` at most 1024 (a workgroup has at most 1024 threads), ``tile-k`` at
  most 1024, ``staging`` 1..4 (shared memory and register budgets are checked per arch);
- ``register-tile`` two values and ``mma-shape`` three, each at most 64 / 256 (the selector checks
  the register budget of the arch).

Generated code is capped separately: a kernel whose Tile IR would expand to more than
``CODE_VECTORS_MAX`` vector operations is refused by ``lower-tile-to-x86``.
"""
from __future__ import annotations

from tessera.errors import ScheduleIllegalError
from tessera.ir.schedule import SPLIT_MAX

UNROLL_MAX = 16
THREADS_MAX = 256
CHUNK_MAX = 512               # floats: 32 AVX-512 registers of 16 lanes
CPU_TILE_MAX = {"tile_m": 8192, "tile_n": 65536, "tile_k": 8192}
GPU_TILE_MAX = {"tile_m": 1024, "tile_n": 1024, "tile_k": 1024}
STAGING_RANGE = (1, 4)
WORKSPACE_MAX = 1 << 30       # bytes of gemm packing buffers per kernel
REGISTER_TILE_MAX = 64
MMA_SHAPE_MAX = 256
CODE_VECTORS_MAX = 1 << 17    # vector operations one kernel may expand to
DECODE_BLOCK_RANGE = (16, 2048)   # keys per block of the decode kernel (its S^T scratch: block x rows)


def _spell(key: str) -> str:
    return key.replace("_", "-")


def _range(key: str, v: int, lo: int, hi: int, where: str = "") -> None:
    if not lo <= v <= hi:
        raise ScheduleIllegalError(f"{where}schedule {_spell(key)}={v} is out of range; legal: {lo}..{hi}")


def check_static(values: dict, target: str = "cpu", where: str = "") -> None:
    """The arch-independent ranges of schedule options (``values`` keyed by field name; 0, "" and ()
    mean "not pinned").  Raises ``ScheduleIllegalError`` naming the legal range."""
    gpu = target in ("rocm", "nvidia")
    tiles = GPU_TILE_MAX if gpu else CPU_TILE_MAX
    for key, v in values.items():
        if v in (None, 0, "", ()):
            continue
        if key == "unroll":
            _range(key, v, 1, UNROLL_MAX, where)
        elif key == "threads":
            _range(key, v, 1, THREADS_MAX, where)
        elif key == "split":
            _range(key, v, 1, max(SPLIT_MAX.values()), where)
        elif key == "chunk":
            _range(key, v, 1, CHUNK_MAX, where)
        elif key in tiles:
            _range(key, v, 1, tiles[key], where)
        elif key == "staging":
            _range(key, v, *STAGING_RANGE, where)
        elif key == "register_tile":
            if len(v) != 2 or not all(1 <= i <= REGISTER_TILE_MAX for i in v):
                raise ScheduleIllegalError(f"{where}schedule register-tile={','.join(map(str, v))}: two values "
                                           f"(MR,NR), each in 1..{REGISTER_TILE_MAX}")
        elif key == "mma_shape":
            if len(v) != 3 or not all(1 <= i <= MMA_SHAPE_MAX for i in v):
                raise ScheduleIllegalError(f"{where}schedule mma-shape={','.join(map(str, v))}: three values "
                                           f"(M,N,K), each in 1..{MMA_SHAPE_MAX}")


def check_chunk(chunk: int, w: int, registers: int, name: str) -> None:
    """A row kernel's column chunk: a multiple of the vector width within the register file."""
    hi = w * registers
    if chunk % w or not w <= chunk <= hi:
        raise ScheduleIllegalError(f"kernel {name}: schedule chunk={chunk} is illegal; legal: a multiple of the "
                                   f"vector width {w} in {w}..{hi} ({registers} vector registers)")


def check_workspace(name: str, threads: int, mc: int, nc: int, kc: int, esize: int) -> None:
    """The gemm packing buffers (an MC x KC A block per thread, a KC x NC B panel) fit the cap."""
    total = (threads * mc * kc + kc * nc) * esize
    if total > WORKSPACE_MAX:
        raise ScheduleIllegalError(
            f"kernel {name}: tile-m={mc}, tile-n={nc}, tile-k={kc} on {threads} threads need {total} bytes of "
            f"packing buffers; at most {WORKSPACE_MAX} (legal: (threads * tile-m * tile-k + tile-k * tile-n) * "
            f"{esize} <= {WORKSPACE_MAX})")


def code_vectors(fn) -> int:
    """An estimate of the vector operations a Tile IR kernel function expands to: each tile-typed
    result of R x C elements is R * ceil(C / w) vector registers' worth of work; any other op one."""
    from tessera.ir import tile as t

    w = 16
    vec = fn.attributes.get("vector")
    if vec is not None:
        w = max(1, vec.value.data)
    total = 0
    for op in fn.walk():
        n = 1
        for r in op.results:
            if isinstance(r.type, t.TileType):
                rows, cols = r.type.dims
                n = max(n, rows * -(-cols // w))
        total += n
    return total


def check_code_size(fn, name: str) -> None:
    """Refuse a kernel whose generated code would exceed ``CODE_VECTORS_MAX`` vector operations
    (a schedule IR file can carry any tile size or unroll; the options are bounded, this is the cap)."""
    n = code_vectors(fn)
    if n > CODE_VECTORS_MAX:
        raise ScheduleIllegalError(f"kernel {name} would expand to about {n} vector operations; at most "
                                   f"{CODE_VECTORS_MAX} (pin a smaller chunk / unroll, or split the program)")
