"""A GEMM + bias + GELU layer to export as a C library (docs/ecosystem.md, "Ahead of time").

    ./dev tessera aot examples/aot/mlp.py:mlp --shape 8x16 --shape 16x32 --shape 32 --out build
    cc -O2 -Ibuild examples/aot/main.c -Lbuild -lmlp -Wl,-rpath,build -o build/mlp_demo
    build/mlp_demo            # random inputs; or: build/mlp_demo x.bin w.bin b.bin y.bin
"""
import tessera as ts


@ts.jit
def mlp(x, w, b):
    return ts.ops.gelu(x @ w + b)
