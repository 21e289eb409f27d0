"""EAGLE-3 training rate against its floor: the real training step beside a bare forward and backward
pass of the same head, side by side in one run.

Trains the default head (SmolLM2-135M target, draft vocabulary 2048, ttt_length 3) for a few steps on
the demo training root (built here if the workflow has not built it), and times, on batches of the
same shape:
  bare       one forward and backward pass of the head (fc, the decoder layer, norm, lm_head) with a
             plain cross-entropy: the floor of any training step
  ttt        the same head unrolled ttt_length steps with the training-time-test attention and the
             soft-target loss, as specmatch.training.drafter trains it
and reports tokens/s of both and specmatch's end-to-end training rate (data, batches and all).

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--target", default=str(REPO / "results" / "models" / "smollm2-135m"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    a = p.parse_args()
    import torch

    from specmatch.training.drafter import Budget, build_head, train, ttt_forward
    from specmatch.data.inspect_pass import inspect_root
    from specmatch.data.rows import ChatTemplate
    from specmatch.data.tokenizer import load_tokenizer

    cfg = json.loads((Path(a.target) / "config.json").read_text())
    budget = Budget(steps=a.steps, train_tokens=4000, seq_len=a.seq_len, batch_size=a.batch)
    H, V = cfg["hidden_size"], budget.draft_vocab
    torch.manual_seed(0)
    head = build_head(cfg, V)
    embed = torch.nn.Embedding(cfg["vocab_size"], H)
    embed.requires_grad_(False)
    B, L = a.batch, a.seq_len - 1
    aux = torch.randn(B, L, 3 * H)
    ids = torch.randint(0, cfg["vocab_size"], (B, L + 1 + budget.ttt_length))
    labels = torch.randint(0, V, (B, L))
    opt = torch.optim.AdamW(head.parameters(), lr=1e-4)

    def bare():
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
        return torch.nn.functional.cross_entropy(head.lm_head(head.norm(h)).reshape(-1, V), labels.reshape(-1))

    def ttt():
        outs = ttt_forward(head, embed, aux, ids, 100000.0, budget.ttt_length)
        return sum(0.8 ** k * torch.nn.functional.cross_entropy(o.reshape(-1, V), labels.reshape(-1))
                   for k, o in enumerate(outs))

    def rate(step, n):
        for _ in range(2):  # warm-up
            opt.zero_grad()
            step().backward()
        t0 = time.perf_counter()
        for _ in range(n):
            opt.zero_grad()
            step().backward()
            opt.step()
        return n * B * L / (time.perf_counter() - t0)

    r_bare, r_ttt = rate(bare, a.steps), rate(ttt, a.steps)
    with tempfile.TemporaryDirectory() as d:
        root = REPO / "resources" / "demo" / "prepared"
        if not root.exists():
            from specmatch.data.demo import build

            root = Path(d) / "prepared"
            build(root, a.target, {"code_instruct": 40, "agent_traces": 20, "python_docs": 30})
        m, cuts = inspect_root(root, a.target, holdout={"fraction": 0.2})
        state = train(Path(a.target), cuts, ChatTemplate.of(load_tokenizer(a.target)), budget,
                      log=lambda msg: None)
    m = state["metrics"]
    print(f"head: hidden {H}, draft vocabulary {V}, batch {B} x {L} tokens, ttt_length {budget.ttt_length}; "
          f"{torch.get_num_threads()} torch threads")
    print(f"bare forward + backward (one step, plain CE):   {r_bare:8.0f} tokens/s")
    print(f"training-time test ({budget.ttt_length} unrolled steps, soft targets): {r_ttt:8.0f} tokens/s "
          f"({r_ttt / r_bare:.2f}x the bare pass; {budget.ttt_length} steps cost at least {budget.ttt_length}x)")
    print(f"specmatch.training.drafter end to end ({m['steps']} steps, data and batching included): "
          f"{m['train_tokens_per_s']:8.0f} tokens/s ({m['train_tokens_per_s'] / r_bare:.2f}x the bare pass); "
          f"target features {m['feature_seconds']} s")


if __name__ == "__main__":
    main()
