"""Plugins through the harness: the example package installed from source (entry points) and a --plugin module,
each run through a tiny suite; provenance, failed components, regress, merge and validate."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.merge import check_shards
from benchmarks.regress import compare
from benchmarks.suite import load_suite
from benchmarks.suite_names import check_names, component_lines
from tests.plugin_install import EXAMPLE, REPO, clean_plugins, install_from_source  # noqa: F401  (a fixture)

DATA = Path(__file__).resolve().parent / "plugin_data"


def _cli(args: list[str], pythonpath: list[Path]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in [*pythonpath, REPO]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "splitinfer.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def example_run(tmp_path_factory) -> tuple[dict, Path]:
    """The example package installed from source, found by its entry points alone (no flag), one suite run."""
    root = tmp_path_factory.mktemp("plugin-example")
    site = install_from_source(EXAMPLE, root / "site")
    out = root / "run"
    res = _cli(["bench", "run", "--suite", str(DATA / "example_suite.toml"), "--out", str(out)], [site])
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), out


def test_the_installed_example_plugin_runs_beside_the_built_ins(example_run):
    doc, out = example_run
    (plugin,) = doc["config"]["plugins"]
    assert plugin["dist"] == "splitinfer-example-plugin" and plugin["version"] == "0.1.0"
    assert plugin["components"] == {"attack": ["knn-match"], "defense": ["hidden-mix"]}
    assert len(plugin["digest"]) == 64 and "entry point splitinfer.defenses:hidden-mix" in plugin["source"]
    runs = doc["results"]
    assert "attacks/knn-match/head:1" in runs and "attacks/linear-probe/head:1" in runs
    row = "defenses/head:2/hidden-mix(alpha=0.5)"
    assert runs[row]["recovery_top1"]["kind"] == "accuracy"
    for spec in ("none", "hidden-mix(alpha=0.5)", "noise(sigma=0.1,clip=" ):  # knn-match, brought by hidden-mix,
        assert any(r.startswith(f"defenses/head:2/{spec}") and r.endswith("/knn-match") for r in runs)  # every row
    assert "failed_components" not in doc
    report = (out / "report.md").read_text()
    assert "`splitinfer_example` (splitinfer-example-plugin 0.1.0" in report and "`hidden-mix(alpha=0.5)`" in report
    assert (out / "defenses_frontier_head2.png").stat().st_size > 0


def test_regress_flags_a_plugin_digest_change(example_run):
    doc, _ = example_run
    assert compare(doc, copy.deepcopy(doc)) == []
    changed = copy.deepcopy(doc)
    changed["config"]["plugins"][0]["digest"] = "0" * 64
    (r,) = compare(doc, changed)
    assert r.rule == "plugin" and r.metric == "splitinfer_example" and "digest" in r.message
    gone = copy.deepcopy(doc)
    gone["config"]["plugins"] = []
    assert [r.rule for r in compare(doc, gone)] == ["plugin"]
    assert compare(gone, doc) == []  # a plugin only the new run loads adds runs: no regression


def test_merge_refuses_shards_made_with_different_plugin_code(example_run):
    doc, _ = example_run
    a, b = ({**copy.deepcopy(doc), "shard": {"index": i, "count": 2}} for i in (0, 1))
    assert check_shards([(Path("a"), a), (Path("b"), b)]) == (2, [])
    b["config"]["plugins"][0]["digest"] = "f" * 64
    with pytest.raises(Exception, match="plugin 'splitinfer_example' changed .digest .* a plugin change is a code"):
        check_shards([(Path("a"), a), (Path("b"), b)])


def test_a_plugin_module_runs_and_its_broken_defense_is_left_out_and_listed(tmp_path):
    out = tmp_path / "run"
    res = _cli(["bench", "run", "--suite", str(DATA / "module_suite.toml"), "--out", str(out),
                "--plugin", str(DATA / "plugin_module.py")], [])
    assert res.returncode == 1, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("splitinfer: error:")]
    assert len(errors) == 1 and "defense 'nan-mix' (plugin_module): apply returned NaN or inf" in errors[0]
    doc = json.loads((out / "results.json").read_text())
    (failed,) = doc["failed_components"]
    assert failed["stage"] == "defenses" and failed["name"] == "nan-mix@head:1"
    assert not any("nan-mix" in run for run in doc["results"])  # never silently mixed in
    assert "defenses/head:1/none" in doc["results"]  # the rest of the grid ran
    assert doc["config"]["plugins"][0]["name"] == "plugin_module" and doc["config"]["plugins"][0]["dist"] is None
    exact = [r for r in doc["data"]["exactness"] if r["decoding"] == "repeat-last"]
    assert exact and all(r["identical"] for r in exact)
    assert "## Failed components" in (out / "report.md").read_text()


def test_validate_names_components_the_registries_do_not_know(tmp_path, clean_plugins):
    bad = check_names(load_suite(str(DATA / "example_suite.toml")))  # the example package not loaded
    assert any("[attacks] attacks: unknown attack 'knn-match'" in line for line in bad)
    assert any("[defenses] defenses: unknown defense 'hidden-mix'" in line for line in bad)
    suite = tmp_path / "s.toml"
    module = DATA / "plugin_module.py"
    text = (DATA / "module_suite.toml").read_text().replace("seed = 0", f'seed = 0\nplugins = ["{module}"]')
    suite.write_text(text)
    assert check_names(load_suite(str(suite))) == []  # plugins = [...] loads the module with the suite
    listing = "\n".join(component_lines())  # bench ls
    assert "plugin_module" in listing and "repeat-last [plugin plugin_module]" in listing
    assert "nan-mix [plugin plugin_module]" in listing and "noise," in listing
    suite.write_text(text.replace('"nan-mix"', '"nan-mixx"'))
    (line,) = check_names(load_suite(str(suite)))
    assert "[defenses] defenses: unknown defense 'nan-mixx'" in line
