"""The local side of split inference: head and tail here, body in the cloud.

:class:`SplitModel` keeps the embedding, the first ``a`` and the last ``b``
layers, the final norm and the LM head on the user's machine; only hidden
states cross the link. ``generate`` decodes greedily by default (token-
identical to the unsplit model) or samples with a seeded generator, streams
tokens, stops on EOS and records a :class:`~splitinfer.timing.StepTiming`
per round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from splitinfer import families
from splitinfer.body_info import BodyInfo
from splitinfer.decoding.base import DecodingEnv, Proposer, make_proposer
from splitinfer.decoding.verify import decode
from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.keyed import path_digests
from splitinfer.errors import SplitInferError
from splitinfer.link import InProcessLink, Link, WanProfile
from splitinfer.models import LoadedModel
from splitinfer.partition import CloudBody, LocalHead, LocalTail, SplitConfig, param_bytes
from splitinfer.protocol import wire_dtype as parse_wire_dtype
from splitinfer.remote import RemoteBody
from splitinfer.session import BodyService, ServiceLimits
from splitinfer.timing import StepTiming, fit, mean_breakdown
from splitinfer.tokens import encode_chat, encode_text, public_prefix_length

log = logging.getLogger(__name__)


@dataclass
class StepEvent:
    """What one round trip produced."""

    token_ids: list[int]  # tokens committed by this step
    text: str  # new text (may lag a token behind on split UTF-8 sequences)
    timing: StepTiming
    logits: torch.Tensor | None = None  # (n, V) logits that chose token_ids, if recorded


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    steps: list[StepTiming]
    wall_s: float
    bytes_sent: int
    bytes_received: int
    logits: list[torch.Tensor] = field(default_factory=list)  # per emitted token, (V,)
    decoding: str = "sequential"
    rtt_ms: float = 0.0  # the link's emulated WAN during the run (for the modelled tok/s)
    bandwidth_mbps: float | None = None
    defense: str = "none"  # canonical label of the defense the run used, its secret fields left out

    @property
    def tokens_per_step(self) -> float:
        return len(self.token_ids) / max(1, len(self.steps))

    @property
    def tok_s(self) -> float:
        return len(self.token_ids) / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict:
        """The ``--json`` summary of DESIGN/issue 2."""
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "prompt_tokens": len(self.prompt_ids),
            "new_tokens": len(self.token_ids),
            "steps": len(self.steps),
            "tokens_per_step": self.tokens_per_step,
            "tok_s": self.tok_s,
            "wall_s": self.wall_s,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "breakdown_ms": mean_breakdown(self.steps),
            "prefill_ms": self.steps[0].total_ms if self.steps else 0.0,
            "defense": self.defense,
            **self.decoding_summary(),
        }

    def decoding_summary(self) -> dict:
        """Speculative-decoding figures (issue 4): acceptance, load per step, modelled tok/s.

        Per-step figures describe the decode steps (the prefill excluded);
        ``modelled_tok_s`` uses the step-time model fitted to this run's steps
        (:mod:`splitinfer.timing`) at the run's RTT and bandwidth.
        """
        dec = self.steps[1:] if len(self.steps) > 1 else self.steps
        drafted = sum(s.draft_tokens for s in dec)
        model = fit(self.steps, self.rtt_ms, self.bandwidth_mbps) if self.steps else None
        return {
            "decoding": self.decoding,
            "draft_acceptance_rate": sum(s.draft_accepted for s in dec) / drafted if drafted else 0.0,
            "tokens_sent_per_step": sum(s.tokens_sent for s in dec) / max(1, len(dec)),
            "bytes_per_step": sum(s.bytes_up + s.bytes_down for s in dec) / max(1, len(dec)),
            "modelled_tok_s": model.tok_s(dec) if model else 0.0,
        }


def body_info(model_spec: str, split: SplitConfig, body: CloudBody, hidden_size: int, num_layers: int) -> BodyInfo:
    """What a cloud body announces at hello, and what a client checks (see :class:`BodyInfo`)."""
    return BodyInfo.of_body(model_spec, split, body, num_layers)


class SplitModel:
    """A causal LM run as local head -> cloud body -> local tail."""

    def __init__(
        self,
        loaded: LoadedModel,
        split: SplitConfig | str,
        *,
        cloud: str | Link | None = None,
        wan: WanProfile | None = None,
        wire_dtype: str | None = None,
        service_limits: ServiceLimits | None = None,
        defense: str | DefensePipeline | None = None,
        defense_options: dict | list | tuple = (),
    ):
        self.loaded = loaded
        self.split = SplitConfig.parse(split) if isinstance(split, str) else split
        self.split.validate(loaded.num_layers)
        # None: the family's default (fp16; bf16 for families whose states exceed fp16's range, e.g. Gemma)
        self.wire_dtype_name = wire_dtype or families.default_wire_dtype(loaded.model.config)
        self.wire_dtype = parse_wire_dtype(self.wire_dtype_name)
        model = loaded.model
        self.head = LocalHead(model, self.split)
        self.tail = LocalTail(model, self.split)
        self.defense = defense if isinstance(defense, DefensePipeline) else DefensePipeline.parse(defense,
                                                                                               defense_options)
        self.defense.apply_head(self.head)  # model defenses: private copies of the head layers
        self.defense.check_width(loaded.hidden_size)
        body = CloudBody.from_model(model, self.split)
        if isinstance(cloud, str):
            self.defense.refuse_served_body("a served body")
        # permute: the transformed weights the cloud runs (a Link's caller gives its body them: apply_body)
        self.defense.apply_body(body, loaded.hidden_size)
        info = body_info(loaded.spec, self.split, body, loaded.hidden_size, loaded.num_layers)
        if cloud is None:
            link: Link = InProcessLink(BodyService(body, info, service_limits or ServiceLimits(), self.defense), wan)
            self.local_body: CloudBody | None = body  # only for memory reports; never called directly
        elif isinstance(cloud, Link):
            link, self.local_body = cloud, None
        elif isinstance(cloud, str) and cloud.startswith(("ws://", "wss://")):
            from splitinfer.ws_link import WebSocketLink  # token from $SPLITINFER_TOKEN(_FILE); pass a Link for more

            link, self.local_body = WebSocketLink(cloud, wan=wan), None
        else:
            raise SplitInferError(
                f"cannot connect to cloud {cloud!r}: pass ws://HOST:PORT, wss://HOST:PORT, a Link, or leave it unset"
            )
        self.link = link
        self.remote = RemoteBody(link, info.expectation(), defense=self.defense)  # batch_invariant pinned when on
        welcome = self.remote.hello()
        if info.batch_invariant and welcome.get("batch_invariant") is not True:  # a server from before the flag
            raise SplitInferError("this client uses batch-invariant kernels but the cloud body does not say it "
                                  "does: start the server with --batch-invariant (and this version of splitinfer)")
        self.device = next(model.parameters()).device
        self.max_context = int(getattr(model.config, "max_position_embeddings", 0) or 0)

    # ------------------------------------------------------------------ memory
    def local_param_bytes(self) -> int:
        """Bytes of the local side's parameters (tied embedding / LM head counted once)."""
        return param_bytes(torch.nn.ModuleList([self.head, self.tail]))

    # ------------------------------------------------------------------ steps
    def encode_prompt(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        tok = self.loaded.tokenizer
        if isinstance(prompt, list):
            ids = [int(i) for i in prompt]
        elif chat:
            if not self.loaded.has_chat_template:
                raise SplitInferError(f"model {self.loaded.spec!r} has no chat template; drop --chat")
            ids = encode_chat(tok, [{"role": "user", "content": prompt}]).ids
        else:
            ids = encode_text(tok, prompt).ids
        if not ids:
            raise SplitInferError("the prompt is empty; give at least one token of text")
        vocab = self.loaded.model.config.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise SplitInferError(f"prompt token ids must lie in [0, {vocab})")
        return ids

    def forward_step(
        self,
        head_cache,
        tail_cache,
        tokens: list[int],
        positions: list[int],
        parents: list[int] | None = None,
        keep: dict | None = None,
        return_states: bool = False,
    ) -> tuple:  # (logits (T, V) fp32, timing[, (sent (T, d), received (T, d), final (T, d))])
        """One round trip: head -> cloud body -> tail for ``tokens`` at ``positions``.

        ``keep`` ({"prefix", "accepted"}) first commits the accepted path of
        the previous tree step in all three caches; ``parents`` makes the new
        tokens a tree. The caller commits on its side; the body gets ``keep``
        inside this same frame, so a step is exactly one round trip.
        ``return_states`` adds the hidden states sent (head output),
        received (body output, as the tail saw it) and the tail's final
        normed states (what the LM head saw).
        """
        timing = StepTiming(tokens_sent=len(tokens))
        t0 = time.perf_counter()
        if keep is not None:
            head_cache.keep(keep["prefix"], keep["accepted"])
            tail_cache.keep(keep["prefix"], keep["accepted"])
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)  # (1, T)
        pos = torch.tensor(positions, dtype=torch.long)  # (T,)
        hidden = self.head(ids, pos, head_cache, parents)  # (1, T, d)
        t1 = time.perf_counter()
        sent = hidden.to(self.wire_dtype)
        if self.defense.transforms:  # noise, keyed by each row's token path
            sent = self.defense.transform_up(sent, positions, self.remote.session_no,
                                             _row_digests(head_cache, tokens, parents, keep),
                                             self._public_rows(tokens, positions, parents))
        t_cast = time.perf_counter()
        back, ft = self.remote.forward(sent, positions, parents, keep)  # (1, T, d) wire dtype
        t2 = time.perf_counter()
        back = self.defense.restore_down(back.to(device=self.device, dtype=hidden.dtype))  # permute: y Q^T
        logits, final = self.tail(back, pos, tail_cache, parents, return_final=True)  # (1, T, V), (1, T, d)
        logits = logits[0]  # (T, V)
        t3 = time.perf_counter()
        timing.head_ms = 1e3 * (t1 - t0)
        timing.tail_ms = 1e3 * (t3 - t2)
        timing.body_ms = ft.body_ms
        timing.codec_ms = 1e3 * (t_cast - t1) + ft.encode_ms + ft.decode_ms + ft.server_codec_ms
        timing.network_ms = ft.network_ms
        timing.bytes_up, timing.bytes_down = ft.bytes_up, ft.bytes_down
        timing.finish(1e3 * (t3 - t0))
        if return_states:
            return logits, timing, (hidden[0], back[0], final[0])
        return logits, timing

    def _public_rows(self, tokens: list[int], positions: list[int], parents: list[int] | None) -> list[bool] | None:
        """(T,) the rows the cloud knows without user text, which ``noise`` and ``pclip`` release untouched: the
        model's public opening (BOS, chat-template opening) in a step that starts the sequence as a chain; None in
        every other step (``splitinfer.tokens.public_prefix_length``)."""
        if parents is not None or not positions or positions[0] != 0:
            return None
        n = public_prefix_length(self.loaded.tokenizer, tokens)
        n = next((i for i in range(n) if positions[i] != i), n)
        return [i < n for i in range(len(tokens))] if n else None

    def sequence_logits(self, tokens: list[int]) -> torch.Tensor:
        """(T, V) fp32 logits of the whole of ``tokens``, teacher-forced in one round trip of a fresh session."""
        self.remote.open()
        try:
            logits, _ = self.forward_step(self.head.new_cache(), self.tail.new_cache(), tokens,
                                          list(range(len(tokens))))
        finally:
            self.remote.close()
        return logits

    # ------------------------------------------------------------------ generation
    def stream(
        self,
        prompt: str | list[int],
        max_new_tokens: int = 128,
        *,
        chat: bool = False,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_on_eos: bool = True,
        record_logits: bool = False,
        decoding: str | Proposer = "sequential",
        decoding_options: dict | None = None,
    ) -> Iterator[StepEvent]:
        """Yield one :class:`StepEvent` per round trip while generating.

        ``decoding`` names a registered proposer (``splitinfer.decoding.list_proposers()``),
        built with ``decoding_options``, or is a :class:`Proposer` instance (which then keeps
        its state across calls, e.g. the suffix cache's history). Every step goes through
        the verifier (:mod:`splitinfer.decoding.verify`): greedy output is token-identical
        to sequential decoding whatever the proposer.
        """
        if max_new_tokens < 1:
            raise SplitInferError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not 0 <= temperature < float("inf") or not 0 < top_p <= 1:  # NaN fails both
            raise SplitInferError(f"need temperature >= 0 and 0 < top_p <= 1 (got {temperature}, {top_p})")
        prompt_ids = self.encode_prompt(prompt, chat)
        if self.max_context and len(prompt_ids) + max_new_tokens > self.max_context:
            raise SplitInferError(
                f"prompt of {len(prompt_ids)} tokens + {max_new_tokens} new tokens exceeds the model's "
                f"context limit of {self.max_context} tokens; shorten the prompt or lower --max-new-tokens"
            )
        proposer = make_decoding(decoding, decoding_options)
        eos = eos_ids(self.loaded) if stop_on_eos else set()
        detok = _Detokenizer(self.loaded.tokenizer)
        wan = self.link.wan
        env = DecodingEnv(
            vocab_size=int(self.loaded.model.config.vocab_size), eos_ids=frozenset(eos),
            max_new_tokens=max_new_tokens, rtt_ms=wan.rtt_ms, bandwidth_mbps=wan.bandwidth_mbps,
            tokenizer=self.loaded.tokenizer,
        )
        self.remote.open()
        try:
            for step in decode(
                self, prompt_ids, proposer, max_new_tokens, eos=eos, temperature=temperature, top_p=top_p,
                seed=seed, record_logits=record_logits, env=env,
            ):
                text = detok.add(step.tokens, final=step.done)
                yield StepEvent(step.tokens, text, step.timing, step.logits)
        finally:
            try:
                self.remote.close()
            except SplitInferError as e:  # the session may already be gone; keep the real error
                log.warning("closing the cloud session failed: %s", e)

    def generate(
        self, prompt: str | list[int], max_new_tokens: int = 128, *, on_text: Callable[[str], None] | None = None,
        **kwargs,
    ) -> GenerationResult:
        """Generate and collect: text, token ids, per-step timings, bytes (and logits if asked)."""
        prompt_ids = self.encode_prompt(prompt, kwargs.get("chat", False))
        sent0, recv0 = self.link.stats.bytes_sent, self.link.stats.bytes_received
        t0 = time.perf_counter()
        ids, steps, logits, texts = [], [], [], []
        for ev in self.stream(prompt_ids, max_new_tokens, **{k: v for k, v in kwargs.items() if k != "chat"}):
            ids += ev.token_ids
            steps.append(ev.timing)
            texts.append(ev.text)
            if ev.logits is not None:
                logits += list(ev.logits)
            if on_text and ev.text:
                on_text(ev.text)
        wall = time.perf_counter() - t0
        text = self.loaded.tokenizer.decode(ids, skip_special_tokens=True)
        dec = kwargs.get("decoding", "sequential")
        return GenerationResult(
            text, ids, prompt_ids, steps, wall,
            self.link.stats.bytes_sent - sent0, self.link.stats.bytes_received - recv0, logits,
            dec if isinstance(dec, str) else dec.name, self.link.wan.rtt_ms, self.link.wan.bandwidth_mbps,
            self.defense.shareable_label,
        )

    def close(self) -> None:
        self.link.close()


