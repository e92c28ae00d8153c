"""The device scripts' one timer: the median of CUDA-event times (ms) of ``call`` after a warm-up,
each repeat bracketed by its own pair of events on the current stream."""
from __future__ import annotations

import statistics


def median_ms(call, reps: int = 20, warmup: int = 3) -> float:
    import torch
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        call()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)
