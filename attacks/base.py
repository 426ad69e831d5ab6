"""The inversion-attack interface (DESIGN.md §3, §4): fit on taps, invert taps, save/load without pickle.

An attack recipe subclasses :class:`InversionAttack` (recovers tokens from
states at one boundary) or :class:`DepthIdentifier` (reads the split depth
from states of several depths), both subclasses of :class:`Attack`, declares

- ``threat_model``: what it knows against an undefended victim (DESIGN.md
  section 4): ``white-box (exact)`` (inverts the published local layers),
  ``white-box (learned)`` (trains on (activation, token) pairs it makes with
  the published weights) or ``paired`` (pairs from the deployment itself).
  ``shadow`` is a property of a result, not of a recipe: the same learned
  attacker against a victim whose local layers were changed privately
  (:func:`benchmarks.attack_grid.row_threat_model`);
- options the harness reads instead of naming recipes: ``proposer_recipe`` (another
  recipe whose fitted top-k this one tries first, via ``set_proposer``;
  :meth:`Attack.proposer_of` when it depends on the options, as ``lm-beam``'s ``base``),
  ``scoring`` (``all`` test tokens or, for costly attacks, sequence
  ``prefixes``) and ``reads`` (``current``: the token whose state it sees;
  ``next``: the token generated from that state);
- ``requires``: what it needs, from :data:`REQUIREMENTS` (``pairs``,
  ``embedding``, ``head_weights``, ``tail_weights``, ``lm_head``, ``language_model``);
- ``boundary_side``: ``head`` (states the cloud receives), ``tail`` (states it
  returns) or ``any``;
- ``defaults``: its hyper-parameters and their default values,

implements ``_fit`` and ``_invert`` (inversion) or ``fit`` and ``identify``
(depth identification), ``_state`` and ``_load_state``, and is
registered by name with :func:`attacks.registry.register_attack`.

Checkpoints are a directory holding ``config.json`` (recipe, threat model,
hyper-parameters, seed, model spec + sha256, boundary, fit report) and
``attack.safetensors`` (every tensor). Nothing is pickled; loading checks the
format, the recipe and, against the data or the model given, the model sha256
and the boundary, and raises :class:`~attacks.errors.AttackError` naming the
mismatch and the fix.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from attacks.errors import AttackError, AttackOutputError
from attacks.metrics.baselines import TokenPrior, prior_to_json
from attacks.tapdata import Taps, as_taps
from attacks.trainer import digest, with_run
from splitinfer.atomic import atomic_file, guard_overwrite, write_json
from splitinfer.options import OptionTypeError, coerce_option

log = logging.getLogger(__name__)

__all__ = ["Attack", "DepthIdentifier", "Inversion", "InversionAttack", "REQUIREMENTS", "THREAT_MODELS", "CONFIG_NAME",
           "TENSORS_NAME"]

THREAT_MODELS = ("white-box (exact)", "white-box (learned)", "shadow", "paired")
RECIPE_THREAT_MODELS = ("white-box (exact)", "white-box (learned)", "paired")  # shadow: only a result's label
SIDES = ("head", "tail", "any")
REQUIREMENTS = {
    "pairs": "(activation, token) training pairs at the same boundary (made with the public base, or deployment)",
    "embedding": "the public base model's token-embedding matrix",
    "head_weights": "the exact weights of the local head layers (published weights)",
    "tail_weights": "the exact weights of the local tail layers (published weights)",
    "lm_head": "the public base model's final norm and LM head",
    "language_model": "the public base model run forward as a language-model prior over text (never inverted)",
}
FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
TENSORS_NAME = "attack.safetensors"
_WEIGHT_NEEDS = frozenset({"embedding", "head_weights", "tail_weights", "lm_head", "language_model"})


@dataclass
class Inversion:
    """What an attack recovers for N positions: ranked guesses and their scores (higher = more likely)."""

    tokens: np.ndarray  # (N,) int64 top-1 guess
    topk: np.ndarray  # (N, k) int64 ranked guesses, best first; topk[:, 0] == tokens
    scores: np.ndarray  # (N, k) float32 score of each guess (log-prob, or minus a distance)
    info: dict[str, Any] = field(default_factory=dict)  # recipe-specific (timing, acceptance, ...)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        self.topk = np.asarray(self.topk, dtype=np.int64)
        self.scores = np.asarray(self.scores, dtype=np.float32)
        n = len(self.tokens)
        if self.topk.ndim != 2 or self.topk.shape[0] != n or self.scores.shape != self.topk.shape:
            raise AttackOutputError(f"bad Inversion: tokens {self.tokens.shape}, topk {self.topk.shape}, scores "
                                    f"{self.scores.shape}; expected (N,), (N, k), (N, k)")


def check_inversion(inv: Any, n_tokens: int, who: str) -> None:
    """AttackOutputError (one line naming ``who`` and the fix) unless ``inv`` is an Inversion of ``n_tokens`` rows
    whose scores hold no NaN or +inf."""
    if not isinstance(inv, Inversion):
        raise AttackOutputError(f"attack {who}: _invert returned {type(inv).__name__}; return an "
                                "attacks.base.Inversion(tokens, topk, scores)")
    if len(inv.tokens) != n_tokens:
        raise AttackOutputError(f"attack {who}: returned {len(inv.tokens)} guesses for {n_tokens} tokens; return "
                                "one row per state of the taps given")
    bad = np.isnan(inv.scores) | np.isposinf(inv.scores)  # -inf stays allowed: "impossible" in a log-probability
    if bad.any():
        raise AttackOutputError(f"attack {who}: returned {int(bad.sum())} NaN or +inf scores; return finite scores "
                                "(log-probabilities, or minus distances)")


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


class Attack(ABC):
    """Base class of every attack recipe: hyper-parameters, model checks, save / load (see the module docstring)."""

    name: ClassVar[str] = ""
    threat_model: ClassVar[str] = "white-box (learned)"
    requires: ClassVar[frozenset[str]] = frozenset({"pairs"})
    boundary_side: ClassVar[str] = "head"
    defaults: ClassVar[dict[str, Any]] = {}
    proposer_recipe: ClassVar[str | None] = None
    scoring: ClassVar[str] = "all"
    reads: ClassVar[str] = "current"

    def __init__(self, *, model: Any = None, seed: int = 0, **hparams: Any):
        self.hparams: dict[str, Any] = {**self.defaults, **self.typed_hparams(hparams)}
        self.seed = int(seed)
        self.model = model  # a splitinfer.models.LoadedModel, for recipes that need weights
        self.meta: dict[str, Any] = {}
        self.fit_report: dict[str, Any] = {}
        self.fitted = False
        if model is not None:
            self.meta.update(model=model.spec, model_sha256=model.sha256, num_layers=model.num_layers,
                             vocab_size=int(model.config.vocab_size))

    @classmethod
    def typed_hparams(cls, hparams: dict[str, Any]) -> dict[str, Any]:
        """``hparams`` each coerced to its default's type; an AttackError names an unknown key or a bad value.
        Needs no model: ``bench validate`` checks a suite's attack options with it before anything loads."""
        unknown = sorted(set(hparams) - set(cls.defaults))
        if unknown:
            raise AttackError(f"attack {cls.name!r} has no hyper-parameter(s) {unknown}; it takes "
                              f"{sorted(cls.defaults) or 'none'}")
        typed = {}
        for key, value in hparams.items():
            try:
                typed[key] = coerce_option(value, cls.defaults[key])
            except OptionTypeError as e:
                raise AttackError(f"{cls.name} {key}={value!r} must be {e.want}; e.g. {key}={cls.defaults[key]} "
                                  f"(--attack-option {key}={cls.defaults[key]})") from None
        return typed

    def require_int(self, key: str, low: int = 1, why: str = "") -> int:
        """The integer hyper-parameter ``key`` (a bool is refused), else an AttackError naming it and the bound."""
        value = self.hparams[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise AttackError(f"{self.name} {key}={value!r}; give an integer >= {low}{why}")
        return value

    def require_number(self, key: str, low: float = 0, why: str = "") -> float:
        """The numeric hyper-parameter ``key`` >= ``low`` (a bool is refused), else an AttackError naming it."""
        value = self.hparams[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
            raise AttackError(f"{self.name} {key}={value!r}; give a number >= {low:g}{why}")
        return value

    # ------------------------------------------------------------ description
    @classmethod
    def describe(cls) -> dict[str, Any]:
        doc = (cls.__doc__ or "").strip().splitlines()
        return {"name": cls.name, "threat_model": cls.threat_model, "requires": sorted(cls.requires),
                "boundary_side": cls.boundary_side, "summary": doc[0] if doc else "", "defaults": dict(cls.defaults)}

    @classmethod
    def proposer_of(cls, hparams: dict[str, Any]) -> str | None:
        """The recipe whose fitted attacker this one takes through ``set_proposer`` under ``hparams`` (None: none)."""
        return cls.proposer_recipe

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, boundary={self.meta.get('boundary')}, fitted={self.fitted})"

    # ------------------------------------------------------------ checks
    def _need_model(self) -> Any:
        if self.model is None:
            need = sorted(self.requires & _WEIGHT_NEEDS)
            raise AttackError(f"attack {self.name!r} needs {', '.join(need)} of the model; construct or load it "
                              "with model=load_model(<spec>) (the spec its checkpoint records)")
        return self.model

    def _check_side(self, taps: Taps) -> None:
        b = taps.boundary
        if self.boundary_side != "any" and b is not None and not str(b).startswith(self.boundary_side + ":"):
            raise AttackError(f"attack {self.name!r} attacks the {self.boundary_side} boundary but the taps are at "
                              f"{b}; extract taps at {self.boundary_side}:N")

    def check_compatible(self, taps: Taps) -> None:
        """Raise AttackError unless ``taps`` come from the model and boundary this attack was fitted on."""
        mine, theirs = self.meta.get("model_sha256"), taps.model_sha256
        if mine and theirs and mine != theirs:
            raise AttackError(f"model mismatch: attack {self.name!r} was fitted on model {self.meta.get('model')} "
                              f"(sha256 {mine[:12]}...) but the taps come from {taps.meta.get('model')} (sha256 "
                              f"{theirs[:12]}...); extract the taps with the attack's model or retrain the attack")
        mb, tb = self.meta.get("boundary"), taps.boundary
        if self.boundary_side != "any" and mb and tb and mb != tb:
            raise AttackError(f"boundary mismatch: attack {self.name!r} was fitted at {mb} but the taps are at {tb}; "
                              f"extract taps at {mb} or train an attacker at {tb}")
        d = self.meta.get("hidden_size")
        if d and taps.hidden_size != d:
            raise AttackError(f"hidden size mismatch: attack {self.name!r} expects d={d}, the taps have "
                              f"d={taps.hidden_size}")

    @abstractmethod
    def _state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors, json-able config) describing the fitted attack."""

    @abstractmethod
    def _load_state(self, tensors: dict[str, Any], state: dict[str, Any]) -> None: ...

    # ------------------------------------------------------------ persistence
    def config(self) -> dict[str, Any]:
        """The JSON config written beside the tensors."""
        return _jsonable({"format_version": FORMAT_VERSION, "format": "splitinfer-attack", "recipe": self.name,
                          "threat_model": self.threat_model, "requires": sorted(self.requires),
                          "boundary_side": self.boundary_side, "hparams": self.hparams, "seed": self.seed,
                          "meta": self.meta, "fit_report": self.fit_report})

    def save(self, directory: str | Path, force: bool = False) -> Path:
        """Write ``config.json`` + ``attack.safetensors`` under ``directory`` (created), atomically, config last.

        A directory holding a checkpoint of a different run (another recipe, data,
        model, boundary or hyper-parameters) is not overwritten unless ``force``.
        """
        import torch
        from safetensors.torch import save_file

        if not self.fitted:
            raise AttackError(f"attack {self.name!r} is not fitted; nothing to save")
        directory = Path(directory)
        identity = {"recipe": self.name, **self.meta.get("run", {})}
        guard_overwrite(directory / CONFIG_NAME, identity, "run_identity", force, "an attack checkpoint",
                        AttackError)
        tensors, cfg = self.parts()
        tensors = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))).contiguous()
                   for k, v in tensors.items()}
        if not tensors:
            tensors = {"_empty": torch.zeros(0)}
        cfg["run_identity"] = identity
        (directory / CONFIG_NAME).unlink(missing_ok=True)  # until the new config lands, this is no checkpoint
        with atomic_file(directory / TENSORS_NAME) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "splitinfer-attack", "recipe": self.name})
        write_json(directory / CONFIG_NAME, cfg, indent=2, sort_keys=True)  # last: marks it complete
        log.info("saved attack %s to %s", self.name, directory)
        return directory

    @classmethod
    def restore(cls, directory: str | Path, cfg: dict[str, Any], model: Any = None) -> Attack:
        """Rebuild this recipe from checkpoint ``directory`` whose :func:`read_config` is ``cfg``.

        ``model``: a LoadedModel, for recipes needing weights. Use
        :func:`attacks.registry.load_attack` to load a checkpoint of any recipe
        (this module does not import the registry: no cycle).
        """
        try:
            from safetensors.torch import load_file

            tensors = load_file(str(Path(directory) / TENSORS_NAME))
        except Exception as e:  # safetensors raises several types on corrupt files
            raise AttackError(f"checkpoint {directory}/{TENSORS_NAME} is unreadable or not safetensors ({e}); "
                              "retrain the attack or restore the file") from None
        return cls.from_parts(cfg, tensors, model=model, where=f"checkpoint {directory}")

    def parts(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(tensors, config with its ``state``) of the fitted attack: what :meth:`save` writes, for an attack
        that holds another inside its own checkpoint (rebuilt by :meth:`from_parts`)."""
        tensors, state = self._state()
        cfg = self.config()
        cfg["state"] = _jsonable(state)
        return tensors, cfg

    @classmethod
    def from_parts(cls, cfg: dict[str, Any], tensors: dict[str, Any], model: Any = None,
                   where: str = "the checkpoint") -> Attack:
        """Rebuild this recipe from a config (with ``state``) and its tensors (see :meth:`parts`)."""
        meta = cfg.get("meta", {})
        if model is not None and meta.get("model_sha256") and model.sha256 != meta["model_sha256"]:
            raise AttackError(f"model mismatch: {where} was trained on {meta.get('model')} (sha256 "
                              f"{meta['model_sha256'][:12]}...) but the model given is {model.spec} (sha256 "
                              f"{model.sha256[:12]}...); load the checkpoint's model")
        try:
            attack = cls(model=model, seed=cfg.get("seed", 0), **cfg.get("hparams", {}))
        except TypeError as e:
            raise AttackError(f"{where} has bad hyper-parameters ({e}); retrain it") from None
        attack.meta.update(meta)
        attack.fit_report = dict(cfg.get("fit_report", {}))
        try:
            attack._load_state(tensors, cfg.get("state", {}))
        except (KeyError, RuntimeError, ValueError) as e:
            raise AttackError(f"{where} does not match recipe {cfg['recipe']!r} ({e}); it is "
                              "corrupt or from another version: retrain the attack") from None
        attack.fitted = True
        return attack


