"""What a cloud body announces at hello, and what a client checks against it: one frozen :class:`BodyInfo`.

Built by :meth:`BodyInfo.of_body` on both sides (the client over its own copy of
the body layers, the server over the layers it loaded), so the two agree by
construction. :data:`BodyInfo.CHECKED` lists the fields a hello may pin.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from splitinfer.errors import ProtocolError


@dataclass(frozen=True)
class BodyInfo:
    model: str  # the model spec the body was loaded from
    body_sha256: str  # over the body layers' tensors (models.weights_sha256)
    hidden_size: int
    split: str  # "A,B"
    num_layers: int  # of the whole model
    batch_invariant: bool = False  # runs splitinfer.batch_invariant's kernels

    CHECKED: ClassVar[tuple[str, ...]] = ("body_sha256", "hidden_size", "split", "batch_invariant")
    _HINTS: ClassVar[dict[str, str]] = {"hidden_size": "",
                                        "batch_invariant": " (start the server with --batch-invariant)"}

    @classmethod
    def of_body(cls, model_spec: str, split, body, num_layers: int) -> BodyInfo:
        """The info of ``body`` (a CloudBody) loaded from ``model_spec`` with ``split``."""
        from splitinfer import batch_invariant
        from splitinfer.models import weights_sha256

        return cls(model=model_spec, body_sha256=weights_sha256(body), hidden_size=int(body.config.hidden_size),
                   split=str(split), num_layers=int(num_layers), batch_invariant=batch_invariant.is_enabled(body))

    def as_dict(self) -> dict:
        return asdict(self)

    def public(self) -> dict:
        """The fields sent to clients: a model given as a local path is reduced to its last component."""
        d = self.as_dict()
        p = Path(self.model).expanduser()
        if self.model.startswith(("/", "~", ".")) or p.suffix == ".gguf" or p.exists():
            d["model"] = p.name
        return d

    def expectation(self) -> dict:
        """What a client pins in its hello: the checked fields (batch_invariant only when it is on)."""
        want = {k: getattr(self, k) for k in self.CHECKED if k != "batch_invariant"}
        if self.batch_invariant:
            want["batch_invariant"] = True
        return want

    def check(self, wanted: dict) -> None:
        """Raise ProtocolError naming the first field of ``wanted`` (a hello) that this body does not match."""
        for key in self.CHECKED:
            want = wanted.get(key)
            if want is not None and want != getattr(self, key):
                from splitinfer.protocol import short

                hint = self._HINTS.get(key, " (start the server with the same --model, --split and --dtype)")
                raise ProtocolError(f"{key} mismatch: client expects {short(want)}, this server has "
                                    f"{getattr(self, key)!r}{hint}")
