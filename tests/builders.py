"""What several test modules build: paths, Snakemake runs, training roots, prompts, cell arguments
and records. The one home of shared test helpers: test modules import from here (and get fixtures
from conftest.py), never from each other."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
if str(REPO / "workflow") not in sys.path:
    sys.path.insert(0, str(REPO / "workflow"))

from specmatch.measuring.client import Request  # noqa: E402
from specmatch.measuring.protocols import protocol as protocol_of  # noqa: E402
from specmatch.records import (CellResult, LaunchRecord, Prompt, RequestRecord, RequestSettings, Session,  # noqa: E402
                               SessionTurn)


# -- vLLM's own checks (no server) -----------------------------------------------------------------
def vllm_installed() -> bool:
    """Whether vLLM can be imported here (without importing it: that takes 10 s)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_check(argv: list[str]):
    """vLLM's own code on a server argv (`vllm serve`'s arguments, no server started): the API server's
    argument parser, EngineArgs, the model config, the speculative config (method, drafter, k) and, for a
    batch-size schedule, vLLM's validation of it and the dense per-batch-size lookup it builds.
    Returns (args, speculative config or None, the lookup or None)."""
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older layout
        from vllm.utils import FlexibleArgumentParser
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    ea = AsyncEngineArgs.from_cli_args(args)
    spec = ea.create_speculative_config(ea.create_model_config(), ParallelConfig(tensor_parallel_size=1))
    dense = None
    if spec is not None and spec.num_speculative_tokens_per_batch_size:
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        dense = build_dynamic_sd_schedule_lookup(spec.num_speculative_tokens_per_batch_size,
                                                 vllm_max_batch_size=ea.max_num_seqs or 256,
                                                 vllm_num_speculative_tokens=spec.num_speculative_tokens)
    return args, spec, dense


# -- Snakemake ------------------------------------------------------------------------------------
NGRAM = {"engine": "vllm", "model": "results/models/smollm2-135m", "dtype": "float32", "suites": ["train_holdout"],
         "speculative": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}}


KSWEEP_CONFIG = "resources/configs/cpu_ksweep.yaml"   # the shipped k sweep with the in-sample suite


def shipped_config(ngram=None, path: str = KSWEEP_CONFIG) -> dict:
    """A shipped config as written: by default resources/configs/cpu_ksweep.yaml (the eagle3 k sweep on
    train_mix, train_holdout and generic, which these tests edit); `path="config.yaml"` for the embedded
    default. `ngram`: also an n-gram server `ngram` on train_holdout drafting that k (a list: a sweep),
    for tests that need a second speculative server or one that is not a sweep."""
    import copy

    import yaml

    cfg = yaml.safe_load((REPO / path).read_text())
    if ngram is not None:
        cfg["servers"]["ngram"] = copy.deepcopy(NGRAM)
        cfg["servers"]["ngram"]["speculative"]["num_speculative_tokens"] = ngram
    return cfg


@contextlib.contextmanager
def scripted_endpoints(specs: dict, *extra: str, env: dict | None = None):
    """OpenAI-compatible scripted servers (tests/fakeserver.py), one per name: `specs[name]` is the
    speculative script as JSON (e.g. '{"k": 4, "accept": 2}') or None for a plain server; `extra` are
    more fakeserver flags. Yields {name: base_url}; every server is stopped on the way out."""
    procs, urls = [], {}
    try:
        for name, spec in specs.items():
            cmd = [sys.executable, str(REPO / "tests" / "fakeserver.py"), "--tokens", "12", "--ttft", "0.01",
                   "--itl", "0.004", *extra] + (["--spec", spec] if spec else [])
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
            procs.append(p)
            urls[name] = json.loads(p.stdout.readline())["base_url"]
        yield urls
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def snakemake_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "snakemake"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "snakemake"]


def copy_workflow(dst: Path) -> Path:
    """A copy of the workflow (code, config, resources) in which a test may run Snakemake."""
    for name in ("Snakefile", "config.yaml", "workflow", "resources", "profiles", "envs"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "demo"))
        else:
            shutil.copy2(src, dst / name)
    return dst


def run(cmd, cwd, timeout=900, env=None, check=True):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **(env or {})})
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
                             + failed_logs(r.stdout + r.stderr, Path(cwd)))
    return r


