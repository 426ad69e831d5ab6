"""PNG plots of a results document (matplotlib, Agg backend).

Every plot has a title, axis labels with units and a legend; each function
returns the file it wrote, or None when the results lack the data for it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COMPONENT_LABELS = {"network_ms": "network (RTT + transfer)", "head_ms": "local head", "tail_ms": "local tail",
                    "draft_ms": "proposer", "body_ms": "cloud body", "codec_ms": "serialisation",
                    "other_ms": "other"}


def save_figure(fig, path: Path) -> Path:
    """Lay out, write at 110 dpi and close ``fig``; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_recovery_vs_depth(rows: list[dict], baselines: dict, out: Path, title: str) -> Path | None:
    """Top-1 recovery (with 95% CI) per attacker against split depth, with uniform and unigram baselines.

    ``rows``: {attack, depth, value, ci_low, ci_high}; ``baselines``: {name: value}.
    """
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for attack in sorted({r["attack"] for r in rows}):
        rs = sorted((r for r in rows if r["attack"] == attack), key=lambda r: r["depth"])
        ax.errorbar([r["depth"] for r in rs], [100 * r["value"] for r in rs],
                    yerr=[[100 * (r["value"] - r["ci_low"]) for r in rs], [100 * (r["ci_high"] - r["value"])
                                                                            for r in rs]],
                    marker="o", capsize=3, label=attack)
    for (name, value), style in zip(sorted(baselines.items()), (":", "--", "-.")):
        ax.axhline(100 * value, linestyle=style, color="grey", label=f"baseline: {name} ({100 * value:.2g}%)")
    ax.set_xlabel("split depth (layers before the boundary)")
    ax.set_ylabel("tokens recovered, top-1 (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out)


def plot_pii(rows: list[dict], out: Path) -> Path | None:
    """PII spans recovered per type, grouped bars per attacker (at one depth). rows: {attack, type, value}."""
    if not rows:
        return None
    types = sorted({r["type"] for r in rows})
    attacks = sorted({r["attack"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(7, len(types) * 0.9), 4.5))
    width = 0.8 / len(attacks)
    for i, attack in enumerate(attacks):
        vals = {r["type"]: 100 * r["value"] for r in rows if r["attack"] == attack}
        xs = [t + i * width for t in range(len(types))]
        bars = ax.bar(xs, [vals.get(t, 0.0) for t in types], width, label=attack)
        for x, t in zip(xs, types):  # tell a real 0% from a type this attacker was not scored on
            if t not in vals:
                ax.text(x, 1, "n/a", ha="center", va="bottom", fontsize=6, rotation=90, color="0.4")
            elif vals[t] == 0:
                ax.text(x, 1, "0", ha="center", va="bottom", fontsize=7, color=bars[0].get_facecolor())
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(types))], types, rotation=30, ha="right")
    ax.set_ylabel("PII spans recovered exactly (%)")
    ax.set_ylim(0, 105)
    ax.text(0.0, -0.32, "n/a: no span of that type in the tokens this attacker was scored on", fontsize=7,
            transform=ax.transAxes, color="0.4")
    ax.set_title(rows[0].get("title", "PII recovery by type"))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, out)


def plot_breakdown(rows: list[dict], out: Path) -> Path | None:
    """Stacked bars of mean per-step latency by component. rows: {label, breakdown_ms}."""
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(7, 0.8 * len(rows)), 4.5))
    bottoms = [0.0] * len(rows)
    for key, label in COMPONENT_LABELS.items():
        vals = [r["breakdown_ms"].get(key, 0.0) for r in rows]
        if not any(vals):
            continue
        ax.bar(range(len(rows)), vals, bottom=bottoms, label=label)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    ax.set_xticks(range(len(rows)), [r["label"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time per step (ms)")
    ax.set_title("Per-step latency breakdown at 80 ms RTT")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: the bars fill the axes
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, out)


def plot_tau(rows: list[dict], out: Path) -> Path | None:
    """Grouped bars of tokens per round trip by prompt category and proposer. rows: {decoding, category, tau}."""
    if not rows:
        return None
    cats = sorted({r["category"] for r in rows})
    decs = sorted({r["decoding"] for r in rows}, key=lambda d: (d != "sequential", d))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(decs)
    for i, dec in enumerate(decs):
        vals = {r["category"]: r["tau"] for r in rows if r["decoding"] == dec}
        ax.bar([c + i * width for c in range(len(cats))], [vals.get(c, 0.0) for c in cats], width, label=dec)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cats))], cats)
    ax.set_ylabel("tokens committed per round trip (tau)")
    ax.set_title("Tokens per round trip by prompt category and proposer")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, out)


def plot_throughput_vs_rtt(series: list[dict], out: Path) -> Path | None:
    """Projected tok/s against RTT per series, measured points marked.

    series: {label, projected: [(rtt, tok_s)], measured: [(rtt, tok_s)]}.
    """
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in series:
        xs, ys = zip(*sorted(s["projected"])) if s["projected"] else ((), ())
        line = ax.plot(xs, ys, label=f"{s['label']} (modelled)", linestyle=s.get("style", "-"))
        if s.get("measured"):
            mx, my = zip(*s["measured"])
            ax.scatter(mx, my, marker="o", color=line[0].get_color(), zorder=3, label=f"{s['label']} (measured)")
    ax.set_xlabel("network round-trip time (ms)")
    ax.set_ylabel("generation speed (tokens/s)")
    ax.set_title("Throughput against RTT (100 Mbit/s)")
    ax.set_xlim(0, 155)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, out)
