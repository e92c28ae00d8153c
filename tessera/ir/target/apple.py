"""Target IR for Apple GPUs: the ``tessera_apple`` dialect.

No op is defined before a lowering produces it; the Apple lane (simdgroup_matrix,
emitted as MSL) has no lowering yet, so this dialect is registered and empty.
``tessera mma`` lists the Apple records as "no lowering yet".
"""
from __future__ import annotations

from xdsl.ir import Dialect

APPLE = Dialect("tessera_apple", [], [])
