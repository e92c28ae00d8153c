"""One error hierarchy with stable codes.

Every error Tessera raises on purpose is a :class:`TesseraError` subclass whose
``code`` never changes once published.  ``docs/errors.md`` is generated from this
module (``tessera docs errors``) and drift-tested, so the table below the classes is
the documentation.

A location, when known, is the user's source position: a line of the Python
function being traced, or ``file:line:col`` of an IR text file.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class SourceLocation:
    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}" if self.col else f"{self.file}:{self.line}"


class TesseraError(Exception):
    """Base class of every error Tessera raises on purpose."""

    code: ClassVar[str] = "TESSERA"
    area: ClassVar[str] = "general"

    def __init__(self, message: str, *, location: SourceLocation | None = None,
                 op: object | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location
        self.op = op
        self.hint = hint

    def with_location(self, location: SourceLocation | None) -> "TesseraError":
        if self.location is None and location is not None:
            self.location = location
        return self

    def __str__(self) -> str:
        text = f"error[{self.code}]: {self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        if self.location is not None:
            text = f"{self.location}: {text}"
        return text


# --------------------------------------------------------------------------- IR text
class IRParseError(TesseraError):
    """IR text could not be parsed (syntax error, unknown op or type)."""
    code = "IR_PARSE"
    area = "ir"


class IRNestingError(IRParseError):
    """IR text nests regions, blocks or types deeper than the parser follows (a few hundred levels)."""
    code = "IR_NESTING"


class FileAccessError(TesseraError):
    """A file named on the command line could not be read or written (missing, a directory, no permission)."""
    code = "FILE_ACCESS"
    area = "ir"


class IRVerifyError(TesseraError):
    """An op failed a structural verifier that has no more specific code."""
    code = "IR_VERIFY"
    area = "ir"


# --------------------------------------------------------------------------- Graph IR
class GraphVerifyError(IRVerifyError):
    """A Graph IR op is malformed."""
    code = "GRAPH_VERIFY"
    area = "graph"


class GraphShapeError(GraphVerifyError):
    """Operand shapes are incompatible for the op (matmul inner dims, broadcasting, axes)."""
    code = "GRAPH_SHAPE"


class AttentionHeadDimError(GraphShapeError):
    """Attention: q and k head dimensions differ (or v's sequence differs from k's)."""
    code = "ATTENTION_HEAD_DIM"


class AttentionSeqError(GraphShapeError):
    """Attention: k and v have different sequence lengths (or batch)."""
    code = "ATTENTION_SEQ"


class AttentionHeadsError(GraphShapeError):
    """Attention: the number of query heads is not a multiple of the key/value heads."""
    code = "ATTENTION_HEADS"


class AttentionMaskError(GraphShapeError):
    """Attention: the mask does not broadcast to [batch, heads, seq_q, seq_k] or has an unsupported dtype."""
    code = "ATTENTION_MASK"


class GraphDtypeError(GraphVerifyError):
    """Operand or result element types are not allowed for the op, or disagree."""
    code = "GRAPH_DTYPE"


class GraphRankError(GraphVerifyError):
    """An operand has a rank the op does not accept."""
    code = "GRAPH_RANK"


class GraphAttributeError(GraphVerifyError):
    """An op attribute is missing or out of range (axis, permutation, approximation...)."""
    code = "GRAPH_ATTRIBUTE"


class GraphResultTypeError(GraphVerifyError):
    """The declared result type differs from the type the op's operands imply."""
    code = "GRAPH_RESULT_TYPE"


# --------------------------------------------------------------------------- Schedule IR
class ScheduleVerifyError(IRVerifyError):
    """A schedule.kernel op carries an inconsistent schedule."""
    code = "SCHEDULE_VERIFY"
    area = "schedule"


class ScheduleIllegalError(TesseraError):
    """A user-pinned schedule (tile sizes, register tile, parallel loop, threads) is illegal."""
    code = "SCHEDULE_ILLEGAL"
    area = "schedule"


