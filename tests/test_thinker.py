"""Thinker parity with transformers' Qwen3-Omni thinker on both tiny variants (float32, CPU).

Tolerance: max|ours - ref| <= 1e-4 * max|ref| for every compared tensor.
"""

from __future__ import annotations

import pytest
import torch

from models.common.layers import DenseKVCache
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.model import load_weights
from models.qwen3_omni.thinker import Thinker, ThinkerText, merge_audio
from tests.reference_paths import text_positions

IM_START, IM_END, SYSTEM, USER, ASSISTANT, NL = 151644, 151645, 8948, 872, 77091, 198
AUDIO_START, AUDIO_END, AUDIO_PAD = 151669, 151670, 151675
REL_TOL = 1e-4


def chat(user: list[int], system: tuple[int, ...] = (2610, 525, 264, 10950, 17847, 13)) -> list[int]:
    """system + user turn + the assistant header, as the chat template writes it."""
    return [IM_START, SYSTEM, NL, *system, IM_END, NL, IM_START, USER, NL, *user, IM_END, NL, IM_START, ASSISTANT, NL]


def audio_span(n: int) -> list[int]:
    return [AUDIO_START, *[AUDIO_PAD] * n, AUDIO_END]


def check(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    print(f"{what}: max abs {err:.2e}, rel {err / scale:.2e}")
    assert ours.shape == ref.shape, what
    assert err <= REL_TOL * scale, f"{what}: max abs error {err:.3e} > {REL_TOL} * {scale:.3e}"


@pytest.fixture
def setup(hf_tiny):
    cfg = OmniConfig.from_file(hf_tiny.path)
    with torch.device("meta"):
        ours = Thinker(cfg.thinker)
    load_weights(ours, hf_tiny.path, prefix="thinker.")
    return ours.eval(), hf_tiny.model.thinker, cfg


def prefill(ours: ThinkerText, ids: torch.Tensor, cache=None, start: int = 0, capture: int | None = None):
    hidden, captured = ours(ours.embed(ids), text_positions(ids.shape[0], ids.shape[1], start), cache, capture)
    return ours.logits(hidden), captured


@torch.no_grad()
def test_prefill_logits(setup):
    ours, ref, _ = setup
    ids = torch.tensor([chat([9707, 11, 1246, 525, 498, 30])])
    assert ids.shape[1] == 25
    logits = prefill(ours, ids)[0]
    check(logits, ref(input_ids=ids).logits, "prefill logits")
    flat, _ = ours(ours.embed(ids), torch.arange(ids.shape[1])[None])  # [B, T] positions: plain 1-D rope
    check(ours.logits(flat), logits, "1-D positions vs mrope positions")


@torch.no_grad()
def test_cached_greedy_decode(setup):
    ours, ref, cfg = setup
    ids = torch.tensor([chat([40, 1079, 264, 8251])])
    accept = cfg.talker.accept_hidden_layer
    gen = ref.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
        return_dict_in_generate=True, output_logits=True, output_hidden_states=True,
    )
    cache = DenseKVCache(cfg.thinker.text.num_hidden_layers)
    logits, captured = prefill(ours, ids, cache, capture=accept)
    check(captured, gen.hidden_states[0][accept], "prefill captured hidden")
    tokens = []
    for step in range(3):
        check(logits[:, -1], gen.logits[step], f"decode step {step} logits")
        if step:
            check(captured, gen.hidden_states[step][accept], f"decode step {step} captured hidden")
        tok = logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(tok)
        logits, captured = prefill(ours, tok, cache, start=cache.length(), capture=accept)
    assert torch.equal(torch.cat(tokens, 1), gen.sequences[:, ids.shape[1] :])
    # the cached run also equals one full forward over the whole sequence
    full = ref(input_ids=gen.sequences).logits[:, -1]
    check(logits[:, -1], full, "decode vs full-sequence logits")


@torch.no_grad()
def test_captured_hidden_states(setup):
    ours, ref, cfg = setup
    ids = torch.tensor([chat([3838, 374, 279, 9104, 3351, 30])])
    states = ref(input_ids=ids, output_hidden_states=True).hidden_states
    layers = cfg.thinker.text.num_hidden_layers
    assert len(states) == layers + 1
    for k in range(layers + 1):
        check(prefill(ours, ids, capture=k)[1], states[k], f"hidden_states[{k}]")
    with pytest.raises(ValueError):
        prefill(ours, ids, capture=layers + 1)


