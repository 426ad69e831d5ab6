"""The defenses frontier plot: best adaptive recovery against next-token agreement, one curve per family."""

from __future__ import annotations

from pathlib import Path

from benchmarks.defenses_speed import measured_tok_s


def error_bars(rows: list[dict]) -> tuple[list[float], list[float]]:
    """(below, above) in points of the best recovery's 95% interval per row; 0 where it has none (n/a)."""
    below, above = [], []
    for r in rows:
        m = r["best"]["top1"]
        below.append(0.0 if m["ci_low"] is None else 100 * (m["value"] - m["ci_low"]))
        above.append(0.0 if m["ci_high"] is None else 100 * (m["ci_high"] - m["value"]))
    return below, above


def draw_order(rows: list[dict]) -> list[str]:
    """Families in the order they are drawn: first appearance, the undefended point (`none`) last, so that a
    defense that sits on it (permute, at 100% agreement and 100% recovery) cannot hide it."""
    families = list(dict.fromkeys(r["family"] for r in rows))
    return [f for f in families if f != "none"] + [f for f in families if f == "none"]


def plot_frontier(rows: list[dict], out: Path, depth: int) -> Path | None:
    """One panel: x = next-token agreement, y = best recovery top-1 (CI bars); marker size = tok/s at 80 ms."""
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    top = max(measured_tok_s(r.get("modelled_tok_s_80ms")) or 0.0 for r in rows) or 1.0  # none timed: smallest
    for fam in draw_order(rows):
        pts = sorted((r for r in rows if r["family"] == fam), key=lambda r: r["next_token_agreement"])
        x = [100 * r["next_token_agreement"] for r in pts]
        y = [100 * r["best"]["top1"]["value"] for r in pts]
        lo, hi = error_bars(pts)
        style = (dict(marker="*", markersize=13, color="black", linestyle="none", zorder=5) if fam == "none"
                 else dict(marker="o"))
        ax.errorbar(x, y, yerr=[lo, hi], label="undefended" if fam == "none" else fam, capsize=3, **style)
        area = [20 + 180 * (measured_tok_s(r.get("modelled_tok_s_80ms")) or 0.0) / top for r in pts]
        ax.scatter(x, y, s=area, alpha=0.3, color="black" if fam == "none" else None)
    ax.axhline(10, color="grey", linestyle=":", linewidth=1)
    ax.axvline(90, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("next-token agreement with the undefended model (%)")
    ax.set_ylabel("best adaptive attacker, top-1 recovery (%)")
    ax.set_title(f"Head depth {depth}: recovery vs utility (area ~ tok/s at 80 ms)", fontsize=10)
    ax.set_xlim(-2, 102)
    ax.set_ylim(-2, 102)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


UTILITY_FLOOR = 0.9  # next-token agreement below which a configuration is marked unusable
COSTS = (("cpu", "this CPU's costs"), ("gpu_flat", "GPU projection (flat compute)"))


def speed_points(rows: list[dict], cost: str) -> list[dict]:
    """One point per (head depth, defense, decoding) with a tok/s at 80 ms for ``cost`` (``cpu`` / ``gpu_flat``).

    Rows without the per-decoding speed columns (grids run before them) give their one stored figure,
    ``modelled_tok_s_80ms`` (``combined``, this CPU), and nothing for the GPU projection.
    """
    out = []
    for r in rows:
        speeds = r.get("tok_s_80ms") or ({"combined": {"cpu": r["modelled_tok_s_80ms"]}}
                                         if "modelled_tok_s_80ms" in r else {})
        for decoding, by_cost in speeds.items():
            if measured_tok_s(by_cost.get(cost)) is None:  # not measured, or no decode step timed: no point
                continue
            m = r["best"]["top1"]
            out.append({"depth": r["depth"], "defense": r["defense"], "decoding": decoding,
                        "tok_s": float(by_cost[cost]), "recovery": 100 * m["value"],
                        "below": 0.0 if m["ci_low"] is None else 100 * (m["value"] - m["ci_low"]),
                        "above": 0.0 if m["ci_high"] is None else 100 * (m["ci_high"] - m["value"]),
                        "agreement": float(r["next_token_agreement"]),
                        "usable": float(r["next_token_agreement"]) >= UTILITY_FLOOR})
    return out


def plot_speed(rows: list[dict], out: Path) -> Path | None:
    """Strongest adaptive recovery (95% CI) against modelled tok/s at 80 ms; one row of panels per head depth,
    one column per cost basis (this CPU, GPU projection).

    Marker shape = decoding; colour = next-token agreement (the utility) for configurations at or above the floor
    (90%); configurations below it are grey crosses, "unusable".
    """
    panels = {cost: speed_points(rows, cost) for cost, _ in COSTS}
    if not any(panels.values()):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {"sequential": "o", "combined": "^"}
    depths = sorted({r["depth"] for r in rows})
    cmap, norm = plt.get_cmap("viridis"), matplotlib.colors.Normalize(100 * UTILITY_FLOOR, 100)
    fig, axes = plt.subplots(len(depths), 2, figsize=(11, 3.6 * len(depths) + 0.8), sharey=True, squeeze=False)
    for i, depth in enumerate(depths):
        for j, (cost, title) in enumerate(COSTS):
            ax = axes[i][j]
            pts = [p for p in panels[cost] if p["depth"] == depth]
            if not pts:
                ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax.transAxes)
            for p in pts:
                mk = markers.get(p["decoding"], "s")
                if p["usable"]:
                    colour = cmap(norm(100 * p["agreement"]))
                    ax.errorbar(p["tok_s"], p["recovery"], yerr=[[p["below"]], [p["above"]]], marker=mk,
                                color=colour, markeredgecolor="black", capsize=3, linestyle="none", zorder=3)
                else:
                    ax.scatter(p["tok_s"], p["recovery"], marker="x", color="grey", alpha=0.6, zorder=2)
            ax.axhline(10, color="grey", linestyle=":", linewidth=1)
            ax.set_title(f"head depth {depth}: {title}", fontsize=10)
            ax.set_ylim(-2, 102)
            if i == len(depths) - 1:
                ax.set_xlabel("modelled tok/s at 80 ms RTT, 100 Mbit/s")
        axes[i][0].set_ylabel("strongest adaptive attacker,\ntop-1 recovery (%)")
    handles = [plt.Line2D([], [], marker=markers.get(d, "s"), color="white", markeredgecolor="black",
                          linestyle="none", label=d)
               for d in sorted({p["decoding"] for pts in panels.values() for p in pts})]
    handles.append(plt.Line2D([], [], marker="x", color="grey", linestyle="none",
                              label=f"unusable: agreement < {100 * UTILITY_FLOOR:.0f}%"))
    axes[0][1].legend(handles=handles, fontsize=8, loc="lower right")
    bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, shrink=0.8, pad=0.02)
    bar.set_label("next-token agreement (%)")
    fig.suptitle("Privacy vs speed: one point per (head depth, defense, decoding)", fontsize=10)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out
