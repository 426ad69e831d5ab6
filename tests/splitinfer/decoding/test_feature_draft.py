"""feature-draft: exactness, the final states it drafts from, training files and their errors, combined, options."""

import json

import pytest
import torch

from splitinfer.cli import main
from splitinfer.client import SplitModel
from splitinfer.decoding.base import Draft, StepFeedback, make_proposer
from splitinfer.decoding.feature_draft import FeatureDraft
from splitinfer.decoding.feature_head import FeatureHead, head_files, load_head, save_head
from splitinfer.decoding.feature_train import vocab_shortlist
from splitinfer.errors import SplitInferError
from splitinfer.models import load_model
from tests.splitinfer.decoding.exact import check_same

PROMPTS = ["the cat sat on the mat. the cat sat on the mat. the cat", "def f(x):\n    return x\ndef g(x):", "Hello"]
WITH_HEAD = "suffix,prompt-lookup,ngram-pool,feature-draft"


@pytest.fixture(scope="module")
def sm(tiny):
    return SplitModel(tiny, "2,2", wire_dtype="fp32")



@pytest.mark.parametrize("name,options", [
    ("feature-draft", {}),
    ("feature-draft", {"adaptive": False, "draft_budget": 6, "topk": 2, "beam": 2, "max_depth": 4, "min_prob": 0.0}),
    ("combined", {"sources": WITH_HEAD}),
])
def test_token_identical_to_sequential(sm, feature_head_dir, name, options):
    proposer = make_proposer(name, draft_head=str(feature_head_dir), **options)  # one instance across prompts
    drafted = 0
    for prompt in PROMPTS[:2]:
        ref = sm.generate(prompt, 24, record_logits=True, stop_on_eos=False)
        res = sm.generate(prompt, 24, record_logits=True, stop_on_eos=False, decoding=proposer)
        check_same(res, ref)
        drafted += sum(s.draft_tokens for s in res.steps)
    assert drafted > 0


def test_it_drafts_from_the_state_that_chose_the_newest_token(sm, feature_head_dir):
    """The row it keeps is the one whose LM-head logits picked the last emitted token (greedy)."""
    seen = []

    class Watched(FeatureDraft):
        def update(self, context, accepted, feedback=None):
            super().update(context, accepted, feedback)
            seen.append((int(self.tail.logits(self._feat).argmax()), accepted[-1], len(feedback.draft)))

    p = Watched(draft_head=str(feature_head_dir), adaptive=False, min_prob=0.0)
    sm.generate(PROMPTS[0], 30, stop_on_eos=False, decoding=p)
    assert all(a == b for a, b, _ in seen) and any(n for _, _, n in seen)


def test_chooser_row_pure():
    d = Draft((5, 6, 7), (-1, 0, -1))
    fb = StepFeedback(d, [6, 9, 1], [0, 1], 5, None, [0, 1, 2], torch.zeros(4, 2))
    assert fb.chooser_row(3) == 2 and fb.chooser_row(1) == 0  # rows: root, node 0, node 1, node 2
    prefill = StepFeedback(Draft(), [], [], 3, None, [], torch.zeros(7, 2))
    assert prefill.chooser_row(1) == 6


def test_train_save_load_round_trip(feature_head_dir, tiny):
    head, info = load_head(feature_head_dir, {"model_sha256": tiny.sha256, "hidden_size": 64})
    assert info["model_sha256"] == tiny.sha256 and info["vocab_size"] == 259 and info["mlp_hidden"] == 32
    assert len(info["heldout"]["top1_per_depth"]) == 6 and info["steps"] == 6 and info["generated_tokens"] > 0
    assert info["corpus_split"] == "train"
    head2, _ = load_head(head_files(feature_head_dir)[0])  # the .safetensors path works too
    x, e = torch.randn(3, 64), torch.randn(3, 64)
    assert torch.equal(head(x, e), head2(x, e))


