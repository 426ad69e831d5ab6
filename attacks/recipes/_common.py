"""Shared pieces of the learned attackers: input standardisation and a restricted-softmax token classifier.

:class:`TokenClassifier` is the base of ``linear-probe``, ``mlp``,
``seq-decoder`` and ``output-probe``. It

- standardises hidden states per dimension with the training mean and std
  (robust to the few outlier dimensions with huge activations), then clips to
  +-``clip`` standard deviations;
- trains a softmax over the *restricted vocabulary*: the tokens that occur as
  targets in the training set. Deviation from a full-vocabulary softmax, for
  CPU speed: a token never seen in training gets no output row. With
  ``backoff`` (``auto``: on when a model is given and there is one head),
  tokens seen fewer than ``min_count`` times train an ``<unk>`` class whose
  mass -- mixed with an embedding-space route -- goes to the rest of the full
  vocabulary (:mod:`attacks.recipes._backoff`); without it, unseen tokens are
  never guessed. The returned guesses are token ids of the full vocabulary.
  With ``output=tied`` the network instead ends in the public embedding
  matrix and scores every token of the vocabulary (:mod:`attacks.recipes._tied`;
  no backoff then);
- trains with :func:`attacks.trainer.fit_module` (AdamW, early stopping on
  validation top-1, checkpoints, resume, DDP), token rows or whole sequences
  (``sequence_level``) as items;
- supports several output heads (``n_heads``) over the same vocabulary with
  one target column each (``output-probe``: current and next token).
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from attacks.base import Inversion, InversionAttack
from attacks.errors import AttackError
from attacks.tapdata import Taps
from attacks.trainer import fit_module

log = logging.getLogger(__name__)

IGNORE = -100
PAIRED_MIN_VAL = 20  # held-out known-plaintext pairs below which fine_tune does not validate
_CHUNK = 4096  # rows per scoring chunk


def fit_standardizer(hidden: np.ndarray, max_rows: int = 200_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-dimension (mean, std) of hidden states, shape (d,) each, from at most ``max_rows`` sampled rows."""
    n = len(hidden)
    rows = np.sort(np.random.default_rng(seed).choice(n, max_rows, replace=False)) if n > max_rows else slice(None)
    x = np.asarray(hidden[rows], dtype=np.float64)  # (n', d)
    mu, sd = x.mean(axis=0), x.std(axis=0)
    return mu.astype(np.float32), np.maximum(sd, 1e-6).astype(np.float32)


def standardize(hidden: np.ndarray, mu: np.ndarray, sd: np.ndarray, clip: float = 10.0) -> torch.Tensor:
    """(N, d) -> float32 (N, d) tensor of (h - mu) / sd clipped to +-clip."""
    out = np.empty(hidden.shape, dtype=np.float32)
    for a in range(0, len(hidden), 65536):
        x = (np.asarray(hidden[a: a + 65536], dtype=np.float32) - mu) / sd
        out[a: a + 65536] = np.clip(x, -clip, clip) if clip else x
    return torch.from_numpy(out)


