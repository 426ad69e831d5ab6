"""Markdown report and plots from a results document.

The report opens with a summary table a reader can act on (per head split
depth: share of prompt tokens the strongest attacker of each threat model
recovers, and tok/s at 80 ms RTT), then one section per stage. It is rebuilt
from ``results.json`` alone (``splitinfer bench report``).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks import plots
from benchmarks.schema import SchemaError


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _ci(m: dict) -> str:
    if m.get("ci_low") is None:
        return _pct(m["value"])
    return f"{_pct(m['value'])} [{100 * m['ci_low']:.1f}, {100 * m['ci_high']:.1f}]"


def _speed_at(data: dict, head: int, decoding: str, rtt: float = 80.0) -> dict | None:
    for r in data.get("speed", []):
        if r["head_layers"] == head and r["decoding"] == decoding and r["rtt_ms"] == rtt:
            return r
    return None


def _strongest(attack_rows: list[dict], depth: int, threat: str) -> dict | None:
    """The strongest attacker of a threat model at a head depth, compared and reported on the depth's common
    scored set where the rows carry it (issue 28 finding 3), else on each row's own tokens (older results)."""
    rows = [r for r in attack_rows if r["side"] == "head" and r["depth"] == depth and r["threat_model"] == threat
            and r["corpus"] == "all"]
    rows = [{**r, "metrics": r["common"]["metrics"]} if r.get("common") else r for r in rows]
    return max(rows, key=lambda r: r["metrics"]["token_acc_top1"]["value"], default=None)


