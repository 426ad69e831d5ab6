"""``suffix-automaton``: drafting from suffix automata over the prompt, the output, earlier outputs and a datastore.

Hu et al. 2024, "SAM Decoding: Speculative Decoding via Suffix Automaton"
(arXiv 2411.15510). A suffix automaton of the request's text (prompt and
output, extended online one token at a time, O(1) amortised) gives, after
every token, the longest suffix of the context that occurred earlier; the
draft is the ``draft_budget`` tokens that followed that earlier occurrence.
A second automaton holds earlier outputs of the same proposer instance
(matched by walking its transitions as the context grows), and a static
datastore of public text (:mod:`splitinfer.decoding.datastore`) is the third
source. The longest of the three matches drafts (ties: request, history,
datastore); inside ``combined`` all three are candidates.

Deviations: the draft follows the *earliest* occurrence of the match (the
automaton's first end position; SAM Decoding does the same for its static
automaton); the static part is a suffix array over the datastore (the same
longest match up to ``max_match`` tokens, less memory than an automaton of
Python dicts), and SAM Decoding's auxiliary drafter (Token Recycling or
EAGLE when matches are short) is left to ``combined``, which merges this
source with ``token-recycling``.
"""

from __future__ import annotations

from splitinfer.decoding.base import EMPTY, Candidate, Draft, Proposer, check_positive, register_proposer
from splitinfer.decoding.datastore import SEP, Datastore, ensure_store

DEFAULT_CORPORA = "chat,code,prose"  # the same public datastore as ``rest`` (built once per process)


class SuffixAutomaton:
    """Online suffix automaton of a token sequence (Blumer et al. 1985), with each state's first end position."""

    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first: list[int] = [-1]  # first end position (index into text) of the state's substrings
        self.last = 0
        self.text: list[int] = []

    def __len__(self) -> int:
        return len(self.next)

    def _state(self, length: int, first: int, link: int = -1, nxt: dict | None = None) -> int:
        self.next.append(dict(nxt or {}))
        self.link.append(link)
        self.length.append(length)
        self.first.append(first)
        return len(self.next) - 1

    def extend(self, c: int) -> None:
        """Append token ``c`` (SEP between documents keeps matches inside one)."""
        i = len(self.text)
        self.text.append(int(c))
        cur = self._state(self.length[self.last] + 1, i)
        p = self.last
        while p != -1 and c not in self.next[p]:
            self.next[p][c] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][c]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                clone = self._state(self.length[p] + 1, self.first[q], self.link[q], self.next[q])
                while p != -1 and self.next[p].get(c) == q:
                    self.next[p][c] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def continuation(self, state: int, length: int, k: int) -> tuple[int, list[int]]:
        """(match length, up to ``k`` tokens after the state's first occurrence), walking to shorter suffixes
        until one has a continuation before the text's end; (0, []) when none has."""
        end = len(self.text) - 1
        while state > 0:
            p = self.first[state]
            if p < end and self.text[p + 1] != SEP:
                cont = self.text[p + 1 : p + 1 + k]
                cut = cont.index(SEP) if SEP in cont else len(cont)
                return length, cont[:cut]
            state = self.link[state]
            length = self.length[state]
        return 0, []

    def step(self, state: int, length: int, c: int) -> tuple[int, int]:
        """Matching state after reading ``c``: the longest suffix of the read text that occurs here."""
        while state and c not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if c in self.next[state]:
            return self.next[state][c], length + 1
        return 0, 0


@register_proposer("suffix-automaton")
class SamDecoding(Proposer):
    """SAM Decoding: the longest earlier match of the context in request, history and datastore automata."""

    def __init__(self, *, draft_budget: int = 16, min_match: int = 1, max_match: int = 12,
                 corpora: str = DEFAULT_CORPORA, max_tokens: int = 400_000, history: bool = True):
        self.k = check_positive("draft_budget", draft_budget)
        self.min_match = check_positive("min_match", min_match)
        self.max_match = check_positive("max_match", max_match)
        self.max_tokens = check_positive("max_tokens", max_tokens, 0)
        self.corpora, self.history = str(corpora), bool(history)
        self.request = SuffixAutomaton()
        self.past = SuffixAutomaton()  # earlier outputs, SEP-separated
        self.past_state = (0, 0)
        self.store: Datastore | None = None

    def begin(self, prompt, env) -> None:
        super().begin(prompt, env)
        self.store = ensure_store(self.store, env, self.corpora, self.max_tokens, self.max_match)
        self.request, self.past_state = SuffixAutomaton(), (0, 0)
        self._feed(prompt)

    def _feed(self, tokens) -> None:
        for t in tokens:
            self.request.extend(int(t))
            if self.history:
                self.past_state = self.past.step(*self.past_state, int(t))

    def matches(self, context: list[int]) -> list[tuple[int, list[int], str]]:
        """(match length, continuation, source) of each automaton with a match, longest first."""
        out = []
        req = self.request
        link = req.link[req.last]  # the whole context (state ``last``) has no earlier occurrence of its own
        n, cont = req.continuation(link, req.length[link], self.k) if req.last else (0, [])
        out.append((n, cont, "suffix-automaton"))
        if self.history:
            out.append((*self.past.continuation(*self.past_state, self.k), "suffix-automaton-history"))
        if self.store is not None and len(self.store):
            m, starts = self.store.longest_match(context, self.max_match)
            conts = self.store.continuations(starts, m, self.k, 1) if m else []
            out.append((m, conts[0] if conts else [], "suffix-automaton-datastore"))
        out = [(min(n, 64), c, s) for n, c, s in out if n >= self.min_match and c]
        return sorted(out, key=lambda x: -x[0])  # stable: ties keep request, history, datastore

    def candidates(self, context: list[int]) -> list[Candidate]:
        return [Candidate(tuple(c), (n / (n + 1.0),) + (1.0,) * (len(c) - 1), source, r)
                for r, (n, c, source) in enumerate(self.matches(context))]

    def propose(self, context: list[int]) -> Draft:
        found = self.matches(context)
        return Draft.chain(found[0][1]) if found else EMPTY

    def update(self, context, accepted, feedback=None) -> None:
        self._feed(accepted)

    def end(self, prompt, output) -> None:
        if self.history and output:
            for t in output:
                self.past.extend(int(t))
            self.past.extend(SEP)
        self.past_state = (0, 0)
