"""Devices a test runs on: the CPU always, CUDA where the machine has it (the defenses stage's GPU path)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


def on_device(loaded, device: str):
    """``loaded`` itself on the CPU, else a copy of it whose model lives on ``device`` (same sha256)."""
    if device == "cpu":
        return loaded
    return dataclasses.replace(loaded, model=copy.deepcopy(loaded.model).to(device))
