"""One attack grid: split depth x boundary side x attacker x corpus (x victim), for the suite stage and the study.

:func:`extract` takes teacher-forced taps of the train, val and test splits
of every corpus at every boundary (``head:A``: the states the cloud receives;
``tail:B``: those it returns), one truncated forward per corpus and split.
:func:`plan` lists the (attacker, boundary) jobs a grid holds, and
:func:`run_job` fits one and scores it on the pooled held-out test documents
and per corpus. What differs between recipes is read from their class, never
from their name (issue 17 item 6): ``boundary_side``; ``proposer_recipe``
(fitted on the same boundary and passed to ``set_proposer``); ``scoring``
(``prefixes``: costly attacks are scored on the head boundary's common scored
set alone, :mod:`benchmarks.scored_set`; every other head-side attacker is
scored on all test tokens and on that set too, the comparison of a cell); ``reads`` (``next``:
output-side attackers, scored on the generated token of real split
generation, :mod:`benchmarks.attack_wire`); :class:`~attacks.base.DepthIdentifier`
(:func:`depth_rows`).

Threat labels (DESIGN.md section 4) come from :func:`row_threat_model`: the
recipe's white-box label against an undefended victim, ``shadow`` only when
the :class:`Victim`'s local layers were changed privately; :func:`check_row`
refuses any other ``shadow`` row.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.base import DepthIdentifier, Inversion
from attacks.errors import AttackError
from attacks.evaluate import collect, doc_top1_counts, prior_from_taps, score
from attacks.registry import get_attack_class, make_attack
from attacks.tapdata import Taps
from attacks.boundary import Boundary
from splitinfer.families import default_wire_dtype
from splitinfer.tokens import encode_text
from attacks.defended import knowledge_label
from attacks.taps import extract_depths
from benchmarks.grid_cell import score_on_set
from benchmarks.scored_set import ScoredSetConfig, check_size, choose, take, train_openings

log = logging.getLogger(__name__)

# grid names that are a recipe with fixed options
ALIASES = {"mlp-seed": ("mlp", {"protocol": "seed"}), "output-probe:current": ("output-probe", {"target": "current"})}
MIN_TEST_DOCUMENTS = 10  # per corpus, so that bootstrap intervals over documents mean something
SOURCES = ("attacks/base.py", "attacks/trainer.py", "attacks/tapdata.py", "attacks/evaluate.py", "attacks/metrics/core.py",
           "attacks/metrics/baselines.py", "attacks/metrics/intervals.py", "attacks/metrics/summary.py",
           "attacks/recipes/_common.py", "attacks/recipes/_backoff.py", "benchmarks/attack_grid.py",
           "benchmarks/attack_wire.py")


@dataclass(frozen=True)
class Victim:
    """The deployment attacked: its defense (canonical spec; ``none`` = undefended) and whether it changed its
    local layers privately (fine-tuning, private LoRA, random perturbation: the weights the attacker lacks)."""

    defense: str = "none"
    private_local_layers: bool = False


def row_threat_model(recipe_label: str, victim: Victim) -> str:
    """The label of a result: ``shadow`` for a public-weights attacker against private local layers, else the
    recipe's own (``white-box (exact)`` / ``white-box (learned)`` / ``paired``)."""
    return knowledge_label(recipe_label, victim.private_local_layers)


def check_row(row: dict[str, Any], victim: Victim) -> dict[str, Any]:
    """Refuse a ``shadow`` row unless the victim's local layers were changed privately (DESIGN.md section 4)."""
    if row.get("threat_model") == "shadow" and not victim.private_local_layers:
        raise AttackError(f"result {row.get('attack')} at {row.get('boundary')} is labelled shadow but the victim "
                          f"(defense {victim.defense!r}) runs the published local layers; label it white-box")
    return row


@dataclass(frozen=True)
class GridConfig:
    """What one grid covers and its sizes (per corpus)."""

    head_depths: tuple[int, ...] = (2,)
    tail_layers: tuple[int, ...] = ()
    corpora: tuple[str, ...] = ("prose",)
    attacks: tuple[str, ...] = ("linear-probe",)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # per grid name
    train_tokens: int = 3000
    val_tokens: int = 0
    test_tokens: int = 1000
    max_length: int = 128
    max_doc_tokens: int | None = None
    prefix_tokens: int = 40  # scoring="prefixes": first tokens of 4 test sequences per corpus
    prefix_pii_tokens: int = 96  # ... PII corpora: 2 sequences cut here instead
    prefix_depths: tuple[int, ...] | None = None  # depths where prefix-scored attacks run (None = all)
    wire_tokens: int = 256  # generated tokens per corpus for reads="next" attackers (0: teacher-forced next token)
    wire_split_head: int = 2  # head layers of the split model generating the wire traffic
    min_pii_spans: int = 0  # test split of a PII corpus grown until every span type has this many scored spans
    seed: int = 0
    n_boot: int = 1000
    victim: Victim = Victim()
    # the cell's common scored set per head depth (every head-side attacker is also scored on it; prefix-scored
    # attackers on it alone); the floor is the suite's, 0 here
    scored_set: ScoredSetConfig = ScoredSetConfig(min_tokens=0, min_documents=0)


