"""Session suites replayed turn by turn against a scripted server: the history each turn sends, the
prefix cache, concurrency as sessions in flight, failures and the context limit counted."""
import asyncio
import json

import polars as pl
import pytest

from builders import REQ, cell_args, session, sessions_file
from specmatch.files import SpecmatchError
from specmatch.measuring.cell import main, plan_requests
from specmatch.measuring.sessions import check_sessions, pass_salt, run_sessions, session_passes, turn_prompt
from specmatch.serving.engines import get_engine
from specmatch.records import RequestSettings

SETTINGS = RequestSettings(max_tokens=4, temperature=0.0, ignore_eos=False, timeout_s=5)


def texts(i: int, turns: int = 3) -> list[str]:
    """A conversation's non-assistant turns: a shared system line, then user/tool lines of session i."""
    return [f"SYS you are an agent\nU{i}.0 read the file\n"] + [f"\nTOOL{i}.{t} output of step {t}\n"
                                                                for t in range(1, turns)]


def replay(srv, sessions, c=1, settings=SETTINGS, **kw):
    runs = plan_requests(sessions, 1, 0)
    return asyncio.run(run_sessions(srv.base_url, runs, c, "openai-completions", "fake", settings,
                                    {"return_token_ids": True}, **kw)), runs


@pytest.mark.slow
def test_turns_are_sent_in_order_with_the_history_the_previous_answer_made(fake_server):
    """Live: turn t's prompt is the data's text with the server's own earlier answers in it (the fake's
    answer is a function of the prompt, as greedy decoding is); recorded: the data's answers."""
    srv = fake_server(words=True, ttft=0.001, itl=0.001, tokens=4)
    ss = [session(i, texts(i)) for i in range(2)]
    (records, outcome), runs = replay(srv, ss)
    assert outcome.completed == 2 and outcome.turns_sent == 6 and not outcome.cut_short
    sent = [e["prompt"] for e in srv.log]
    expect = []
    for s, _ in runs:                       # c=1: sessions in plan order, turns in order
        answers = []
        for t in range(len(s.turns)):
            prompt = turn_prompt(s, t, answers).text
            expect.append(prompt)
            answers.append("".join(srv.script(prompt, 4, False)[1]))
    assert sent == expect
    assert expect[1].startswith(expect[0] + answers_of(srv, expect[0])) and "TOOL" in expect[1]
    # records: one per turn, in plan order, each with its session, turn and the server's context count
    assert [(r.session_id, r.turn) for r in records] == [(s.id, t) for s, _ in runs for t in range(3)]
    assert [r.prompt_tokens for r in records] == [len(p.split()) for p in expect]
    assert all(r.output_text == answers_of(srv, p) for r, p in zip(records, expect))
    # recorded answers: each turn is exactly the data's history
    rec = [session(0, texts(0), answers_mode="recorded")]
    srv.log.clear()
    replay(srv, rec)
    assert [e["prompt"] for e in srv.log] == [turn_prompt(rec[0], t, [x.answer for x in rec[0].turns[:t]]).text
                                               for t in range(3)]
    assert " A0" in srv.log[1]["prompt"] and " A1" in srv.log[2]["prompt"]


def answers_of(srv, prompt, n=4):
    return "".join(srv.script(prompt, n, False)[1])


@pytest.mark.slow
def test_the_chat_endpoint_sends_the_history_as_messages(fake_server):
    srv = fake_server(words=True, ttft=0.001, itl=0.001, tokens=3)
    s = session(0, texts(0, 2))
    runs = plan_requests([s], 1, 0)
    records, _ = asyncio.run(run_sessions(srv.base_url, runs, 1, "openai-chat", "fake", SETTINGS, {}))
    first, second = (json.loads(e["prompt"]) for e in srv.log)
    assert first == s.turns[0].messages
    assert second == s.turns[0].messages + [{"role": "assistant", "content": records[0].output_text}] \
        + s.turns[1].messages


