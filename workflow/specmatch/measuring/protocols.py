"""One object per endpoint the load generator speaks, looked up by name (`PROTOCOLS`, `protocol()`).

Each knows its path, the request body it sends for a prompt, how it reads its stream's events (which
ones are token arrivals, which carry a server error, which carries the counts) and where in that
event the prompt and output token counts are. The engine adapters name the protocol a cell speaks
(Engine.protocol); the transport (specmatch.measuring.transport) only moves bytes.

Token arrivals follow vLLM's `bench serve`: an OpenAI stream chunk is an arrival when it carries
`choices` (its text may be empty, e.g. a special token); the usage chunk carries `"choices": []`.
SGLang's /generate events are arrivals when they raise meta_info.completion_tokens.

A stream that collects its output (`Stream.collect`: a session's live answer, the natural-stopping
checks) parses every event and keeps the text, the token ids and why the output ended:

- vLLM 0.32 (vllm/entrypoints/openai/completion/serving.py:417-421, chat_completion/serving.py:749-790):
  with `"return_token_ids": true` (completion/protocol.py:171, chat_completion/protocol.py:423) each
  chunk's choice carries `token_ids`, the delta's token ids (the end-of-sequence token included: it is
  part of the request's output ids, v1/core/sched/utils.py:104-107); `finish_reason` on the last one.
- SGLang 0.5.23 (srt/managers/tokenizer_manager.py:2631-2668): every /generate event has `output_ids`,
  cumulative or (with --incremental-streaming-output) a delta, and meta_info.finish_reason.

The prefix-cache hit is read from the event that carries the counts: vLLM's
usage.prompt_tokens_details.cached_tokens (entrypoints/serve/engine/protocol.py:121-139; sent only with
--enable-prompt-tokens-details, completion/serving.py:453-456, chat_completion/serving.py:90-109),
SGLang's meta_info.cached_tokens (tokenizer_manager.py:2557).
"""
from __future__ import annotations

import json
import re
from typing import Protocol as _Typing
from ..records import Prompt, RequestSettings

