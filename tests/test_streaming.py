"""How the client defines its numbers (vLLM bench serve's definitions) and reads SGLang's stream."""
import asyncio

import pytest

from builders import load_requests
from specmatch.measuring.client import run_load
from specmatch.serving.engines import get_engine


def reqs(n, text="hello world", protocol="openai-completions"):
    return load_requests(n, text, protocol)


@pytest.mark.slow
def test_e2e_ends_at_the_last_token_chunk_not_the_usage_chunk(fake_server):
    """Defect 9: e2e ended after the usage chunk and [DONE]; vLLM ends at the last chunk with choices."""
    srv = fake_server(tokens=10, ttft=0.05, itl=0.01, usage_delay=0.3)
    r = asyncio.run(run_load(srv.base_url, reqs(2), 1, "openai-completions"))[0]
    assert r.ok and r.e2e_s == pytest.approx(0.05 + 9 * 0.01, abs=0.04)  # not + 0.3


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["openai-completions", "openai-chat"])
def test_ttft_counts_the_first_chunk_with_choices_even_if_empty(fake_server, protocol):
    """Defect 9: TTFT counted only non-empty content; vLLM counts the first chunk that carries choices."""
    srv = fake_server(tokens=5, ttft=0.1, itl=0.05, empty_first=True)
    r = asyncio.run(run_load(srv.base_url, reqs(1, protocol=protocol), 1, protocol))[0]
    assert r.ok and r.ttft_s == pytest.approx(0.1, abs=0.03)  # not 0.15
    assert len(r.arrivals_s) == 6 and r.output_tokens == 5


@pytest.mark.slow
@pytest.mark.parametrize("incremental", [False, True])
def test_sglang_stream_counts_every_arrival(fake_server, incremental):
    """Defect 10: with --incremental-streaming-output (delta text) the `len(text) > seen` check dropped
    most arrivals. meta_info.completion_tokens is cumulative in both modes."""
    srv = fake_server(tokens=12, ttft=0.02, itl=0.01, incremental=incremental, spec={"k": 3, "accept": 2})
    eng = get_engine({"engine": "sglang", "model": "m"})
    recs = asyncio.run(run_load(srv.base_url, reqs(2, protocol="sglang-generate"), 1, "sglang-generate",
                                eng.parse_request_acceptance))
    assert len(recs) == 2
    for r in recs:
        assert r.ok and len(r.arrivals_s) == 12 and r.output_tokens == 12
        assert r.num_spec_steps == 4 and r.acceptance_length == pytest.approx(3.0)


@pytest.mark.slow
def test_sglang_error_event_is_reported_as_its_error(fake_server):
    """Defect 10: an SGLang error event was reported as "no usage"."""
    srv = fake_server(tokens=4)
    r = asyncio.run(run_load(srv.base_url, reqs(1, "ERRORSG please", "sglang-generate"), 1, "sglang-generate"))[0]
    assert not r.ok and r.error == "server error: scripted SGLang failure"


@pytest.mark.slow
def test_definitions_are_written_into_every_cell(tmp_path, fake_server):
    import json

    from builders import REQ, cell_args, prompts_file

    srv = fake_server(tokens=4, ttft=0.001, itl=0.001)
    from specmatch.measuring.cell import main

    assert main(cell_args(tmp_path, srv.base_url, prompts_file(tmp_path, ["a", "b"]), REQ)) == 0
    cell = json.loads((tmp_path / "c2.json").read_text())
    assert "vLLM bench serve" in cell["definitions"]["ttft"] and "last chunk" in cell["definitions"]["e2el"]
