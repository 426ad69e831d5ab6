"""Token sharding across non-colluding body parties (Cascade): which party holds a position, and what a
sharded decode step costs.

Cascade (Thomas et al., "Cascade: Token-Sharded Private LLM Inference", ICML 2025, arXiv 2507.05228) deals a
prompt's positions out to several body parties that do not collude; each sees the hidden states of its own
positions only, and together they compute the unsplit body, so utility is the undefended model's. Here the
positions are dealt round-robin (:func:`party_of`); the scheme is public, which party is which is not a
secret either. What one party recovers alone is measured by the ``shard-infill`` attack
(:mod:`attacks.recipes.shard_infill`); colluding parties see every row, the undefended case.

Not a registered defense: the runtime serves one body per session, and a sharded body needs an exchange
between the parties inside every layer (attention at a position reads the keys and values of every earlier
one, held by the other parties). :func:`cost_per_step` gives a lower bound on that exchange for one decode
step, the figure a deployment would pay on top of the client's round trip. Deviation from Cascade's own
accounting: its compute and attention nodes, and its sharding schemes, are not modelled; the bound counts
only what any scheme that keeps the rows apart must move. That cheapest exchange is not private: it sends each
position's query to the other parties, and the ``query-match`` attack (:mod:`attacks.recipes.query_match`)
measures what a party recovers from the queries it receives.
"""

from __future__ import annotations

from typing import Any


def party_of(position, shards: int):
    """The party (0 .. shards - 1) that holds ``position`` (an int, or an integer array elementwise) under
    round-robin dealing."""
    if shards < 1:
        raise ValueError(f"shards={shards}; give at least 1")
    return position % int(shards)


def cost_per_step(body_layers: int, shards: int, hidden: int, heads: int, bytes_per_value: int = 2) -> dict[str, Any]:
    """Lower bound on the exchange between parties in one single-token decode step of a sharded body.

    The new position is held by one party; at every body layer its query must meet the keys and values of
    the positions the other ``shards - 1`` parties hold, and the next layer needs the result. The cheapest
    exchange keeps keys and values where they are: the query goes out to each other party (``hidden`` values)
    and each returns its partial attention output (``hidden`` values) with its softmax maximum and sum per
    head, to be combined exactly (as flash attention combines blocks). That is two sequential hops per layer,
    in parallel across parties.
    """
    if body_layers < 1 or shards < 2:
        raise ValueError("cost_per_step needs at least one body layer and two parties")
    per_party = 2 * hidden + 2 * heads  # query out; partial output and per-head (max, sum) back
    return {
        "client_round_trips": 1,  # the client sends each party its rows at once and reads the last layer's
        "sequential_hops_between_parties": 2 * body_layers,
        "bytes_between_parties": body_layers * (shards - 1) * per_party * bytes_per_value,
    }
