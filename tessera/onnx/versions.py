"""Which ONNX op versions ``tessera.onnx`` maps, per node rather than per model.

The handlers are written for the default-domain opsets ``MAPPED`` (13..21).  A model may import
another opset: each node is then judged by its op's own version there (``onnx.defs``), since an
opset number moves every op's version bound but most ops do not change:

- below 13, the op's version must be the one it has at 13 (``And`` is version 7 at both; ``Softmax``
  11 treats its axis differently from 13 and is refused);
- above 21, the op's version must be the one it has at 21, or a later version that only changes
  its type constraints (opsets 22..28 added bfloat16, float8, int4 and int2 types to many ops,
  and dropped some: attributes, their defaults, inputs and outputs unchanged; a type the model
  uses that the version does not allow fails ``onnx.checker``) and adds optional attributes the
  node does not set (``Cast``'s ``round_mode``, which rounds only into the float8/float4 types);
- ops added after opset 21 (``INTRODUCED_LATER``) must have the version their handler follows.

``effective(opset)`` is the opset the handlers are told: the model's, clamped into ``MAPPED``.
"""
from __future__ import annotations

MAPPED = range(13, 22)
# ops added after opset 21 whose handlers follow the version named here
INTRODUCED_LATER = {"RMSNormalization": {23}, "Swish": {24}, "CumProd": {26}, "Attention": {23, 24, 25},
                    "RotaryEmbedding": {23},
                    # every version: later ones add types, block_size, output_dtype and precision,
                    # which the handlers read (and refuse where not mapped)
                    "QuantizeLinear": {10, 13, 19, 21, 23, 24, 25, 28},
                    "DequantizeLinear": {10, 13, 19, 21, 23, 24, 25, 28}}


def effective(opset: int) -> int:
    return min(max(opset, MAPPED.start), MAPPED.stop - 1)


def _signature(s, skip=()) -> tuple:
    attrs = tuple(sorted((k, int(v.type), v.required, v.default_value.SerializeToString())
                         for k, v in s.attributes.items() if k not in skip))
    params = tuple((p.name, int(p.option), p.type_str) for p in list(s.inputs) + list(s.outputs))
    return attrs, params, s.min_input, s.max_input, s.min_output, s.max_output


def _types(s) -> dict[str, set[str]]:
    return {tc.type_param_str: set(tc.allowed_type_strs) for tc in s.type_constraints}


def problem(op: str, opset: int, attrs=()) -> str | None:
    """Why ``op`` at the model's ``opset`` is not a version the handlers map (None: it is);
    ``attrs``: the names of the attributes the node sets."""
    import onnx.defs
    if op in INTRODUCED_LATER:
        try:
            have = onnx.defs.get_schema(op, opset).since_version
        except onnx.defs.SchemaError:
            return f"opset {opset} is not supported for {op} (it is new in opset {min(INTRODUCED_LATER[op])})"
        return None if have in INTRODUCED_LATER[op] else (
            f"opset {opset} is not supported for {op}: its version there is {have}, the mapped ones "
            f"{sorted(INTRODUCED_LATER[op])}")
    if opset in MAPPED:
        return None
    try:
        have = onnx.defs.get_schema(op, opset)
        ref = onnx.defs.get_schema(op, effective(opset))
    except onnx.defs.SchemaError:
        return f"opset {opset} is not supported for {op} (onnx has no schema for it there)"
    if have.since_version == ref.since_version:
        return None
    span = f"opsets {MAPPED.start}..{MAPPED.stop - 1}"
    if opset < MAPPED.start:
        return (f"opset {opset} is not supported for {op}: its version there is {have.since_version}, "
                f"the mapped one ({span}) is {ref.since_version}")
    old, new = _types(ref), _types(have)
    added = {k for k, v in have.attributes.items() if k not in ref.attributes and not v.required}
    if added & set(attrs):
        return (f"opset {opset} is not supported for {op}: the node sets {', '.join(sorted(added & set(attrs)))}, "
                f"new in its version {have.since_version}")
    if _signature(have, added) == _signature(ref) and set(old) == set(new):
        return None   # only the types allowed, and optional attributes this node leaves unset, changed
    return (f"opset {opset} is not supported for {op}: its version {have.since_version} changes more than "
            f"types against version {ref.since_version} ({span})")