class SpecializeRequest(ScheduleIllegalError):
    """A kernel generator needs some symbolic sizes fixed (the GPU attention kernel's head
    dims size its registers).  ``tessera.jit`` / ``compile`` specialise the named dims and
    compile again; from ``tessera-opt`` on IR with those dims symbolic it is the error."""
    code = "SPECIALIZE"

    def __init__(self, message: str, *, symbols=(), **kw):
        super().__init__(message, **kw)
        self.symbols = tuple(symbols)


# --------------------------------------------------------------------------- Tile IR
class TileVerifyError(IRVerifyError):
    """A Tile IR op is malformed."""
    code = "TILE_VERIFY"
    area = "tile"


class TileMmaOperandRole(TileVerifyError):
    """tile.mma operands must be fragments of roles a, b, acc in that order."""
    code = "TILE_MMA_OPERAND_ROLE"


class TileMmaShapeMismatch(TileVerifyError):
    """tile.mma operands disagree on the (m, n, k) shape."""
    code = "TILE_MMA_SHAPE_MISMATCH"


class TileMmaFamilyMismatch(TileVerifyError):
    """tile.mma operands belong to different instruction families."""
    code = "TILE_MMA_FAMILY_MISMATCH"


class TileMmaAccumMismatch(TileVerifyError):
    """The accumulator fragment's element type differs from the declared accumulator type."""
    code = "TILE_MMA_ACCUM_MISMATCH"


class TileMmaResultType(TileVerifyError):
    """tile.mma's result type differs from its accumulator operand's type."""
    code = "TILE_MMA_RESULT_TYPE"


class TileMmaUntypedOperand(TileVerifyError):
    """A tile.mma operand is not a !tile.fragment (there is no untyped form)."""
    code = "TILE_MMA_UNTYPED_OPERAND"


class TileFragmentZeroRole(TileVerifyError):
    """tile.fragment_zero must produce a fragment of role acc."""
    code = "TILE_FRAGMENT_ZERO_ROLE"


class TileFragmentUnpackRole(TileVerifyError):
    """tile.fragment_unpack takes an acc fragment only."""
    code = "TILE_FRAGMENT_UNPACK_ROLE"


class TileFragmentRoleDisagrees(TileVerifyError):
    """A packed fragment's role differs from the operand slot that uses it."""
    code = "TILE_FRAGMENT_ROLE_DISAGREES"


class TileFragmentPackShape(TileVerifyError):
    """tile.fragment_pack's view shape is not the data shape of the fragment's role."""
    code = "TILE_FRAGMENT_PACK_SHAPE"


class TileShapeMismatch(TileVerifyError):
    """Tile values of an elementwise/reduce/store op have incompatible shapes."""
    code = "TILE_SHAPE_MISMATCH"


class TileMemorySpaceError(TileVerifyError):
    """An op reads or writes a memory space it may not (e.g. async_copy into global)."""
    code = "TILE_MEMORY_SPACE"


# --------------------------------------------------------------------------- Target IR
class TargetVerifyError(IRVerifyError):
    """A Target IR op is malformed."""
    code = "TARGET_VERIFY"
    area = "target"


# --------------------------------------------------------------------------- passes
class PipelineError(TesseraError):
    """A pass pipeline string is malformed."""
    code = "PIPELINE_SYNTAX"
    area = "passes"


class PipelineUnknownPass(PipelineError):
    """A pipeline names a pass that is not registered."""
    code = "PIPELINE_UNKNOWN_PASS"


class PipelineUnknownOption(PipelineError):
    """A pipeline gives a pass an option it does not declare."""
    code = "PIPELINE_UNKNOWN_OPTION"


class PipelineOptionType(PipelineError):
    """A pass option has a value of the wrong type."""
    code = "PIPELINE_OPTION_TYPE"


class PipelineMissingOption(PipelineError):
    """A required pass option (e.g. a target lowering's arch) is absent."""
    code = "PIPELINE_MISSING_OPTION"


class PassFailedError(TesseraError):
    """A pass could not transform its input."""
    code = "PASS_FAILED"
    area = "passes"