def failed_logs(output: str, cwd: Path) -> str:
    """The end of every log Snakemake names for a failed job (`log: <path> (check log file(s) ...)`): the
    traceback a CI run would otherwise lose with its temporary folder."""
    out = []
    for name in dict.fromkeys(re.findall(r"log: (\S+) \(check log", output)):
        p = cwd / name
        if p.is_file():
            out.append(f"\n--- {name} (end) ---\n" + p.read_text(errors="replace")[-3000:])
    return "".join(out)


def job_counts(stdout: str) -> dict:
    """The job table of a Snakemake dry run (`-n`): {rule: count}."""
    counts, on = {}, False
    for line in stdout.splitlines():
        if line.startswith("job ") and "count" in line:
            on = True
            continue
        if on:
            parts = line.split()
            if not parts or parts[0] == "total":
                break
            if parts[0].startswith("---"):
                continue
            counts[parts[0]] = int(parts[1])
    return counts


# -- training data --------------------------------------------------------------------------------
CONV = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write add(a, b)."},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
        {"role": "user", "content": "Now sub."},
        {"role": "assistant", "content": "def sub(a, b):\n    return a - b"}]


def make_root(tmp_path, tok, sizes):
    """A training root `prepared/` with one source per `sizes` entry, each of that many tokenized
    two-turn conversations (CONV, made distinct by a `[source i]` tag)."""
    from specmatch.data.demo import tokenize_conversation

    root = tmp_path / "prepared"
    for src, n in sizes.items():
        d = root / src
        d.mkdir(parents=True)
        with open(d / "tokenized_data.jsonl", "w") as fh:
            for i in range(n):
                conv = [dict(m) for m in CONV]
                conv[1]["content"] = f"[{src} {i}] " + conv[1]["content"]
                conv[3]["content"] = f"[{src} {i}] " + conv[3]["content"]
                fh.write(json.dumps({"id": f"{src}-{i}", **tokenize_conversation(tok, conv)}) + "\n")
    return root


# -- prompts and cells ----------------------------------------------------------------------------
REQ = {"endpoint": "completions", "passes": 2, "warmup": 0, "max_tokens": 8,
       "use_reference_length": False, "temperature": 0.0, "ignore_eos": True, "seed": 0, "timeout_s": 5,
       "max_failure_fraction": 0.0, "request_rate": None, "burstiness": 1.0,
       # the machine running the tests is shared: a cell here records its neighbours but never re-measures
       # (the tests of re-measuring choose their own readings)
       "on_interference": "flag"}


def prompt(i: int, text: str, source: str = "src", **fields) -> Prompt:
    """Prompt `s-{i}` of suite `s`."""
    base = dict(id=f"s-{i}", suite="s", source=source, file="s.jsonl", line=i + 1, row=None, row_id=str(i),
                turn=0, turns=1, text=text, messages=None, prompt_tokens=3, reference_completion_tokens=8,
                holdout=False)
    return Prompt(**{**base, **fields})


def load_requests(n: int, text: str = "hello world", protocol: str = "openai-completions", source: str = "s",
                  holdout=lambda i: False, max_tokens: int = 64) -> list[Request]:
    """`n` requests of one prompt (with messages, for the chat endpoint) to the fake server's model."""
    settings = RequestSettings(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    body = protocol_of(protocol).body
    return [Request(i, f"p{i}", source, holdout(i),
                    body(prompt(i, text, source, messages=[{"role": "user", "content": text}]), "fake", settings))
            for i in range(n)]


def prompts_file(tmp_path, texts) -> Path:
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps(prompt(i, t).to_json()) + "\n" for i, t in enumerate(texts)))
    return p


def session(i: int, texts: list[str], answers: list[str] | None = None, source: str = "src",
            answers_mode: str = "live", max_prompt_tokens: int | None = 2048, **fields) -> Session:
    """Session `s-{i}` of suite `s`: turn t adds `texts[t]` to the history (word counts stand in for
    token counts, as the fake server counts them), recorded answers `answers` (default `A<t>`)."""
    answers = answers or [f" A{t}" for t in range(len(texts))]
    turns, context = [], 0
    for t, text in enumerate(texts):
        added = len(text.split())
        context += added + (len(answers[t - 1].split()) if t else 0)
        turns.append(SessionTurn(t, text, answers[t], context, len(answers[t].split()), added,
                                 [{"role": "user", "content": text}]))
    base = dict(id=f"s-{i:05d}", suite="s", source=source, file="s.jsonl", line=i + 1, row=None, row_id=str(i),
                holdout=True, turns=turns, answers=answers_mode, max_prompt_tokens=max_prompt_tokens,
                turns_in_row=len(texts))
    return Session(**{**base, **fields})


