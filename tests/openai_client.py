#!/usr/bin/env python3
"""Client-side test of a running deltaserve (or any OpenAI-compatible server) with the official `openai`
package: models, chat (whole and streamed, reasoning_content, usage), thinking switched off, logprobs,
n > 1, completions, error classes, and structured output (`chat.completions.parse`, `responses.parse`
and the streamed `responses.stream` with a Pydantic model, a forced tool call). It starts nothing; pass --base-url of a running server.

    .venv/bin/python tests/openai_client.py --base-url http://127.0.0.1:30000

Prints one line per check and a closing 'N passed, M failed' line; exits 1 when any check failed.
Requires: openai>=1.40 (pip install openai).
"""

import argparse
import json
import sys
import traceback
from typing import Literal

import openai
import pydantic


class Sum(pydantic.BaseModel):
    """A structured answer; bounded so that even a weak model's output is short."""

    operation: Literal["add", "subtract"]
    answer: int = pydantic.Field(ge=0, le=200)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the run
            self.failed += 1
            print(f"FAIL {name}: {exc!r}")
            traceback.print_exc(limit=3)
        else:
            self.passed += 1
            print(f"ok   {name}")


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def extra(obj, name):
    """A field the openai types do not declare (reasoning_content, spec_decoding): attribute or model_extra."""
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


def reasoning_tokens(usage):
    details = getattr(usage, "completion_tokens_details", None)
    if details is None:
        return None
    return getattr(details, "reasoning_tokens", None)