class InversionAttack(Attack):
    """An attack that recovers tokens from states at one boundary: ``fit`` on taps, ``invert`` taps."""

    # ------------------------------------------------------------ fit / invert
    def fit(self, train: Any, val: Any = None, *, trainer: Any = None) -> InversionAttack:
        """Fit on training taps (and optional validation taps); returns ``self``.

        ``trainer`` is an optional :class:`attacks.train.TrainConfig` for recipes
        trained by gradient descent (epochs, checkpoints, resume, progress).
        """
        import torch

        train = as_taps(train)
        val = as_taps(val) if val is not None else None
        self._check_side(train)
        if self.model is not None and train.model_sha256 and train.model_sha256 != self.model.sha256:
            raise AttackError(f"model mismatch: the training taps come from {train.meta.get('model')} but the attack "
                              f"was given {self.model.spec}; use the same model for both")
        for key in ("model", "model_sha256", "boundary", "depth", "num_layers"):
            if train.meta.get(key) is not None:
                self.meta[key] = train.meta[key]
        self.meta["hidden_size"] = train.hidden_size
        self.meta.setdefault("vocab_size", int(train.meta.get("vocab_size") or int(train.token_ids.max()) + 1))
        uniq, counts = np.unique(train.token_ids, return_counts=True)
        self.meta["unigram_top"] = uniq[np.lexsort((uniq, -counts))[:5]].tolist()
        self.meta["token_prior"] = prior_to_json(TokenPrior.fit(train.token_ids, train.positions()))  # for attack eval
        self.meta["train_tokens"] = train.n_tokens
        self.meta["run"] = self._run_identity(train, val)
        trainer = with_run(trainer, **self.meta["run"])  # a training checkpoint resumes only into this run
        torch.manual_seed(self.seed)
        np.random.seed(self.seed % 2**32)
        t0 = time.perf_counter()
        self._fit(train, val, trainer)
        self.fit_report["fit_seconds"] = round(time.perf_counter() - t0, 3)
        self.fitted = True
        return self

    def _run_identity(self, train: Taps, val: Taps | None) -> dict[str, Any]:
        """What makes two fits the same run: recipe, hyper-parameters, seed, model, boundary and data digests."""
        def taps_digest(t: Taps | None) -> str | None:
            return None if t is None else digest(t.token_ids, t.seq_lengths, t.hidden)

        return _jsonable({"recipe": self.name, "hparams": self.hparams, "seed": self.seed,
                          "model_sha256": train.model_sha256, "boundary": train.meta.get("boundary"),
                          "train": taps_digest(train), "val": taps_digest(val)})

    def invert(self, taps: Any, k: int = 5) -> Inversion:
        """Recover the tokens behind ``taps``: an :class:`Inversion` with ``k`` ranked guesses per position."""
        if not self.fitted:
            raise AttackError(f"attack {self.name!r} is not fitted; call fit(train_taps) or load a checkpoint")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise AttackError(f"k={k!r} must be an integer >= 1")
        taps = as_taps(taps)
        self._check_side(taps)
        self.check_compatible(taps)
        try:
            inv = self._invert(taps, k)
        except AttackOutputError as e:
            raise AttackOutputError(f"attack {self._who()}: {e}") from None
        check_inversion(inv, taps.n_tokens, self._who())
        return inv

    def _who(self) -> str:
        """``'name' (module)``: the recipe and the module (a plugin's) that defines it, for one-line errors."""
        return f"{self.name!r} ({type(self).__module__})"

    @abstractmethod
    def _fit(self, train: Taps, val: Taps | None, trainer: Any) -> None: ...

    @abstractmethod
    def _invert(self, taps: Taps, k: int) -> Inversion: ...


