"""Prompt suites: the prompts the drafter was trained on, sampled across the whole mix; control files.

Training suites are drawn from the cut table inspection wrote (records.Cut: one row per assistant
turn of every training row). The suite's rules pick the cuts (which turn of a row, held-out rows
only/excluded, length limits, duplicates), every excluded cut is counted by reason, and prompts
are sampled across ALL sources in proportion to the mix (or equal, or by weights), stratified and
seeded. Only the sampled rows are read again, by byte offset where the file allows: the prompt is
every token before the cut, decoded with the tokenizer the data was made with, so its text is
exactly what training saw, and its messages come from that text by the template's own markers.

Control suites read prompt files: {"prompt"}, {"messages"}, Spec-Bench/MT-bench {"turns"} (category
kept as the source) or ShareGPT {"conversations"}.

Session suites (`kind: session`) draw whole multi-turn rows the same way (seeded, by source weighting,
held-out rows unless the suite says otherwise) and write one records.Session per line: every assistant
turn of the row in order, with what the rendered history adds before it, so the load generator can
replay the conversation with the served model's own answers (specmatch.measuring.sessions). A training
suite with `length_strata` is drawn in equal shares from prompt-length strata (sample_by_length).

    python -m specmatch prompts --suite NAME --spec JSON --manifest M --cuts C --tokenizer T --out S.jsonl
"""
from __future__ import annotations

import argparse
import functools
import json
import random
import sys
from collections import Counter
from pathlib import Path

import polars as pl

from . import readers
from .. import steps
from ..files import SpecmatchError, read_json, read_jsonl, write_json, write_jsonl, write_text
from .cuts import read_cuts
from ..provenance import Recorder
from ..records import Cut, Manifest, Prompt, Session, SessionTurn, SuiteMatch
from .rows import ChatTemplate, ids_and_spans, normalise_messages, prompt_of, tools_of
from ..stats import describe, ks_critical, ks_statistic, total_variation
from .tokenizer import load_tokenizer
from .traffic import resolve_mix, training_shares

ORDER = ["source", "file", "row", "turn"]


def allocate(size: int, weights: dict[str, float], minimum: int = 0) -> dict[str, int]:
    """Largest-remainder allocation of `size` draws to sources by weight (deterministic). With a
    `minimum`, every source of positive weight gets at least that many (minimum_allocation)."""
    total = sum(weights.values())
    if total <= 0:
        raise SpecmatchError("suite weighting: all source weights are zero")
    if minimum > 0:
        return minimum_allocation(size, weights, minimum)
    exact = {s: size * w / total for s, w in weights.items()}
    alloc = {s: int(v) for s, v in exact.items()}
    rest = size - sum(alloc.values())
    for s in sorted(exact, key=lambda s: (-(exact[s] - alloc[s]), s))[:rest]:
        alloc[s] += 1
    return alloc


def minimum_allocation(size: int, weights: dict[str, float], minimum: int) -> dict[str, int]:
    """Proportional allocation with a floor (a stratified design that estimates every stratum): the
    strata whose proportional share falls below `minimum` get exactly `minimum`, and the rest of the
    suite is shared by weight among the others, repeated until no share falls below it. Post-
    stratification (each stratum reweighted to its share in the training mix, recorded in the match
    record) then estimates any mix from it, so oversampling a small source costs no bias."""
    positive = {s: w for s, w in weights.items() if w > 0}
    if minimum * len(positive) > size:
        raise SpecmatchError(f"min_per_source: {minimum} prompts x {len(positive)} sources of positive weight is more "
                             f"than the suite's size ({size})")
    fixed: dict[str, int] = {}
    while True:
        free = {s: w for s, w in positive.items() if s not in fixed}
        rest = size - sum(fixed.values())
        low = {s for s, w in free.items() if rest * w / sum(free.values()) < minimum} if free else set()
        if not low:
            break
        fixed.update({s: minimum for s in low})
    out = {s: 0 for s in weights}
    out.update(fixed)
    if free:
        out.update(allocate(size - sum(fixed.values()), free))
    return out


def source_weights(manifest: Manifest, weighting) -> dict[str, float]:
    """Target share of each source: its rows (`mix`), the same for all (`equal`), or as configured."""
    names = [s.name for s in manifest.sources]
    if weighting == "mix":
        return {s.name: float(s.rows) for s in manifest.sources}
    if weighting == "equal":
        return {n: 1.0 for n in names}
    unknown = set(weighting) - set(names)
    if unknown:
        raise SpecmatchError(f"suite weighting: unknown sources {sorted(unknown)} (sources: {', '.join(names)})")
    return {n: float(weighting.get(n, 0.0)) for n in names}


def _random_turn(seed: int) -> pl.Expr:
    """A seeded, order-independent choice of one turn per row (a hash of seed, file and row)."""
    h = pl.concat_str([pl.lit(str(seed)), pl.col("file"), pl.col("row").cast(pl.String)], separator="\0").hash(seed)
    return (h % pl.col("turns").cast(pl.UInt64)).cast(pl.Int64)


