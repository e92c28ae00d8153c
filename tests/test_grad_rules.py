"""Every vjp rule against float64 central finite differences and torch.autograd (float64).

Each case differentiates ``sum(f(*args) * r)`` (``r`` a random cotangent, so the rule sees a
non-trivial one) with ``jit(value_and_grad(...))``: one compile per case, whose value output also
gives the finite differences.  The registry test checks every op is differentiable with a rule,
declared non-differentiable, or refused with GRAD_NO_RULE naming it.
"""
from __future__ import annotations

import numpy as np
import pytest

import tessera as ts
from tessera.errors import GradNoRuleError
from tessera.frontend import differentiate as D
from tessera.frontend.trace import Tensor, trace
from tessera.ir import opset, opset_grad

torch = pytest.importorskip("torch")
O = ts.ops
F = torch.nn.functional


def _gelu_tanh_t(x):
    return F.gelu(x, approximate="tanh")


def _ln_t(x, s, b):
    return F.layer_norm(x, (x.shape[-1],), s, b, eps=1e-5)


def _rms_t(x, s):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * s


def _attn_t(q, k, v, causal=False, mask=None):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


# name: (tessera fn, torch fn, argument specs); a spec is a shape (normal), ("pos", shape),
# ("int", shape, high) or ("bool", shape)
CASES = {
    "neg": (lambda x: -x, lambda x: -x, [(3, 4)]),
    "abs": (O.abs, torch.abs, [(3, 4)]),
    "exp": (O.exp, torch.exp, [(3, 4)]),
    "exp2": (O.exp2, torch.exp2, [(3, 4)]),
    "expm1": (O.expm1, torch.expm1, [(3, 4)]),
    "log": (O.log, torch.log, [("pos", (3, 4))]),
    "log1p": (O.log1p, torch.log1p, [("pos", (3, 4))]),
    "tanh": (O.tanh, torch.tanh, [(3, 4)]),
    "erf": (O.erf, torch.erf, [(3, 4)]),
    "sigmoid": (O.sigmoid, torch.sigmoid, [(3, 4)]),
    "relu": (O.relu, torch.relu, [(3, 4)]),
    "silu": (O.silu, F.silu, [(3, 4)]),
    "gelu_tanh": (O.gelu, _gelu_tanh_t, [(3, 4)]),
    "gelu_erf": (lambda x: O.gelu(x, approximate="erf"), F.gelu, [(3, 4)]),
    "sqrt": (O.sqrt, torch.sqrt, [("pos", (3, 4))]),
    "rsqrt": (O.rsqrt, torch.rsqrt, [("pos", (3, 4))]),
    "reciprocal": (O.reciprocal, torch.reciprocal, [("pos", (3, 4))]),
    "square": (O.square, torch.square, [(3, 4)]),
    "sin": (O.sin, torch.sin, [(3, 4)]),
    "cos": (O.cos, torch.cos, [(3, 4)]),
    "cast": (lambda x: O.cast(O.cast(x, np.float32), np.float64) * 2.0, lambda x: x.float().double() * 2.0,
             [(3, 4)]),
    "add_bcast": (O.add, torch.add, [(3, 4), (4,)]),
    "sub_bcast": (O.sub, torch.sub, [(3, 1), (1, 4)]),
    "mul_bcast": (O.mul, torch.mul, [(2, 3, 4), (3, 1)]),
    "div_bcast": (O.div, torch.div, [(3, 4), ("pos", (4,))]),
    "maximum": (O.maximum, torch.maximum, [(3, 4), (3, 4)]),
    "minimum": (O.minimum, torch.minimum, [(3, 4), (4,)]),
    "clip": (lambda x: O.clip(x, -0.5, 0.5), lambda x: torch.clamp(x, -0.5, 0.5), [(3, 4)]),
    "pow": (O.pow, torch.pow, [("pos", (3, 4)), (3, 4)]),
    "pow_int": (lambda x: x ** 3, lambda x: x ** 3, [(3, 4)]),
    "mod": (O.mod, torch.remainder, [(3, 4), ("pos", (3, 4))]),
    "where": (lambda c, a, b: O.where(c, a, b), torch.where, [("bool", (3, 4)), (3, 4), (4,)]),
    "matmul": (O.matmul, torch.matmul, [(3, 5), (5, 4)]),
    "matmul_batched_bcast": (O.matmul, torch.matmul, [(2, 3, 5), (5, 4)]),
    "matmul_vec": (O.matmul, torch.matmul, [(5,), (2, 5, 3)]),
    "reduce_sum": (lambda x: O.reduce_sum(x, 1), lambda x: x.sum(1), [(3, 4, 2)]),
    "reduce_sum_keep": (lambda x: O.reduce_sum(x, (0, 2), keepdims=True), lambda x: x.sum((0, 2), keepdim=True),
                        [(3, 4, 2)]),
    "reduce_mean": (lambda x: O.reduce_mean(x, -1), lambda x: x.mean(-1), [(3, 4)]),
    "reduce_max": (lambda x: O.reduce_max(x, 0), lambda x: x.amax(0), [(3, 4)]),
    "reduce_min": (lambda x: -O.reduce_max(-x, 1), lambda x: x.amin(1), [(3, 4)]),
    "prod": (lambda x: O.prod(x, 1), lambda x: x.prod(1), [("pos", (3, 4))]),
    "var": (lambda x: O.var(x, 1), lambda x: x.var(1, unbiased=False), [(3, 4)]),
    "std": (lambda x: O.std(x, 0, ddof=1), lambda x: x.std(0), [(3, 4)]),
    "logsumexp": (lambda x: O.logsumexp(x, 0), lambda x: torch.logsumexp(x, 0), [(3, 4)]),
    "cumsum": (lambda x: O.cumsum(x, 1), lambda x: x.cumsum(1), [(3, 4)]),
    "cumprod": (lambda x: O.cumprod(x, 0), lambda x: x.cumprod(0), [("pos", (3, 4))]),
    "reshape": (lambda x: O.reshape(x, (4, 3)), lambda x: x.reshape(4, 3), [(3, 4)]),
    "transpose": (lambda x: O.transpose(x, (2, 0, 1)), lambda x: x.permute(2, 0, 1), [(2, 3, 4)]),
    "slice_step": (lambda x: x[1:, ::-2], lambda x: x[1:].flip(1)[:, ::2], [(3, 5)]),
    "slice_int": (lambda x: x[1, 1:3], lambda x: x[1, 1:3], [(3, 5)]),
    "concat": (lambda a, b: O.concatenate([a, b], 1), lambda a, b: torch.cat([a, b], 1), [(3, 2), (3, 4)]),
    "stack": (lambda a, b: O.stack([a, b], 0), lambda a, b: torch.stack([a, b], 0), [(3, 4), (3, 4)]),
    "expand_squeeze": (lambda x: O.squeeze(O.expand_dims(x, 1), 1) * O.expand_dims(x, 0),
                       lambda x: x * x.unsqueeze(0), [(3, 4)]),
    "pad": (lambda x: O.pad(x, ((1, 0), (2, 1))), lambda x: F.pad(x, (2, 1, 1, 0)), [(3, 4)]),
    "softmax": (lambda x: O.softmax(x, 0), lambda x: torch.softmax(x, 0), [(3, 4)]),
    "log_softmax": (O.log_softmax, lambda x: torch.log_softmax(x, -1), [(3, 4)]),
    "layer_norm": (O.layer_norm, _ln_t, [(3, 5), (5,), (5,)]),
    "layer_norm_plain": (O.layer_norm, lambda x: F.layer_norm(x, (5,)), [(2, 3, 5)]),
    "rms_norm": (O.rms_norm, _rms_t, [(3, 5), (5,)]),
    "cross_entropy": (lambda z, y: O.cross_entropy(z, y, reduction="none"),
                      lambda z, y: F.cross_entropy(z, y, reduction="none"), [(4, 5), ("int", (4,), 5)]),
    "cross_entropy_mean": (lambda z, y: O.cross_entropy(z, y, ignore_index=1),
                           lambda z, y: F.cross_entropy(z, y, ignore_index=1), [(6, 5), ("int", (6,), 5)]),
    "take": (lambda t, i: O.take(t, i, 0), lambda t, i: t[i], [(5, 3), ("int", (2, 4), 5)]),
    "take_along_axis": (lambda x, i: O.take_along_axis(x, i, 1), lambda x, i: torch.gather(x, 1, i),
                        [(3, 5), ("int", (3, 2), 5)]),
    "top_k": (lambda x: O.top_k(x, 2)[0], lambda x: torch.topk(x, 2).values, [(3, 5)]),
    "conv2d": (lambda x, w: O.conv2d(x, w, stride=2, padding=1), lambda x, w: F.conv2d(x, w, stride=2, padding=1),
               [(1, 3, 6, 5), (4, 3, 3, 2)]),
    "conv2d_dilated_groups": (lambda x, w: O.conv2d(x, w, padding=2, dilation=2, groups=2),
                              lambda x, w: F.conv2d(x, w, padding=2, dilation=2, groups=2),
                              [(2, 4, 5, 5), (4, 2, 3, 3)]),
    "attention": (lambda q, k, v: O.attention(q, k, v), _attn_t, [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)]),
    "attention_causal_gqa": (lambda q, k, v: O.attention(q, k, v, causal=True),
                             lambda q, k, v: _attn_t(q, k, v, causal=True), [(1, 4, 3, 2), (1, 2, 3, 2), (1, 2, 3, 2)]),
    "take_axis1": (lambda t, i: O.take(t, i, 1), lambda t, i: t[:, i], [(3, 5), ("int", (7,), 5)]),
    "scatter_add": (lambda x, i, u: O.scatter_add(x, i, u, 1), lambda x, i, u: x.index_add(1, i, u),
                    [(3, 5), ("int", (6,), 5), (3, 6)]),
}

