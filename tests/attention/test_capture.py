"""watch(attention=True): every attention call's per-head entropy, against float64 by hand."""

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerscope

HEADS, DIM, LENGTH, BATCH = 4, 16, 7, 3
VALUES = ["entropy_mean", "entropy_min", "entropy_frac", "max_prob"]


class SelfAttention(nn.Module):
    def __init__(self, causal=True):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.causal = causal

    def query_key(self, x):
        b, length, _ = x.shape
        qkv = self.qkv(x).view(b, length, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def forward(self, x):
        q, k, v = self.query_key(x)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(x.shape))


class Block(nn.Module):
    def __init__(self, causal=True):
        super().__init__()
        self.attn = SelfAttention(causal)
        self.mlp = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU())

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class Tiny(nn.Module):
    def __init__(self, causal=True):
        super().__init__()
        self.blocks = nn.ModuleList([Block(causal), Block(causal)])
        self.head = nn.Linear(DIM, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _reference(q, k, causal):
    """Per head: entropy mean and min, fraction of log(keys), mean max probability: by loops."""
    q, k = q.double().numpy(), k.double().numpy()
    batch, heads, length, width = q.shape
    rows = []
    for h in range(heads):
        entropies, fractions, top = [], [], []
        for b in range(batch):
            for i in range(length):
                allowed = i + 1 if causal else k.shape[2]
                logits = k[b, h, :allowed] @ q[b, h, i] / math.sqrt(width)
                p = np.exp(logits - logits.max())
                p /= p.sum()
                entropy = -sum(x * math.log(x) for x in p if x > 0)
                entropies.append(entropy)
                if allowed >= 2:
                    fractions.append(entropy / math.log(allowed))
                top.append(p.max())
        rows.append((np.mean(entropies), min(entropies), np.mean(fractions), np.mean(top)))
    return np.array(rows)


def _expected(model, xs, causal=True):
    """Each block's attention over the micro-batches ``xs``, from a float64 copy."""
    double = copy.deepcopy(model).double()
    seen = {}

    def keep(name):
        def hook(module, args):
            seen.setdefault(name, []).append(module.query_key(args[0])[:2])

        return hook

    hooks = [
        block.attn.register_forward_pre_hook(keep(f"blocks.{i}.attn"))
        for i, block in enumerate(double.blocks)
    ]
    with torch.no_grad():
        for x in xs:
            double(x.double())
    for hook in hooks:
        hook.remove()
    expected = {}
    for name, pairs in seen.items():
        q = torch.cat([q for q, _ in pairs])
        k = torch.cat([k for _, k in pairs])
        expected[name] = _reference(q, k, causal)
    return expected


def _train(model, steps, **watch):
    torch.manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer, every=1, attention=True, **watch) as scope:
        for _ in range(steps):
            model(torch.randn(BATCH, LENGTH, DIM)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    return scope


@pytest.mark.parametrize("causal", [True, False])
def test_each_head_matches_float64_by_hand(causal):
    torch.manual_seed(0)
    model = Tiny(causal)
    before = copy.deepcopy(model)
    torch.manual_seed(1)
    x = torch.randn(BATCH, LENGTH, DIM)
    expected = _expected(before, [x], causal)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer, every=1, attention=True) as scope:
        model(x).pow(2).mean().backward()
        optimizer.step()
    frame = scope.frame("attention")
    assert list(frame.columns) == list(layerscope.model.ATTENTION_COLUMNS)
    assert sorted(set(frame.module)) == ["blocks.0.attn", "blocks.1.attn"]
    for name, want in expected.items():
        rows = frame[frame.module == name].sort_values("head")
        assert rows["head"].tolist() == list(range(HEADS))
        assert (rows.step == 0).all()
        assert (rows.phase == "train").all()
        assert (rows.call == 0).all()
        assert (rows["keys"] == LENGTH).all()
        np.testing.assert_allclose(rows[VALUES].to_numpy(), want, rtol=1e-5, atol=1e-6)


def test_micro_batches_of_a_step_merge_by_call():
    torch.manual_seed(0)
    model = Tiny()
    before = copy.deepcopy(model)
    torch.manual_seed(1)
    xs = [torch.randn(BATCH, LENGTH, DIM) for _ in range(3)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer, every=1, attention=True) as scope:
        for x in xs:
            (model(x).pow(2).mean() / 3).backward()
        optimizer.step()
    frame = scope.frame("attention")
    assert len(frame) == 2 * HEADS  # one row per head and call, not per micro-batch
    for name, want in _expected(before, xs).items():
        rows = frame[frame.module == name].sort_values("head")
        np.testing.assert_allclose(rows[VALUES].to_numpy(), want, rtol=1e-5, atol=1e-6)


