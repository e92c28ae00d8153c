"""Counts over ``nvdisasm`` SASS: the instructions of the innermost loop around a marker
instruction (the k-loop around ``HGMMA``), grouped by class, with or without the edge arms of
its copies.  Counts, not timings: they do not depend on machine load.

The loop is the innermost backward branch whose range holds the marker; every instruction
between its target and the branch is counted once (``static``).  ``fast_path`` walks one
iteration the way a k-block with aligned, interior operands goes (around the edge arms of its
copies): what such a k-block executes.
"""
from __future__ import annotations

import re
from collections import Counter

_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?\s*([^;]*);")
INT_ALU = ("IMAD", "IADD3", "IADD", "LOP3", "LOP", "SHF", "SHL", "SHR", "LEA", "ISETP", "SEL", "IMNMX", "IABS",
           "MOV", "PRMT", "ULEA", "UIADD3", "UMOV", "USHF", "ULOP3", "UISETP", "USEL", "UIMAD", "VIADD", "VIMNMX",
           "R2UR", "S2R", "S2UR", "PLOP3", "UPLOP3", "P2R", "R2P", "FLO", "POPC", "BMSK", "SGXT", "IMUL")
SYNC = ("BAR", "WARPGROUP", "DEPBAR", "LDGDEPBAR", "WARPSYNC", "FENCE", "MEMBAR", "BSYNC", "BSSY", "ARRIVES")


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """(address, opcode, full text) of every instruction."""
    out = []
    for line in sass.splitlines():
        m = _INSN.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), (m.group(2) or "") + m.group(3) + (m.group(4) or "") + " "
                        + m.group(5)))
    return out


def k_loop(sass: str, marker: str = "HGMMA") -> list[tuple[int, str, str]]:
    """The instructions of the innermost loop that issues ``marker``."""
    ins = instructions(sass)
    addr_of = _label_addrs(sass)
    best = None
    for a, op, text in ins:
        if op != "BRA":
            continue
        m = re.search(r"(\.L_x_\d+)", text)
        if not m or m.group(1) not in addr_of or addr_of[m.group(1)] >= a:
            continue
        lo = addr_of[m.group(1)]
        body = [x for x in ins if lo <= x[0] <= a]
        if any(x[1] == marker for x in body) and (best is None or len(body) < len(best)):
            best = body
    if best is None:
        raise ValueError(f"no backward branch around {marker} found")
    return best


def _label_addrs(sass: str) -> dict[str, int]:
    """The address of each ``.L_x_N`` label: that of the instruction after it."""
    addr_of, pending = {}, []
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        im = _INSN.search(line)
        if im and pending:
            for p in pending:
                addr_of[p] = int(im.group(1), 16)
            pending = []
    return addr_of


def fast_path(sass: str, body):
    """The path through ``body`` (one iteration) a k-block with aligned, interior operands takes:
    from the loop head, an unconditional forward branch is followed, a conditional one is taken
    when the code it skips issues element loads (``LDG``) or zero-filling copies (``ZFILL``: the
    edge and partial-block arms), else falls through; the walk ends at the loop's back branch."""
    addr_of = _label_addrs(sass)
    index = {x[0]: i for i, x in enumerate(body)}
    out, i = [], 0
    while i < len(body):
        a, op, text = body[i]
        out.append(body[i])
        if i == len(body) - 1:
            break
        if op == "BRA":
            m = re.search(r"(\.L_x_\d+)", text)
            t = addr_of.get(m.group(1)) if m else None
            if t is not None and t in index and index[t] > i:
                skipped = body[i + 1:index[t]]
                if not text.startswith("@") or any(x[1] == "LDG" or "ZFILL" in x[2] for x in skipped):
                    i = index[t]
                    continue
        i += 1
    return out


def classify(body) -> dict[str, int]:
    c = Counter()
    for _, op, text in body:
        c["total"] += 1
        if op == "HGMMA":
            c["HGMMA"] += 1
        elif op in ("LDG", "LDGSTS", "UTMALDG", "UBLKCP"):
            c[op] += 1
        elif op in ("STS", "LDS"):
            c[op] += 1
        elif op in INT_ALU:
            c["int_alu"] += 1
        elif op in SYNC:
            c["sync"] += 1
        else:
            c["other"] += 1
    return dict(c)



def loop_counts(sass: str, marker: str = "HGMMA") -> dict[str, dict[str, int]]:
    """``{"static": ..., "fast": ...}`` class counts of the loop around ``marker``."""
    body = k_loop(sass, marker)
    return {"static": classify(body), "fast": classify(fast_path(sass, body))}


__all__ = ["instructions", "k_loop", "fast_path", "classify", "loop_counts"]