@pytest.mark.slow
def test_sessions_reach_an_endpoint_under_a_path_prefix(fake_server):
    srv = fake_server(words=True, ttft=0.001, itl=0.001, tokens=3, prefix="/team/llm")
    (records, outcome), _ = replay(srv, [session(i, texts(i, 2)) for i in range(2)], c=2)
    assert len(records) == 4 and all(r.ok for r in records), [r.error for r in records]
    assert outcome.turns_sent == 4 and len(srv.log) == 4


@pytest.mark.slow
def test_prefix_cache_is_reset_before_the_cell_and_not_within_a_session(tmp_path, fake_server):
    srv = fake_server(words=True, cache=True, ttft=0.001, itl=0.001, tokens=4)
    ss = [session(i, texts(i)) for i in range(4)]
    a = cell_args(tmp_path, srv.base_url, sessions_file(tmp_path, ss), {**REQ, "passes": 1, "warmup": 2,
                                                                          "max_tokens": 4, "ignore_eos": False})
    assert main(a) == 0
    assert srv.events[:3] == ["warmup", "warmup", "reset"] and srv.resets == 1
    assert srv.events[3:] == ["request"] * 12          # no reset between (or within) the sessions
    recs = pl.read_parquet(tmp_path / "c2.requests.parquet").sort("index")
    by = {}
    for r in recs.iter_rows(named=True):
        by.setdefault(r["session_id"], []).append(r)
    for turns in by.values():
        for prev, cur in zip(turns, turns[1:]):
            # the previous turn's whole prompt is a prefix of this one: served from the cache
            assert cur["cached_tokens"] >= prev["prompt_tokens"] - 1 and cur["cached_tokens"] > 0
    cell = json.loads((tmp_path / "c2.json").read_text())
    assert cell["sessions"]["sessions"] == 4 and cell["sessions"]["completed"] == 4
    assert cell["num_prompts"] == 12 and cell["suite_prompts"] == 4 and cell["prefix_cache_hit_share"] > 0.4


@pytest.mark.slow
def test_concurrency_counts_sessions_in_flight(fake_server):
    """Each worker runs one session at a time, turn after turn: at c=2 two sessions are in flight,
    never two turns of one session."""
    srv = fake_server(words=True, ttft=0.01, itl=0.005, tokens=4)
    ss = [session(i, texts(i)) for i in range(6)]
    (records, outcome), _ = replay(srv, ss, c=2)
    assert outcome.completed == 6 and len(records) == 18
    assert srv.max_in_flight == 2
    by = {}
    for r in records:
        by.setdefault(r.session_id, []).append(r)
    for turns in by.values():
        assert [r.turn for r in turns] == [0, 1, 2]
        for prev, cur in zip(turns, turns[1:]):      # a turn starts only when the previous answer ended
            assert cur.start_s >= prev.start_s + prev.e2e_s - 1e-3
    with pytest.raises(SpecmatchError, match="cannot keep 8 sessions in flight"):
        check_sessions(6, 1, 8, "s")
    assert check_sessions(6, 1, 4, "s") and not check_sessions(8, 1, 4, "s")
    # sessions per worker: min_requests_per_worker counts sessions; an engine without a cache salt says why
    assert not check_sessions(12, 1, 4, "s", 3) and check_sessions(8, 1, 4, "s", 3)
    assert "own cache: no field" in check_sessions(4, 1, 4, "s", 2, "no field")[0]


def test_sessions_per_worker_raise_the_passes_only_where_a_cache_salt_keeps_replays_cold():
    """A session suite's passes rise like a prompt suite's (sessions per worker) only where the engine
    can keep a pass off the blocks its earlier passes left: a session replayed on its own cache would
    measure a hit rate no traffic has."""
    assert session_passes(4, 1, 2, 4, "cache_salt") == 2 and session_passes(8, 1, 2, 4, "cache_salt") == 1
    assert session_passes(4, 1, 2, 4, None) == 1 and session_passes(4, 1, None, 4, "cache_salt") == 1
    for cfg in ({"engine": "vllm", "model": "m"}, {"engine": "sglang", "model": "m"},
                {"engine": "external", "base_url": "http://h", "flavor": "sglang"}):
        assert get_engine(cfg).cache_salt_field()[0] == "cache_salt"
    field, why = get_engine({"engine": "external", "base_url": "http://h", "flavor": "openai"}).cache_salt_field()
    assert field is None and "openai" in why