@dataclass
class GridData:
    """Pooled taps per boundary and the rows of each corpus in the test taps."""

    train: dict[Boundary, Taps]
    val: dict[Boundary, Taps] | None
    test: dict[Boundary, Taps]
    test_rows: dict[str, tuple[int, int]]  # corpus -> its rows of the test taps
    depth_of: dict[Boundary, int]
    wire: dict[Boundary, Any] = field(default_factory=dict)  # tail boundary -> attack_wire.WireTargets (on demand)
    # corpus -> {"test_tokens", "spans" per type, "unscored_spans"}: the scored PII of each PII corpus's test split
    pii: dict[str, dict[str, Any]] = field(default_factory=dict)
    common: dict[Boundary, Taps] = field(default_factory=dict)  # head boundary -> the cell's scored set
    chosen: dict[Boundary, list[tuple[int, int]]] = field(default_factory=dict)  # its (test sequence, length)s


@dataclass(frozen=True)
class Job:
    name: str  # grid name (a recipe or an alias)
    recipe: str
    fixed: dict[str, Any]
    boundary: Boundary
    depth: int


def _proposer(cfg: GridConfig, name: str) -> str | None:
    """The recipe whose fitted attacker the grid name ``name`` takes through ``set_proposer`` (None: none)."""
    recipe, fixed = ALIASES.get(name, (name, {}))
    return get_attack_class(recipe).proposer_of({**cfg.options.get(name, {}), **fixed})


def boundaries(cfg: GridConfig) -> list[Boundary]:
    return [Boundary("head", a) for a in cfg.head_depths] + [Boundary("tail", b) for b in cfg.tail_layers]


def pii_test_tokens(loaded: Any, corpus: str, cfg: GridConfig) -> int:
    """Test tokens of ``corpus`` needed for ``cfg.min_pii_spans`` scored spans of every PII type it holds.

    Documents are taken in split order, each cut at ``cfg.max_doc_tokens`` as the taps cut it; a span counts
    when it ends inside the tokenized part. Returns ``cfg.test_tokens`` when that is enough, when the corpus has
    no PII, or when ``min_pii_spans`` is 0; the whole split when even that falls short (the report shows n).
    """
    from splitinfer.corpora import load_corpus

    if cfg.min_pii_spans <= 0:
        return cfg.test_tokens
    dataset = load_corpus(corpus, "test", cfg.seed, None, loaded.tokenizer)
    counts: dict[str, int] = {}
    for spans in dataset["pii_spans"]:
        for s in spans:
            counts.setdefault(s["type"], 0)
    if not counts:
        return cfg.test_tokens
    tokens = 0
    for text, spans in zip(dataset["text"], dataset["pii_spans"]):
        if min(counts.values()) >= cfg.min_pii_spans:
            break
        offs = encode_text(loaded.tokenizer, text).offsets
        offs = offs[: cfg.max_doc_tokens or len(offs)]
        if not offs:
            continue
        covered = max(e for _, e in offs)
        tokens += len(offs)
        for s in spans:
            counts[s["type"]] += int(s["end"] <= covered)
    if min(counts.values()) < cfg.min_pii_spans:
        log.warning("%s: the whole test split holds only %d spans of its rarest PII type (%d wanted)", corpus,
                    min(counts.values()), cfg.min_pii_spans)
    return max(cfg.test_tokens, tokens)


def _pii_summary(taps: Taps) -> dict[str, Any]:
    """Scored PII spans per type and spans that the document cap cut (they start inside, end beyond the text)."""
    spans: dict[str, int] = {}
    unscored = 0
    for d in taps.documents:
        for s in d.get("pii_spans") or []:
            if s["end"] <= len(d["text"]):
                spans[s["type"]] = spans.get(s["type"], 0) + 1
            else:
                unscored += 1
    return {"test_tokens": taps.n_tokens, "spans": dict(sorted(spans.items())), "unscored_spans": unscored}


