"""The EAGLE-3 head's training-time unroll (specgate_lab.eagle3.draft_steps) against a brute-force
reference: every step's attention written as one masked softmax over all steps' keys, with the
visibility vLLM gives a draft step (step 0's keys at indices <= i, steps 1..s's keys at index i).
Needs torch (the cpu tier's environment); no server."""

import math

import pytest

from specgate_lab.eagle3 import HeadShape, build_head, draft_steps, rope

pytestmark = pytest.mark.cpu
torch = None  # set by _import_torch: importing torch at collection cost every `pytest -m fast` 2.4 s


@pytest.fixture(scope="module", autouse=True)
def _import_torch():
    global torch
    torch = pytest.importorskip("torch")


SHAPE = HeadShape(hidden=32, heads=4, kv_heads=2, head_dim=8, intermediate=48, vocab=50, draft_vocab=20,
                  aux_layers=(2, 3, 4), rms_eps=1e-5, rope_theta=10000.0, max_positions=64)


def _reference_steps(head, embed, aux, tokens, steps):
    sh, layer = head.shape, head.midlayer
    attn = layer.self_attn
    B, T, _ = aux.shape
    hidden = head.fc(aux)
    ks, vs, out = [], [], []
    for s in range(steps):
        n = T - 2 - s
        residual = hidden[:, :n]
        x = torch.cat([layer.input_layernorm(embed(tokens[:, 1 + s:1 + s + n])), layer.hidden_norm(residual)], -1)
        pos = torch.arange(n) + s
        q = rope(attn.q_proj(x).view(B, n, sh.heads, sh.head_dim), pos, sh.rope_theta)
        k = rope(attn.k_proj(x).view(B, n, sh.kv_heads, sh.head_dim), pos, sh.rope_theta)
        v = attn.v_proj(x).view(B, n, sh.kv_heads, sh.head_dim)
        ks.append(k.repeat_interleave(2, dim=2))
        vs.append(v.repeat_interleave(2, dim=2))
        o = torch.zeros(B, n, sh.heads, sh.head_dim)
        for i in range(n):  # one query at a time, its visible keys listed explicitly
            keys = [ks[0][:, j] for j in range(i + 1)] + [ks[t][:, i] for t in range(1, s + 1)]
            vals = [vs[0][:, j] for j in range(i + 1)] + [vs[t][:, i] for t in range(1, s + 1)]
            kk, vv = torch.stack(keys, 1), torch.stack(vals, 1)  # [B, m, H, D]
            w = torch.softmax(torch.einsum("bhd,bmhd->bhm", q[:, i], kk) / math.sqrt(sh.head_dim), -1)
            o[:, i] = torch.einsum("bhm,bmhd->bhd", w, vv)
        residual = residual + attn.o_proj(o.reshape(B, n, -1))
        hidden = residual + layer.mlp(layer.post_attention_layernorm(residual))
        out.append(head.lm_head(head.norm(hidden)))
    return out


def test_unrolled_draft_steps_match_the_brute_force_attention():
    head = build_head(SHAPE, seed=3)
    embed = torch.nn.Embedding(SHAPE.vocab, SHAPE.hidden)
    gen = torch.Generator().manual_seed(0)
    aux = torch.randn(2, 9, 3 * SHAPE.hidden, generator=gen)
    tokens = torch.randint(0, SHAPE.vocab, (2, 9), generator=gen)
    with torch.no_grad():
        got = draft_steps(head, embed, aux, tokens, steps=3)
        want = _reference_steps(head, embed, aux, tokens, 3)
    assert [g.shape for g in got] == [(2, 7, 20), (2, 6, 20), (2, 5, 20)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_step_zero_at_index_i_does_not_see_later_tokens():
    head = build_head(SHAPE, seed=1)
    embed = torch.nn.Embedding(SHAPE.vocab, SHAPE.hidden)
    aux = torch.randn(1, 8, 3 * SHAPE.hidden)
    tokens = torch.randint(0, SHAPE.vocab, (1, 8))
    changed = tokens.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % SHAPE.vocab
    with torch.no_grad():
        a = draft_steps(head, embed, aux, tokens, steps=1)[0]
        b = draft_steps(head, embed, aux, changed, steps=1)[0]
    # index i reads token i+1: indices 0..4 read tokens 1..5, untouched
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5], b[:, 5])
