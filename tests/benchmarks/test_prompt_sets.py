from collections import Counter

from benchmarks.prompt_sets import CATEGORIES, N_DEV, SPLIT_ROLES, SPLITS, TUNING_SPLITS, all_prompts, prompt_set


def test_dev_and_test_are_fixed_disjoint_and_cover_every_category():
    dev, test = prompt_set("dev"), prompt_set("test")
    assert list(dev) == list(test) == list(CATEGORIES)
    for cat in CATEGORIES:
        assert len(dev[cat]) == N_DEV and len(test[cat]) >= 10
        texts = [str(p) for p in dev[cat]]
        assert not set(texts) & {str(p) for p in test[cat]}  # nothing tuned on dev is reported from test
        assert len(set(texts + [str(p) for p in test[cat]])) == len(all_prompts()[cat])
    assert prompt_set("test") == test  # fixed: the same split every time
    assert prompt_set("test", 2)["qa"] == test["qa"][:2]


def test_prompts_are_chat_messages_and_multi_turn_has_history():
    test = prompt_set("test")
    for cat, prompts in test.items():
        for msgs in prompts:
            assert msgs[-1]["role"] == "user" and msgs[-1]["content"].strip()
    assert all(len(m) == 3 and m[1]["role"] == "assistant" for m in test["multi-turn"])
    assert all("def " in m[0]["content"] for m in test["code"])
    assert all(len(m[0]["content"]) > 800 for m in test["summarisation"] + test["rag"])


def test_a_bad_split_is_a_one_line_error():
    import pytest

    from splitinfer.errors import SplitInferError

    with pytest.raises(SplitInferError, match="dev, test, test2"):
        prompt_set("train")


def _paragraph_heads(messages) -> list[str]:
    text = messages[-1]["content"].removeprefix("Passage:\n")
    return [p.strip()[:80] for p in text.split("\n\n")[:-1]]  # the last part is the instruction or question


def test_test2_shares_no_text_with_the_splits_that_were_tuned_on():
    sets = {s: prompt_set(s) for s in SPLITS}
    assert set(SPLIT_ROLES) == set(SPLITS) and "test2" not in TUNING_SPLITS
    assert list(sets["test2"]) == list(CATEGORIES)
    seen = {str(p) for s in TUNING_SPLITS for ps in sets[s].values() for p in ps}
    heads = Counter()
    for split, cats in sets.items():
        for cat, prompts in cats.items():
            if split == "test2":
                assert len(prompts) >= 10 and not {str(p) for p in prompts} & seen
                assert len({str(p) for p in prompts}) == len(prompts)
            if cat in ("summarisation", "rag"):
                heads.update(h for p in prompts for h in _paragraph_heads(p))
    assert heads and max(heads.values()) == 1  # no passage paragraph is in two prompts, across all splits
    t2 = sets["test2"]
    for i, m in enumerate(t2["multi-turn"]):  # the follow-up questions are new, and so are the conversations
        assert m[-1]["content"] not in {p[-1]["content"] for ps in (sets["dev"], sets["test"]) for p in ps["multi-turn"]}
        assert m[0] not in [p[0] for ps in (sets["dev"], sets["test"]) for p in ps["multi-turn"]]
    code = [m[0]["content"] for s in SPLITS for m in sets[s]["code"]]
    assert len(set(code)) == len(code)
