"""Per-step cost of a wire defense alone (issue 13 item 3: noise and quant <= 1 ms per step at d = 576)."""

from __future__ import annotations

import time

import torch

from splitinfer.defenses import DefensePipeline


def overhead_ms(spec: str, d: int, tokens: int = 1, reps: int = 200) -> float:
    """Milliseconds per step of a wire defense alone: client transform + encode, cloud decode, reply both ways.

    One torch thread (tensors this small gain nothing from more; on a shared 2-core machine the intra-op pool's
    waits made an 8-token step 50x slower); the best of three rounds of ``reps``.
    """
    pipe = DefensePipeline.parse(spec)
    x = torch.randn(1, tokens, d).to(torch.float16)
    pos = list(range(100, 100 + tokens))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                up = pipe.decode_up(pipe.encode_up(pipe.transform_up(x, pos, 0, pos)), d)
                pipe.decode_down(pipe.encode_down(up, pos, 0), d)
            best = min(best, 1e3 * (time.perf_counter() - t0) / reps)
    finally:
        torch.set_num_threads(threads)
    return best
