"""Sampling is lossless: Rule E reproduces ar token for token; Rule R matches the target's law."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from mirror_core import LaneConfig, MirrorEngine, Request, SamplingConfig, SpecConfig
from mirror_core.sampling import probs, warp_logits
from testing.toy_models import build_pair, prompts


@pytest.fixture(scope="module")
def engine(pairs):
    target, draft = pairs["llama"]
    with MirrorEngine.load(target, draft, LaneConfig(dtype="float32", kind="inline")) as e:
        yield e


@pytest.mark.parametrize("sampling", [
    SamplingConfig(temperature=1.0, seed=3),
    SamplingConfig(temperature=0.7, top_k=20, seed=11),
    SamplingConfig(temperature=1.3, top_p=0.9, seed=5),
    SamplingConfig(temperature=0.9, top_k=40, top_p=0.8, seed=123),
])
def test_rule_e_reproduces_ar_with_the_same_seed(engine, sampling):
    for i, prompt in enumerate(prompts(4, seed=9)):
        spec = SpecConfig(gamma=1 + 2 * i, kappa=2 + i, exit_layer=1 + i % 3)
        ar = engine.generate(Request(prompt, "ar", 32, sampling=sampling)).token_ids
        for decoder in ("sd", "mirror"):
            out = engine.generate(Request(prompt, decoder, 32, sampling=sampling, spec=spec)).token_ids
            assert out == ar, (decoder, prompt, spec)


def test_different_seeds_give_different_samples(engine):
    a = engine.generate(Request((1, 2, 3), "mirror", 32, sampling=SamplingConfig(1.0, seed=1))).token_ids
    b = engine.generate(Request((1, 2, 3), "mirror", 32, sampling=SamplingConfig(1.0, seed=2))).token_ids
    assert a != b


def test_warpers_keep_the_top_k_and_nucleus():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    assert torch.isinf(warp_logits(logits, SamplingConfig(1.0, top_k=2))[0, 2:]).all()
    p = probs(logits, SamplingConfig(1.0, top_p=0.7))
    kept = (p > 0).sum().item()
    full = torch.softmax(logits, -1)[0]
    assert full[:kept].sum() >= 0.7 and full[: kept - 1].sum() < 0.7


# -- Rule R: a statistical test of the output law -------------------------------------------------
V = 12
N_RUNS = 2500


def _chi2_sf(x: float, df: int) -> float:
    """P(χ²_df ≥ x) via the regularised upper incomplete gamma function (series / continued fraction)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    if z < a + 1:  # series for P, then Q = 1 − P
        term = total = 1.0 / a
        n = a
        while abs(term) > 1e-14 * abs(total):
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    b, c, d = z + 1 - a, 1e300, 1.0 / (z + 1 - a)  # Lentz continued fraction for Q
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = 1.0 / (an * d + b)
        c = b + an / c
        h *= d * c
    return h * math.exp(-z + a * math.log(z) - math.lgamma(a))


def _chi2_p(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    n = counts.sum().item()
    exp = expected_p * n
    keep = exp > 5  # pool rare bins
    stat = (((counts[keep] - exp[keep]) ** 2) / exp[keep]).sum().item()
    rest_c, rest_e = counts[~keep].sum().item(), exp[~keep].sum().item()
    bins = int(keep.sum().item())
    if rest_e > 0:
        stat += (rest_c - rest_e) ** 2 / rest_e
        bins += 1
    return _chi2_sf(stat, bins - 1)


def _exact_marginals(path: str, prompt: tuple[int, ...], cfg: SamplingConfig):
    """Exact laws of new tokens 2 and 3 under the target with the request's warpers."""
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        p1 = probs(model(torch.tensor([prompt])).logits[0, -1], cfg)                           # [V]
        pre2 = torch.tensor([list(prompt) + [a] for a in range(V)])
        p2 = probs(model(pre2).logits[:, -1], cfg)                                             # [V(t1), V(t2)]
        pre3 = torch.tensor([list(prompt) + [a, b] for a in range(V) for b in range(V)])
        p3 = probs(model(pre3).logits[:, -1], cfg).view(V, V, V)                               # [t1, t2, t3]
    joint12 = p1[:, None] * p2                                                                 # [V, V]
    return joint12.sum(0), (joint12[:, :, None] * p3).sum((0, 1))


@pytest.mark.slow  # a statistical test of many seeded runs (Rule E's exact tests above stay in the default tier)
def test_rule_r_matches_the_target_distribution(pair_root):
    target, draft = build_pair(pair_root, "llama", target_layers=2, hidden=32, seed=4, vocab=V, draft_noise=0.6)
    cfg = SamplingConfig(temperature=1.0, rule="rejection")
    prompt = (1, 5, 7)
    law2, law3 = _exact_marginals(target, prompt, cfg)
    counts2, counts3 = torch.zeros(V), torch.zeros(V)
    accepted = hits = 0
    with MirrorEngine.load(target, draft, LaneConfig(dtype="float32", kind="inline")) as engine:
        for seed in range(N_RUNS):
            end = engine.generate(Request(prompt, "mirror", 3, sampling=SamplingConfig(1.0, seed=seed, rule="rejection"),
                                          spec=SpecConfig(gamma=2, kappa=2, exit_layer=1)))
            counts2[end.token_ids[1]] += 1
            counts3[end.token_ids[2]] += 1
            accepted += end.summary.accepted
            hits += end.summary.hits
    assert accepted > N_RUNS * 0.3  # the draft's tokens really were accepted (by rejection sampling)
    assert _chi2_p(counts2, law2) > 1e-3
    assert _chi2_p(counts3, law3) > 1e-3
    # Power check: the same test rejects the draft's own law.
    _, draft_law3 = _exact_marginals(draft, prompt, cfg)
    assert (draft_law3 - law3).abs().sum() > 0.2
    assert _chi2_p((draft_law3 * N_RUNS).round(), law3) < 1e-3
