"""The metadata side channel, measured: what the cloud tells apart from frames alone.

Developer note: issue 13 stretch.

Two session properties a user may want hidden, each as a balanced binary task
of chat-form prompts:

- ``code-vs-chat``: HumanEval problems (:func:`benchmarks.prompts.humaneval_prompts`)
  against user turns of the ``chat`` corpus's test split (chatterbot);
- ``copy-vs-summarise``: the same prose paragraph (``prose`` test split,
  State of the Union addresses) asked to be repeated word for word or
  summarised in one sentence. Both prompts of a paragraph share a fold, so
  only the instruction differs between the classes.

Every session runs through the real split runtime (:class:`~splitinfer.client.SplitModel`,
in-process body) with speculative decoding; the cloud's side records each
forward frame it receives (positions; its bytes) and
:mod:`attacks.side_channel` scores a classifier per feature set. The
``lengths`` set is what a sequential client reveals too (its outputs are the
same tokens); ``speculation`` is what the drafts add.

``python -m benchmarks.side_channel --out reports/side_channel`` writes
``results.json`` (versioned schema, ``bench-side-channel``) and ``report.md``.
Wire defenses (noise, quant) are not varied here: they change no position or
tree size (quant shrinks every frame by the same factor); a metadata defense
(fixed tree sizes, padded prompts) is not implemented.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from tqdm import tqdm

from attacks.side_channel import FEATURE_SETS, cross_validated, session_features
from benchmarks.bench_output import document, write_dir
from benchmarks.prompts import humaneval_prompts
from benchmarks.schema import add_metric, metric
from splitinfer.client import SplitModel
from splitinfer.protocol import decode_frame

log = logging.getLogger(__name__)

TASKS = ("code-vs-chat", "copy-vs-summarise")
CLASSES = {"code-vs-chat": ("chat", "code"), "copy-vs-summarise": ("summarise", "copy")}
FIXED_COSTS = {"step_ms": 60.0, "token_ms": 1.0}  # the quick suite's: tree sizes independent of timing noise


def _user_turn(doc: dict) -> str:
    """The first user turn of a chat document (between the first two template spans)."""
    spans = sorted(doc["template_spans"], key=lambda s: s["start"])
    return doc["text"][spans[0]["end"]: spans[1]["start"]].strip() if len(spans) > 1 else doc["text"]


def _paragraphs(n: int, seed: int, lo: int = 250, hi: int = 600) -> list[str]:
    from splitinfer.corpora.loading import load_corpus

    out: list[str] = []
    for doc in load_corpus("prose", "test", seed=seed):
        out += [p.strip() for p in doc["text"].split("\n\n") if lo <= len(p.strip()) <= hi]
    if len(out) < n:
        raise ValueError(f"the prose test split has {len(out)} paragraphs of {lo}-{hi} characters; ask for <= that")
    rng = np.random.default_rng(seed)
    return [out[i] for i in sorted(rng.choice(len(out), n, replace=False))]


def task_sessions(task: str, n: int, seed: int = 0) -> list[tuple[str, int, str]]:
    """``n`` prompts per class of ``task``: (prompt, label 0/1, group)."""
    if task == "code-vs-chat":
        from splitinfer.corpora.loading import load_corpus

        turns = list(dict.fromkeys(_user_turn(d) for d in load_corpus("chat", "test", seed=seed)))
        rng = np.random.default_rng(seed)
        chat = [turns[i] for i in sorted(rng.choice(len(turns), n, replace=False))]
        return [(p, 1, f"code{i}") for i, p in enumerate(humaneval_prompts(n))] + \
               [(p, 0, f"chat{i}") for i, p in enumerate(chat)]
    if task == "copy-vs-summarise":
        paras = _paragraphs(n, seed)
        return [(f"Repeat the following paragraph word for word.\n\n{p}", 1, f"p{i}") for i, p in enumerate(paras)] + \
               [(f"Summarise the following paragraph in one sentence.\n\n{p}", 0, f"p{i}") for i, p in enumerate(paras)]
    raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")


class CloudView:
    """Wraps an in-process body service: keeps the op, fields and size of every frame the cloud receives."""

    def __init__(self, service):
        self.frames: list[dict] = []
        handle = service.handle

        def recording(data: bytes, *args):
            f = decode_frame(data)
            self.frames.append({"op": f.op, "positions": list(f.fields.get("positions") or []), "bytes": len(data)})
            return handle(data, *args)

        service.handle = recording

    def take(self) -> list[dict]:
        """The forward frames since the last call (one session), in order."""
        out, self.frames = [f for f in self.frames if f["op"] == "forward"], []
        return out


def run_task(loaded, task: str, n: int, tokens: int, decoding: str, split: str, seed: int) -> dict:
    """Generate every session of ``task`` with ``decoding``; features per session and the classifiers' scores."""
    sm = SplitModel(loaded, split)
    view = CloudView(sm.link.service)
    sessions = task_sessions(task, n, seed)
    feats, labels, groups, taus = [], [], [], {0: [], 1: []}
    opts = FIXED_COSTS if decoding == "combined" else {}
    for prompt, label, group in tqdm(sessions, desc=task, unit="session"):
        view.take()
        res = sm.generate(prompt, tokens, chat=True, decoding=decoding, decoding_options=opts)
        feats.append(session_features(view.take()))
        labels.append(label)
        groups.append(group)
        taus[label].append(len(res.token_ids) / max(1, len(res.steps)))
    scores = [cross_validated(feats, labels, groups, fs, seed=seed) for fs in FEATURE_SETS]
    means = {CLASSES[task][c]: {k: float(np.mean([f[k] for f, y in zip(feats, labels) if y == c]))
                                for k in ("prompt_positions", "generated_positions", "advance_mean",
                                          "multi_token_share", "tree_mean")} for c in (0, 1)}
    return {"task": task, "decoding": decoding, "classes": list(CLASSES[task]), "sessions": len(sessions),
            "scores": scores, "class_means": means, "features": feats, "labels": labels, "groups": groups}


