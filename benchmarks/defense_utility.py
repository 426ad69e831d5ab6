"""Utility of a defended split against the undefended model, with intervals over sequences (issue 28 finding 5).

Before, the quick grid's agreement and perplexity came from 58 teacher-forced
positions of 2 plain-prose sequences and greedy identity from 1 prompt, without
intervals; position 0 was a user token (the attention-sink state that drives the
clip's cost), which a deployed chat prompt never has. Here:

- :func:`chat_form_sequences`: held-out text in chat form, the model's own
  template and special tokens included: chat documents of the test split as
  they are, every other corpus's test documents as one user turn through the
  template (:func:`splitinfer.corpora.chat.format_chat_spans`), cut at
  ``max_length`` tokens, until ``positions`` teacher-forced positions.
- :func:`teacher_forced`: next-token agreement (argmax of the defended split
  against the undefended model) and perplexity of the defended split, each with
  a 95% bootstrap interval over sequences (perplexity: the interval of the mean
  negative log-likelihood, exponentiated).
- :func:`greedy`: per held-out prompt (chat form) the defended split's greedy
  answer against the undefended split's: identity (share of the answer before
  the first divergence), token F1 of the two answers (bag of tokens,
  :func:`attacks.metrics.core.token_f1`) and the perplexity of the defended
  answer under the undefended model; intervals over prompts.
- :func:`denoiser_gains`: what a local denoiser wins back, the agreement of
  ``X+denoise`` minus that of ``X`` on the same sequences (paired over sequences).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from attacks.metrics.core import token_f1
from attacks.metrics.intervals import bootstrap_ci, interval, paired_bootstrap_diff
from benchmarks.defenses_speed import speed_columns
from benchmarks.prompts import PROMPTS
from splitinfer.client import SplitModel
from splitinfer.corpora import load_corpus
from splitinfer.corpora.chat import format_chat_spans
from splitinfer.errors import SplitInferError
from splitinfer.tokens import encode_text

__all__ = ["chat_form_sequences", "iter_chat_form", "held_out_prompts", "teacher_forced", "greedy", "cost",
           "cell_utility", "defended_utility", "denoiser_gains", "utility_sequences"]


def _documents(loaded: Any, corpora: list[str], seed: int, split: str = "test") -> list[tuple[str, dict]]:
    """(corpus, document) of every corpus's ``split``, interleaved across corpora (one of each in turn)."""
    per = [[(c, d) for d in load_corpus(c, split, seed, None, loaded.tokenizer)] for c in corpora]
    return [x for group in zip(*per) for x in group] + [x for p in per for x in p[min(map(len, per)):]]


def _as_chat(loaded: Any, doc: dict, max_chars: int) -> tuple[str, str]:
    """(chat-form text, its first user turn): a chat document as it is, any other as one user turn."""
    if doc.get("template_spans"):
        text, spans = doc["text"], doc["template_spans"]
        edges = sorted((s["start"], s["end"]) for s in spans)
        user = next((text[a:b] for (_, a), (b, _) in zip(edges, edges[1:]) if text[a:b].strip()), text)
        return text, user.strip()
    user = doc["text"][:max_chars].strip()
    return format_chat_spans([user], loaded.tokenizer)[0], user


def iter_chat_form(loaded: Any, corpora: list[str], max_length: int, seed: int, split: str = "test"
                   ) -> Iterator[list[int]]:
    """Token ids of each document of ``split`` in chat form (as the runtime sends text), cut at ``max_length``,
    across corpora in turn; held out (``"test"``), or ``"train"`` for what is fitted on public text."""
    for _, doc in _documents(loaded, corpora, seed, split):
        ids = encode_text(loaded.tokenizer, _as_chat(loaded, doc, 8 * max_length)[0]).ids[:max_length]
        if len(ids) >= 2:
            yield ids


def chat_form_sequences(loaded: Any, corpora: list[str], positions: int, max_length: int, seed: int
                        ) -> list[list[int]]:
    """Token ids of held-out chat-form sequences holding at least ``positions`` next-token positions in all."""
    out, n = [], 0
    for ids in iter_chat_form(loaded, corpora, max_length, seed):
        out.append(ids)
        n += len(ids) - 1
        if n >= positions:
            return out
    raise SplitInferError(f"the test splits of {corpora} hold {n} chat-form positions, fewer than the "
                          f"{positions} asked; lower utility_positions or add a corpus")


def held_out_prompts(loaded: Any, corpora: list[str], n: int, seed: int, max_chars: int = 300) -> list[str]:
    """``n`` user turns of held-out documents (one per document, across corpora in turn), cut at ``max_chars``."""
    out = [_as_chat(loaded, doc, max_chars)[1][:max_chars] for _, doc in _documents(loaded, corpora, seed)]
    out = [p for p in dict.fromkeys(out) if p]
    if len(out) < n:
        raise SplitInferError(f"the test splits of {corpora} hold {len(out)} distinct prompts, fewer than the "
                              f"{n} asked; lower greedy_prompts or add a corpus")
    return out[:n]


