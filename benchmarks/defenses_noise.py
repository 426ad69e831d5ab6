"""The defenses report's noise table: sigma beside the absolute noise norm, SNR and composed epsilon (issue 28).

One row per noise row of the grid (head depth, defense), computed by
:func:`splitinfer.defenses.noise_accounting.noise_accounting` from the row's public label and the model's
hidden size. Epsilon is composed with the RDP accountant over a prompt of :data:`PROMPT_TOKENS` vectors and a
generation of :data:`PROMPT_TOKENS` + :data:`GENERATED_TOKENS` (sequential decoding); every row says in words
whether it protects anything (the line: epsilon > 10 over the prompt). The heading never calls epsilon a
guarantee: it bounds the cloud's view of the released vectors under the Gaussian mechanism's neighbour
relation, not what the attackers of the table recover.
"""

from __future__ import annotations

from splitinfer.defenses import DefensePipeline
from splitinfer.defenses.noise_accounting import MEANINGLESS_EPSILON, noise_accounting

__all__ = ["GENERATED_TOKENS", "PROMPT_TOKENS", "hidden_size", "noise_lines"]

PROMPT_TOKENS = 128
GENERATED_TOKENS = 128


def hidden_size(data: dict) -> int | None:
    """The model's hidden size d from the stage's data (``hidden_size``, or the overhead timings' ``d``)."""
    if data.get("hidden_size"):
        return int(data["hidden_size"])
    return next((int(o["d"]) for o in data.get("overhead", []) if o.get("d")), None)


def _eps(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"


def noise_lines(data: dict) -> list[str]:
    """Markdown lines of the noise table for the stage's ``data`` (none when no row adds noise or d is unknown)."""
    d = hidden_size(data)
    noisy = []
    for r in data.get("rows", []):
        item = DefensePipeline.parse(r["defense"]).get("noise")
        if item is not None and item.sigma > 0:
            noisy.append((r["depth"], r["defense"], item))
    if not noisy or d is None:
        return []
    deltas = ", ".join(sorted({f"{item.delta:g}" for _, _, item in noisy}))
    lines = ["", f"Noise in absolute terms (d = {d} coordinates per vector). sigma is the noise std per coordinate "
                 "as a multiple of the clip norm C, so the noise vector's norm is about sigma x C x sqrt(d) "
                 f"(sqrt(d) = {d ** 0.5:.1f}); SNR = C / E||noise|| (a clipped state's norm is at most C). "
                 f"epsilon (delta = {deltas}) is an accountant's bound on what the "
                 "released vectors reveal under the Gaussian mechanism (one vector replaced by any other, "
                 "L2 sensitivity 2C; opacus RDP), composed over the vectors of a prompt of "
                 f"{PROMPT_TOKENS} tokens and of a generation of {PROMPT_TOKENS} + {GENERATED_TOKENS} tokens "
                 "(sequential decoding; rejected drafts add releases). It is not a guarantee that text stays "
                 f"private, and above epsilon = {MEANINGLESS_EPSILON:g} it protects nothing: the rows say so. "
                 "At small sigma the RDP bound is loose; any value above the line means the same.", "",
             "| depth | defense | sigma (x C per coordinate) | C | noise norm (x C) | SNR | epsilon per vector | "
             f"epsilon per prompt ({PROMPT_TOKENS}) | epsilon per generation ({PROMPT_TOKENS + GENERATED_TOKENS}) | "
             "protection |", "|---|---|---|---|---|---|---|---|---|---|"]
    for depth, label, item in noisy:
        a = noise_accounting(item.sigma, item.clip, d, delta=item.delta, prompt_tokens=PROMPT_TOKENS,
                             generated_tokens=GENERATED_TOKENS)
        lines.append(f"| {depth} | `{label}` | {a.sigma:g} | {a.clip:g} | {a.noise_norm:.1f} "
                     f"({a.noise_norm_over_clip:.2f}) | {a.snr:.3g} | {_eps(a.eps_vector)} | {_eps(a.eps_prompt)} | "
                     f"{_eps(a.eps_generation)} | {a.verdict} |")
    return lines
