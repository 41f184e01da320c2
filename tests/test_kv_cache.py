import numpy as np
import pytest
import torch

from models.common.layers import attention
from pipelines import kv_views
from pipelines.kv_cache import KVLayout, OutOfBlocks, PagedKVCache
from tests.batch_kv import BatchKV


def layout(blocks=8, bs=4):
    return KVLayout(num_layers=2, kv_heads=2, head_dim=8, num_blocks=blocks, block_size=bs)


def test_reserve_commit_truncate_release_keep_accounting():
    c = PagedKVCache(layout())
    c.reserve("a", 5)
    c.commit("a", 5)
    assert len(c.seqs["a"].blocks) == 2 and c.num_free == 6
    c.reserve("b", 9)
    c.commit("b", 9)
    assert c.num_free == 3
    c.check()
    c.truncate("b", 4)
    assert c.length("b") == 4 and len(c.seqs["b"].blocks) == 1 and c.num_free == 5
    c.check()
    with pytest.raises(OutOfBlocks):
        c.reserve("c", 4 * 6)
    assert not c.has("c") and c.num_free == 5  # a failed reserve allocates nothing
    c.release("a")
    c.release("b")
    assert c.num_free == 8
    c.check()


def test_commit_past_reservation_is_refused_and_check_catches_corruption():
    c = PagedKVCache(layout())
    c.reserve("a", 3)
    with pytest.raises(RuntimeError):
        c.commit("a", 5)
    c.seqs["a"].blocks.append(c.seqs["a"].blocks[0])  # a block owned twice
    with pytest.raises(AssertionError):
        c.check()


def test_batched_paged_attention_equals_dense_per_row():
    torch.manual_seed(0)
    c = PagedKVCache(layout(blocks=16, bs=3))
    heads, kvh, d = 4, 2, 8
    # two sequences with different histories, written in several steps (prefill of different lengths, decode)
    history = {"a": 7, "b": 2}
    full = {s: (torch.randn(1, n + 3, kvh, d), torch.randn(1, n + 3, kvh, d)) for s, n in history.items()}
    for s, n in history.items():
        c.reserve(s, n)
        view = BatchKV(c, [(s, n)])
        k, v = full[s][0][:, :n], full[s][1][:, :n]
        view.attend(0, torch.randn(1, n, heads, d), k, v, 0.3)
        c.commit(s, n)
    # now one batched step: a gets 3 new tokens, b gets 1 (padded batch)
    news = {"a": 3, "b": 1}
    q = torch.randn(2, 3, heads, d)
    k = torch.zeros(2, 3, kvh, d)
    v = torch.zeros(2, 3, kvh, d)
    for r, (s, n) in enumerate(news.items()):
        p = history[s]
        k[r, :n], v[r, :n] = full[s][0][0, p : p + n], full[s][1][0, p : p + n]
        c.reserve(s, n)
    view = BatchKV(c, list(news.items()))
    out = view.attend(0, q, k, v, 0.3)
    for r, (s, n) in enumerate(news.items()):
        p = history[s]
        ref = attention(q[r : r + 1, :n], full[s][0][:, : p + n], full[s][1][:, : p + n], 0.3, past=p)
        torch.testing.assert_close(out[r : r + 1, :n], ref, rtol=1e-5, atol=1e-6)
    assert view.positions[0].tolist() == [7, 8, 9] and view.positions[1, 0].item() == 2
    c.check()


def test_step_rows_name_each_tokens_slot_and_refuse_an_unreserved_token():
    """kv_views.prefill_rows (and rows, its one-token form that every decode step builds) in array operations:
    each row's real tokens write where PagedKVCache.slots puts them, padding tokens to the scratch slot; tables,
    positions and lengths per row; lengths at, before and after block boundaries, rows in any order."""
    cache = PagedKVCache(KVLayout(num_layers=1, kv_heads=1, head_dim=4, num_blocks=64, block_size=4))
    lengths = {"a": 0, "b": 3, "c": 4, "d": 5, "e": 15, "f": 16}
    for key, n in lengths.items():
        cache.reserve(key, n + 6)
        cache.commit(key, n)
    order = ["f", "a", "d", "c", "e", "b"]
    for new, tokens in (([1] * 6, 1), ([6, 1, 4, 5, 0, 3], 8)):
        got = (kv_views.rows(cache, order, 7) if tokens == 1
               else kv_views.prefill_rows(cache, list(zip(order, new, strict=True)), tokens, 7))
        assert (got["block_table"].dtype, got["write_slots"].dtype) == (np.int32, np.int64)
        for r, (key, n) in enumerate(zip(order, new, strict=True)):
            length, blocks = lengths[key], cache.seqs[key].blocks
            assert list(got["write_slots"][r, :n]) == cache.slots(key, length, length + n).tolist(), key
            assert (got["write_slots"][r, n:] == cache.scratch_slot).all(), key
            assert list(got["positions"][r]) == list(range(length, length + tokens))
            assert list(got["block_table"][r]) == blocks + [0] * (7 - len(blocks))
            assert got["seq_lens"][r] == length + n
        if tokens > 1:  # PrefillKV.pad: the padding tokens, row by row (MoE routes them to no expert)
            view = kv_views.PrefillKV(cache, {k: torch.as_tensor(v) for k, v in got.items()})
            assert view.pad.tolist() == [t >= n for n in new for t in range(tokens)]
    assert {k: v.shape for k, v in kv_views.rows(cache, [], 6).items()} == {
        "positions": (0, 1), "write_slots": (0, 1), "block_table": (0, 6), "seq_lens": (0,)}
    cache.reserve("g", 4)
    cache.commit("g", 4)  # its fifth token would need a block not reserved
    with pytest.raises(ValueError, match="g: 1 new tokens after 4 need reserved blocks"):
        kv_views.rows(cache, ["a", "g"], 6)
    with pytest.raises(ValueError, match="f: 1 new tokens after 16"):
        kv_views.rows(cache, ["f"], 5)  # six blocks in a table of five
    with pytest.raises(ValueError, match="b: 9 new tokens"):
        kv_views.prefill_rows(cache, [("b", 9)], 8, 7)  # more than the step's tokens
