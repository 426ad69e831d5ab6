"""Token Recycling: the adjacency table from hand-made logits, the static and dynamic trees, exactness on the tiny model."""

import pytest
import torch

from splitinfer.client import SplitModel
from splitinfer.decoding.base import EMPTY, DecodingEnv, Draft, StepFeedback, make_proposer
from splitinfer.decoding.replay import replay, top_tokens_of
from splitinfer.decoding.token_recycling import AdjacencyTable, TokenRecycling, static_shape
from splitinfer.decoding.verify import top_tokens
from splitinfer.errors import SplitInferError
from tests.splitinfer.decoding.exact import check_same

V = 10


def logits_for(*rows: dict[int, float]) -> torch.Tensor:
    """(T, V) logits; each row puts the given logit on its tokens and -10 elsewhere."""
    out = torch.full((len(rows), V), -10.0)
    for i, row in enumerate(rows):
        for tok, v in row.items():
            out[i, tok] = v
    return out


def feedback(draft: Draft, sent: list[int], accepted: list[int], logits: torch.Tensor, k: int) -> StepFeedback:
    return StepFeedback(draft, [None] * len(draft), accepted, 0, None, sent, None, None, None, *top_tokens(logits, k))


def test_top_tokens_are_the_softmax_top_k():
    ids, probs = top_tokens(logits_for({3: 2.0, 5: 1.0}, {7: 0.0}), 2)
    assert ids[0].tolist() == [3, 5] and ids[1, 0] == 7
    assert probs[0, 0] > probs[0, 1] > 0 and abs(float(probs[1].sum()) - float(probs[1, :2].sum())) < 1e-6
    assert top_tokens(logits_for({1: 1.0}), 0) == (None, None)


def test_prefill_rows_fill_the_table_for_every_prompt_token():
    tr = TokenRecycling(k=2)
    tr.begin([4, 6], DecodingEnv(vocab_size=V))
    tr.update([4, 6], [1], feedback(EMPTY, [], [], logits_for({6: 3.0, 2: 1.0}, {1: 3.0, 8: 2.0}), 2))
    assert tr.table.get(4)[0] == (6, 2) and tr.table.get(6)[0] == (1, 8)
    assert tr.table.get(9) == ((), ())


def test_committed_learning_skips_rejected_nodes_and_all_learning_uses_them():
    # Context ends in 6; draft 1 -> 2 and a sibling 3; node 0 (token 1) accepted, nodes 1 and 2 rejected.
    draft = Draft((1, 2, 3), (-1, 0, -1))
    rows = logits_for({1: 5.0}, {5: 5.0, 4: 1.0}, {7: 5.0}, {8: 5.0})  # root, node 0, node 1, node 2
    committed, every = TokenRecycling(k=2), TokenRecycling(k=2, learn="all")
    for tr in (committed, every):
        tr.begin([6], DecodingEnv(vocab_size=V))
        tr.update([0, 6], [1, 5], feedback(draft, [0, 1, 2], [0], rows, 2))
    assert committed.table.get(6)[0][0] == 1 and committed.table.get(1)[0] == (5, 4)
    assert committed.table.get(2) == ((), ()) and committed.table.get(3) == ((), ())
    assert every.table.get(2)[0][0] == 7 and every.table.get(3)[0][0] == 8
    assert every.learns_from_rejected and not committed.learns_from_rejected


def test_unknown_rows_leave_the_table_alone():
    table = AdjacencyTable(2)
    table.update([3], torch.tensor([[4, 5]]), torch.tensor([[0.6, 0.3]]))
    table.update([3], torch.tensor([[-1, -1]]), torch.tensor([[0.0, 0.0]]))
    assert table.get(3) == ((4, 5), (pytest.approx(0.6), pytest.approx(0.3)))


def test_static_shape_goes_deepest_along_rank_zero():
    shape = static_shape(budget=6, k=3, max_depth=3)
    # rank-0 chain (1, 0.5^0...) first; then rank-1 children of the root and of the chain
    assert shape[:3] == [(-1, 0), (0, 0), (1, 0)]
    assert len(shape) == 6 and all(p < i for i, (p, _) in enumerate(shape))
    depth = []
    for p, _ in shape:
        depth.append(1 if p < 0 else depth[p] + 1)
    assert max(depth) == 3


def hand_table(tr: TokenRecycling) -> None:
    tr.table.rows = {1: ((2, 3), (0.7, 0.2)), 2: ((4, 1), (0.9, 0.05)), 3: ((5, 6), (0.5, 0.5)), 4: ((9, 2), (0.8, 0.1))}


def test_static_tree_is_filled_breadth_first_from_the_table():
    tr = TokenRecycling(k=2, draft_budget=5, max_depth=3)
    tr.begin([0], DecodingEnv(vocab_size=V, eos_ids=frozenset({4})))
    hand_table(tr)
    d = tr.propose([0, 1])
    # shape: (root r0) 2, (2 r0) 4, (root r1) 3, (4 r0) EOS: not expanded, so dropped; (2 r1) 1 ...
    assert d.tokens[:3] == (2, 4, 3) and d.parents[:3] == (-1, 0, -1)
    assert 9 not in d.tokens  # 4 is EOS: nothing drafted below it
    assert tr.propose([0, 7]) == EMPTY  # no table row for 7 yet


