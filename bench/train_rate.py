"""EAGLE-3 training rate against its floor and against the padded step: the real training step beside
a bare forward and backward pass of the same head, and beside the padded computation it replaced,
side by side in one run.

Trains the default head (SmolLM2-135M target, draft vocabulary 2048, ttt_length 3) for a few steps on
the demo training root (built here if the workflow has not built it), and times, on the same batches
of the demo's own training sequences (their lengths and assistant spans; the features are random,
which changes no cost):
  bare       one forward and backward pass of the head (fc, the decoder layer, norm, lm_head) over every
             position of a padded batch with a plain cross-entropy
  padded     the training-time test over every position of a padded batch (the step as it was before
             3 Dec 2026; tests/test_drafter_ttt.py keeps it as the reference the packed step must equal)
  packed     specmatch.training.drafter's step: packed sequences, only the positions that can carry loss
and reports tokens/s of each (tokens of the sequences, padding not counted), the packed step over the
padded one, and specmatch's end-to-end training rate (data, batches and all).

    .venv/bin/python bench/train_rate.py [--steps 20] [--target results/models/smollm2-135m]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--target", default=str(REPO / "results" / "models" / "smollm2-135m"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    a = p.parse_args()
    import torch

    import numpy as np

    from specmatch.training.drafter import Budget, _step, build_head, needed_positions, read_sequences, train
    from specmatch.data.inspect_pass import inspect_root
    from specmatch.data.rows import ChatTemplate, training_rows
    from specmatch.data.tokenizer import load_tokenizer
    from test_drafter_ttt import reference_step

    cfg = json.loads((Path(a.target) / "config.json").read_text())
    budget = Budget(steps=a.steps, train_tokens=4000, seq_len=a.seq_len, batch_size=a.batch)
    H, V, T = cfg["hidden_size"], budget.draft_vocab, budget.ttt_length
    torch.manual_seed(0)
    head = build_head(cfg, V)
    embed = torch.nn.Embedding(cfg["vocab_size"], H)
    embed.requires_grad_(False)
    opt = torch.optim.AdamW(head.parameters(), lr=1e-4)
    with tempfile.TemporaryDirectory() as d:
        root = demo_root(Path(d), a.target)
        _, cuts = inspect_root(root, a.target, holdout={"fraction": 0.2})
        seqs = read_sequences(training_rows(cuts, 0), ChatTemplate.of(load_tokenizer(a.target)),
                              Budget(train_tokens=20_000, seq_len=a.seq_len))
    feats = [(torch.randn(len(i), 3 * H).to(torch.bfloat16), torch.randn(len(i), H).to(torch.bfloat16),
              torch.randint(0, cfg["vocab_size"], (len(i),))) for i, _ in seqs]
    used = torch.arange(V) * (cfg["vocab_size"] // V)
    t2d = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    t2d[used] = True
    for f in feats:  # most greedy tokens in the draft vocabulary, as in training
        f[2][torch.rand(len(f[2])) < 0.8] = used[torch.randint(0, V, (1,))]
    ctx = {"embed": embed, "head_w": torch.randn(V, H), "t2d": t2d, "used": used, "cfg": cfg,
           "rope_theta": 100000.0, "ttt_length": T}
    rng = np.random.default_rng(0)
    batches = [rng.choice(len(seqs), size=a.batch, replace=False).tolist() for _ in range(a.steps + 2)]
    weights = [0.8 ** k for k in range(T)]

    def bare(batch):
        L = max(len(seqs[b][0]) for b in batch) - 1
        B = len(batch)
        aux = torch.zeros(B, L, 3 * H)
        ids = torch.zeros(B, L + 1, dtype=torch.long)
        for j, b in enumerate(batch):
            n = len(seqs[b][0])
            aux[j, :n - 1] = feats[b][0][:n - 1].float()
            ids[j, :n] = torch.tensor(seqs[b][0])
        layer = head.midlayer
        h = head.fc(aux)
        x = torch.cat([layer.input_layernorm(embed(ids[:, 1:L + 1])), layer.hidden_norm(h)], dim=-1)
        nh, nkv, hd = head.dims
        q = layer.self_attn.q_proj(x).view(B, L, nh, hd).transpose(1, 2)
        k = layer.self_attn.k_proj(x).view(B, L, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, 1)
        v = layer.self_attn.v_proj(x).view(B, L, nkv, hd).transpose(1, 2).repeat_interleave(nh // nkv, 1)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + layer.self_attn.o_proj(att.transpose(1, 2).reshape(B, L, nh * hd))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        labels = torch.randint(0, V, (B, L))
        return torch.nn.functional.cross_entropy(head.lm_head(head.norm(h)).reshape(-1, V), labels.reshape(-1))

    def padded(batch):
        return reference_step(head, ctx, seqs, feats, batch, weights)[0]

    def packed(batch):
        return _step(head, ctx, seqs, feats, batch, weights)[0]

    def rate(step):
        for b in batches[:2]:  # warm-up
            opt.zero_grad()
            step(b).backward()
        t0, tokens = time.perf_counter(), 0
        for b in batches[2:]:
            opt.zero_grad()
            step(b).backward()
            opt.step()
            tokens += sum(len(seqs[i][0]) for i in b)
        return tokens / (time.perf_counter() - t0)

    rates = {}
    for _ in range(2):  # interleaved, twice: drift of the machine lands on all three alike
        for name, step in (("bare", bare), ("padded", padded), ("packed", packed)):
            rates.setdefault(name, []).append(rate(step))
    r_bare, r_pad, r_packed = (sum(rates[k]) / 2 for k in ("bare", "padded", "packed"))
    with tempfile.TemporaryDirectory() as d:
        root = demo_root(Path(d), a.target)
        _, cuts = inspect_root(root, a.target, holdout={"fraction": 0.2})
        state = train(Path(a.target), cuts, ChatTemplate.of(load_tokenizer(a.target)), budget,
                      log=lambda msg: None)
    m = state["metrics"]
    assigned = sum(len(s) for s, _ in seqs)
    scored = sum(len(needed_positions(m, len(s), T)) for s, m in seqs)
    print(f"head: hidden {H}, draft vocabulary {V}, batches of {a.batch} demo sequences (up to {a.seq_len} tokens; "
          f"{scored / assigned:.0%} of positions can carry loss), ttt_length {T}; {torch.get_num_threads()} torch threads")
    print(f"bare forward + backward (one step, plain CE, padded):  {r_bare:8.0f} tokens/s")
    print(f"training-time test, padded, every position:           {r_pad:8.0f} tokens/s "
          f"({r_pad / r_bare:.2f}x the bare pass)")
    print(f"training-time test, packed, positions with loss only: {r_packed:8.0f} tokens/s "
          f"({r_packed / r_pad:.2f}x the padded step; {r_packed / r_bare:.2f}x the bare pass)")
    print(f"specmatch.training.drafter end to end ({m['steps']} steps, data and batching included): "
          f"{m['train_tokens_per_s']:8.0f} tokens/s; target features {m['feature_seconds']} s")


def demo_root(tmp: Path, target: str) -> Path:
    root = REPO / "resources" / "demo" / "prepared"
    if root.exists():
        return root
    from specmatch.data.demo import build

    root = tmp / "prepared"
    build(root, target, {"code_instruct": 40, "agent_traces": 20, "python_docs": 30})
    return root

if __name__ == "__main__":
    main()
