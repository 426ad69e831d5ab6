"""The defenses stage on the tiny model: rows, threat labels, utility ordering, results keys, report and plot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.stage_defenses import defenses_section, stage_defenses
from splitinfer.models import load_model
from tests.notes_corpus import write_notes


@pytest.fixture()
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("SPLITINFER_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "docs.jsonl"
    write_notes(path, 120)
    return {"head_depths": [2], "tail_layers": 1, "corpora": [f"file:{path}"], "train_tokens": 600,
            "test_tokens": 320, "max_length": 32, "utility_positions": 60, "greedy_prompts": 3, "tokens": 6,
            "scored_set": {"user_tokens": 8, "docs_per_corpus": 8, "min_tokens": 48, "min_documents": 6},
            "defenses": ["none", "noise(sigma=0.5)", "quant(format=int8)", "lora-random(rank=2,scale=0.5)",
                         "random-split(depths=1,4)"],
            "attackers": ["vocab-match-adaptive"], "overhead": ["quant(format=int8)"],
            "options": {"vocab-match-adaptive": {"random_tokens": 128, "max_candidates": None, "grad_steps": 5,
                                                 "batch_sizes": [64]}}}


def is_design_label(label: str) -> bool:
    """A threat-model label made of DESIGN.md section 4's words only."""
    words = {"white-box (exact)", "white-box (learned)", "shadow", "adaptive"}
    return all(p in words or re.fullmatch(r"paired \(k=\d+\)", p) for p in label.split(", "))


def test_stage_grid(cfg: dict, tmp_path: Path) -> None:
    results = {"config": {"seed": 0}, "results": {}}
    out = stage_defenses(load_model("tiny-random"), cfg, results)
    rows = {r["defense"].split("(")[0]: r for r in out["rows"]}
    assert set(rows) == {"none", "noise", "quant", "lora-random"}
    none, noise = rows["none"], rows["noise"]
    assert none["best"]["top1"]["value"] == 1.0 and none["best"]["threat_model"] == "white-box (exact)"
    assert none["next_token_agreement"] >= 0.95 and none["greedy_identity"] == 1.0
    assert "clip=" in noise["defense"]  # clip set from the median state norm
    assert noise["next_token_agreement"] < none["next_token_agreement"]
    assert noise["best"]["top1"]["value"] < none["best"]["top1"]["value"]
    assert rows["quant"]["best"]["threat_model"] == "white-box (exact), adaptive"
    assert rows["lora-random"]["best"]["threat_model"] == "shadow, adaptive"
    for r in out["rows"]:  # issue 28 findings 1 and 5: the cell's one scored set, utility sizes and intervals
        assert r["scored_set"]["tokens"] == r["best"]["top1"]["n"] >= 48 and r["scored_set"]["documents"] >= 6
        iv = r["intervals"]
        assert iv["next_token_agreement"]["n"] == r["positions"] >= 60 and r["greedy_prompts"] == 3
        assert iv["greedy_identity"]["n"] == iv["answer_token_f1"]["n"] == 3 and "answer_perplexity" in iv
        assert iv["perplexity"]["ci_low"] <= r["perplexity"] <= iv["perplexity"]["ci_high"]
    from benchmarks.grid_cell import with_undefended_gaps

    gaps = {r["defense"].split("(")[0]: r["vs_undefended"] for r in with_undefended_gaps(out["rows"])}
    assert gaps["none"]["value"] == 0.0 and gaps["noise"]["value"] < 0  # paired over the same documents
    run = results["results"][f"defenses/head:2/{noise['defense']}"]
    assert {"recovery_top1", "next_token_agreement", "perplexity", "greedy_identity", "bytes_per_step",
            "tau_combined", "modelled_tok_s_80ms"} <= set(run)
    assert f"defenses/head:2/{noise['defense']}/vocab-match-adaptive" in results["results"]
    for r in out["rows"]:  # the privacy-vs-speed plot's columns: tok/s at 80 ms per decoding, CPU and GPU-like
        seq, comb = r["tok_s_80ms"]["sequential"], r["tok_s_80ms"]["combined"]
        assert min(seq["cpu"], seq["gpu_flat"], comb["cpu"], comb["gpu_flat"]) > 0
        assert seq["gpu_flat"] == pytest.approx(seq["cpu"])  # one position per decode step: flat changes nothing
    (rs,) = out["random_split"]
    assert rs["depths"] == [1, 4] and sum(rs["drawn"].values()) == rs["sequences"] > 1
    assert 0.0 <= rs["sequence_acc"] <= 1.0 and "defenses/random-split(depths=1,4)" in results["results"]
    e2e, known = rs["end_to_end_top1"], rs["known_depth_top1"]  # end to end: depth-id, then that depth's probe
    assert e2e["n"] == known["n"] > 0 and 0.0 <= e2e["value"] <= 1.0
    if rs["sequence_acc"] == 1.0:  # every session named right: the same probe inverts it
        assert e2e["value"] == known["value"]
    assert {"end_to_end_top1", "known_depth_top1"} <= set(results["results"]["defenses/random-split(depths=1,4)"])
    labels = [x["threat_model"] for r in out["rows"] for x in r["attackers"]] + \
        [rs["threat_model"], rs["recovery_threat_model"].split(" (depth-id")[0]]
    assert all(is_design_label(t) for t in labels), labels  # DESIGN.md 4's words only
    lines = defenses_section(out, tmp_path)
    assert not any("guarantees" in line for line in lines)  # epsilon is not framed as a guarantee (issue 28)
    noise_row = next(line for line in lines if line.startswith(f"| 2 | `{noise['defense']}` | 0.5 |"))
    assert noise_row.endswith("| no meaningful protection (epsilon > 10) |")
    opts = next(line for line in lines if line.startswith("Attacker options"))  # the suite's options are shown
    assert all(f"{k}={v}" in opts for o in cfg["options"].values() for k, v in o.items()), opts
    kept = {k: v for k, v in out.items() if k != "predictions"}  # bench run writes the predictions apart
    again = defenses_section(json.loads(json.dumps(kept)), tmp_path)  # as a merge or bench report reads it back
    assert any(re.search(r"sessions per depth 1: \d+, 4: \d+\.", line) for line in again), again
    assert any(line.startswith("End to end (white-box (learned), adaptive") for line in lines)
    assert (tmp_path / "defenses_frontier_head2.png").stat().st_size > 1000
    assert (tmp_path / "defenses_speed.png").stat().st_size > 1000 and "![Privacy vs speed" in "\n".join(lines)


