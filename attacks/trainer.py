"""Gradient-descent training loop shared by the learned attackers: progress, checkpoints, resume, seeds, DDP.

:func:`fit_module` trains a ``torch.nn.Module`` on ``n_items`` items (token
rows or sequences, addressed by index) with AdamW, one shuffled pass per
epoch (seeded per epoch, so a resumed run sees the same order), optional
validation with early stopping on the best validation score, and a checkpoint
after every epoch: ``<tag>-train.safetensors`` (module, best module and
optimizer tensors) + ``<tag>-train.json`` (epoch, history, optimizer groups,
a fingerprint of the run: data digest, boundary, model sha256 and every
hyper-parameter, see :func:`with_run`). A rerun with the same fingerprint
resumes after the last finished epoch; any other run starts over. Both files
are written atomically, the JSON last (it is removed first), so a crash leaves
either the previous epoch's checkpoint or none.

Distributed: when launched with several processes (``WORLD_SIZE > 1``, e.g.
``accelerate launch --multi_gpu --num_processes 2``; on a machine without
CUDA this starts torchrun workers that we run as MULTI_CPU with gloo -- plain
``--cpu`` would need mpirun) the loop uses
:class:`accelerate.Accelerator` to wrap the module in DDP and shard the index
loader; only the main process writes checkpoints. Single-process runs use a
plain loop (no accelerate state).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attacks.errors import AttackError
from splitinfer.atomic import atomic_file, write_json

log = logging.getLogger(__name__)

__all__ = ["TrainConfig", "digest", "fit_module", "get_accelerator", "with_run"]


@dataclass(frozen=True)
class TrainConfig:
    """Overrides and bookkeeping for a training run (``None`` keeps the recipe's default)."""

    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    checkpoint_dir: str | None = None  # where <tag>-train.{safetensors,json} go; None: no checkpoints
    resume: bool = True
    progress: bool = True
    patience: int | None = 2  # stop after this many epochs without a better validation score
    run_key: str | None = None  # what the run is (data hash, boundary, model sha256, hyper-parameters): with_run()


_ACCELERATOR: Any = None


def get_accelerator() -> Any:
    """The process-wide :class:`accelerate.Accelerator` when running distributed, else None."""
    global _ACCELERATOR
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if _ACCELERATOR is None:
        from accelerate import Accelerator

        _ACCELERATOR = Accelerator(cpu=not torch.cuda.is_available())  # MULTI_CPU with gloo on CPU machines
        log.info("distributed training: process %d of %d (%s)", _ACCELERATOR.process_index,
                 _ACCELERATOR.num_processes, _ACCELERATOR.distributed_type)
    return _ACCELERATOR


def _optim_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    sd = opt.state_dict()
    tensors = {}
    for pid, st in sd["state"].items():
        for name, v in st.items():
            tensors[f"optim.{pid}.{name}"] = torch.as_tensor(v).detach().cpu().clone()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, groups


def _restore_optim(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict[str, Any]]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, v in tensors.items():
        if key.startswith("optim."):
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = v
    opt.load_state_dict({"state": state, "param_groups": groups})


def digest(*arrays: Any) -> str:
    """sha256 over arrays (numpy, memmap or torch), their dtypes and shapes, read in chunks of rows."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for a in arrays:
        a = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        h.update(f"{a.dtype}|{a.shape}|".encode())
        flat = a.reshape(len(a), -1) if a.ndim else a.reshape(1, 1)
        step = max(1, (1 << 24) // max(1, flat[:1].nbytes))  # about 16 MB at a time
        for i in range(0, len(flat), step):
            h.update(np.ascontiguousarray(flat[i : i + step]).tobytes())
    return h.hexdigest()


def with_run(cfg: TrainConfig | None, **identity: Any) -> TrainConfig | None:
    """``cfg`` with ``run_key`` set from ``identity`` (data digest, boundary, model sha256, hyper-parameters).

    A checkpoint resumes only into the same run: change any of these and training starts over.
    """
    if cfg is None:
        return None
    return replace(cfg, run_key=json.dumps(identity, sort_keys=True, default=str))


def _fingerprint(module: nn.Module, n_items: int, settings: dict[str, Any], run_key: str | None) -> str:
    shapes = [list(p.shape) for p in module.parameters()]
    return json.dumps({"items": n_items, "shapes": shapes, "settings": settings, "run": run_key}, sort_keys=True)


def fit_module(
    module: nn.Module,
    n_items: int,
    loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    weight_decay: float = 0.0,
    seed: int = 0,
    val_fn: Callable[[nn.Module], float] | None = None,
    cfg: TrainConfig | None = None,
    tag: str = "attack",
) -> dict[str, Any]:
    """Train ``module`` in place; returns a report (epochs run, loss/val history, best epoch, seconds).

    ``loss_fn(module, idx)`` gets a (B,) int64 tensor of item indices and
    returns a scalar loss. ``val_fn(module)`` returns a score to maximise
    (e.g. validation top-1); the module ends with the weights of its best epoch.
    """
    from tqdm.auto import tqdm

    cfg = cfg or TrainConfig()
    epochs = int(cfg.epochs if cfg.epochs is not None else epochs)
    lr = float(cfg.lr if cfg.lr is not None else lr)
    batch_size = int(cfg.batch_size if cfg.batch_size is not None else batch_size)
    if epochs < 1 or lr <= 0 or batch_size < 1 or n_items < 1:
        raise AttackError(f"bad training setup: epochs={epochs}, lr={lr}, batch_size={batch_size}, items={n_items}; "
                          "epochs and batch size must be >= 1, lr > 0, and the training set non-empty")
    acc = get_accelerator()
    main = acc is None or acc.is_main_process
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay)
    ckpt = Path(cfg.checkpoint_dir) / f"{tag}-train" if cfg.checkpoint_dir else None
    settings = {"epochs": epochs, "lr": lr, "batch_size": batch_size, "seed": seed, "weight_decay": weight_decay,
                "patience": cfg.patience, "tag": tag, "validated": val_fn is not None}
    fp = _fingerprint(module, n_items, settings, cfg.run_key)
    history: list[dict[str, float]] = []
    start, best_score, best_epoch, best_state = 0, float("-inf"), -1, None
    if ckpt is not None and cfg.resume and ckpt.with_suffix(".json").is_file():
        start, history, best_score, best_epoch, best_state = _resume(ckpt, module, opt, fp)
    loader = torch.utils.data.DataLoader(torch.arange(n_items), batch_size=batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    model = module
    if acc is not None:
        model, opt, loader = acc.prepare(module, opt, loader)
    t0 = time.perf_counter()
    stale = 0 if best_epoch < 0 else max(0, len(history) - 1 - best_epoch)
    for epoch in range(start, epochs):
        if cfg.patience is not None and val_fn is not None and stale >= cfg.patience:
            log.info("%s: early stop after epoch %d (no better validation score for %d epochs)", tag, epoch, stale)
            break
        torch.manual_seed(seed * 1009 + epoch)
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        elif isinstance(loader.generator, torch.Generator):
            loader.generator.manual_seed(seed * 1009 + epoch)
        model.train()
        total, count = 0.0, 0
        bar = tqdm(loader, desc=f"{tag} epoch {epoch + 1}/{epochs}", leave=False,
                   disable=True if not (cfg.progress and main) else None)  # None: off when not a terminal
        for idx in bar:
            loss = loss_fn(model, idx)
            opt.zero_grad(set_to_none=True)
            if acc is not None:
                acc.backward(loss)
            else:
                loss.backward()
            opt.step()
            total, count = total + float(loss.detach()), count + 1
            bar.set_postfix(loss=f"{total / count:.3f}")
        bar.close()
        entry = {"epoch": epoch + 1, "loss": total / max(count, 1)}
        module.eval()
        if val_fn is not None:
            with torch.no_grad():
                entry["val"] = float(val_fn(module))
            if entry["val"] > best_score:
                best_score, best_epoch, stale = entry["val"], epoch, 0
                best_state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            else:
                stale += 1
        history.append(entry)
        log.info("%s epoch %d: %s", tag, epoch + 1, entry)
        if ckpt is not None and main:
            _save(ckpt, module, opt, best_state, fp, epoch + 1, history, best_score, best_epoch)
        if acc is not None:
            acc.wait_for_everyone()
    if best_state is not None:
        module.load_state_dict(best_state)
    module.eval()
    return {"epochs_run": len(history), "history": history, "best_epoch": best_epoch + 1 if best_epoch >= 0 else None,
            "best_val": best_score if best_epoch >= 0 else None, "train_seconds": round(time.perf_counter() - t0, 3),
            "processes": 1 if acc is None else acc.num_processes, "epochs": epochs, "lr": lr, "batch_size": batch_size}


def _save(ckpt: Path, module: nn.Module, opt: torch.optim.Optimizer, best_state: dict | None, fp: str, epoch: int,
          history: list, best_score: float, best_epoch: int) -> None:
    from safetensors.torch import save_file

    ckpt.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    if best_state is not None:
        tensors.update({f"best.{k}": v.detach().cpu().contiguous() for k, v in best_state.items()})
    opt_tensors, groups = _optim_tensors(opt)
    tensors.update(opt_tensors)
    ckpt.with_suffix(".json").unlink(missing_ok=True)  # from here until the new json lands, nothing resumes
    with atomic_file(ckpt.with_suffix(".safetensors")) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "splitinfer-train-checkpoint", "epoch": str(epoch)})
    meta = {"fingerprint": fp, "epoch": epoch, "history": history, "best_score": best_score,
            "best_epoch": best_epoch, "param_groups": groups}
    write_json(ckpt.with_suffix(".json"), meta)  # last: marks the checkpoint complete


def _resume(ckpt: Path, module: nn.Module, opt: torch.optim.Optimizer, fp: str):
    from safetensors.torch import load_file

    try:
        meta = json.loads(ckpt.with_suffix(".json").read_text(encoding="utf-8"))
        tensors = load_file(str(ckpt.with_suffix(".safetensors")))
    except Exception as e:  # unreadable: start over rather than fail the run
        log.warning("cannot resume from %s (%s); training from scratch", ckpt, e)
        return 0, [], float("-inf"), -1, None
    if meta.get("fingerprint") != fp:
        log.warning("checkpoint %s belongs to a different run (data, model size or settings changed); training "
                    "from scratch", ckpt)
        return 0, [], float("-inf"), -1, None
    module.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    _restore_optim(opt, tensors, meta["param_groups"])
    best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")} or None
    log.info("resuming %s after epoch %d", ckpt, meta["epoch"])
    return int(meta["epoch"]), list(meta["history"]), float(meta["best_score"]), int(meta["best_epoch"]), best