class UnloweredOpsError(PassFailedError):
    """Ops of a higher layer survived to translation: the pipeline lacks their lowering."""
    code = "UNLOWERED_OPS"


class CompilerInternalError(PassFailedError):
    """The compiler failed on a program it accepted (a Python exception inside a pass or the
    translation, not a refusal with its own code).  The message names a reproducer file: the
    Graph IR, the pass pipeline and the target, replayable with ``tessera-opt``."""
    code = "COMPILER_INTERNAL"


# --------------------------------------------------------------------------- MMA selector
class MmaSelectorError(TesseraError):
    """An MMA request is illegal for the target/arch; the message lists what is legal."""
    code = "MMA_SELECTOR"
    area = "mma"


class MmaNoLoweringError(MmaSelectorError):
    """The selected instruction has no lowering yet (a capability without a producer)."""
    code = "MMA_NO_LOWERING"


class UnknownArchError(TesseraError):
    """An unknown target or arch was named; the message lists the known ones."""
    code = "ARCH_UNKNOWN"
    area = "mma"


# --------------------------------------------------------------------------- frontend
class FrontendError(TesseraError):
    """The traced Python function cannot be compiled."""
    code = "FRONTEND"
    area = "frontend"


class ScalarSpecialize(FrontendError):
    """While tracing, user code read a Python-number argument as a Python value (``float(s)``,
    ``if s > 0``, a size, an axis, an ``eps=``): ``tessera.jit`` specialises on that argument's
    value and traces again, so a caller sees this only from a bare trace."""
    code = "SPECIALIZE_SCALAR"

    def __init__(self, message: str, *, indices=(), **kw):
        super().__init__(message, **kw)
        self.indices = frozenset(indices)


class RecompileWarning(UserWarning):
    """A jitted function has been compiled many times (``tessera.jit.RECOMPILE_WARNING_AFTER``);
    the warning names the causes (new dtypes, sizes, values compiled in)."""


class UnsupportedConstructError(FrontendError):
    """The function uses a Python construct that cannot be traced (data-dependent control flow...)."""
    code = "UNSUPPORTED_CONSTRUCT"


class UnknownNameError(UnsupportedConstructError, AttributeError):
    """A name looked up on ``tessera.ops`` or on a traced tensor does not exist; the message names
    the nearest existing ones.  It is also an ``AttributeError``, so ``hasattr`` answers False."""
    code = "UNKNOWN_NAME"


class ShapeMismatchError(FrontendError):
    """Argument or operand shapes are incompatible."""
    code = "SHAPE_MISMATCH"


class RankMismatchError(FrontendError):
    """An operand has the wrong rank for the op."""
    code = "RANK_MISMATCH"


class DtypeError(FrontendError):
    """A dtype is unsupported or operands' dtypes disagree."""
    code = "DTYPE_UNSUPPORTED"


class Fp8OperandError(DtypeError):
    """fp8 (e4m3 / e5m2) arrays are matmul operands only, on both sides, and the product is
    never fp8 (f32, bf16 or f16 out); other ops refuse them (cast with ``.astype``)."""
    code = "FP8_OPERAND"


class ScaleError(FrontendError):
    """A ``scaled_matmul`` scale is not a scalar: a Python number or a 0-d float32 array."""
    code = "SCALED_MATMUL_SCALE"


class ArgumentError(FrontendError):
    """A call's arguments do not fit the compiled function (count, type, layout)."""
    code = "BAD_ARGUMENT"


class DynamicShapeError(FrontendError):
    """An op along a ``tessera.jit(dynamic=...)`` axis that padding and masking cannot keep exact.

    A reshape merging the axis, a slice, pad or gather along it, conv or layer_norm over it, or
    its size read as a Python number; the message names the op and its line."""
    code = "DYNAMIC_SHAPE"


class RequiresGradError(ArgumentError):
    """A torch tensor that requires grad was passed to a jitted function: a silent detach would lose its gradient."""
    code = "REQUIRES_GRAD"