def test_time_budget_leaves_configurations_out(cfg: dict) -> None:
    out = stage_defenses(load_model("tiny-random"), {**cfg, "time_budget_s": 0.0, "overhead": []},
                         {"config": {"seed": 0}, "results": {}})
    assert out["rows"] == [] and len(out["skipped"]) == 4  # random-split runs before the budgeted grid


def test_lora_private_is_shadow_and_paired_attackers_report_k(cfg: dict, tmp_path: Path) -> None:
    """The victim's adapter is trained by the stage (never under reports/), attackers with the public weights are
    shadow, the paired attacker is fine-tuned on k deployment pairs and labelled with k; answers (a)-(e) read it."""
    import tempfile

    from benchmarks.defenses_answers import answers_section

    before = set(Path(tempfile.gettempdir()).glob("splitinfer-adapters-*"))
    results = {"config": {"seed": 0}, "results": {}}
    out = stage_defenses(load_model("tiny-random"), {
        **cfg, "defenses": ["none", "lora-private(rank=2,steps=3)"], "attackers": ["vocab-match-adaptive",
                                                                                    "linear-probe"],
        "options": {**cfg["options"], "linear-probe": {"epochs": 1}}, "paired_k": [0, 40], "overhead": []}, results)
    assert set(Path(tempfile.gettempdir()).glob("splitinfer-adapters-*")) == before  # the secret adapter is removed
    none, private = out["rows"]
    assert private["defense"] == "lora-private(rank=2,steps=3)" and private["family"] == "lora-private"
    by = {(x["attack"], x.get("k")): x for x in private["attackers"]}
    assert by[("vocab-match-adaptive", None)]["threat_model"] == "shadow, adaptive"
    assert by[("linear-probe", None)]["threat_model"] == "shadow, adaptive"
    assert by[("linear-probe+paired", 0)]["top1"] == by[("linear-probe", None)]["top1"]  # k = 0: no fine-tuning
    assert by[("linear-probe+paired", 40)]["threat_model"] == "shadow, paired (k=40), adaptive"  # also holds pairs
    assert 0 < by[("linear-probe+paired", 40)]["pairs_used"] <= 40
    assert private["best"]["attack"] in ("vocab-match-adaptive", "linear-probe")  # best: without deployment pairs
    vm, lp = by[("vocab-match-adaptive", None)], by[("linear-probe", None)]
    assert vm["candidate_cap"] is None and "candidate_cap" not in lp  # the matcher's scan as it ran: uncapped
    # issue 28 finding 3: every attacker on the same tokens, the cell's recovery the maximum over them
    assert lp["top1"]["n"] == vm["top1"]["n"] == by[("linear-probe+paired", 40)]["top1"]["n"]
    assert private["best"]["top1"]["value"] == max(vm["top1"]["value"], lp["top1"]["value"])
    weaker = lp if private["best"]["attack"] == "vocab-match-adaptive" else vm
    assert weaker["gap_to_best"]["value"] == private["best"]["top1"]["value"] - weaker["top1"]["value"]
    assert "defenses/head:2/lora-private(rank=2,steps=3)/linear-probe+paired/k=40" in results["results"]
    text = "\n".join(answers_section(out))
    assert "(e) " in text and "paired (known-plaintext pairs from the deployment): linear-probe k=0" in text
    assert "(a) Does a random LoRA" in text and "not measured in this suite" in text
    assert none["best"]["top1"]["value"] == 1.0