class DepthIdentifier(Attack):
    """An attack that reads the split depth from states of unknown depth (not the tokens).

    ``fit`` takes taps at two or more known depths; :meth:`identify` returns,
    for taps of one (unknown) depth, the predicted depth per token and per
    sequence. It is no :class:`InversionAttack`: its training data and its
    output are of another type.
    """

    boundary_side: ClassVar[str] = "any"
    classifiers: ClassVar[tuple[str | None, ...]] = (None,)  # the classifiers identify() offers (None: default)

    @abstractmethod
    def fit(self, groups: Any, *, trainer: Any = None) -> DepthIdentifier:
        """Fit on taps at several known depths (a list or ``{boundary: taps}``); returns ``self``."""

    @abstractmethod
    def identify(self, taps: Any, classifier: str | None = None) -> dict[str, Any]:
        """``{"depths", "token_depth" (N,), "sequence_depth" (S,), "token_logp" (N, C)}`` for ``taps``."""

    def accuracy(self, taps: Any, classifier: str | None = None) -> dict[str, Any]:
        """Token and sequence accuracy on taps whose depth is known (``taps.meta["depth"]``)."""
        taps = as_taps(taps)
        true = taps.meta.get("depth")
        if true is None:
            raise AttackError("these taps record no depth; extract them with attacks.taps.extract_depths")
        pred = self.identify(taps, classifier)
        return {"depth": int(true), "token_acc": float((pred["token_depth"] == true).mean()),
                "sequence_acc": float((pred["sequence_depth"] == true).mean()), "sequences": len(taps),
                "n_tokens": taps.n_tokens}


