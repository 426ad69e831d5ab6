"""Identify the split depth from activations of unknown depth (``depth-id``).

The "random split point" defense hopes the cloud cannot tell after how many
layers the states it receives were taken, so that a depth-specific inverter
cannot be chosen. Residual-stream statistics drift with depth (norm growth,
massive activations in a few outlier dimensions appearing after the first
layers; Sun et al. 2024, "Massive activations in large language models"), so
the depth is usually easy to read off. Two classifiers, both reported:

- ``stats``: multinomial logistic regression (scikit-learn) on per-token
  statistics: log norm, mean, std, skewness, kurtosis, log max-abs, max-abs /
  rms, share of entries beyond 3 rms, log(1 + position), and the values of
  the ``n_outlier_dims`` dimensions with the largest mean magnitude in
  training;
- ``raw``: a small MLP on the standardised raw state (d -> ``hidden`` -> depths;
  no normalisation layer, which would erase the scale the depth shows in).

Per sequence, token log-probabilities are summed (the cloud sees a whole
prompt at one depth). It implements :class:`attacks.base.DepthIdentifier`
(not an inversion attack): ``fit`` takes taps at several known depths (a list
or ``{boundary: taps}``); :meth:`DepthId.identify` returns token- and
sequence-level predictions, :meth:`~attacks.base.DepthIdentifier.accuracy`
scores them against taps of known depth. The fitted
scikit-learn model is stored as plain arrays (no pickle) and applied with numpy.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from attacks.base import DepthIdentifier
from attacks.errors import AttackError
from attacks.recipes._common import fit_standardizer, standardize
from attacks.registry import register_attack
from attacks.tapdata import Taps, as_taps
from attacks.trainer import digest, fit_module, with_run

log = logging.getLogger(__name__)
CLASSIFIERS = ("raw", "stats")


def token_stats(hidden: np.ndarray, positions: np.ndarray, dims: np.ndarray) -> np.ndarray:
    """(N, d) states, (N,) positions, (n_out,) outlier dims -> (N, 9 + n_out) float64 features."""
    out = []
    for a in range(0, len(hidden), 16384):
        x = np.asarray(hidden[a: a + 16384], dtype=np.float64)  # (n, d)
        mean, std = x.mean(1), x.std(1) + 1e-12
        z = (x - mean[:, None]) / std[:, None]
        rms = np.sqrt((x ** 2).mean(1)) + 1e-12
        mx = np.abs(x).max(1)
        feats = [np.log(np.linalg.norm(x, axis=1) + 1e-12), mean, np.log(std), (z ** 3).mean(1),
                 np.log((z ** 4).mean(1)), np.log(mx + 1e-12), mx / rms, (np.abs(x) > 3 * rms[:, None]).mean(1),
                 np.log1p(positions[a: a + 16384].astype(np.float64))]
        out.append(np.column_stack(feats + [x[:, dims]]))
    return np.concatenate(out)


@register_attack("depth-id")
class DepthId(DepthIdentifier):
    """Identify the split depth of activations (per token and per sequence): stats + logistic regression, raw MLP."""

    threat_model = "white-box (learned)"
    requires = frozenset({"pairs"})
    boundary_side = "any"
    classifiers = ("stats", "raw")
    defaults = {"classifier": "raw", "n_outlier_dims": 8, "C": 1.0, "hidden": 256, "epochs": 4, "lr": 1e-3,
                "batch_size": 256, "max_tokens_per_depth": 20000}

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        if self.hparams["classifier"] not in CLASSIFIERS:
            raise AttackError(f"depth-id classifier={self.hparams['classifier']!r}; choose one of {CLASSIFIERS}")
        self.depths = self.dims = self.mu = self.sd = None
        self.lr_params: dict[str, np.ndarray] = {}
        self.net: nn.Module | None = None

    # ------------------------------------------------------------ fit
    def fit(self, groups: Any, *, trainer: Any = None) -> DepthId:
        """``groups``: taps at several known depths (list, tuple or {boundary: taps})."""
        if isinstance(groups, dict):
            groups = list(groups.values())
        if not isinstance(groups, (list, tuple)):
            raise AttackError("depth-id is fitted on taps at several known depths: fit([taps_a, taps_b, ...])")
        groups = [as_taps(t) for t in groups]
        depths = [t.meta.get("depth") for t in groups]
        if len(groups) < 2 or None in depths or len(set(depths)) != len(depths):
            raise AttackError(f"depth-id needs taps at two or more distinct known depths, got depths {depths}; pass "
                              "[taps_at_head1, taps_at_head4, ...]")
        shas = {t.model_sha256 for t in groups}
        if len(shas) > 1:
            raise AttackError("depth-id training taps come from different models; use one model")
        cap = int(self.hparams["max_tokens_per_depth"])
        groups = [t.spread_tokens(cap) for t in groups]
        for key in ("model", "model_sha256", "num_layers"):
            self.meta[key] = groups[0].meta.get(key)
        self.meta.update(hidden_size=groups[0].hidden_size, boundary=None, depths=sorted(depths))
        self.depths = np.array(sorted(depths), dtype=np.int64)
        y = np.concatenate([np.full(t.n_tokens, int(np.searchsorted(self.depths, t.meta["depth"]))) for t in groups])
        hidden = np.concatenate([np.asarray(t.hidden) for t in groups])  # (N, d)
        positions = np.concatenate([t.positions() for t in groups])
        torch.manual_seed(self.seed)
        # --- stats + logistic regression
        from sklearn.linear_model import LogisticRegression

        self.dims = np.argsort(-np.abs(hidden.astype(np.float32)).mean(0))[: int(self.hparams["n_outlier_dims"])]
        feats = token_stats(hidden, positions, self.dims)
        f_mu, f_sd = feats.mean(0), feats.std(0) + 1e-9
        clf = LogisticRegression(C=float(self.hparams["C"]), max_iter=2000)
        clf.fit((feats - f_mu) / f_sd, y)
        self.lr_params = {"f_mu": f_mu, "f_sd": f_sd, "coef": clf.coef_, "intercept": clf.intercept_}
        # --- raw MLP
        self.mu, self.sd = fit_standardizer(hidden, seed=self.seed)
        x = standardize(hidden, self.mu, self.sd)  # (N, d)
        yt = torch.from_numpy(y)
        self.net = self._build(hidden.shape[1], len(self.depths))
        self.meta["run"] = {"recipe": self.name, "hparams": self.hparams, "seed": self.seed, "depths": sorted(depths),
                            "model_sha256": self.meta["model_sha256"], "data": digest(hidden, y)}
        trainer = with_run(trainer, **self.meta["run"])
        ce = nn.CrossEntropyLoss()
        report = fit_module(self.net, len(x), lambda m, idx: ce(m(x[idx]), yt[idx]), epochs=self.hparams["epochs"],
                            lr=self.hparams["lr"], batch_size=self.hparams["batch_size"], seed=self.seed, cfg=trainer,
                            tag="depth-id")
        self.fitted = True
        self.fit_report.update(report, train_tokens=int(len(y)),
                               train_token_acc_stats=float((self._logp_stats(feats).argmax(1) == y).mean()))
        return self

    def _build(self, d_in: int, n_classes: int) -> nn.Module:
        h = int(self.hparams["hidden"])
        return nn.Sequential(nn.Linear(d_in, h), nn.GELU(), nn.Linear(h, n_classes))  # no LayerNorm: keep the scale

    # ------------------------------------------------------------ predict
    def _logp_stats(self, feats: np.ndarray) -> np.ndarray:
        p = self.lr_params
        z = ((feats - p["f_mu"]) / p["f_sd"]) @ p["coef"].T + p["intercept"]  # (N, C)
        z = z - z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))

    @torch.no_grad()
    def token_logp(self, taps: Taps, classifier: str | None = None) -> np.ndarray:
        """(N, C) log-probabilities over :attr:`depths` per token."""
        which = classifier or self.hparams["classifier"]
        if which not in CLASSIFIERS:
            raise AttackError(f"depth-id classifier={which!r}; choose one of {CLASSIFIERS}")
        if which == "stats":
            return self._logp_stats(token_stats(taps.hidden, taps.positions(), self.dims))
        self.net.eval()
        x = standardize(taps.hidden, self.mu, self.sd)
        return torch.cat([torch.log_softmax(self.net(x[a: a + 8192]), -1) for a in range(0, len(x), 8192)]).numpy()

    def identify(self, taps: Any, classifier: str | None = None) -> dict[str, Any]:
        """Token-level and sequence-level depth predictions for ``taps`` (checked against the model)."""
        if not self.fitted:
            raise AttackError("depth-id is not fitted; call fit([...]) or load a checkpoint")
        taps = as_taps(taps)
        self.check_compatible(taps)
        logp = self.token_logp(taps, classifier)  # (N, C)
        seq = np.stack([logp[rows].sum(0) for _, rows in taps.sequences()])  # (S, C)
        return {"depths": self.depths.tolist(), "token_depth": self.depths[logp.argmax(1)],
                "sequence_depth": self.depths[seq.argmax(1)], "token_logp": logp}

    # ------------------------------------------------------------ persistence
    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tensors = {f"net.{k}": v for k, v in self.net.state_dict().items()}
        tensors.update({f"lr.{k}": torch.from_numpy(np.asarray(v, dtype=np.float64))
                        for k, v in self.lr_params.items()})
        tensors.update({"depths": torch.from_numpy(self.depths), "dims": torch.from_numpy(self.dims.astype(np.int64)),
                        "std.mu": torch.from_numpy(self.mu), "std.sd": torch.from_numpy(self.sd)})
        return tensors, {"d_in": int(len(self.mu)), "n_classes": int(len(self.depths))}

    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None:
        self.depths, self.dims = tensors["depths"].numpy(), tensors["dims"].numpy()
        self.mu, self.sd = tensors["std.mu"].numpy(), tensors["std.sd"].numpy()
        self.lr_params = {k[3:]: v.numpy() for k, v in tensors.items() if k.startswith("lr.")}
        self.net = self._build(int(state["d_in"]), int(state["n_classes"]))
        self.net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")}, strict=True)
        self.net.eval()