def eligible(cuts: pl.DataFrame, spec: dict, skipped: Counter) -> pl.DataFrame:
    """The cuts a suite may sample: its turn choice, holdout setting, length limits, no duplicates.
    Every cut it drops is counted by reason, in this order."""
    df = cuts.sort(ORDER)
    want = spec.get("holdout", "any")
    if want != "any":
        keep = pl.col("holdout") if want == "only" else ~pl.col("holdout")
        out = df.filter(~keep)
        for hold, n in out.unique(["file", "row"]).group_by("holdout").len().iter_rows():
            skipped[f"holdout={hold} excluded by suite setting"] += n
        df = df.filter(keep)
    turn = spec.get("turn", "last")
    if turn == "first":
        df = df.filter(pl.col("turn") == 0)
    elif turn == "last":
        df = df.filter(pl.col("turn") == pl.col("turns") - 1)
    elif turn == "random":
        df = df.filter(pl.col("turn") == _random_turn(spec.get("seed", 0)))
    max_total, max_p = spec.get("max_total_tokens"), spec.get("max_prompt_tokens", 2048)
    min_c = spec.get("min_completion_tokens", 1)
    rules = []
    if max_total:
        rules.append((pl.col("prompt_tokens") + pl.col("completion_tokens") > max_total,
                      f"prompt + completion longer than max_total_tokens ({max_total})"))
    rules += [(pl.col("prompt_tokens") > max_p, f"prompt longer than max_prompt_tokens ({max_p})"),
              (pl.col("completion_tokens") < min_c, f"completion shorter than min_completion_tokens ({min_c})"),
              (pl.col("prompt_tokens") == 0, "empty prompt")]
    for cond, reason in rules:
        n = df.select(cond.sum()).item()
        if n:
            skipped[reason] += n
            df = df.filter(~cond)
    first = df.with_row_index("_i").group_by("key", maintain_order=True).agg(pl.col("_i").first())["_i"]
    if len(first) < df.height:
        skipped["duplicate prompt"] += df.height - len(first)
        df = df[first.sort()]
    return df


def sample(pool: pl.DataFrame, size: int, weights: dict[str, float], seed: int, minimum: int = 0
           ) -> tuple[pl.DataFrame, dict[str, int], dict]:
    """Stratified by source (largest-remainder allocation, at least `minimum` per source of positive
    weight), seeded, then shuffled: the chosen cuts, the allocation, and each source's shortfall
    ({wanted, available}) where it had too few."""
    alloc = allocate(size, weights, minimum)
    rng = random.Random(seed)
    by_src = {s: g for (s,), g in pool.group_by(["source"], maintain_order=True)}
    parts, shortfall = [], {}
    for src in sorted(alloc):
        g = by_src.get(src)
        avail = g.height if g is not None else 0
        k = alloc[src]
        if k > avail:
            shortfall[src] = {"wanted": k, "available": avail}
            k = avail
        if k:
            parts.append(g[sorted(rng.sample(range(avail), k))])
    chosen = pl.concat(parts) if parts else pool.clear()
    order = list(range(chosen.height))
    rng.shuffle(order)
    return chosen[order], alloc, shortfall


def load_prompts(name: str, chosen: pl.DataFrame, template: ChatTemplate, need_messages: bool) -> list[Prompt]:
    """Read back only the chosen rows (one seek each in plain JSON Lines) and rebuild their prompts."""
    cuts = [Cut.from_json(r) for r in chosen.to_dicts()]
    rows = readers.read_located((c.file, c.position) for c in cuts)
    ids_of, out = {}, []
    for i, c in enumerate(cuts):
        row = rows[(c.file, c.position)]
        ids, messages, tools = prompt_of(template, row, c.schema, c.turn)
        if ids is not None:
            if len(ids) != c.prompt_tokens:
                raise SpecmatchError(f"{c.origin}: the row changed since inspection (prompt of "
                                     f"{len(ids)} tokens, the cut table says {c.prompt_tokens}); rerun inspect")
            ids_of[i] = ids
        out.append((c, messages, tools))
    texts = dict(zip(ids_of, template.tok.batch_decode(list(ids_of.values()), skip_special_tokens=False)))
    prompts = []
    for i, (c, messages, tools) in enumerate(out):
        if i in texts:
            text = texts[i]
            try:
                messages = template.split(text)
            except SpecmatchError:
                if need_messages:
                    raise
                messages = None
        else:
            text = template.render(messages, tools)
        prompts.append(Prompt(f"{name}-{i:05d}", name, c.source, c.file, c.line, c.row, c.row_id, c.turn, c.turns,
                              text, messages, c.prompt_tokens, c.completion_tokens, c.holdout))
    return prompts


def training_suite(name: str, spec: dict, manifest: Manifest, cuts: pl.DataFrame, template: ChatTemplate,
                   need_messages: bool = False) -> tuple[list[Prompt], SuiteMatch]:
    """A suite sampled from the cut table to follow the target mix; an empty weighted pool is an error
    that names the sources and why their rows gave no cut, never a division by zero or a short suite."""
    skipped: Counter = Counter()
    for s in manifest.sources:
        for reason, n in s.rows_without_cut.items():
            skipped[reason] += n
    weights = source_weights(manifest, spec.get("weighting", "mix"))
    pool = eligible(cuts, spec, skipped)
    weighted = pool.filter(pl.col("source").is_in([s for s, w in weights.items() if w > 0]))
    if weighted.is_empty():
        srcs = ", ".join(f"{s} ({w:g})" for s, w in weights.items())
        raise SpecmatchError(f"suite {name}: no eligible prompt in the weighted sources of {manifest.root} "
                             f"(weights: {srcs}; eligible cuts in any source: {pool.height}; skipped: "
                             f"{dict(skipped) or 'nothing'})")
    minimum, size = spec.get("min_per_source", 0), spec.get("size", 64)
    positive = sorted(s for s, w in weights.items() if w > 0)
    if minimum * len(positive) > size:
        raise SpecmatchError(f"suites.{name}.min_per_source: {minimum} prompts x {len(positive)} sources of positive "
                             f"weight ({', '.join(positive)}) is more than suites.{name}.size ({size})")
    strata = None
    if spec.get("length_strata"):
        if minimum:
            raise SpecmatchError(f"suites.{name}: length_strata and min_per_source cannot be combined (a suite is "
                                 "stratified by prompt length or by source, not both)")
        chosen, allocation, shortfall, strata = sample_by_length(weighted, spec, weights)
    else:
        chosen, allocation, shortfall = sample(weighted, size, weights, spec.get("seed", 0), minimum)
    prompts = load_prompts(name, chosen, template, need_messages)
    match = match_report(name, "training", prompts, manifest, weights, weighted)
    match.candidates, match.skipped = pool.height, dict(skipped)
    match.allocation, match.shortfall = allocation, shortfall
    match.min_per_source, match.strata = minimum, source_strata(match.suite_sources, manifest)
    if strata is not None:
        stratified(match, strata)
    return prompts, match


