"""A learned attacker decoded with the public model as a language prior (``lm-beam``).

Any learned per-token attacker (``base``: ``linear-probe``, ``mlp``,
``seq-decoder``, ... with its own options ``base.KEY=VALUE``) gives, at each
position, its top ``candidates`` tokens with log-probabilities; a beam search
(:func:`attacks.recipes._beam.beam_decode`, ``beam`` paths per sequence) then
picks the sequence maximising ``sum_t log p_attack(x_t) + lam * log
p_LM(x_t | x_<t)``, where ``p_LM`` is the public model's own next-token
distribution, run forward as an ordinary language model. ``lam`` is chosen on
validation taps from ``lams`` (``lam=auto``; 0 is always among the choices,
and is the base attacker's argmax) or fixed (``lam=0.5``).

This is the idea of BiSR (Chen et al., CCS 2024, "Unveiling the vulnerability
of private fine-tuning in split-based frameworks for large language models:
a bidirectionally enhanced attack"), whose learning-based inversion is
refined with the public model's own language modelling, and of the
decoding-time language prior of Depth-TBS-style attacks: the attacker's
per-position evidence is combined with a prior over text, as in noisy-channel
decoding. Deviations: BiSR refines its recovered tokens by optimisation
against the observed states (forward and backward, which needs the local
layers' weights at attack time); here the prior only re-ranks the learned
attacker's candidates, so the attacker never inverts or differentiates
through the local layers and still applies when those are private (threat
model ``white-box (learned)``, or ``shadow`` against a privately changed
victim). The candidate log-probabilities are renormalised over the top
``candidates``; a true token outside them cannot be recovered. With no
validation taps the base attacker is fitted on 90% of the training sequences
and ``lam`` is chosen on the rest; with validation taps the base attacker's
early stopping and ``lam`` use the same validation taps.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from attacks.base import Inversion, InversionAttack
from attacks.errors import AttackError
from attacks.recipes._beam import CausalLMPrior, beam_decode
from attacks.registry import get_attack_class, make_attack, register_attack
from attacks.tapdata import Taps

log = logging.getLogger(__name__)


@register_attack("lm-beam")
class LMPriorBeam(InversionAttack):
    """A learned attacker's top-k re-ranked by beam search with the public model as a language prior."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs", "language_model"})
    boundary_side = "head"
    defaults = {"base": "linear-probe", "base_options": {}, "candidates": 8, "beam": 4, "lam": "auto",
                "lams": [0.25, 0.5, 1.0], "val_tokens": 2000, "batch_sequences": 48}

    def __init__(self, **kwargs: Any):
        nested = {k[5:]: kwargs.pop(k) for k in list(kwargs) if k.startswith("base.")}  # base.KEY=VALUE options
        if nested:
            kwargs["base_options"] = {**dict(kwargs.get("base_options") or {}), **nested}
        super().__init__(**kwargs)
        hp = self.hparams
        base = get_attack_class(str(hp["base"]))  # AttackError naming the known recipes when unknown
        if base is type(self) or base.threat_model != "white-box (learned)" or base.reads != "current" \
                or not issubclass(base, InversionAttack) or base.boundary_side != "head":
            raise AttackError(f"lm-beam base={hp['base']!r} is not a learned per-token attacker of the head "
                              "boundary; choose e.g. base=linear-probe, base=mlp or base=seq-decoder")
        if not isinstance(hp["base_options"], dict):
            raise AttackError(f"lm-beam base_options={hp['base_options']!r}; give base.KEY=VALUE options instead")
        for key in ("candidates", "beam", "val_tokens", "batch_sequences"):
            self.require_int(key)
        if hp["beam"] > hp["candidates"]:
            raise AttackError(f"lm-beam beam={hp['beam']} exceeds candidates={hp['candidates']}; give "
                              f"candidates >= beam")
        lams = hp["lams"] if isinstance(hp["lams"], (list, tuple)) else str(hp["lams"]).split(",")
        lams = [_number(x) for x in lams]
        if not all(_weight(x) is not None for x in lams) or (hp["lam"] != "auto" and _weight(hp["lam"]) is None):
            raise AttackError(f"lm-beam lam={hp['lam']!r}, lams={hp['lams']!r}; give lam=auto or a number >= 0, "
                              "and lams as numbers >= 0 (e.g. lams=0.25,0.5,1)")
        self.hparams["lams"] = [float(x) for x in lams]
        self.base: InversionAttack | None = None
        self.lam = 0.0

    @classmethod
    def proposer_of(cls, hparams: dict[str, Any]) -> str | None:
        """The base recipe: a harness that fits it on the same boundary passes it to :meth:`set_proposer`."""
        return str({**cls.defaults, **hparams}["base"])

    def set_proposer(self, base: InversionAttack) -> None:
        """Use an attacker already fitted on the same boundary (its recipe must be ``base``)."""
        if base.name != self.hparams["base"] or not base.fitted:
            raise AttackError(f"lm-beam was given a {'fitted ' if base.fitted else 'unfitted '}{base.name!r} "
                              f"attacker; it re-ranks a fitted {self.hparams['base']!r}")
        self.base = base

    def _prior(self) -> CausalLMPrior:
        model = self._need_model()
        tok = model.tokenizer
        start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        return CausalLMPrior(model.model, start)

    # ------------------------------------------------------------ fit
    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        self._need_model()
        if self.base is None:
            if val is None:  # hold out whole sequences for choosing lam
                n_val = max(1, len(train) // 10)
                perm = np.random.default_rng(self.seed).permutation(len(train))
                val, train = train.select_sequences(np.sort(perm[:n_val])), train.select_sequences(np.sort(perm[n_val:]))
                base_val = None
            else:
                base_val = val
            self.base = make_attack(self.hparams["base"], model=self.model, seed=self.seed,
                                    **self.hparams["base_options"]).fit(train, base_val, trainer=trainer)
        self.fit_report["base"] = {k: v for k, v in self.base.fit_report.items() if isinstance(v, (int, float, str))}
        if self.hparams["lam"] != "auto":
            self.lam = float(self.hparams["lam"])
            return
        if val is None:
            raise AttackError("lm-beam with lam=auto and a pre-fitted base needs validation taps to choose lam; "
                              "give val taps or a fixed lam (e.g. lam=0.5)")
        val = val.spread_tokens(int(self.hparams["val_tokens"]))
        cand, logp = self._candidates(val, 1)
        grid = {0.0: float((cand[:, 0] == val.token_ids).mean())}  # lam = 0: the base attacker's argmax
        for lam in self.hparams["lams"]:
            if lam > 0:
                grid[lam] = float((self._decode(val, cand, logp, lam) == val.token_ids).mean())
        self.lam = max(grid, key=lambda x: (grid[x], -x))  # ties: the smaller weight
        self.fit_report.update(lam=self.lam, lam_val_top1={str(k): v for k, v in grid.items()},
                               lam_val_tokens=int(val.n_tokens))
        log.info("lm-beam: lam=%g (validation top-1 %s)", self.lam, grid)

    # ------------------------------------------------------------ invert
    def _candidates(self, taps: Taps, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(N, max(K, k)) candidate ids of the base attacker and (N, K) log-probs renormalised over the top K."""
        kk = int(self.hparams["candidates"])
        inv = self.base.invert(taps, k=max(kk, k))
        scores = np.where(np.isfinite(inv.scores[:, :kk]), inv.scores[:, :kk], -1e9)  # no NaN / inf in the beam
        logp = torch.log_softmax(torch.from_numpy(scores).double(), dim=1).float().numpy()
        return inv.topk, logp

    def _decode(self, taps: Taps, cand: np.ndarray, logp: np.ndarray, lam: float) -> np.ndarray:
        """(N,) best-path tokens of ``taps`` under weight ``lam``, ``batch_sequences`` sequences of similar length at
        a time (R = batch_sequences x beam rows of the LM and its KV cache)."""
        kk = logp.shape[1]
        starts, lens = taps.seq_starts(), np.asarray(taps.seq_lengths)
        out = np.empty(taps.n_tokens, dtype=np.int64)
        lm = self._prior()
        step = int(self.hparams["batch_sequences"])
        by_length = np.argsort(-lens, kind="stable")  # batches of similar lengths: little padding
        for a in range(0, len(taps), step):
            seqs = by_length[a: a + step]
            t_n = int(lens[seqs].max())
            ids = np.zeros((len(seqs), t_n, kk), dtype=np.int64)  # (S, T, K)
            lp = np.zeros((len(seqs), t_n, kk), dtype=np.float32)
            for i, s in enumerate(seqs):
                ids[i, : lens[s]] = cand[starts[s]: starts[s + 1], :kk]
                lp[i, : lens[s]] = logp[starts[s]: starts[s + 1]]
            path = beam_decode(ids, lp, lens[seqs], lm, lam, int(self.hparams["beam"]))  # (S, T)
            for i, s in enumerate(seqs):
                out[starts[s]: starts[s + 1]] = path[i, : lens[s]]
        return out

    def _invert(self, taps: Taps, k: int) -> Inversion:
        cand, logp = self._candidates(taps, k)
        path = cand[:, 0] if self.lam == 0 else self._decode(taps, cand, logp, self.lam)  # (N,)
        order = np.argsort(cand != path[:, None], axis=1, kind="stable")  # the path's token first, then the rest
        topk = np.take_along_axis(cand, order, axis=1)[:, :k]  # (N, k)
        full = np.concatenate([logp, np.full((len(logp), cand.shape[1] - logp.shape[1]), -1e9, np.float32)], 1)
        scores = np.take_along_axis(full, order, axis=1)[:, :k]  # (N, k)
        return Inversion(path, topk, scores, {"lam": self.lam})

    # ------------------------------------------------------------ persistence
    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors, cfg = self.base.parts()
        return {f"base.{k}": v for k, v in tensors.items()}, {"lam": self.lam, "base": cfg}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        cfg = state["base"]
        self.base = get_attack_class(cfg["recipe"]).from_parts(
            cfg, {k[5:]: v for k, v in tensors.items() if k.startswith("base.")}, model=self.model,
            where="the lm-beam checkpoint's base attacker")
        self.lam = float(state["lam"])


def _number(x: Any) -> Any:
    """``x`` as a float when it is a numeric string (``lams=0.25,0.5``), else unchanged."""
    try:
        return float(x) if isinstance(x, str) else x
    except ValueError:
        return x


def _weight(x: Any) -> float | None:
    """A prior weight >= 0, or None when ``x`` is not one."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0:
        return None
    return float(x)
