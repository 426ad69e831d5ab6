"""The shared registry steps: claim a name once, import a package's modules once, look a name up."""

import sys

import pytest

from splitinfer import registry
from splitinfer.registry import claim, import_modules, lookup


class Boom(Exception):
    pass


def test_claim_sets_the_name_and_refuses_a_second_class():
    table: dict[str, type] = {}

    class A:
        pass

    class B:
        pass

    assert claim(table, "a", A, "thing", Boom) is A and A.name == "a" and table == {"a": A}
    assert claim(table, "a", A, "thing", Boom) is A  # a re-import of the same class is no clash
    with pytest.raises(Boom, match="thing name 'a' is registered twice"):
        claim(table, "a", B, "thing", Boom)


def test_lookup_lists_the_known_names_and_the_hint():
    class A:
        pass

    table = {"b": A, "a": A}
    assert lookup(table, "a", "thing", Boom, "see the docs") is A
    with pytest.raises(Boom, match=r"^unknown thing 'x'; choose one of none, a, b \(see the docs\)$"):
        lookup(table, "x", "thing", Boom, "see the docs", also=("none",))


def test_import_modules_imports_public_modules_once(tmp_path, monkeypatch):
    pkg = tmp_path / "regpkg_once"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("import regpkg_once\nregpkg_once.COUNT = getattr(regpkg_once, 'COUNT', 0) + 1\n")
    (pkg / "_private.py").write_text("raise RuntimeError('private modules are not imported')\n")
    (pkg / "skipped.py").write_text("raise RuntimeError('skipped modules are not imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_IMPORTED", set())
    import regpkg_once

    import_modules("regpkg_once", pkg, skip=("skipped",))
    del sys.modules["regpkg_once.one"]  # a second scan would import it again
    import_modules("regpkg_once", pkg, skip=("skipped",))
    assert regpkg_once.COUNT == 1
