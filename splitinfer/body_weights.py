"""Where the server's body weights come from, without ever loading the full model in the server process.

:func:`weights_dir` resolves a model spec to a directory of ``config.json`` +
safetensors. A cached spec is used as it is; one that must first be built (a
GGUF file to dequantise, or ``tiny-random`` to write) is built once by a child
process, ``python -m splitinfer.body_weights SPEC SEED``, which calls the public
:func:`splitinfer.models.prepare_weights` (the conversion loads the whole model;
the server then maps only its body layers). A Hugging Face id is fetched as
config + safetensors only.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

from splitinfer import models
from splitinfer.errors import SplitInferError

log = logging.getLogger(__name__)


def weights_dir(spec: str, seed: int = 0) -> Path:
    """Resolve ``spec`` to a safetensors directory; build a GGUF / tiny-random cache in a child process first."""
    try:
        weights = models.resolve_weights_dir(spec, seed=seed, prepare=False)
    except models.NeedsPreparation:
        log.warning("preparing %s once in a child process (this process loads only the body)", spec)
        r = subprocess.run([sys.executable, "-m", "splitinfer.body_weights", spec, str(seed)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise SplitInferError(f"preparing model {spec!r} failed: {tail}") from None
        weights = models.resolve_weights_dir(spec, seed=seed, prepare=False)
    if weights is not None:
        return weights
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise SplitInferError(f"unknown model spec {spec!r}: use default, gemma3-270m, tiny-random, a model "
                              "directory, a .gguf file or a Hugging Face id like 'org/name'")
    from huggingface_hub import snapshot_download

    try:  # config and safetensors only: the body reads its own layers' tensors from them
        patterns = ["config.json", "*.safetensors", "*.safetensors.index.json"]
        return Path(snapshot_download(spec, allow_patterns=patterns))
    except Exception as e:  # network, auth, missing repo
        raise SplitInferError(f"could not fetch {spec!r} from the Hugging Face hub: {e}".splitlines()[0]) from None


def main(argv: list[str] | None = None) -> int:
    """``python -m splitinfer.body_weights SPEC [SEED]``: build the weights cache of SPEC; print its directory."""
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print("usage: python -m splitinfer.body_weights SPEC [SEED]", file=sys.stderr)
        return 2
    try:
        out = models.prepare_weights(argv[0], int(argv[1]) if len(argv) > 1 else 0)
    except (SplitInferError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out if out is not None else f"{argv[0]}: nothing to prepare (not a cached spec)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