def test_training_is_bit_identical_with_and_without_attention():
    def run(watched):
        torch.manual_seed(0)
        model = Tiny()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        scope = layerscope.watch(model, optimizer, every=1, attention=True) if watched else None
        torch.manual_seed(1)
        for _ in range(3):
            model(torch.randn(BATCH, LENGTH, DIM)).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        if scope is not None:
            assert len(scope.frame("attention")) == 3 * 2 * HEADS
            scope.close()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(False), run(True), strict=True):
        assert torch.equal(a, b)


def test_nothing_between_recorded_steps_and_nothing_after_close():
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    original = F.scaled_dot_product_attention
    patched, hooked = [], []
    with layerscope.watch(model, optimizer, every=2, attention=True) as scope:
        for _ in range(4):
            model(torch.randn(BATCH, LENGTH, DIM)).pow(2).mean().backward()
            patched.append(F.scaled_dot_product_attention is not original)
            hooked.append(len(model.blocks[0].attn._forward_pre_hooks))
            optimizer.step()
            optimizer.zero_grad()
    # An unrecorded step calls torch's own function, and the attention modules carry no hook.
    assert patched == [True, False, True, False]
    assert hooked[1] == hooked[3] == 0
    assert hooked[0] == hooked[2] > 0
    assert F.scaled_dot_product_attention is original
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert sorted(set(scope.frame("attention").step)) == [0, 2]


def test_evaluation_rows_have_their_phase():
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with layerscope.watch(model, optimizer, every=1, attention=True) as scope:
        model(torch.randn(BATCH, LENGTH, DIM)).pow(2).mean().backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(BATCH, LENGTH, DIM))
        model.train()
    frame = scope.frame("attention")
    assert sorted(set(zip(frame.step, frame.phase, strict=True))) == [(0, "eval"), (0, "train")]


def test_multihead_attention_matches_its_own_weights():
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(DIM, HEADS, dim_feedforward=32, dropout=0.0,
                                       batch_first=True)  # fmt: skip
    x = torch.randn(BATCH, LENGTH, DIM)
    mask = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    mask[0, -2:] = True  # padding: the last two keys of the first sequence
    with torch.no_grad():
        double = copy.deepcopy(model).double().self_attn
        _, weights = double(x.double(), x.double(), x.double(), key_padding_mask=mask,
                            average_attn_weights=False)  # fmt: skip
    p = weights.numpy()  # (batch, heads, queries, keys)
    entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)
    allowed = np.where(mask.numpy(), 0, 1).sum(-1)[:, None, None]
    frac = entropy / np.log(allowed)
    with layerscope.watch(model, every=1, attention=True) as scope:
        model(x, src_key_padding_mask=mask).pow(2).mean().backward()
        scope.step()
    frame = scope.frame("attention")
    assert set(frame.module) == {"self_attn"}
    rows = frame.sort_values("head")
    np.testing.assert_allclose(rows.entropy_mean, entropy.mean(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(rows.entropy_min, entropy.min(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(rows.entropy_frac, frac.mean(axis=(0, 2)), rtol=1e-5)
    np.testing.assert_allclose(rows.max_prob, p.max(-1).mean(axis=(0, 2)), rtol=1e-5)


def test_a_stored_run_reads_back_what_the_scope_saw(tmp_path):
    torch.manual_seed(0)
    scope = _train(Tiny(), 2, run=tmp_path / "run")
    run = layerscope.load(tmp_path / "run")
    order = ["step", "module", "head"]
    stored = run.attention.sort_values(order).reset_index(drop=True)
    seen = scope.frame("attention").sort_values(order).reset_index(drop=True)
    assert len(stored) == 2 * 2 * HEADS
    np.testing.assert_array_equal(stored.entropy_mean, seen.entropy_mean)
    low = run.sql("select module, head, min(entropy_frac) as low from attention group by all")
    assert len(low) == 2 * HEADS
    assert (low.low > 0).all()
    assert (low.low <= 1).all()


def test_a_failing_read_is_one_warning_and_training_goes_on(monkeypatch):
    import layerscope.hooks._attention as attention

    def broken(*args, **kwargs):
        raise RuntimeError("no")

    monkeypatch.setattr(attention, "attention_partials", broken)
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(scope):
        for _ in range(2):
            model(torch.randn(BATCH, LENGTH, DIM)).pow(2).mean().backward()
            optimizer.step()

    warned = pytest.warns(layerscope.LayerscopeWarning, match="the attention of 'blocks.0.attn'")
    with layerscope.watch(model, optimizer, every=1, attention=True) as scope, warned:
        steps(scope)
    assert scope.failures >= 1
    assert len(scope.frame("attention")) == 0
    assert len(scope.frame()) > 0


def test_attention_must_be_a_bool():
    with pytest.raises(TypeError, match="attention: expected True or False"):
        layerscope.watch(Tiny(), attention="yes")
