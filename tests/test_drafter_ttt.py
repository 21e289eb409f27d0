"""The EAGLE-3 head's training step computes only the positions that can carry loss (packed, not
padded): it must give the loss, the agreement counts and the gradients of the plain computation over
every position of a padded batch, which is written out here as the reference (the step as it was
before, SpecForge's SDPA path)."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from specmatch.training import drafter as D  # noqa: E402

CFG = {"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
       "rms_norm_eps": 1e-5, "vocab_size": 97}
DRAFT = 24
T = 3


def reference_forward(head, embed, aux, ids, theta, length):
    """Every position of a padded batch (B x L), each step's logits (B x L x V_draft)."""
    B, L, _ = aux.shape
    nh, nkv, hd = head.dims
    layer = head.midlayer
    hidden = head.fc(aux)
    causal = torch.full((L, L), float("-inf")).triu(1)
    keys, vals, outs = [], [], []
    for k in range(length):
        step_ids = ids[:, k + 1:k + 1 + L]
        if step_ids.shape[1] < L:
            step_ids = torch.nn.functional.pad(step_ids, (0, L - step_ids.shape[1]))
        emb = layer.input_layernorm(embed(step_ids))
        residual = hidden
        x = torch.cat([emb, layer.hidden_norm(hidden)], dim=-1)
        q = layer.self_attn.q_proj(x).view(B, L, nh, hd).transpose(1, 2)
        kk = layer.self_attn.k_proj(x).view(B, L, nkv, hd).transpose(1, 2)
        v = layer.self_attn.v_proj(x).view(B, L, nkv, hd).transpose(1, 2)
        cos, sin = D.rope(torch.arange(L) + k, hd, theta)
        q, kk = D._rotate(q, cos, sin), D._rotate(kk, cos, sin)
        rep = nh // nkv
        kk, v = kk.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        keys.append(kk)
        vals.append(v)
        scores = [q @ keys[0].transpose(-1, -2) / math.sqrt(hd) + causal]
        scores += [(q * keys[j]).sum(-1, keepdim=True) / math.sqrt(hd) for j in range(1, len(keys))]
        w = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
        att = w[..., :L] @ vals[0]
        for j in range(1, len(keys)):
            att = att + w[..., L + j - 1:L + j] * vals[j]
        att = layer.self_attn.o_proj(att.transpose(1, 2).reshape(B, L, nh * hd))
        h = residual + att
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        hidden = h
        outs.append(head.lm_head(head.norm(h)))
    return outs


def reference_step(head, ctx, seqs, feats, batch, weights):
    """The padded step (also bench/train_rate.py's reference)."""
    T = ctx["ttt_length"]
    L = max(len(seqs[b][0]) for b in batch) - 1
    H = feats[batch[0]][1].shape[1]
    ids = torch.zeros(len(batch), L + 1 + T, dtype=torch.long)
    mask = torch.zeros(len(batch), L + 1 + T)
    aux = torch.zeros(len(batch), L, 3 * H)
    last = torch.zeros(len(batch), L + 1 + T, H)
    greedy = torch.zeros(len(batch), L + 1 + T, dtype=torch.long)
    for j, b in enumerate(batch):
        s_ids, s_mask = seqs[b]
        n = len(s_ids)
        ids[j, :n] = torch.tensor(s_ids)
        mask[j, :n] = torch.tensor(s_mask, dtype=torch.float32)
        aux[j, :n - 1] = feats[b][0][:n - 1].float()
        last[j, :n] = feats[b][1].float()
        greedy[j, :n] = feats[b][2]
    logits = reference_forward(head, ctx["embed"], aux, ids, ctx["rope_theta"], T)
    loss, accs, counts = 0.0, [], []
    for k, lg in enumerate(logits):
        with torch.no_grad():
            p = torch.softmax(last[:, 1 + k:1 + k + L] @ ctx["head_w"].T, dim=-1)
            full_argmax = greedy[:, 1 + k:1 + k + L]
            asst = mask[:, 2 + k:2 + k + L]
            valid = asst * ctx["t2d"][full_argmax].float()
        lp = torch.log_softmax(lg, dim=-1)
        denom = valid.sum().clamp_min(1.0)
        loss = loss + weights[k] * (-(p * lp).sum(-1) * valid).sum() / denom
        hit = (ctx["used"][lg.argmax(-1)] == full_argmax).float()
        accs.append(float((hit * valid).sum() / denom))
        counts.append((float((hit * valid).sum()), float(valid.sum()), float(asst.sum())))
    return loss, accs, counts


