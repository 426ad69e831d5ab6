"""Fixtures of the decoding tests: a feature-draft head trained on the tiny model (a few seconds)."""

import pytest


@pytest.fixture(scope="session")
def feature_head_dir(tiny, tmp_path_factory):
    """A feature-draft head for the tiny model: short prompts, a few greedy tokens, a few steps."""
    from splitinfer.decoding.feature_head import save_head
    from splitinfer.decoding.feature_train import draft_train

    head, meta = draft_train(tiny, tokens=48, steps=6, batch=16, max_new=12, hidden=32, prompt_chars=40,
                             progress=False)
    out = tmp_path_factory.mktemp("feature-head")
    save_head(head, out, meta)
    return out
