"""``tessera.onnx``: ONNX models as jitted Tessera functions.

    import tessera as ts
    fn = ts.onnx.load("model.onnx")          # a path, its bytes or an onnx.ModelProto
    y = fn(x)                                # inputs in graph order (or by ONNX name)

The ``onnx`` package is needed only to load a model (it is imported by ``load``).  What maps
and what is refused: docs/ecosystem.md, "ONNX".
"""
from __future__ import annotations


def load(model, *, target=None, arch=None):
    from tessera.onnx.model import load as _load
    return _load(model, target=target, arch=arch)


load.__doc__ = """Load an ONNX model (a path, its bytes, or an ``onnx.ModelProto``) as a jitted function
(``tessera.onnx.model.OnnxFunction``); see tessera/onnx/model.py."""

__all__ = ["load"]