def test_attack_rescore_reproduces_every_defense_row(cfg: dict, tmp_path: Path) -> None:
    """Issue 28 finding 8: the stage writes every attacker's per-token predictions of every cell, and
    `attack rescore` recomputes each row's metrics (value, interval, n) from them alone."""
    from attacks.predictions import rescore_dir, write_all

    results = {"config": {"seed": 0}, "results": {}}
    out = stage_defenses(load_model("tiny-random"), {
        **cfg, "defenses": ["none", "quant(format=int8)"], "overhead": [],
        "attackers": ["vocab-match-adaptive", "linear-probe"],
        "options": {**cfg["options"], "linear-probe": {"epochs": 1}}}, results)
    (tmp_path / "results.json").write_text(json.dumps({"results": results["results"]}), encoding="utf-8")
    write_all(out["predictions"], tmp_path)
    checked = rescore_dir(tmp_path)
    runs = {f"defenses/head:2/{r['defense']}/{x['attack']}" for r in out["rows"] for x in r["attackers"]}
    assert {c["run"] for c in checked} == runs and len(runs) == 4
    assert all(c["complete"] and not c["missing"] and not c["mismatches"] and c["metrics"] > 5 for c in checked)


def test_defenses_table_scores_user_text_with_baselines(cfg: dict, tmp_path: Path) -> None:
    out = stage_defenses(load_model("tiny-random"), {**cfg, "defenses": ["none"], "overhead": [],
                                                     "attackers": ["linear-probe"],
                                                     "options": {"linear-probe": {"epochs": 1}}},
                         {"config": {"seed": 0}, "results": {}})
    text = "\n".join(defenses_section(out, tmp_path))
    assert "Scope: user text" in text and "template top-1" in text and "lift over strongest baseline" in text
    assert "Baselines beside the table" in text and "position" in text


