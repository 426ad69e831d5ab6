"""Shards of a suite run: ``splitinfer bench run --shard I/N`` runs every N-th job of the grid stages.

A *job* is one grid cell of a shardable stage, numbered in the stage's own run
order from 0:

- ``attacks``: one (attacker, boundary) pair of :func:`benchmarks.attack_grid.plan`
  (fitted and scored on every corpus);
- ``defenses``: one (head depth, defense spec) configuration of the grid.

Shard ``I`` of ``N`` runs the jobs whose number ``j`` has ``j % N == I``. What is
not a grid cell runs in shard 0 only: the stages that are not shardable
(``exactness``, ``speed``, ``rtt_model``, ``ngram_ablation``), the depth
identifiers of ``attacks`` (trained on every boundary at once), the
``random-split`` rows and the per-step overhead timings of ``defenses``. Every
shard extracts the taps its stage needs (the same teacher-forced taps, so the
jobs see the same data as in one run). Jobs seed themselves, so a job's
numbers do not depend on which jobs ran before it in its process: the shards
merged by :mod:`benchmarks.merge` give the metrics of one run (tested).

The shard is recorded in the results document as ``shard = {"index": I,
"count": N}`` (schema minor 2) and read back from there by the stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitinfer.errors import SplitInferError


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (``0/1``: the whole run)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"`` with ``0 <= I < N``; a one-line error naming the fix otherwise."""
        head, sep, tail = text.partition("/")
        try:
            index, count = int(head), int(tail)
        except ValueError:
            index, count = -1, 0
        if not sep or count < 1 or not 0 <= index < count:
            raise SplitInferError(f"--shard {text!r}: give I/N with 0 <= I < N, e.g. --shard 0/4")
        return cls(index, count)

    @classmethod
    def of(cls, results: dict) -> Shard:
        """The shard a results document is being written for (the whole run when it names none)."""
        s = results.get("shard") or {}
        return cls(int(s.get("index", 0)), int(s.get("count", 1)))

    @property
    def whole(self) -> bool:
        return self.count == 1

    @property
    def first(self) -> bool:
        """Shard 0 runs what is not a grid cell."""
        return self.index == 0

    def mine(self, job: int) -> bool:
        """Whether job number ``job`` (0-based, in the stage's run order) belongs to this shard."""
        return job % self.count == self.index

    def record(self) -> dict:
        return {"index": self.index, "count": self.count}

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"
