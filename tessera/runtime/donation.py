"""Donated arguments (``tessera.jit(donate_argnums=...)``): which results the host program writes
into a donated argument's buffer instead of a fresh one.

A kernel says which of its arguments it reads only at the element it writes a given result
(``inplace = ["i:j"]`` on its launch, from the Tile generator: kernels/elementwise.py).  A donated
argument's buffer takes result j of step s when

- the argument is read by step s at every position only where that launch's flag pairs it with j,
- no later step reads it (s is its last reader) and the function does not return it as it is,
- result j has its shape and dtype (the same symbolic sizes), and no other donation took j.

Everything else is allocated as without donation, and the verdict says why.  Per call
(``check_call``), a donated array that cannot be written (read-only, e.g. consumed by an earlier
call) or that shares memory with another argument is refused with ``BAD_DONATION``: writing it
would change an argument that was not donated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.errors import DonationError


@dataclass(frozen=True)
class Donation:
    """The aliasing of one program for one set of donated argument positions."""

    donated: frozenset          # argument positions (indices into the program's inputs)
    per_step: tuple             # per step: ((result position j, argument position), ...)
    verdicts: tuple             # (argument position, honoured?, why), one per donated position

    @property
    def honoured(self) -> tuple[int, ...]:
        return tuple(a for a, ok, _ in self.verdicts if ok)


NONE = Donation(frozenset(), (), ())


def plan(program, donated) -> Donation:
    """Which results of ``program`` (a runtime.cpu.HostProgram) go into which donated argument."""
    donated = frozenset(donated)
    if not donated:
        return NONE
    steps = program.steps
    per_step: list[list] = [[] for _ in steps]
    taken: set = set()
    verdicts = []
    for a in sorted(donated):
        v = program.input_ids[a]
        spec = program.inputs[a]
        readers = [k for k, s in enumerate(steps) if v in s.args]
        why = None
        if v in program.results:
            why = "the function returns it as it is"
        elif not readers:
            why = "no kernel reads it"
        if why is None:
            k = readers[-1]
            s = steps[k]
            flags = {}
            for p in (p for p, x in enumerate(s.args) if x == v):
                flags[p] = {j for i, j in getattr(s, "inplace", ()) if i == p}
            common = set.intersection(*flags.values())
            if not common:
                why = (f"kernel {s.kernel} (its last reader) reads it at other elements than it writes "
                       "(a broadcast, transpose, GEMM, reduction or gather)")
            else:
                fits = [j for j in sorted(common) if s.out_types[j] == spec and (k, j) not in taken]
                # returned results first, in the order they are returned (as jax.jit pairs donated
                # buffers with outputs): p', m', v' of an optimizer land in p, m, v
                order = {r: n for n, r in reversed(list(enumerate(program.results)))}
                fits.sort(key=lambda j: order.get(s.outs[j], len(order)))
                if not fits:
                    why = (f"kernel {s.kernel} writes no result of its shape and dtype "
                           f"({list(spec.dims)} {spec.dtype}) that another donation did not take")
                else:
                    j = fits[0]
                    taken.add((k, j))
                    per_step[k].append((j, a))
                    what = "a result" if s.outs[j] in program.results else "an intermediate"
                    verdicts.append((a, True, f"kernel {s.kernel} writes {what} (its output {j}) in place"))
                    continue
        verdicts.append((a, False, why))
    return Donation(donated, tuple(tuple(x) for x in per_step), tuple(verdicts))


def check_call(arrays, donation: Donation, data_address) -> None:
    """Refuse (``BAD_DONATION``) a call whose honoured donated arrays are read-only or share memory
    with another argument; one sort of the arguments' byte ranges (calls pass hundreds of arrays)."""
    honoured = donation.honoured
    if not honoured:
        return
    for a in honoured:
        if not arrays[a].flags.writeable:
            raise DonationError(
                f"argument {a} is donated but read-only (a donated array is read-only after the call that "
                "consumed it: pass the result, not the old array; a DLPack or JAX array may not be written)")
    mine = set(honoured)
    spans = []
    for i, x in enumerate(arrays):
        if x.nbytes:
            lo = data_address(x)
            spans.append((lo, lo + x.nbytes, i))
    spans.sort()
    end, owner = -1, -1
    for lo, hi, i in spans:
        if lo < end and (i in mine or owner in mine):
            a, b = sorted((i, owner))
            raise DonationError(f"arguments {a} and {b} share memory and one of them is donated: writing it "
                                "would change the other; pass a copy, or do not donate it")
        if hi > end:
            end, owner = hi, i


def consume(arrays, donation: Donation) -> None:
    """After a call: mark the arrays whose buffers now hold results read-only (their old content is
    gone; a write through the old name would change the result, a second donation is refused)."""
    for a in donation.honoured:
        arrays[a].flags.writeable = False


def report(donation: Donation, names=None) -> list[str]:
    """One line per donated argument: honoured or refused, and why (tessera.explain)."""
    out = []
    for a, ok, why in donation.verdicts:
        name = (names or {}).get(a, f"argument {a}")
        out.append(f"{name}: {'honoured' if ok else 'refused'}: {why}")
    return out


__all__ = ["Donation", "NONE", "plan", "check_call", "consume", "report", "np"]
