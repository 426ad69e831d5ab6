"""Training the ``feature-draft`` head (:mod:`.feature_head`) by self-distillation: ``splitinfer draft-train``.

1. *Prompts* from the project's corpora, TRAIN split only (:mod:`splitinfer.corpora`:
   prose, code, chat, pii): a random snippet of a document wrapped in the
   chat template with a varied instruction (continue, explain, summarise,
   convert to JSON / CSV / a table, answer, reply...); or the user's own
   (``--prompts-file``: JSONL of ``{"text": ...}``). The benchmark prompts
   (:mod:`benchmarks.prompts`) are never used, so the decoding benchmark
   measures the head on prompts it has not seen.
2. *Greedy continuations* of those prompts by the model itself, batched
   (``model.generate``, greedy), so the labels are what the verifier accepts.
3. *Features*: each prompt + continuation is teacher-forced once through the
   unsplit model; the final normed states ``s_t`` (d,) and the model's argmax
   ``y_t`` at every position are kept (labels = the model's own greedy token
   there, also on the prompt positions, which makes prompts cheap extra data).
4. *Draft vocabulary* (``vocab``, default 8192 of the model's tokens): the
   tokens the model itself emitted most often in the training sequences,
   then the most frequent in them, then the lowest ids (BPE merge order),
   as FR-Spec (Zhao et al. 2025) ranks its shortlist by corpus frequency.
   Training and the held-out check read out only those LM-head rows; a label
   outside the shortlist adds no cross-entropy term in training and counts
   as a miss in the held-out check, whose coverage (share of held-out
   generated positions whose label is in the shortlist) the metadata
   records. ``vocab=0`` keeps all tokens.
5. *Training*: windows of ``unroll`` positions; the head starts from the true
   ``s_{t-1}`` and then feeds its OWN predicted features (EAGLE's fix for
   feature uncertainty) with the true next tokens; loss = cross-entropy of
   ``lm_head(s_hat)`` against ``y`` at every unrolled depth + ``reg_weight`` x
   smooth-L1 between predicted and true features. AdamW, cosine decay.
6. *Held-out agreement*: 10% of the sequences (by prompt) are kept out;
   top-1 agreement with the model's greedy token per depth (own features,
   true tokens) and chain agreement (all depths up to ``j`` right) on their
   generated positions.

Everything is seeded; the result is saved as safetensors + JSON
(:func:`~.feature_head.save_head`).
"""

from __future__ import annotations

import logging
import math
import random
import time

import torch
from torch.nn import functional as F
from tqdm import tqdm

from splitinfer.decoding.feature_head import FeatureHead
from splitinfer.errors import SplitInferError
from splitinfer.tokens import encode_chat

log = logging.getLogger(__name__)

CORPORA = ("prose", "code", "chat", "pii")
INSTRUCTIONS = {
    "prose": ["Continue this text:", "Summarize this passage in a few sentences:", "Explain this passage simply:",
              "Extract the key facts from this passage as a JSON object:", "Turn this passage into a bulleted list:",
              "Write a short poem inspired by this passage:", "Write a short story that begins like this:"],
    "code": ["Explain what this code does:", "Continue this code:", "Add docstrings and type hints to this code:",
             "Write unit tests for this code:", "Convert this code to JavaScript:",
             "List the functions in this code as a Markdown table with a one-line description each:"],
    "chat": ["{text}", "Answer this question:", "Reply to this message in a friendly way:",
             "Answer this question in detail, with examples:"],
    "pii": ["Convert the following record into JSON:", "Make a Markdown table of the fields in this text:",
            "Write a CSV file with a header row for the data in this text:", "Summarize this document:",
            "Write a polite reply to this letter:"],
}


