import pytest
import torch

from splitinfer.decoding.tree import ancestor_matrix, chain_parents, depths, path_to, validate_parents
from splitinfer.errors import SplitInferError
from splitinfer.kv_cache import PartKVCache, attention_mask


def filled(n):
    c = PartKVCache()
    k = torch.arange(n, dtype=torch.float32).view(1, 1, n, 1)
    c.update(k, k + 100, layer_idx=3)
    c.append_positions(torch.arange(n))
    return c


def test_update_concatenates_per_layer():
    c = filled(3)
    k, v = c.update(torch.full((1, 1, 2, 1), 7.0), torch.full((1, 1, 2, 1), 8.0), layer_idx=3)
    assert k.shape == (1, 1, 5, 1) and v[0, 0, -1, 0] == 8.0


def test_crop_and_keep():
    c = filled(6)
    c.keep(3, [1, 2])  # keep 0,1,2 and new entries 4,5
    assert c.keys[3].flatten().tolist() == [0, 1, 2, 4, 5]
    assert c.positions.tolist() == [0, 1, 2, 4, 5]
    c.crop(2)
    assert len(c) == 2 and c.values[3].flatten().tolist() == [100, 101]
    with pytest.raises(SplitInferError):
        c.crop(5)
    with pytest.raises(SplitInferError):
        c.keep(1, [3])


def test_keep_chain_prefix_is_crop():
    c = filled(5)
    c.keep(2, [0, 1])
    assert c.positions.tolist() == [0, 1, 2, 3]


def test_masks_causal_tree_sliding():
    assert attention_mask(torch.arange(0), torch.arange(4), None, None) is None  # prefill: sdpa causal
    assert attention_mask(torch.arange(4), torch.tensor([4]), None, None) is None  # one-token decode
    m = attention_mask(torch.arange(2), torch.tensor([2, 3]), None, None)[0, 0]
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]
    parents = [-1, 0, 0, 2]
    m = attention_mask(torch.arange(1), torch.tensor([1, 2, 2, 3]), parents, None)[0, 0]
    assert m.tolist() == [
        [True, True, False, False, False],
        [True, True, True, False, False],
        [True, True, False, True, False],
        [True, True, False, True, True],
    ]
    m = attention_mask(torch.arange(4), torch.tensor([4]), None, 2)[0, 0]
    assert m.tolist() == [[False, False, False, True, True]]


def test_tree_helpers():
    parents = [-1, 0, 0, 2, -1]
    validate_parents(parents, 5)
    assert depths(parents) == [0, 1, 1, 2, 0]
    assert path_to(parents, 3) == [0, 2, 3]
    assert ancestor_matrix(parents)[3].tolist() == [True, False, True, True, False]
    assert chain_parents(3) == [-1, 0, 1]
    for bad in ([0], [-1, 1], [-2], [-1, "0"]):
        with pytest.raises(SplitInferError):
            validate_parents(bad)
    with pytest.raises(SplitInferError, match="entries for"):
        validate_parents([-1], 2)
