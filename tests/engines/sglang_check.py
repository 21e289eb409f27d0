"""Run inside a pinned SGLang release: parse argvs with SGLang's own server-argument parser and run
its own validation (ServerArgs.from_cli_args), and report what it made of them. Reads a JSON list
of argvs (the part after `python -m sglang.launch_server`) on stdin, writes JSON on stdout:
{"results": one per argv, "options": every option string of the parser}. One process for every
check of a test module: importing SGLang takes seconds."""
import argparse
import contextlib
import io
import json
import sys

from sglang.srt.server_args import ServerArgs

KEEP = ("model_path", "tp_size", "max_running_requests", "cuda_graph_max_bs", "cuda_graph_max_bs_decode",
        "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens", "speculative_adaptive", "speculative_adaptive_config", "enable_metrics",
        "host", "port", "dtype")
out = []
options = argparse.ArgumentParser()
ServerArgs.add_cli_args(options)
for argv in json.loads(sys.stdin.read()):
    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except (SystemExit, argparse.ArgumentError) as exc:
        out.append({"error": (err.getvalue().strip().splitlines() or [str(exc)])[-1]})
        continue
    rec = {"parsed": {k: getattr(ns, k) for k in KEEP if hasattr(ns, k)}}
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            ServerArgs.from_cli_args(ns)
        rec["validation"] = "ok"
    except Exception as exc:  # noqa: BLE001 - whatever SGLang's own checks raise
        rec["validation"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    out.append(rec)
print(json.dumps({"results": out, "options": [s for a in options._actions for s in a.option_strings]}, default=str))
