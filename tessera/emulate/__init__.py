"""Wave/warp emulation of GPU kernels; ``layouts`` is the one table of matrix-instruction lane layouts."""
