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
from tessera.runtime.lanes import LOG as lane_log
from tessera.runtime.threads import get_num_threads, set_num_threads

bfloat16 = dtypes.bfloat16
float32 = dtypes.float32

__all__ = ["jit", "compile", "explain", "ops", "dtypes", "errors", "TesseraError", "RecompileWarning", "JitFunction", "Artifact",
           "lane_log", "bfloat16", "float32", "set_num_threads", "get_num_threads"]
__all__ += ["tune"]
__version__ = "0.1.0"