def sessions_file(tmp_path, sessions: list[Session]) -> Path:
    p = tmp_path / "s.jsonl"
    p.write_text("".join(json.dumps(x.to_json()) + "\n" for x in sessions))
    return p


def cell_args(tmp_path, url, prompts, req) -> list[str]:
    """`python -m specmatch cell` arguments for cell c2 of an external server at `url`."""
    return ["--name", "ext", "--server", json.dumps({"engine": "external", "base_url": url, "flavor": "vllm"}),
            "--suite", "s", "--prompts", str(prompts), "--concurrency", "2", "--max-batch", "0",
            "--requests", json.dumps(req), "--out", str(tmp_path / "c2.json"),
            "--requests-out", str(tmp_path / "c2.requests.parquet"), "--state-dir", str(tmp_path / "state")]


def cell_result(server: str = "baseline", concurrency: int = 1, **fields) -> CellResult:
    """A complete, successful CellResult (8 prompts, one pass, one repeat, vLLM) by keyword; `fields`
    overrides any field by name."""
    n = fields.get("num_prompts", 8)
    base = dict(server=server, suite="train", concurrency=concurrency, repeat=1, engine="vllm",
                protocol="openai-completions", flavor="vllm", max_concurrency=concurrency, num_prompts=n,
                suite_prompts=n, passes=1, warmup_requests=0, request_rate="inf", burstiness=1.0, started_at=0.0,
                server_session="r1", server_reused=False, server_config_hash="h", cache_reset="ok", completed=n,
                failed=0, failure_reasons={}, duration=1.0, total_input_tokens=0, total_output_tokens=n,
                request_throughput=float(n), output_throughput=float(n), total_token_throughput=None)
    return CellResult(**{**base, **fields})


def launch_record(server: str, speculative: dict | None = None, **fields) -> LaunchRecord:
    """A vLLM server's launch record (launch.json) by keyword; `fields` overrides any field by name."""
    config = {"engine": "vllm", "model": "m", **({"speculative": speculative} if speculative else {})}
    base = dict(server=server, engine="vllm", flavor="vllm", max_batch=256, config=config, speculative=speculative)
    return LaunchRecord(**{**base, **fields})


# -- the report's input ---------------------------------------------------------------------------
def decided(an, attrs=None, no_control=None):
    """What the report renders for an analysis made in a test (reporting.decided.Decided): its decision
    records as the decide step writes them, read back through their JSON as the summary step reads
    them, with the analysis's cells."""
    from specmatch.deciding.decide import Decisions, records_of
    from specmatch.reporting.decided import Decided

    written = json.dumps(records_of(an, attrs or [], no_control).to_json(), default=lambda o: o.item())
    return Decided.of(Decisions.from_json(json.loads(written)), list(an.measurements.cells.values()))


# -- simulated k sweeps -------------------------------------------------------------------------
BETA = (6.0, 4.0)      # a prompt's per-token acceptance probability: mean 0.6


