"""The workloads of ``tessera bench train``, each written once per implementation: Tessera
(``tessera.value_and_grad`` + ``tessera.optim.adamw`` in one ``tessera.jit``), torch eager,
``torch.compile`` and ``jax.jit(jax.value_and_grad(...))``, and a float64 numpy oracle with its
backward written by hand.

- ``step``: one training step of a GPT-2-style block (pre-LayerNorm, fused qkv projection, causal
  attention, tanh-GELU MLP, residuals) under a mean-squared-error loss against a random target:
  forward, backward, then AdamW (torch.optim.AdamW's formula) over the block's twelve parameters.
  Every implementation returns ``(loss, params', m', v')`` as new arrays (the same allocation
  policy everywhere; torch's AdamW is written out-of-place, as jax's is, for that reason); Tessera
  is measured a second time as a user would train with it, ``donate_argnums`` on the parameters
  and moments (``tessera (donated)``: p', m', v' written into the buffers of the previous step's).
- ``attn``: the gradient of attention alone, ``(dq, dk, dv)`` of ``sum(attention(q, k, v) * do)``
  on ``[batch, heads, seq, dim]``, causal or not (every implementation runs its forward too).

An implementation is a function ``build(w) -> (call, outputs)``: ``call()`` runs one step on the
workload's inputs and ``outputs(result)`` turns its result into a list of float64 numpy arrays in
the oracle's order, which ``bench_train.check`` compares before anything is timed.
"""
from __future__ import annotations

import math

import numpy as np

NAMES = ("ln1_g", "ln1_b", "w_qkv", "b_qkv", "w_o", "b_o", "ln2_g", "ln2_b", "w_fc", "b_fc", "w_proj", "b_proj")
ADAMW = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=1e-2)
EPS_LN = 1e-5


# --------------------------------------------------------------------------- inputs
def make_step(rng, batch: int, seq: int, dim: int, heads: int, oracle: bool = True) -> dict:
    """Random inputs of one step (never zeros): x, a target y, the parameters (fan-in scaled) and
    AdamW's moments as after a few steps, at step t=3.  The moments are drawn at each parameter's
    gradient scale (from the float64 oracle, kept in the workload): m of the gradient's size and
    v of its square, so that the step's outputs depend on the gradient measurably (``check``
    recovers each implementation's gradient from its m') and AdamW's denominator stays away from
    eps (a float32 gradient error cannot flip an update).  ``oracle=False`` (the memory children,
    which check nothing) draws the moments at a fixed scale instead and keeps no oracle."""
    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32)

    def g(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def b(n):
        return (0.1 * rng.standard_normal(n)).astype(np.float32)
    d = dim
    params = [g(d), b(d), w(d, 3 * d), b(3 * d), w(d, d), b(d), g(d), b(d), w(d, 4 * d), b(4 * d), w(4 * d, d), b(d)]
    x = rng.standard_normal((batch, seq, dim)).astype(np.float32)
    y = rng.standard_normal((batch, seq, dim)).astype(np.float32)
    loss, grads = block_loss_and_grads64(x, y, params, heads) if oracle else (None, None)
    rms = [float(np.sqrt(np.mean(gr * gr))) or 1.0 for gr in grads] if oracle else [1e-4] * len(params)
    m = [(r * rng.standard_normal(p.shape)).astype(np.float32) for r, p in zip(rms, params)]
    v = [(r * r * (0.5 + rng.random(p.shape))).astype(np.float32) for r, p in zip(rms, params)]
    return {"kind": "step", "heads": heads, "x": x, "y": y, "params": params, "m": m, "v": v, "t": 3.0,
            "loss64": loss, "grads64": grads}


def make_attn(rng, batch: int, heads: int, seq: int, dim: int, causal: bool) -> dict:
    q, k, v, do = (rng.standard_normal((batch, heads, seq, dim)).astype(np.float32) for _ in range(4))
    return {"kind": "attn", "causal": causal, "q": q, "k": k, "v": v, "do": do}


# --------------------------------------------------------------------------- the float64 oracle
def _ln_fwd(x, g, b):
    mu = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + EPS_LN)
    xh = (x - mu) * rstd
    return xh * g + b, (xh, rstd, g)