def make_decoding(decoding: str | Proposer, options: dict | None = None) -> Proposer:
    """A proposer from a registered name and options, or the given instance (options must then be empty)."""
    if isinstance(decoding, Proposer):
        if options:
            raise SplitInferError("decoding_options only apply when decoding is a name, not a Proposer instance")
        proposer = decoding
    elif isinstance(decoding, str):
        proposer = make_proposer(decoding, **(options or {}))
    else:
        raise SplitInferError(f"decoding must be a proposer name or a Proposer, got {type(decoding).__name__}")
    if proposer.drafts_at_prefill:  # before any session opens
        raise SplitInferError(f"proposer {proposer.name!r} drafts at prefill, which only the replay of transformers' "
                              "rule models: the split runtime's prefill carries no draft (drop at_prefill)")
    return proposer


def _row_digests(cache, tokens: list[int], parents: list[int] | None, keep: dict | None) -> list[int]:
    """Token-path digests of a step's rows; the cache's rows' digests are kept beside it, pruned like it."""
    done = getattr(cache, "path_digests", [])
    if keep is not None:
        done = done[: keep["prefix"]] + [done[keep["prefix"] + i] for i in keep["accepted"]]
    rows = path_digests(done[-1] if done else 0, tokens, parents)
    cache.path_digests = done + rows
    return rows


def eos_ids(loaded: LoadedModel) -> set[int]:
    """The token ids that end generation: the generation config's, else the model config's, else the tokenizer's."""
    eos = loaded.model.generation_config.eos_token_id if loaded.model.generation_config else None
    if eos is None:
        eos = loaded.model.config.eos_token_id
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())


class _Detokenizer:
    """Incremental decoding that never emits half a UTF-8 character."""

    def __init__(self, tokenizer):
        self.tok, self.ids, self.emitted = tokenizer, [], 0

    def add(self, ids: list[int], final: bool = False) -> str:
        self.ids += ids
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        new, self.emitted = text[self.emitted :], len(text)
        return new