def test_one_server_without_a_salt_keeps_the_configured_passes_for_every_server():
    """Servers compared on a session suite send the same sessions: where one of the run's servers has no
    cache salt (an endpoint of another flavor), none raises its passes (a steady state would otherwise
    be compared with one wave), and the cells say why."""
    from specmatch.config import requests_settings

    cfg = {"requests": {"passes": 1, "min_requests_per_worker": 2},
           "suites": {"sess": {"kind": "session"}, "p": {"kind": "training"}},
           "servers": {"a": {"engine": "vllm", "model": "m"},
                       "b": {"engine": "external", "base_url": "http://h", "flavor": "sglang"}}}
    assert requests_settings(cfg, "sess")["session_salt"] is None and "session_salt" not in requests_settings(cfg, "p")
    cfg["servers"]["c"] = {"engine": "external", "base_url": "http://h", "flavor": "openai"}
    why = requests_settings(cfg, "sess")["session_salt"]
    assert why.startswith("server c:") and "openai" in why
    assert pass_salt(1) == "specmatch-pass-1" and pass_salt(1, "team") == "team-specmatch-pass-1"


@pytest.mark.slow
def test_each_pass_replays_its_sessions_under_its_own_cache_salt(tmp_path, fake_server):
    """4 sessions at c=2 with two sessions per worker... and 4 per worker asked: two passes, the second
    under its own salt. Within a pass a session's turns hit their own history and the shared system
    line; a session's first turn in pass 2 hits only that line, not pass 1's replay of it."""
    srv = fake_server(words=True, cache=True, ttft=0.001, itl=0.001, tokens=4)
    ss = [session(i, texts(i)) for i in range(4)]
    a = cell_args(tmp_path, srv.base_url, sessions_file(tmp_path, ss),
                  {**REQ, "passes": 1, "warmup": 0, "max_tokens": 4, "ignore_eos": False,
                   "min_requests_per_worker": 4})
    assert main(a) == 0
    cell = json.loads((tmp_path / "c2.json").read_text())
    assert cell["passes"] == 2 and cell["num_prompts"] == 24 and cell["sessions"]["completed"] == 8
    assert {e["cache_salt"] for e in srv.log} == {pass_salt(0), pass_salt(1)}
    recs = pl.read_parquet(tmp_path / "c2.requests.parquet")
    first = recs.filter(pl.col("turn") == 0)
    system = len(texts(0)[0].split()) - len(texts(0)[0].splitlines()[1].split())   # the shared system line's words
    assert first.height == 8 and first["cached_tokens"].max() <= system
    later = recs.filter(pl.col("turn") > 0)
    assert (later["cached_tokens"] > system).all()
    # one pass (enough sessions per worker): no salt is sent, as before
    srv.log.clear()
    a = cell_args(tmp_path, srv.base_url, sessions_file(tmp_path, ss),
                  {**REQ, "passes": 1, "warmup": 0, "max_tokens": 4, "ignore_eos": False,
                   "min_requests_per_worker": 2})
    assert main(a) == 0
    assert {e["cache_salt"] for e in srv.log} == {None}
    # another server of the run has no salt: one pass here too, and the warning says why
    srv.log.clear()
    a = cell_args(tmp_path, srv.base_url, sessions_file(tmp_path, ss),
                  {**REQ, "passes": 1, "warmup": 0, "max_tokens": 4, "ignore_eos": False,
                   "min_requests_per_worker": 4, "session_salt": "server other: no field"})
    assert main(a) == 0
    cell = json.loads((tmp_path / "c2.json").read_text())
    assert cell["passes"] == 1 and {e["cache_salt"] for e in srv.log} == {None}
    assert any("server other: no field" in w for w in cell.get("warnings") or [])