def train_prompt_texts(tokenizer, n: int, seed: int, max_chars: int = 600) -> list[str]:
    """``n`` user messages from snippets of the corpora's train split, round-robin over :data:`CORPORA`."""
    from splitinfer.corpora import load_corpus

    rng = random.Random(seed)
    texts = {c: [t for t in load_corpus(c, "train", tokenizer=tokenizer)["text"] if t.strip()] for c in CORPORA}
    out = []
    for i in range(n):
        corpus = CORPORA[i % len(CORPORA)]
        doc = rng.choice(texts[corpus])
        start = rng.randrange(max(1, len(doc) - max_chars // 2))
        snippet = doc[start : start + rng.randint(max_chars // 4, max_chars)].strip() or doc[:max_chars]
        instr = rng.choice(INSTRUCTIONS[corpus])
        out.append(instr.format(text=snippet) if "{text}" in instr else f"{instr}\n\n{snippet}")
    return out


def chat_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Each text as one user turn in the model's chat template, ready for the assistant's answer."""
    out = []
    for text in texts:
        out.append(encode_chat(tokenizer, [{"role": "user", "content": text}]).ids)
    return out


def read_prompt_file(path: str) -> list[str]:
    """User messages from a JSONL file (one ``{"text": ...}`` object per line), e.g. prompts of your own domain."""
    import json
    from pathlib import Path

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SplitInferError(f"cannot read prompts file {path}: {e.strerror or e}") from None
    texts = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise SplitInferError(f"prompts file {path}, line {i}: not JSON (want one {{\"text\": ...}} per line)") \
                from None
        if not isinstance(rec, dict) or not isinstance(rec.get("text"), str) or not rec["text"].strip():
            raise SplitInferError(f"prompts file {path}, line {i}: want an object with a non-empty \"text\" string")
        texts.append(rec["text"])
    if not texts:
        raise SplitInferError(f"prompts file {path} holds no prompts")
    return texts


@torch.no_grad()
def greedy_continuations(model, tokenizer, prompts: list[list[int]], max_new: int, batch: int,
                         eos: set[int]) -> list[tuple[list[int], list[int]]]:
    """(prompt, greedy continuation up to and including EOS) per prompt, generated ``batch`` at a time."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos))
    dev = next(model.parameters()).device
    out = []
    for i in tqdm(range(0, len(prompts), batch), desc="greedy continuations", leave=False):
        group = prompts[i : i + batch]
        width = max(map(len, group))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in group], device=dev)  # (B, P) left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=dev)  # (B, P)
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             pad_token_id=pad, eos_token_id=sorted(eos))[:, width:].tolist()  # (B, <= max_new)
        for p, g in zip(group, gen):
            cut = next((j + 1 for j, t in enumerate(g) if t in eos), len(g))
            out.append((p, g[:cut]))
    return out


@torch.no_grad()
def teacher_features(model, seqs: list[list[int]], batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence: final normed states (L, d) float32 and the model's argmax after each position (L,)."""
    dev = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out: list = [None] * len(seqs)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    for k in tqdm(range(0, len(order), batch), desc="teacher-forced features", leave=False):
        idx = order[k : k + batch]
        width = max(len(seqs[i]) for i in idx)
        ids = torch.tensor([seqs[i] + [0] * (width - len(seqs[i])) for i in idx], device=dev)  # (B, L) right-padded
        mask = (torch.arange(width, device=dev)[None] < torch.tensor([len(seqs[i]) for i in idx], device=dev)[:, None])
        states = model.model(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # (B, L, d), after the norm
        logits = model.lm_head(states).float()  # (B, L, V)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        labels = logits.argmax(-1)  # (B, L)
        for row, i in enumerate(idx):
            n = len(seqs[i])
            out[i] = (states[row, :n].float().cpu(), labels[row, :n].cpu())
    return out


def vocab_shortlist(labels: torch.Tensor, tokens: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` most useful draft tokens, sorted by id: (size,) int64.

    Ranked by how often the model emitted them (``labels`` (N,)), ties by how
    often they occur in the sequences (``tokens`` (N,)), then by lower id.
    """
    if not 0 < size <= vocab_size:
        raise SplitInferError(f"the draft vocabulary must hold 1..{vocab_size} tokens, got {size}")
    labels, tokens = labels.cpu(), tokens.cpu()
    score = (torch.bincount(labels, minlength=vocab_size).double() * (tokens.numel() + 1)
             + torch.bincount(tokens, minlength=vocab_size).double())  # (V,) label count first, exact in fp64
    order = torch.argsort(-score, stable=True)  # stable: equal scores keep id order
    return order[:size].sort().values


def windows(lengths: list[int], starts_from: list[int], unroll: int) -> torch.Tensor:
    """Flat start indices ``t`` (>= 1 inside a sequence, from ``starts_from``) with ``t + unroll <= L``."""
    out, base = [], 0
    for n, first in zip(lengths, starts_from):
        out += range(base + max(1, first), base + n - unroll + 1)
        base += n
    return torch.tensor(out, dtype=torch.long)


def unrolled_logits(head: FeatureHead, lm_head, feats, tokens, emb, starts, unroll):
    """Unroll the head from true s_{t-1} over ``unroll`` depths: per depth (B, K) logits and (B, d) features.

    K is the draft vocabulary: the shortlist, or all V tokens."""
    h = feats[starts - 1]  # (B, d)
    out = []
    for j in range(unroll):
        h = head(h, emb(tokens[starts + j]).float())  # (B, d)
        out.append((lm_head(h), h))
    return out


def train_head(data: dict, emb, lm_head, *, hidden: int, unroll: int, steps: int, batch: int, lr: float,
               reg_weight: float, seed: int, progress: bool = True) -> FeatureHead:
    """Fit a :class:`FeatureHead` on ``data`` (flat ``feats`` (N, d), ``tokens``/``labels`` (N,), ``starts``)."""
    torch.manual_seed(seed)
    feats, tokens, labels, starts = data["feats"], data["tokens"], data["labels"], data["starts"]
    if len(starts) == 0:
        raise SplitInferError("no training windows: give more --train-tokens (sequences are shorter than the unroll)")
    head = FeatureHead(feats.shape[1], hidden).to(feats.device)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    gen = torch.Generator().manual_seed(seed)
    bar = tqdm(range(steps), desc="training feature head", leave=False, disable=not progress)
    for _ in bar:
        pick = starts[torch.randint(len(starts), (batch,), generator=gen)]  # (B,)
        loss = torch.zeros(())
        for j, (logits, h) in enumerate(unrolled_logits(head, lm_head, feats, tokens, emb, pick, unroll)):
            y = labels[pick + j]  # (B,) shortlist index, -100 = outside the shortlist (no cross-entropy term)
            ce = F.cross_entropy(logits, y) if bool((y >= 0).any()) else logits.sum() * 0.0
            loss = loss + ce + reg_weight * F.smooth_l1_loss(h, feats[pick + j])
        opt.zero_grad()
        (loss / unroll).backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item() / unroll:.3f}")
    return head.eval()


@torch.no_grad()
def agreement(head: FeatureHead, data: dict, emb, lm_head, depth: int, batch: int = 256) -> dict:
    """Held-out top-1 agreement with the model's greedy token per depth, and chain agreement (all depths <= j)."""
    starts = data["starts"]
    hit = torch.zeros(depth, device=starts.device)
    chain = torch.zeros(depth, device=starts.device)
    for k in range(0, len(starts), batch):
        pick = starts[k : k + batch]
        ok = torch.ones(len(pick), dtype=torch.bool, device=starts.device)
        for j, (logits, _) in enumerate(unrolled_logits(head, lm_head, data["feats"], data["tokens"], emb, pick,
                                                        depth)):
            right = logits.argmax(-1) == data["labels"][pick + j]  # (B,)
            ok &= right
            hit[j] += right.sum()
            chain[j] += ok.sum()
    n = max(1, len(starts))
    return {"positions": len(starts), "top1_per_depth": [round(float(x) / n, 4) for x in hit],
            "chain_per_depth": [round(float(x) / n, 4) for x in chain]}


def flatten(items: list[tuple[torch.Tensor, torch.Tensor, list[int], int]]) -> dict:
    """(feats (L, d), labels (L,), token ids, first generated position) per sequence -> flat training arrays."""
    return {
        "feats": torch.cat([f for f, _, _, _ in items]),  # (N, d)
        "labels": torch.cat([y for _, y, _, _ in items]),  # (N,)
        "tokens": torch.tensor([t for _, _, ids, _ in items for t in ids], dtype=torch.long),  # (N,)
        "lengths": [len(ids) for _, _, ids, _ in items],
    }


def draft_train(loaded, *, tokens: int = 12000, seed: int = 0, hidden: int = 1024, unroll: int = 4,
                steps: int = 400, batch: int = 128, lr: float = 1e-3, reg_weight: float = 0.2, max_new: int = 128,
                gen_batch: int = 16, eval_depth: int = 6, prompt_chars: int = 600, prompt_texts: list[str] | None = None,
                vocab: int = 8192, progress: bool = True) -> tuple[FeatureHead, dict]:
    """The whole recipe (module docstring) on a :class:`~splitinfer.models.LoadedModel`; returns (head, meta).

    ``prompt_texts``: user messages to continue instead of corpus snippets (cycled to the number of prompts
    ``tokens`` needs). Runs on the model's device (data, head and optimizer); the head comes back on the CPU.
    """
    from splitinfer.client import eos_ids

    if tokens < 1 or steps < 1 or unroll < 1 or hidden < 1 or batch < 1 or max_new < 2:
        raise SplitInferError("draft-train needs --train-tokens, --steps, --unroll, --hidden and --batch >= 1")
    if vocab < 0:
        raise SplitInferError(f"--vocab must be >= 0 (0 = the whole vocabulary), got {vocab}")
    random.seed(seed)
    torch.manual_seed(seed)
    model, tok = loaded.model, loaded.tokenizer
    eos = set(eos_ids(loaded))
    timings, t0 = {}, time.perf_counter()
    n_prompts = max(2, math.ceil(tokens / (0.75 * max_new)))  # some continuations stop early at EOS
    if prompt_texts is None:
        texts = train_prompt_texts(tok, n_prompts, seed, prompt_chars)
    else:
        texts = [prompt_texts[i % len(prompt_texts)] for i in range(n_prompts)]
    prompts = chat_prompts(tok, texts)
    pairs = greedy_continuations(model, tok, prompts, max_new, gen_batch, eos)
    timings["generate_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    seqs = [p + g for p, g in pairs]
    feats = teacher_features(model, seqs)
    timings["features_s"] = time.perf_counter() - t1
    rng = random.Random(seed)
    order = list(range(len(seqs)))
    rng.shuffle(order)
    n_held = max(1, len(order) // 10)
    held, train = sorted(order[:n_held]), sorted(order[n_held:])
    item = lambda i: (feats[i][0], feats[i][1], seqs[i], len(pairs[i][0]))  # noqa: E731
    train_data = flatten([item(i) for i in train])
    train_data["starts"] = windows(train_data["lengths"], [1] * len(train), unroll)  # prompt positions too
    held_data = flatten([item(i) for i in held])
    held_data["starts"] = windows(held_data["lengths"], [len(pairs[i][0]) for i in held], eval_depth)
    emb = model.get_input_embeddings()
    dev = emb.weight.device
    for data in (train_data, held_data):
        data.update({k: v.to(dev) for k, v in data.items() if isinstance(v, torch.Tensor)})
    w = model.lm_head.weight.detach().float()  # (V, d) frozen
    n_vocab = int(w.shape[0])
    shortlist, coverage = None, None
    if 0 < vocab < n_vocab:
        shortlist = vocab_shortlist(train_data["labels"], train_data["tokens"], n_vocab, vocab).to(dev)  # (K,)
        index = torch.full((n_vocab,), -100, dtype=torch.long, device=dev)  # token id -> shortlist row
        index[shortlist] = torch.arange(len(shortlist), device=dev)
        gen_pos = held_data["starts"].unique()
        coverage = float((index[held_data["labels"][gen_pos]] >= 0).float().mean()) if len(gen_pos) else None
        for data in (train_data, held_data):
            data["labels"] = index[data["labels"]]
        w = w[shortlist]  # (K, d)
    softcap = getattr(model.config, "final_logit_softcapping", None)

    def lm_head(h):  # (B, d) -> (B, K): the draft vocabulary's rows
        logits = F.linear(h, w)
        return torch.tanh(logits / softcap) * softcap if softcap else logits

    for p in model.parameters():
        p.requires_grad_(False)
    t2 = time.perf_counter()
    head = train_head(train_data, emb, lm_head, hidden=hidden, unroll=unroll, steps=steps, batch=batch, lr=lr,
                      reg_weight=reg_weight, seed=seed, progress=progress)
    timings["train_s"] = time.perf_counter() - t2
    head.vocab_shortlist = shortlist
    t3 = time.perf_counter()
    held_out = agreement(head, held_data, emb, lm_head, eval_depth)
    timings["eval_s"] = time.perf_counter() - t3
    timings["total_s"] = time.perf_counter() - t0
    meta = {
        "model": loaded.spec, "model_sha256": loaded.sha256 or "", "vocab_size": n_vocab,
        "draft_vocab": n_vocab if shortlist is None else len(shortlist), "draft_vocab_coverage": None if coverage is None else round(coverage, 4),
        "seed": seed, "unroll": unroll, "steps": steps, "batch": batch, "lr": lr, "reg_weight": reg_weight,
        "prompt_source": "corpora train split" if prompt_texts is None else "prompts file",
        "corpora": list(CORPORA) if prompt_texts is None else [],
        "corpus_split": "train" if prompt_texts is None else None, "prompts": len(prompts),
        "generated_tokens": sum(len(g) for _, g in pairs), "train_sequences": len(train),
        "train_positions": int(train_data["feats"].shape[0]), "train_windows": len(train_data["starts"]),
        "heldout_sequences": len(held), "max_new_tokens": max_new, "heldout": held_out,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    log.info("feature head: held-out top-1 per depth %s", held_out["top1_per_depth"])
    return head.cpu(), meta