def setup(seed=0, lengths=(9, 23, 5, 16, 30)):
    """A random head (every weight nonzero: the identity start would hide the attention), random
    features, and sequences whose assistant spans start, stop and end anywhere, one of them at the
    very last tokens and one with an assistant token only at position 1 (nothing can score it)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    H, V = CFG["hidden_size"], CFG["vocab_size"]
    head = D.build_head(CFG, DRAFT)
    with torch.no_grad():
        for prm in head.parameters():
            prm.normal_(0, 0.3)
    embed = torch.nn.Embedding(V, H)
    embed.requires_grad_(False)
    used = torch.tensor(sorted(rng.choice(V, DRAFT, replace=False)))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    seqs, feats = [], []
    for i, n in enumerate(lengths):
        ids = rng.integers(0, V, n).tolist()
        mask = (rng.random(n) < 0.4).astype(int).tolist()
        if i == 0:
            mask = [0] * n
            mask[1] = 1
        if i == 1:
            mask[-3:] = [1, 1, 1]
        seqs.append((ids, mask))
        greedy = torch.tensor(np.where(rng.random(n) < 0.6, used[rng.integers(0, DRAFT, n)].numpy(),
                                       rng.integers(0, V, n)))
        feats.append((torch.randn(n, 3 * H).to(torch.bfloat16), torch.randn(n, H).to(torch.bfloat16), greedy))
    ctx = {"embed": embed, "head_w": torch.randn(DRAFT, H), "t2d": t2d, "used": used, "cfg": CFG,
           "rope_theta": 10000.0, "ttt_length": T}
    return head, ctx, seqs, feats


@pytest.mark.parametrize("batch", [[1, 2], [2, 1, 3, 4], [3], [0, 4]])
def test_packed_step_equals_padded_step(batch):
    head, ctx, seqs, feats = setup()
    weights = [0.8 ** k for k in range(T)]
    loss, accs, counts = D._step(head, ctx, seqs, feats, batch, weights)
    grads = torch.autograd.grad(loss, list(head.parameters()), allow_unused=True)
    ref_loss, ref_accs, ref_counts = reference_step(head, ctx, seqs, feats, batch, weights)
    ref_grads = torch.autograd.grad(ref_loss, list(head.parameters()), allow_unused=True)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert float(loss) > 0
    assert accs == pytest.approx(ref_accs, abs=1e-6)
    assert counts == ref_counts
    assert sum(c[2] for c in counts) > 0
    for g, r in zip(grads, ref_grads):
        g = torch.zeros(1) if g is None else g
        r = torch.zeros(1) if r is None else r
        assert torch.allclose(g, r, rtol=1e-4, atol=1e-6)
    assert any(float(r.abs().sum()) > 0 for r in ref_grads if r is not None)


def test_a_sequence_with_nothing_to_score_has_no_needed_position_and_no_loss():
    head, ctx, seqs, feats = setup()
    assert D.needed_positions(seqs[0][1], len(seqs[0][0]), T) == []
    loss, accs, counts = D._step(head, ctx, seqs, feats, [0], [1.0, 0.8, 0.64])
    assert float(loss) == 0.0 and accs == [0.0] * T
    assert [c[2] for c in counts] == [0.0] * T


def test_needed_positions_are_those_a_later_assistant_token_scores():
    # tokens 5 and 6 are assistant tokens: step 0 at i scores i+2, step 2 scores i+4
    mask = [0, 0, 0, 0, 0, 1, 1, 0, 0]
    assert D.needed_positions(mask, 9, 3) == [1, 2, 3, 4]
    assert D.needed_positions(mask, 9, 1) == [3, 4]
    # the last token feeds nothing: position n-1 is never needed
    assert D.needed_positions([0, 0, 1], 3, 3) == [0]


def test_the_greedy_token_is_read_only_where_an_assistant_token_follows():
    """`target_features` leaves the greedy token 0 where no assistant token follows: the step must not
    read it there (same loss and counts with any value in those places)."""
    head, ctx, seqs, feats = setup(seed=3)
    other = []
    for (ids, mask), (a, h, g) in zip(seqs, feats):
        g2 = g.clone()
        for p in range(len(ids)):
            if not (p + 1 < len(ids) and mask[p + 1]):
                g2[p] = 0
        other.append((a, h, g2))
    w = [1.0, 0.8, 0.64]
    a = D._step(head, ctx, seqs, feats, [1, 3, 4], w)
    b = D._step(head, ctx, seqs, other, [1, 3, 4], w)
    assert float(a[0]) == pytest.approx(float(b[0]), rel=1e-6) and a[2] == b[2]


def test_target_features_compute_the_greedy_token_where_the_step_reads_it():
    """Against the full head's argmax at every position: equal where an assistant token follows, 0
    elsewhere; the hidden states are the model's own."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    ids = list(range(3, 23))
    mask = [0] * 6 + [1] * 5 + [0] * 4 + [1] * 3 + [0] * 2
    feats, _ = D.target_features(None, [(ids, mask)], [2, 3, 4], lambda m: None, model=model)
    aux, last, greedy = feats[0]
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        full = model.lm_head(out.last_hidden_state[0]).argmax(-1)
    read = [p for p in range(len(ids) - 1) if mask[p + 1]]
    assert read == [5, 6, 7, 8, 9, 14, 15, 16]
    assert greedy[read].tolist() == full[read].tolist()
    assert all(greedy[p] == 0 for p in range(len(ids)) if p not in read)
    assert torch.allclose(last.float(), out.last_hidden_state[0], atol=1e-2)
    assert aux.shape == (len(ids), 3 * 32)