def test_permute_row_keeps_utility_and_the_cloud_undoes_it_with_its_weights(cfg: dict) -> None:
    """The cloud's own transformed weights give the basis away (vocab-match-adaptive recovers everything); a
    learned attacker trained on its own basis does not transfer; the split's output is the undefended one."""
    results = {"config": {"seed": 0}, "results": {}}
    out = stage_defenses(load_model("tiny-random"), {
        **cfg, "defenses": ["permute(mode=rotation)"], "attackers": ["vocab-match-adaptive", "linear-probe"],
        "options": {**cfg["options"], "linear-probe": {"epochs": 2}}, "overhead": []}, results)
    (row,) = out["rows"]
    by = {x["attack"]: x for x in row["attackers"]}
    assert row["family"] == "permute" and row["defense"] == "permute(mode=rotation)"  # the seed stays secret
    assert by["vocab-match-adaptive"]["top1"]["value"] == 1.0
    assert by["vocab-match-adaptive"]["threat_model"] == "white-box (exact), adaptive"
    assert by["linear-probe"]["top1"]["value"] < 0.5
    assert row["greedy_identity"] == 1.0 and row["next_token_agreement"] >= 0.95
    from benchmarks.defenses_answers import answers_section

    (f,) = [line for line in answers_section(out) if line.startswith("- (f)")]
    assert "No: the cloud solves for the secret basis" in f
    assert "vocab-match-adaptive (white-box (exact), adaptive) 100.0%" in f


def _m(value: float, lo: float | None, hi: float | None, n: int) -> dict:
    return {"value": value, "ci_low": lo, "ci_high": hi, "n": n, "higher_is_better": True, "kind": "accuracy"}


def _row(depth: int, defense: str, family: str, top1: dict, **extra) -> dict:
    """A hand-made grid row as ``grid_cell.summarise_row`` returns it (one linear-probe attacker)."""
    best = {"attack": "linear-probe", "threat_model": "shadow, adaptive", "top1": top1,
            "baseline_uniform_top1": _m(0.0001, None, None, top1["n"]),
            "baseline_unigram_top1": _m(0.05, 0.03, 0.07, top1["n"]),
            "baseline_position_top1": _m(0.03, 0.01, 0.05, top1["n"])}
    return {"job": 0, "depth": depth, "defense": defense, "family": family, "strength": {}, "describe": [defense],
            "attackers": [best], "best": best, "next_token_agreement": 0.9, "perplexity": 30.0,
            "perplexity_undefended": 29.0, "positions": 100, "greedy_identity": 0.5, "bytes_per_step": 2672.0,
            "tau_combined": 1.1, "modelled_tok_s_80ms": 8.0, **extra}


def test_baselines_are_reported_beside_a_table_without_an_undefended_row(tmp_path: Path) -> None:
    """A shard of the full grid holds one defended row and no ``none`` row: its baselines still go beside it
    (DESIGN.md section 5: always reported; they depend on the scored tokens, not on the defense)."""
    row = _row(8, "lora-private(rank=8,steps=50)", "lora-private", _m(0.79, 0.76, 0.82, 3186))
    text = "\n".join(defenses_section({"rows": [row]}, tmp_path))
    assert "Baselines beside the table" in text and "unigram 5.0 [3.0, 7.0]" in text


def test_results_from_before_the_common_scored_set_are_not_described_as_scored_on_it(tmp_path: Path) -> None:
    """``bench report`` on an older results file (rows without ``scored_set``) said every attacker was scored on
    one common set; those rows scored each attacker on its own tokens, and the header must say so."""
    old = _row(8, "lora-private(rank=8,steps=50)", "lora-private", _m(0.79, 0.76, 0.82, 3186))
    text = "\n".join(defenses_section({"rows": [old]}, tmp_path))
    assert "predate the common scored set" in text and "exactly the cell's scored set" not in text
    assert "chat-form" not in text  # older rows measured utility on plain prose
    new = {**old, "scored_set": {"tokens": 3186, "documents": 96}}
    text = "\n".join(defenses_section({"rows": [new]}, tmp_path))
    assert "exactly the cell's scored set" in text and "predate" not in text and "chat-form" in text


