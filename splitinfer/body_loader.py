"""Loading the cloud body for ``splitinfer serve``: the body layers alone, their :class:`BodyInfo`, the service.

- :func:`load_body` builds the body from ``config.json`` and the body layers'
  safetensors (:meth:`CloudBody.from_weights`); the process never holds the
  embedding matrix or the LM head. A corrupt checkpoint gives one line naming
  it and the fix.
- :func:`place_auto` (``--device-map auto``) spreads the body layers over all
  visible GPUs with accelerate; untested on a CPU-only machine, kept small.
- :func:`body_inventory` lists what the process holds (the ``stats`` reply).
- :func:`make_service` wraps the body in a :class:`BodyService` with the CLI's limits and batching.
"""

from __future__ import annotations

import logging

import torch

from splitinfer import batch_invariant as bi
from splitinfer.batch_scheduler import BatchConfig
from splitinfer.body_info import BodyInfo
from splitinfer.body_weights import weights_dir
from splitinfer.errors import SplitInferError
from splitinfer.models import DTYPES
from splitinfer.partition import CloudBody, SplitConfig
from splitinfer.server_config import check_device
from splitinfer.session import BodyService, ServiceLimits

log = logging.getLogger(__name__)


def place_auto(body: CloudBody) -> CloudBody:
    """Spread the body's decoder layers over all visible GPUs (accelerate's big-model placement).

    Whole decoder layers stay on one device; accelerate's hooks move
    activations (and the mask and rotary tables) between devices, and each
    layer's KV cache lives on its layer's device. Untested without GPUs.
    """
    if not torch.cuda.is_available():
        raise SplitInferError("--device-map auto needs CUDA GPUs, and none is visible; use --device cpu")
    from accelerate import dispatch_model, infer_auto_device_map

    no_split = sorted({type(layer).__name__ for layer in body.layers})
    device_map = infer_auto_device_map(body, no_split_module_classes=no_split)
    if any(d in ("cpu", "disk") for d in device_map.values()):
        log.warning("the body does not fit on the GPUs; some layers are offloaded: %s", device_map)
    log.info("device map: %s", device_map)
    return dispatch_model(body, device_map=device_map)


def load_body(spec: str, split: SplitConfig, dtype: str = "fp32", device: str = "cpu",
              device_map: str | None = None, seed: int = 0, batch_invariant: bool = False
              ) -> tuple[CloudBody, BodyInfo]:
    """The body layers of ``spec`` (and nothing else) plus the info it announces at hello.

    ``batch_invariant``: run them with :mod:`splitinfer.batch_invariant`'s kernels.
    """
    if dtype not in DTYPES:
        raise SplitInferError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if device_map not in (None, "auto"):
        raise SplitInferError(f"unknown --device-map {device_map!r}; the only map is 'auto'")
    if device_map is None:
        check_device(device)
    weights = weights_dir(spec, seed)
    try:
        body = CloudBody.from_weights(weights, split, DTYPES[dtype], "cpu" if device_map else device)
    except SplitInferError:
        raise
    except Exception as e:  # safetensors / JSON / OS errors of a damaged checkpoint
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        raise SplitInferError(f"cannot read the model checkpoint in {weights} ({type(e).__name__}: {first}); if it "
                              f"is a cache, delete that directory and rerun to rebuild it") from None
    num_layers = body.config.num_hidden_layers
    if device_map == "auto":
        body = place_auto(body)
    if batch_invariant:
        bi.enable(body)  # after placement: the padding is probed on the devices that will run it
    return body, BodyInfo.of_body(spec, split, body, num_layers)


def body_inventory(body: torch.nn.Module) -> dict:
    """What the process holds: module names, parameter count, whether any embedding / LM head is loaded."""
    names = sorted({name.split(".")[0] if not name.startswith("layers.") else ".".join(name.split(".")[:2])
                    for name, _ in body.named_modules() if name and name != "layers"})
    return {
        "loaded_modules": names,
        "param_count": sum(p.numel() for p in body.parameters()),
        "has_embedding": any(isinstance(m, torch.nn.Embedding) for m in body.modules()),
        "has_lm_head": any(n.split(".")[-1] in ("lm_head", "embed_tokens") for n, _ in body.named_modules()),
    }


def make_service(body: CloudBody, info: BodyInfo, max_sessions: int = 64, max_context: int = 4096,
                 idle_timeout_s: float = 300.0, max_frame_bytes: int = 64 * 2**20,
                 max_sessions_per_connection: int = 8, stats_all: bool = False,
                 batch: BatchConfig = BatchConfig(max_batch=1)) -> BodyService:
    """A BodyService with the CLI's limits and batching (validated)."""
    from splitinfer.protocol import Limits

    if max_sessions < 1 or max_context < 1 or idle_timeout_s <= 0 or max_frame_bytes < 1024:
        raise SplitInferError("need --max-sessions >= 1, --max-context >= 1, --idle-timeout-s > 0, "
                              "--max-frame-mb >= 0.001")
    if max_sessions_per_connection < 1:
        raise SplitInferError("--max-sessions-per-connection must be >= 1")
    limits = ServiceLimits(max_sessions, max_context, idle_timeout_s, Limits(max_frame_bytes=max_frame_bytes),
                           max_sessions_per_owner=max_sessions_per_connection, stats_all=stats_all)
    batch.validate()
    return BodyService(body, info, limits, batch=batch)