def sweep_cells(seed: int, rho: dict, concurrencies=(1, 4, 16), repeats: int = 3, prompts: int = 24,
                out_tokens: int = 64, session_sd: float = 0.01, cell_sd: float = 0.01, parent: str = "spec",
                extra: dict | None = None):
    """Cells of a baseline `base` and one sweep member `<parent>@k=<k>` per k of `rho` (k -> c -> the step
    cost in plain steps at that concurrency), simulated by specmatch.calibration.des with per-prompt acceptance
    from BETA, every cell's times moved by its session's and its own run-to-run effect. Each member's
    cells carry vLLM's per-position acceptance rates: a prompt accepts the first p + 1 drafts with
    probability alpha^(p + 1), weighted by its steps and scaled so that 1 + their sum equals the cell's
    acceptance length (as vLLM's counters are). `extra`: name -> f(c, engines) -> the Engine that server
    is at concurrency c (e.g. a recommended schedule: the member of the band's k at each c).
    """
    import functools
    import math
    from dataclasses import replace

    import numpy as np

    from specmatch.calibration.grid import BASE
    from specmatch.calibration.des import serve
    from specmatch.calibration.simulate import cell

    rng = np.random.default_rng(seed)
    ids = [f"p-{i:03d}" for i in range(prompts)]
    tokens = np.clip(np.round(rng.lognormal(math.log(200), 0.6, prompts)), 16, 768)
    alpha = rng.beta(*BETA, prompts)
    engines = {"base": BASE}
    for k, table in rho.items():
        cs = sorted(table)
        f = functools.partial(_rho_at, tuple(np.log(cs)), tuple(table[c] for c in cs))
        engines[f"{parent}@k={k}"] = replace(BASE, k=k, rho=f)
    names = list(engines) + list(extra or {})
    sessions = {(s, r): rng.normal(0, session_sd) for s in names for r in range(1, repeats + 1)}
    out = []
    for c in concurrencies:
        at_c = {**engines, **{n: f(c, engines) for n, f in (extra or {}).items()}}
        keys = [(s, r) for s in names for r in range(1, repeats + 1)]
        eng = [at_c[s] for s, _ in keys]
        pt = np.tile(tokens, (len(keys), 1))
        served = serve(eng, c, pt, np.full(pt.shape, out_tokens), rng, np.tile(alpha, (len(keys), 1)))
        factor = np.exp([sessions[key] + rng.normal(0, cell_sd) for key in keys])
        served = served.scaled(factor)
        ot = np.full(prompts, float(out_tokens))
        for i, (s, r) in enumerate(keys):
            one = served.row(i)
            k = eng[i].k
            spec = k > 0
            res, req = cell(s, "s", c, r, one.e2e, one.ttft, ot, ids, one.steps if spec else None,
                            one.accepted if spec else None, tokens, int(one.steps.sum()) if spec else None,
                            starts=one.start, duration=float(one.duration[0]), drafted=one.drafted if spec else None,
                            session=f"{s}-r{r}")
            if spec:
                w = one.steps / one.steps.sum()
                rates = np.array([float((w * alpha ** (p + 1)).sum()) for p in range(k)])
                rates *= (one.accepted.sum() / one.steps.sum()) / rates.sum()
                res.spec_decode_per_position_acceptance_rates = [float(x) for x in rates]
                res.spec_decode_acceptance_length = 1 + float(one.accepted.sum() / one.steps.sum())
            out.append((res, req))
    return out


def _rho_at(xs: tuple, ys: tuple, b: int) -> float:
    import math

    import numpy as np

    return float(np.interp(math.log(max(b, 1)), xs, ys))


# -- simulated traffic mixes ----------------------------------------------------------------------
# the discrete-event server's mixed batches and their truth live with the calibration
# (specmatch.calibration.traffic); tests use them from here
from specmatch.calibration.traffic import (TRAFFIC_STRATA, traffic_cells, traffic_experiment,  # noqa: E402,F401
                                           traffic_profiles, traffic_prompts, traffic_truth)


# -- synthetic cells whose acceptance depends on context ---------------------------------------------
def context_cells(seed: int, tau_at, rho_at, prompts: int = 48, repeats: int = 2, concurrencies=(1,),
                  out_tokens: int = 64, lengths=(64, 2048), session_sd: float = 0.02, cell_sd: float = 0.02,
                  request_cv: float = 0.05, tau_cv: float = 0.05, sessions: int | None = None):
    """Cells of a baseline `base` and a speculative `spec` on suite `ctx` whose truth depends on each
    prompt's context length L (log-uniform over `lengths`): tau_at(L) tokens per speculative step (times a
    per-prompt lognormal of `tau_cv`) and rho_at(L) plain decode steps per speculative step, so the true
    TPOT speedup is tau_at(L) / rho_at(L). A plain decode step costs more over a longer context (1 + L/2000).
    Per request vLLM's counts (1 + accepted / steps = tau); run-to-run noise per server session and cell.
    `sessions`: group the prompts into that many sessions (prompt ids `<session>.t<k>`), contexts
    growing within a session, and return the prompt -> session map as well."""
    import numpy as np

    from specmatch.calibration.simulate import cell

    rng = np.random.default_rng(seed)
    L = np.exp(rng.uniform(np.log(lengths[0]), np.log(lengths[1]), prompts))
    if sessions:
        L = np.sort(L)
        owner = rng.permutation(np.arange(prompts) % sessions)
        ids, turn_of = [], {}
        for i in range(prompts):
            k = turn_of.get(owner[i], 0)
            turn_of[owner[i]] = k + 1
            ids.append(f"sess-{owner[i]:03d}.t{k}")
        unit = {p: p.split(".t")[0] for p in ids}
    else:
        ids, unit = [f"ctx-{i:03d}" for i in range(prompts)], None
    tau_p = np.array([tau_at(x) for x in L]) * rng.lognormal(0.0, tau_cv, prompts)
    tau_p = np.maximum(tau_p, 1.0)
    rho_p = np.array([rho_at(x) for x in L])
    difficulty = rng.lognormal(0.0, 0.1, prompts)
    out = np.full(prompts, float(out_tokens))
    cells = []
    for r in range(1, repeats + 1):
        for name in ("base", "spec"):
            session = rng.normal(0.0, session_sd)
            for c in concurrencies:
                plain = 0.02 * (1 + 0.1 * (c - 1)) * (1 + L / 2000.0) * difficulty
                speed = np.exp(session + rng.normal(0.0, cell_sd))
                noise = rng.lognormal(0.0, request_cv, prompts)
                if name == "base":
                    tpot, steps, accepted = plain * speed * noise, None, None
                else:
                    steps = np.round((out - 1) / tau_p)
                    accepted = np.round(steps * (tau_p - 1))
                    tau_real = (steps + accepted) / steps
                    tpot = plain * rho_p / tau_real * speed * noise
                ttft = 0.05 * noise
                e2e = ttft + tpot * (out - 1)
                cells.append(cell(name, "ctx", c, r, e2e, ttft, out, ids, steps, accepted, L.round(), None,
                                  session=f"{name}-r{r}"))
    return (cells, unit) if sessions else cells