class DeviceArrayError(ArgumentError):
    """An argument lives in device memory (``__dlpack_device__`` CUDA, ROCm, ...) that the function's lane cannot read."""
    code = "DEVICE_ARRAY"


class DeviceMismatchError(DeviceArrayError):
    """Device arrays of one call on different devices, or on a device other than the lane's (its id, or an arch the binary was not built for)."""
    code = "DEVICE_MISMATCH"


class DeviceHostMixError(DeviceArrayError):
    """A GPU-lane call mixes device arrays with host arrays (all on the device, or all on the host; Python numbers are fine)."""
    code = "DEVICE_HOST_MIX"


class DeviceLayoutError(DeviceArrayError):
    """A device array whose layout one device copy cannot make dense (a transpose, a broadcast, a mask, a misaligned address)."""
    code = "DEVICE_LAYOUT"


class DonationError(ArgumentError):
    """A donated argument (``tessera.jit(donate_argnums=...)``) cannot be written: it is read-only
    (a read-only numpy array, one donated and consumed by an earlier call, a DLPack tensor whose
    producer marks it read-only or does not say, a JAX array) or it shares memory with another
    argument (writing it would change an argument that was not donated)."""
    code = "BAD_DONATION"


class TorchBackendMismatchError(FrontendError):
    """The ``torch.compile(backend="tessera")`` check found a Tessera subgraph whose result differs
    from ATen's (a wrong op mapping): raised, never a silent wrong result (the message names the
    subgraph and its ATen ops)."""
    code = "TORCH_BACKEND_MISMATCH"


class OnnxImportError(FrontendError):
    """An ONNX model cannot be read: a corrupt file, no default-domain opset, a malformed graph (``tessera.onnx``)."""
    code = "ONNX_IMPORT"


class OnnxUnsupportedError(OnnxImportError):
    """An ONNX node uses an op, an op version, an attribute or an input count that ``tessera.onnx`` does not map; the message lists every such node (name, op type, reason)."""
    code = "ONNX_UNSUPPORTED"


class GradError(FrontendError):
    """``tessera.grad`` / ``value_and_grad`` / ``vjp`` cannot differentiate what it was given."""
    code = "GRAD"


class GradNoRuleError(GradError):
    """The gradient would flow through an op that has no vjp rule yet (the message names the op):
    it is refused, never given a zero gradient."""
    code = "GRAD_NO_RULE"


class GradNonScalarError(GradError):
    """``grad`` / ``value_and_grad`` of a function whose output is not a float scalar (use
    ``vjp`` with a cotangent for other outputs, as in JAX)."""
    code = "GRAD_NON_SCALAR"


class GradDtypeError(GradError):
    """A gradient was asked for an integer, bool or non-array argument: it has none."""
    code = "GRAD_DTYPE"


class GradArgnumsError(GradError):
    """``argnums`` is not an argument position (an int, or a tuple of ints, in range)."""
    code = "GRAD_ARGNUMS"


# --------------------------------------------------------------------------- codegen / runtime
class CodegenError(TesseraError):
    """Translation to machine code failed."""
    code = "CODEGEN"
    area = "codegen"


class LLVMAbortError(CodegenError):
    """LLVM aborted while compiling (caught in a subprocess guard)."""
    code = "LLVM_ABORT"


class ToolchainMissingError(CodegenError):
    """An external tool (ptxas, ld.lld) needed for this artifact is not installed."""
    code = "TOOLCHAIN_MISSING"


class ExportError(CodegenError):
    """Ahead-of-time export (``tessera.export``) refused; the message says why.

    A GPU or reference lane, sizes not fixed at export time (``dynamic=``), a dtype with no C type,
    AMX kernels, a name that is not a C identifier, or the link failed."""
    code = "EXPORT"


class TensorMapError(CodegenError):
    """A tensor map (the copy engine's description of a global tensor, sm_90a) cannot be encoded for
    these arrays: a row stride not a multiple of 16 bytes, an address not 16-byte aligned, a box or
    dims out of the engine's range.  Refused before any launch (and at compile time for static shapes)."""
    code = "TENSOR_MAP"


