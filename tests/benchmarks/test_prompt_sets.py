from benchmarks.prompt_sets import CATEGORIES, N_DEV, all_prompts, prompt_set


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

    with pytest.raises(SplitInferError, match="dev, test"):
        prompt_set("train")
