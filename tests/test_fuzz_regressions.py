"""Regressions from fuzzing (issue 26, section 3): each compiled against a float64 numpy oracle,
each refusal with a coded error naming the legal range; tessera-opt never says INTERNAL."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tessera as ts
from tessera.errors import ScheduleIllegalError, all_error_classes
from tessera.tools import opt

DOCUMENTED = {c.code for c in all_error_classes()}


def _softmax64(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _ln64(x, s):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * s


def test_residual_over_row_ops(rng):
    x = rng.standard_normal((5, 37)).astype(np.float32)
    s = rng.standard_normal(37).astype(np.float32)
    x64, s64 = x.astype(np.float64), s.astype(np.float64)
    np.testing.assert_allclose(ts.jit(lambda a: ts.ops.softmax(a) + a)(x), _softmax64(x64) + x64, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ts.jit(lambda a, b: ts.ops.layer_norm(a, b) * b)(x, s), _ln64(x64, s64) * s64,
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "reduce_mean"])
def test_half_reductions_accumulate_in_f32(rng, op, dtype):
    x = rng.standard_normal((6, 300)).astype(dtype)
    x64 = x.astype(np.float64)
    ref = {"reduce_sum": x64.sum(), "reduce_max": x64.max(), "reduce_mean": x64.mean()}[op]
    got = np.float64(ts.jit(lambda a: getattr(ts.ops, op)(a))(x).astype(np.float64))
    # f32 accumulation, one rounding to the 16-bit type at the end
    tol = 2 * float(np.finfo(dtype).eps) * max(abs(ref), 1.0) if op != "reduce_sum" else \
        2 * float(np.finfo(dtype).eps) * max(abs(ref), 1.0) + 1e-4 * np.abs(x64).sum()
    assert abs(got - ref) <= tol


def test_transpose_of_bool(rng):
    b = rng.standard_normal((5, 7)) > 0
    got = ts.jit(lambda a: ts.ops.transpose(a))(b)
    assert got.dtype == np.bool_ and (got == b.T).all()


@pytest.mark.parametrize("shape", [(8, 0), (0,), (-1,), (4, 0, 2), (0, 8)])
def test_reshape_of_empty(shape):
    z = np.zeros((0, 8), np.float32)
    assert ts.jit(lambda a: ts.ops.reshape(a, shape))(z).shape == np.reshape(z, shape).shape


def test_long_elementwise_chain(rng):
    x = rng.standard_normal((5, 7)).astype(np.float32)

    def f(y):
        for i in range(1000):
            y = y * 1.0001 if i % 2 else y + 0.001
        return y
    np.testing.assert_allclose(ts.jit(f)(x), f(x.astype(np.float64)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("key,ok,bad", [("unroll", 16, 17), ("threads", 256, 257), ("chunk", 64, 100000),
                                        ("tile_k", 8192, 8193)])
def test_schedule_bounds_in_jit(rng, key, ok, bad):
    x = rng.standard_normal((9, 40)).astype(np.float32)
    f = (lambda a: ts.ops.softmax(a)) if key == "chunk" else (lambda a: ts.ops.matmul(a, a.T))
    with pytest.raises(ScheduleIllegalError, match=r"legal"):
        ts.jit(f, schedule={key: bad})(x)
    if key in ("unroll", "chunk"):
        ts.jit(f, schedule={key: ok})(x)


def _opt(tmp_path, capsys, argv):
    rc = opt.main(argv)
    err = capsys.readouterr().err
    return rc, err


def _code(err: str) -> str:
    import re
    m = re.search(r"error\[([A-Z_0-9]+)\]", err)
    return m.group(1) if m else ""


def test_opt_refuses_big_unroll(tmp_path, capsys):
    rc, err = _opt(tmp_path, capsys, ["examples/mlp.mlir", "--pass-pipeline", "tessera-cpu{arch=znver4 unroll=100000}"])
    assert rc == 1 and _code(err) == "SCHEDULE_ILLEGAL" and "1..16" in err


def test_opt_hostile_files(tmp_path, capsys):
    mlp = open("examples/mlp.mlir", "rb").read()
    (tmp_path / "bad.mlir").write_bytes(b"func.func @main() {\xff}\n")
    (tmp_path / "bom.mlir").write_bytes(b"\xef\xbb\xbf" + mlp)
    (tmp_path / "deep.mlir").write_text("func.func @main() {" + "scf.execute_region {" * 2000 + "}" * 2001 + "\n")
    cases = {"bad.mlir": "IR_PARSE", "deep.mlir": "IR_NESTING"}
    for name, code in cases.items():
        rc, err = _opt(tmp_path, capsys, [str(tmp_path / name)])
        assert rc == 1 and _code(err) == code, err
    rc, err = _opt(tmp_path, capsys, [str(tmp_path / "bom.mlir")])
    assert rc == 0, err
    for out in ("/nonexistent-dir/x.mlir", str(tmp_path)):
        rc, err = _opt(tmp_path, capsys, ["examples/mlp.mlir", "-o", out])
        assert rc == 1 and _code(err) == "FILE_ACCESS", err


def test_opt_wrong_attribute_kind_and_internal_is_documented(tmp_path, capsys, monkeypatch):
    import sys
    sys.path.insert(0, "tests")
    from ir_samples import SAMPLES
    p = tmp_path / "k.mlir"
    p.write_text(SAMPLES["schedule.kernel"].replace("tiles = [1 : i64, 64 : i64]", 'tiles = ["a", 64 : i64]'))
    rc, err = _opt(tmp_path, capsys, [str(p)])
    assert rc == 1 and _code(err) == "SCHEDULE_VERIFY", err
    # teeth for the last resort: an unanticipated exception is INTERNAL, and INTERNAL is documented
    import tessera.tools.opt as o
    monkeypatch.setattr(o, "_run", lambda args: (_ for _ in ()).throw(ZeroDivisionError("planted")))
    rc, err = _opt(tmp_path, capsys, ["examples/mlp.mlir"])
    assert rc == 1 and _code(err) == "INTERNAL" and "INTERNAL" in DOCUMENTED
    assert "INTERNAL" in open("docs/errors.md").read()


# ---- found by tests/test_fuzz_programs.py and tests/test_opt_mutation.py
@pytest.mark.parametrize("shapes", [[(7, 1), (7, 1)], [(1,), (1,)], [(3, 65, 1), (65, 1)]])
def test_bf16_maximum_of_columns(rng, shapes):
    """A bf16 scalar broadcast (a size-1 last dim) was a bfloat scalar load + splat, which LLVM
    without AVX512-BF16 rounds back with __truncsfbf2: CODEGEN on every maximum of columns."""
    a, b = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in shapes)
    got = ts.jit(lambda x, y: ts.ops.maximum(ts.ops.silu(x), y))(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.maximum(a64 / (1 + np.exp(-a64)), b64)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2 ** -7, atol=1e-6)


def test_opt_unterminated_string_is_refused_at_once(tmp_path, capsys):
    """xDSL's string-literal regex backtracked exponentially on a quote left open (a 100-character
    line hung tessera-opt for hours); the parser uses a linear one with the same language."""
    import signal

    from tessera.ir import text
    from xdsl.utils.mlir_lexer import MLIRLexer
    for s in ['"abc"', '"a\\"b"', '"\\n\\t\\\\"', '"\\7f"', '""', '"a\\q"', '"abc', '"a\nb"']:
        ours, theirs = text._STRING_LITERAL.match(s), MLIRLexer._unescaped_characters_regex.match(s)
        assert (ours and ours.group()) == (theirs and theirs.group()), s
    p = tmp_path / "q.mlir"
    mlp = open("examples/mlp.mlir").read()
    p.write_text(mlp.replace("!tessera.tensor<[M, K], f32>", '!tessera.ten"sor<[M, K], f32>', 1))
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("tessera-opt hung")))
    signal.alarm(20)
    try:
        rc, err = _opt(tmp_path, capsys, [str(p)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert rc == 1 and _code(err) == "IR_PARSE" and "string literal" in err, err


def test_opt_launch_of_a_missing_kernel(tmp_path, capsys):
    """tile.launch of a symbol the module does not define: a PASS_FAILED that says so, not a
    KeyError wrapped by the pipeline."""
    import sys
    sys.path.insert(0, "tests")
    from ir_samples import SAMPLES
    p = tmp_path / "l.mlir"
    p.write_text(SAMPLES["tile.launch"])
    rc, err = _opt(tmp_path, capsys, [str(p), "--pass-pipeline", "tessera-cpu{arch=znver4 input=tile}"])
    assert rc == 1 and _code(err) == "PASS_FAILED" and "no tile kernel @k0" in err and "KeyError" not in err, err


def test_opt_constant_beyond_its_type(tmp_path, capsys):
    """dense<4294967296> : tensor<f16> raised OverflowError from xDSL's packing: INTERNAL."""
    p = tmp_path / "c.mlir"
    p.write_text("func.func @f() -> (!tessera.tensor<[], f16>) {\n"
                 "  %r = tessera.constant {value = dense<4294967296> : tensor<f16>} : !tessera.tensor<[], f16>\n"
                 "  func.return %r : !tessera.tensor<[], f16>\n}\n")
    rc, err = _opt(tmp_path, capsys, [str(p)])
    assert rc == 1 and _code(err) == "IR_PARSE" and ":2:" in err, err


