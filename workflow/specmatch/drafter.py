"""Train an EAGLE-3 draft head for a target on the training data, on the CPU, within a step budget.

The recipe follows EAGLE-3 as SpecForge implements it (sgl-project/SpecForge: specforge/modeling/
draft/llama3_eagle.py, specforge/algorithms/eagle3/model.py):

- **features**: the target's residual stream after a low, a middle and a high layer (vLLM's default
  for Llama: after layers 2, n/2 and n-3), concatenated and fused by a linear layer `fc` into one
  hidden state;
- **one decoder layer** (`midlayer`) whose attention reads the token embedding (the target's own,
  frozen and not saved: vLLM shares it) concatenated with that hidden state;
- **training-time test**: the head is unrolled `ttt_length` steps; step k feeds back its own output
  hidden state and the next token, attends to the real sequence (step 0) plus its own earlier steps
  at the same position, and is scored against the target's distribution k+1 tokens ahead;
- **a reduced draft vocabulary**: the `draft_vocab` most frequent assistant tokens of the training
  data, so every draft step's head is small; `d2t` maps a draft id back to the target's
  (target = draft + d2t[draft]), `t2d` marks the target ids the draft can propose.

Only rows marked as seen in training (the cut table's holdout flag is False) are read: the held-out
rows stay unseen, so a suite of them measures how the drafter generalises. The same seed and
budget give the same weights. The checkpoint is what SpecForge writes and vLLM loads for
`method: eagle3`: `config.json` (architectures LlamaForCausalLMEagle3, draft_vocab_size,
eagle_config.eagle_aux_hidden_state_layer_ids) and `model.safetensors` (fc, midlayer.*, norm,
lm_head, d2t, t2d). A SpecForge drafter goes through the same serving path.

    python -m specmatch.drafter --target DIR --manifest manifest.json --cuts cuts.parquet --out DIR
        [--steps 300] [--train-tokens 40000] [--draft-vocab 4096] [--ttt-length 3] [--seed 0]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from . import readers, steps
from .files import SpecmatchError, atomic_dir, read_json
from .inspection import read_cuts
from .provenance import Recorder
from .records import Cut, Manifest
from .rows import ChatTemplate, flat, mask_of, normalise_messages, tools_of
from .tokenizer import load_tokenizer

CONFIG_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
               "max_position_embeddings", "hidden_act", "vocab_size", "bos_token_id", "eos_token_id", "head_dim",
               "pad_token_id")


@dataclass
class Budget:
    """What training may spend; the same budget and seed give the same weights."""
    steps: int = 300
    train_tokens: int = 40_000      # target forward passes over at most this many tokens of training rows
    seq_len: int = 256              # rows are cut into sequences of at most this many tokens
    batch_size: int = 2
    draft_vocab: int = 2048
    ttt_length: int = 3
    lr: float = 3e-3
    seed: int = 0
    threads: int = 0                # torch threads (0: all cores)


# -- training data -----------------------------------------------------------------------------
def training_rows(cuts, budget: Budget):
    """The rows training may read: seen (not held-out) rows of the cut table, in a seeded order,
    enough to cover the token budget. Returns [(file, line, offset, row, schema)]."""
    seen = cuts.filter(~pl.col("holdout")).unique(["file", "row"], keep="first").sort(["file", "row"])
    if seen.is_empty():
        raise SpecmatchError("drafter: no training rows (every row is held out, or the cut table is empty)")
    order = np.random.default_rng(budget.seed).permutation(seen.height)
    return seen[order.tolist()]


def sequences(rows, template, budget: Budget) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) per training sequence, read from the chosen rows only."""
    out, total = [], 0
    by_file: dict[str, dict] = {}
    picked = []
    for c in (Cut.from_json(r) for r in rows.iter_rows(named=True)):
        if c.holdout:  # never: training_rows filters them, and this guards the promise
            raise SpecmatchError(f"drafter: {c.file}:{c.line} is a held-out row")
        pos = c.offset if c.offset is not None else c.row
        by_file.setdefault(c.file, {})[pos] = None
        picked.append((c.file, pos, c.schema))
        total += c.prompt_tokens + c.completion_tokens
        if total >= budget.train_tokens * 1.5:
            break
    loaded = {}
    for path, wanted in by_file.items():
        for pos, row in readers.read_rows(readers.sniff(Path(path)), wanted).items():
            loaded[(path, pos)] = row
    total = 0
    for path, pos, schema in picked:
        row = loaded[(path, pos)]
        if schema == "tokenized":
            ids = flat(row["input_ids"])
            mask, _ = mask_of(row)
            if mask is None:
                mask = [0] * len(ids)
                for s, e in template.spans_in_array(np.asarray(ids)):
                    mask[s:e] = [1] * (e - s)
        else:
            text = row["text"] if schema == "text" else template.tok.apply_chat_template(
                normalise_messages(row.get("conversations", row.get("messages")), row.get("system")),
                tokenize=False, tools=tools_of(row))
            ids = template.tok(text, add_special_tokens=False)["input_ids"]
            mask = [0] * len(ids)
            for s, e in template.spans_in_array(np.asarray(ids)):
                mask[s:e] = [1] * (e - s)
        for start in range(0, len(ids), budget.seq_len):
            seg_ids, seg_mask = ids[start:start + budget.seq_len], mask[start:start + budget.seq_len]
            if len(seg_ids) > budget.ttt_length + 2 and any(seg_mask):
                out.append((seg_ids, seg_mask))
                total += len(seg_ids)
            if total >= budget.train_tokens:
                return out
    if not out:
        raise SpecmatchError("drafter: the training rows hold no assistant tokens to learn from")
    return out


