"""Models exported from torch 2.13 with ``torch.onnx.export`` (``tests/data/onnx``: an MLP, a conv net,
a transformer block, an upsampling decoder; made by
``tools/export_onnx_fixtures.py``; no torch needed here) through ``tessera.onnx.load``.

Each model runs on fresh random inputs at two batch sizes (the batch dim is dynamic in every file)
and is judged against a float64 numpy oracle written here from the torch parameters read out of
the ``*_legacy.onnx`` file by name (exported without constant folding: the parameters verbatim
under their torch names; the other exports of the same model hold the same values, checked below,
some folded or transposed by the exporter's optimiser).  onnxruntime, where installed, is a second
opinion held to the same oracle.  Teeth: every bound weight, perturbed alone, fails the comparison;
a planted wrong mapping (GELU's tanh form for ``Gelu``, BatchNormalization without its mean, zeros
for reflect/edge ``Pad``, nearest for linear ``Resize``) fails.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

import tessera as ts  # noqa: E402
from oracle import gelu_erf, layer_norm, rel_err, softmax  # noqa: E402
from tessera.onnx import convert, model as _registry  # noqa: E402,F401 - importing it registers the ops

DATA = Path(__file__).parent / "data" / "onnx"
FIXTURES = {"mlp.onnx": "mlp", "mlp_legacy.onnx": "mlp", "convnet.onnx": "convnet",
            "convnet_unopt.onnx": "convnet", "convnet_legacy.onnx": "convnet", "block.onnx": "block",
            "block_legacy.onnx": "block", "decoder.onnx": "decoder", "decoder_unopt.onnx": "decoder",
            "decoder_legacy.onnx": "decoder"}
FEATURES = {"mlp": (16,), "convnet": (3, 8, 8), "block": (8, 32), "decoder": (3, 6, 6)}   # after the batch dim
# GroupNorm exports as a Reshape merging the batch into the groups: those graphs cannot be bucketed along
# the dynamic batch and are specialised per shape (fn.dynamic_fallback says why)
SPECIALISED = {"decoder"}
TORCH_PARAMS = {
    "mlp": {"fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight", "fc2.bias"},
    "convnet": {"conv1.weight", "conv1.bias", "conv2.weight", "fc.weight", "fc.bias"} |
               {f"bn{i}.{k}" for i in (1, 2) for k in ("weight", "bias", "running_mean", "running_var")},
    "block": {f"{m}.{k}" for m in ("ln1", "qkv", "proj", "ln2", "fc1", "fc2") for k in ("weight", "bias")},
    "decoder": {f"{m}.{k}" for m in ("conv_in", "norm", "up", "conv_out") for k in ("weight", "bias")},
}
TOL = 2e-6        # relative (Frobenius) error against the float64 oracle; float32 models measure ~1e-7
EPS = 1e-5        # torch's LayerNorm and BatchNorm2d default


def initializers(fname) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(DATA / fname)).graph.initializer}


@functools.lru_cache(maxsize=None)
def params(model: str) -> dict[str, np.ndarray]:
    """The torch parameters of ``model`` in float64, by name, from its legacy export."""
    return {k: v.astype(np.float64) for k, v in initializers(f"{model}_legacy.onnx").items()}


# ---------------------------------------------------------------------------- float64 oracles
def _linear(p, name, x):
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def _conv3x3(x, w, b=None, pad="constant"):
    """Conv2d, kernel 3, stride 1, NCHW: the 3x3 windows of the input padded by one (``pad``: numpy's
    mode; None: no padding) contracted."""
    xp = x if pad is None else np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode=pad)
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))    # N C H W 3 3
    y = np.einsum("nchwij,ocij->nohw", win, w)
    return y if b is None else y + b[None, :, None, None]


def _batch_norm(p, name, x):
    k = (None, slice(None), None, None)
    return ((x - p[f"{name}.running_mean"][k]) / np.sqrt(p[f"{name}.running_var"][k] + EPS) *
            p[f"{name}.weight"][k] + p[f"{name}.bias"][k])


def _pool2(x, reduce):
    n, c, h, w = x.shape
    return reduce(x.reshape(n, c, h // 2, 2, w // 2, 2), axis=(3, 5))


def oracle_mlp(p, x):
    h = layer_norm(gelu_erf(_linear(p, "fc1", x)), p["norm.weight"], p["norm.bias"], EPS)
    return _linear(p, "fc2", h)


def oracle_convnet(p, x):
    h = _pool2(np.maximum(_batch_norm(p, "bn1", _conv3x3(x, p["conv1.weight"], p["conv1.bias"])), 0), np.max)
    h = _pool2(np.maximum(_batch_norm(p, "bn2", _conv3x3(h, p["conv2.weight"])), 0), np.mean)
    return _linear(p, "fc", h.reshape(len(h), -1))


def oracle_block(p, x, heads=4):
    b, s, d = x.shape
    qkv = _linear(p, "qkv", layer_norm(x, p["ln1.weight"], p["ln1.bias"], EPS))
    q, k, v = (t.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3) for t in np.split(qkv, 3, axis=-1))
    w = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), axis=-1)
    x = x + _linear(p, "proj", (w @ v).transpose(0, 2, 1, 3).reshape(b, s, d))
    h = gelu_erf(_linear(p, "fc1", layer_norm(x, p["ln2.weight"], p["ln2.bias"], EPS)))
    return x + _linear(p, "fc2", h)


def _bilinear2x(x, axis):
    """torch's bilinear upsampling by 2 along ``axis`` (align_corners=False): source (i + 0.5) / 2 - 0.5
    clamped at 0, blended between floor and the next index (clamped at the end)."""
    n = x.shape[axis]
    src = np.maximum((np.arange(2 * n) + 0.5) / 2 - 0.5, 0)
    i0 = np.floor(src).astype(int)
    lam = (src - i0).reshape((-1,) + (1,) * (x.ndim - axis - 1))
    a, b = np.take(x, i0, axis=axis), np.take(x, np.minimum(i0 + 1, n - 1), axis=axis)
    return a * (1 - lam) + b * lam


def oracle_decoder(p, x, groups=2):
    h = _conv3x3(x, p["conv_in.weight"], p["conv_in.bias"], pad="reflect")
    n, c = h.shape[:2]
    g = h.reshape(n, groups, -1)
    g = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + EPS)
    h = g.reshape(h.shape) * p["norm.weight"][None, :, None, None] + p["norm.bias"][None, :, None, None]
    h = h / (1 + np.exp(-h))                                                       # SiLU
    up = np.einsum("ncij,coab->noiajb", h, p["up.weight"]).reshape(n, -1, 2 * h.shape[2], 2 * h.shape[3])
    up = up + p["up.bias"][None, :, None, None]
    bil = _bilinear2x(_bilinear2x(h[:, : c // 2], 2), 3)
    y = _conv3x3(np.concatenate([up, bil], axis=1), p["conv_out.weight"], p["conv_out.bias"], pad="edge")
    return y + x[:, : y.shape[1]].repeat(2, axis=2).repeat(2, axis=3)


ORACLES = {"mlp": oracle_mlp, "convnet": oracle_convnet, "block": oracle_block, "decoder": oracle_decoder}


def inputs(rng, model, batch):
    return rng.standard_normal((batch,) + FEATURES[model]).astype(np.float32)


def errors(got, want) -> dict:
    """rel: the relative Frobenius error (the gate); max_abs, max_rel: max |diff| and that over max |want|."""
    d = np.abs(np.asarray(got, np.float64) - want)
    return {"rel": rel_err(got, want), "max_abs": float(d.max()), "max_rel": float(d.max() / np.abs(want).max())}


@pytest.fixture(scope="module")
def loaded():
    cache = {}

    def get(fname):
        if fname not in cache:
            cache[fname] = ts.onnx.load(DATA / fname)
        return cache[fname]
    return get


# ---------------------------------------------------------------------------- the files
def test_fixture_files_are_small_exports_with_a_dynamic_batch():
    for fname, model in FIXTURES.items():
        assert (DATA / fname).stat().st_size < 300_000, fname
        m = onnx.load(str(DATA / fname))
        onnx.checker.check_model(m)
        (opset,) = [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")]
        assert opset == (17 if "legacy" in fname else 20), fname
        (x,) = m.graph.input
        assert x.type.tensor_type.shape.dim[0].dim_param, f"{fname}: the batch dim is not symbolic"
        kinds = {n.op_type for n in m.graph.node}
        if model in ("mlp", "block"):   # the default exporter keeps GELU and LayerNorm whole at opset 20
            assert {"LayerNormalization", "Gelu" if opset == 20 else "Erf"} <= kinds, (fname, kinds)
        if fname in ("convnet_unopt.onnx", "convnet_legacy.onnx"):
            assert "BatchNormalization" in kinds, kinds
        if model == "decoder":
            assert {"Pad", "ConvTranspose", "Resize", "InstanceNormalization"} <= kinds, kinds
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(str(DATA / "convnet.onnx")).graph.node}


def test_every_export_holds_the_same_parameters():
    """The legacy files hold exactly the torch parameters; the other exports of each model hold the
    same values (under the same name, or folded: convnet.onnx's Conv weights carry BatchNorm)."""
    for model, names in TORCH_PARAMS.items():
        p = params(model)
        assert set(p) == names, model
        assert all(v.size > 1 and np.abs(v).max() > 0 for v in p.values())
        for fname in [f for f, m in FIXTURES.items() if m == model and "legacy" not in f]:
            inits = initializers(fname)
            same = [k for k in inits if k in p and not (fname == "convnet.onnx" and k.startswith("conv"))]
            assert same, fname
            for k in same:
                assert np.array_equal(inits[k], p[k].astype(np.float32)), (fname, k)
    inits, p = initializers("convnet.onnx"), params("convnet")
    for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
        f = p[f"{bn}.weight"] / np.sqrt(p[f"{bn}.running_var"] + EPS)
        assert np.allclose(inits[f"{conv}.weight"], p[f"{conv}.weight"] * f[:, None, None, None], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- the comparisons
@pytest.mark.parametrize("fname", FIXTURES)
def test_exported_model_matches_float64_oracle(fname, loaded, rng):
    model = FIXTURES[fname]
    fn = loaded(fname)
    for batch in (int(rng.integers(1, 4)), int(rng.integers(5, 9))):
        x = inputs(rng, model, batch)
        got, want = fn(x), ORACLES[model](params(model), x.astype(np.float64))
        assert got.shape == want.shape and got.dtype == np.float32
        e = errors(got, want)
        assert e["rel"] < TOL, (fname, batch, e)
    if model in SPECIALISED:
        assert not fn.dynamic and "reshape" in fn.dynamic_fallback
    else:
        assert fn.dynamic == {0: {0: "batch"}} and fn.dynamic_fallback is None


@pytest.mark.parametrize("fname", FIXTURES)
def test_exported_model_matches_onnxruntime(fname, loaded, rng):
    ort = pytest.importorskip("onnxruntime")
    model = FIXTURES[fname]
    sess = ort.InferenceSession(str(DATA / fname), providers=["CPUExecutionProvider"])
    x = inputs(rng, model, int(rng.integers(2, 7)))
    (ref,) = sess.run(None, {"x": x})
    want = ORACLES[model](params(model), x.astype(np.float64))
    assert errors(ref, want)["rel"] < TOL, "onnxruntime itself is off the oracle"
    got = loaded(fname)(x)
    assert errors(got, ref.astype(np.float64))["rel"] < TOL, (fname, errors(got, ref.astype(np.float64)))


# ---------------------------------------------------------------------------- teeth
@pytest.mark.parametrize("fname", FIXTURES)
def test_every_bound_weight_is_read(fname, loaded, rng):
    """Each weight Tessera binds, moved by 10% (one element alone can sit behind a ReLU that is
    off for every input), takes the result off the oracle."""
    model = FIXTURES[fname]
    fn = loaded(fname)
    x = inputs(rng, model, 3)
    want = ORACLES[model](params(model), x.astype(np.float64))
    assert errors(fn(x), want)["rel"] < TOL
    assert len(fn.weights) >= 5
    for name, w in list(fn.weights.items()):
        fn.weights[name] = (w + 0.1 * (np.abs(w) + 0.1) * rng.choice([-1, 1], w.shape)).astype(w.dtype)
        try:
            err = errors(fn(x), want)["rel"]
        finally:
            fn.weights[name] = w
        assert err > 10 * TOL, (fname, name, err)


def _planted(kind):
    real = convert.OPS[kind]
    if kind in ("Gelu", "Pad", "Resize"):   # erf GELU as tanh; reflect/edge pads as zeros; bilinear as nearest
        attr = {"Gelu": ("approximate", "tanh"), "Pad": ("mode", "constant"), "Resize": ("mode", "nearest")}[kind]

        def fn(ctx, ins):
            return real.fn(convert.Ctx(ctx.node, {**ctx.attrs, attr[0]: attr[1]}, ctx.opset, ctx.n_outputs), ins)
    else:                     # BatchNormalization with its running mean taken as zero
        def fn(ctx, ins):
            return real.fn(ctx, ins[:3] + [np.zeros(ins[3].shape, np.float32)] + ins[4:])
    return convert.Spec(fn, real.inputs, real.attrs, real.static, real.fold, real.check, real.outputs)


@pytest.mark.parametrize("kind, fname", [("Gelu", "mlp.onnx"), ("BatchNormalization", "convnet_legacy.onnx"),
                                         ("Pad", "decoder.onnx"), ("Resize", "decoder_legacy.onnx")])
def test_planted_wrong_mapping_fails(kind, fname, monkeypatch, rng):
    monkeypatch.setitem(convert.OPS, kind, _planted(kind))
    model = FIXTURES[fname]
    x = inputs(rng, model, 4)
    err = errors(ts.onnx.load(DATA / fname)(x), ORACLES[model](params(model), x.astype(np.float64)))["rel"]
    assert err > 10 * TOL, err
