import torch

from splitinfer.replay_log import ReplayLog


def rows(start: int, n: int) -> torch.Tensor:
    """(1, n, 2) hidden states whose first feature is the position: replayed rows say where they came from."""
    return torch.stack([torch.arange(start, start + n, dtype=torch.float32), torch.zeros(n)], dim=-1)[None]


def positions_of(log: ReplayLog) -> list[float]:
    return [float(x) for h, _ in log.replay_chunks(1 << 20) for x in h[0, :, 0]]


def test_sequential_forwards_commit_every_row_and_replay_in_chunks():
    log = ReplayLog()
    for start, n in ((0, 5), (5, 1), (6, 1)):
        log.before_forward(None)
        log.after_forward(rows(start, n), list(range(start, start + n)), None)
    log.before_forward(None)  # the next step resolves the last forward: everything stays
    assert log.length == 7 and log.n_pending == 0 and log.broken is None
    chunks = log.replay_chunks(max_bytes=3 * 2 * 4)  # three fp32 rows of d=2 per chunk
    assert [p for _, p in chunks] == [[0, 1, 2], [3, 4, 5], [6]]
    assert positions_of(log) == [0, 1, 2, 3, 4, 5, 6] and log.nbytes() == 7 * 2 * 4


def test_a_tree_keeps_one_accepted_path_and_crop_mirrors_the_cache():
    log = ReplayLog()
    log.before_forward(None)
    log.after_forward(rows(0, 3), [0, 1, 2], None)
    log.before_forward(None)
    # a draft tree after the 3 committed rows: root 3, children 4 and 5 of the root, 6 under 5
    parents = [-1, 0, 0, 2]
    tree = rows(3, 4)
    log.after_forward(tree, [3, 4, 4, 5], parents)
    log.before_forward({"prefix": 3, "accepted": [0, 2, 3]})  # root -> node 2 -> node 3: one path
    assert log.broken is None and log.length == 6
    assert positions_of(log) == [0, 1, 2, 3, 5, 6]  # node 1 (the rejected sibling) is gone
    log.crop(4)
    assert log.length == 4 and positions_of(log) == [0, 1, 2, 3]


def test_edits_that_are_not_a_replayable_chain_break_the_log_with_the_reason():
    log = ReplayLog()
    log.before_forward(None)
    log.after_forward(rows(0, 2), [0, 1], None)
    log.before_forward(None)
    log.after_forward(rows(2, 3), [2, 3, 3], [-1, 0, 0])
    log.before_forward({"prefix": 2, "accepted": [1, 2]})  # two siblings: not one path
    assert "not one root-to-node path" in log.broken
    log = ReplayLog()
    log.after_forward(rows(0, 1), [0], None)
    log.after_forward(rows(1, 1), [1], None)  # the first forward was never resolved
    assert "without resolving the previous one" in log.broken
    log = ReplayLog()
    log.after_forward(rows(0, 2), [5, 6], None)
    assert "do not continue the 0 committed rows" in log.broken
    log.reset()
    assert log.broken is None and log.length == 0 and log.replay_chunks(100) == []
    log.crop(3)
    assert "crop to 3 is out of range" in log.broken
