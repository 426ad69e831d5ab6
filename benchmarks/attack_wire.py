"""Targets of output-side attackers (``reads = "next"``): the tokens a real split generation produced.

An output-side attacker sees the states the body returns and guesses the
token the user's tail generates from each. It is scored on real traffic:
:func:`wire_targets` runs split generation (:class:`splitinfer.client.SplitModel`,
in process) on prompts cut from the test documents of each corpus, half of
them with speculative drafts (``ngram-pool``: tree drafts, rejected nodes on
the wire), records the frames with :class:`attacks.wiretap.WireTap`, and keeps,
per session, the committed rows in position order (a committed draft token
attends only to its committed ancestors, so its returned state is the causal
one; the cloud learns which rows were committed from the keep fields). The
target of a row is the token generated right after it; prompt rows whose
next token is still prompt are not scored. At most ``wire_tokens`` generated
tokens per corpus. Learned attackers are trained on teacher-forced taps, as
before; only the scoring data is the wire.

Assumption: the prompt goes to the cloud in one prefill frame (true of
:meth:`SplitModel.generate`). With ``wire_tokens = 0`` the target is the next
token of the teacher-forced test taps instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attacks.errors import AttackError
from attacks.tapdata import Taps
from attacks.boundary import Boundary
from splitinfer.tokens import encode_text

log = logging.getLogger(__name__)

PROMPT_TOKENS = 32  # each prompt: the first tokens of a test document
NEW_TOKENS = 32  # generated per prompt (the last prompt of a corpus gets what is left of wire_tokens)
DECODINGS = ("sequential", "ngram-pool")  # alternated over prompts: sequential and speculative traffic


@dataclass
class NextTargets:
    """Taps to invert, the scored rows, and the truth of those rows (token ids = the token generated next)."""

    taps: Taps
    rows: np.ndarray  # (n,) rows of ``taps`` that are scored
    truth: Taps  # n one-token sequences, token_ids = targets
    corpus_of_row: np.ndarray  # (n,) corpus name of each scored row
    scored_on: str
    traffic: dict[str, int] = field(default_factory=dict)  # frames, draft frames, rejected draft rows


def _session_rows(steps: list[Any]) -> dict[str, list[tuple[int, Any, int]]]:
    """session -> committed (position, returned state (d,), label) rows, in order of first appearance."""
    out: dict[str, list[tuple[int, Any, int]]] = {}
    for st in steps:
        rows = out.setdefault(st.session, [])
        if st.returned is None:
            continue
        for j, kept in enumerate(st.kept):
            if kept:
                rows.append((int(st.positions[j]), st.returned[j], -1 if st.token_ids is None else st.token_ids[j]))
    return out


def wire_targets(loaded: Any, cfg: Any, data: Any, boundary: Boundary) -> NextTargets:
    """Generate, tap and label real split traffic at ``boundary`` (``tail:B``) for every corpus of the grid."""
    from attacks.wiretap import WireTap
    from splitinfer.client import SplitModel

    tail = boundary.layers
    head = max(1, min(cfg.wire_split_head, loaded.num_layers - tail - 1))
    sm = SplitModel(loaded, f"{head},{tail}")  # the family's wire dtype (bf16 for Gemma)
    store = np.float16 if sm.wire_dtype_name == "fp16" else np.float32  # bf16 values are exact in float32
    tok = loaded.tokenizer
    test = next(iter(data.test.values()))
    hidden, ids, lengths, docs, targets, corpus_of = [], [], [], [], [], []
    traffic = {"wire_frames": 0, "wire_draft_frames": 0, "wire_rejected_rows": 0, "wire_sessions": 0,
               "wire_skipped_sessions": 0}
    for corpus, (lo, hi) in data.test_rows.items():
        seq_docs = sorted(set(test.doc_index()[lo:hi].tolist()))
        results, budget = [], cfg.wire_tokens
        with WireTap(sm) as wt:
            for k, d in enumerate(seq_docs):
                if budget <= 0:
                    break
                prompt = encode_text(tok, test.documents[d]["text"]).ids[:PROMPT_TOKENS]
                if len(prompt) < 2:
                    continue
                n = min(NEW_TOKENS, budget)
                res = sm.generate(prompt, n, decoding=DECODINGS[k % len(DECODINGS)])
                results.append(res)
                budget -= len(res.token_ids)
        sessions = _session_rows(wt.steps)
        traffic["wire_frames"] += len(wt.steps)
        traffic["wire_draft_frames"] += sum(st.step > 0 and len(st.positions) > 1 for st in wt.steps)
        traffic["wire_rejected_rows"] += sum(not k for st in wt.steps for k in st.kept)
        if len(sessions) != len(results):
            raise AttackError(f"wire tap of {corpus}: {len(sessions)} sessions for {len(results)} generations")
        traffic["wire_sessions"] += len(sessions)
        for (sid, rows), res in zip(sessions.items(), results):
            rows.sort(key=lambda r: r[0])
            stream = list(res.prompt_ids) + list(res.token_ids)
            pos = [r[0] for r in rows]
            if pos != list(range(len(rows))) or any(lab not in (-1, stream[p]) for p, _, lab in rows):
                log.warning("wire session %s of %s: committed rows are not the generated stream; skipped", sid, corpus)
                traffic["wire_skipped_sessions"] += 1
                continue
            p0 = len(res.prompt_ids)
            hidden.append(np.stack([r[1].float().numpy() for r in rows]).astype(store))  # (T, d) as received
            ids.append(np.asarray(stream[: len(rows)], dtype=np.int64))
            lengths.append(len(rows))
            targets.append(np.asarray([stream[p + 1] if p0 <= p + 1 < len(stream) else -1 for p in pos]))
            corpus_of += [corpus] * len(rows)
            docs.append({"doc_id": f"wire-{corpus}-{len(docs)}", "genre": corpus, "pii_spans": [],
                         "text": tok.decode(stream, skip_special_tokens=False)})
    if not hidden:
        raise AttackError(f"no wire traffic to score: {traffic['wire_skipped_sessions']} of "
                          f"{traffic['wire_sessions']} sessions skipped, and the test documents gave no other prompt "
                          "of 2 or more tokens")
    meta = {**test.meta, "boundary": str(boundary), "depth": data.depth_of[boundary], "kind": "wire", "split": "wire",
            "wire_dtype": sm.wire_dtype_name}
    taps = Taps(np.concatenate(hidden), np.concatenate(ids), lengths, np.arange(len(docs)), docs, None, meta)
    target = np.concatenate(targets)
    rows = np.flatnonzero(target >= 0)
    truth = taps.select_tokens(rows)
    truth.token_ids = target[rows]
    log.info("wire traffic at %s: %d generated tokens scored over %d sessions", boundary, len(rows), len(docs))
    return NextTargets(taps, rows, truth, np.asarray(corpus_of)[rows], "wire", traffic)


TRAFFIC_KEYS = ("wire_sessions", "wire_skipped_sessions", "wire_frames", "wire_draft_frames", "wire_rejected_rows")


def record_traffic(results: dict[str, Any], run: str, info: dict[str, Any]) -> None:
    """Add the wire traffic counts of a row's ``info`` (sessions, skipped sessions, frames...) to ``run``."""
    from benchmarks.schema import add_metric, metric

    for key in TRAFFIC_KEYS:
        if key in info:
            add_metric(results, run, key, metric(float(info[key]), kind="info", unit="count"))