def test_wrong_model_corrupt_or_missing_files_are_one_line_errors(feature_head_dir, tmp_path):
    other = SplitModel(load_model("tiny-random", seed=1), "2,2", wire_dtype="fp32")  # same dims, other weights
    with pytest.raises(SplitInferError, match="was made for model_sha256=") as e:
        other.generate("x", 3, decoding="feature-draft", decoding_options={"draft_head": str(feature_head_dir)})
    assert "\n" not in str(e.value)
    st, js = head_files(tmp_path)
    save_head(FeatureHead(64, 8), tmp_path, {"model_sha256": "abc", "vocab_size": 259})
    st.write_bytes(st.read_bytes()[:40])  # truncated
    with pytest.raises(SplitInferError, match="not a readable safetensors file") as e:
        load_head(tmp_path)
    assert "\n" not in str(e.value)
    save_head(FeatureHead(64, 8), tmp_path, {}, force=True)  # another run: overwriting it needs force
    js.write_text(json.dumps({**json.loads(js.read_text()), "mlp_hidden": 9}))
    with pytest.raises(SplitInferError, match="wrong names or shapes"):
        load_head(tmp_path)
    js.write_text("{not json")
    with pytest.raises(SplitInferError, match="not a readable feature-draft config"):
        load_head(tmp_path)
    with pytest.raises(SplitInferError, match="no trained feature-draft head"):
        load_head(tmp_path / "nowhere")
    with pytest.raises(SplitInferError, match="hidden_size=64, not 32"):
        load_head(feature_head_dir, {"hidden_size": 32})


def test_the_shortlist_ranks_emitted_tokens_first_then_frequent_ones_then_low_ids():
    labels = torch.tensor([7, 7, 7, 3, 3, 9])  # the model emitted 7 thrice, 3 twice, 9 once
    tokens = torch.tensor([1, 1, 1, 1, 9, 9, 9, 5, 5, 0])  # 1 is frequent in the text but never emitted
    assert vocab_shortlist(labels, tokens, 12, 3).tolist() == [3, 7, 9]
    assert vocab_shortlist(labels, tokens, 12, 6).tolist() == [0, 1, 3, 5, 7, 9]  # then 1 (x4), 5 (x2), 0 (x1)
    assert vocab_shortlist(labels, tokens, 12, 7).tolist() == [0, 1, 2, 3, 5, 7, 9]  # unseen: lowest id first
    with pytest.raises(SplitInferError, match="1..12 tokens"):
        vocab_shortlist(labels, tokens, 12, 13)


@pytest.fixture(scope="module")
def shortlist_head_dir(tiny, tmp_path_factory):
    from splitinfer.decoding.feature_train import draft_train

    head, meta = draft_train(tiny, tokens=48, steps=6, batch=16, max_new=12, hidden=32, prompt_chars=40,
                             vocab=40, progress=False)
    out = tmp_path_factory.mktemp("shortlist-head")
    save_head(head, out, meta)
    return out


def test_a_shortlisted_head_round_trips_and_drafts_only_its_tokens(sm, shortlist_head_dir):
    head, info = load_head(shortlist_head_dir)
    assert info["draft_vocab"] == 40 and 0 < info["draft_vocab_coverage"] <= 1
    assert head.vocab_shortlist.dtype == torch.int64 and head.vocab_shortlist.shape == (40,)
    allowed = set(head.vocab_shortlist.tolist())
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    ref = sm.generate(prompt, 30, record_logits=True, stop_on_eos=False)
    for use in (True, False):
        proposer = make_proposer("feature-draft", draft_head=str(shortlist_head_dir), shortlist=use)
        drafted = []
        original = proposer.propose
        proposer.propose = lambda ctx: drafted.append(original(ctx)) or drafted[-1]
        res = sm.generate(prompt, 30, record_logits=True, stop_on_eos=False, decoding=proposer)
        assert res.token_ids == ref.token_ids
        tokens = {t for d in drafted for t in d.tokens}
        assert tokens and (tokens <= allowed if use else proposer._readout.shape[0] == 259)  # 259: the whole vocabulary