class LaneUnavailableError(TesseraError):
    """The compiled lane cannot run on this machine (no such device); no other lane is substituted."""
    code = "LANE_UNAVAILABLE"
    area = "runtime"


class SharedMemoryLimitError(LaneUnavailableError):
    """A kernel asks for more shared memory per block than this GPU allows (its opt-in maximum): refused before any launch."""
    code = "SHARED_MEMORY_LIMIT"


class EmulatorError(TesseraError):
    """The GPU emulator found the kernel doing something the hardware would not allow."""
    code = "EMULATE"
    area = "emulator"


class EmulatorFaultError(EmulatorError):
    """A lane read or wrote outside its buffer (a masking bug in the kernel)."""
    code = "EMULATE_OUT_OF_BOUNDS"
    area = "emulator"


class EmulatorRaceError(EmulatorError):
    """Two threads of a workgroup touched one shared-memory element with no barrier between
    (or a thread read shared memory that a copy still in flight will write)."""
    code = "EMULATE_RACE"
    area = "emulator"


class EmulatorAlignError(EmulatorError):
    """An access is not aligned as its instruction promised."""
    code = "EMULATE_MISALIGNED"
    area = "emulator"


class EmulatorDivergenceError(EmulatorError):
    """A wave-wide instruction or a barrier ran with only part of its wave or workgroup active,
    or lanes disagree where the instruction needs them to agree (replicated operands)."""
    code = "EMULATE_DIVERGENT"
    area = "emulator"


class OutOfMemoryError(TesseraError):
    """A result or workspace is larger than the memory this process may use."""
    code = "OUT_OF_MEMORY"
    area = "runtime"


class InternalError(TesseraError):
    """A defect in Tessera: an exception no check anticipated (its type and message follow). Please
    report it with the input that caused it; the input may be valid."""
    code = "INTERNAL"
    area = "general"


class CacheError(TesseraError):
    """A compile-cache entry is unusable (it is discarded and recompiled; raised only if that fails)."""
    code = "CACHE"
    area = "runtime"


class CacheUntrustedError(CacheError):
    """The compile-cache directory or an entry in it is owned by another user (or the directory is
    writable by others): entries are unpickled, so it is refused rather than read."""
    code = "CACHE_UNTRUSTED"


class CacheSizeError(CacheError):
    """A cache size (``TESSERA_CACHE_MAX``, ``tessera cache prune --max-size``) cannot be read."""
    code = "CACHE_SIZE"


class TuneError(TesseraError):
    """The autotuner cannot rank a kernel's schedule candidates: none compiled or ran, or the
    machine is too noisy (the best candidate's timing spread exceeds the threshold)."""
    code = "TUNE"
    area = "runtime"


class TuneWarning(UserWarning):
    """``tessera.jit(tune=True)`` could not rank the candidates (a ``TuneError``: too noisy, or none
    ran): the call compiles with the cost model's schedule and nothing is recorded."""


class TuningDatabaseWarning(UserWarning):
    """The tuning database (``tuning.sqlite`` in the cache directory) was unreadable or of another
    schema: it is set aside and rebuilt empty."""


class BenchLogError(TesseraError):
    """A benchmark log (``benchmarks/results/cpu/<host>/*.json``) is unreadable or malformed."""
    code = "BENCH_LOG"
    area = "tools"


class BenchMismatchError(TesseraError):
    """A benchmarked implementation's result differs from the float64 oracle: it is not timed.

    (``tessera bench train`` checks every implementation's result before timing it.)"""
    code = "BENCH_MISMATCH"
    area = "tools"


def all_error_classes() -> list[type[TesseraError]]:
    """Every TesseraError class defined in Tessera, in definition order, base first."""
    seen: list[type[TesseraError]] = []

    def walk(cls: type[TesseraError]) -> None:
        if cls not in seen:
            seen.append(cls)
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("tessera"):
                walk(sub)

    walk(TesseraError)
    return seen


def error_for_code(code: str) -> type[TesseraError]:
    for cls in all_error_classes():
        if cls.code == code:
            return cls
    raise KeyError(code)
