"""Tessera: a tile-centric kernel compiler.

    import numpy as np, tessera as ts

    @ts.jit
    def mlp(x, w, b):
        return ts.ops.gelu(x @ w + b)

    y = mlp(x, w, b)                 # Graph -> Schedule -> Tile -> Target IR -> machine code
    print(ts.explain(mlp, x, w, b))  # layers, passes, MMA choice, the lane that ran
"""
from tessera import dtypes, errors
from tessera.errors import RecompileWarning, TesseraError
from tessera.frontend import ops
from tessera.frontend.jit import Artifact, JitFunction, compile, explain, jit
from tessera.frontend.profile import profile
from tessera.frontend.tune import tune
# ahead-of-time export: lib<name>.so + <name>.h (tessera/aotlib/)
from tessera.aotlib import export
aot = export
from tessera.runtime.lanes import LOG as lane_log
from tessera.runtime.threads import get_num_threads, set_num_threads
# reverse-mode differentiation (frontend/autodiff.py, the differentiate transformation)
from tessera.frontend.autodiff import grad, stop_gradient, value_and_grad, vjp
from tessera.frontend.remat import checkpoint  # recompute a region in the backward (frontend/remat.py)
from tessera import optim  # optimizer steps (tessera/optim.py)

bfloat16 = dtypes.bfloat16
float32 = dtypes.float32

__all__ = ["jit", "compile", "explain", "ops", "dtypes", "errors", "TesseraError", "RecompileWarning", "JitFunction", "Artifact",
           "lane_log", "bfloat16", "float32", "set_num_threads", "get_num_threads"]
__all__ += ["grad", "value_and_grad", "vjp", "stop_gradient"]
__all__ += ["tune"]
__all__ += ["export", "aot"]
from tessera import onnx  # noqa: E402 - tessera.onnx.load; imports onnx only when it loads a model
__all__ += ["onnx"]
__all__ += ["checkpoint"]
from tessera.frontend.device_call import device_options  # noqa: E402 - stream / device / graph replay of GPU calls
__all__ += ["device_options"]
__all__ += ["optim"]
__version__ = "0.1.0"


def __getattr__(name):   # tessera.torch imports torch: only when asked for
    if name == "torch":
        import importlib
        return importlib.import_module("tessera.torch")
    if name == "jax":    # tessera.jax imports jax: only when asked for
        import importlib
        return importlib.import_module("tessera.jax")
    raise AttributeError(f"module 'tessera' has no attribute {name!r}")