def _ci(lo, hi) -> str:
    return "n/a" if lo is None else f"[{100 * lo:.1f}, {100 * hi:.1f}]"


def report(data: dict) -> str:
    lines = ["# The metadata side channel: what frame sizes and timing alone reveal", "",
             f"Model `{data['model']}`, split {data['split']}, `{data['decoding']}` decoding "
             f"({data['tokens']} new tokens per session, chat form), {data['per_class']} sessions per class; "
             f"commit {data['git']}. Classifier: logistic regression, {data['folds']}-fold cross-validation over "
             "sessions (a paragraph's two prompts share a fold); 95% intervals by bootstrap over paragraphs (a "
             "paragraph's two prompts are one unit; each other session its own). Threat model: "
             f"{data['tasks'][0]['scores'][0]['threat_model']}. Baseline: the majority class under the same folds.",
             "", "| task | features | accuracy | 95% CI | majority baseline | sessions |", "|---|---|---|---|---|---|"]
    for t in data["tasks"]:
        for s in t["scores"]:
            lines.append(f"| {t['task']} | {s['feature_set']} | {100 * s['accuracy']:.1f}% | "
                         f"{_ci(s['ci_low'], s['ci_high'])} | {100 * s['majority']:.1f}% | {s['n']} |")
    lines += ["", "`lengths`: prompt positions and generated length (a sequential client shows these too). "
              "`speculation`: tokens committed per round trip (mean, spread, max, share of steps with >= 2) and "
              "tree sizes, without any length. `all`: both and the number of round trips.", "",
              "Per-class means of what the cloud sees:", "",
              "| task | class | prompt positions | generated | tokens per round trip | steps with >= 2 | tree size |",
              "|---|---|---|---|---|---|---|"]
    for t in data["tasks"]:
        for cls, m in t["class_means"].items():
            lines.append(f"| {t['task']} | {cls} | {m['prompt_positions']:.1f} | {m['generated_positions']:.1f} | "
                         f"{m['advance_mean']:.2f} | {100 * m['multi_token_share']:.1f}% | {m['tree_mean']:.1f} |")
    lines += ["", f"Wall time {data['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


def to_document(data: dict) -> dict:
    config = {k: v for k, v in data.items() if isinstance(v, (str, int, float, bool)) or v is None}
    doc = document("side-channel", config, data)
    for t in data["tasks"]:
        for s in t["scores"]:
            add_metric(doc, f"side_channel/{t['task']}/{t['decoding']}/{s['feature_set']}", "accuracy",
                       metric(s["accuracy"], s["ci_low"], s["ci_high"], s["n"], higher_is_better=False,
                              kind="accuracy"))
    return doc


def main(argv: list[str] | None = None) -> int:
    from benchmarks.checkout import git_state
    from splitinfer.models import load_model

    p = argparse.ArgumentParser(prog="python -m benchmarks.side_channel", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--split", default="2,2")
    p.add_argument("--per-class", type=int, default=24, help="sessions per class and task (default 24)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per session (default 64)")
    p.add_argument("--decoding", default="combined", help="speculative decoding to observe (default combined)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory for results.json and report.md")
    args = p.parse_args(argv)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in TASKS]
    if bad or args.per_class < 3:
        p.error(f"unknown task {bad[0]!r}; choose from {', '.join(TASKS)}" if bad else "--per-class must be >= 3")
    git, dirty = git_state()
    t0 = time.perf_counter()
    loaded = load_model(args.model)
    rows = [run_task(loaded, t, args.per_class, args.tokens, args.decoding, args.split, args.seed) for t in tasks]
    data = {"model": loaded.spec, "model_sha256": loaded.sha256, "split": args.split, "decoding": args.decoding,
            "tokens": args.tokens, "per_class": args.per_class, "seed": args.seed, "folds": 5,
            "git": f"{git}{' (dirty)' if dirty else ''}", "wall_s": time.perf_counter() - t0, "tasks": rows}
    return write_dir(args.out, report(data), to_document(data))


if __name__ == "__main__":
    raise SystemExit(main())
