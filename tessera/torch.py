"""Tessera from torch: ``tessera.torch.op(fn, name=...)`` registers a jitted function as a
``torch.library.custom_op`` (``frontend/torch_op.py``); ``torch.compile(model, backend="tessera")``
compiles the ATen graphs it can map (``frontend/torch_backend.py``; ``register_backend()`` names it
in a checkout whose package metadata predates the entry point, ``explain_backend`` shows what
stayed ATen).  torch tensors are also taken by any jitted function directly (``frontend/interop.py``)."""
from __future__ import annotations

from tessera.frontend.torch_backend import ExplainTable, TesseraBackend, explain_backend, register_backend
from tessera.frontend.torch_op import op, result_types

__all__ = ["op", "result_types"]
__all__ += ["register_backend", "explain_backend", "TesseraBackend", "ExplainTable"]
