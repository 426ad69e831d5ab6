"""attacks.plugins: entry points and --plugin modules load, record provenance, and fail in one line."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attacks import plugins
from attacks.errors import AttackOutputError
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.base import get_defense_class
from splitinfer.errors import ComponentError
from tests.plugin_install import EXAMPLE, clean_plugins, install_from_source  # noqa: F401  (a fixture)


def _module(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return path


def test_entry_points_of_an_installed_package_are_found_and_recorded(tmp_path, clean_plugins, monkeypatch):
    site = install_from_source(EXAMPLE, tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setattr(plugins, "_DISCOVERED", False)
    found = {p.name: p for p in plugins.discover()}
    p = found["splitinfer_example"]
    assert p.dist == "splitinfer-example-plugin" and p.version == "0.1.0"
    assert p.components == {"attack": ("knn-match",), "defense": ("hidden-mix",)}
    files = sorted((EXAMPLE / "splitinfer_example").glob("*.py"))
    assert p.digest == plugins.source_digest(files) and p.files == len(files) == 3
    assert plugins.origin("defense", "hidden-mix").startswith("plugin splitinfer_example")
    assert plugins.origin("defense", "noise") is None
    rec = plugins.records()
    assert rec[0]["digest"] == p.digest and rec[0]["components"]["defense"] == ["hidden-mix"]
    # the example defense works on the wire like a built-in, and its attack registers with a threat model
    pipe = DefensePipeline.parse("hidden-mix(alpha=0.5)")
    x = torch.randn(1, 5, 16)
    y = pipe.transform_up(x, range(5), 0)
    assert y.shape == x.shape and not torch.allclose(x, y)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=0.6)  # a blend with a rotation: comparable norms


def test_a_plugin_module_by_path_is_loaded_without_a_distribution(tmp_path, clean_plugins):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "plugin_data" / "plugin_module.py"
    p = plugins.load_module(str(path))
    assert p.dist is None and p.components == {"defense": ("nan-mix",), "proposer": ("repeat-last",)}
    assert get_defense_class("nan-mix").__module__ == "plugin_module"


def test_import_failure_is_one_line_naming_the_plugin(tmp_path, clean_plugins):
    path = _module(tmp_path, "needs_missing", "import definitely_not_installed_xyz\n")
    with pytest.raises(plugins.PluginError) as e:
        plugins.load_module(str(path))
    msg = str(e.value)
    assert "\n" not in msg and "plugin needs_missing failed to import (ModuleNotFoundError" in msg
    assert "install what it needs" in msg
    with pytest.raises(plugins.PluginError, match="plugin no_such_mod_abc failed to import"):
        plugins.load_module("no_such_mod_abc")


def test_a_broken_installed_entry_point_is_reported_and_the_others_load(tmp_path, clean_plugins, monkeypatch):
    site = install_from_source(EXAMPLE, tmp_path / "site")
    dist = next(site.glob("*.dist-info"))
    (dist / "entry_points.txt").write_text((dist / "entry_points.txt").read_text()
                                           + "[splitinfer.proposers]\nbroken = splitinfer_example.not_there\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setattr(plugins, "_DISCOVERED", False)
    monkeypatch.setattr(plugins, "_FAILED", [])
    found = plugins.discover()
    assert any(p.name == "splitinfer_example" for p in found)
    (line,) = plugins.failures()
    assert "splitinfer_example.not_there (entry point splitinfer.proposers: broken, a proposer)" in line


@pytest.mark.parametrize("body, kind, name", [
    ("from dataclasses import dataclass\nfrom splitinfer.defenses.base import Defense, register_defense\n"
     "@register_defense('noise')\n@dataclass(frozen=True)\nclass MyNoise(Defense):\n    pass\n", "defense", "noise"),
    # the same class name as the built-in slips past the registry's own check: caught by the snapshot
    ("from dataclasses import dataclass\nfrom splitinfer.defenses.base import Defense, register_defense\n"
     "@register_defense('noise')\n@dataclass(frozen=True)\nclass Noise(Defense):\n    pass\n", "defense", "noise"),
    ("from splitinfer.corpora.registry import register_corpus\n"
     "@register_corpus('prose', 'prose', 'mine')\ndef build(arg, seed, tokenizer, **o):\n    pass\n",
     "corpus", "prose"),
    ("from attacks.recipes.linear_probe import LinearProbe\nfrom attacks.registry import register_attack\n"
     "@register_attack('mlp')\nclass Mine(LinearProbe):\n    pass\n", "attack", "mlp"),
])
def test_a_name_clash_with_a_built_in_is_refused_and_the_built_in_kept(tmp_path, clean_plugins, body, kind, name):
    builtin = plugins.registries()[kind][name]
    path = _module(tmp_path, f"clash_{kind}", body)
    with pytest.raises(plugins.PluginError) as e:
        plugins.load_module(str(path))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"plugin clash_{kind}: ") and repr(name) in msg
    assert "clashes with a built-in" in msg or "registered twice" in msg
    assert plugins.registries()[kind][name] is builtin and f"clash_{kind}" not in sys.modules


def test_an_unknown_threat_model_is_refused_in_one_line(tmp_path, clean_plugins):
    body = ("from attacks.recipes.linear_probe import LinearProbe\nfrom attacks.registry import register_attack\n"
            "@register_attack('grey-probe')\nclass Grey(LinearProbe):\n    threat_model = 'grey-box'\n")
    with pytest.raises(plugins.PluginError) as e:
        plugins.load_module(str(_module(tmp_path, "grey", body)))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("plugin grey: attack 'grey-probe' declares threat model 'grey-box'")
    assert "grey-probe" not in plugins.registries()["attack"]


@pytest.mark.parametrize("ret, why", [("x[:, :-1]", "apply returned (3, 7) for states of shape (3, 8)"),
                                      ("x * float('nan')", "NaN or inf"),
                                      ("None", "apply returned NoneType")])
def test_a_defense_with_wrong_output_fails_in_one_line(tmp_path, clean_plugins, ret, why):
    body = ("from dataclasses import dataclass\nfrom splitinfer.defenses.base import Defense, register_defense\n"
            "@register_defense('bad-out')\n@dataclass(frozen=True)\nclass Bad(Defense):\n"
            "    def apply(self, x, positions, session, direction, content=None):\n"
            f"        return {ret}\n")
    plugins.load_module(str(_module(tmp_path, "bad_out", body)))
    with pytest.raises(ComponentError) as e:
        DefensePipeline.parse("bad-out").transform_up(torch.ones(1, 3, 8), range(3), 0)
    assert "\n" not in str(e.value) and "defense 'bad-out' (bad_out)" in str(e.value) and why in str(e.value)


def _taps(n: int = 8, d: int = 4):
    from attacks.tapdata import Taps

    return Taps(np.random.default_rng(0).normal(size=(n, d)).astype(np.float32), np.arange(n),
                np.array([n]), np.array([0]), [{"doc_id": "a"}], None,
                {"boundary": "head:1", "depth": 1})


@pytest.mark.parametrize("ret, why", [
    ("Inversion(np.zeros(2), np.zeros((2, k)), np.zeros((2, k)))", "returned 2 guesses for 8 tokens"),
    ("Inversion(np.zeros(n), np.zeros((n, k)), np.full((n, k), np.nan))", "NaN or +inf scores"),
    ("Inversion(np.zeros(n), np.zeros((n, k)), np.zeros((n, 1)))", "bad Inversion"),
])
def test_an_attack_with_wrong_output_fails_in_one_line_naming_the_plugin(tmp_path, clean_plugins, ret, why):
    body = ("import numpy as np\nfrom attacks.base import Inversion, InversionAttack\n"
            "from attacks.registry import register_attack\n"
            "@register_attack('bad-atk')\nclass Bad(InversionAttack):\n"
            "    def _fit(self, train, val, trainer):\n        pass\n"
            "    def _invert(self, taps, k):\n        n = taps.n_tokens\n"
            f"        return {ret}\n"
            "    def _state(self):\n        return {}, {}\n    def _load_state(self, t, s):\n        pass\n")
    plugins.load_module(str(_module(tmp_path, "bad_atk", body)))
    from attacks.registry import make_attack

    atk = make_attack("bad-atk").fit(_taps())
    with pytest.raises(AttackOutputError) as e:
        atk.invert(_taps(), k=2)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("attack 'bad-atk' (bad_atk)") and why in msg
    assert isinstance(e.value, ComponentError)
    assert plugins.droppable("attack", "bad-atk", e.value) == msg
    assert plugins.droppable("attack", "linear-probe", RuntimeError("bug")) is None  # a built-in's bug stops a run
    assert "raised RuntimeError: x; fix the plugin" in plugins.droppable("attack", "bad-atk", RuntimeError("x"))