@torch.no_grad()
def test_audio_prompt(setup):
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    ours, ref, cfg = setup
    frames = [237, 80]  # 2.37 s and 0.8 s of audio: two user turns with audio
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(len(frames), 128, max(frames), generator=g)
    mask = (torch.arange(max(frames))[None] < torch.tensor(frames)[:, None]).long()
    counts = [int(_get_feat_extract_output_lengths(torch.tensor(f))) for f in frames]
    assert counts == [int(ours.audio_tower.token_count(f)) for f in frames]
    user = [*audio_span(counts[0]), 3838, 374, 419, 30, IM_END, NL, IM_START, USER, NL, *audio_span(counts[1])]
    ids = torch.tensor([chat(user)])
    accept = cfg.talker.accept_hidden_layer
    out = ref(input_ids=ids, input_features=feats, feature_attention_mask=mask, output_hidden_states=True)

    ref_pos, ref_delta = ref.get_rope_index(ids, attention_mask=torch.ones_like(ids), audio_seqlens=mask.sum(1))
    assert torch.equal(text_positions(1, ids.shape[1]).float(), ref_pos) and ref_delta.abs().sum() == 0

    audio = ours.audio_tower(feats, mask.sum(1))
    embeds = ours.embed_prompt(ids, audio)
    check(embeds, out.hidden_states[0], "audio prompt embeddings")
    hidden, captured = ours(embeds, text_positions(1, ids.shape[1]), capture_layer=accept)
    check(ours.logits(hidden), out.logits, "audio prompt logits")
    check(captured, out.hidden_states[accept], "audio prompt captured hidden")
    with pytest.raises(ValueError, match="audio_pad"):
        merge_audio(ours.embed(ids), ids, audio[1:], cfg.thinker.audio_token_id)


@torch.no_grad()
def test_batch_equals_single(setup):
    ours, _, cfg = setup
    rows = [chat([9707, 11, 1246, 525]), chat([40, 1079, 264, 4268])]
    layers = cfg.thinker.text.num_hidden_layers
    accept = cfg.talker.accept_hidden_layer

    def run(ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cache, outs = DenseKVCache(layers), []
        logits, captured = prefill(ours, ids, cache, capture=accept)
        outs.append((logits, captured))
        for _ in range(2):
            tok = logits[:, -1].argmax(-1, keepdim=True)
            logits, captured = prefill(ours, tok, cache, start=cache.length(), capture=accept)
            outs.append((logits, captured))
        return outs

    batched = run(torch.tensor(rows))
    for b, row in enumerate(rows):
        for step, ((lg, cap), (blg, bcap)) in enumerate(zip(run(torch.tensor([row])), batched, strict=True)):
            check(blg[b : b + 1], lg, f"batch row {b} step {step} logits")
            check(bcap[b : b + 1], cap, f"batch row {b} step {step} captured")


@torch.no_grad()
def test_second_turn_reuses_cache(setup):
    ours, ref, cfg = setup
    turn1 = chat([9707, 11, 1246, 525])
    turn2 = [40, 1079, 264, 8251, IM_END, NL, IM_START, USER, NL, 3838, 374, IM_END, NL, IM_START, ASSISTANT, NL]
    cache = DenseKVCache(cfg.thinker.text.num_hidden_layers)
    prefill(ours, torch.tensor([turn1]), cache)
    logits, _ = prefill(ours, torch.tensor([turn2]), cache, start=len(turn1))
    full = ref(input_ids=torch.tensor([turn1 + turn2])).logits[:, len(turn1) :]
    check(logits, full, "second turn over cached first turn")


def test_text_positions():
    pos = text_positions(2, 3, start=torch.tensor([0, 5]))
    assert pos.shape == (3, 2, 3)
    assert pos[:, 1].tolist() == [[5, 6, 7]] * 3
    assert text_positions(1, 2, start=4)[:, 0].tolist() == [[4, 5]] * 3
