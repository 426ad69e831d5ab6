"""A composed defense (``lora-random+noise+quant``): what each side does with it.

The local side calls :meth:`DefensePipeline.transform_up` on the head's
states (:meth:`~splitinfer.client.SplitModel.forward_step`, so the replay log
keeps the released values), :meth:`encode_up` where the bytes leave
(:class:`~splitinfer.remote.RemoteBody`) and :meth:`decode_down` on the reply; the cloud
(:class:`~splitinfer.session.BodyService`)
calls :meth:`decode_up` and :meth:`encode_down`. Value transforms (noise) run
first, in spec order, then the one codec (quant), if any, turns the states into
the frame's tensors. With no wire defense every method is the identity on the
``hidden`` tensor, so the undefended frames are byte-identical to an undefended
build. :meth:`simulate_up` computes what the cloud receives without a link (the
attack harness extracts defended taps with it). Model defenses (lora-random)
change the local layers: :meth:`apply_head`. ``permute`` also changes the
body's weights (:meth:`apply_body`, in-process only) and the client turns the
reply back (:meth:`restore_down`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from splitinfer.defenses.base import Defense, DefenseError, format_items, parse_items
from splitinfer.defenses.keyed import path_digests
from splitinfer.errors import ComponentError


def check_released(defense: Defense, x: torch.Tensor, y: object) -> None:
    """ComponentError (one line naming the defense, its module and the fix) unless ``y`` is a tensor of ``x``'s
    shape (T, d) without NaN or inf: a defense's wrong output never reaches the wire or a result."""
    who = f"defense {defense.name!r} ({type(defense).__module__})"
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
        got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ComponentError(f"{who}: apply returned {got} for states of shape {tuple(x.shape)}; return a (T, d) "
                             "tensor shaped like its input")
    if not bool(torch.isfinite(y).all()):
        raise ComponentError(f"{who}: apply returned NaN or inf values; return finite states (clip or rescale them)")


def exact_rows(delta: torch.Tensor, first_position: int) -> int:
    """How many leading rows of a step's (T, d) perturbation were released untouched with nothing perturbed
    before them (a step starting the sequence at position 0): the body's output there is exact."""
    if first_position != 0:
        return 0
    touched = (delta != 0).any(-1).tolist()  # (T,)
    return touched.index(True) if True in touched else len(touched)