def test_a_bad_shortlist_in_the_file_is_a_one_line_error(tmp_path):
    from safetensors.torch import load_file, save_file

    head = FeatureHead(64, 8)
    head.vocab_shortlist = torch.tensor([1, 2, 300])
    save_head(head, tmp_path, {"vocab_size": 259})
    with pytest.raises(SplitInferError, match=r"outside \[0, 259\)"):
        load_head(tmp_path)
    st = head_files(tmp_path)[0]
    tensors = load_file(str(st))
    save_file({**tensors, "vocab_shortlist": torch.tensor([4, 4])}, str(st))
    with pytest.raises(SplitInferError, match="repeats token ids"):
        load_head(tmp_path)


@pytest.mark.parametrize("options,match", [  # the options both model drafters take: test_model_drafter.py
    ({"topk": 0}, "topk must be an integer >= 1"),
    ({"min_prob": 1.5}, r"min_prob must be a number in \[0, 1\)"),
    ({"draft_head": 3}, "draft_head must be a directory path"),
    ({"shortlist": "yes"}, "shortlist='yes' must be true or false"),
])
def test_bad_options_are_named(options, match):
    with pytest.raises(SplitInferError, match=match):
        make_proposer("feature-draft", **options)


def test_cli_train_then_generate(tmp_path, capsys):
    out = tmp_path / "head"
    assert main(["draft-train", "--model", "tiny-random", "--out", str(out), "--tokens", "24", "--steps", "2",
                 "--batch", "8", "--hidden", "16", "--max-new-tokens", "8", "--prompt-chars", "30"]) == 0
    assert "held-out top-1 per depth" in capsys.readouterr().out
    rc = main(["generate", "--model", "tiny-random", "--max-new-tokens", "12", "--decoding", "feature-draft",
               "--draft-head", str(out), "--wire-dtype", "fp32", "--json", "ab ab ab ab"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["decoding"] == "feature-draft" and s["new_tokens"] == 12
    assert main(["generate", "--model", "tiny-random", "--decoding", "feature-draft", "--draft-head",
                 str(tmp_path / "none"), "x"]) == 2
    assert "no trained feature-draft head" in capsys.readouterr().err


def test_cli_trains_on_a_prompts_file_and_names_bad_ones(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "Write a haiku about the sea."}\n\n{"text": "List three primes."}\n')
    out = tmp_path / "head"
    assert main(["draft-train", "--model", "tiny-random", "--out", str(out), "--tokens", "24", "--steps", "2",
                 "--batch", "8", "--hidden", "16", "--max-new-tokens", "8", "--prompts-file", str(prompts)]) == 0
    info = json.loads((out / "feature_draft.json").read_text())
    assert info["prompt_source"] == "prompts file" and info["corpora"] == [] and info["corpus_split"] is None
    assert info["prompts"] >= 2
    capsys.readouterr()
    for text, match in [("not json\n", "line 1: not JSON"), ('{"text": ""}\n', 'non-empty "text"'),
                        ("\n", "holds no prompts")]:
        prompts.write_text(text)
        assert main(["draft-train", "--model", "tiny-random", "--out", str(out), "--tokens", "8",
                     "--prompts-file", str(prompts)]) == 2
        err = capsys.readouterr().err
        assert match in err and "Traceback" not in err
    assert main(["draft-train", "--model", "tiny-random", "--prompts-file", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read prompts file" in capsys.readouterr().err


@pytest.mark.real_model
def test_real_model_feature_draft_and_combined_with_it_are_exact(real_model_bi):
    """Default model (batch-invariant kernels), split 2,2, fp32 wire, one chat prompt, 48 tokens, logits equal
    bit for bit; needs `splitinfer draft-train` run once."""
    real_model = real_model_bi
    from splitinfer.decoding.feature_head import default_dir

    if not head_files(default_dir(real_model.sha256))[1].exists():
        pytest.skip("no trained feature-draft head for the default model (run `splitinfer draft-train`)")
    sm = SplitModel(real_model, "2,2", wire_dtype="fp32")
    ids = sm.encode_prompt("Write a Python function that checks whether a number is prime.", chat=True)
    ref = sm.generate(ids, 48, record_logits=True)
    for name, options in (("feature-draft", {}), ("combined", {"sources": WITH_HEAD})):
        res = sm.generate(ids, 48, record_logits=True, decoding=make_proposer(name, **options))
        check_same(res, ref, bitwise=True)
        assert len(res.steps) < len(ref.steps)
