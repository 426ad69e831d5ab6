"""The one exactness check the decoding tests share: same tokens, and logits within 1e-4 or bit for bit."""

import torch


def check_same(res, ref, bitwise: bool = False) -> None:
    """``res`` and ``ref`` are GenerationResults with recorded logits; ``bitwise`` for batch-invariant kernels."""
    assert res.token_ids == ref.token_ids
    assert len(res.logits) == len(ref.logits)
    diff = (torch.stack(res.logits) - torch.stack(ref.logits)).abs().max()
    assert diff == 0 if bitwise else diff <= 1e-4, f"max |dlogit| {float(diff):.3g}"