class DefensePipeline:
    """An ordered list of defense configs, at most one of which is a wire codec."""

    def __init__(self, items: Sequence[Defense] = ()):
        self.items = tuple(items)
        codecs = [d for d in self.items if hasattr(d, "encode")]
        if len(codecs) > 1:
            raise DefenseError(f"{self.label}: at most one wire codec (quant) can be composed")
        self.codec = codecs[0] if codecs else None
        self.transforms = [d for d in self.items if d.kind == "wire" and not hasattr(d, "encode")]
        self.model_items = [d for d in self.items if d.kind == "model"]
        self.denoisers = [d for d in self.transforms if hasattr(d, "denoise")]
        if self.denoisers and len(self.transforms) == len(self.denoisers):
            raise DefenseError(f"{self.label}: a denoiser removes the effect of noise the head adds; compose it "
                               "with one, e.g. noise(sigma=0.05)+denoise(profile=KEY)")
        self._perturbation: torch.Tensor | None = None
        self._exact = 0  # leading rows of the last step released untouched at the sequence start

    @classmethod
    def parse(cls, spec: str | None = "none", options: Iterable[str] | dict = ()) -> DefensePipeline:
        return cls(parse_items(spec or "none", options))

    @property
    def label(self) -> str:
        """Canonical label, e.g. ``noise(sigma=0.05,clip=8.0,...)+quant(format=int8,...)``; ``none``."""
        return format_items(self.items)

    @property
    def public_label(self) -> str:
        """What the hello carries: the public part of what the cloud must run (``none`` if nothing)."""
        return format_items([d for d in self.items if d.cloud_must_know], public=True)

    @property
    def shareable_label(self) -> str:
        """Every defense with its secret fields (seeds, adapter paths) left out: what a run's summary records."""
        return format_items(self.items, public=True)

    @property
    def is_none(self) -> bool:
        return not self.items

    def get(self, name: str) -> Defense | None:
        return next((d for d in self.items if d.name == name), None)

    def describe(self) -> list[str]:
        return [d.describe() for d in self.items]

    def record(self) -> dict:
        """The results-file entry: label, per-defense parameters and strength, guarantees."""
        return {"label": self.label, "items": [
            {"name": d.name, "params": d.params(), "strength": d.strength_value(), "describe": d.describe()}
            for d in self.items]}

    # ---------------------------------------------------------------- values
    def _transform(self, x: torch.Tensor, positions: Sequence[int], session: int, direction: str,
                   content: Sequence[int] | None = None,
                   public: Sequence[bool] | None = None) -> torch.Tensor:  # (1, T, d) -> (1, T, d)
        for d in self.transforms:
            extra = {"public": public} if getattr(d, "uses_public", False) else {}
            y = d.apply(x[0], positions, session, direction, content, **extra)
            check_released(d, x[0], y)
            x = y[None]
        return x

    def transform_up(self, hidden: torch.Tensor, positions: Sequence[int], session: int,
                     content: Sequence[int] | None = None, public: Sequence[bool] | None = None) -> torch.Tensor:
        """Client: (1, T, d) head states -> (1, T, d) released values (noise keyed by ``content`` digests).

        ``public`` (T,) marks the positions the cloud knows without user text (an added BOS, chat-template
        tokens: ``splitinfer.tokens``' mask); defenses that declare ``uses_public`` release the leading run of
        them (the public opening, before any user token) untouched.
        A local denoiser (``denoise``) gets the perturbation released - head states at :meth:`restore_down`.
        """
        if not self.transforms:
            return hidden
        out = self._transform(hidden, positions, session, "up", content, public)
        if self.denoisers:
            self._perturbation = out.float() - hidden.float()  # (1, T, d), local only
            self._exact = exact_rows(self._perturbation[0], positions[0] if len(positions) else 0)
        return out

    def encode_up(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Client: (1, T, d) released values on the wire dtype -> the forward frame's tensors."""
        return self.codec.encode(x) if self.codec else {"hidden": x}

    def decode_up(self, tensors: dict[str, torch.Tensor], d: int) -> torch.Tensor | None:
        """Cloud: the forward frame's tensors -> (1, T, d) states the body runs on (None if absent)."""
        if self.codec is None:
            return tensors.get("hidden")
        return self.codec.decode(tensors, d)

    def encode_down(self, out: torch.Tensor, positions: Sequence[int], session: int) -> dict[str, torch.Tensor]:
        """Cloud: (1, T, d) body output -> the result frame's tensors (reply noise uses the cloud's seed)."""
        if self.is_none:
            return {"hidden": out}
        x = self._transform(out, positions, session, "down")
        if self.codec is not None and self.codec.replies:
            return self.codec.encode(x)
        return {"hidden": x}

    def decode_down(self, tensors: dict[str, torch.Tensor], d: int) -> torch.Tensor | None:
        """Client: the result frame's tensors -> (1, T, d) body output as the tail sees it."""
        if self.codec is not None and self.codec.replies:
            return self.codec.decode(tensors, d)  # ProtocolError on a malformed reply
        return tensors.get("hidden")

    def restore_down(self, back: torch.Tensor) -> torch.Tensor:
        """Client: (1, T, d) body output as received -> (1, T, d) in the tail's basis (permute's ``y Q^T``), then
        the local denoisers' estimate of the undefended body output (from the last :meth:`transform_up`)."""
        for d in reversed(self.transforms):
            if hasattr(d, "restore"):
                back = d.restore(back)
        for d in self.denoisers:
            if self._perturbation is None or self._perturbation.shape != back.shape:
                raise DefenseError("denoise: the reply does not match the last released states; the client must "
                                   "call transform_up before restore_down for every step")
            back = d.denoise(back.float(), self._perturbation.to(back.device), self._exact).to(back.dtype)
        return back

    def down_dtype(self, sent: torch.dtype) -> torch.dtype:
        """The reply's dtype: the client's wire dtype, or float32 when a codec dequantises on the cloud."""
        return sent if self.codec is None else torch.float32

    def simulate_up(self, hidden: torch.Tensor, tokens: Sequence[int], session: int,
                    public: Sequence[bool] | None = None) -> torch.Tensor:
        """(T, d) states of a sequence (positions 0..T-1, on the wire dtype) -> (T, d) float32 as the body gets them
        (``public``: (T,) the positions the cloud knows, see :meth:`transform_up`)."""
        x = self.transform_up(hidden[None], range(len(tokens)), session, path_digests(0, tokens), public)
        return (self.codec.roundtrip(x) if self.codec else x)[0].float()

    def check_width(self, d: int) -> None:
        """DefenseError when a wire defense cannot run at hidden size ``d`` (int4's group must divide it)."""
        if self.codec is not None:
            self.codec.check_width(d)

    # ---------------------------------------------------------------- cloud weights
    @property
    def needs_cloud_weights(self) -> bool:
        """True when the cloud must run body weights transformed with a secret (permute)."""
        return any(getattr(d, "cloud_weights", False) for d in self.items)

    def apply_body(self, body: torch.nn.Module, d: int) -> None:
        """Give an in-process CloudBody the transformed weights its defenses hand the cloud (private copies)."""
        for item in self.items:
            if getattr(item, "cloud_weights", False):
                body.layers = torch.nn.ModuleList(item.body_layers(list(body.layers), d))

    def refuse_served_body(self, where: str) -> None:
        """A one-line error when a served body would need transformed weights (not shipped yet)."""
        if self.needs_cloud_weights:
            names = ", ".join(d.name for d in self.items if getattr(d, "cloud_weights", False))
            raise DefenseError(f"{names}: the cloud must run body weights transformed with your secret, and "
                               f"{where} cannot ship them yet; use the in-process body (no --cloud) or "
                               "`splitinfer attack`/`bench`")

    # ---------------------------------------------------------------- local layers
    def apply_head(self, head: torch.nn.Module) -> None:
        """Apply the model defenses to a LocalHead / TruncatedForward in place (its layers become private copies)."""
        for d in self.model_items:
            if not hasattr(d, "apply_head"):
                raise DefenseError(f"defense {d.name!r} changes the split per session; the runtime serves one "
                                   "split per body, so use it in `splitinfer attack`/`bench` (states only)")
            d.apply_head(head)


def check_public(client_label: str | None, server_label: str | None) -> str | None:
    """The hello check: a one-line mismatch message, or None when both sides agree."""
    c, s = client_label or "none", server_label or "none"
    if c == s:
        return None
    return (f"defense mismatch: the client runs {c!r} but the cloud runs {s!r}; start both with the same "
            f"--defense (the cloud needs only its public part, e.g. --defense '{c}')")


def check_specs(specs: Iterable[str], d: int, where: str = "defense") -> None:
    """Parse every spec and check that it runs at hidden size ``d``; a DefenseError naming the spec otherwise.

    For a grid of specs (a suite's ``[defenses]`` table) before any work: ``quant(format=int4,group=128)`` at
    d = 576 is one line at the start, not a shard that fails hours into the grid.
    """
    for spec in specs:
        try:
            DefensePipeline.parse(spec).check_width(d)
        except DefenseError as e:
            raise DefenseError(f"{where} {spec!r}: {e}") from None
