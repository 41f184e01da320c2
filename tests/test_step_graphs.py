"""The fixed-shape decode steps (what CUDA graphs capture), run eagerly on CPU with the tiny model:
they equal the variable-shape path, and padding a batch to its bucket changes no row's output."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.common.frame_stage import FrameStage
from models.common.frame_step import FrameStep
from models.common.rows import Rows
from models.qwen3_omni.forward import ThinkerDecode
from models.qwen3_omni.model import load_model
from pipelines import kv_views
from pipelines.graphs import GraphRunner, Input, bucket_for
from pipelines.kv_cache import KVLayout, PagedKVCache
from pipelines.paged_attention import paged_decode_attention
from pipelines.sampling import Sampler, SamplingParams, sampling_rows
from tests.batch_kv import BatchKV

LENGTHS = [5, 17, 1, 33, 9]  # cached tokens per row, across block boundaries
SAMPLED = SamplingParams(temperature=0.9, top_k=7, top_p=0.8, repetition_penalty=1.05, seed=3)


@pytest.fixture(scope="module")
def model():
    return load_model("tiny")


def prefilled(model, text_cfg, embed, lengths: list[int]) -> tuple[PagedKVCache, int, list[str]]:
    """A paged cache holding real prefills of random inputs, one sequence per length."""
    cache = PagedKVCache(KVLayout(text_cfg.num_hidden_layers, text_cfg.num_key_value_heads, text_cfg.head_dim, 64, 4))
    keys = []
    for i, n in enumerate(lengths):
        key = f"s{i}"
        cache.reserve(key, n)
        view = BatchKV(cache, [(key, n)])
        with torch.inference_mode():
            embed(torch.randn(1, n, text_cfg.hidden_size, generator=torch.Generator().manual_seed(i)), view)
        cache.commit(key, n)
        cache.reserve(key, 1)
        keys.append(key)
    return cache, cache.scratch_slot, keys


def reference_decode(stack, cache: PagedKVCache, keys: list[str], x: torch.Tensor) -> torch.Tensor:
    view = BatchKV(cache, [(k, 1) for k in keys])
    out = stack(x, view.positions, view)
    return out[0] if isinstance(out, tuple) else out


def test_paged_decode_attention_matches_dense_attention():
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(40, 2, 8, generator=g), torch.randn(40, 2, 8, generator=g)
    table = torch.tensor([[3, 7, 1, 0], [9, 2, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([11, 5], dtype=torch.int32)
    q = torch.randn(2, 4, 8, generator=g)
    out = paged_decode_attention(q, *cache, table, lens, 0.3, 4)
    for r in range(2):
        slots = torch.cat([torch.arange(b * 4, b * 4 + 4) for b in table[r].tolist()])[: lens[r]]
        k, v = cache[0][slots], cache[1][slots]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[r][:, None], k.transpose(0, 1), v.transpose(0, 1), scale=0.3, enable_gqa=True)
        torch.testing.assert_close(out[r], ref[:, 0], rtol=1e-5, atol=1e-5)


def test_thinker_decode_equals_the_variable_shape_path_and_padding_changes_nothing(model):
    text = model.cfg.thinker.text
    cache, scratch, keys = prefilled(model, text, lambda x, kv: model.thinker(x, kv.positions, kv), LENGTHS)
    x = torch.randn(len(keys), 1, text.hidden_size, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        ref_hidden = reference_decode(model.thinker, cache, keys, x)
        ref_logits = model.thinker.logits(ref_hidden[:, -1])
        ref_ids = Sampler.of([SAMPLED] * len(keys), "cpu")(ref_logits, torch.full((len(keys),), 4))
    for k in keys:  # the reference wrote the new token's K/V; the step writes the same slots again
        assert cache.length(k) == LENGTHS[keys.index(k)]
    step = ThinkerDecode(model, cache, text.vocab_size)
    width = 16
    runner = GraphRunner("thinker", step, step.inputs(torch.float32, width, scratch), "cpu", (1, 2, 8))

    def run(rows_idx: list[int]) -> dict:
        ks = [keys[i] for i in rows_idx]
        rows = kv_views.rows(cache, ks, width) | {
            "x": x[rows_idx], "step": [4] * len(ks), "no_eos": [False] * len(ks),
            **sampling_rows("s", [SAMPLED] * len(ks))}
        with torch.inference_mode():
            return runner(len(ks), rows)

    together = run(list(range(len(keys))))  # 5 rows padded to 8
    assert bucket_for(len(keys), runner.buckets) == 8
    assert together["ids"].tolist() == ref_ids.tolist()
    torch.testing.assert_close(together["embeds"], model.thinker.embed(ref_ids))
    for i in range(len(keys)):
        alone = run([i])
        assert alone["ids"].tolist() == [together["ids"][i].item()]
        torch.testing.assert_close(alone["projected"][0], together["projected"][i], rtol=1e-5, atol=1e-5)
    cache.check()


def test_talker_frame_equals_the_variable_shape_path_and_padding_changes_nothing(model):
    text = model.cfg.talker.text
    talker = model.talker
    cache, scratch, keys = prefilled(model, text, lambda x, kv: talker(x, kv.positions, kv), LENGTHS[:3])
    n, vocab, eos = len(keys), text.vocab_size, model.cfg.talker.codec_eos_id
    x = torch.randn(n, 1, text.hidden_size, generator=torch.Generator().manual_seed(5))
    suppress = torch.zeros(vocab, dtype=torch.bool)
    suppress[vocab - 1024 :] = True
    suppress[eos] = False
    seen = torch.zeros(n + 1, vocab, dtype=torch.bool)
    seen[0, 5] = seen[2, 9] = True
    predictor = SamplingParams(top_k=5, top_p=0.8, seed=1)
    frames = torch.tensor([2, 0, 7])
    with torch.inference_mode():
        last = reference_decode(talker, cache, keys, x)[:, -1]
        code0 = Sampler.of([SAMPLED] * n, "cpu")(talker.codec_logits(last), frames, seen[:n].clone(), suppress)
        pred = Sampler.of([predictor] * n, "cpu")
        ref = talker.next_frame(last, code0, lambda lg, s: pred(lg, frames * 16 + s))
    step = FrameStep(model.talker, cache, seen, suppress, eos)
    width = 16
    runner = GraphRunner("talker", step, step.inputs(torch.float32, width, scratch, n), "cpu", (1, 4))
    before = seen.clone()

    def run(idx: list[int]) -> dict:
        seen.copy_(before)
        rows = kv_views.rows(cache, [keys[i] for i in idx], width) | {
            "x": x[idx], "frame": frames[idx], "slot": idx, "no_eos": [False] * len(idx),
            **sampling_rows("t", [SAMPLED] * len(idx)), **sampling_rows("p", [predictor] * len(idx))}
        with torch.inference_mode():
            return runner(len(idx), rows)

    together = run([0, 1, 2])
    assert together["codes"].tolist() == ref.codes.tolist()
    torch.testing.assert_close(together["embed_sum"], ref.embed_sum, rtol=1e-5, atol=1e-5)
    assert all(seen[i, ref.codes[i, 0]] for i in range(n))  # each stream's penalty state gained its code
    for i in range(n):
        alone = run([i])
        assert alone["codes"].tolist() == [together["codes"][i].tolist()]
    cache.check()


def test_packed_inputs_take_each_calls_rows_and_pad_the_rest():
    """The host inputs travel in one packed copy from alternating staging buffers: every call's buffers hold
    exactly its rows and the padding, whatever an earlier call left in either staging buffer; a device-fed input
    gets its own copy and padding; an input left out is an error, not a stale row."""
    spec = {"ids": Input((2,), torch.long, -1), "table": Input((3,), torch.int32, 7),
            "flag": Input((), torch.bool, True), "temp": Input((), torch.float32, 1.0),
            "bf": Input((2,), torch.bfloat16, 0.5), "x": Input((4,), torch.float32, 0.0, on_device=True)}
    seen: list[dict[str, torch.Tensor]] = []
    runner = GraphRunner("packed", lambda b: seen.append({k: v.clone() for k, v in b.items()}) or {"y": b["x"]},
                         spec, torch.device("cpu"), buckets=(4, 8))
    g = torch.Generator().manual_seed(0)
    for n in (7, 3, 1, 4, 2):  # shrinking within a bucket: stale rows would show in the padding
        rows = {"ids": torch.randint(0, 99, (n, 2), generator=g).numpy(),
                "table": torch.randint(0, 99, (n, 3), generator=g).tolist(),
                "flag": [bool(i % 2) for i in range(n)], "temp": torch.rand(n, generator=g).bfloat16(),
                "bf": torch.randn(n, 2, generator=g).bfloat16(), "x": torch.randn(n, 4, generator=g)}
        runner(n, rows)
        got, b = seen[-1], bucket_for(n, (4, 8))
        for k, s in spec.items():
            want = torch.as_tensor(np.asarray(rows[k])) if not isinstance(rows[k], torch.Tensor) else rows[k]
            assert torch.equal(got[k][:n], want.to(s.dtype).reshape(got[k][:n].shape)), (n, k)
            assert torch.equal(got[k][n:b], torch.full_like(got[k][n:b], s.pad)), (n, k)
    with pytest.raises(ValueError, match=r"no values for input\(s\) \['temp'\]"):
        runner(1, {k: v[:1] for k, v in rows.items() if k != "temp"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_packed_inputs_survive_calls_issued_ahead_of_the_gpu():
    """With the GPU kept busy between calls, the host runs many calls ahead of it: a staging buffer is refilled
    only after the copy that read it ran, so every call's output holds its own rows (graphs on)."""
    runner = GraphRunner("ahead", lambda b: {"y": b["v"] * 1}, {"v": Input((4096,), torch.long, -1)},
                         torch.device("cuda"), buckets=(2, 4), graphs=True)
    runner.capture()
    outs, want = [], []
    for i in range(40):
        n = 1 + i % 4
        rows = np.arange(n * 4096).reshape(n, 4096) + i * 1_000_000
        torch.cuda._sleep(2_000_000)  # about a millisecond of GPU work ahead of each copy
        outs.append(runner(n, {"v": rows})["y"])
        want.append(rows)
    torch.cuda.synchronize()
    for i, (out, rows) in enumerate(zip(outs, want, strict=True)):
        assert np.array_equal(out.cpu().numpy(), rows), f"call {i} read another call's rows"