def summary_table(data: dict) -> list[str]:
    attack_rows = (data.get("attacks") or {}).get("rows", [])
    threats = sorted({r["threat_model"] for r in attack_rows})
    depths = sorted({r["head_layers"] for r in data.get("speed", [])} |
                    {r["depth"] for r in attack_rows if r["side"] == "head"})
    decs = sorted({r["decoding"] for r in data.get("speed", [])}, key=lambda d: (d != "sequential", d))
    head = ["local head layers"] + [f"prompt tokens recovered, user text ({t})" for t in threats] + \
        [f"tok/s at 80 ms, {d}" for d in decs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in depths:
        cells = [str(d)]
        for t in threats:
            best = _strongest(attack_rows, d, t)
            lift = None if best is None else best["metrics"].get("lift_token_acc_top1")
            cells.append("n/a" if best is None else f"{_pct(best['metrics']['token_acc_top1']['value'])} "
                                                    f"({best['attack']}"
                         + (f"; {100 * lift['value']:+.1f} over the strongest baseline)" if lift else ")"))
        for dec in decs:
            s = _speed_at(data, d, dec)
            cells.append("n/a" if s is None else f"{s['tok_s_modelled']:.1f} modelled, {s['tok_s_measured']:.1f} "
                                                 f"measured (tau {s['tau']:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _exactness_section(rows: list[dict]) -> list[str]:
    keys = sorted({(r["decoding"], r["split"]) for r in rows})
    lines = ["## Exactness (fp32 wire, greedy, against the unsplit model)", "",
             "| decoding | split | runs | token-identical | max abs logit diff |", "|---|---|---|---|---|"]
    for dec, split in keys:
        rs = [r for r in rows if r["decoding"] == dec and r["split"] == split]
        lines.append(f"| {dec} | {split} | {len(rs)} | {sum(r['identical'] for r in rs)}/{len(rs)} | "
                     f"{max(r['max_logit_diff'] for r in rs):.2e} |")
    return lines + [""]


def _speed_section(rows: list[dict]) -> list[str]:
    lines = ["## Throughput per split depth", "",
             "Measured on this machine's CPU over an emulated WAN; *modelled* is the fitted step-time model "
             "(DESIGN.md section 6) at the same RTT; *flat* assumes the verification compute of a step costs "
             "the same as a one-token step, as on a GPU.", "",
             "| split | decoding | RTT ms | tau | tok/s measured | tok/s modelled | efficiency | tok/s flat "
             "compute | bytes/step |", "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["head_layers"], r["decoding"], r["rtt_ms"])):
        lines.append(f"| {r['head_layers']},{r['tail_layers']} | {r['decoding']} | {r['rtt_ms']:g} | "
                     f"{r['tau']:.2f} | {r['tok_s_measured']:.2f} | {r['tok_s_modelled']:.2f} | "
                     f"{r['efficiency']:.3f} | {r['tok_s_modelled_flat']:.2f} | {r['bytes_per_step']:.0f} |")
    return lines + [""]


def _rtt_section(model: dict) -> list[str]:
    lines = ["## RTT decomposition model", ""]
    for dec, m in model.items():
        cv = m["cv"]
        lines += [f"**{dec}** (split {m['split']}): leave-one-RTT-out error mean {_pct(cv['mean_rel_error'])}, "
                  f"max {_pct(cv['max_rel_error'])}. Seed-style fit: per step = "
                  f"{m['seed_model']['slope']:.3f} x RTT + {m['seed_model']['intercept_ms']:.1f} ms.", "",
                  "| held-out RTT ms | measured ms/step | predicted ms/step | error |", "|---|---|---|---|"]
        lines += [f"| {f['rtt_ms']:g} | {f['measured_ms']:.1f} | {f['predicted_ms']:.1f} | {_pct(f['rel_error'])} |"
                  for f in cv["folds"]]
        lines += ["", "| RTT ms | bandwidth Mbit/s | tok/s (this CPU) | tok/s (flat compute) |", "|---|---|---|---|"]
        lines += [f"| {p['rtt_ms']:g} | {p['bandwidth_mbps']:g} | {p['tok_s']:.2f} | {p['tok_s_flat_compute']:.2f} |"
                  for p in m["projections"]]
        lines.append("")
    return lines


def _attack_section(att: dict) -> list[str]:
    from benchmarks.attack_tables import (SCOPE, baseline_line, common_set_table, metrics_cells, metrics_header,
                                          pii_cell, pii_test_line)
    from benchmarks.attack_wire import traffic_line

    rows = att.get("rows", [])
    head = ["side", "depth", "attack", "threat model", "corpus"] + metrics_header() + ["s/token"]
    lines = ["## Inversion attacks", "", att.get("note", ""), "", SCOPE, "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["side"], r["depth"], r["attack"], r["corpus"])):
        seed = r.get("info", {}).get("seed_split_top1")
        label = r["attack"] + (f" (its own random token split: {_pct(seed)})" if seed is not None else "")
        cells = [r["side"], str(r["depth"]), label, r["threat_model"], r["corpus"]] + metrics_cells(r["metrics"])
        lines.append("| " + " | ".join(cells) + f" | {r.get('seconds_per_token', float('nan')):.2g} |")
    common = common_set_table(rows)
    if common:
        lines += ["", "Every head-side attacker on the depth's common scored set (held-out, de-duplicated user text "
                      "of every corpus, chat user turns included; the set the defenses stage scores), top-1 % "
                      "[95% CI]:", "", *common]
    pooled = next((r["metrics"] for r in rows if r["corpus"] == "all" and "baseline_unigram_top1" in r["metrics"]),
                  None)
    if pooled:
        lines += ["", baseline_line(pooled)]
    lines += [x for line in (traffic_line(rows), pii_test_line(att.get("pii_test"))) if line for x in ("", line)]
    pii = [r for r in rows if r["corpus"] == "all" and any(k.startswith("pii_recovery_") for k in r["metrics"])]
    if pii:
        types = sorted({k[len("pii_recovery_"):] for r in pii for k in r["metrics"] if k.startswith("pii_recovery_")})
        lines += ["", "PII spans recovered character-exactly (% [95% CI], n spans), pooled test set:", "",
                  "| attack | boundary | " + " | ".join(types) + " |", "|---|---|" + "---|" * len(types)]
        lines += [f"| {r['attack']} | {r['boundary']} | " + " | ".join(
            pii_cell(r["metrics"].get(f"pii_recovery_{t}")) for t in types) + " |" for r in pii]
    return lines + [""]


def stage_time_section(data: dict) -> list[str]:
    """Each stage's wall time against the budget its suite table gives (``budget_s``)."""
    budgets = data.get("stage_budget_s", {})
    rows = [f"| {name} | {wall:.0f} | {'-' if budgets.get(name) is None else f'{budgets[name]:g}'} |"
            for name, wall in data.get("stage_seconds", {}).items()]
    return ["## Stage times", "", "| stage | wall s | budget s |", "|---|---:|---:|", *rows, ""] if rows else []


def _shards(results: dict) -> str:
    """How the run was cut (bench run --shard / bench merge), for the header line."""
    if results.get("missing_shards"):
        n, missing = results["merged_shards"], results["missing_shards"]
        return (f" (processor time summed over {n - len(missing)} of {n} shards; **partial merge**: shards "
                f"{', '.join(str(i) for i in missing)} of {n} not run yet, so every table and plot covers the merged "
                "shards only)")
    if results.get("merged_shards"):
        return f" (processor time summed over {results['merged_shards']} merged shards)"
    if results.get("shard"):
        return f"; shard {results['shard']['index']}/{results['shard']['count']} only (join with bench merge)"
    return ""


def plugin_lines(results: dict) -> list[str]:
    """The plugins the run loaded (name, distribution, version, digest) and, loudly, the components it left out."""
    lines = []
    plugins = results["config"].get("plugins") or []
    if plugins:
        lines += ["Plugins (third-party components beside the built-ins; docs/extending.md): " + "; ".join(
            f"`{p['name']}` ({' '.join(x for x in (p['dist'], p['version']) if x) or 'not installed'}, "
            f"sha256 `{p['digest'][:12]}`: "
            + ", ".join(f"{k} {', '.join(v)}" for k, v in p["components"].items()) + ")" for p in plugins) + ".", ""]
    failed = results.get("failed_components") or []
    if failed:
        lines += ["## Failed components (left out of every table and metric)", ""]
        lines += [f"- {f['stage']}: {f['kind']} `{f['name']}`: {f['error']}" for f in failed] + [""]
    return lines


_SUITE_CONFIG = ("model", "model_sha256", "num_layers")  # what a bench run's config always holds


def write_report(results: dict, out_dir: str | Path) -> Path:
    """Write report.md and the PNG plots next to results.json; return the report's path."""
    out = Path(out_dir)
    data = results.get("data", {})
    cfg = results["config"]
    missing = [k for k in _SUITE_CONFIG if k not in cfg]
    if missing:
        raise SchemaError(f"a {results['suite']!r} results document is not a suite run's (its config lacks "
                          f"{', '.join(missing)}): bench report renders what bench run wrote; the benchmark that "
                          "wrote this file writes its own report")
    if not isinstance(data, dict):
        raise SchemaError(f"the results document's data is a {type(data).__name__}, not a table of stages; the file "
                          "is damaged: rerun the suite")
    figs: list[tuple[str, Path | None]] = []
    speed = data.get("speed", [])
    att = data.get("attacks") or {}
    attack_rows = att.get("rows", [])

    for side, title in (("head", "Prompt recovery from the states the cloud receives"),
                        ("tail", "Output recovery from the states the cloud returns")):
        rows = [{"attack": r["attack"], "depth": r["depth"], **r["metrics"]["token_acc_top1"]}
                for r in attack_rows if r["side"] == side and r["corpus"] == "all"
                and (side == "head" or r.get("leaks", "output") == "output")]  # :current leaks the input
        figs.append((title, plots.plot_recovery_vs_depth(rows, att.get("baselines", {}),
                                                          out / f"recovery_{side}.png", title)))
    pii_rows = att.get("pii_rows", [])
    figs.append(("PII recovery by type", plots.plot_pii(pii_rows, out / "pii.png")))
    bd = [{"label": f"{r['head_layers']},{r['tail_layers']} {r['decoding']}", "breakdown_ms": r["breakdown_ms"]}
          for r in sorted(speed, key=lambda r: (r["head_layers"], r["decoding"])) if r["rtt_ms"] == 80.0]
    figs.append(("Latency breakdown", plots.plot_breakdown(bd, out / "latency_breakdown.png")))
    tau_rows = []
    seen = set()
    for r in speed:
        for cat, tau in r["tau_by_category"].items():
            if (r["decoding"], cat) not in seen:
                seen.add((r["decoding"], cat))
                tau_rows.append({"decoding": r["decoding"], "category": cat, "tau": tau})
    figs.append(("Tokens per round trip", plots.plot_tau(tau_rows, out / "tau.png")))
    series = []
    for dec, m in (data.get("rtt_model") or {}).items():
        curve = m.get("curve", m["projections"])
        series.append({"label": f"{dec}, split {m['split']}", "projected": [(p["rtt_ms"], p["tok_s"]) for p in curve],
                       "measured": [(x["rtt_ms"], x["tok_s"]) for x in m["measured"]]})
        if dec != "sequential":
            series.append({"label": f"{dec}, flat compute (GPU-like)", "style": "--",
                           "projected": [(p["rtt_ms"], p["tok_s_flat_compute"]) for p in curve]})
    figs.append(("Throughput against RTT", plots.plot_throughput_vs_rtt(series, out / "throughput_vs_rtt.png")))

    lines = [f"# splitinfer report: suite `{results['suite']}`", "",
             f"Model `{cfg['model']}` (sha256 `{cfg['model_sha256'][:16]}`, {cfg['num_layers']} layers, "
             f"d={cfg['hidden_size']}), seed {cfg['seed']}, git `{results['git_hash'][:12]}`"
             f"{' (dirty)' if results.get('git_dirty') else ''}, {results['date']}, "
             f"{data.get('total_seconds', 0):.0f} s{_shards(results)}.", ""]
    lines += plugin_lines(results)
    summary = summary_table(data)
    if len(summary) > 2:  # a run without attacks or speed stages (e.g. defenses only) has no summary row
        lines += ["## Summary", ""] + summary + [""]
    if "exactness" in data:
        lines += _exactness_section(data["exactness"])
    if speed:
        lines += _speed_section(speed)
    if data.get("rtt_model"):
        lines += _rtt_section(data["rtt_model"])
    if data.get("ngram_ablation"):
        from benchmarks.stage_ablation import ablation_section

        lines += ablation_section(data["ngram_ablation"])
    if attack_rows:
        lines += _attack_section(att)
    if data.get("defenses"):
        from benchmarks.stage_defenses import defenses_section

        lines += defenses_section(data["defenses"], out)
    lines += stage_time_section(data)
    shown = [f"![{t}]({p.name})" for t, p in figs if p is not None]
    lines += (["## Plots", ""] + shown + [""]) if shown else []
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