def check_usage(usage):
    expect(usage is not None, "usage is missing")
    expect(usage.prompt_tokens > 0, f"prompt_tokens = {usage.prompt_tokens}")
    expect(usage.completion_tokens > 0, f"completion_tokens = {usage.completion_tokens}")
    expect(
        usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        f"total_tokens {usage.total_tokens} != {usage.prompt_tokens} + {usage.completion_tokens}",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:30000 (/v1 optional)")
    parser.add_argument("--model", help="model name (default: the first of /v1/models)")
    parser.add_argument("--api-key", default="EMPTY")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", default="What is 2+2?")
    parser.add_argument("--expect", help="a substring the greedy answer (content or reasoning) must contain")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    base_url = args.base_url.rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    client = openai.OpenAI(base_url=base_url, api_key=args.api_key, timeout=args.timeout, max_retries=0)
    checks = Checks()
    state = {"model": args.model}
    messages = [{"role": "user", "content": args.prompt}]
    greedy = {"temperature": 0.0, "max_tokens": args.max_tokens, "seed": 1234}

    def models():
        listed = client.models.list().data
        expect(len(listed) >= 1, "no model listed")
        expect(all(m.object == "model" for m in listed), "model objects")
        if state["model"] is None:
            state["model"] = listed[0].id
        expect(any(m.id == state["model"] for m in listed), f"{state['model']} is not listed")

    checks.run("models.list", models)
    if state["model"] is None:
        print(f"0 passed, {checks.failed} failed")
        return 1
    model = state["model"]
    whole = {}

    def chat_whole():
        response = client.chat.completions.create(model=model, messages=messages, **greedy)
        expect(response.object == "chat.completion", f"object {response.object}")
        expect(response.id, "empty id")
        expect(response.model == model, f"model {response.model}")
        expect(len(response.choices) == 1, "one choice")
        choice = response.choices[0]
        expect(choice.index == 0, "index 0")
        expect(choice.message.role == "assistant", f"role {choice.message.role}")
        expect(choice.finish_reason in ("stop", "length", "tool_calls"), f"finish_reason {choice.finish_reason}")
        check_usage(response.usage)
        content = choice.message.content
        reasoning = extra(choice.message, "reasoning_content")
        expect(content is None or isinstance(content, str), "content is a string or null")
        expect(content is None or content != "", "content is null rather than empty")
        expect(content or reasoning, "neither content nor reasoning_content")
        if reasoning:
            # The server splits reasoning (--reasoning-parser qwen3): no tag may leak on either side.
            tokens = reasoning_tokens(response.usage)
            expect(tokens is not None and tokens > 0, f"reasoning text present but reasoning_tokens = {tokens}")
            expect("<think>" not in reasoning and "</think>" not in reasoning, "think tags leaked into reasoning")
            expect("</think>" not in (content or ""), "think tag leaked into content")
        if args.expect:
            expect(args.expect in (content or "") + (reasoning or ""), f"{args.expect!r} not in the answer")
        whole.update(content=content, reasoning=reasoning, usage=response.usage, finish=choice.finish_reason)

    def chat_streamed():
        stream = client.chat.completions.create(
            model=model, messages=messages, stream=True, stream_options={"include_usage": True}, **greedy
        )
        chunks = list(stream)
        expect(chunks, "no chunks")
        expect(all(c.object == "chat.completion.chunk" for c in chunks), "chunk objects")
        expect(len({c.id for c in chunks}) == 1, "one id across chunks")
        expect(chunks[0].choices[0].delta.role == "assistant", "the first chunk carries the role")
        content, reasoning, finishes = "", "", []
        for chunk in chunks[:-1]:
            expect(len(chunk.choices) == 1, "one choice per chunk")
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += extra(delta, "reasoning_content") or ""
            if chunk.choices[0].finish_reason:
                finishes.append(chunk.choices[0].finish_reason)
        expect(len(finishes) == 1, f"finish reasons {finishes}")
        last = chunks[-1]
        expect(last.choices == [], "the usage chunk has no choices")
        check_usage(last.usage)
        if whole:
            # Greedy with the same seed: the stream must say exactly what the whole response said.
            expect(content == (whole["content"] or ""), f"streamed content {content!r} != {whole['content']!r}")
            expect(reasoning == (whole["reasoning"] or ""), "streamed reasoning differs from the whole response")
            expect(finishes[0] == whole["finish"], f"finish {finishes[0]} != {whole['finish']}")
            expect(
                last.usage.completion_tokens == whole["usage"].completion_tokens,
                f"completion_tokens {last.usage.completion_tokens} != {whole['usage'].completion_tokens}",
            )

    def thinking_off():
        response = client.chat.completions.create(
            model=model,
            messages=messages,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            **greedy,
        )
        message = response.choices[0].message
        expect(not extra(message, "reasoning_content"), "reasoning_content with thinking off")
        tokens = reasoning_tokens(response.usage)
        expect(tokens in (None, 0), f"reasoning_tokens = {tokens} with thinking off")

    def logprobs():
        response = client.chat.completions.create(
            model=model, messages=messages, logprobs=True, top_logprobs=2, **{**greedy, "max_tokens": 8}
        )
        content = response.choices[0].logprobs.content
        expect(len(content) == response.usage.completion_tokens, f"{len(content)} logprobs entries")
        for entry in content:
            expect(isinstance(entry.token, str), "token string")
            expect(entry.logprob <= 0.0, f"logprob {entry.logprob}")
            expect(isinstance(entry.bytes, list), "bytes list")
            expect(len(entry.top_logprobs) == 2, f"{len(entry.top_logprobs)} top_logprobs")
            # Greedy: the chosen token is the most likely one.
            expect(entry.logprob >= entry.top_logprobs[0].logprob - 1e-4, "greedy token is not the best one")

    def n_choices():
        response = client.chat.completions.create(
            model=model, messages=messages, n=2, **{**greedy, "temperature": 0.8, "max_tokens": 8}
        )
        expect(sorted(c.index for c in response.choices) == [0, 1], "choices 0 and 1")

    def completions():
        response = client.completions.create(model=model, prompt="The capital of France is", **greedy)
        expect(response.object == "text_completion", f"object {response.object}")
        expect(isinstance(response.choices[0].text, str), "text")
        expect(response.choices[0].finish_reason in ("stop", "length"), "finish_reason")
        check_usage(response.usage)
        stream = client.completions.create(
            model=model, prompt="The capital of France is", stream=True, **greedy
        )
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        expect(text == response.choices[0].text, f"streamed {text!r} != {response.choices[0].text!r}")

    def errors():
        try:
            client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
            raise AssertionError("unknown model accepted")
        except openai.NotFoundError:
            pass
        try:
            client.chat.completions.create(model=model, messages=messages, temperature=-1.0, max_tokens=4)
            raise AssertionError("temperature -1 accepted")
        except openai.BadRequestError as exc:
            expect(exc.body and exc.body.get("param") == "temperature", f"error body {exc.body}")

    def parse_chat():
        completion = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": "What is 47 + 38?"}],
            response_format=Sum,
            temperature=0.0,
            max_tokens=400,
        )
        parsed = completion.choices[0].message.parsed
        expect(isinstance(parsed, Sum), f"parsed {parsed!r} from {completion.choices[0].message.content!r}")

    def parse_responses():
        response = client.responses.parse(
            model=model, input="What is 47 + 38?", text_format=Sum, temperature=0.0, max_output_tokens=400
        )
        expect(response.status == "completed", f"status {response.status}")
        expect(isinstance(response.output_parsed, Sum), f"output_parsed {response.output_parsed!r}")

    def stream_responses():
        kwargs = dict(model=model, input="What is 47 + 38?", temperature=0.0, max_output_tokens=400)
        whole = client.responses.parse(text_format=Sum, **kwargs)
        deltas, types = [], []
        with client.responses.stream(text_format=Sum, **kwargs) as stream:
            for event in stream:
                types.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            final = stream.get_final_response()
        expect(types[0] == "response.created", f"first event {types[0]}")
        expect(types[-1] == "response.completed", f"last event {types[-1]}")
        expect("response.output_text.done" in types, f"no output_text.done in {types}")
        expect("".join(deltas) == whole.output_text, f"streamed {''.join(deltas)!r} != {whole.output_text!r}")
        expect(final.output_parsed == whole.output_parsed, f"{final.output_parsed!r} != {whole.output_parsed!r}")

    def forced_tool_call():
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather in a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "maxLength": 32}},
                        "required": ["city"],
                    },
                },
            }
        ]
        response = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Is it raining in Atlanta right now?"}],
            tools=tools,
            tool_choice="required",
            temperature=0.0,
            max_tokens=400,
        )
        choice = response.choices[0]
        expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
        calls = choice.message.tool_calls or []
        expect(len(calls) >= 1, "no tool call")
        expect(calls[0].function.name == "get_weather", f"called {calls[0].function.name}")
        expect("city" in json.loads(calls[0].function.arguments), f"arguments {calls[0].function.arguments}")

    checks.run("chat (whole)", chat_whole)
    checks.run("chat (streamed, include_usage)", chat_streamed)
    checks.run("chat with thinking off", thinking_off)
    checks.run("chat logprobs", logprobs)
    checks.run("chat n=2", n_choices)
    checks.run("completions (whole and streamed)", completions)
    checks.run("errors (404 model, 400 temperature)", errors)
    checks.run("chat.completions.parse (Pydantic response_format)", parse_chat)
    checks.run("responses.parse (Pydantic text_format)", parse_responses)
    checks.run("responses.stream equals responses.parse (Pydantic text_format)", stream_responses)
    checks.run("tool_choice required", forced_tool_call)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