@pytest.mark.slow
def test_a_session_whose_server_fails_mid_way_is_counted_not_dropped(tmp_path, fake_server):
    srv = fake_server(words=True, ttft=0.001, itl=0.001, tokens=4)
    bad = texts(1)
    bad[1] = "\nTOOL FAIL500 the tool crashed\n"
    ss = [session(0, texts(0)), session(1, bad), session(2, texts(2))]
    (records, outcome), _ = replay(srv, ss)
    assert outcome.sessions == 3 and outcome.completed == 2 and outcome.cut_short == {"failed": 1}
    assert outcome.turns_planned == 9 and outcome.turns_sent == 8 and outcome.turns_failed == 1
    assert outcome.turns_not_sent == 1
    assert outcome.examples[0]["session"] == "s-00001" and outcome.examples[0]["turn"] == 1
    failed = [r for r in records if not r.ok]
    assert len(failed) == 1 and failed[0].session_id == "s-00001" and failed[0].turn == 1
    # through the cell: the failure fails the job beyond the tolerance, and the partial cell counts it
    a = cell_args(tmp_path, srv.base_url, sessions_file(tmp_path, ss), {**REQ, "passes": 1, "max_tokens": 4})
    assert main(a) == 2
    cell = json.loads((tmp_path / "c2.failed.json").read_text())
    assert cell["failed"] == 1 and cell["completed"] == 7
    assert cell["sessions"]["cut_short"] == {"failed": 1} and cell["sessions"]["turns_not_sent"] == 1


@pytest.mark.slow
def test_a_session_stops_before_a_turn_beyond_the_served_context(tmp_path, fake_server):
    """The next turn's context is predicted from the server's usage plus what the data adds; a turn
    that would not fit (max_model_len less max_tokens, or max_prompt_tokens) is not sent, and the
    session is counted as stopped at the context with its reason."""
    srv = fake_server(words=True, ttft=0.001, itl=0.001, tokens=4, max_model_len=30)
    ss = [session(0, texts(0))]
    runs = plan_requests(ss, 1, 0)
    records, outcome = asyncio.run(run_sessions(srv.base_url, runs, 1, "openai-completions", "fake", SETTINGS, {},
                                                served=30))
    sizes = [r.prompt_tokens for r in records]
    assert len(records) == 2 and sizes[-1] <= 26          # 30 - max_tokens 4
    nxt = sizes[-1] + records[-1].output_tokens + ss[0].turns[2].added_tokens
    assert nxt > 26 and outcome.cut_short == {"context": 1} and outcome.turns_not_sent == 1
    assert "served context 30 less max_tokens 4" in outcome.examples[0]["why"]
    # the suite's own limit, through the cell (which reads the served context from /v1/models)
    short = [session(0, texts(0), max_prompt_tokens=12)]
    a = cell_args(tmp_path, srv.base_url, sessions_file(tmp_path, short), {**REQ, "passes": 1, "max_tokens": 4})
    a[a.index("--concurrency") + 1] = "1"
    assert main(a) == 0
    cell = json.loads((tmp_path / "c2.json").read_text())
    assert cell["served_context"] == 30 and cell["sessions"]["cut_short"] == {"context": 1}
    assert "max_prompt_tokens 12" in cell["sessions"]["examples"][0]["why"] and cell["completed"] == 1


@pytest.mark.slow
def test_the_same_sessions_in_the_same_order_on_every_server(fake_server):
    a = fake_server(words=True, ttft=0.001, itl=0.001, tokens=3)
    b = fake_server(words=True, ttft=0.001, itl=0.001, tokens=3, spec={"k": 2, "accept": 1})
    ss = [session(i, texts(i, 2)) for i in range(5)]
    for srv in (a, b):
        replay(srv, ss)
    assert [e["prompt"] for e in a.log] == [e["prompt"] for e in b.log]
    order = [s.id for s, _ in plan_requests(ss, 1, 0)]
    assert order != sorted(order) or len(order) < 3      # a seeded order, not the file's
    assert order == [s.id for s, _ in plan_requests(ss, 1, 0)]
