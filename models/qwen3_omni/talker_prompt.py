"""The talker's inputs, built from the thinker's, by the rules of the reference (transformers' generate).

P(x) is `talker.project_text(x)`, E(id) the thinker's token embedding of `id`. The prompt (prefill) is:
1. Every user turn's whole segment (`<|im_start|>user\\n` through its `<|im_end|>\\n`, found by the role token
   after the nearest `<|im_start|>`), in order; system and assistant turns are dropped. Audio positions become
   `talker.project_hidden(h)`, h = `output_hidden_states[accept_hidden_layer]` of the thinker; others P(embedding).
2. A 9-position assistant prefix, each position the sum of a text row and a codec row:
      text:  P(im_start) P(assistant) P(\\n) pad pad pad pad bos P(reply token 0)
      codec: 0          0            0     nothink think_bos think_eos speaker codec_pad codec_bos
   where pad, bos, eos are P(E(tts_pad)), P(E(tts_bos)), P(E(tts_eos)) and the codec row uses the talker's
   own `codec_embedding`. The prefix starts at the last `<|im_start|>assistant` of the sequence.
Positions run 0..P-1 over the prompt and continue one per step (all three mrope rows equal: no vision).

Decode step k (0: the first after the prefill) takes the sum of the previous frame's 16 codebook embeddings
(codebook 0 from the talker's `codec_embedding`, 1..15 from the code predictor's) plus text_k: P(reply token
k+1) while reply tokens fed back into the thinker remain (its final token, normally `<|im_end|>`, never is),
then eos once, then pad."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.qwen3_omni.config import OmniConfig
from models.qwen3_omni.talker import Talker


@dataclass(frozen=True)
class TtsEmbeds:
    bos: torch.Tensor  # [H] each, in the talker's width
    eos: torch.Tensor
    pad: torch.Tensor


def tts_embeds(talker: Talker, thinker_token_embeds: torch.Tensor) -> TtsEmbeds:
    """`thinker_token_embeds` [3, H_thinker]: the thinker's embeddings of tts_bos, tts_eos, tts_pad."""
    return TtsEmbeds(*talker.project_text(thinker_token_embeds).unbind(0))


def tts_token_ids(cfg: OmniConfig) -> list[int]:
    """The ids whose thinker embeddings `tts_embeds` wants, in order."""
    return [cfg.tts_bos_token_id, cfg.tts_eos_token_id, cfg.tts_pad_token_id]


def user_mask(input_ids: torch.Tensor, cfg: OmniConfig) -> torch.Tensor:
    """[L] bool: positions inside user turns."""
    pos = torch.arange(input_ids.shape[0], device=input_ids.device)
    turn_start = torch.where(input_ids == cfg.im_start_token_id, pos, 0).cummax(0).values
    role = input_ids[(turn_start + 1).clamp(max=input_ids.shape[0] - 1)]
    return role == cfg.user_token_id


def assistant_prefix(talker: Talker, cfg: OmniConfig, head_embeds: torch.Tensor, tts: TtsEmbeds,
                     speaker_id: int) -> torch.Tensor:
    """[9, H]. head_embeds [4, H_thinker]: thinker embeddings of im_start, assistant, newline, reply token 0."""
    head = talker.project_text(head_embeds)
    text = torch.cat((head[:3], tts.pad.expand(4, -1), tts.bos[None], head[3:4]))
    t = cfg.talker
    codec_ids = [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id, speaker_id, t.codec_pad_id,
                 t.codec_bos_id]
    codec = talker.embed_codec(torch.tensor(codec_ids, device=text.device))
    return text + torch.cat((torch.zeros_like(text[:3]), codec))
