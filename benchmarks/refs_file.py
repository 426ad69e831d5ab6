"""The decoding references file (``bench decoding --refs-out``, ``decoding_tune --refs``) without pickle.

The references are greedy outputs and each prompt's top-k rows (``ids``,
``probs`` tensors), read back by :mod:`benchmarks.decoding_tune` to replay
drafting offline. They were a ``torch.save`` pickle loaded with
pickle loading switched on (``weights_only`` off), so a crafted file ran code (issue 30, finding 8).
Now: one safetensors file, the top-k tensors as ``refs.<i>.topk_ids`` /
``refs.<i>.topk_probs`` and everything else as JSON in the file's metadata.
Loading parses JSON and tensors only.
"""

from __future__ import annotations

import json
from pathlib import Path

from splitinfer.atomic import atomic_file
from splitinfer.errors import SplitInferError

_META = "splitinfer_refs"


def save_refs(data: dict, path: str | Path) -> None:
    """Write ``data`` (``{"refs": [{"topk": (ids, probs), ...}, ...], ...}``) to ``path``, atomically."""
    from safetensors.torch import save_file

    tensors, refs = {}, []
    for i, ref in enumerate(data["refs"]):
        ids, probs = ref["topk"]
        tensors[f"refs.{i}.topk_ids"], tensors[f"refs.{i}.topk_probs"] = ids.contiguous(), probs.contiguous()
        refs.append({k: v for k, v in ref.items() if k != "topk"})
    meta = json.dumps({**{k: v for k, v in data.items() if k != "refs"}, "refs": refs})
    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp), metadata={_META: meta})


def load_refs(path: str | Path) -> dict:
    """Read a file written by :func:`save_refs`; a one-line error for anything else (a pickle included)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get(_META)
            if meta is None:
                raise SplitInferError(f"{path} is not a references file of `bench decoding --refs-out` "
                                      "(no references in its metadata); rebuild it")
            data = json.loads(meta)
            for i, ref in enumerate(data["refs"]):
                ref["topk"] = (f.get_tensor(f"refs.{i}.topk_ids"), f.get_tensor(f"refs.{i}.topk_probs"))
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise SplitInferError(f"cannot read references file {path}: {str(e)[:200]} (write it with "
                              "`splitinfer bench decoding --refs-out PATH`; pickles are not read)") from None
    return data
