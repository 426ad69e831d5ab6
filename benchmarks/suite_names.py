"""The component names a suite file's tables use, checked against the registries (built-ins and plugins).

``bench validate`` runs :func:`check_names` after :func:`benchmarks.suite.load_suite` (which checks keys and
types and loads the suite's ``plugins``): every attack, defense spec, corpus and decoding a table names must be
registered, and every attack's ``options`` (and decoding's ``decoding_options``) are its own, typed right, so a
typo or a plugin that did not load is one line before any model is loaded, not an error an hour into a run.
``bench ls`` prints :func:`component_lines`: every registered component and where it comes from.
"""

from __future__ import annotations

from attacks.plugins import loaded, origin, registries
from attacks.registry import get_attack_class
from splitinfer.corpora.registry import resolve
from splitinfer.decoding.base import registered_proposers, typed_proposer_options
from splitinfer.defenses.base import parse_items
from splitinfer.errors import SplitInferError

__all__ = ["check_names", "checked_suite", "component_lines"]


def _attack(name: str) -> tuple[type, dict]:
    """The attack class a suite's attacker ``name`` makes and its preset options (an alias such as ``mlp-seed``
    presets some); a SplitInferError for a name no registry knows."""
    from attacks.errors import AttackError
    from benchmarks.attack_grid import ALIASES  # suite name -> (attack, preset options)

    base, preset = ALIASES.get(name, (name, {}))
    try:
        return get_attack_class(base), preset
    except AttackError as e:
        raise SplitInferError(str(e)) from None


def _attack_options(name: str, options, stage: str) -> None:
    """The ``options`` table's entry for attack ``name``: a registered attack, its keys its hyper-parameters (and,
    in the attacks stage, the keys that stage reads itself), typed right."""
    from attacks.errors import AttackError
    from benchmarks.stage_attacks import suite_only_keys

    cls, preset = _attack(name)
    if not isinstance(options, dict):
        raise SplitInferError(f"{name}: give a table of hyper-parameters, e.g. {{ epochs = 2 }}, got {options!r}")
    suite_only = suite_only_keys(name) if stage == "attacks" else ()
    own = {k: v for k, v in options.items() if k not in suite_only}
    try:
        cls.typed_hparams({**preset, **own})
    except AttackError as e:
        raise SplitInferError(str(e)) from None


def _decoding(name: str) -> None:
    known = registered_proposers()
    if name not in known:
        raise SplitInferError(f"unknown decoding {name!r}; choose one of {', '.join(sorted(known))}")


CHECKS = {  # table key -> check of one value
    "attacks": _attack,
    "attackers": _attack,
    "defenses": lambda spec: parse_items(spec),
    "overhead": lambda spec: parse_items(spec),
    "defense": lambda spec: parse_items(spec),
    "corpora": resolve,
    "decodings": _decoding,
}


def check_names(suite) -> list[str]:
    """One line per component name of ``suite`` that no registry knows (empty: every name resolves)."""
    errors = []
    for stage, table in suite.stages.items():
        for key, check in CHECKS.items():
            values = table.get(key)
            for value in [values] if isinstance(values, str) else values or []:
                try:
                    check(value)
                except SplitInferError as e:
                    errors.append(f"{suite.path} [{stage}] {key}: {e}")
        for name, options in (table.get("options") or {}).items():
            try:
                _attack_options(name, options, stage)
            except SplitInferError as e:
                errors.append(f"{suite.path} [{stage}] options: {e}")
        for name, options in (table.get("decoding_options") or {}).items():
            try:
                _decoding(name)
                if not isinstance(options, dict):
                    raise SplitInferError(f"{name}: give a table of options, e.g. {{ step_ms = 60.0 }}, "
                                          f"got {options!r}")
                typed_proposer_options(name, options)
            except SplitInferError as e:
                errors.append(f"{suite.path} [{stage}] decoding_options: {e}")
    return errors


def checked_suite(name_or_path: str):
    """:func:`benchmarks.suite.load_suite` then :func:`check_names`, for commands that run a suite: a
    SplitInferError names the first problem (and how many more ``bench validate`` lists) before any model loads."""
    from benchmarks.suite import load_suite

    suite = load_suite(name_or_path)
    problems = check_names(suite)
    if problems:
        more = f" (and {len(problems) - 1} more: splitinfer bench validate {suite.path})" if len(problems) > 1 else ""
        raise SplitInferError(problems[0] + more)
    return suite


def component_lines() -> list[str]:
    """``bench ls``'s listing: the plugins loaded, then every registered component with its origin."""
    lines = ["plugins (entry points and --plugin modules; provenance goes into every results document):"]
    for p in loaded():
        comps = "; ".join(f"{k}: {', '.join(v)}" for k, v in p.components.items()) or "no components"
        lines.append(f"  {p.name:<24} {p.dist or '(not installed)'} {p.version or ''}  sha256 {p.digest[:12]}  "
                     f"[{p.source}]  {comps}")
    if len(lines) == 1:
        lines.append("  (none loaded; docs/extending.md says how to write one)")
    lines.append("components (built-in unless marked):")
    for kind, reg in registries().items():
        names = [n + (f" [{origin(kind, n)}]" if origin(kind, n) else "") for n in sorted(reg)]
        lines.append(f"  {kind + 's' if kind != 'corpus' else 'corpora':<10} {', '.join(names)}")
    return lines
