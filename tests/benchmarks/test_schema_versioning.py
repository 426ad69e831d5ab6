"""The schema's versioning rule: minor bumps add keys (old and newer minors read as they are); major bumps
rename, with the migration in regress."""

import json

import pytest

from benchmarks import regress, schema


def _doc(version=None, minor=None, metric_name="tok_s"):
    doc = schema.new_results({"model": "m"}, "ci")
    schema.add_metric(doc, "speed/x", metric_name, schema.metric(1.0, kind="exact"))
    if version is not None:
        doc["schema_version"] = version
    if minor is None:
        doc.pop("schema_minor")
    else:
        doc["schema_minor"] = minor
    return doc


def test_documents_record_the_minor_and_any_minor_of_the_major_reads():
    assert schema.new_results({}, "ci")["schema_minor"] == schema.SCHEMA_MINOR
    for minor in (None, 0, schema.SCHEMA_MINOR + 5):  # before the rule, older, newer: all only add keys
        schema.validate(_doc(minor=minor))
    with pytest.raises(schema.SchemaError, match="schema_minor is not a non-negative integer"):
        schema.validate(_doc(minor=-1))
    with pytest.raises(schema.SchemaError, match="schema_version is 0, this code reads 1"):
        schema.validate(_doc(version=0))


def test_regress_migrates_an_older_major_before_comparing(tmp_path, monkeypatch, capsys):
    """A renamed metric (tok_per_s -> tok_s) in an old baseline is compared under its new name."""
    old = tmp_path / "old.json"
    old.write_text(json.dumps(_doc(version=schema.SCHEMA_VERSION - 1, metric_name="tok_per_s")))
    new = tmp_path / "new.json"
    new.write_text(json.dumps(_doc()))
    args = ["--baseline", str(old), "--results", str(new)]
    assert regress.main(args) == 2  # no migration: the old major is refused in one line
    assert "schema_version is 0" in capsys.readouterr().err

    def rename(doc):
        doc["results"]["speed/x"]["tok_s"] = doc["results"]["speed/x"].pop("tok_per_s")
        return doc

    monkeypatch.setitem(regress.MIGRATIONS, schema.SCHEMA_VERSION - 1, rename)
    assert regress.main(args) == 0
    assert "1 metrics compared, 0 regressions" in capsys.readouterr().out
    assert regress.migrate(_doc())["schema_version"] == schema.SCHEMA_VERSION  # current: unchanged
