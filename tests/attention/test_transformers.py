"""watch(attention=True) on Hugging Face's GPT-2 through SDPA, against the attention weights
that the same model returns in its eager form, in float64."""

import numpy as np
import pytest
import torch

import layerscope

transformers = pytest.importorskip("transformers")

LAYERS, HEADS, LENGTH, VOCAB = 2, 2, 8, 64
PADDED = 3  # the second sequence's last tokens are padding
MODULES = [f"transformer.h.{i}.attn" for i in range(LAYERS)]
VALUES = ["entropy_mean", "entropy_min", "entropy_frac", "max_prob"]


def _config(attention: str):
    return transformers.GPT2Config(
        attn_implementation=attention,
        n_layer=LAYERS, n_head=HEADS, n_embd=32, vocab_size=VOCAB, n_positions=16,
        bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # the eager weights are the softmax's
    )  # fmt: skip


def _models():
    """A random GPT-2 through SDPA, and an eager copy of it that can return its weights."""
    torch.manual_seed(0)
    sdpa = transformers.GPT2LMHeadModel(_config("sdpa"))
    eager = transformers.GPT2LMHeadModel(_config("eager"))
    eager.load_state_dict(sdpa.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    return sdpa, eager


def _batch():
    """Two sequences, the second right-padded; the padding mask, 2-d and as a 4-d float mask."""
    tokens = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, LENGTH, dtype=torch.long)
    padding[1, -PADDED:] = 0
    # (batch, query, key): causal and not padding; Hugging Face's eager form adds finfo.min.
    allowed = torch.ones(LENGTH, LENGTH).tril().bool() & padding.bool()[:, None, :]
    minimum = torch.finfo(torch.float32).min
    additive = torch.zeros(2, 1, LENGTH, LENGTH).masked_fill(~allowed[:, None], minimum)
    return tokens, padding, allowed, additive


def _reference(weights, allowed):
    """(heads, 4) in float64 from one layer's weights ``(batch, heads, query, key)``: entropy
    mean and min, entropy over log of each query's allowed keys (counted from the mask, those
    with two or more), mean largest probability."""
    p = weights.double().numpy()
    entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)  # (batch, heads, query)
    keys = allowed.sum(-1).numpy()[:, None, :].repeat(p.shape[1], axis=1)  # (batch, heads, query)
    rows = []
    for head in range(p.shape[1]):
        spread = keys[:, head] >= 2
        frac = entropy[:, head][spread] / np.log(keys[:, head][spread])
        top = p[:, head].max(-1)
        rows.append((entropy[:, head].mean(), entropy[:, head].min(), frac.mean(), top.mean()))
    return np.array(rows)


def _train(model, steps, mask, eager=None, **watch):
    """Train ``steps`` AdamW steps on one batch; the eager copy's weights before each step."""
    tokens = _batch()[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen = []  # per step: each layer's (batch, heads, query, key)
    scope = layerscope.watch(model, optimizer, every=1, **watch) if watch else None
    for _ in range(steps):
        if eager is not None:
            eager.load_state_dict(model.state_dict())
            with torch.no_grad():
                seen.append(eager(tokens, attention_mask=mask, output_attentions=True).attentions)
        model(tokens, attention_mask=mask, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if scope is not None:
        scope.close()
    return scope, seen


@pytest.mark.parametrize("form", ["padding", "float mask"])
def test_each_head_matches_the_eager_weights(form):
    # "padding": the 2-d mask, which the SDPA form makes a bool mask of; "float mask": a 4-d
    # mask of 0 and finfo.min, handed to SDPA as it is.
    sdpa, eager = _models()
    _, padding, allowed, additive = _batch()
    mask = padding if form == "padding" else additive
    scope, seen = _train(sdpa, 2, mask, eager, attention=True)
    frame = scope.frame("attention")
    attending = {info.name: info.type for info in scope.modules if info.name in set(frame.module)}
    assert attending == dict.fromkeys(MODULES, "GPT2Attention")
    assert len(frame) == 2 * LAYERS * HEADS  # steps x modules x heads, one call each
    assert (frame.call == 0).all()
    assert (frame["keys"] == LENGTH).all()
    # Counting keys by position alone (6 to 8 for the padded sequence's last queries, not its
    # 5 real keys) gives another entropy_frac: the comparison below tells them apart.
    positional = allowed.clone()
    positional[1] = allowed[0]
    for step, weights in enumerate(seen):
        for name, layer in zip(MODULES, weights, strict=True):
            rows = frame[(frame.step == step) & (frame.module == name)].sort_values("head")
            assert rows["head"].tolist() == list(range(HEADS))
            want = _reference(layer, allowed)
            # Both sides start from float32 logits (torch's softmax there, float32 exponentials
            # summed in float64 here): they agree to a few float32 roundings, well within 1e-5.
            np.testing.assert_allclose(rows[VALUES].to_numpy(), want, rtol=1e-5, atol=1e-6)
            wrong = _reference(layer, positional)[:, 2]
            assert (np.abs(wrong - want[:, 2]) > 1e-3).all()


def test_training_is_bit_identical_with_and_without_attention():
    padding = _batch()[1]

    def trained(**watch):
        sdpa, _ = _models()
        scope, _ = _train(sdpa, 2, padding, **watch)
        if watch.get("attention"):
            assert len(scope.frame("attention")) == 2 * LAYERS * HEADS  # it did recompute
        return [p.detach().clone() for p in sdpa.parameters()]

    unwatched = trained()
    for watched in (trained(attention=False), trained(attention=True)):
        for a, b in zip(unwatched, watched, strict=True):
            assert torch.equal(a, b)
