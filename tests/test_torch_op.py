"""``tessera.torch.op``: a jitted function as a torch custom op (issue 29).

Numbers against float64 oracles; ``torch.library.opcheck`` on the shipped example
(examples/torch_op.py); ``torch.compile(fullgraph=True)`` against eager, with dynamic sizes
reaching the fake implementation as SymInts; planted wrong fake shapes are caught.  Gradients
(the autograd formula from ``tessera.vjp``): float32 against float64 torch autograd of the same
formula, ``torch.autograd.gradcheck`` in float64, opcheck with inputs that require grad
(``test_aot_dispatch_dynamic`` traces the backward op), a planted wrong vjp caught, a missing
vjp rule refused with GRAD_NO_RULE.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import tessera as ts
from oracle import assert_close, f64, gelu_tanh
from tessera.errors import ArgumentError, GradNoRuleError
from tessera.frontend import differentiate as D
from tessera.frontend import torch_op, torch_op_grad

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("torch_op_example", ROOT / "examples" / "torch_op.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)   # registers tessera_examples::mlp, ::scale, ::moments

OPS = {"mlp": example.mlp_op, "scale": example.scale_op, "moments": example.moments_op}


def _args(rng, which, rows=6):
    t = lambda *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    return {"mlp": (t(rows, 5), t(5, 7), t(7)), "scale": (t(rows, 4), 0.75), "moments": (t(rows, 9),)}[which]


def _oracle(which, args):
    a = [f64(x.numpy()) if isinstance(x, torch.Tensor) else x for x in args]
    if which == "mlp":
        return (gelu_tanh(a[0] @ a[1] + a[2]),)
    if which == "scale":
        return (a[0] * a[1],)
    return a[0].mean(axis=1), (a[0] ** 2).mean(axis=1)


@pytest.mark.parametrize("which", list(OPS))
def test_op_matches_oracle_and_opcheck(rng, which):
    args = _args(rng, which)
    out = OPS[which](*args)
    outs = out if isinstance(out, tuple) else (out,)
    for o, want in zip(outs, _oracle(which, args), strict=True):
        assert isinstance(o, torch.Tensor) and o.dtype == torch.float32
        assert_close(o.numpy(), want, 1e-5, which)
    # inputs that require grad: test_aot_dispatch_dynamic traces the backward (the _vjp op) too
    grad_args = [a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    res = torch.library.opcheck(OPS[which], grad_args)
    assert set(res.values()) == {"SUCCESS"} and "test_aot_dispatch_dynamic" in res, res


def test_fake_shapes_have_teeth(rng, monkeypatch):
    """A fake implementation that gets a size wrong is caught by opcheck."""
    real = torch_op.result_types

    def wrong(jitfn, args):
        return [((shape[0] + 1, *shape[1:]), d) for shape, d in real(jitfn, args)]
    monkeypatch.setattr(torch_op, "result_types", wrong)
    with pytest.raises(Exception, match="(?i)shape|size"):
        torch.library.opcheck(example.mlp_op, _args(rng, "mlp"), test_utils=("test_faketensor",))


def test_torch_compile_fullgraph_and_dynamic_sizes(rng, monkeypatch):
    seen = []
    real = torch_op.result_types

    def spy(jitfn, args):
        out = real(jitfn, args)
        seen.append(any(isinstance(s, torch.SymInt) for shape, _ in out for s in shape))
        return out
    monkeypatch.setattr(torch_op, "result_types", spy)

    def model(x, w, b):
        return torch.relu(example.mlp_op(x, w, b)) * 2 + 1
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for rows in (6, 11):
        args = _args(rng, "mlp", rows)
        got = compiled(*args)
        a = [f64(x.numpy()) for x in args]
        assert_close(got.numpy(), np.maximum(gelu_tanh(a[0] @ a[1] + a[2]), 0) * 2 + 1, 1e-5, f"rows={rows}")
    assert seen and any(seen)   # the fake implementation saw symbolic sizes and kept them


def test_results_never_alias_inputs(rng):
    ident = ts.torch.op(lambda x: x, name="tessera_tests::ident")
    x = _args(rng, "moments")[0]
    y = ident(x)
    assert not torch_op._overlaps(y, x) and torch.equal(y, x)
    assert torch_op._overlaps(x[1:], x) and not torch_op._overlaps(x.clone(), x)   # the check itself
    assert set(torch.library.opcheck(ident, (x,)).values()) == {"SUCCESS"}


def test_bad_registrations_are_coded():
    with pytest.raises(ArgumentError):
        ts.torch.op(lambda x: x, name="no_namespace")
    with pytest.raises(ArgumentError):
        ts.torch.op(lambda x: x, name="tessera_tests::twice", outputs=0)
    with pytest.raises(ArgumentError):
        ts.torch.op(ts.jit(lambda x: x, target="nvidia", arch="sm_90"), name="tessera_tests::gpu")


def _torch64(which, args):
    """The op's formula in float64 torch (autograd's gradients are the oracle)."""
    if which == "mlp":
        return (torch.nn.functional.gelu(args[0] @ args[1] + args[2], approximate="tanh"),)
    if which == "scale":
        return (args[0] * args[1],)
    return args[0].mean(dim=1), (args[0] * args[0]).mean(dim=1)


def _grads(fn, args, cts):
    ins = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
    out = fn(*ins)
    outs = out if isinstance(out, tuple) else (out,)
    sum((o * c).sum() for o, c in zip(outs, cts)).backward()
    return [a.grad for a in ins if isinstance(a, torch.Tensor)]


@pytest.mark.parametrize("which", list(OPS))
def test_gradients_match_float64(rng, which):
    args = _args(rng, which)
    outs = OPS[which](*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    cts = [torch.from_numpy(rng.standard_normal(tuple(o.shape)).astype(np.float32)) for o in outs]
    got = _grads(OPS[which], args, cts)
    want = _grads(lambda *a: _torch64(which, a), [a.double() if isinstance(a, torch.Tensor) else a for a in args],
                  [c.double() for c in cts])
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        assert_close(g.numpy(), w.numpy(), 1e-5, f"{which} grad")


def test_gradcheck_float64(rng):
    x, w, b = (torch.from_numpy(rng.standard_normal(s)).requires_grad_() for s in ((4, 5), (5, 3), (3,)))
    assert torch.autograd.gradcheck(example.mlp_op, (x, w, b))


def test_planted_wrong_vjp_is_caught(rng, monkeypatch):
    real = torch_op_grad._vjp_program

    def doubled(jitfn, nparams, tensor_pos):
        prog = real(jitfn, nparams, tensor_pos)
        return lambda *a: prog(*a) * 2.0
    monkeypatch.setattr(torch_op_grad, "_vjp_program", doubled)
    bad = ts.torch.op(example.scale, name="tessera_tests::scale_wrong_grad")
    x = torch.from_numpy(rng.standard_normal((3, 4))).requires_grad_()
    from torch.autograd.gradcheck import GradcheckError   # noqa: PLC0415 - torch.autograd.gradcheck is also a function
    with pytest.raises(GradcheckError, match="(?i)jacobian mismatch"):
        torch.autograd.gradcheck(lambda x: bad(x, 0.5), (x,))


def test_backward_under_torch_compile(rng):
    x, w, b = _args(rng, "mlp")
    params = [t.requires_grad_() for t in (w, b)]
    step = torch.compile(lambda x, w, b: (example.mlp_op(x, w, b) ** 2).sum(), fullgraph=True)
    step(x, *params).backward()
    want = _grads(lambda x, w, b: (_torch64("mlp", (x, w, b))[0] ** 2).sum(), [x.double(), w.double(), b.double()],
                  [torch.ones((), dtype=torch.float64)])
    assert_close(w.grad.numpy(), want[1].numpy(), 1e-5, "w grad")
    assert_close(b.grad.numpy(), want[2].numpy(), 1e-5, "b grad")


def test_missing_vjp_rule_is_coded(rng, monkeypatch):
    op = ts.torch.op(lambda x: ts.ops.cumsum(x, 0) * 1.0, name="tessera_tests::running")
    monkeypatch.delitem(D.RULES, "cumsum")
    x = _args(rng, "moments")[0].requires_grad_()
    y = op(x)
    with pytest.raises(GradNoRuleError, match="cumsum"):
        y.sum().backward()   # refused by name, never a zero gradient