# -- the decide and summary steps on synthetic cells, as the workflow runs them ------------------------
def write_cells(root: Path, cells) -> tuple[list[str], list[str]]:
    """Cells and request records on disk, as the cell step writes them."""
    from specmatch.files import write_json
    from specmatch.measuring.cell import write_requests

    cpaths, rpaths = [], []
    for res, req in cells:
        d = root / "cells" / res.server / res.suite / f"r{res.repeat}"
        d.mkdir(parents=True, exist_ok=True)
        c, r = d / f"c{res.concurrency}.json", d / f"c{res.concurrency}.requests.parquet"
        write_json(c, res.to_json())
        recs = [RequestRecord(i, row["prompt_id"], "code" if i % 2 else "chat", False, 0, row["start_s"], row["e2e_s"],
                              row["ttft_s"], [row["ttft_s"]], 0, 10, int(row["output_tokens"]), True, None,
                              None, None if row["num_spec_steps"] is None else int(row["num_accepted_tokens"]),
                              None if row["num_spec_steps"] is None else int(row["num_spec_steps"]))
                for i, row in enumerate(req.iter_rows(named=True))]
        write_requests(r, recs)
        cpaths.append(str(c))
        rpaths.append(str(r))
    return cpaths, rpaths


def launches(root: Path, servers: dict, kv_pools: dict | None = None) -> list[str]:
    """Launch records of vLLM servers ({name: speculative config}), with the KV pools given by name."""
    from specmatch.files import write_json

    out = []
    for name, spec in servers.items():
        p = root / "servers" / name / "r1" / "launch.json"
        write_json(p, launch_record(name, spec, kv_pool=(kv_pools or {}).get(name)).to_json())
        out.append(str(p))
    return out


SPEC = {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}


def decide_and_render(out: Path, decide_args: list[str], cells: list[str]) -> None:
    """The two steps as the workflow runs them: decide (every decision, written as records), then the
    summary (renders the records and the cells; it reads no request file)."""
    from specmatch.deciding.decide import main as decide_main
    from specmatch.reporting.summary import main as summary_main

    assert decide_main([*decide_args, "--cells", *cells, "--out-dir", str(out)]) == 0
    assert summary_main(["--cells", *cells, "--out-dir", str(out)]) == 0


def run_summary(tmp_path, cells, servers, suites=("s",), settings=None, kv_pools=None):
    cp, rp = write_cells(tmp_path, cells)
    lp = launches(tmp_path, servers, kv_pools)
    cfgs = {n: {"engine": "vllm", "model": "m", **({"speculative": s} if s else {})} for n, s in servers.items()}
    out = tmp_path / "summary"
    decide_and_render(out, ["--baseline", "baseline", "--settings", json.dumps(settings or {"bootstrap": 300}),
                            "--servers", json.dumps(cfgs), "--requests", *rp, "--launches", *lp, "--suites", *suites],
                      cp)
    return out, (out / "summary.md").read_text()


def coverage_gate(n: int, nominal: float = 0.9) -> float:
    """A coverage gate of n simulated experiments: the nominal level less 3 binomial Monte-Carlo errors."""
    return nominal - 3 * math.sqrt(nominal * (1 - nominal) / n)