ROUNDED = {"cast"}
_JITTED: dict = {}


def _make(rng, spec):
    if isinstance(spec[0], str):
        kind = spec[0]
        if kind == "pos":
            return rng.uniform(0.5, 2.0, spec[1])
        if kind == "int":
            return rng.integers(0, spec[2], spec[1]).astype(np.int64)
        return rng.random(spec[1]) < 0.5
    return rng.standard_normal(spec)


def _loss_fn(f):
    def loss(*a):
        return O.reduce_sum(O.mul(f(*a[:-1]), a[-1]))
    return loss


def check_case(name, rng, rules=None):
    """(max |grad - fd|, max |grad - torch|) relative to the gradient's scale."""
    f, tf, specs = CASES[name]
    args = [_make(rng, s) for s in specs]
    fl = tuple(i for i, a in enumerate(args) if a.dtype == np.float64)
    key = name if rules is None else None
    vg = _JITTED.get(key) or ts.jit(ts.value_and_grad(_loss_fn(f), argnums=fl))
    if key is not None:
        _JITTED[key] = vg
    targs = [torch.tensor(a, requires_grad=a.dtype == np.float64) for a in args]
    out = tf(*targs)
    r = rng.standard_normal(tuple(out.shape))
    _, grads = vg(*args, r)
    tgrads = torch.autograd.grad((out * torch.tensor(r)).sum(), [targs[i] for i in fl])
    scale = max(1.0, max(float(np.abs(t.numpy()).max()) for t in tgrads))
    torch_err = max(float(np.abs(g - t.numpy()).max()) for g, t in zip(grads, tgrads)) / scale
    eps, fd_err = 1e-6, 0.0
    for gi, i in zip(grads, fl):
        flat = args[i].reshape(-1)
        for j in rng.choice(flat.size, min(flat.size, 10), replace=False):
            old = flat[j]
            flat[j] = old + eps
            up = float(vg(*args, r)[0])
            flat[j] = old - eps
            down = float(vg(*args, r)[0])
            flat[j] = old
            fd_err = max(fd_err, abs((up - down) / (2 * eps) - gi.reshape(-1)[j]) / scale)
    return fd_err, torch_err