@pytest.mark.parametrize("axis", ["2147483647 : f16", "1.0 : f32"])
def test_opt_float_where_an_integer_belongs(tmp_path, capsys, axis):
    """axes = [2147483647 : f16] is a float attribute (inf): int() of it raised OverflowError in the
    verifier (INTERNAL); 1.0 : f32 was read as axis 1.  Both are malformed attributes."""
    import sys
    sys.path.insert(0, "tests")
    from ir_samples import SAMPLES
    p = tmp_path / "r.mlir"
    text = SAMPLES["tessera.reduce_mean"]
    assert "axes = [0 : i64]" in text
    p.write_text(text.replace("axes = [0 : i64]", f"axes = [{axis}]"))
    rc, err = _opt(tmp_path, capsys, [str(p)])
    assert rc == 1 and _code(err) == "IR_VERIFY" and "integer attribute" in err, err


def test_use_before_definition_is_refused_by_the_verifier(tmp_path, capsys):
    """A tessera-opt mutant whose ops used each other's results in a cycle (%a = mul %p ...;
    %p = softmax %a) passed verification and failed in lower-schedule-to-tile with
    ``PASS_FAILED: KeyError``; it is IR_VERIFY at the use now."""
    src = tmp_path / "cycle.mlir"
    T = "!tessera.tensor<[M, N], f32>"
    src.write_text(f"func.func @main(%x : {T}) -> {T} {{\n"
                   f"  %a = tessera.mul %p, %x : ({T}, {T}) -> {T}\n"
                   f"  %p = tessera.softmax %a {{axis = -1 : i64}} : ({T}) -> {T}\n"
                   f"  func.return %p : {T}\n}}\n")
    rc, err = _opt(tmp_path, capsys, [str(src), "--pass-pipeline", "tessera-cpu{arch=znver4}"])
    assert rc == 1 and _code(err) == "IR_VERIFY" and f"{src}:2:3:" in err and "used before" in err, err


def test_opt_function_of_two_blocks_is_a_verify_error(tmp_path, capsys):
    """A mutant whose body gained a second block (a duplicated ``^bb0`` line) crashed
    lower-schedule-to-tile (PASS_FAILED wrapping xDSL's ValueError); it is IR_VERIFY now."""
    import sys
    sys.path.insert(0, "tests")
    from ir_samples import SAMPLES
    text = SAMPLES["schedule.kernel"]
    assert text.rstrip().endswith("}")
    p = tmp_path / "two.mlir"
    p.write_text(text.rstrip()[:-1] + "  ^bb1(%z : f32):\n}\n")
    rc, err = _opt(tmp_path, capsys, [str(p), "--pass-pipeline", "tessera-nvidia{arch=sm_90 input=schedule}"])
    assert rc == 1 and _code(err) == "IR_VERIFY" and "one (no control flow" in err, err
