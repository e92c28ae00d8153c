"""What ``tessera.grad`` does with each op of the registry (``opset.py``), beside it.

Every op is in exactly one of three states, checked by ``tests/test_grad_rules.py``:

* **differentiable**: it has a vjp rule (``frontend/vjp_rules.py``, ``frontend/vjp_rules_nn.py``,
  keyed by the op name; the rules emit ``tessera.ops`` calls, so they live in the frontend);
* **declared non-differentiable** (:data:`NON_DIFFERENTIABLE`, with the reason): no cotangent
  flows through it — its result is an int or bool, a count, an index, or piecewise constant
  (derivative 0 almost everywhere, as JAX and torch give);
* **refused**: neither of the above; a gradient that would flow through it raises
  ``GRAD_NO_RULE`` naming the op — never a silent zero gradient.  A new op starts here.
"""
from __future__ import annotations

_BOOL = "its result is bool"
_INT = "its result is an integer index"
_FLAT = "piecewise constant: its derivative is 0 wherever it exists"

NON_DIFFERENTIABLE: dict[str, str] = {
    "sign": _FLAT, "floor": _FLAT, "ceil": _FLAT, "round": _FLAT, "floor_divide": _FLAT,
    "isnan": _BOOL, "isinf": _BOOL, "isfinite": _BOOL, "bitwise_not": _BOOL + " or int",
    "equal": _BOOL, "not_equal": _BOOL, "less": _BOOL, "less_equal": _BOOL, "greater": _BOOL,
    "greater_equal": _BOOL, "bitwise_and": _BOOL + " or int", "bitwise_or": _BOOL + " or int",
    "bitwise_xor": _BOOL + " or int", "left_shift": "integer only", "right_shift": "integer only",
    "reduce_any": _BOOL, "reduce_all": _BOOL,
    "iota": "an index computed from no input", "constant": "a number: no input",
    "argmax": _INT, "argmin": _INT, "top_k_indices": _INT, "one_hot": "its input is an integer label",
    "cross_entropy_valid": "a count of the labels not ignored (its value does not depend on the loss)",
    "fusion": "made by the fusion passes after differentiation (never traced)",
    "yield": "made by the fusion passes after differentiation (never traced)",
}

__all__ = ["NON_DIFFERENTIABLE"]
