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

Training reads only rows marked as seen (the cut table's holdout flag is False): the held-out rows
stay unseen, so a suite of them measures how the drafter generalises. With `--regenerated DIR` (the
output of `specmatch.training.regenerate`) the seen rows' assistant turns are the target's own greedy answers
(SpecForge's scripts/regenerate_train_data.py recipe), matched to the cut table by file and row, so
the holdout is that of the original rows. After training, `evaluate` reports top-1 agreement per
draft step on seen rows and on held-out rows (read then, for that only). The same seed and budget
give the same weights. The checkpoint is what SpecForge writes and vLLM loads for
`method: eagle3`: `config.json` (architectures LlamaForCausalLMEagle3, draft_vocab_size,
eagle_config.eagle_aux_hidden_state_layer_ids) and `model.safetensors` (fc, midlayer.*, norm,
lm_head, d2t, t2d). A SpecForge drafter goes through the same serving path.

    python -m specmatch drafter --target DIR --manifest manifest.json --cuts cuts.parquet --out DIR
        [--budget JSON] [--aux-layers 2,15,27] [--regenerated DIR]
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

from ..data import readers
from .. import steps
from ..files import SpecmatchError, atomic_dir, read_json
from ..data.cuts import read_cuts
from ..provenance import Recorder
from ..records import Cut, Manifest
from ..data.rows import ChatTemplate, row_ids_and_mask, training_rows
from ..data.tokenizer import load_tokenizer

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
    eval_tokens: int = 4000         # after training: agreement on this many tokens of seen and of held-out rows


# -- training data -----------------------------------------------------------------------------
def sequences(rows, template, budget: Budget, store: dict | None = None, limit: int | None = None,
              ) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) per training sequence, read from the chosen rows only, up to `limit`
    tokens (default: the budget's train_tokens). With `store` ({(file, position): (ids, mask)}, the
    regenerated rows), a row's content comes from the store and rows absent from it are passed over."""
    for c in (Cut.from_json(r) for r in rows.iter_rows(named=True)):
        if c.holdout:  # never: training_rows filters them, and this guards the promise
            raise SpecmatchError(f"drafter: {c.file}:{c.line} is a held-out row")
    out = read_sequences(rows, template, budget, store, limit)
    if not out:
        raise SpecmatchError("drafter: the training rows hold no assistant tokens to learn from")
    return out


def read_sequences(rows, template, budget: Budget, store: dict | None = None, limit: int | None = None) -> list:
    """The reading behind `sequences`, without its guard: also reads held-out rows, which only the
    evaluation after training asks for (agreement on rows the head never trained on)."""
    limit = budget.train_tokens if limit is None else limit
    out, total = [], 0
    picked = []
    for c in (Cut.from_json(r) for r in rows.iter_rows(named=True)):
        if store is not None:
            if (c.file, c.position) not in store:
                continue
            total += len(store[(c.file, c.position)][0])
        else:
            total += c.prompt_tokens + c.completion_tokens
        picked.append((c.file, c.position, c.schema))
        if total >= limit * 1.5:
            break
    loaded = {} if store is not None else readers.read_located((path, pos) for path, pos, _ in picked)
    total = 0
    for path, pos, schema in picked:
        ids, mask = store[(path, pos)] if store is not None else row_ids_and_mask(loaded[(path, pos)], schema, template)
        for start in range(0, len(ids), budget.seq_len):
            seg_ids, seg_mask = ids[start:start + budget.seq_len], mask[start:start + budget.seq_len]
            if len(seg_ids) > budget.ttt_length + 2 and any(seg_mask):
                out.append((seg_ids, seg_mask))
                total += len(seg_ids)
            if total >= limit:
                return out
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


def target_features(target_dir: Path, seqs, aux_layers: list[int], log, model=None) -> tuple[list, object]:
    """Per sequence: the aux hidden states (L x 3H), the target's final normed hidden state (L x H) and
    its greedy next token (L), from the target's own forward pass; also returns the target model (its
    embeddings, head and norm). The greedy token is computed where an assistant token follows (the
    only positions any loss or agreement reads it, `_step`) and left 0 elsewhere: the full-vocabulary
    head costs a quarter of the forward pass, and most positions of a training sequence are prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    if model is None:
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    model.eval()
    feats, t0, done = [], time.time(), 0
    total = sum(len(ids) for ids, _ in seqs)
    with torch.no_grad():
        for i, (ids, mask) in enumerate(seqs):
            out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
            hs = out.hidden_states  # [embeddings, after layer 1, ..., after layer n (normed)]
            aux = torch.cat([hs[k][0] for k in aux_layers], dim=-1).to(torch.bfloat16)
            last = out.last_hidden_state[0]
            read = torch.tensor([p for p in range(len(ids) - 1) if mask[p + 1]], dtype=torch.long)
            greedy = torch.zeros(len(ids), dtype=torch.long)
            greedy[read] = model.lm_head(last[read]).argmax(-1)
            feats.append((aux, last.to(torch.bfloat16), greedy))
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


def needed_positions(mask, n: int, length: int) -> list[int]:
    """The positions of a sequence of `n` tokens whose draft-step outputs can carry loss: step k at
    position i is scored on the assistant token i+2+k, so i matters when any of tokens i+2..i+1+length
    is an assistant token (and i < n-1: the last token has no next token to feed)."""
    return [i for i in range(n - 1) if any(mask[i + 2 + k] for k in range(length) if i + 2 + k < n)]


def ttt_forward(head, embed, aux, ids, need, theta: float, length: int):
    """Unroll the head `length` steps over one batch, as SpecForge's SDPA path does: step k attends
    causally to step 0's keys and to its own earlier steps' keys at the same position.

    The batch is packed, not padded: `aux` is a list of the sequences' features ((n_b - 1) x 3H),
    `ids` their token ids (n_b), `need` their `needed_positions`. Step 0's keys and values are computed
    at every position (any later query reads them), everything else only at the needed positions: a
    position's output at step k depends only on its own earlier steps and on step 0's keys up to it,
    so the rest (the prompt, most of a training sequence) changes no loss and no gradient. Same
    logits at the needed positions as the padded computation over every position, at about a third
    of its cost. Returns the logits of every step (Q x V_draft, the needed positions in order)."""
    import torch

    nh, nkv, hd = head.dims
    layer = head.midlayer
    rep = nh // nkv
    seq_of = torch.cat([torch.full((a.shape[0],), b, dtype=torch.long) for b, a in enumerate(aux)])
    pos = torch.cat([torch.arange(a.shape[0]) for a in aux])
    offsets = np.cumsum([0] + [a.shape[0] for a in aux])[:-1]
    rows = torch.cat([torch.as_tensor(nd, dtype=torch.long) + int(o) for nd, o in zip(need, offsets)])
    qpos, qseq = pos[rows], seq_of[rows]
    # the token each position feeds at step k: ids[i+1+k] (0 past the end, where no loss is scored)
    def tokens(k: int, at_rows: bool):
        out = []
        for b, (s_ids, nd) in enumerate(zip(ids, need)):
            where = torch.as_tensor(nd, dtype=torch.long) if at_rows else torch.arange(len(s_ids) - 1)
            j = where + 1 + k
            t = torch.as_tensor(s_ids, dtype=torch.long)[j.clamp_max(len(s_ids) - 1)]
            out.append(torch.where(j < len(s_ids), t, torch.zeros_like(t)))
        return torch.cat(out)

    def project(x, p):
        q = layer.self_attn.q_proj(x).view(-1, nh, hd).transpose(0, 1)
        k = layer.self_attn.k_proj(x).view(-1, nkv, hd).transpose(0, 1)
        v = layer.self_attn.v_proj(x).view(-1, nkv, hd).transpose(0, 1)
        cos, sin = rope(p, hd, theta)
        return _rotate(q, cos, sin), _rotate(k, cos, sin).repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)

    fused = head.fc(torch.cat(aux))
    x0 = torch.cat([layer.input_layernorm(embed(tokens(0, False))), layer.hidden_norm(fused)], dim=-1)
    # step 0 at every position: the keys and values every later query reads
    _, key0, val0 = project(x0, pos)
    allowed = (qseq[:, None] == seq_of[None, :]) & (pos[None, :] <= qpos[:, None])
    causal = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    hidden = fused[rows]
    keys, vals, outs = [], [], []
    for k in range(length):
        x = x0[rows] if k == 0 else torch.cat(
            [layer.input_layernorm(embed(tokens(k, True))), layer.hidden_norm(hidden)], dim=-1)
        q, kk, v = project(x, qpos + k)
        if k == 0:
            kk, v = key0[:, rows], val0[:, rows]
        keys.append(kk)
        vals.append(v)
        scores = [q @ key0.transpose(-1, -2) / math.sqrt(hd) + causal]
        scores += [(q * keys[j]).sum(-1, keepdim=True) / math.sqrt(hd) for j in range(1, len(keys))]
        w = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
        P = key0.shape[1]
        att = w[..., :P] @ val0
        for j in range(1, len(keys)):
            att = att + w[..., P + j - 1:P + j] * vals[j]
        att = layer.self_attn.o_proj(att.transpose(0, 1).reshape(-1, nh * hd))
        h = hidden + att
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        hidden = h
        outs.append(head.lm_head(head.norm(h)))
    return outs


# -- training ----------------------------------------------------------------------------------
def train(target_dir: Path, cuts, template, budget: Budget, aux_layers: list[int] | None = None, log=print,
          store: dict | None = None) -> dict:
    """Train the head; returns its state (weights, vocabulary, config, metrics) for `save`. With `store`
    (load_regenerated), the seen rows' content is the target's own regenerated answers."""
    import torch

    torch.manual_seed(budget.seed)
    if budget.threads:
        torch.set_num_threads(budget.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    cfg = read_json(Path(target_dir) / "config.json")
    rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta") or 10000.0
    aux_layers = aux_layers or default_aux_layers(cfg["num_hidden_layers"])
    t0 = time.time()
    seqs = sequences(training_rows(cuts, budget.seed), template, budget, store)
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
    ctx = {"embed": embed, "head_w": head_w, "t2d": t2d, "used": torch.from_numpy(used), "cfg": cfg,
           "rope_theta": rope_theta, "ttt_length": budget.ttt_length}
    t1, tokens, history = time.time(), 0, []
    for step in range(budget.steps):
        batch = rng.choice(len(seqs), size=min(budget.batch_size, len(seqs)), replace=False)
        loss, accs, _ = _step(head, ctx, seqs, feats, batch, weights)
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
            "eval": {"ctx": ctx, "seqs": seqs, "feats": feats, "target": target, "target_dir": target_dir},
            "metrics": {**vocab_info, "sequences": len(seqs), "feature_seconds": round(t_feat, 1),
                        "train_seconds": round(t_train, 1), "train_tokens_per_s": round(tokens / max(t_train, 1e-9)),
                        "final_loss": history[-1]["loss"], "final_top1_agreement_by_step": last_acc,
                        "steps": budget.steps, "training_rows": "regenerated" if store is not None else "original"}}


def _step(head, ctx: dict, seqs, feats, batch, weights):
    """One batch through the unrolled head: (loss, in-vocabulary agreement by step, counts by step).
    Step k at position i predicts token i+2+k, scored against the target's distribution at position
    i+1+k; counts are (agreeing, in-vocabulary, all assistant positions) per step, for evaluation.
    Only the positions that can carry loss are computed (`ttt_forward`); the loss is a mean over the
    batch's scored positions, as over a padded batch."""
    import torch

    T = ctx["ttt_length"]
    need = [needed_positions(seqs[b][1], len(seqs[b][0]), T) for b in batch]
    aux = [feats[b][0][:len(seqs[b][0]) - 1].float() for b in batch]
    logits = ttt_forward(head, ctx["embed"], aux, [seqs[b][0] for b in batch], need, ctx["rope_theta"], T)
    # per sequence: its length, its needed positions and its assistant mask
    rows = [(len(seqs[b][0]), torch.as_tensor(nd, dtype=torch.long), torch.as_tensor(seqs[b][1], dtype=torch.float32))
            for b, nd in zip(batch, need)]
    loss, accs, counts = 0.0, [], []
    for k, lg in enumerate(logits):
        with torch.no_grad():
            last, greedy, asst = [], [], []
            for b, (n, at, mask) in zip(batch, rows):
                here = (at + 1 + k).clamp_max(n - 1)  # the target's position; past the end no loss is scored
                last.append(feats[b][1][here].float())
                greedy.append(feats[b][2][here])
                scored = mask[(at + 2 + k).clamp_max(n - 1)]
                asst.append(torch.where(at + 2 + k < n, scored, torch.zeros_like(scored)))
            last, full_argmax, asst = torch.cat(last), torch.cat(greedy), torch.cat(asst)
            tgt_logits = last @ ctx["head_w"].T
            valid = asst * ctx["t2d"][full_argmax].float()
            p = torch.softmax(tgt_logits, dim=-1)
        lp = torch.log_softmax(lg, dim=-1)
        denom = valid.sum().clamp_min(1.0)
        loss = loss + weights[k] * (-(p * lp).sum(-1) * valid).sum() / denom
        with torch.no_grad():
            hit = (ctx["used"][lg.argmax(-1)] == full_argmax).float()
            accs.append(float((hit * valid).sum() / denom))
            counts.append((float((hit * valid).sum()), float(valid.sum()), float(asst.sum())))
    return loss, accs, counts


def evaluation_rows(cuts, holdout: bool, seed: int):
    """The rows of one side of the holdout (one per row), in a seeded order."""
    side = cuts.filter(pl.col("holdout") == holdout).unique(["file", "row"], keep="first").sort(["file", "row"])
    return side[np.random.default_rng(seed + 1).permutation(side.height).tolist()]


def evaluate(state: dict, cuts, template, budget: Budget, store: dict | None = None, log=print) -> dict:
    """Top-1 agreement by draft step of the trained head, after training, on `eval_tokens` tokens of:
    `seen` (the sequences it trained on: regenerated rows when it trained on them), `seen_original`
    (with regenerated training only: the original text of seen rows, the like-for-like comparison
    for held-out rows) and `held_out` (rows it never trained on; read here only, to evaluate). Each:
    `top1_agreement_by_step` (share of assistant positions where the head's first choice is the
    target's greedy token; a target token outside the draft vocabulary counts as a miss, as it does
    when serving), `top1_agreement_in_vocab_by_step` (the training metric's denominator), tokens."""
    import torch

    if budget.eval_tokens <= 0:
        return {}
    ev = state["eval"]
    ctx, aux_layers = ev["ctx"], state["aux_layers"]
    weights = [0.8 ** k for k in range(budget.ttt_length)]

    def score(seqs, feats) -> dict:
        tot = np.zeros((budget.ttt_length, 3))
        with torch.no_grad():
            for i in range(0, len(seqs), budget.batch_size):
                _, _, counts = _step(state["head"], ctx, seqs, feats, list(range(i, min(len(seqs), i + budget.batch_size))),
                                     weights)
                tot += np.array(counts)
        return {"top1_agreement_by_step": [round(a / max(n, 1.0), 4) for a, _, n in tot],
                "top1_agreement_in_vocab_by_step": [round(a / max(v, 1.0), 4) for a, v, _ in tot],
                "assistant_positions": int(tot[0, 2]), "sequences": len(seqs), "tokens": sum(len(s) for s, _ in seqs)}

    def upto(seqs, limit):
        out, total = [], 0
        for s in seqs:
            if total >= limit:
                break
            out.append(s)
            total += len(s[0])
        return out

    seen = upto(ev["seqs"], budget.eval_tokens)
    out = {"seen": score(seen, ev["feats"][:len(seen)])}
    sets = {}
    if store is not None:
        sets["seen_original"] = read_sequences(training_rows(cuts, budget.seed), template, budget, None, budget.eval_tokens)
    held = cuts.filter(pl.col("holdout"))
    if not held.is_empty():
        sets["held_out"] = read_sequences(evaluation_rows(cuts, True, budget.seed), template, budget, None,
                                          budget.eval_tokens)
    for name, seqs in sets.items():
        if seqs:
            feats, _ = target_features(ev["target_dir"], seqs, aux_layers, log, model=ev["target"])
            out[name] = score(seqs, feats)
    for name, r in out.items():
        log(f"agreement on {name} ({r['tokens']} tokens): top-1 by draft step "
            + " ".join(f"{a:.2f}" for a in r["top1_agreement_by_step"]))
    return out


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
    p.add_argument("--regenerated", default=None, type=Path,
                   help="train on the target's own answers: a `specmatch.training.regenerate` output folder (its rows "
                        "replace the seen rows they regenerated; the holdout stays the cut table's)")


def execute(a: argparse.Namespace) -> int:
    budget = Budget(**json.loads(a.budget))
    files = Manifest.from_json(read_json(a.manifest)).training_files()
    store, regen_info = None, None
    inputs = [a.target, a.cuts, *files]
    if a.regenerated:
        from .regenerate import load_regenerated

        store, regen_info = load_regenerated(a.regenerated)
        inputs.append(a.regenerated)
    rec = Recorder("train_drafter", inputs, {"budget": asdict(budget), "regenerated": bool(a.regenerated)})
    cuts = read_cuts(a.cuts)
    template = ChatTemplate.of(load_tokenizer(a.tokenizer))
    log = lambda m: print(m, flush=True)  # noqa: E731
    state = train(a.target, cuts, template, budget,
                  [int(x) for x in a.aux_layers.split(",")] if a.aux_layers else None, log=log, store=store)
    t0 = time.time()
    state["metrics"]["agreement"] = evaluate(state, cuts, template, budget, store, log)
    state["metrics"]["evaluation_seconds"] = round(time.time() - t0, 1)
    if regen_info is not None:
        state["metrics"]["regenerated"] = regen_info
    save(state, a.out, budget, {"target": str(a.target), "training_files": files,
                                "regenerated": str(a.regenerated) if a.regenerated else None,
                                "holdout": "rows whose cut-table holdout flag is true were never trained on "
                                           "(read only after training, to measure agreement)"})
    rec.write([a.out])
    print(json.dumps(state["metrics"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("drafter", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
