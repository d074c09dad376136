"""CPU tests for the SS draft model: HF round trip, cache equivalence, stream isolation, lossless SS decode."""
import tempfile

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from mirror_core.models.ss_draft import SSDraftConfig, SSDraftForCausalLM, ss_draft_from_llama, truncate_cache
from training.toy_pair.evaluate import ss_greedy_generate
from training.toy_pair.losses import speculative_streaming_loss
from testing.toy_models import main_greedy_generate

VOCAB = 48


def tiny_model(seed: int = 0, layers: int = 3, msa: int = 2) -> SSDraftForCausalLM:
    """A random tiny SS draft built under a forked RNG, so the global seed is left alone."""
    config = SSDraftConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, num_msa_layers=msa, num_streams=2)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return SSDraftForCausalLM(config).eval()


def random_ids(n: int, seed: int = 1, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))  # [B, n]


def test_save_load_round_trip_via_auto_classes():
    model = tiny_model()
    ids = random_ids(10)
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        assert AutoConfig.from_pretrained(d).model_type == "mirror_ss_draft"
        loaded = AutoModelForCausalLM.from_pretrained(d).eval()
        assert isinstance(loaded, SSDraftForCausalLM)
        with torch.no_grad():
            a, b = model(ids), loaded(ids)
        torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=0)
        torch.testing.assert_close(a.stream_logits, b.stream_logits, rtol=0, atol=0)


@torch.no_grad()
def test_cached_token_by_token_equals_full_forward():
    model = tiny_model()
    ids = random_ids(14, batch=2)
    full = model(ids)
    out, main, streams = None, [], []
    for i in range(ids.shape[1]):
        out = model(ids[:, i:i + 1], cache=None if out is None else out.cache)
        main.append(out.logits)
        streams.append(out.stream_logits)
    torch.testing.assert_close(torch.cat(main, 1), full.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(streams, 1), full.stream_logits, rtol=0, atol=1e-5)


@torch.no_grad()
def test_truncate_then_refeed_matches_full_forward():
    model = tiny_model()
    ids = random_ids(12)
    full = model(ids)
    first = model(ids[:, :8])
    wrong = model(random_ids(3, seed=7), cache=first.cache)  # rejected tokens at indices 8..10
    redo = model(ids[:, 8:], cache=truncate_cache(wrong.cache, 8))
    torch.testing.assert_close(redo.logits, full.logits[:, 8:], rtol=0, atol=1e-5)


@torch.no_grad()
def test_main_stream_never_sees_the_streams():
    model = tiny_model()
    ids = random_ids(12)
    before = model(ids)
    model.stream_embed.add_(torch.randn(model.stream_embed.shape, generator=torch.Generator().manual_seed(3)) * 5)
    after = model(ids)
    torch.testing.assert_close(after.logits, before.logits, rtol=0, atol=0)
    assert not torch.allclose(after.stream_logits, before.stream_logits)
    # without streams the fused attention call is smaller, so float summation order may differ slightly
    torch.testing.assert_close(model(ids, with_streams=False).logits, before.logits, rtol=0, atol=1e-6)


@torch.no_grad()
def test_streams_are_causal():
    model = tiny_model()
    ids = random_ids(12)
    changed = ids.clone()
    changed[0, 7:] = (changed[0, 7:] + 1) % VOCAB
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a.stream_logits[:, :7], b.stream_logits[:, :7], rtol=0, atol=1e-6)


@torch.no_grad()
def test_left_padding_mask_matches_unpadded_row():
    model = tiny_model()
    ids = random_ids(9)
    pad = 3
    padded = torch.cat((torch.zeros(1, pad, dtype=torch.long), ids), 1)  # [1, 12]
    mask = torch.cat((torch.zeros(1, pad), torch.ones(1, 9)), 1)  # [1, 12]
    pos = (torch.arange(12) - pad).clamp(min=0)[None]  # [1, 12]
    out = model(padded, position_ids=pos, attention_mask=mask)
    ref = model(ids)
    torch.testing.assert_close(out.logits[:, pad:], ref.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.stream_logits[:, pad:], ref.stream_logits, rtol=0, atol=1e-5)


@torch.no_grad()
def test_initialised_from_llama_matches_llama_main_logits():
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        llama = LlamaForCausalLM(config).eval()
    draft = ss_draft_from_llama(llama, 4, 2, 2, torch.Generator().manual_seed(0)).eval()
    ids = random_ids(11)
    torch.testing.assert_close(draft(ids).logits, llama(ids).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ss_greedy_equals_main_greedy_on_random_model(seed):
    model = tiny_model(seed)
    prompt = random_ids(6, seed=seed)[0].tolist()
    tokens, per_forward = ss_greedy_generate(model, prompt, 30)
    assert tokens == main_greedy_generate(model, prompt, 30)
    assert all(1 <= k <= 3 for k in per_forward)


def train_on_cycle(model: SSDraftForCausalLM, steps: int = 120) -> list[int]:
    """Teach a tiny model the cycle x -> perm[x] with the SS loss, so the streams can look ahead."""
    gen = torch.Generator().manual_seed(0)
    perm = torch.randperm(VOCAB, generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        x = torch.randint(0, VOCAB, (16, 1), generator=gen)  # [B, 1]
        for _ in range(24):
            x = torch.cat((x, perm[x[:, -1:]]), 1)  # [B, t+1]
        out = model(x[:, :-1])
        loss = speculative_streaming_loss(out.logits, out.stream_logits, x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_ss_greedy_emits_several_tokens_per_forward_and_stays_lossless():
    model = train_on_cycle(tiny_model(layers=2, msa=1))
    prompt = random_ids(5, seed=4)[0].tolist()
    tokens, per_forward = ss_greedy_generate(model, prompt, 40)
    assert tokens == main_greedy_generate(model, prompt, 40)
    assert max(per_forward) == 3
    assert sum(per_forward) / len(per_forward) > 2.0