def test_greedy_identity_counts_the_prompts_it_is_measured_on() -> None:
    """Greedy identity is a mean over the suite's prompts; its n is theirs, not the utility's teacher-forced
    positions (next-token agreement's n)."""
    from benchmarks.stage_defenses import _record

    best = {"attack": "linear-probe", "metrics": {"token_acc_top1": _m(0.5, 0.4, 0.6, 300)}}
    intervals = {"next_token_agreement": _m(0.9, 0.85, 0.95, 100), "perplexity": _m(30.0, 28.0, 32.0, 100),
                 "greedy_identity": _m(0.5, 0.2, 0.8, 2), "answer_token_f1": _m(0.7, 0.5, 0.9, 2),
                 "answer_perplexity": _m(3.0, 2.0, 4.0, 48)}
    row = {**_row(2, "none", "none", _m(0.5, 0.4, 0.6, 300)), "best": best, "attackers": [best],
           "greedy_prompts": 2, "intervals": intervals}
    results = {"results": {}}
    _record(results, "defenses/head:2/none", row)
    run = results["results"]["defenses/head:2/none"]
    assert run["greedy_identity"]["n"] == 2 and run["next_token_agreement"]["n"] == 100
    assert run["next_token_agreement"]["ci_low"] == 0.85 and run["answer_token_f1"]["ci_high"] == 0.9


def test_a_paired_label_keeps_what_the_attacker_knows_besides_the_pairs():
    from benchmarks.defenses_private import paired_label

    assert paired_label("shadow, adaptive", 100) == "shadow, paired (k=100), adaptive"
    assert paired_label("white-box (learned)", 10) == "white-box (learned), paired (k=10)"


DEFAULT_MODEL_WIDTH = 576  # SmolLM2-135M-Instruct's hidden size (../shared/ENVIRONMENT.md)


def test_every_built_in_suites_defense_specs_run_on_the_default_model():
    """Regression: full.toml asked for quant(format=int4,group=128), which cannot run at d = 576 (jobs 18 and 19
    of the full grid failed after the other shards had run)."""
    from splitinfer.defenses import check_specs
    from benchmarks.suite import load_suite

    for name in ("ci", "quick", "full"):
        suite = load_suite(name)
        if "defenses" in suite.stages and suite.model == "default":
            check_specs(suite.stage("defenses").get("defenses", []), DEFAULT_MODEL_WIDTH, f"{name}.toml")


def test_a_spec_the_model_cannot_run_stops_the_stage_before_any_work(monkeypatch):
    import benchmarks.stage_defenses as sd
    from splitinfer.defenses import DefenseError

    monkeypatch.setattr(sd, "grid_data", lambda *a, **k: pytest.fail("extracted taps before checking the specs"))
    with pytest.raises(DefenseError, match=r"\[defenses\] spec 'quant\(format=int4,group=6\)': quant: int4 needs"):
        stage_defenses(load_model("tiny-random"), {"defenses": ["none", "quant(format=int4,group=6)"]},
                       {"config": {"seed": 0}, "results": {}})