def _ln_bwd(dy, cache):
    xh, rstd, g = cache
    dxh = dy * g
    dx = rstd * (dxh - dxh.mean(-1, keepdims=True) - xh * (dxh * xh).mean(-1, keepdims=True))
    red = tuple(range(dy.ndim - 1))
    return dx, (dy * xh).sum(red), dy.sum(red)


def _attn_fwd(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ v, p


def _attn_bwd(do, q, k, v, p):
    scale = 1 / math.sqrt(q.shape[-1])
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv


_C = math.sqrt(2 / math.pi)


def _gelu(u):
    return 0.5 * u * (1 + np.tanh(_C * (u + 0.044715 * u ** 3)))


def _gelu_grad(u):
    t = np.tanh(_C * (u + 0.044715 * u ** 3))
    return 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * _C * (1 + 3 * 0.044715 * u * u)


def block_loss_and_grads64(x, y, params, heads: int):
    """Loss and the twelve parameter gradients of the block, float64, backward by hand."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj = (
        p.astype(np.float64) for p in params)
    B, S, D = x.shape
    H, dh = heads, D // heads

    def heads_of(t):
        return t.reshape(B, S, H, dh).transpose(0, 2, 1, 3)

    a1, c1 = _ln_fwd(x, ln1_g, ln1_b)
    qkv = a1 @ w_qkv + b_qkv
    q, k, v = (heads_of(t) for t in np.split(qkv, 3, -1))
    o, p = _attn_fwd(q, k, v, True)
    yatt = o.transpose(0, 2, 1, 3).reshape(B, S, D)
    x1 = x + yatt @ w_o + b_o
    a2, c2 = _ln_fwd(x1, ln2_g, ln2_b)
    u = a2 @ w_fc + b_fc
    h = _gelu(u)
    out = x1 + h @ w_proj + b_proj
    r = out - y
    loss = float((r * r).mean())
    dout = 2 * r / r.size

    def wgrad(a, d):
        return a.reshape(-1, a.shape[-1]).T @ d.reshape(-1, d.shape[-1])
    dw_proj, db_proj = wgrad(h, dout), dout.sum((0, 1))
    du = (dout @ w_proj.T) * _gelu_grad(u)
    dw_fc, db_fc = wgrad(a2, du), du.sum((0, 1))
    dx1_ln, dln2_g, dln2_b = _ln_bwd(du @ w_fc.T, c2)
    dx1 = dout + dx1_ln
    dw_o, db_o = wgrad(yatt, dx1), dx1.sum((0, 1))
    do = (dx1 @ w_o.T).reshape(B, S, H, dh).transpose(0, 2, 1, 3)
    dq, dk, dv = _attn_bwd(do, q, k, v, p)
    dqkv = np.concatenate([t.transpose(0, 2, 1, 3).reshape(B, S, D) for t in (dq, dk, dv)], -1)
    dw_qkv, db_qkv = wgrad(a1, dqkv), dqkv.sum((0, 1))
    _, dln1_g, dln1_b = _ln_bwd(dqkv @ w_qkv.T, c1)
    return loss, [dln1_g, dln1_b, dw_qkv, db_qkv, dw_o, db_o, dln2_g, dln2_b, dw_fc, db_fc, dw_proj, db_proj]


def adamw64(p, g, m, v, t, lr, b1, b2, eps, wd):
    p, m, v = (a.astype(np.float64) for a in (p, m, v))
    m2 = b1 * m + (1 - b1) * g
    v2 = b2 * v + (1 - b2) * g * g
    p2 = p * (1 - lr * wd) - lr / (1 - b1 ** t) * m2 / (np.sqrt(v2) / math.sqrt(1 - b2 ** t) + eps)
    return p2, m2, v2


def oracle(w: dict) -> list[np.ndarray]:
    """The workload's outputs in float64: [loss, params'..., m'..., v'...] or [dq, dk, dv]."""
    if w["kind"] == "attn":
        q, k, v, do = (w[n].astype(np.float64) for n in ("q", "k", "v", "do"))
        _, p = _attn_fwd(q, k, v, w["causal"])
        return list(_attn_bwd(do, q, k, v, p))
    loss, grads = w["loss64"], w["grads64"]
    a = ADAMW
    new = [adamw64(p, g, m, v, w["t"], a["lr"], a["b1"], a["b2"], a["eps"], a["wd"])
           for p, g, m, v in zip(w["params"], grads, w["m"], w["v"])]
    return [np.float64(loss)] + [n[0] for n in new] + [n[1] for n in new] + [n[2] for n in new]


def _f64(xs) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float64) for x in xs]


# --------------------------------------------------------------------------- Tessera
def _ts_block(x, params, n_head):
    import tessera as ts
    O = ts.ops
    ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj = params
    B, S, D = x.shape
    dh = D // n_head
    q, k, v = O.split(O.layer_norm(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, axis=-1)
    q, k, v = (t.reshape(B, S, n_head, dh).transpose(0, 2, 1, 3) for t in (q, k, v))
    y = O.attention(q, k, v, causal=True).transpose(0, 2, 1, 3).reshape(B, S, D)
    x = x + (y @ w_o + b_o)
    return x + (O.gelu(O.layer_norm(x, ln2_g, ln2_b) @ w_fc + b_fc) @ w_proj + b_proj)


def _ts_loss(x, y, *params, n_head):
    import tessera as ts
    return ts.ops.reduce_mean(ts.ops.square(_ts_block(x, params, n_head) - y))


_TS_STEP: dict = {}


def tessera_step(n_head: int, donate: bool = False):
    """The jitted step: ``(x, y, *params, *m, *v, t, lr, b1, b2, eps, wd) -> (loss, *p', *m', *v')``
    (one program: forward, backward, AdamW; the scalars are runtime values).  ``donate``: the
    parameters and moments are donated (``donate_argnums``), so p', m', v' are written in place."""
    if donate:
        key = (n_head, "donated")
        if key not in _TS_STEP:
            import tessera as ts
            n = len(NAMES)
            _TS_STEP[key] = ts.jit(tessera_step(n_head).fn, donate_argnums=tuple(range(2, 2 + 3 * n)))
        return _TS_STEP[key]
    if n_head not in _TS_STEP:
        import tessera as ts
        n = len(NAMES)

        def train_step(x, y, *rest):
            P, M, V = list(rest[:n]), list(rest[n:2 * n]), list(rest[2 * n:3 * n])
            t, lr, b1, b2, eps, wd = rest[3 * n:]
            loss, grads = ts.value_and_grad(_ts_loss, argnums=tuple(range(2, 2 + n)))(x, y, *P, n_head=n_head)
            P2, M2, V2 = ts.optim.adamw(P, list(grads), M, V, t, lr=lr, b1=b1, b2=b2, eps=eps, weight_decay=wd)
            return (loss, *P2, *M2, *V2)
        _TS_STEP[n_head] = ts.jit(train_step)
    return _TS_STEP[n_head]


def _ts_attn(causal: bool):
    import tessera as ts

    def f(q, k, v, do):
        return ts.ops.reduce_sum(ts.ops.attention(q, k, v, causal=causal) * do)
    return ts.jit(ts.grad(f, argnums=(0, 1, 2)))


_TS_ATTN: dict = {}


def tessera_call(w: dict):
    """(the jitted function, its positional args, its keyword args) for workload ``w``."""
    if w["kind"] == "attn":
        fn = _TS_ATTN.get(w["causal"]) or _TS_ATTN.setdefault(w["causal"], _ts_attn(w["causal"]))
        return fn, [w["q"], w["k"], w["v"], w["do"]], {}
    a = ADAMW
    args = [w["x"], w["y"], *w["params"], *w["m"], *w["v"], w["t"], a["lr"], a["b1"], a["b2"], a["eps"], a["wd"]]
    return tessera_step(w["heads"]), args, {}


def build_tessera(w: dict, donate: bool = False):
    """``donate`` (the step only): as a user of ``donate_argnums`` trains, ``p, m, v = step(x, y, p, m,
    v, ...)``: each call consumes the state the previous one returned (copies of the workload's at
    first, so its arrays stay intact), and writes p', m', v' into those buffers."""
    fn, args, kw = tessera_call(w)
    if not donate or w["kind"] != "step":
        return (lambda: fn(*args, **kw)), (lambda out: _f64(out))
    n = len(NAMES)
    step = tessera_step(w["heads"], donate=True)
    state = [a.copy() for a in args[2:2 + 3 * n]]

    def call():
        out = step(*args[:2], *state, *args[2 + 3 * n:])
        state[:] = out[1:]
        return out
    return call, (lambda out: _f64(out))


# --------------------------------------------------------------------------- torch
def _torch_block(x, params, n_head):
    import torch.nn.functional as F
    ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj = params
    B, S, D = x.shape
    q, k, v = (F.layer_norm(x, (D,), ln1_g, ln1_b, EPS_LN) @ w_qkv + b_qkv).split(D, dim=-1)
    q, k, v = (t.view(B, S, n_head, D // n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
    x = x + y @ w_o + b_o
    return x + F.gelu(F.layer_norm(x, (D,), ln2_g, ln2_b, EPS_LN) @ w_fc + b_fc, approximate="tanh") @ w_proj + b_proj


def _torch_adamw(P, G, M, V, t, lr, b1, b2, eps, wd):
    """AdamW out of place (new tensors, like the other implementations)."""
    import torch
    bc1, bc2 = 1 - b1 ** t, math.sqrt(1 - b2 ** t)
    P2, M2, V2 = [], [], []
    for p, g, m, v in zip(P, G, M, V):
        m2 = m * b1 + g * (1 - b1)
        v2 = v * b2 + g * g * (1 - b2)
        P2.append(p * (1 - lr * wd) - (lr / bc1) * m2 / (torch.sqrt(v2) / bc2 + eps))
        M2.append(m2)
        V2.append(v2)
    return P2, M2, V2


def build_torch(w: dict, compiled: bool = False):
    import torch
    import torch.nn.functional as F
    T = {k: torch.from_numpy(w[k]) for k in (("q", "k", "v", "do") if w["kind"] == "attn" else ("x", "y"))}
    if w["kind"] == "attn":
        def attn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=w["causal"])
        fwd = torch.compile(attn) if compiled else attn

        def call():
            q, k, v = (T[n].detach().requires_grad_() for n in ("q", "k", "v"))
            return torch.autograd.grad(fwd(q, k, v), (q, k, v), T["do"])
        return call, lambda out: _f64(t.numpy() for t in out)
    n_head = w["heads"]

    def loss_fn(x, y, *params):
        return ((_torch_block(x, params, n_head) - y) ** 2).mean()
    lossf = torch.compile(loss_fn) if compiled else loss_fn
    adamw = torch.compile(_torch_adamw) if compiled else _torch_adamw
    P = [torch.from_numpy(p) for p in w["params"]]
    M, V = [torch.from_numpy(a) for a in w["m"]], [torch.from_numpy(a) for a in w["v"]]
    a = ADAMW

    def call():
        params = [p.detach().requires_grad_() for p in P]
        loss = lossf(T["x"], T["y"], *params)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            P2, M2, V2 = adamw(P, list(grads), M, V, w["t"], a["lr"], a["b1"], a["b2"], a["eps"], a["wd"])
        return (loss.detach(), *P2, *M2, *V2)
    return call, lambda out: _f64(t.numpy() for t in out)


# --------------------------------------------------------------------------- jax
def _jax_block(x, params, n_head):
    import jax
    import jax.numpy as jnp

    def ln(t, g, b):
        m = t.mean(-1, keepdims=True)
        return (t - m) * jax.lax.rsqrt(((t - m) ** 2).mean(-1, keepdims=True) + EPS_LN) * g + b
    ln1_g, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_g, ln2_b, w_fc, b_fc, w_proj, b_proj = params
    B, S, D = x.shape
    q, k, v = (t.reshape(B, S, n_head, D // n_head) for t in jnp.split(ln(x, ln1_g, ln1_b) @ w_qkv + b_qkv, 3, -1))
    y = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(B, S, D)
    x = x + y @ w_o + b_o
    return x + jax.nn.gelu(ln(x, ln2_g, ln2_b) @ w_fc + b_fc, approximate=True) @ w_proj + b_proj


def _jax_adamw(P, G, M, V, t, lr, b1, b2, eps, wd):
    """AdamW in jnp (optax is not a dependency): new arrays."""
    import jax.numpy as jnp
    bc1, bc2 = 1 - b1 ** t, jnp.sqrt(1 - b2 ** t)
    out = [(m * b1 + g * (1 - b1), v * b2 + g * g * (1 - b2), p) for p, g, m, v in zip(P, G, M, V)]
    return ([p * (1 - lr * wd) - (lr / bc1) * m2 / (jnp.sqrt(v2) / bc2 + eps) for m2, v2, p in out],
            [o[0] for o in out], [o[1] for o in out])


def build_jax(w: dict):
    import jax
    import jax.numpy as jnp
    if w["kind"] == "attn":
        causal = w["causal"]

        def f(q, k, v, do):
            o = jax.nn.dot_product_attention(*(t.transpose(0, 2, 1, 3) for t in (q, k, v)), is_causal=causal)
            return jnp.sum(o.transpose(0, 2, 1, 3) * do)
        g = jax.jit(jax.grad(f, argnums=(0, 1, 2)))
        args = [jnp.asarray(w[n]) for n in ("q", "k", "v", "do")]
        return (lambda: jax.block_until_ready(g(*args))), (lambda out: _f64(np.asarray(t) for t in out))
    n_head = w["heads"]

    def loss_fn(params, x, y):
        return jnp.mean((_jax_block(x, params, n_head) - y) ** 2)

    def step(params, m, v, x, y, t, lr, b1, b2, eps, wd):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        P2, M2, V2 = _jax_adamw(params, grads, m, v, t, lr, b1, b2, eps, wd)
        return loss, P2, M2, V2
    js = jax.jit(step)
    a = ADAMW
    args = [[jnp.asarray(p) for p in w[n]] for n in ("params", "m", "v")] + [jnp.asarray(w["x"]), jnp.asarray(w["y"])]
    scal = [np.float32(s) for s in (w["t"], a["lr"], a["b1"], a["b2"], a["eps"], a["wd"])]

    def outputs(out):
        loss, P2, M2, V2 = out
        return _f64([np.asarray(loss)] + [np.asarray(t) for t in (*P2, *M2, *V2)])
    return (lambda: jax.block_until_ready(js(*args, *scal))), outputs


# --------------------------------------------------------------------------- registry
def available_peers() -> list[str]:
    out = []
    try:
        import torch  # noqa: F401
        out += ["torch", "torch.compile"]
    except ImportError:
        pass
    try:
        import jax  # noqa: F401
        out.append("jax.jit")
    except ImportError:
        pass
    return out


def build(impl: str, w: dict):
    """``(call, outputs)`` of implementation ``impl`` on workload ``w``."""
    if impl == "tessera":
        return build_tessera(w)
    if impl == "tessera (donated)":
        return build_tessera(w, donate=True)
    if impl == "torch":
        return build_torch(w)
    if impl == "torch.compile":
        return build_torch(w, compiled=True)
    if impl == "jax.jit":
        return build_jax(w)
    raise KeyError(impl)


__all__ = ["ADAMW", "NAMES", "available_peers", "build", "make_attn", "make_step", "oracle", "tessera_call"]