def draft_vocabulary(seqs, size: int, vocab_size: int) -> tuple[np.ndarray, dict]:
    """The `size` most frequent assistant tokens (ties broken by id), sorted by id, as SpecForge does:
    d2t[i] = used[i] - i maps draft id i to target id used[i]."""
    counts = Counter()
    for ids, mask in seqs:
        counts.update(t for t, m in zip(ids, mask) if m)
    top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
    used = sorted(t for t, _ in top)
    # pad with the lowest unused ids, so the draft vocabulary always has `size` entries
    k = 0
    have = set(used)
    while len(used) < size:
        if k not in have:
            used.append(k)
        k += 1
    used = np.array(sorted(used), dtype=np.int64)
    covered = sum(c for t, c in top)
    return used, {"draft_vocab": size, "assistant_tokens": int(sum(counts.values())),
                  "coverage": covered / max(1, sum(counts.values())), "distinct_assistant_tokens": len(counts)}


# -- the target's features ---------------------------------------------------------------------
def default_aux_layers(num_layers: int) -> list[int]:
    """vLLM's default EAGLE-3 layers for Llama (get_eagle3_default_aux_hidden_state_layers)."""
    return [2, num_layers // 2, num_layers - 3]


def target_features(target_dir: Path, seqs, aux_layers: list[int], log) -> tuple[list, object]:
    """Per sequence: the aux hidden states (L x 3H), the target's final normed hidden state (L x H) and
    its greedy next token (L), from the target's own forward pass; also returns the target model (its
    embeddings, head and norm)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    model.eval()
    feats, t0, done = [], time.time(), 0
    total = sum(len(ids) for ids, _ in seqs)
    with torch.no_grad():
        for i, (ids, _mask) in enumerate(seqs):
            out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            hs = out.hidden_states  # [embeddings, after layer 1, ..., after layer n (normed)]
            aux = torch.cat([hs[k][0] for k in aux_layers], dim=-1).to(torch.bfloat16)
            last = out.last_hidden_state[0]
            feats.append((aux, last.to(torch.bfloat16), model.lm_head(last).argmax(-1)))
            done += len(ids)
            if i % 20 == 0 or i == len(seqs) - 1:
                rate = done / max(1e-9, time.time() - t0)
                log(f"features: {done}/{total} tokens, {rate:.0f} tokens/s, ETA {(total - done) / rate:.0f} s")
    return feats, model


# -- the draft head ----------------------------------------------------------------------------
def build_head(cfg: dict, draft_vocab: int):
    """The EAGLE-3 head as SpecForge defines it (parameter names are the checkpoint's)."""
    import torch
    from torch import nn

    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
            self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
            self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, H, bias=False)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(H, I, bias=False)
            self.up_proj = nn.Linear(H, I, bias=False)
            self.down_proj = nn.Linear(I, H, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()
            self.mlp = MLP()
            self.hidden_norm = RMSNorm(H)
            self.input_layernorm = RMSNorm(H)
            self.post_attention_layernorm = RMSNorm(H)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * H, H, bias=False)
            self.midlayer = Layer()
            self.norm = RMSNorm(H)
            self.lm_head = nn.Linear(H, draft_vocab, bias=False)
            self.dims = (nh, nkv, hd)

    return Head()


def rope(positions, hd: int, theta: float):
    import torch

    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = positions[:, None].float() * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rotate(x, cos, sin):
    import torch

    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def ttt_forward(head, embed, aux, ids, theta: float, length: int):
    """Unroll the head `length` steps over one batch (B x L), as SpecForge's SDPA path does: step k
    attends causally to step 0's keys and to its own earlier steps' keys at the same position.
    Returns the logits of every step (B x L x V_draft)."""
    import torch

    B, L, _ = aux.shape
    nh, nkv, hd = head.dims
    layer = head.midlayer
    hidden = head.fc(aux)
    causal = torch.full((L, L), float("-inf")).triu(1)
    keys, vals, outs = [], [], []
    for k in range(length):
        step_ids = ids[:, k + 1:k + 1 + L]
        if step_ids.shape[1] < L:  # past the end: pad (those positions carry no loss)
            step_ids = torch.nn.functional.pad(step_ids, (0, L - step_ids.shape[1]))
        emb = layer.input_layernorm(embed(step_ids))
        residual = hidden
        x = torch.cat([emb, layer.hidden_norm(hidden)], dim=-1)
        q = layer.self_attn.q_proj(x).view(B, L, nh, hd).transpose(1, 2)
        kk = layer.self_attn.k_proj(x).view(B, L, nkv, hd).transpose(1, 2)
        v = layer.self_attn.v_proj(x).view(B, L, nkv, hd).transpose(1, 2)
        cos, sin = rope(torch.arange(L) + k, hd, theta)
        q, kk = _rotate(q, cos, sin), _rotate(kk, cos, sin)
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


# -- training ----------------------------------------------------------------------------------
def train(target_dir: Path, cuts, template, budget: Budget, aux_layers: list[int] | None = None, log=print) -> dict:
    """Train the head; returns its state (weights, vocabulary, config, metrics) for `save`."""
    import torch

    torch.manual_seed(budget.seed)
    if budget.threads:
        torch.set_num_threads(budget.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    cfg = read_json(Path(target_dir) / "config.json")
    rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or 10000.0
    aux_layers = aux_layers or default_aux_layers(cfg["num_hidden_layers"])
    t0 = time.time()
    seqs = sequences(training_rows(cuts, budget), template, budget)
    used, vocab_info = draft_vocabulary(seqs, budget.draft_vocab, cfg["vocab_size"])
    log(f"training data: {len(seqs)} sequences, {sum(len(s) for s, _ in seqs)} tokens; draft vocabulary "
        f"{budget.draft_vocab} covers {vocab_info['coverage']:.1%} of assistant tokens")
    feats, target = target_features(target_dir, seqs, aux_layers, log)
    t_feat = time.time() - t0
    embed = target.model.embed_tokens
    embed.requires_grad_(False)
    t2d = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    t2d[torch.from_numpy(used)] = True
    head = build_head(cfg, budget.draft_vocab)
    with torch.no_grad():  # start from the target's own output head and final norm on the draft vocabulary,
        head.lm_head.weight.copy_(target.lm_head.weight[torch.from_numpy(used)])
        head.norm.weight.copy_(target.model.norm.weight)
        head.midlayer.self_attn.o_proj.weight.zero_()  # and a layer that starts as the identity on its
        head.midlayer.mlp.down_proj.weight.zero_()      # residual stream (the fused features pass through)
    head_w = target.lm_head.weight[torch.from_numpy(used)].detach()
    opt = torch.optim.AdamW(head.parameters(), lr=budget.lr, weight_decay=0.0)
    warm = max(1, budget.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / budget.steps))))
    rng = np.random.default_rng(budget.seed)
    weights = [0.8 ** k for k in range(budget.ttt_length)]  # EAGLE-3's per-step loss weights
    t1, tokens, history = time.time(), 0, []
    for step in range(budget.steps):
        batch = rng.choice(len(seqs), size=min(budget.batch_size, len(seqs)), replace=False)
        L = max(len(seqs[b][0]) for b in batch) - 1
        ids = torch.zeros(len(batch), L + 1 + budget.ttt_length, dtype=torch.long)
        mask = torch.zeros(len(batch), L + 1 + budget.ttt_length)
        aux = torch.zeros(len(batch), L, 3 * cfg["hidden_size"])
        last = torch.zeros(len(batch), L + 1 + budget.ttt_length, cfg["hidden_size"])
        greedy = torch.zeros(len(batch), L + 1 + budget.ttt_length, dtype=torch.long)
        for j, b in enumerate(batch):
            s_ids, s_mask = seqs[b]
            n = len(s_ids)
            ids[j, :n] = torch.tensor(s_ids)
            mask[j, :n] = torch.tensor(s_mask, dtype=torch.float32)
            aux[j, :n - 1] = feats[b][0][:n - 1].float()
            last[j, :n] = feats[b][1].float()
            greedy[j, :n] = feats[b][2]
        logits = ttt_forward(head, embed, aux, ids, rope_theta, budget.ttt_length)
        loss, accs = 0.0, []
        for k, lg in enumerate(logits):
            # step k at position i predicts token i+2+k: the target's distribution at position i+1+k
            with torch.no_grad():
                tgt_logits = last[:, 1 + k:1 + k + L] @ head_w.T
                full_argmax = greedy[:, 1 + k:1 + k + L]
                valid = mask[:, 2 + k:2 + k + L] * t2d[full_argmax].float()
                p = torch.softmax(tgt_logits, dim=-1)
            lp = torch.log_softmax(lg, dim=-1)
            denom = valid.sum().clamp_min(1.0)
            loss = loss + weights[k] * (-(p * lp).sum(-1) * valid).sum() / denom
            with torch.no_grad():
                pred = torch.from_numpy(used)[lg.argmax(-1)]
                accs.append(float(((pred == full_argmax).float() * valid).sum() / denom))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        tokens += int(sum(len(seqs[b][0]) for b in batch))
        history.append({"step": step + 1, "loss": float(loss.detach()), "acc": accs})
        if step % 10 == 0 or step == budget.steps - 1:
            rate = tokens / max(1e-9, time.time() - t1)
            eta = (budget.steps - step - 1) * (time.time() - t1) / (step + 1)
            log(f"step {step + 1}/{budget.steps}  loss {history[-1]['loss']:.3f}  top-1 agreement by draft step "
                + " ".join(f"{a:.2f}" for a in accs) + f"  {rate:.0f} tokens/s  ETA {eta:.0f} s")
    t_train = time.time() - t1
    last_acc = np.mean([h["acc"] for h in history[-max(1, budget.steps // 10):]], axis=0).tolist()
    return {"head": head, "used": used, "t2d": t2d, "cfg": cfg, "aux_layers": aux_layers,
            "metrics": {**vocab_info, "sequences": len(seqs), "feature_seconds": round(t_feat, 1),
                        "train_seconds": round(t_train, 1), "train_tokens_per_s": round(tokens / max(t_train, 1e-9)),
                        "final_loss": history[-1]["loss"], "final_top1_agreement_by_step": last_acc,
                        "steps": budget.steps}}


def checkpoint_config(cfg: dict, budget: Budget, aux_layers: list[int]) -> dict:
    """config.json as SpecForge writes it for a Llama target (and vLLM reads it for eagle3)."""
    out = {k: cfg[k] for k in CONFIG_KEYS if k in cfg}
    rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or 10000.0
    out.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "draft_vocab_size": budget.draft_vocab, "rope_theta": rope_theta, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16", "target_hidden_size": cfg["hidden_size"],
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers, "use_aux_hidden_state": True}})
    return out


def save(state: dict, out: Path, budget: Budget, provenance: dict) -> None:
    """Write the checkpoint atomically (a folder renamed into place)."""
    import torch
    from safetensors.torch import save_file

    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state["head"].state_dict().items()}
    used = torch.from_numpy(state["used"])
    sd["d2t"] = (used - torch.arange(len(used))).to(torch.int64)
    sd["t2d"] = state["t2d"].contiguous()
    with atomic_dir(out) as tmp:
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(checkpoint_config(state["cfg"], budget, state["aux_layers"]),
                                                    indent=2) + "\n")
        (tmp / "specmatch_drafter.json").write_text(json.dumps(
            {"budget": asdict(budget), "metrics": state["metrics"], **provenance}, indent=2) + "\n")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, type=Path, help="the target model folder (HF safetensors)")
    p.add_argument("--manifest", required=True, type=Path)
    p.add_argument("--cuts", required=True, type=Path)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--budget", default="{}", help="the training budget as JSON (see Budget)")
    p.add_argument("--aux-layers", default=None, help="comma-separated target layers (default: vLLM's)")


def execute(a: argparse.Namespace) -> int:
    budget = Budget(**json.loads(a.budget))
    files = Manifest.from_json(read_json(a.manifest)).training_files()
    rec = Recorder("train_drafter", [a.target, a.cuts, *files], {"budget": asdict(budget)})
    state = train(a.target, read_cuts(a.cuts), ChatTemplate.of(load_tokenizer(a.tokenizer)), budget,
                  [int(x) for x in a.aux_layers.split(",")] if a.aux_layers else None,
                  log=lambda m: print(m, flush=True))
    save(state, a.out, budget, {"target": str(a.target), "training_files": files,
                                "holdout": "rows whose cut-table holdout flag is true were never read"})
    rec.write([a.out])
    print(json.dumps(state["metrics"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("drafter", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
