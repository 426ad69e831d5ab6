"""White-box output attack (``tail-logits``): run the public tail and LM head on the states the body returns.

With a split ``A,B`` the cloud returns, for every position, the residual
stream after ``L - B`` layers; the user's tail (the last ``B`` published
layers, the final norm and the LM head) turns it into the next-token logits
and samples from them. An attacker holding the published weights does the
same computation: it runs the public tail causally over each sequence of
returned states and reads the argmax (top-k) of the logits. Greedy output is
then recovered exactly, up to the wire precision; sampled output is
recovered as the most likely token (the attacker does not know the user's
sampling draws). This is the logit lens of nostalgebraist (2020) with the
real remaining layers instead of none, so it is exact rather than a lens.

:attr:`reads` is ``next``: the guess at row t is the token generated from the
state at t (token t+1 of the sequence), so the harness scores it against the
following token or, on wire taps, the generated token. Each sequence of the
taps must start at position 0 and hold the states in causal order: true of
teacher-forced taps and of the committed rows of a wire session (a committed
draft token attends only to its committed ancestors, so its returned state is
the causal one). No training: ``fit`` only records the boundary.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attacks.base import Inversion, InversionAttack
from attacks.errors import AttackError
from attacks.registry import register_attack
from attacks.tapdata import Taps
from attacks.boundary import Boundary


@register_attack("tail-logits")
class TailLogits(InversionAttack):
    """White-box exact: the public tail layers + LM head on the returned states give the next token (no training)."""

    threat_model = "white-box (exact)"
    requires = frozenset({"tail_weights", "lm_head"})
    boundary_side = "tail"
    reads = "next"
    defaults = {"max_seq_tokens": 4096}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._tail = None

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        self._need_model()
        self.fit_report["trained"] = False  # nothing to learn: the published weights are the attack

    def _tail_layers(self) -> int:
        b = self.meta.get("boundary")
        boundary = Boundary.parse(b) if b else None
        if boundary is None or boundary.side != "tail":
            raise AttackError(f"tail-logits needs taps at a tail boundary (tail:B), got {b or 'none'}")
        return boundary.layers

    def _stack(self) -> Any:
        from splitinfer.partition import LocalTail, SplitConfig

        model = self._need_model()
        if self._tail is None:
            self._tail = LocalTail(model.model, SplitConfig(1, self._tail_layers())).eval()
        return self._tail

    @torch.no_grad()
    def _invert(self, taps: Taps, k: int) -> Inversion:
        tail = self._stack()
        param = next(tail.parameters())
        topk = np.empty((taps.n_tokens, k), dtype=np.int64)
        scores = np.empty((taps.n_tokens, k), dtype=np.float32)
        cap = int(self.hparams["max_seq_tokens"])
        for _, rows in taps.sequences():
            n = rows.stop - rows.start
            if n > cap:
                raise AttackError(f"a sequence of {n} states exceeds max_seq_tokens={cap}; raise it")
            h = torch.from_numpy(np.asarray(taps.hidden[rows], dtype=np.float32)).to(param.device, param.dtype)
            logits = tail(h[None], torch.arange(n), tail.new_cache())[0]  # (T, V) fp32
            val, idx = torch.log_softmax(logits, -1).topk(k, dim=-1)  # (T, k)
            topk[rows], scores[rows] = idx.cpu().numpy(), val.cpu().numpy()
        return Inversion(topk[:, 0], topk, scores, {"what": "token generated from each state (next token)"})

    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        pass  # the published weights are the whole attack