def read_config(directory: str | Path) -> dict[str, Any]:
    """The validated ``config.json`` of an attack checkpoint directory."""
    directory = Path(directory)
    path = directory / CONFIG_NAME
    if directory.is_file():
        raise AttackError(f"{directory} is a file; point --attacker at the directory `splitinfer attack train --out` "
                          "wrote")
    if not directory.is_dir():
        raise AttackError(f"attack checkpoint {directory} does not exist; train one with `splitinfer attack train`")
    if not path.is_file() or not (directory / TENSORS_NAME).is_file():
        raise AttackError(f"{directory} is not an attack checkpoint (needs {CONFIG_NAME} and {TENSORS_NAME}); "
                          "point --attacker at the --out directory of `splitinfer attack train`")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AttackError(f"cannot read {path}: {e}; the checkpoint is corrupt, retrain it") from None
    if not isinstance(cfg, dict) or cfg.get("format") != "splitinfer-attack" or "recipe" not in cfg:
        raise AttackError(f"{path} is not a splitinfer attack config; retrain the attack")
    if cfg.get("format_version") != FORMAT_VERSION:
        raise AttackError(f"{path} has attack format version {cfg.get('format_version')!r}; this code reads "
                          f"{FORMAT_VERSION}; retrain the attack")
    return cfg