class TokenClassifier(InversionAttack):
    """Base of the softmax attackers (restricted training vocabulary; see the module docstring)."""

    sequence_level: ClassVar[bool] = False
    n_heads: ClassVar[int] = 1
    defaults: ClassVar[dict[str, Any]] = {"epochs": 10, "lr": 2e-3, "batch_size": 256, "weight_decay": 0.0,
                                          "clip": 10.0, "device": "auto", "backoff": "auto", "min_count": 2,
                                          "output": "restricted", "negatives": 4096}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.module: nn.Module | None = None
        self.mu = self.sd = self.vocab = None
        self.backoff = None  # a fitted linear-embed for the <unk> class (see attacks.recipes._backoff)
        self.tau, self.lam = 0.2, 1.0
        if self.hparams["backoff"] not in ("auto", "embed", "none"):
            raise AttackError(f"backoff={self.hparams['backoff']!r}; choose auto (embed when a model is given), "
                              "embed or none")
        if self.hparams["output"] not in ("restricted", "tied"):
            raise AttackError(f"output={self.hparams['output']!r}; choose restricted (one row per training token) "
                              "or tied (every token, through the public embedding matrix)")
        if self.tied and self.n_heads != 1:
            raise AttackError(f"attack {self.name!r} has {self.n_heads} output heads; output=tied supports one; "
                              "use output=restricted")

    @property
    def tied(self) -> bool:
        """Whether the output is tied to the embedding matrix (full vocabulary, :mod:`attacks.recipes._tied`)."""
        return self.hparams["output"] == "tied"

    @property
    def unk(self) -> bool:
        """Whether the last class is <unk> (the embedding backoff is on)."""
        return self.backoff is not None

    # ------------------------------------------------------------ to implement
    @abstractmethod
    def _build(self, d_in: int, n_classes: int) -> nn.Module:
        """Token level: (B, d) -> (B, n_heads * n_classes); sequence level: (B, T, d), pad (B, T) -> (B, T, ...)."""

    def _targets(self, taps: Taps) -> np.ndarray:
        """(N, n_heads) target ids, IGNORE where there is none. Default: the token itself."""
        return taps.token_ids[:, None]

    def _combine(self, logp: torch.Tensor, taps: Taps) -> torch.Tensor:
        """(N, n_heads, V_r) log-probs -> (N, V_r) scores of each position's own token. Default: head 0."""
        return logp[:, 0]

    def _warm_start(self, module: nn.Module, x: torch.Tensor, y: torch.Tensor, trainer: Any) -> None:
        """Hook run after the module is built, before training (x: (N, d) inputs, y: (N, H) restricted targets)."""

    # ------------------------------------------------------------ training
    def _device(self) -> torch.device:
        """Training / scoring device: the accelerator's under ``accelerate launch``, else ``device`` (auto: CUDA?)."""
        from attacks.trainer import get_accelerator

        acc = get_accelerator()
        if acc is not None:
            return acc.device
        dev = self.hparams["device"]
        return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else dev)

    def _prepare(self, taps: Taps) -> torch.Tensor:
        return standardize(taps.hidden, self.mu, self.sd, self.hparams["clip"])  # (N, d)

    def _forward(self, module: nn.Module, x: torch.Tensor, taps_seqs: Any = None) -> torch.Tensor:
        """Token rows (B, d) or padded sequences -> (B[, T], n_heads, V_r) logits."""
        dev = next(module.parameters()).device
        out = module(*(t.to(dev) for t in x)) if isinstance(x, tuple) else module(x.to(dev))
        return out.reshape(*out.shape[:-1], self.n_heads, -1)

    def _seq_batch(self, x: torch.Tensor, starts: np.ndarray, seqs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad the sequences ``seqs`` of x into (B, T, d) and a (B, T) padding mask (True = pad)."""
        lens = starts[seqs + 1] - starts[seqs]
        t = int(lens.max())
        xb = x.new_zeros((len(seqs), t, x.shape[1]))  # (B, T, d)
        pad = torch.ones((len(seqs), t), dtype=torch.bool)  # (B, T)
        for b, s in enumerate(seqs):
            xb[b, : lens[b]] = x[starts[s]: starts[s + 1]]
            pad[b, : lens[b]] = False
        return xb, pad

    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None:
        hp = self.hparams
        self.mu, self.sd = fit_standardizer(train.hidden, seed=self.seed)
        y_full = self._targets(train)  # (N, H)
        ids, counts = np.unique(y_full[y_full != IGNORE], return_counts=True)
        if ids.size == 0:
            raise AttackError(f"attack {self.name!r}: the training taps hold no targets; give more tokens")
        mode = "none" if self.tied else hp["backoff"]
        if mode == "embed" or (mode == "auto" and self.model is not None and self.n_heads == 1):
            from attacks.recipes import _backoff

            if self.n_heads != 1:
                raise AttackError(f"attack {self.name!r} has {self.n_heads} output heads; the embedding backoff "
                                  "supports one; use backoff=none")
            self.backoff = _backoff.fit_backoff(self._need_embedding(), train, val, self.seed)
            ids = ids[counts >= int(hp["min_count"])] if (counts >= int(hp["min_count"])).any() else ids
        if self.tied:  # a sampled softmax while training: seen tokens and drawn negatives
            from attacks.recipes._tied import training_ids

            ids = training_ids(ids, self._vocab_size(), int(hp["negatives"]), self.seed)
        self.vocab = ids  # (V_r,) known tokens; with the backoff, class V_r is <unk>
        y = torch.from_numpy(self._map(y_full))  # (N, H) restricted ids / <unk> / IGNORE
        x = self._prepare(train)  # (N, d)
        self.module = self._make_module(train.hidden_size, len(self.vocab)).to(self._device())
        if self.tied:
            self.module.proj.ids = torch.from_numpy(self.vocab)
        ce = nn.CrossEntropyLoss(ignore_index=IGNORE)
        self._warm_start(self.module, x, y, trainer)
        if self.sequence_level:
            starts = train.seq_starts()

            def loss_fn(module: nn.Module, idx: torch.Tensor) -> torch.Tensor:
                seqs = idx.numpy()
                xb, pad = self._seq_batch(x, starts, seqs)
                yb = torch.full((len(seqs), xb.shape[1], self.n_heads), IGNORE, dtype=torch.long)  # (B, T, H)
                for b, s in enumerate(seqs):
                    yb[b, : starts[s + 1] - starts[s]] = y[starts[s]: starts[s + 1]]
                logits = self._forward(module, (xb, pad))  # (B, T, H, V_r)
                return ce(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1).to(logits.device))

            n_items = len(train)
        else:
            rows = torch.from_numpy(np.flatnonzero((y != IGNORE).any(dim=1).numpy()))
            loss_fn = self._token_loss(x, y, rows)
            n_items = len(rows)
        val_fn = None if val is None else self._val_top1(val)
        report = fit_module(self.module, n_items, loss_fn, epochs=hp["epochs"], lr=hp["lr"],
                            batch_size=hp["batch_size"], weight_decay=hp["weight_decay"], seed=self.seed,
                            val_fn=val_fn, cfg=trainer, tag=self.name)
        self.fit_report.update(report, restricted_vocab=int(len(self.vocab)), backoff="embed" if self.unk else "none",
                               output=hp["output"])
        if self.tied:  # score every token of the vocabulary from now on
            self.module.proj.ids = None
            self.vocab = np.arange(self._vocab_size(), dtype=np.int64)
        if self.unk and val is not None:
            from attacks.recipes import _backoff

            self.tau, self.lam, grid = _backoff.choose(self.backoff, val, self._combine(self._logp(val), val),
                                                       self.vocab)
            self.fit_report.update(backoff_tau=self.tau, backoff_lam=self.lam, backoff_val_top1=grid)

    def _token_loss(self, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor):
        """Cross-entropy of a batch of token rows (x: (N, d) inputs, y: (N, H) restricted targets)."""
        ce = nn.CrossEntropyLoss(ignore_index=IGNORE)

        def loss_fn(module: nn.Module, idx: torch.Tensor) -> torch.Tensor:
            r = rows[idx]
            logits = self._forward(module, x[r])  # (B, H, V_r)
            return ce(logits.reshape(-1, logits.shape[-1]), y[r].reshape(-1).to(logits.device))

        return loss_fn

    def _val_top1(self, val: Taps) -> Callable[[nn.Module], float]:
        """A function giving a module's top-1 on ``val`` over the restricted ids (what training maximises)."""
        yv = self._map(self._targets(val))  # (Nv, H)
        ok = yv != IGNORE

        def val_fn(module: nn.Module) -> float:
            pred = self._logp(val, module).argmax(-1).numpy()  # (Nv, H)
            return float((pred == yv)[ok].mean()) if ok.any() else 0.0

        return val_fn

    def fine_tune(self, pairs: Taps, epochs: int = 10, lr: float | None = None, val_share: float = 0.2) -> int:
        """Continue training the fitted classifier on known-plaintext (state, token) pairs; return how many counted.

        The ``paired`` threat model of DESIGN.md section 4: an attacker fitted on its own public-model pairs
        that also holds ``k`` pairs from the deployment. The standardiser and the restricted vocabulary stay
        those of the first fit (a token outside it counts as ``<unk>`` with the backoff, else is skipped).
        With at least ``PAIRED_MIN_VAL / val_share`` pairs, the last ``val_share`` of them are held out: training
        stops early on them, and the classifier keeps its public weights when fine-tuning does not beat them
        there (unvalidated, 10 epochs on 10,000 pairs lowered a probe from 95.0% to 89.9% in the full suite's
        lora-private row: it forgot what the pairs did not show).
        """
        if self.module is None or self.sequence_level:
            raise AttackError(f"attack {self.name!r}: fine_tune needs a fitted token-level classifier")
        hp = self.hparams
        n_val = int(pairs.n_tokens * val_share) if pairs.n_tokens * val_share >= PAIRED_MIN_VAL else 0
        fit_part = pairs.select_tokens(range(pairs.n_tokens - n_val)) if n_val else pairs
        x = self._prepare(fit_part)  # (k', d)
        y = torch.from_numpy(self._map(self._targets(fit_part)))  # (k', H)
        rows = torch.from_numpy(np.flatnonzero((y != IGNORE).any(dim=1).numpy()))
        if len(rows) == 0:  # nothing to learn from: the public fit stands, and the report says so for this k
            self.fit_report.update(paired_pairs=0, paired_val_pairs=0, paired_val_top1_public=None,
                                   paired_val_top1_tuned=None, paired_kept_public=False)
            return 0
        val_fn = self._val_top1(pairs.select_tokens(range(pairs.n_tokens - n_val, pairs.n_tokens))) if n_val else None
        public = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        before = val_fn(self.module) if val_fn else None
        fit_module(self.module, len(rows), self._token_loss(x, y, rows), epochs=epochs, lr=lr or hp["lr"],
                   batch_size=min(int(hp["batch_size"]), len(rows)), weight_decay=hp["weight_decay"], seed=self.seed,
                   val_fn=val_fn, tag=f"{self.name}+paired")
        after = val_fn(self.module) if val_fn else None
        kept = before is not None and after <= before
        if kept:
            self.module.load_state_dict(public)
        self.fit_report.update(paired_pairs=int(len(rows)), paired_val_pairs=n_val, paired_val_top1_public=before,
                               paired_val_top1_tuned=after, paired_kept_public=kept)
        return int(len(rows))

    def _need_embedding(self) -> Any:
        if self.model is None:
            what = "output=tied" if self.tied else "backoff=embed"
            raise AttackError(f"attack {self.name!r} with {what} needs the model's embedding matrix; pass "
                              f"model=load_model(<spec>) or use {'output=restricted' if self.tied else 'backoff=none'}")
        return self.model

    def _embedding(self) -> torch.Tensor:
        from attacks.recipes._tied import embedding_matrix

        return embedding_matrix(self._need_embedding())  # (V, d_e)

    def _vocab_size(self) -> int:
        return int(self._embedding().shape[0])

    def _make_module(self, d_in: int, n_classes: int) -> nn.Module:
        """The recipe's network for ``n_classes`` outputs (+ <unk>), or ending in the tied embedding (output=tied)."""
        if not self.tied:
            return self._build(d_in, n_classes + int(self.unk))
        from attacks.recipes._tied import TiedOutput

        emb = self._embedding()
        return TiedOutput(self._build(d_in, int(emb.shape[1])), emb)

    def _map(self, ids: np.ndarray) -> np.ndarray:
        """Full-vocabulary ids -> restricted ids (<unk> or IGNORE where absent)."""
        absent = len(self.vocab) if self.unk else IGNORE
        lut = np.full(max(int(ids.max(initial=0)), int(self.vocab.max())) + 1, absent, dtype=np.int64)
        lut[self.vocab] = np.arange(len(self.vocab))
        out = np.full(ids.shape, IGNORE, dtype=np.int64)
        ok = ids >= 0
        out[ok] = lut[ids[ok]]
        return out

    # ------------------------------------------------------------ scoring
    @torch.no_grad()
    def _logp_chunks(self, taps: Taps, module: nn.Module | None = None):
        """Yield (first row, (n, H, V_r) log-probabilities) for consecutive chunks of the rows of ``taps``."""
        module = module or self.module
        module.eval()
        x = self._prepare(taps)
        if self.sequence_level:
            starts = taps.seq_starts()
            for a in range(0, len(taps), 16):
                seqs = np.arange(a, min(a + 16, len(taps)))
                xb, pad = self._seq_batch(x, starts, seqs)
                lp = torch.log_softmax(self._forward(module, (xb, pad)), dim=-1).cpu()  # (B, T, H, V_r)
                yield int(starts[a]), torch.cat([lp[b, : starts[s + 1] - starts[s]] for b, s in enumerate(seqs)])
        else:
            for a in range(0, taps.n_tokens, _CHUNK):
                yield a, torch.log_softmax(self._forward(module, x[a: a + _CHUNK]), dim=-1).cpu()

    def _logp(self, taps: Taps, module: nn.Module | None = None) -> torch.Tensor:
        """(N, H, V_r) log-probabilities over the restricted vocabulary."""
        out = torch.empty((taps.n_tokens, self.n_heads, len(self.vocab) + int(self.unk)))
        for a, lp in self._logp_chunks(taps, module):
            out[a: a + len(lp)] = lp
        return out

    def _invert(self, taps: Taps, k: int) -> Inversion:
        if self.tied:  # full vocabulary: top-k chunk by chunk, never (N, V) at once
            parts = [lp[:, 0].topk(k, dim=-1) for _, lp in self._logp_chunks(taps)]
            val, idx = torch.cat([p.values for p in parts]), torch.cat([p.indices for p in parts])  # (N, k)
            return Inversion(idx[:, 0].numpy(), idx.numpy(), val.numpy())
        scores = self._combine(self._logp(taps), taps)  # (N, V_r [+ 1])
        if self.unk:
            from attacks.recipes._backoff import combine_topk

            y = self.backoff.predict_embedding(taps)  # (N, d_e)
            ids, vals = combine_topk(self.backoff, y, scores, self.vocab, self.tau, k, self.lam)
            return Inversion(ids[:, 0], ids, vals)
        kk = min(k, scores.shape[1])
        val, idx = scores.topk(kk, dim=-1)  # (N, kk)
        topk = self.vocab[idx.numpy()]
        if kk < k:  # fewer classes than k: pad with repeats of the best guess
            topk = np.concatenate([topk, np.repeat(topk[:, :1], k - kk, axis=1)], axis=1)
            val = torch.cat([val, val[:, :1].expand(-1, k - kk) - 1e9], dim=1)
        return Inversion(topk[:, 0], topk, val.numpy())

    # ------------------------------------------------------------ persistence
    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors = {f"module.{k}": v.cpu() for k, v in self.module.state_dict().items()}
        tensors.update({"std.mu": torch.from_numpy(self.mu), "std.sd": torch.from_numpy(self.sd),
                        "vocab": torch.from_numpy(self.vocab.astype(np.int64))})
        state = {"d_in": int(len(self.mu)), "n_classes": int(len(self.vocab)), "unk": self.unk, "tau": self.tau,
                 "lam": self.lam}
        if self.unk:
            from attacks.recipes import _backoff

            extra, state["backoff"] = _backoff.state(self.backoff)
            tensors.update(extra)
        return tensors, state

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        self.mu, self.sd = tensors["std.mu"].numpy(), tensors["std.sd"].numpy()
        self.vocab = tensors["vocab"].numpy().astype(np.int64)
        if len(self.vocab) != state["n_classes"] or len(self.mu) != state["d_in"]:
            raise ValueError("vocabulary or input size disagrees with the config")
        if state.get("unk"):
            from attacks.recipes import _backoff

            self.backoff = _backoff.load(self.model, tensors, state["backoff"], self.name)
            self.tau, self.lam = float(state["tau"]), float(state.get("lam", 1.0))
        self.module = self._make_module(int(state["d_in"]), int(state["n_classes"]))
        self.module.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("module.")}, strict=True)
        self.module.to(self._device()).eval()


def next_token_rows(taps: Taps) -> tuple[np.ndarray, Taps]:
    """Rows of ``taps`` followed by a token in their sequence, and those following tokens as one-token taps.

    An attacker that ``reads`` ``next`` guesses at row t the token t+1; score its guesses at the returned rows
    against the returned taps (their token ids, offsets and documents are those of the following tokens).
    """
    rows = np.flatnonzero(taps.next_token_ids() >= 0)
    if rows.size == 0:
        raise AttackError("no token of these taps is followed by another in its sequence: nothing to score for a "
                          "next-token attacker; give sequences of 2 or more tokens")
    return rows, taps.select_tokens(rows + 1)
