"""Exactness of split generation against the unsplit model (issue 2's acceptance check).

For each split and prompt: greedy split generation vs ``model.generate(do_sample=False)``
on the unsplit model; token identity, and the max |logit difference| over every
emitted token. Run with fp32 on the wire (must be exact to 1e-4) and fp16 (reported).
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from splitinfer.client import SplitModel
from splitinfer.models import LoadedModel

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is the capital of Australia, and why was it chosen?",
    "Write a short poem about autumn leaves.",
    'Convert this to JSON: name Ada Lovelace, born 1815, field mathematics.',
    "Explain how a hash table works in two sentences.",
    "List three tips for staying focused while studying.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
]
SPLITS = ["1,1", "2,2", "4,4", "8,8", "2,8", "12,12"]


def unsplit_reference(loaded: LoadedModel, prompt_ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and (n, V) logits of the unsplit model with HF generate."""
    ids = torch.tensor([prompt_ids], device=next(loaded.model.parameters()).device)
    with torch.no_grad():
        out = loaded.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, output_logits=True,
            return_dict_in_generate=True, pad_token_id=loaded.tokenizer.pad_token_id or 0,
        )
    return out.sequences[0, len(prompt_ids):].tolist(), torch.stack([x[0].float().cpu() for x in out.logits])


def compare(tokens: list[int], logits: list[torch.Tensor], ref_tokens: list[int], ref_logits: torch.Tensor) -> dict:
    """Token identity, share of identical tokens and max |logit diff| over the common prefix."""
    n = min(len(tokens), len(ref_tokens))
    same = sum(a == b for a, b in zip(tokens[:n], ref_tokens[:n]))
    first_diff = next((i for i in range(n) if tokens[i] != ref_tokens[i]), None)
    upto = n if first_diff is None else first_diff + 1  # logits are comparable until the first divergence
    diff = (torch.stack(logits[:upto]).cpu() - ref_logits[:upto]).abs().max().item() if upto else 0.0
    return {"identical": tokens == ref_tokens, "same_share": same / max(1, len(ref_tokens)),
            "max_logit_diff": diff, "n": len(ref_tokens)}


def run_exactness(loaded: LoadedModel, splits=SPLITS, prompts=PROMPTS, n_tokens: int = 64,
                  wires=("fp32", "fp16"), chat: bool | None = None) -> list[dict]:
    """Rows of :func:`compare` per (prompt, split, wire); ``chat=None`` uses the template if there is one."""
    if chat is None:
        chat = loaded.has_chat_template
    rows = []
    models = {(s, w): SplitModel(loaded, s, wire_dtype=w) for s in splits for w in wires}
    for prompt in tqdm(prompts, desc="exactness prompts", unit="prompt"):
        prompt_ids = models[(splits[0], wires[0])].encode_prompt(prompt, chat=chat)
        ref_tokens, ref_logits = unsplit_reference(loaded, prompt_ids, n_tokens)
        for (split, wire), sm in models.items():
            res = sm.generate(prompt_ids, n_tokens, record_logits=True)
            rows.append({"split": split, "wire": wire, "prompt": prompt,
                         **compare(res.token_ids, res.logits, ref_tokens, ref_logits)})
    return rows


def format_exactness(rows: list[dict]) -> str:
    out = [f"{'split':>6} {'wire':>5} {'prompts':>8} {'identical':>10} {'same tokens':>12} {'max |dlogit|':>13}"]
    keys = sorted({(r["split"], r["wire"]) for r in rows}, key=lambda k: (k[1], [int(x) for x in k[0].split(",")]))
    for split, wire in keys:
        rs = [r for r in rows if r["split"] == split and r["wire"] == wire]
        same = sum(r["same_share"] * r["n"] for r in rs) / sum(r["n"] for r in rs)
        out.append(f"{split:>6} {wire:>5} {len(rs):>8} {sum(r['identical'] for r in rs):>10} "
                   f"{100 * same:>11.1f}% {max(r['max_logit_diff'] for r in rs):>13.2e}")
    return "\n".join(out)
