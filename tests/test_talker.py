"""Talker, code predictor and talker prompt vs transformers' Qwen3-Omni (float32, CPU, tiny random models)."""

from __future__ import annotations

from pathlib import Path

import torch

from models.common.layers import DenseKVCache
from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.model import load_weights
from models.qwen3_omni.talker import Talker
from models.qwen3_omni.talker_prompt import tts_embeds, tts_token_ids
from tests.conftest import HFTiny
from tests.reference_paths import build_prompt, next_input

REL_TOL = 1e-4


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    err = (ours - ref).abs().max() / ref.abs().max()
    return float(err)


def check(name: str, ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != {tuple(ref.shape)}"
    err = rel_err(ours, ref)
    print(f"{name}: max abs {float((ours - ref).abs().max()):.2e}, rel {err:.2e}")
    assert err <= REL_TOL, f"{name}: relative error {err:.2e}"


def load_talker(path: Path) -> Talker:
    cfg = OmniConfig.from_file(path)
    with torch.device("meta"):
        talker = Talker(cfg.talker)
    load_weights(talker, path, prefix="talker.")
    return talker.eval()


@torch.no_grad()
def test_talker_prefill_and_cached_decode(hf_tiny: HFTiny) -> None:
    from transformers import DynamicCache

    ref, ours = hf_tiny.model.talker, load_talker(hf_tiny.path)
    g = torch.Generator().manual_seed(1)
    b, t, h = 2, 7, ours.cfg.text.hidden_size
    steps = [torch.randn(b, t, h, generator=g)] + [torch.randn(b, 1, h, generator=g) for _ in range(3)]

    ref.rope_deltas = None
    ref_cache, cache, past = DynamicCache(config=ref.config.text_config), DenseKVCache(len(ours.model.layers)), 0
    for i, x in enumerate(steps):
        # generation_step only feeds the reference's bookkeeping; it fails on a 1-token input without one.
        out = ref(inputs_embeds=x, cache=ref_cache, use_cache=True, output_hidden_states=True, generation_step=0)
        positions = torch.arange(past, past + x.shape[1]).expand(b, -1)
        hidden = ours(x, positions, cache)
        check(f"[{hf_tiny.variant}] talker step {i} hidden", hidden, out.hidden_states[0][-1])
        check(f"[{hf_tiny.variant}] talker step {i} logits", ours.codec_logits(hidden), out.logits)
        past += x.shape[1]
    mrope = ours(steps[0], torch.arange(t).expand(3, b, -1), None)
    assert torch.allclose(mrope, ours(steps[0], torch.arange(t).expand(b, -1), None), atol=1e-6)


@torch.no_grad()
def test_code_predictor_all_steps_greedy(hf_tiny: HFTiny) -> None:
    ref, ours = hf_tiny.model.talker.code_predictor, load_talker(hf_tiny.path).code_predictor
    g = torch.Generator().manual_seed(2)
    b, h = 3, ours.cfg.hidden_size
    talker_hidden, code0_embed = torch.randn(b, h, generator=g), torch.randn(b, h, generator=g)

    got = ours.predict(talker_hidden, code0_embed)
    want = ref.generate(
        inputs_embeds=torch.stack((talker_hidden, code0_embed), dim=1), max_new_tokens=ours.num_steps,
        do_sample=False, output_logits=True, return_dict_in_generate=True,
    )
    assert torch.equal(got.codes, want.sequences), "greedy codes differ"
    for step, ref_logits in enumerate(want.logits):
        check(f"[{hf_tiny.variant}] predictor step {step} logits", got.logits[:, step], ref_logits)
    embeds = [ref.model.codec_embedding[i](want.sequences[:, i]) for i in range(ours.num_steps)]
    check(f"[{hf_tiny.variant}] predictor embed sum", got.embed_sum, torch.stack(embeds).sum(0))


@torch.no_grad()
def test_code_predictor_uses_sampler(hf_tiny: HFTiny) -> None:
    predictor = load_talker(hf_tiny.path).code_predictor
    seen: list[int] = []

    def sampler(logits: torch.Tensor, step: int) -> torch.Tensor:
        seen.append(step)
        return torch.full(logits.shape[:1], 7 * step + 1, dtype=torch.long)

    h = predictor.cfg.hidden_size
    out = predictor.predict(torch.randn(2, h), torch.randn(2, h), sampler)
    assert seen == list(range(predictor.num_steps))
    assert out.codes.tolist() == [[7 * s + 1 for s in range(predictor.num_steps)]] * 2
    greedy = predictor.predict(torch.randn(2, h), torch.randn(2, h))
    assert not torch.equal(out.codes, greedy.codes)


def audio_prompt(cfg: OmniConfig, frames: int) -> torch.Tensor:
    """system, then a user turn of audio and text, then the assistant header."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    n = int(_get_feat_extract_output_lengths(torch.tensor(frames), cfg.thinker.audio.n_window))
    im_start, im_end, nl = cfg.im_start_token_id, cfg.im_end_token_id, 198
    th = cfg.thinker
    ids = [im_start, cfg.system_token_id, nl, 100, 200, im_end, nl, im_start, cfg.user_token_id, nl,
           th.audio_start_token_id, *[th.audio_token_id] * n, th.audio_end_token_id, 300, 400, im_end, nl,
           im_start, cfg.assistant_token_id, nl]
    return torch.tensor([ids])


@torch.no_grad()
def test_prompt_and_frames_match_generate(hf_tiny: HFTiny) -> None:
    """Capture every talker forward of a greedy `generate(return_audio=True)`, rebuild its inputs with
    our prompt builder, talker and code predictor, and compare inputs, logits and codes."""
    hf, cfg, talker = hf_tiny.model, OmniConfig.from_file(hf_tiny.path), load_talker(hf_tiny.path)
    frames, v = 230, hf_tiny.variant
    input_ids = audio_prompt(cfg, frames)
    g = torch.Generator().manual_seed(3)
    feats, feat_mask = torch.randn(1, 128, frames, generator=g), torch.ones(1, frames, dtype=torch.long)

    calls: list[dict] = []

    def record(module: torch.nn.Module, args: tuple, kwargs: dict, out: object) -> None:
        calls.append({"embeds": kwargs["inputs_embeds"].clone(), "codes": kwargs.get("residual_codes"),
                      "logits": out.logits.clone()})

    thinker_results = []
    thinker_generate = hf.thinker.generate

    def capture_thinker(*args: object, **kwargs: object) -> object:
        thinker_results.append(thinker_generate(*args, **kwargs))
        return thinker_results[-1]

    handle = hf.talker.register_forward_hook(record, with_kwargs=True)
    hf.thinker.generate = capture_thinker
    try:
        hf.talker.rope_deltas = None
        hf.generate(
            input_ids=input_ids, input_features=feats, feature_attention_mask=feat_mask, return_audio=True,
            speaker="Ethan", thinker_max_new_tokens=3, thinker_do_sample=False, talker_max_new_tokens=5,
            talker_do_sample=False, talker_repetition_penalty=1.0,
        )
    finally:
        handle.remove()
        del hf.thinker.generate
    assert len(calls) == 5

    states = thinker_results[0].hidden_states  # per thinker forward: embeddings, then each layer's output
    thinker_embeds = torch.cat([s[0] for s in states], dim=1)[0]
    thinker_hidden = torch.cat([s[cfg.talker.accept_hidden_layer] for s in states], dim=1)[0]
    tts = tts_embeds(talker, hf.thinker.get_input_embeddings()(torch.tensor(tts_token_ids(cfg))))
    speaker = cfg.talker.speaker_id("ethan")
    prompt = build_prompt(talker, cfg, input_ids[0], thinker_embeds, thinker_hidden, tts, speaker)
    check(f"[{v}] talker prompt", prompt.embeds[None], calls[0]["embeds"])
    assert prompt.trailing.shape[0] == 2  # reply token 1, then eos; steps 2, 3 take pad

    vocab = cfg.talker.text.vocab_size
    suppressed = torch.zeros(vocab, dtype=torch.bool)
    suppressed[vocab - 1024 :] = True
    suppressed[cfg.talker.codec_eos_id] = False
    cache, x, past = DenseKVCache(len(talker.model.layers)), prompt.embeds[None], 0
    for step, call in enumerate(calls):
        if step:
            check(f"[{v}] talker input, decode step {step - 1}", x, call["embeds"])
        hidden = talker(x, torch.arange(past, past + x.shape[1])[None], cache)[:, -1]
        logits = talker.codec_logits(hidden)
        check(f"[{v}] talker logits, call {step}", logits, call["logits"][:, -1])
        past += x.shape[1]
        if step + 1 == len(calls):
            break
        code0 = logits.masked_fill(suppressed, float("-inf")).argmax(-1)
        frame = talker.next_frame(hidden, code0)
        assert torch.equal(frame.codes, calls[step + 1]["codes"]), f"frame {step} codes differ"
        x = next_input(frame, prompt.text_for_step(step))