def traffic_line(rows: list[dict[str, Any]]) -> str | None:
    """One Markdown sentence per tail boundary: sessions generated, skipped, frames and draft rows on the wire."""
    seen: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("scored_on") == "wire" and "wire_sessions" in r.get("info", {}):
            seen.setdefault(r["boundary"], r["info"])
    if not seen:
        return None
    parts = [f"{b}: {i['wire_sessions']} sessions, {i['wire_skipped_sessions']} skipped (committed rows not the "
             f"generated stream), {i['wire_frames']} frames ({i['wire_draft_frames']} with drafts, "
             f"{i['wire_rejected_rows']} rejected draft rows)" for b, i in seen.items()]
    return "Wire traffic scored: " + "; ".join(parts) + "."


def teacher_forced_targets(data: Any, boundary: Boundary) -> NextTargets:
    """The next token of each teacher-forced test row (no generation)."""
    from attacks.recipes._common import next_token_rows

    test = data.test[boundary]
    rows, truth = next_token_rows(test)
    corpus = np.empty(test.n_tokens, dtype=object)
    for c, (lo, hi) in data.test_rows.items():
        corpus[lo:hi] = c
    return NextTargets(test, rows, truth, corpus[rows].astype(str), "teacher-forced")


def next_token_targets(loaded: Any, cfg: Any, data: Any, boundary: Boundary) -> NextTargets:
    """The scoring data of output-side attackers at ``boundary``, made once per grid and boundary."""
    if boundary not in data.wire:
        data.wire[boundary] = (wire_targets(loaded, cfg, data, boundary) if cfg.wire_tokens > 0
                               else teacher_forced_targets(data, boundary))
    return data.wire[boundary]