_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\{')
_NEEDS_PARSE = re.compile(rb'"usage"\s*:\s*\{|"error"\s*:')


class Stream(_Typing):
    """What a protocol fills in while a request's events arrive (client.RequestRun)."""
    arrivals: list[float]
    final: dict | None       # the event that carries the counts (and the engine's acceptance figures)
    error: str | None
    tokens_seen: int
    collect: bool            # keep the output: text, token ids, finish reason (parses every event)
    text_parts: list[str]
    token_ids: list[int]
    finish_reason: str | None


def has_choices(payload: bytes) -> bool:
    """Whether an OpenAI-style stream event carries choices (a token arrival, as vLLM counts them)."""
    return _CHOICES.search(payload) is not None


def _error_text(err) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


def max_tokens(prompt: Prompt, settings: RequestSettings) -> int:
    """The output budget: `max_tokens`, or the training completion's own length when that is smaller
    and `use_reference_length` is set (as the real traffic would produce)."""
    if settings.use_reference_length and prompt.reference_completion_tokens:
        return min(settings.max_tokens, prompt.reference_completion_tokens)
    return settings.max_tokens


def server_error(stream: Stream, obj: dict) -> bool:
    """An event that reports a server error instead of tokens: the request's error, and True."""
    if "error" in obj and not obj.get("choices"):
        stream.error = f"server error: {_error_text(obj['error'])}"
        return True
    return False


class Protocol:
    """An endpoint: its path, its body, its events, its counts."""
    name = ""
    path = ""

    def body(self, prompt: Prompt, model: str, settings: RequestSettings, extras: dict | None = None) -> dict:
        raise NotImplementedError

    def on_event(self, stream: Stream, payload: bytes, now: float) -> None:
        raise NotImplementedError

    def counts(self, stream: Stream) -> tuple[int | None, int | None] | None:
        """(prompt tokens, output tokens) from the server's own report; None when the stream gave none."""
        raise NotImplementedError

    def cached(self, stream: Stream) -> int | None:
        """Prompt tokens served from the prefix cache, as the engine reports them; None where it does not."""
        return None


def _int_or_none(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class OpenAICompletions(Protocol):
    """/v1/completions, streaming with usage."""
    name = "openai-completions"
    path = "/v1/completions"

    def content(self, prompt: Prompt) -> dict:
        return {"prompt": prompt.text}

    def body(self, prompt: Prompt, model: str, settings: RequestSettings, extras: dict | None = None) -> dict:
        body = {"model": model, "max_tokens": max_tokens(prompt, settings), "temperature": settings.temperature,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": settings.ignore_eos}
        body.update(self.content(prompt))
        body.update(extras or {})
        return body

    def on_event(self, stream: Stream, payload: bytes, now: float) -> None:
        if not stream.collect and not _NEEDS_PARSE.search(payload):
            # an ordinary token event: only whether it carries choices matters (the counts come from
            # the final usage event), so skip the JSON parse on the hot path
            if has_choices(payload):
                stream.arrivals.append(now)
            return
        obj = json.loads(payload)
        if server_error(stream, obj):
            return
        choices = obj.get("choices")
        if choices:
            stream.arrivals.append(now)
            if stream.collect and isinstance(choices[0], dict):
                self.keep(stream, choices[0])
        if obj.get("usage"):
            stream.final = obj

    def piece(self, choice: dict) -> str | None:
        return choice.get("text")

    def keep(self, stream: Stream, choice: dict) -> None:
        """One chunk's share of the output: its text, its token ids (`return_token_ids`), why it ended."""
        text = self.piece(choice)
        if isinstance(text, str) and text:
            stream.text_parts.append(text)
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            stream.token_ids.extend(int(x) for x in ids)
        if choice.get("finish_reason"):
            stream.finish_reason = str(choice["finish_reason"])

    def counts(self, stream: Stream) -> tuple[int | None, int | None] | None:
        if stream.final is None:
            return None
        usage = stream.final["usage"]
        return usage.get("prompt_tokens"), usage.get("completion_tokens")

    def cached(self, stream: Stream) -> int | None:
        details = ((stream.final or {}).get("usage") or {}).get("prompt_tokens_details")
        return _int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None


class OpenAIChat(OpenAICompletions):
    """/v1/chat/completions: the prompt's messages, as the data's chat template split them."""
    name = "openai-chat"
    path = "/v1/chat/completions"

    def content(self, prompt: Prompt) -> dict:
        if not prompt.messages:
            raise ValueError(f"prompt {prompt.id}: no messages to send to the chat endpoint (the data's "
                             "chat template could not be split; use requests.endpoint: completions)")
        return {"messages": prompt.messages}

    def piece(self, choice: dict) -> str | None:
        return (choice.get("delta") or {}).get("content")


class SGLangGenerate(Protocol):
    """SGLang's native /generate: the only endpoint whose meta_info has the verify-step count."""
    name = "sglang-generate"
    path = "/generate"

    def body(self, prompt: Prompt, model: str, settings: RequestSettings, extras: dict | None = None) -> dict:
        body = {"text": prompt.text, "stream": True,
                "sampling_params": {"max_new_tokens": max_tokens(prompt, settings),
                                    "temperature": settings.temperature, "ignore_eos": settings.ignore_eos}}
        body.update(extras or {})
        return body

    def on_event(self, stream: Stream, payload: bytes, now: float) -> None:
        obj = json.loads(payload)
        if server_error(stream, obj):
            return
        # meta_info.completion_tokens is cumulative whether the text is cumulative or (with
        # --incremental-streaming-output) a delta: an event that raises it brought tokens
        stream.final = obj
        meta = obj.get("meta_info") or {}
        done = meta.get("completion_tokens")
        if done is not None:
            if done > stream.tokens_seen:
                stream.tokens_seen = done
                stream.arrivals.append(now)
        elif obj.get("text") or obj.get("output_ids"):
            stream.arrivals.append(now)
        if stream.collect:
            self.keep(stream, obj, meta, done)

    @staticmethod
    def keep(stream: Stream, obj: dict, meta: dict, done) -> None:
        """The output so far: `output_ids` and `text` are cumulative, or deltas with
        --incremental-streaming-output; ids are cumulative when they number the completion tokens so
        far (a delta does only at the first event, where both readings agree). 0.5.23 defers the text
        of intermediate cumulative events (None) to the last one."""
        ids, text = obj.get("output_ids"), obj.get("text")
        cumulative = None
        if isinstance(ids, list):
            cumulative = done is not None and len(ids) == done
            stream.token_ids[:] = [int(x) for x in ids] if cumulative else stream.token_ids + [int(x) for x in ids]
        if isinstance(text, str):
            so_far = "".join(stream.text_parts)
            if cumulative is None:
                cumulative = text.startswith(so_far)
            stream.text_parts[:] = [text] if cumulative else stream.text_parts + [text]
        reason = meta.get("finish_reason")
        if isinstance(reason, dict):
            reason = reason.get("type")
        if reason:
            stream.finish_reason = str(reason)

    def counts(self, stream: Stream) -> tuple[int | None, int | None] | None:
        if stream.final is None or stream.error:
            return None
        meta = stream.final.get("meta_info") or {}
        return meta.get("prompt_tokens"), meta.get("completion_tokens")

    def cached(self, stream: Stream) -> int | None:
        return _int_or_none(((stream.final or {}).get("meta_info") or {}).get("cached_tokens"))


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (OpenAICompletions(), OpenAIChat(), SGLangGenerate())}


def protocol(name: str) -> Protocol:
    """The protocol object of an endpoint name (Engine.protocol)."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r} (known: {', '.join(PROTOCOLS)})") from None