def _entry(value: float, lo: float | None, hi: float | None, n: int) -> dict[str, Any]:
    return {"value": value, "ci_low": lo, "ci_high": hi, "n": n}


def _perplexity(nll: np.ndarray, count: np.ndarray, n_boot: int, seed: int) -> dict[str, Any]:
    """exp of the mean NLL per token, with the exponentiated bootstrap interval over units (None below 2)."""
    value = math.exp(float(nll.sum() / count.sum()))
    if len(nll) < 2:
        return _entry(value, None, None, int(count.sum()))
    _, lo, hi = bootstrap_ci(nll, count, n_boot=n_boot, seed=seed)
    return _entry(value, math.exp(lo), math.exp(hi), int(count.sum()))


@torch.no_grad()
def clean_logits(loaded: Any, seqs: list[list[int]], cache: dict) -> list[torch.Tensor]:
    """The undefended model's logits of every sequence, (T, V) each (kept in ``cache`` across cells)."""
    key = ("clean", tuple(map(tuple, seqs)))
    if key not in cache:
        dev = next(loaded.model.parameters()).device
        cache[key] = [loaded.model(torch.tensor([s], device=dev)).logits[0].float() for s in seqs]
    return cache[key]


@torch.no_grad()
def teacher_forced(loaded: Any, sm: SplitModel, seqs: list[list[int]], cache: dict, n_boot: int = 1000,
                   seed: int = 0) -> dict[str, Any]:
    """Next-token agreement and perplexity of ``sm`` (the defended split) on ``seqs``, intervals over sequences;
    ``by_sequence`` keeps each sequence's agreed and scored positions for paired differences between defenses."""
    clean = clean_logits(loaded, seqs, cache)
    agree, nll_d, nll_c, count = (np.zeros(len(seqs)) for _ in range(4))
    for i, seq in enumerate(seqs):
        logits = sm.sequence_logits(seq)  # (T, V)
        nxt = torch.tensor(seq[1:], device=logits.device)
        agree[i] = int((logits[:-1].argmax(-1) == clean[i][:-1].argmax(-1)).sum())
        nll_d[i] = float(torch.nn.functional.cross_entropy(logits[:-1].float(), nxt, reduction="sum"))
        nll_c[i] = float(torch.nn.functional.cross_entropy(clean[i][:-1], nxt, reduction="sum"))
        count[i] = len(seq) - 1
    value, lo, hi = interval(agree, count, binary=True, n_boot=n_boot, seed=seed)
    return {"next_token_agreement": _entry(value, lo, hi, int(count.sum())),
            "perplexity": _perplexity(nll_d, count, n_boot, seed),
            "perplexity_undefended": _perplexity(nll_c, count, n_boot, seed),
            "positions": int(count.sum()), "sequences": len(seqs),
            "by_sequence": {"agreed": agree.astype(int).tolist(), "positions": count.astype(int).tolist()}}


@torch.no_grad()
def _answer_nll(loaded: Any, prompt_ids: list[int], answer: list[int]) -> float:
    """Summed NLL of ``answer`` after ``prompt_ids`` under the undefended model."""
    dev = next(loaded.model.parameters()).device
    ids = torch.tensor([prompt_ids + answer], device=dev)
    logits = loaded.model(ids).logits[0, len(prompt_ids) - 1: -1].float()  # (len(answer), V)
    return float(torch.nn.functional.cross_entropy(logits, torch.tensor(answer, device=dev), reduction="sum"))


