"""One object per endpoint the load generator speaks, looked up by name (`PROTOCOLS`, `protocol()`).

Each knows its path, the request body it sends for a prompt, how it reads its stream's events (which
ones are token arrivals, which carry a server error, which carries the counts) and where in that
event the prompt and output token counts are. The engine adapters name the protocol a cell speaks
(Engine.protocol); the transport (specmatch.measuring.transport) only moves bytes.

Token arrivals follow vLLM's `bench serve`: an OpenAI stream chunk is an arrival when it carries
`choices` (its text may be empty, e.g. a special token); the usage chunk carries `"choices": []`.
SGLang's /generate events are arrivals when they raise meta_info.completion_tokens.
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
        if not _NEEDS_PARSE.search(payload):
            # an ordinary token event: only whether it carries choices matters (the counts come from
            # the final usage event), so skip the JSON parse on the hot path
            if has_choices(payload):
                stream.arrivals.append(now)
            return
        obj = json.loads(payload)
        if server_error(stream, obj):
            return
        if obj.get("choices"):
            stream.arrivals.append(now)
        if obj.get("usage"):
            stream.final = obj

    def counts(self, stream: Stream) -> tuple[int | None, int | None] | None:
        if stream.final is None:
            return None
        usage = stream.final["usage"]
        return usage.get("prompt_tokens"), usage.get("completion_tokens")


class OpenAIChat(OpenAICompletions):
    """/v1/chat/completions: the prompt's messages, as the data's chat template split them."""
    name = "openai-chat"
    path = "/v1/chat/completions"

    def content(self, prompt: Prompt) -> dict:
        if not prompt.messages:
            raise ValueError(f"prompt {prompt.id}: no messages to send to the chat endpoint (the data's "
                             "chat template could not be split; use requests.endpoint: completions)")
        return {"messages": prompt.messages}


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

    def counts(self, stream: Stream) -> tuple[int | None, int | None] | None:
        if stream.final is None or stream.error:
            return None
        meta = stream.final.get("meta_info") or {}
        return meta.get("prompt_tokens"), meta.get("completion_tokens")


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (OpenAICompletions(), OpenAIChat(), SGLangGenerate())}


def protocol(name: str) -> Protocol:
    """The protocol object of an endpoint name (Engine.protocol)."""
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise ValueError(f"unknown protocol {name!r} (known: {', '.join(PROTOCOLS)})") from None
