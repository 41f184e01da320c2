import pytest
import torch

from pipelines.sampling import Sampler, SamplingParams, top_k_top_p, uniform


def test_greedy_is_argmax_and_suppression_applies():
    logits = torch.randn(3, 50)
    s = Sampler.of([SamplingParams(greedy=True)] * 3, "cpu")
    step = torch.zeros(3, dtype=torch.long)
    assert torch.equal(s(logits, step), logits.argmax(-1))
    suppress = torch.zeros(50, dtype=torch.bool)
    suppress[logits.argmax(-1)] = True
    assert not suppress[s(logits, step, suppress=suppress)].any()
    per_row = torch.zeros(3, 50, dtype=torch.bool)
    per_row[1, logits[1].argmax()] = True  # only row 1 may not take its favourite
    out = s(logits, step, suppress=per_row)
    assert out[0] == logits[0].argmax() and out[1] != logits[1].argmax() and out[2] == logits[2].argmax()


def test_repetition_penalty_matches_reference_rule():
    logits = torch.tensor([[2.0, 1.9, -1.0, -1.05]])
    seen = torch.tensor([[True, False, True, False]])
    s = Sampler.of([SamplingParams(greedy=True, repetition_penalty=1.1)], "cpu")
    assert s(logits, torch.zeros(1, dtype=torch.long), seen=seen).item() == 1  # 2.0/1.1 < 1.9


def test_row_draws_do_not_depend_on_the_batch():
    torch.manual_seed(1)
    logits = torch.randn(4, 300)
    params = [SamplingParams(temperature=0.9, top_k=50, top_p=0.8, seed=i) for i in range(4)]
    steps = torch.tensor([0, 5, 9, 2])
    together = Sampler.of(params, "cpu")(logits, steps)
    alone = [Sampler.of([p], "cpu")(logits[i : i + 1], steps[i : i + 1]).item() for i, p in enumerate(params)]
    assert together.tolist() == alone


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 6000
    logits = probs.log().expand(n, 4)
    s = Sampler.of([SamplingParams(seed=7)] * n, "cpu")
    draws = s(logits, torch.arange(n))
    freq = torch.bincount(draws, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.025), freq


def test_top_k_and_top_p_keep_the_right_sets():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]] * 3)
    out = top_k_top_p(logits, torch.tensor([2, 0, 0]), torch.tensor([1.0, 0.5, 1e-6]))
    kept = torch.isfinite(out)
    assert kept[0].tolist() == [True, True, False, False, False]
    assert kept[1].tolist() == [True, False, False, False, False]  # top token alone holds > 0.5 of the mass
    assert kept[2].tolist() == [True, False, False, False, False]  # always at least one


def test_uniform_range_and_params_validation():
    u = uniform(torch.tensor([0, 123456789]), torch.tensor([0, 10**6]), 10000)
    assert u.min() > 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    with pytest.raises(ValueError):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)


def test_top_k_keeps_the_logits_equal_to_the_kth_and_top_p_keeps_runs_together():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])
    kept = torch.isfinite(top_k_top_p(logits, torch.tensor([2]), torch.tensor([1.0])))
    assert kept[0].tolist() == [True, True, True, True, False]  # transformers' TopKLogitsWarper's rule
    probs = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()
    kept = torch.isfinite(top_k_top_p(probs, torch.tensor([0]), torch.tensor([0.5])))
    assert kept[0].tolist() == [True, True, True, True]  # 0.4 above each 0.2: all of the run stays
    kept = torch.isfinite(top_k_top_p(probs, torch.tensor([0]), torch.tensor([0.39])))
    assert kept[0].tolist() == [True, False, False, False]