def greedy(loaded: Any, sm: SplitModel, reference: SplitModel, prompts: list[str], tokens: int, cache: dict,
           key: Any = None, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Greedy identity, answer token F1 and the answer's perplexity under the undefended model, per prompt.

    The undefended answers are kept in ``cache`` under ``key`` (e.g. the head depth) across cells."""
    chat = loaded.has_chat_template
    share, f1s, nll, count, steps_bytes = [], [], [], [], []
    for p in prompts:
        where = ("greedy", key, p, tokens)
        if where not in cache:
            cache[where] = reference.generate(p, tokens, chat=chat).token_ids
        ref = list(cache[where])
        res = sm.generate(p, tokens, chat=chat)
        got = list(res.token_ids)
        same = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
        share.append(same / max(1, len(ref)))
        f1s.append(float(token_f1([np.asarray(ref)], [np.asarray(got)])[0]))
        if got:
            nll.append(_answer_nll(loaded, sm.encode_prompt(p, chat), got))
            count.append(len(got))
        steps_bytes.append(res.decoding_summary()["bytes_per_step"])
    ones = np.ones(len(prompts))
    out = {"greedy_prompts": len(prompts), "bytes_per_step": float(np.mean(steps_bytes))}
    for name, vals in (("greedy_identity", share), ("answer_token_f1", f1s)):
        out[name] = _entry(*interval(np.asarray(vals), ones, binary=False, n_boot=n_boot, seed=seed), len(prompts))
    out["answer_perplexity"] = _perplexity(np.asarray(nll), np.asarray(count, dtype=float), n_boot, seed) \
        if count else _entry(float("nan"), None, None, 0)
    return out


def cost(loaded: Any, sm: SplitModel, cfg: dict) -> dict[str, Any]:
    """tau of combined under the defense, its tok/s modelled at 80 ms RTT, and tok/s per decoding (CPU and flat
    compute) for the privacy-vs-speed plot (the suite's cost prompts)."""
    prompts = [PROMPTS[c][0] for c in cfg.get("categories", ["conversational"])]
    tokens = int(cfg.get("tokens", 24))
    opts = dict(cfg.get("decoding_options", {}).get("combined", {}))
    comb = [sm.generate(p, tokens, chat=loaded.has_chat_template, decoding="combined", decoding_options=opts)
            for p in prompts]
    seq = [sm.generate(p, tokens, chat=loaded.has_chat_template) for p in prompts]
    speeds = speed_columns({"sequential": seq, "combined": comb})  # None where no decode step was timed
    return {"tau_combined": sum(len(r.token_ids) for r in comb) / max(1, sum(len(r.steps) for r in comb)),
            "modelled_tok_s_80ms": speeds["tok_s_80ms"]["combined"]["cpu"], **speeds}


def cell_utility(loaded: Any, depth: int, tail: int, pipe: Any, cfg: dict, texts: dict, cache: dict,
                 seed: int) -> dict[str, Any]:
    """Teacher-forced agreement and perplexity, greedy identity and answer measures (intervals), and cost."""
    sm = SplitModel(loaded, f"{depth},{tail}", defense=pipe)
    ref = cache.setdefault(("reference", depth), SplitModel(loaded, f"{depth},{tail}"))
    tf = teacher_forced(loaded, sm, texts["sequences"], cache, seed=seed)
    gr = greedy(loaded, sm, ref, texts["prompts"], int(cfg.get("tokens", 24)), cache, key=depth, seed=seed)
    flat = {k: tf[k]["value"] for k in ("next_token_agreement", "perplexity", "perplexity_undefended")}
    return {**flat, "greedy_identity": gr["greedy_identity"]["value"], "positions": tf["positions"],
            "utility_sequences": tf["sequences"], "utility_by_sequence": tf["by_sequence"],
            "greedy_prompts": gr["greedy_prompts"],
            "bytes_per_step": gr["bytes_per_step"], "intervals": {
                **{k: tf[k] for k in ("next_token_agreement", "perplexity", "perplexity_undefended")},
                **{k: gr[k] for k in ("greedy_identity", "answer_token_f1", "answer_perplexity")}},
            **cost(loaded, sm, cfg)}


def denoiser_gains(rows: list[dict[str, Any]], n_boot: int = 1000, seed: int = 0) -> list[dict[str, Any]]:
    """Per row ``X+denoise(...)`` whose base ``X`` was measured at the same head depth on the same utility
    sequences: the denoiser's next-token agreement minus the base's, a paired bootstrap over sequences
    (the utility Split-and-Denoise, arXiv 2310.09130, wins back). Rows without per-sequence counts (written
    before they were kept) or measured on other sequences give nothing, never an unpaired difference."""
    by = {(r["depth"], r["defense"]): r for r in rows}
    out = []
    for r in rows:
        base = by.get((r["depth"], re.sub(r"\+denoise\([^)]*\)", "", r["defense"])))
        if base is None or base is r:
            continue
        a, b = r.get("utility_by_sequence"), base.get("utility_by_sequence")
        if not a or not b or a["positions"] != b["positions"]:
            continue
        diff, lo, hi = paired_bootstrap_diff(a["agreed"], a["positions"], b["agreed"], b["positions"],
                                             n_boot=n_boot, seed=seed)
        out.append({"depth": r["depth"], "defense": r["defense"], "base": base["defense"], "value": diff,
                    "ci_low": lo, "ci_high": hi, "sequences": len(a["positions"])})
    return out


def utility_sequences(held: Any, n: int) -> list[list[int]]:
    """The token ids of the first ``n`` sequences of taps ``held`` (the clip ablation's plain-text sequences)."""
    return [held.token_ids[s].tolist() for _, s in list(held.sequences())[:n]]


def defended_utility(loaded: Any, depth: int, tail: int, pipe: Any, seqs: list[list[int]]) -> dict[str, Any]:
    """:func:`teacher_forced` as flat values (next-token agreement, perplexity and the undefended perplexity,
    positions), for callers that tabulate values alone (:mod:`benchmarks.clip_ablation`)."""
    tf = teacher_forced(loaded, SplitModel(loaded, f"{depth},{tail}", defense=pipe), seqs, {})
    return {**{k: tf[k]["value"] for k in ("next_token_agreement", "perplexity", "perplexity_undefended")},
            "positions": tf["positions"]}