def extract_split(loaded: Any, corpus: str, bounds: list[Boundary], split: str, n_tokens: int, max_length: int,
                  max_doc_tokens: int | None = None, seed: int = 0) -> dict[Boundary, Taps]:
    """Teacher-forced taps of one corpus split at every boundary; a test split of long documents is cut at
    ``n_tokens / 10`` tokens per document so that it holds >= 10 documents (DESIGN.md section 5: intervals are
    bootstrapped over documents; two long documents gave intervals that meant nothing). States are rounded to
    the family's wire dtype (fp16; bf16 for Gemma, whose states exceed fp16's range)."""
    wire = default_wire_dtype(loaded.model.config)
    taps = extract_depths(loaded, corpus, bounds, split, max_tokens=n_tokens, max_length=max_length,
                          max_doc_tokens=max_doc_tokens, seed=seed, dtype=wire, progress=False)
    if split == "test" and len(set(taps[bounds[0]].seq_doc.tolist())) < MIN_TEST_DOCUMENTS:
        cap = max(1, n_tokens // MIN_TEST_DOCUMENTS)
        taps = extract_depths(loaded, corpus, bounds, split, max_tokens=n_tokens, max_length=max_length,
                              max_doc_tokens=min(max_doc_tokens or cap, cap), seed=seed, dtype=wire, progress=False)
    return taps


def _pool(loaded: Any, cfg: GridConfig, bounds: list[Boundary], split: str, per_corpus: int,
          pii: dict[str, dict[str, Any]] | None = None):
    parts: dict[Boundary, list[Taps]] = {b: [] for b in bounds}
    rows: dict[str, tuple[int, int]] = {}
    for corpus in cfg.corpora:
        n_tokens = pii_test_tokens(loaded, corpus, cfg) if split == "test" else per_corpus
        taps = extract_split(loaded, corpus, bounds, split, n_tokens, cfg.max_length, cfg.max_doc_tokens, cfg.seed)
        summary = _pii_summary(taps[bounds[0]])
        if pii is not None and (summary["spans"] or summary["unscored_spans"]):
            pii[corpus] = summary
            if summary["unscored_spans"]:  # once per corpus, not at every scoring
                log.warning("%s: %d PII span(s) run past the per-document token cap (%s) and are not scored",
                            corpus, summary["unscored_spans"], cfg.max_doc_tokens)
        start = sum(t.n_tokens for t in parts[bounds[0]])
        rows[corpus] = (start, start + taps[bounds[0]].n_tokens)
        for b, t in taps.items():
            parts[b].append(t)
    return {b: Taps.concat(v) for b, v in parts.items()}, rows


def extract(loaded: Any, cfg: GridConfig) -> GridData:
    """Teacher-forced taps of every split and corpus at every boundary of the grid."""
    if cfg.victim.defense != "none":
        raise AttackError(f"defense {cfg.victim.defense!r}: defended victims arrive with splitinfer.defenses; "
                          "run the grid against defense 'none' until then")
    bounds = boundaries(cfg)
    if not bounds:
        raise AttackError("the attack grid has no boundary; give head depths or tail layers")
    train, _ = _pool(loaded, cfg, bounds, "train", cfg.train_tokens)
    val = _pool(loaded, cfg, bounds, "val", cfg.val_tokens)[0] if cfg.val_tokens else None
    pii: dict[str, dict[str, Any]] = {}
    test, rows = _pool(loaded, cfg, bounds, "test", cfg.test_tokens, pii)
    seen = train_openings(loaded.tokenizer, cfg.corpora, cfg.seed, cfg.max_length, cfg.max_doc_tokens,
                          cfg.scored_set.dedup_tokens)
    chosen = {b: choose(test[b], rows, cfg.scored_set, seen) for b in bounds if b.side == "head"}
    common = {b: take(test[b], c) for b, c in chosen.items()}
    for b, t in common.items():
        check_size(t, cfg.scored_set, f"{b}")
    return GridData(train, val, test, rows, {b: b.depth(loaded.num_layers) for b in bounds}, pii=pii, common=common,
                    chosen=chosen)


def test_pool(loaded: Any, cfg: GridConfig, bounds: list[Boundary]) -> dict[Boundary, Taps]:
    """The pooled test taps of ``cfg`` at ``bounds`` as :func:`extract` makes them (a private victim's own states
    of the same sequences, for :func:`benchmarks.scored_set.take` with ``GridData.chosen``)."""
    return _pool(loaded, cfg, bounds, "test", cfg.test_tokens)[0]


def plan(cfg: GridConfig, depth_of: dict[Boundary, int]) -> list[Job]:
    """Every (attacker, boundary) job of the grid the attacker's boundary side admits (depth identifiers apart)."""
    jobs = []
    # attackers that use another's fitted top-k go last, so that the grid's own fit of that helper is reused
    names = sorted(cfg.attacks, key=lambda n: _proposer(cfg, n) is not None)
    for b, depth in depth_of.items():
        for name in names:
            recipe, fixed = ALIASES.get(name, (name, {}))
            cls = get_attack_class(recipe)
            if issubclass(cls, DepthIdentifier) or cls.boundary_side not in (b.side, "any"):
                continue
            if cls.scoring == "prefixes" and cfg.prefix_depths is not None and depth not in cfg.prefix_depths:
                continue
            jobs.append(Job(name, recipe, fixed, b, depth))
    return jobs


# ---------------------------------------------------------------------------- resume keys
def source_hash(recipes: list[str]) -> str:
    """sha256 of the trainer, scoring and grid sources and of the modules of ``recipes``."""
    root = Path(__file__).resolve().parents[1]
    files = [root / p for p in SOURCES] + [Path(inspect.getsourcefile(get_attack_class(r))) for r in recipes]
    h = hashlib.sha256()
    for f in sorted(set(files)):
        h.update(f.name.encode() + b"\0" + (f.read_bytes() if f.is_file() else b"<missing>") + b"\0")
    return h.hexdigest()


def data_hash(data: GridData, boundary: Boundary) -> str:
    """sha256 of what a job at ``boundary`` is fitted and scored on: token ids, documents and sampled states."""
    h = hashlib.sha256()
    for part in (data.train, data.val, data.test):
        if part is None:
            continue
        t = part[boundary]
        for arr in (t.token_ids, t.seq_lengths, np.asarray(t.hidden[:: 97], dtype=np.float32)):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(json.dumps([d.get("doc_id") for d in t.documents]).encode())
        h.update(str(t.meta.get("model_sha256")).encode())
    return h.hexdigest()


def job_key(cfg: GridConfig, job: Job, data: GridData, model_sha256: str) -> str:
    """What one job's rows depend on: every input (data, boundary, model sha256, the shared sizes, the resolved
    hyper-parameters of the attacker and of its proposer) and the code (:func:`source_hash`).

    The selection of attackers and the other attackers' options are not part of it, so a rerun with fewer or more
    attackers, or one attacker's options changed, reuses every other finished job.
    """
    shared = {k: v for k, v in asdict(cfg).items() if k not in ("attacks", "options", "prefix_depths")}
    cls = get_attack_class(job.recipe)
    recipes, hparams = [job.recipe], {job.name: {**cls.defaults, **cfg.options.get(job.name, {}), **job.fixed}}
    proposer = _proposer(cfg, job.name)
    if proposer:
        helper = get_attack_class(proposer)
        recipes.append(proposer)
        hparams[proposer] = {**helper.defaults, **cfg.options.get(proposer, {})}
    text = json.dumps({**shared, "job": job.name, "boundary": str(job.boundary), "hparams": hparams,
                       "model_sha256": model_sha256, "data": data_hash(data, job.boundary),
                       "code": source_hash(recipes)}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- one job
def _slice(inv: Inversion, rows: np.ndarray) -> Inversion:
    return Inversion(inv.tokens[rows], inv.topk[rows], inv.scores[rows], dict(inv.info))


def _build(loaded: Any, cfg: GridConfig, name: str, recipe: str, fixed: dict[str, Any]) -> Any:
    import torch

    torch.manual_seed(cfg.seed)
    return make_attack(recipe, model=loaded, seed=cfg.seed, **{**cfg.options.get(name, {}), **fixed})


def _fit(atk: Any, data: GridData, b: Boundary) -> Any:
    return atk.fit(data.train[b], None if data.val is None else data.val[b])


def run_job(loaded: Any, cfg: GridConfig, data: GridData, job: Job, fitted: dict[tuple[Boundary, str], Any],
            predictions: dict[str, Any] | None = None) -> list[dict]:
    """Fit ``job``'s attacker and score it: one row for all corpora pooled, then one per corpus.

    The pooled per-token predictions go to ``predictions[f"attacks/{name}/{boundary}"]`` when a dict is given.
    """
    from attacks.recipes.vocab_match import scoring_subset
    from benchmarks import attack_wire

    b, vocab = job.boundary, int(loaded.config.vocab_size)
    atk = _build(loaded, cfg, job.name, job.recipe, job.fixed)
    helper = _proposer(cfg, job.name)
    if helper:  # its top-k goes first; fitted now unless this grid fitted it already
        if (b, helper) not in fitted:
            fitted[(b, helper)] = _fit(_build(loaded, cfg, helper, helper, {}), data, b)
        atk.set_proposer(fitted[(b, helper)])
    t = time.perf_counter()
    _fit(atk, data, b)
    fit_s = time.perf_counter() - t
    fitted[(b, job.name)] = atk
    prior = prior_from_taps(data.train[b])
    scored_on, parts = "teacher-forced", {}
    if atk.reads == "next":
        target = attack_wire.next_token_targets(loaded, cfg, data, b)
        t = time.perf_counter()
        inv = atk.invert(target.taps, k=5)
        inv_s = time.perf_counter() - t
        inv, truth, scored_on = _slice(inv, target.rows), target.truth, target.scored_on
        inv.info.update(target.traffic)
        parts = {c: np.flatnonzero(target.corpus_of_row == c) for c in cfg.corpora}
    else:
        if atk.scoring == "prefixes":  # costly per token: scored on the cell's common set alone
            truth = data.common[b] if b in data.common else \
                scoring_subset(data.test[b], data.test_rows, cfg.prefix_tokens, cfg.prefix_pii_tokens)
        else:
            truth = data.test[b]
            parts = {c: np.arange(lo, hi) for c, (lo, hi) in data.test_rows.items()}
        t = time.perf_counter()
        inv = atk.invert(truth, k=5)
        inv_s = time.perf_counter() - t
    meta = {"attack": job.name, "boundary": str(b)}
    pred = collect(inv, truth, vocab_size=vocab, prior=prior, n_boot=cfg.n_boot, seed=cfg.seed, meta=meta)
    m = pred.summarize()
    if predictions is not None:
        predictions[f"attacks/{job.name}/{b}"] = pred
    common = None
    if b in data.common and atk.reads != "next":  # the cell's common set: every head attacker on the same tokens
        same = truth is data.common[b]
        common = {"metrics": m, "doc_top1": doc_top1_counts(pred), "test_tokens": truth.n_tokens} if same else \
            score_on_set(atk.invert(data.common[b], k=5), data.common[b], vocab=vocab, prior=prior,
                         n_boot=cfg.n_boot, seed=cfg.seed, meta=meta)[0]
    info = {k: v for k, v in {**atk.fit_report, **inv.info}.items() if isinstance(v, (int, float, str))}
    row = check_row({
        "attack": job.name, "threat_model": row_threat_model(atk.threat_model, cfg.victim),
        "side": b.side, "leaks": "output" if atk.reads == "next" else "input", "depth": job.depth,
        "boundary": str(b), "defense": cfg.victim.defense, "corpus": "all", "scored_on": scored_on, "metrics": m,
        "fit_seconds": round(fit_s, 3), "invert_seconds": round(inv_s, 3),
        "seconds_per_token": inv_s / max(1, len(inv.tokens)), "train_tokens": data.train[b].n_tokens,
        "test_tokens": len(inv.tokens), "info": info, "doc_top1": doc_top1_counts(pred),
        "common": common}, cfg.victim)
    out = [row]
    for corpus, sub in parts.items():
        if len(sub):
            sm = score(_slice(inv, sub), truth, rows=sub, vocab_size=vocab, prior=prior, n_boot=cfg.n_boot,
                       seed=cfg.seed)
            out.append({**row, "corpus": corpus, "metrics": sm, "test_tokens": int(len(sub)), "doc_top1": None,
                        "common": None})
    log.info("%s at %s: top-1 %.3f (%.1f s fit, %.1f s invert)", job.name, b, m["token_acc_top1"]["value"], fit_s,
             inv_s)
    return out


def depth_rows(loaded: Any, cfg: GridConfig, data: GridData) -> list[dict[str, Any]]:
    """Every depth identifier of the grid, trained on the training taps of all depths, scored per depth."""
    out = []
    for name in cfg.attacks:
        recipe, fixed = ALIASES.get(name, (name, {}))
        if not issubclass(get_attack_class(recipe), DepthIdentifier):
            continue
        did = _build(loaded, cfg, name, recipe, fixed).fit(list(data.train.values()))
        for b, depth in data.depth_of.items():
            for clf in type(did).classifiers:
                acc = did.accuracy(data.test[b], clf)
                out.append(check_row({"attack": name, "boundary": str(b), "depth": depth, "classifier": clf,
                                      "threat_model": row_threat_model(did.threat_model, cfg.victim),
                                      "token_acc": acc["token_acc"], "sequence_acc": acc["sequence_acc"],
                                      "sequences": acc["sequences"]}, cfg.victim))
    return out