# variants of a rule another case already checks: under -m slow (suite time)
SLOW = {"attention", "conv2d_dilated_groups", "matmul_vec", "layer_norm_plain", "reduce_sum_keep"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(CASES)])
def test_rule_matches_finite_differences_and_torch(name, rng):
    fd_err, torch_err = check_case(name, rng)
    if name in ROUNDED:   # a float32 round trip: finite differences see its steps
        assert torch_err < 1e-6, (name, torch_err)
        return
    assert torch_err < 1e-9, (name, torch_err)
    assert fd_err < 1e-6, (name, fd_err)


def test_planted_wrong_softmax_rule_fails(rng, monkeypatch):
    """Teeth: softmax's vjp without the subtraction is caught by both checks."""
    def wrong(n, g, need):
        return [O.mul(Tensor(n), g)]
    monkeypatch.setitem(D.RULES, "softmax", wrong)
    fd_err, torch_err = check_case("softmax", rng, rules="planted")
    assert fd_err > 1e-3 and torch_err > 1e-3


def test_every_op_has_a_rule_a_reason_or_is_refused():
    """Each registry op is in exactly one state; the refused ones raise GRAD_NO_RULE naming the op."""
    rules, declared = set(D.RULES), set(opset_grad.NON_DIFFERENTIABLE)
    known = set(opset.OPS) | set(opset.SECOND_RESULTS)
    assert not rules & declared
    assert rules | declared <= known, (rules | declared) - known
    refused = known - rules - declared
    for op in refused | {"an_op_added_later"}:   # none today; a new op without a rule lands here
        with pytest.raises(GradNoRuleError, match=op):
            D.rule_for(op)
    rng = np.random.default_rng(0)
    traced = set()   # the ops the cases' forward graphs record (tracing only, no compile)
    for f, _, specs in CASES.values():
        args = [_make(rng, s) for s in specs]
        traced |= {n.op for n in trace(f, args, [True] * len(args)).nodes}
    assert not rules - traced, f"rules no case exercises: {rules - traced}"


def test_an_op_without_a_rule_is_refused_naming_it(rng, monkeypatch):
    """A gradient through an op whose rule is missing raises GRAD_NO_RULE naming it, never zeros."""
    monkeypatch.delitem(D.RULES, "cumsum")
    f = ts.jit(ts.grad(lambda x: O.reduce_sum(O.cumsum(x, 0))))
    with pytest.raises(GradNoRuleError, match="cumsum"):
        f(rng.standard_normal((3, 4)))