def test_a_call_costs_a_few_torch_calls_however_many_host_inputs():
    """Each torch call lets the GIL go (a busy sockets' thread may keep it): 18 host inputs and a device-fed one
    take one packed copy, the device input's copy and padding, and the output's clone, not calls per input."""
    spec = {f"i{k}": Input((), torch.float32, 0.0) for k in range(16)} | {
        "table": Input((8,), torch.int32, 0), "flag": Input((), torch.bool, False),
        "x": Input((1, 4), torch.float32, on_device=True)}
    runner = GraphRunner("few", lambda b: {"y": b["x"][:, 0, 0] + b["i0"]}, spec, torch.device("cpu"))
    rows = {f"i{k}": np.ones(5, np.float32) for k in range(16)} | {
        "table": np.zeros((5, 8), np.int32), "flag": [True] * 5, "x": torch.ones(5, 1, 4)}
    calls: list[str] = []

    def count(frame, event, arg):
        if event == "c_call" and (getattr(arg, "__module__", None) or "").startswith("torch") or \
                event == "c_call" and isinstance(getattr(arg, "__self__", None), torch.Tensor):
            calls.append(getattr(arg, "__qualname__", repr(arg)))

    runner(5, rows), runner(5, rows)  # the two staging buffers are made at their first use
    runner.step = lambda b, step=runner.step: (sys.setprofile(None), step(b), sys.setprofile(count))[1]
    sys.setprofile(count)
    try:
        out = runner(5, rows)
    finally:
        sys.setprofile(None)
    assert torch.equal(out["y"], torch.full((5,), 2.0))
    assert len(calls) <= 5, calls


class AtenCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def test_the_talkers_next_inputs_cost_the_same_ops_for_any_number_of_rows():
    """Each row's next input is its frame's codec part plus its text row: FrameStage adds them for all rows in one
    op (each op lets the GIL go), so 24 rows take the ops 2 do, and each row gets its own sum. A work whose text is
    not known yet keeps its codec part."""
    ops = {}
    for n in (2, 24):
        g = torch.Generator().manual_seed(n)
        works = [SimpleNamespace(next=(torch.randn(8, generator=g), torch.randn(8, generator=g)), inputs=Rows())
                 for _ in range(n)]
        waiting = SimpleNamespace(next_embed=torch.randn(8, generator=g), next=None, inputs=Rows())
        sums = [w.next[0] + w.next[1] for w in works]
        with AtenCount() as count:
            x = FrameStage._join([*works, waiting])
        ops[n] = count.n
        for w, s in zip(works, sums, strict=True):
            assert w.inputs.n == 1 and torch.equal(w.inputs.all(), s[None])
            assert w.next is None
        assert x is None  # not every row was joined: the step's input is cut from each row's inputs
        assert waiting.inputs.n == 0 and waiting.next_embed is not None
        assert torch.equal(FrameStage._join([SimpleNamespace(next=(sums[0], sums[1]), inputs=Rows())]),
                           (sums[0] + sums[1])[None])  # every row joined: the sums are the step's input
    assert ops[2] == ops[24] <= 6, ops