def test_the_fitted_attacker_runs_in_the_stage_by_name(cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """vocab-match-fitted in a suite's attackers: told the defense's public label like the adaptive recipes (so it
    fits its adapter against private local layers only), ``shadow, adaptive`` there, ``white-box (exact)`` against
    the undefended victim."""
    import benchmarks.stage_defenses as stage
    from attacks.defended import as_public, victim_model
    from benchmarks.stage_defenses import _attack, split_taps
    from splitinfer.defenses import DefensePipeline

    seen = []
    score = stage.score_on_set
    monkeypatch.setattr(stage, "score_on_set", lambda inv, *a, **k: (seen.append(inv.info), score(inv, *a, **k))[1])
    tiny = load_model("tiny-random")
    train, _ = split_taps(tiny, cfg, [2], "train", 300)
    clean, _ = split_taps(tiny, cfg, [2], "test", 80)
    opts = {"random_tokens": 128, "max_candidates": 64, "batch_sizes": [64], "grad_steps": 0, "fit_steps": 10}
    for spec, label in (("none", "white-box (exact)"), ("lora-random(rank=2,scale=0.5)", "shadow, adaptive")):
        pipe = DefensePipeline.parse(spec)
        test = clean[2] if pipe.is_none else as_public(split_taps(victim_model(tiny, pipe, 2), cfg, [2], "test", 80)[0][2],
                                                       tiny)
        preds: dict = {}
        target = test.select_sequences(range(4)).truncate(4)
        (row,) = _attack(tiny, "vocab-match-fitted", opts, pipe, train[2], target, 0, "run", preds)
        assert row["attack"] == "vocab-match-fitted" and row["threat_model"] == label and is_design_label(label)
        assert row["test_tokens"] > 0 and 0.0 <= row["metrics"]["token_acc_top1"]["value"] <= 1.0
        assert seen.pop()["adapter_fitted"] is not pipe.is_none and not seen  # scored once, on the cell's set
        assert row["adapter_fitted"] is not pipe.is_none  # the fit's record reaches the results
        assert list(preds) == ["run/vocab-match-fitted"]  # its per-token predictions
        if pipe.is_none:
            assert row["metrics"]["token_acc_top1"]["value"] == 1.0  # the public head is the victim's


def test_a_model_without_a_chat_template_gets_its_cost_measured_on_plain_prompts() -> None:
    """Regression: the cost columns always asked for the chat template, so the stage stopped ("has no chat
    template; drop --chat") on gemma3-270m's GGUF, a model without one. Without a template the prompts go in
    plain, as `generate` without --chat does."""
    from benchmarks.defense_utility import cost as _cost
    from splitinfer.defenses import DefensePipeline

    tiny = load_model("tiny-random")
    tiny.tokenizer.chat_template = None
    from splitinfer.client import SplitModel

    row = _cost(tiny, SplitModel(tiny, "1,1", defense=DefensePipeline.parse("none")), {"tokens": 4})
    assert row["tau_combined"] >= 1.0 and row["modelled_tok_s_80ms"] > 0


def test_attackers_run_only_where_they_apply(cfg: dict) -> None:
    """The noise attacks (whitened, session-average) run on noise rows only; session-average sees resent sessions."""
    small = {**cfg, "defenses": ["none", "noise(sigma=0.5)"], "overhead": [], "greedy_prompts": 1,
             "attackers": ["vocab-match-adaptive", "vocab-match-whitened", "session-average"],
             "options": {n: {"random_tokens": 128, "max_candidates": 32, "beam": 1}
                         for n in ("vocab-match-adaptive", "vocab-match-whitened", "session-average")}}
    out = stage_defenses(load_model("tiny-random"), small, {"config": {"seed": 0}, "results": {}})
    ran = {r["defense"].split("(")[0]: [x["attack"] for x in r["attackers"]] for r in out["rows"]}
    assert ran == {"none": ["vocab-match-adaptive"],
                   "noise": ["vocab-match-adaptive", "vocab-match-whitened", "session-average"]}
    noise = next(r for r in out["rows"] if r["defense"].startswith("noise"))
    assert all(x["threat_model"] == "white-box (exact), adaptive" for x in noise["attackers"])
    assert [x.get("fitted_on_sessions") for x in noise["attackers"]] == [None, None, 4]  # fitted on 4-session means


def test_a_shard_extracts_taps_at_its_own_jobs_depths_only(cfg: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's jobs at head 2 run the public model to depth 2, not to the deepest depth of the grid or of the
    random-split rows (shard 0's); shard 0 extracts them all (before: every shard did)."""
    import benchmarks.stage_defenses as stage

    asked = []
    real = stage.grid_data
    monkeypatch.setattr(stage, "grid_data",
                        lambda loaded, c, depths, *a: asked.append(depths) or real(loaded, c, depths, *a))
    small = {**cfg, "head_depths": [1, 2], "defenses": ["none", "quant(format=int8)", "random-split(depths=1,4)"],
             "overhead": []}
    for index in (3, 0):  # 4 jobs (2 specs x 2 depths), 4 shards: shard 3 runs int8 at depth 2
        out = stage_defenses(load_model("tiny-random"), small,
                             {"config": {"seed": 0}, "results": {}, "shard": {"index": index, "count": 4}})
        assert [(r["job"], r["depth"]) for r in out["rows"]] == [(index, 2 if index % 2 else 1)]
    assert asked == [[2], [1, 2, 4]]
