"""The defenses frontier plot: best adaptive recovery against next-token agreement, one curve per family."""

from __future__ import annotations

from pathlib import Path


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
    top = max(r["modelled_tok_s_80ms"] for r in rows) or 1.0
    for fam in draw_order(rows):
        pts = sorted((r for r in rows if r["family"] == fam), key=lambda r: r["next_token_agreement"])
        x = [100 * r["next_token_agreement"] for r in pts]
        y = [100 * r["best"]["top1"]["value"] for r in pts]
        lo, hi = error_bars(pts)
        style = (dict(marker="*", markersize=13, color="black", linestyle="none", zorder=5) if fam == "none"
                 else dict(marker="o"))
        ax.errorbar(x, y, yerr=[lo, hi], label="undefended" if fam == "none" else fam, capsize=3, **style)
        ax.scatter(x, y, s=[20 + 180 * r["modelled_tok_s_80ms"] / top for r in pts], alpha=0.3,
                   color="black" if fam == "none" else None)
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