def source_strata(counts: dict, manifest: Manifest) -> dict:
    """A training suite's strata (its sources): prompts drawn and the source's share in the training
    mix (rows), the post-stratification weight that turns the suite's per-source figures into the
    training mix's whatever the suite's own allocation (min_per_source, equal, weights)."""
    return {s: {"kind": "source", "prompts": int(counts.get(s, 0)), "training_share": share}
            for s, share in training_shares(manifest).items()}


def file_suite(name: str, spec: dict, template: ChatTemplate, manifest: Manifest | None,
               like: list[Prompt] | None = None, exclude_lines: set | None = None,
               excluded_by: str = "an estimation suite") -> tuple[list[Prompt], SuiteMatch]:
    """A suite from a user's JSONL file (a control set such as generic prompts); every unusable line
    is counted by reason and named by file:line, none is dropped silently. `exclude_lines`: line
    numbers another suite already drew (`excluded_by`), left out and counted."""
    path = Path(spec["path"])
    if not path.is_file():
        raise SpecmatchError(f"suites.{name}.path: {path}: file not found")
    raw, skipped = [], Counter()
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            loc = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecmatchError(f"{loc}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise SpecmatchError(f"{loc}: expected a JSON object")
            source = str(obj.get("category") or obj.get("source") or path.stem)
            if isinstance(obj.get("prompt"), str):
                messages = [{"role": "user", "content": obj["prompt"]}]
            elif isinstance(obj.get("messages"), list):
                messages = normalise_messages(obj["messages"])
            elif isinstance(obj.get("turns"), list) and obj["turns"]:
                messages = [{"role": "user", "content": str(obj["turns"][0])}]
            elif isinstance(obj.get("conversations"), list):
                conv = normalise_messages(obj["conversations"])
                idx = [k for k, m in enumerate(conv) if m["role"] == "assistant"]
                messages = conv[: idx[-1]] if idx else conv
            else:
                raise SpecmatchError(f"{loc}: expected a prompt, messages, turns or conversations field")
            if not messages or messages[-1]["role"] == "assistant":
                skipped["ends with an assistant turn"] += 1
                continue
            if exclude_lines and lineno in exclude_lines:
                skipped[f"drawn by {excluded_by}"] += 1
                continue
            raw.append((lineno, str(obj.get("question_id", obj.get("id", lineno))), source, messages))
    if not raw:
        raise SpecmatchError(f"{path}: no prompts")
    rng = random.Random(spec.get("seed", 0))
    size = spec.get("size", 64)
    if like is not None:
        prompts, length_match, shortfall = length_matched(name, spec, raw, like, template, path, rng)
        match = match_report(name, "file", prompts, manifest, None, None)
        match.candidates, match.skipped, match.shortfall = len(raw), dict(skipped), shortfall
        match.length_like, match.length_match = spec["length_like"], length_match
        return prompts, match
    picked = rng.sample(raw, min(size, len(raw)))
    prompts = []
    for i, (lineno, rid, source, messages) in enumerate(picked):
        text = template.render(messages)
        prompts.append(Prompt(f"{name}-{i:05d}", name, source, str(path), lineno, None, rid, 0, 0, text, messages,
                              len(template.tok(text, add_special_tokens=False)["input_ids"]), None, True))
    match = match_report(name, "file", prompts, manifest, None, None)
    match.candidates, match.skipped = len(raw), dict(skipped)
    match.shortfall = {"file": {"wanted": size, "available": len(raw)}} if size > len(raw) else {}
    match.strata = file_stratum(name, prompts)
    return prompts, match


def file_stratum(name: str, prompts: list[Prompt]) -> dict:
    """A prompt file is one stratum of any traffic mix, named by its suite (its rows' own categories,
    kept as their source, do not split it): none of the training mix is in it."""
    return {name: {"kind": "file", "prompts": len(prompts), "training_share": 0.0}}


@functools.lru_cache(maxsize=None)
def _same_file(path: str) -> str:
    """A file's one spelling (absolute, links resolved): a suite's config may name it relative to the
    workflow and another absolute, and an exclusion must see them as one."""
    return str(Path(path).resolve())


def traffic_suite(name: str, spec: dict, manifest: Manifest, cuts: pl.DataFrame, template: ChatTemplate,
                  need_messages: bool = False, exclude: dict | None = None) -> tuple[list[Prompt], SuiteMatch]:
    """A suite drawn with a traffic mix (specmatch.data.traffic): stratified over the strata, each stratum
    drawn as its own suite draws it, shuffled; its match record names each stratum's share. `exclude`
    (suite -> its prompts): the estimation suites, whose training rows (every turn of a row drawn) and
    file lines are never drawn again; what that leaves out is counted per suite (`disjoint_from`)."""
    exclude = exclude or {}
    if spec.get("same_prompts"):
        return same_prompt_suite(name, spec, manifest, exclude)
    rows_out: dict = {}    # (file, row) -> the estimation suite that drew it
    lines_out: dict = {}   # file -> {line: the estimation suite that drew it}
    for u, ps in exclude.items():
        for p in ps:
            if p.row is not None:
                rows_out[(_same_file(p.file), p.row)] = u
            elif p.line is not None:
                lines_out.setdefault(_same_file(p.file), {})[p.line] = u
    disjoint = {u: 0 for u in exclude}
    files = list(spec.get("files") or {})
    sources = training_shares(manifest)
    shares = resolve_mix(f"traffic.{spec['profile']}.mix", spec["mix"], sources, files)
    size, seed = spec["size"], spec.get("seed", 1)
    alloc = allocate(size, shares)
    skipped: Counter = Counter()
    prompts: list[Prompt] = []
    shortfall: dict = {}
    wanted = {s: k for s, k in alloc.items() if s in sources and k > 0}
    if wanted:
        pool = eligible(cuts, {**spec.get("training", {}), "seed": seed}, skipped)
        pool = pool.filter(pl.col("source").is_in(list(wanted)))
        if rows_out:
            by = [rows_out.get((_same_file(f), r)) for f, r in zip(pool["file"].to_list(), pool["row"].to_list())]
            for u in by:
                if u is not None:
                    disjoint[u] += 1
                    skipped[f"drawn by the estimation suite {u}"] += 1
            pool = pool.filter(pl.Series([u is None for u in by]))
        chosen, _, short = sample(pool, sum(wanted.values()), {s: float(k) for s, k in wanted.items()}, seed)
        shortfall.update(short)
        prompts += load_prompts(name, chosen, template, need_messages)
    for f in files:
        k = alloc.get(f, 0)
        if not k:
            continue
        path = spec["files"][f]["path"]
        out = lines_out.get(_same_file(path), {})
        got, m = file_suite(f, {"path": path, "size": k, "seed": seed}, template, manifest, exclude_lines=set(out),
                            excluded_by="the estimation suite " + ", ".join(sorted(set(out.values()))))
        for u in out.values():
            disjoint[u] += 1
        for reason, n in m.skipped.items():
            skipped[f"{f}: {reason}"] += n
        if len(got) < k:
            shortfall[f] = {"wanted": k, "available": len(got)}
        for p in got:
            p.source = f   # the stratum: a file's rows are one stratum whatever their category
        prompts += got
    random.Random(seed).shuffle(prompts)
    for i, p in enumerate(prompts):
        p.id, p.suite = f"{name}-{i:05d}", name
    match = match_report(name, "traffic", prompts, manifest, shares, None)
    got = Counter(p.source for p in prompts)
    match.strata = {s: {"kind": "file" if s in files else "source", "prompts": got.get(s, 0), "share": share,
                        "training_share": sources.get(s, 0.0)} for s, share in shares.items()}
    match.allocation, match.shortfall, match.skipped = alloc, shortfall, dict(skipped)
    match.representative = None
    match.verdict = (f"drawn with traffic profile `{spec['profile']}`: "
                     + ", ".join(f"{s} {share:.0%}" for s, share in shares.items()))
    if exclude:
        match.disjoint_from = disjoint
        match.verdict += ("; disjoint from the prompts of " + ", ".join(sorted(exclude))
                          + (" (the rest of a pool fell short: " + ", ".join(sorted(shortfall)) + ")" if shortfall else ""))
    return prompts, match


def same_prompt_suite(name: str, spec: dict, manifest: Manifest, estimation: dict) -> tuple[list[Prompt], SuiteMatch]:
    """A verifying suite drawn from the estimation suites' own prompts (`verify: same_prompts`): the same
    stratified allocation as a fresh draw, each stratum's prompts sampled (seeded, without replacement)
    from those its estimation suite holds (a source's from the basis suite, a file suite's from that
    suite), shuffled, their ids kept, so the analysis predicts the suite from exactly these prompts'
    requests. A stratum allocated more prompts than its suite holds gets them all and the shortfall is
    stated. `estimation`: suite -> its prompts."""
    files = list(spec.get("files") or {})
    sources = training_shares(manifest)
    shares = resolve_mix(f"traffic.{spec['profile']}.mix", spec["mix"], sources, files)
    size, seed = spec["size"], spec.get("seed", 1)
    alloc = allocate(size, shares)
    basis = spec.get("basis")
    pools: dict = {}
    for s_, k in alloc.items():
        if k <= 0:
            continue
        suite = s_ if s_ in files else basis
        if suite not in estimation:
            raise SpecmatchError(f"suite {name}: verify: same_prompts draws stratum {s_} from suite {suite}, whose "
                                 "prompts were not given (--exclude)")
        have = [p for p in estimation[suite] if s_ in files or p.source == s_]
        pools[s_] = (suite, have)
    rng = random.Random(seed)
    prompts, repeated, taken = [], {}, Counter()
    for s_, (suite, have) in pools.items():
        k = alloc[s_]
        if not have:
            raise SpecmatchError(f"suite {name}: verify: same_prompts: stratum {s_} has no prompt in suite {suite}")
        got = [have[j] for j in repeated_draw(lambda m, n: rng.sample(range(m), n), len(have), k)]
        if k > len(have):
            repeated[s_] = {"wanted": k, "prompts": len(have)}
        for p in got:
            q = Prompt.from_json(p.to_json())
            q.suite, q.source = name, s_   # the stratum: a file's rows are one stratum whatever their category
            prompts.append(q)
            taken[suite] += 1
    rng.shuffle(prompts)
    match = match_report(name, "traffic", prompts, manifest, shares, None)
    got = Counter(p.source for p in prompts)
    match.strata = {s_: {"kind": "file" if s_ in files else "source", "prompts": got.get(s_, 0), "share": share,
                         "training_share": sources.get(s_, 0.0)} for s_, share in shares.items()}
    match.allocation, match.shortfall, match.skipped = alloc, {}, {}
    match.representative = None
    match.same_prompts = {"from": dict(sorted(taken.items())), "repeated": repeated}
    match.verdict = (f"drawn with traffic profile `{spec['profile']}` from the estimation suites' own prompts ("
                     + ", ".join(f"{u} {n}" for u, n in sorted(taken.items())) + "): "
                     + ", ".join(f"{s_} {share:.0%}" for s_, share in shares.items())
                     + ("; sent more than once where a stratum holds fewer prompts than its share: "
                        + ", ".join(f"{s_} {v['wanted']} requests of {v['prompts']} prompts"
                                    for s_, v in sorted(repeated.items())) if repeated else ""))
    return prompts, match


def repeated_draw(sample, n: int, k: int) -> list[int]:
    """k indices into n items: without replacement where k <= n, else every item k // n times and k % n of
    them once more, so a same-prompt suite keeps its mix's shares and size where a stratum's suite holds
    fewer prompts (a prompt then repeats within the cell, which the prefix cache serves: the analysis
    reads each request's cached tokens). `sample(m, j)`: j distinct indices of range(m), seeded."""
    return [i for _ in range(k // n) for i in range(n)] + list(sample(n, k % n)) if k > n else list(sample(n, k))


LIST_HEAD = "Answer each of the following questions in turn, one paragraph each.\n"


def length_matched(name: str, spec: dict, raw: list, like: list[Prompt], template: ChatTemplate, path: Path,
                   rng: random.Random) -> tuple[list[Prompt], dict, dict]:
    """Prompts as long as the training suite's (`length_like`), each a numbered list of the file's
    single-turn prompts: the content of a control, the context length of the training mix. Prompt i
    copies the length of the training suite's prompt i (cycling); questions are drawn without
    replacement within a prompt, and a prompt that runs out of questions stays shorter (counted).
    Returns the prompts, how their lengths matched (SuiteMatch.length_match) and the shortfall."""
    if not like:
        raise SpecmatchError(f"suites.{name}.length_like: the training suite '{spec['length_like']}' has no prompts")
    singles = [r for r in raw if len(r[3]) == 1 and r[3][0]["role"] == "user"]
    if not singles:
        raise SpecmatchError(f"{path}: length_like needs single-turn prompts to compose from")
    size = spec.get("size", 64)
    prompts, short, gaps = [], 0, []
    for i in range(size):
        target = like[i % len(like)].prompt_tokens
        order = rng.sample(singles, len(singles))
        items, text, n = [], "", 0
        for row in order:
            items.append(row)
            content = LIST_HEAD + "".join(f"\n{k}. {r[3][0]['content']}" for k, r in enumerate(items, 1))
            text = template.render([{"role": "user", "content": content}])
            n = len(template.tok(text, add_special_tokens=False)["input_ids"])
            if n >= target:
                break
        else:
            short += 1
        gaps.append(n - target)
        messages = [{"role": "user", "content": content}]
        prompts.append(Prompt(f"{name}-{i:05d}", name, items[0][2], str(path), items[0][0], None,
                              "+".join(r[1] for r in items), 0, 0, text, messages, n, None, True))
    length_match = {"target_prompt_tokens": describe([p.prompt_tokens for p in like]),
                    "overshoot_tokens": describe(gaps), "shorter_than_target": short}
    return prompts, length_match, {"length_like": {"prompts_shorter_than_target": short}} if short else {}


def match_report(name: str, kind: str, prompts: list[Prompt], manifest: Manifest | None, weights: dict | None,
                 pool: pl.DataFrame | None) -> SuiteMatch:
    """How well the suite matches the training mix: source TVD, and a prompt-length KS statistic
    against the eligible cuts weighted to the suite's target mix (each source's cuts carry its target
    share), so a suite that follows its weighting is compared with what that weighting asks for."""
    suite_mix = Counter(p.source for p in prompts)
    train_mix = {s.name: s.rows for s in manifest.sources} if manifest else {}
    target = weights or train_mix
    out = SuiteMatch(
        suite=name, kind=kind, prompts=len(prompts),
        holdout_share=sum(p.holdout for p in prompts) / len(prompts) if prompts else None,
        suite_sources=dict(sorted(suite_mix.items())),
        training_sources=train_mix,
        target_shares={k: v / sum(target.values()) for k, v in target.items()} if target else {},
        source_tvd_vs_target=total_variation(dict(suite_mix), target) if target else None,
        source_tvd_vs_training_mix=total_variation(dict(suite_mix), train_mix) if train_mix else None,
        prompt_tokens=describe([p.prompt_tokens for p in prompts]),
        completion_tokens=describe([p.reference_completion_tokens for p in prompts]),
        representative=None, verdict="")
    if pool is not None and not pool.is_empty():
        n_src = dict(pool.group_by("source").len().iter_rows())
        total_w = sum(weights.get(s, 0.0) for s in n_src)
        w = pool["source"].replace_strict({s: weights.get(s, 0.0) / total_w / n for s, n in n_src.items()},
                                          return_dtype=pl.Float64).to_numpy()
        lengths = pool["prompt_tokens"].to_numpy()
        ks = ks_statistic([p.prompt_tokens for p in prompts], lengths, w)
        n_eff = float(w.sum() ** 2 / (w ** 2).sum())
        crit = ks_critical(len(prompts), n_eff)
        out.training_prompt_tokens = describe(lengths.tolist())
        out.training_completion_tokens = describe(pool["completion_tokens"].to_list())
        out.prompt_length_ks, out.prompt_length_ks_critical_5pct = ks, crit
        out.prompt_length_reference = f"eligible cuts weighted to the suite's target mix (effective size {n_eff:.0f})"
        out.representative = bool((out.source_tvd_vs_target or 0) <= 0.1 and ks is not None and ks <= crit)
    else:
        out.training_prompt_tokens_by_source = {s.name: s.prompt_tokens for s in manifest.sources} if manifest else {}
        out.representative = False if train_mix else None
    if out.representative is True:
        out.verdict = "representative of the training mix"
    elif out.representative is False:
        out.verdict = "NOT representative of the training mix (a control suite, or a biased sample)"
    else:
        out.verdict = "no training mix to compare with"
    return out


def match_markdown(m: SuiteMatch) -> str:
    lines = [f"# Suite `{m.suite}`: {m.prompts} prompts — {m.verdict}", ""]
    if m.source_tvd_vs_training_mix is not None:
        lines.append(f"- Source mix: total variation distance {m.source_tvd_vs_training_mix:.3f} from the training "
                     f"mix ({m.source_tvd_vs_target or 0:.3f} from the configured target).")
    if m.prompt_length_ks is not None:
        lines.append(f"- Prompt length: KS statistic {m.prompt_length_ks:.3f} against the eligible training cuts "
                     f"weighted to the target mix (5% critical value {m.prompt_length_ks_critical_5pct:.3f}).")
    lines.append(f"- Held-out share: {m.holdout_share:.0%}." if m.holdout_share is not None else "")
    if m.skipped:
        lines.append("- Skipped candidates: " + ", ".join(f"{k}: {v}" for k, v in m.skipped.items()))
    if m.shortfall:
        lines.append("- Shortfall (fewer eligible prompts than asked): " + json.dumps(m.shortfall))
    lines += ["", "| source | suite prompts | suite share | target share |", "|---|---|---|---|"]
    total = sum(m.suite_sources.values()) or 1
    for src in sorted(set(m.suite_sources) | set(m.target_shares)):
        lines.append(f"| {src} | {m.suite_sources.get(src, 0)} | {m.suite_sources.get(src, 0) / total:.1%} | "
                     f"{m.target_shares.get(src, 0):.1%} |")
    return "\n".join(l for l in lines if l is not None) + "\n"


# -- length strata ----------------------------------------------------------------------------------
def length_edges(spec: dict) -> list[int]:
    """[0, e1, ..., ek, max_prompt_tokens + 1]: the strata's edges (each stratum is [lo, hi))."""
    top = spec.get("max_prompt_tokens", 2048)
    inner = sorted(e for e in set(spec["length_strata"]) if 0 < e <= top)
    return [0, *inner, top + 1]


def sample_by_length(pool: pl.DataFrame, spec: dict, weights: dict[str, float]
                     ) -> tuple[pl.DataFrame, dict[str, int], dict, dict]:
    """A training suite in equal shares from prompt-length strata (`length_strata`), each stratum drawn
    by source weighting (sample); a stratum with fewer eligible prompts than its share gives the rest to
    the others (by largest remainder, as far as they have prompts). Returns the chosen cuts (shuffled),
    the per-source allocation summed over strata, the shortfall, and per stratum {lo, hi, wanted, drawn,
    available, training_share} (the share of the eligible pool in it, by source weight)."""
    size, seed = spec.get("size", 64), spec.get("seed", 0)
    edges = length_edges(spec)
    bands = list(zip(edges, edges[1:]))
    parts = [pool.filter((pl.col("prompt_tokens") >= lo) & (pl.col("prompt_tokens") < hi)) for lo, hi in bands]
    avail = [p.height for p in parts]
    want = allocate(size, {str(i): 1.0 for i in range(len(bands))})
    take = {i: min(want[str(i)], avail[i]) for i in range(len(bands))}
    rest = size - sum(take.values())
    while rest > 0:
        room = {str(i): float(avail[i] - take[i]) for i in take if avail[i] > take[i]}
        if not room:
            break
        extra = allocate(min(rest, int(sum(room.values()))), room)
        for k, n in extra.items():
            take[int(k)] += min(n, avail[int(k)] - take[int(k)])
        rest = size - sum(take.values())
    n_src = dict(pool.group_by("source").len().iter_rows()) if pool.height else {}
    total_w = sum(weights.get(src, 0.0) for src in n_src) or 1.0
    chosen, alloc, shortfall, strata = [], Counter(), {}, {}
    for i, ((lo, hi), part) in enumerate(zip(bands, parts)):
        share = sum(weights.get(src, 0.0) / total_w * n / n_src[src]
                    for src, n in part.group_by("source").len().iter_rows()) if part.height else 0.0
        label = f"[{lo}, {hi})"
        strata[label] = {"lo": lo, "hi": hi, "wanted": want[str(i)], "drawn": take[i], "available": avail[i],
                         "training_share": share}
        if take[i]:
            got, a, _short = sample(part, take[i], {k: v for k, v in weights.items() if k in n_src}, seed + 7919 * i)
            chosen.append(got)
            alloc.update(a)
    if sum(take.values()) < size:
        shortfall["length_strata"] = {"wanted": size, "available": sum(avail)}
    out = pl.concat(chosen) if chosen else pool.clear()
    order = list(range(out.height))
    random.Random(seed).shuffle(order)
    return out[order], dict(alloc), shortfall, strata


def stratified(match: SuiteMatch, strata: dict) -> None:
    """A length-stratified suite's match record: the strata, and a verdict that says its length
    distribution differs from the mix's on purpose (not a biased sample)."""
    match.length_strata = strata
    match.representative = False
    match.verdict = ("stratified by prompt length (`length_strata`): the long tail measured on purpose, so its "
                     "length distribution is not the training mix's")


# -- session suites -----------------------------------------------------------------------------------
def session_pool(cuts: pl.DataFrame, spec: dict, skipped: Counter) -> pl.DataFrame:
    """One row per eligible session: a training row with at least `min_turns` assistant turns whose
    contexts fit `max_prompt_tokens` (its first turns, up to `max_turns`), by the suite's holdout
    setting, duplicates (the same whole history) once. Every row it leaves out is counted by reason."""
    min_turns, max_turns = spec.get("min_turns") or 2, spec.get("max_turns")
    max_p = spec.get("max_prompt_tokens", 2048)
    df = cuts.sort(ORDER)
    want = spec.get("holdout", "only")
    if want != "any":
        keep = pl.col("holdout") if want == "only" else ~pl.col("holdout")
        for hold, n in df.filter(~keep).unique(["file", "row"]).group_by("holdout").len().iter_rows():
            skipped[f"holdout={hold} excluded by suite setting"] += n
        df = df.filter(keep)
    over = pl.when(pl.col("prompt_tokens") > max_p).then(pl.col("turn")).otherwise(pl.col("turns"))
    rows = (df.with_columns(over.alias("_fit"))
              .group_by(["file", "row"], maintain_order=True)
              .agg(pl.all().exclude("_fit").first(), pl.col("_fit").min(),
                   pl.col("key").sort_by("turn").alias("_keys")))
    usable = pl.col("_fit") if not max_turns else pl.min_horizontal(pl.col("_fit"), pl.lit(max_turns))
    rows = rows.with_columns(usable.alias("usable_turns"))
    few = rows.filter(pl.col("turns") < min_turns).height
    if few:
        skipped[f"fewer than {min_turns} assistant turns (not a session)"] += few
    rows = rows.filter(pl.col("turns") >= min_turns)
    short = rows.filter(pl.col("usable_turns") < min_turns).height
    if short:
        skipped[f"fewer than {min_turns} turns within max_prompt_tokens ({max_p})"] += short
    rows = rows.filter(pl.col("usable_turns") >= min_turns)
    rows = rows.with_columns(pl.col("_keys").list.get(pl.col("usable_turns") - 1).alias("key")).drop("_keys")
    first = rows.with_row_index("_i").group_by("key", maintain_order=True).agg(pl.col("_i").first())["_i"]
    if len(first) < rows.height:
        skipped["duplicate session"] += rows.height - len(first)
        rows = rows[first.sort()]
    return rows


def session_suite(name: str, spec: dict, manifest: Manifest, cuts: pl.DataFrame, template: ChatTemplate,
                  need_messages: bool = False) -> tuple[list[Session], SuiteMatch]:
    """Whole conversations of multi-turn training rows, sampled like a training suite (seeded, by source
    weighting: `mix` over the sources that have such rows; those that have none are counted), each a
    records.Session. An empty pool is an error that says why the rows gave none."""
    skipped: Counter = Counter()
    weights = source_weights(manifest, spec.get("weighting", "mix"))
    pool = session_pool(cuts, spec, skipped)
    have = set(pool["source"].to_list())
    if spec.get("weighting", "mix") == "mix":
        for src in sorted(set(weights) - have):
            skipped[f"source {src}: no multi-turn row eligible"] += 1
        weights = {src: w for src, w in weights.items() if src in have}
    weighted = pool.filter(pl.col("source").is_in([src for src, w in weights.items() if w > 0]))
    if weighted.is_empty():
        raise SpecmatchError(f"suite {name}: no multi-turn training row to replay as a session in {manifest.root} "
                             f"(skipped: {dict(skipped) or 'nothing'}); kind session needs rows with at least "
                             f"{spec.get('min_turns') or 2} assistant turns")
    chosen, allocation, shortfall = sample(weighted, spec.get("size", 64), weights, spec.get("seed", 0))
    sessions = load_sessions(name, spec, chosen, cuts, template, need_messages, skipped)
    match = session_match(name, spec, sessions, manifest, weights, skipped)
    match.candidates, match.allocation = weighted.height, allocation
    match.shortfall = dict(shortfall)
    if len(sessions) < chosen.height:
        match.shortfall["unusable rows"] = {"wanted": chosen.height, "available": len(sessions)}
    return sessions, match


def row_turn_texts(template: ChatTemplate, row: dict, schema: str, n: int
                   ) -> tuple[list[str], list[str], list[int], list[int] | None]:
    """The first n turns of a row as text: the prompt before each assistant turn (the training cut's,
    exactly), each answer's content (its end-of-turn token left to the history that follows), each
    answer's token count, and (token ids in the row) each prompt's token count as the row has it."""
    if schema == "conversations":
        conv = normalise_messages(row.get("conversations", row.get("messages")), row.get("system"))
        tools = tools_of(row)
        idx = [k for k, m in enumerate(conv) if m["role"] == "assistant"][:n]
        prompts = [template.render(conv[:k], tools) for k in idx]
        answers = [conv[k]["content"] for k in idx]
        return prompts, answers, [len(template.tok(a, add_special_tokens=False)["input_ids"]) for a in answers], None
    ids, spans = ids_and_spans(template, row, schema)
    spans = spans[:n]
    ends = [e - 1 if e > s and template.end_id is not None and ids[e - 1] == template.end_id else e for s, e in spans]
    decode = lambda a, b: template.tok.decode(ids[a:b], skip_special_tokens=False)  # noqa: E731
    return ([decode(0, s) for s, _ in spans], [decode(s, c) for (s, _), c in zip(spans, ends)],
            [c - s for (s, _), c in zip(spans, ends)], [s for s, _ in spans])


def session_of(name: str, i: int, spec: dict, c: Cut, row: dict, template: ChatTemplate, counts: list[int],
               need_messages: bool) -> Session | str:
    """One row as a records.Session, or why it cannot be one (the history is not the previous prompt
    plus its answer: a template that rewrites earlier turns cannot be replayed by appending)."""
    n = len(counts)
    prompts, answers, answer_tokens, lengths = row_turn_texts(template, row, c.schema, n)
    if len(prompts) < n or (lengths is not None and lengths != counts):
        raise SpecmatchError(f"{c.origin}: the row changed since inspection (its turns' prompts are "
                             f"{lengths or len(prompts)} tokens, the cut table says {counts}); rerun inspect")
    texts = [prompts[0]]
    for t in range(1, n):
        head = prompts[t - 1] + answers[t - 1]
        if not prompts[t].startswith(head):
            return "the rendered history of a turn is not the previous prompt and its answer"
        texts.append(prompts[t][len(head):])
    messages = session_messages(template, prompts, need_messages)
    turns = []
    for t in range(n):
        added = counts[t] if t == 0 else counts[t] - counts[t - 1] - answer_tokens[t - 1]
        turns.append(SessionTurn(t, texts[t], answers[t], counts[t], answer_tokens[t], added,
                                 messages[t] if messages else None))
    return Session(f"{name}-{i:05d}", name, c.source, c.file, c.line, c.row, c.row_id, c.holdout, turns,
                   answers=spec.get("answers") or "live", max_prompt_tokens=spec.get("max_prompt_tokens", 2048),
                   turns_in_row=c.turns)


def session_messages(template: ChatTemplate, prompts: list[str], need: bool) -> list[list] | None:
    """Each turn's own messages (those since the previous answer), split from the rendered prompts by the
    template's markers; None where the template cannot split them (an error when the chat endpoint needs
    them)."""
    try:
        split = [template.split(p) for p in prompts]
    except SpecmatchError:
        if need:
            raise
        return None
    out = [split[0]]
    for prev, cur in zip(split, split[1:]):
        if len(cur) <= len(prev) or cur[len(prev)]["role"] != "assistant":
            if need:
                raise SpecmatchError("chat template: a turn's messages do not extend the previous turn's")
            return None
        out.append(cur[len(prev) + 1:])
    return out


def load_sessions(name: str, spec: dict, chosen: pl.DataFrame, cuts: pl.DataFrame, template: ChatTemplate,
                  need_messages: bool, skipped: Counter) -> list[Session]:
    """Read back only the chosen rows and build their sessions (a row that cannot be one is counted)."""
    firsts = [Cut.from_json({k: v for k, v in r.items() if k in Cut.__dataclass_fields__}) for r in chosen.to_dicts()]
    usable = chosen["usable_turns"].to_list()
    rows = readers.read_located((c.file, c.position) for c in firsts)
    counts_of = {(f, r, t): n for f, r, t, n in cuts.select("file", "row", "turn", "prompt_tokens").iter_rows()}
    out = []
    for c, n in zip(firsts, usable):
        counts = [counts_of[(c.file, c.row, t)] for t in range(n)]
        got = session_of(name, len(out), spec, c, rows[(c.file, c.position)], template, counts, need_messages)
        if isinstance(got, str):
            skipped[got] += 1
            continue
        out.append(got)
    return out


def session_match(name: str, spec: dict, sessions: list[Session], manifest: Manifest, weights: dict,
                  skipped: Counter) -> SuiteMatch:
    """A session suite's match record: its sources against the mix's, and its sessions, turns and context
    lengths (SuiteMatch.sessions)."""
    mix = Counter(x.source for x in sessions)
    train_mix = {src.name: src.rows for src in manifest.sources}
    turns = [t for x in sessions for t in x.turns]
    return SuiteMatch(
        suite=name, kind="session", prompts=len(turns),
        holdout_share=sum(x.holdout for x in sessions) / len(sessions) if sessions else None,
        suite_sources=dict(sorted(mix.items())), training_sources=train_mix,
        target_shares={k: v / sum(weights.values()) for k, v in weights.items()} if weights else {},
        source_tvd_vs_target=total_variation(dict(mix), weights) if weights else None,
        source_tvd_vs_training_mix=total_variation(dict(mix), train_mix) if train_mix else None,
        prompt_tokens=describe([t.prompt_tokens for t in turns]),
        completion_tokens=describe([t.answer_tokens for t in turns]),
        representative=None, skipped=dict(skipped),
        verdict="sessions: whole multi-turn training rows, replayed turn by turn",
        sessions={"sessions": len(sessions), "turns": len(turns),
                  "turns_per_session": describe([len(x.turns) for x in sessions]),
                  "context_tokens": describe([t.prompt_tokens for t in turns]),
                  "last_turn_context_tokens": describe([x.turns[-1].prompt_tokens for x in sessions]),
                  "answers": spec.get("answers") or "live", "sources": dict(sorted(mix.items())),
                  "turns_cut": sum(x.turns_in_row - len(x.turns) for x in sessions)})


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", required=True)
    p.add_argument("--spec", required=True, help="the suite's config as JSON")
    p.add_argument("--manifest", type=Path, help="results/inspect/manifest.json")
    p.add_argument("--cuts", type=Path, help="results/inspect/cuts.parquet (training suites)")
    p.add_argument("--like", type=Path, help="the prompts of the training suite a length_like suite copies")
    p.add_argument("--exclude", type=Path, nargs="*", default=[],
                   help="a traffic suite: the estimation suites' prompts (results/prompts/<suite>.jsonl), never drawn")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--endpoint", default="completions", choices=["completions", "chat"],
                   help="chat: every prompt must carry messages (a template that cannot be split is an error)")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--match", required=True, type=Path)
    p.add_argument("--match-md", type=Path)


def execute(a: argparse.Namespace) -> int:
    spec = json.loads(a.spec)
    rec = Recorder("prompts", [a.manifest, a.cuts, spec.get("path"), a.like, *a.exclude],
                   {"suite": a.suite, "spec": spec, "tokenizer": a.tokenizer, "endpoint": a.endpoint})
    template = ChatTemplate.of(load_tokenizer(a.tokenizer))
    manifest = Manifest.from_json(read_json(a.manifest)) if a.manifest else None
    if spec["kind"] in ("training", "session"):
        if manifest is None or a.cuts is None:
            raise SpecmatchError(f"suite {a.suite}: a {spec['kind']} suite needs --manifest and --cuts")
        build = session_suite if spec["kind"] == "session" else training_suite
        prompts, match = build(a.suite, spec, manifest, read_cuts(a.cuts), template,
                               need_messages=a.endpoint == "chat")
    elif spec["kind"] == "traffic":   # a traffic profile's verifying suite (specmatch.data.traffic)
        if manifest is None or a.cuts is None:
            raise SpecmatchError(f"suite {a.suite}: a traffic suite needs --manifest and --cuts")
        exclude = {pth.name.removesuffix(".jsonl"): [Prompt.from_json(x) for x in read_jsonl(pth)] for pth in a.exclude}
        prompts, match = traffic_suite(a.suite, spec, manifest, read_cuts(a.cuts), template,
                                       need_messages=a.endpoint == "chat", exclude=exclude)
    else:
        if spec.get("length_like") and a.like is None:
            raise SpecmatchError(f"suite {a.suite}: length_like needs --like (the training suite's prompts)")
        like = [Prompt.from_json(x) for x in read_jsonl(a.like)] if a.like else None
        prompts, match = file_suite(a.suite, spec, template, manifest, like)
    write_jsonl(a.out, [pr.to_json() for pr in prompts])
    write_json(a.match, match.to_json())
    outputs = [a.out, a.match]
    if a.match_md:
        write_text(a.match_md, match_markdown(match))
        outputs.append(a.match_md)
    rec.write(outputs)
    print(f"suite {a.suite}: {len(prompts)} {'sessions' if spec['kind'] == 'session' else 'prompts'}; {match.verdict}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return steps.main("prompts", __doc__, arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
