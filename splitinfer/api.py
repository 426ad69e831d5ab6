"""The stable public API of splitinfer, for scripts and notebooks (DESIGN.md section 1).

Everything a script needs, as thin functions over the internal modules (each says which one it calls)::

    from splitinfer import api

    model = api.load_model("tiny-random")                      # HF id, local dir, .gguf, "default", "tiny-random"
    sm = api.split(model, "2,2", defense="noise(sigma=0.05)")   # local head / cloud body / local tail
    out = api.generate(sm, "Hello", max_new_tokens=16)          # .text, .token_ids, .steps
    train = api.extract_taps(model, "prose", "head:2", split="train", max_tokens=2000)
    test = api.extract_taps(model, "prose", "head:2", split="test", max_tokens=500)
    atk = api.train_attack("linear-probe", train, model=model, epochs=2)
    metrics = api.evaluate_attack(atk, test)                    # {"token_acc_top1": {value, ci_low, ...}, ...}
    released = api.apply_defense("hidden-mix(alpha=0.3)", train)  # the states the cloud would see
    path = api.run_suite("ci", "runs/ci")                       # results.json + report.md + plots
    doc = api.read_results(path)
    api.load_plugins("my_pkg.defense")                          # what --plugin does; installed ones load alone

Deprecation rule: a name in :data:`__all__` keeps its signature and meaning for at least one minor release
after it is deprecated; deprecation is announced in the changelog and by a ``DeprecationWarning`` (one line,
naming the replacement) from the first release that deprecates it, and removal happens only in a later minor
release. New keyword arguments may be added with defaults that keep old calls unchanged. Everything not in
:data:`__all__` (every other module, including the ones these functions call) is internal and may change
without notice. The results document has its own versioning rule (:mod:`benchmarks.schema`).

Layering (DESIGN.md section 7): this module composes the three packages, like the console-script module
:mod:`splitinfer.cli`; it imports ``attacks`` and ``benchmarks`` only inside its functions, so ``import
splitinfer`` stays light, and no library module imports it (tests/test_layering.py: ``COMPOSERS``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["apply_defense", "evaluate_attack", "extract_taps", "generate", "list_components", "load_model",
           "load_plugins", "read_results", "run_suite", "split", "train_attack"]


def load_model(spec: str = "default", *, dtype: str = "fp32", device: str = "cpu", seed: int = 0) -> Any:
    """A loaded causal LM (:func:`splitinfer.models.load_model`): an HF id or local dir, a ``.gguf`` path,
    ``default`` (SmolLM2-135M) or ``tiny-random``; ``device`` e.g. ``cuda``; ``dtype`` fp32 | fp16 | bf16."""
    from splitinfer.models import load_model as _load

    return _load(spec, dtype=dtype, device=device, seed=seed)


def split(model: Any, layers: str = "2,2", *, defense: str = "none", wire_dtype: str = "fp16",
          cloud: str | None = None) -> Any:
    """The model cut into local head / cloud body / local tail (:class:`splitinfer.client.SplitModel`).

    ``layers`` is ``A,B`` (A layers before, B after the body); ``defense`` a spec (``noise(sigma=0.05)``);
    ``cloud`` a ``ws://`` URL of a ``splitinfer serve`` process (default: the body in this process)."""
    from splitinfer.client import SplitModel

    return SplitModel(model, layers, cloud=cloud, wire_dtype=wire_dtype, defense=defense)


def generate(split_model: Any, prompt: str | list[int], max_new_tokens: int = 64, *, decoding: str = "sequential",
             chat: bool = False, decoding_options: dict | None = None) -> Any:
    """Split generation (:meth:`SplitModel.generate`): the result has ``text``, ``token_ids`` and per-step
    ``steps``; ``decoding`` names a proposer (built-in or plugin), exact under greedy verification."""
    return split_model.generate(prompt, max_new_tokens, decoding=decoding, chat=chat,
                                decoding_options=dict(decoding_options or {}))


def extract_taps(model: Any, corpus: str, boundary: str = "head:2", *, split: str = "train",
                 max_tokens: int | None = 2000, max_length: int = 128, seed: int = 0) -> Any:
    """The states the cloud sees at ``boundary`` (``head:N`` or ``tail:N``) for one split of a corpus
    (:func:`attacks.taps.extract_depths`, in memory): a :class:`attacks.tapdata.Taps`."""
    from attacks.taps import extract_depths

    return extract_depths(model, corpus, [boundary], split, max_tokens=max_tokens, max_length=max_length,
                          seed=seed, progress=False)[boundary]


def train_attack(name: str, train: Any, *, model: Any = None, seed: int = 0, **options: Any) -> Any:
    """A fitted attack (:func:`attacks.registry.make_attack` then ``fit``); ``options`` are its
    hyper-parameters (``epochs=2``); ``model`` for recipes that need the public weights."""
    from attacks.registry import make_attack

    return make_attack(name, model=model, seed=seed, **options).fit(train)


def evaluate_attack(attack: Any, test: Any, *, k: int = 5) -> dict[str, dict[str, Any]]:
    """Every metric of ``attack`` on held-out taps with its 95% interval over documents
    (:func:`attacks.evaluate.score`; baselines fitted on the attack's training tokens)."""
    from attacks.evaluate import score
    from attacks.metrics.baselines import prior_from_json

    prior = attack.meta.get("token_prior")
    return score(attack.invert(test, k=k), test, vocab_size=attack.meta.get("vocab_size"),
                 prior=prior_from_json(prior) if prior else None)


def apply_defense(spec: str, taps: Any, *, options: dict | None = None) -> Any:
    """The states the cloud receives when the victim runs wire defense ``spec`` (:func:`attacks.defended.defend_taps`;
    a model defense such as ``lora-random`` changes the local layers instead: pass it to :func:`split`)."""
    from attacks.defended import defend_taps
    from splitinfer.defenses import DefensePipeline

    return defend_taps(taps, DefensePipeline.parse(spec, dict(options or {})))


def run_suite(suite: str, out_dir: str | Path, *, stages: list[str] | None = None) -> Path:
    """Run a suite (a name under benchmarks/suites/ or a ``.toml`` path) into ``out_dir``
    (:func:`benchmarks.run.run_suite`); returns the path of ``results.json``."""
    from benchmarks.run import run_suite as _run
    from benchmarks.suite import load_suite

    return _run(load_suite(suite), out_dir, stages=stages)


def read_results(path: str | Path) -> dict[str, Any]:
    """A results document, validated (:func:`benchmarks.schema.load`): ``results[run][metric]`` =
    ``{value, ci_low, ci_high, n, higher_is_better, kind}``; ``config.plugins`` the plugins' provenance."""
    from benchmarks.schema import load

    return load(path)


def load_plugins(*modules: str) -> list[dict[str, Any]]:
    """Load installed plugins (entry points) and ``modules`` (dotted names or ``.py`` paths); their provenance
    (:func:`attacks.plugins.records`)."""
    from attacks.plugins import discover, load_modules, records

    discover()
    load_modules(list(modules))
    return records()


def list_components() -> dict[str, list[str]]:
    """{``attack`` | ``defense`` | ``proposer`` | ``corpus``: registered names}, built-ins and plugins."""
    from attacks.plugins import discover, registries

    discover()
    return {kind: sorted(reg) for kind, reg in registries().items()}
