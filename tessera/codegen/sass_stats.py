"""Counts over ``nvdisasm`` SASS: the instructions of the innermost loop around a marker
instruction (the k-loop around ``HGMMA``), grouped by class, with or without the edge arms of
its copies.  Counts, not timings: they do not depend on machine load.

The loop is the innermost backward branch whose range holds the marker; every instruction
between its target and the branch is counted once (``static``).  ``fast_path`` drops the basic
blocks of element loads (``LDG``) that end by jumping over the matching ``cp.async`` arm: what
a k-block executes when its operands are 16-byte aligned.
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
    labels = {}
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = None
    # address of each label: the next instruction after it
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


def fast_path(sass: str, body):
    """``body`` less the edge arms of its copies (basic blocks of element loads, LDG, that end
    by jumping over the cp.async arm: taken only for unaligned sources) — what a k-block with
    aligned operands executes (element gathers not in such an arm, e.g. a strided B^T copy
    that cannot use cp.async, are counted)."""
    starts = set()
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            starts.add(m.group(1))
    addr_label = {}
    pending = []
    for line in sass.splitlines():
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        im = _INSN.search(line)
        if im and pending:
            addr_label[int(im.group(1), 16)] = pending
            pending = []
    blocks, cur = [], []
    for x in body:
        if x[0] in addr_label and cur:
            blocks.append(cur)
            cur = []
        cur.append(x)
        if x[1] in ("BRA", "EXIT", "RET"):
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    def edge_arm(blk) -> bool:     # an if-arm of element loads that jumps to the join (an else of cp.async)
        last = blk[-1]
        return any(i[1] == "LDG" for i in blk) and last[1] == "BRA" and not last[2].startswith("@")
    return [x for blk in blocks if not edge_arm(blk) for x in blk]


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
