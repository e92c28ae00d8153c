"""Tessera from torch: ``tessera.torch.op(fn, name=...)`` registers a jitted function as a
``torch.library.custom_op`` (``frontend/torch_op.py``).  torch tensors are also taken by any
jitted function directly (``frontend/interop.py``)."""
from __future__ import annotations

from tessera.frontend.torch_op import op, result_types

__all__ = ["op", "result_types"]
