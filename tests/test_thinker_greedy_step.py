"""The thinker's decode step for all-greedy batches (argmax, no sort or draws over the vocabulary) gives what the
full step gives greedy rows: ids, embeddings, talker rows and NaN flags, with and without the eos ban; and a
greedy turn through the pipeline runs on it."""

from __future__ import annotations

from dataclasses import replace

import torch

from models.qwen3_omni.forward import ThinkerDecode
from models.qwen3_omni.model import load_model
from pipelines import kv_views
from pipelines.graphs import GraphRunner
from pipelines.sampling import SamplingParams, sampling_rows
from pipelines.types import GenerationOptions, Message, Turn
from tests.test_step_graphs import LENGTHS, prefilled


def test_the_greedy_step_gives_the_full_steps_greedy_rows():
    model = load_model("tiny")
    text = model.cfg.thinker.text
    cache, scratch, keys = prefilled(model, text, lambda x, kv: model.thinker(x, kv.positions, kv), LENGTHS)
    x = torch.randn(len(keys), 1, text.hidden_size, generator=torch.Generator().manual_seed(5))
    full = ThinkerDecode(model, cache, text.vocab_size)
    rows = kv_views.rows(cache, keys, 16) | {
        "x": x, "step": [3] * len(keys), "no_eos": [i % 2 == 0 for i in range(len(keys))],
        **sampling_rows("s", [SamplingParams(greedy=True, seed=i) for i in range(len(keys))])}
    outs = []
    for step in (full, replace(full, greedy=True)):
        runner = GraphRunner("thinker", step, step.inputs(torch.float32, 16, scratch), "cpu", (8,))
        with torch.inference_mode():
            outs.append(runner(len(keys), rows))
    assert set(outs[0]) == set(outs[1]) == {"ids", "embeds", "bad", "projected"}
    for k in outs[0]:
        assert torch.equal(outs[0][k], outs[1][k]), k
    im_end = model.cfg.im_end_token_id
    assert im_end not in outs[1]["ids"][0::2].tolist()  # the eos ban holds on the greedy step too


def test_a_greedy_turn_runs_on_the_greedy_step_and_a_sampled_one_on_the_full_step():
    from models.registry import build_pipeline

    with build_pipeline("tiny") as pipeline:
        step = pipeline.program.by_name["thinker"].runner.model
        used: list[str] = []

        def spied(name: str):  # the real runner, noting that it ran
            runner = getattr(step, name)
            return lambda n, rows: used.append(name) or runner(n, rows)

        step.graph, step.greedy_graph = spied("graph"), spied("greedy_graph")
        audio = torch.randn(16000, generator=torch.Generator().manual_seed(2)) * 0.1
        sampled = {"thinker": SamplingParams(temperature=0.8, top_p=0.9, seed=1)}
        for opts, want in ((GenerationOptions(greedy=True, max_text_tokens=5, audio=False), "greedy_graph"),
                           (GenerationOptions(max_text_tokens=5, audio=False, sampling=sampled), "graph")):
            used.clear()
            pipeline.run(Turn(want, [Message("user", "", audio)], opts), timeout_s=120)
            assert used and set(used) == {want}, used