def test_dynamic_tree_is_best_first_by_path_probability():
    tr = TokenRecycling(k=2, draft_budget=4, tree="dynamic", min_prob=0.1)
    tr.begin([0], DecodingEnv(vocab_size=V))
    hand_table(tr)
    d = tr.propose([0, 1])
    assert d.tokens == (2, 4, 9, 3)  # 0.7, 0.63, 0.504, 0.2
    assert d.parents == (-1, 0, 1, -1)
    cands = tr.candidates([0, 1])
    assert cands[0].tokens == (2, 4, 9) and cands[0].source == "token-recycling"


def test_two_token_keys_learn_pairs_and_draft_from_them_falling_back_to_one_token_rows():
    tr = TokenRecycling(k=2, key=2, draft_budget=3)
    tr.begin([4, 6], DecodingEnv(vocab_size=V))
    tr.update([4, 6], [1], feedback(EMPTY, [], [], logits_for({6: 3.0, 2: 1.0}, {1: 3.0, 8: 2.0}), 2))
    assert tr.pairs.get((4, 6))[0] == (1, 8) and tr.table.get(6)[0] == (1, 8) and len(tr.pairs) == 1
    # Context ... 5, 6 then draft 1 -> 2: node 0 accepted; the pair rows are (5, 6) for the root, (6, 1) for node 0
    draft = Draft((1, 2), (-1, 0))
    tr.update([5, 6], [1, 7], feedback(draft, [0, 1], [0], logits_for({1: 5.0}, {7: 5.0, 3: 1.0}, {9: 5.0}), 2))
    assert tr.pairs.get((5, 6))[0][0] == 1 and tr.pairs.get((6, 1))[0] == (7, 3) and tr.pairs.get((1, 2)) == ((), ())
    tr.pairs.rows[(6, 1)] = ((3,), (0.9,))  # after (6, 1) the pair says 3; after 1 alone the table says 7
    assert tr.propose([6, 1]).tokens[0] == 3 and tr.propose([0, 1]).tokens[0] == 7
    tr.table.rows[3] = ((2,), (0.8,))
    tr.pairs.rows[(1, 3)] = ((5,), (0.8,))
    d = tr.propose([6, 1])  # below the drafted 3 the pair (1, 3) is used: its parent token is the context's 1
    assert d.tokens[:2] == (3, 5) and d.parents[:2] == (-1, 0)


def test_bad_options_are_one_line_errors():
    for bad in ({"tree": "bushy"}, {"learn": "some"}, {"k": 0}, {"min_prob": 1.5}, {"key": 3}):
        with pytest.raises(SplitInferError):
            make_proposer("token-recycling", **bad)


@pytest.fixture(scope="module")
def sm(tiny):
    return SplitModel(tiny, "2,2", wire_dtype="fp32")


PROMPT = "def f(x):\n    return x\ndef g(x):\n    return x\ndef h(x):\n    return"


@pytest.mark.parametrize("learn,key", [("committed", 1), ("all", 1), ("committed", 2)])
def test_table_carries_over_and_stays_exact_with_eos_inside_drafts(sm, tiny, monkeypatch, learn, key):
    ids = sm.encode_prompt(PROMPT)
    full = sm.generate(ids, 40, stop_on_eos=False).token_ids
    tr = TokenRecycling(k=4, draft_budget=16, learn=learn, key=key)
    warm = sm.generate(ids, 40, stop_on_eos=False, decoding=tr)  # hot start: the table now knows the output
    assert warm.token_ids == full and len(tr.table) > 0
    monkeypatch.setattr(tiny.model.generation_config, "eos_token_id", full[9])
    ref = sm.generate(ids, 40, record_logits=True)
    res = sm.generate(ids, 40, record_logits=True, decoding=tr)
    check_same(res, ref)
    assert len(res.steps) < len(ref.steps)  # the recycled candidates were accepted, EOS among them


@pytest.mark.parametrize("key", [1, 2])
def test_replay_with_the_models_top_tokens_matches_the_real_run(sm, tiny, key):
    ids = sm.encode_prompt(PROMPT)
    real_tr, replay_tr = TokenRecycling(k=4, key=key), TokenRecycling(k=4, key=key)
    res = sm.generate(ids, 40, stop_on_eos=False, decoding=real_tr)
    topk = top_tokens_of(tiny.model, ids, res.token_ids, 4)
    env = DecodingEnv(vocab_size=int(tiny.model.config.vocab_size), max_new_tokens=40)
    steps = replay(replay_tr, ids, res.token_ids, 40, env, topk=topk)
    assert [s.tokens_committed for s in steps] == [s.tokens_committed for s in res.steps]
    ids_of = lambda tr: {tok: row[0] for tok, row in tr.table.rows.items()}  # noqa: E731
    assert ids_of(real_tr) == ids_of(replay_tr)  # committed rows only: the same table


def test_combined_with_token_recycling_is_exact(sm):
    for prompt in (PROMPT, "the cat sat on the mat. the cat sat on the mat. the cat"):
        ref = sm.generate(prompt, 40, record_logits=True, stop_on_eos=False)
        res = sm.generate(prompt, 40, record_logits=True, stop_on_eos=False, decoding="combined",
                          decoding_options={"sources": "suffix,prompt-lookup,ngram-pool,token-recycling"})
        check_same(res, ref)
