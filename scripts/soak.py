#!/usr/bin/env python3
"""Soak test for `deltaserve serve`: a bounded run of mixed, partly hostile clients on loopback.

Starts the server itself, records a greedy (temperature 0) reference reply, warms up, then for `--duration`
seconds runs `--concurrency` workers that draw request kinds at random (seeded):
  normal     non-streaming chat (or, one time in four, /v1/completions); expects 200 with a choice
  stream     streaming chat/completions read to `data: [DONE]`; expects 200 and [DONE]
  cancel     streaming, closes the socket after a few chunks (FIN or abort); expects 200 and >= 1 chunk
  malformed  broken JSON bodies; expects 400
  oversized  Content-Length of 33 MiB, body streamed in 1 MiB pieces; expects 413 (an early close is accepted)
  slow       streaming with a tiny receive buffer, reads one chunk per second for a few seconds, then either
             reads to the end or closes; expects 200
  multiturn  a conversation of 3-5 turns under a system prompt, each turn resending the whole history (the
             prefix cache's main case); expects 200 with a choice on every turn
  shared     one long system prompt (a document) and a different question, streamed or not; expects 200
  cancel_prefix  a multi-turn history or the long system prompt, streamed and closed after 0-4 chunks
             (0: right after the response head, usually mid-prefill); expects 200
Afterwards it checks: the process is alive; /metrics drains to running = queued = 0 (within 30 s) with the
pools holding exactly what the prefix cache holds (kv_blocks_used = prefix_cache_kv_blocks, state_slots_used =
prefix_cache_snapshots); after POST /flush_cache both pools and both cache gauges read 0. With
--disable-radix-cache the pools must read 0 right after the soak, without a flush. VmRSS is within 10 % of its
post-warm-up level; the greedy replies (a short prompt, and a prompt under the long system prompt, which hits
the cache) equal their references, with the cache warm and after the flush; no 5xx was answered. Prints a JSON
summary and exits 1 when a check fails. The server is always killed at the end. Standard library only (asyncio
raw TCP streams, HTTP/1.1, Connection: close).

Usage:
  python3 scripts/soak.py                                   # 120 s, concurrency 64, binary target/release/deltaserve
  python3 scripts/soak.py --duration 20 --json-out /tmp/soak.json --log /tmp/soak_server.log
  python3 scripts/soak.py --duration 60 --disable-radix-cache      # the same mix, prefix cache off
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BINARY = REPO_ROOT / "target" / "release" / "deltaserve"
HOST = "127.0.0.1"

KIND_WEIGHTS = {
    "normal": 25,
    "stream": 25,
    "cancel": 15,
    "malformed": 10,
    "oversized": 5,
    "slow": 20,
    "multiturn": 15,
    "shared": 15,
    "cancel_prefix": 10,
}
OVERSIZED_BYTES = 33 * 1024 * 1024
OVERSIZED_PIECE = 1024 * 1024
REQUEST_TIMEOUT_S = 60.0
POOL_DRAIN_TIMEOUT_S = 30.0
MEMORY_TOLERANCE = 0.10
POOL_GAUGES = (
    "deltaserve_running_requests",
    "deltaserve_queued_requests",
    "deltaserve_kv_blocks_used",
    "deltaserve_state_slots_used",
)
# What the prefix cache holds now: KV blocks only the cache references, and snapshot slots
# (crates/engine/src/metrics.rs). Both are also counted in the `_used` gauges above.
CACHE_GAUGES = ("deltaserve_prefix_cache_kv_blocks", "deltaserve_prefix_cache_snapshots")
CACHE_COUNTERS = (
    "deltaserve_prefix_cache_queries_total",
    "deltaserve_prefix_cache_hits_total",
    "deltaserve_prefix_cache_snapshots_taken_total",
    "deltaserve_prefix_cache_evicted_pages_total",
    "deltaserve_prefix_cache_evicted_snapshots_total",
    "deltaserve_preemptions_total",
    "deltaserve_failed_steps_total",
)

REFERENCE_PROMPT = "What is 17 + 25? Answer briefly."
PROMPTS = [
    "Tell me a story about a lighthouse.",
    "What is 12 + 30?",
    "Is 91 a prime number?",
    "Write a Python function is_prime(n).",
    "Search the web for the highest waterfall.",
    "Hi",
    "Explain what a hash map is in two sentences.",
    "List three colours.",
]
# The long system prompt of the shared-prefix kinds (several hundred tokens on the demo tokenizer: past
# the cache's 64-token grid and its 256-token tracking interval), and the questions asked under it.
SHARED_SYSTEM_PROMPT = "You are a careful assistant for a small arithmetic and programming help desk. " + " ".join(
    f"Rule {i}: {rule}"
    for i, rule in enumerate(
        [
            "answer briefly and check every sum twice before you answer.",
            "when asked whether a number is prime, name its smallest factor if it has one.",
            "write Python functions with a short docstring and no imports.",
            "when a tool is needed, call it with the exact arguments the user gave.",
            "never invent facts about the weather, the time or currencies.",
            "count the items of a list one by one and say the count at the end.",
            "when sorting numbers, list them from the smallest to the largest.",
            "spell words letter by letter, separated by spaces.",
        ]
        * 3
    )
)
SHARED_QUESTIONS = [
    "What is 47 + 38?",
    "Is 91 prime?",
    "Sort 5, 3, 9, 1.",
    "Write a Python function factorial(n).",
    "What is 64 - 29?",
    "Count the items: apple, pear, plum.",
    "Is 97 prime?",
    "What is 8 + 15?",
]
# Long enough (with the first question) to pass the cache's 64-token grid, so that turn 2 can already hit.
CONVERSATION_SYSTEM = (
    "You are a helpful assistant for arithmetic, primality, counting, small Python functions and tool calls. "
    "Answer briefly, check every sum before you answer, and say so when a question is outside what you know."
)
# Canned earlier turns for cancel_prefix: a history resent with a new question, as a client would.
CANNED_HISTORY = [
    ("What is 12 + 30?", "12 + 30 = 42."),
    ("Is 91 a prime number?", "No, 91 = 7 x 13."),
    ("List three colours.", "Red, green and blue."),
    ("What is 40 - 18?", "40 - 18 = 22."),
]
SHARED_REFERENCE_QUESTION = "What is 23 + 19?"
MALFORMED_BODIES = [
    b'{"messages": [{"role": "user", "content": "hi"}',  # truncated
    b"{bad json}",
    b"not json at all",
    b'{"messages": [{"role": "user", "content": "hi"}],}',  # trailing comma
    b"\xff\xfe\x00garbage",  # not UTF-8
    b"",  # empty body
]


class ProtocolError(Exception):
    """The server's reply is not well-formed HTTP/1.1 or SSE."""


# ---------------------------------------------------------------------------------------------- HTTP client


async def open_conn(port: int, rcvbuf: int | None = None, limit: int = 2**16):
    """Connects to the server; a small `rcvbuf` plus a small `limit` makes slow reading push back on the server."""
    if rcvbuf is None:
        return await asyncio.open_connection(HOST, port, limit=limit)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (HOST, port))
    return await asyncio.open_connection(sock=sock, limit=limit)


def request_head(method: str, path: str, port: int, body_len: int | None, content_type: str = "application/json"):
    lines = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "Connection: close", "User-Agent: deltaserve-soak"]
    if body_len is not None:
        lines += [f"Content-Type: {content_type}", f"Content-Length: {body_len}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionResetError("connection closed before a status line")
    parts = status_line.decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ProtocolError(f"bad status line {status_line!r}")
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise ProtocolError("connection closed inside the response headers")
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]):
    """Yields the response body as it arrives (chunked, content-length or read-to-EOF)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ProtocolError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()  # trailer terminator
                return
            piece = await reader.readexactly(size)
            await reader.readexactly(2)
            yield piece
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            piece = await reader.read(min(remaining, 65536))
            if not piece:
                raise ProtocolError(f"connection closed with {remaining} body bytes missing")
            remaining -= len(piece)
            yield piece
    else:
        while piece := await reader.read(65536):
            yield piece


async def read_body(reader, headers) -> bytes:
    return b"".join([p async for p in body_pieces(reader, headers)])


async def sse_events(reader, headers):
    """Yields the `data:` payloads of an SSE body, one per event."""
    buf = b""
    async for piece in body_pieces(reader, headers):
        buf += piece
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield line[5:].strip().decode()


def close_writer(writer: asyncio.StreamWriter, abort: bool = False) -> None:
    if abort:
        writer.transport.abort()
    else:
        writer.close()


async def simple_request(port: int, method: str, path: str, body: bytes | None = None):
    reader, writer = await open_conn(port)
    try:
        writer.write(request_head(method, path, port, None if body is None else len(body)) + (body or b""))
        await writer.drain()
        status, headers = await read_head(reader)
        return status, headers, await read_body(reader, headers)
    finally:
        close_writer(writer)


# ---------------------------------------------------------------------------------------------- request kinds


@dataclass
class Outcome:
    kind: str
    outcome: str  # "ok:<detail>" when the behaviour was the expected one, else an error class
    latency_s: float
    status: int | None = None
    events: int = 0
    tally: "Tally | None" = None


@dataclass
class Tally:
    """What the prefix-cache kinds saw in `usage`: prompt tokens sent and how many were cached."""

    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    hits: int = 0  # replies with cached_tokens > 0

    def add_usage(self, usage: dict | None) -> None:
        if not usage:
            return
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.prompt_tokens += usage.get("prompt_tokens") or 0
        self.cached_tokens += cached
        self.hits += cached > 0


def generation_body(rng: random.Random, stream: bool) -> tuple[str, bytes]:
    use_completions = rng.random() < 0.25
    body = {
        "max_tokens": rng.randint(8, 64),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "stream": stream,
    }
    prompt = rng.choice(PROMPTS)
    if use_completions:
        body["prompt"] = prompt
        path = "/v1/completions"
    else:
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    return path, json.dumps(body).encode()


def classify_exception(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timeout"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "incomplete_read"
    if isinstance(exc, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(exc, ConnectionResetError):
        return "connection_reset"
    if isinstance(exc, BrokenPipeError):
        return "broken_pipe"
    if isinstance(exc, ProtocolError):
        return "protocol_error"
    if isinstance(exc, json.JSONDecodeError):
        return "bad_json_reply"
    return "exception:" + type(exc).__name__


async def do_normal(port, rng, tally) -> tuple[str, int | None, int]:
    path, body = generation_body(rng, stream=False)
    status, _, reply = await simple_request(port, "POST", path, body)
    if status != 200:
        return f"http_{status}", status, 0
    doc = json.loads(reply)
    if not doc.get("choices"):
        return "no_choices", status, 0
    return "ok:200", status, 0


async def stream_until(port, rng, stop_after: int | None, slow: bool) -> tuple[str, int | None, int]:
    path, body = generation_body(rng, stream=True)
    if slow:  # tiny kernel and asyncio buffers so that not reading really stalls the server's writes
        reader, writer = await open_conn(port, rcvbuf=2048, limit=1024)
    else:
        reader, writer = await open_conn(port)
    abort = rng.random() < 0.5
    try:
        writer.write(request_head("POST", path, port, len(body)) + body)
        await writer.drain()
        status, headers = await read_head(reader)
        if status != 200:
            await read_body(reader, headers)
            return f"http_{status}", status, 0
        events = 0
        slow_reads = rng.randint(2, 5) if slow else 0
        finish_early = slow and rng.random() < 0.5
        async for data in sse_events(reader, headers):
            if data == "[DONE]":
                return "ok:done", status, events
            json.loads(data)
            events += 1
            if stop_after is not None and events >= stop_after:
                close_writer(writer, abort)
                return ("ok:cancelled_abort" if abort else "ok:cancelled_close"), status, events
            if slow and events <= slow_reads:
                await asyncio.sleep(1.0)
                if events == slow_reads and finish_early:
                    close_writer(writer, abort)
                    return "ok:slow_then_closed", status, events
        return "stream_ended_without_done", status, events
    finally:
        close_writer(writer)


async def do_stream(port, rng, tally):
    return await stream_until(port, rng, None, slow=False)


async def do_cancel(port, rng, tally):
    return await stream_until(port, rng, rng.randint(1, 4), slow=False)


async def do_slow(port, rng, tally):
    return await stream_until(port, rng, None, slow=True)


async def do_malformed(port, rng, tally):
    body = rng.choice(MALFORMED_BODIES)
    path = rng.choice(["/v1/chat/completions", "/v1/completions"])
    status, _, _ = await simple_request(port, "POST", path, body)
    return ("ok:400" if status == 400 else f"http_{status}"), status, 0


async def do_oversized(port, rng, tally):
    reader, writer = await open_conn(port)
    path = rng.choice(["/v1/chat/completions", "/v1/completions"])
    sent = 0
    try:
        writer.write(request_head("POST", path, port, OVERSIZED_BYTES))
        head_task = asyncio.ensure_future(read_head(reader))
        piece = b"x" * OVERSIZED_PIECE
        try:
            while sent < OVERSIZED_BYTES and not head_task.done():
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
        except OSError:
            pass  # the server may answer 413 and close before the body is through
        try:
            status, headers = await head_task
        except (OSError, asyncio.IncompleteReadError, ProtocolError):
            # An early close while we were still sending can reset the socket and discard the 413 unread.
            return "ok:closed_without_response", None, 0
        try:
            await read_body(reader, headers)
        except (OSError, asyncio.IncompleteReadError, ProtocolError):
            pass
        return ("ok:413" if status == 413 else f"http_{status}"), status, 0
    finally:
        close_writer(writer, abort=True)


def chat_body(messages: list[dict], rng: random.Random, stream: bool, max_tokens: int) -> bytes:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": rng.choice([0.0, 0.0, 0.7]),
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def shared_messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SHARED_SYSTEM_PROMPT}, {"role": "user", "content": question}]


async def do_multiturn(port, rng, tally):
    """A conversation of 3-5 turns; every turn resends the system prompt and all earlier turns."""
    messages = [{"role": "system", "content": CONVERSATION_SYSTEM}]
    questions = rng.sample(PROMPTS + SHARED_QUESTIONS, rng.randint(3, 5))
    status = None
    for question in questions:
        messages.append({"role": "user", "content": question})
        body = chat_body(messages, rng, stream=False, max_tokens=rng.randint(16, 48))
        status, _, reply = await simple_request(port, "POST", "/v1/chat/completions", body)
        if status != 200:
            return f"http_{status}", status, tally.turns
        doc = json.loads(reply)
        if not doc.get("choices"):
            return "no_choices", status, tally.turns
        tally.turns += 1
        tally.add_usage(doc.get("usage"))
        # Clients resend the visible answer (the template drops earlier reasoning anyway); a reply cut
        # inside its reasoning has none, and a placeholder keeps the turn in the history.
        content = doc["choices"][0]["message"].get("content") or "(no answer)"
        messages.append({"role": "assistant", "content": content})
    return "ok:200", status, tally.turns


async def do_shared(port, rng, tally):
    """The long system prompt with one of several questions, streamed half of the time."""
    stream = rng.random() < 0.5
    body = chat_body(shared_messages(rng.choice(SHARED_QUESTIONS)), rng, stream, rng.randint(8, 48))
    if not stream:
        status, _, reply = await simple_request(port, "POST", "/v1/chat/completions", body)
        if status != 200:
            return f"http_{status}", status, 0
        doc = json.loads(reply)
        if not doc.get("choices"):
            return "no_choices", status, 0
        tally.turns = 1
        tally.add_usage(doc.get("usage"))
        return "ok:200", status, 0
    reader, writer = await open_conn(port)
    try:
        writer.write(request_head("POST", "/v1/chat/completions", port, len(body)) + body)
        await writer.drain()
        status, headers = await read_head(reader)
        if status != 200:
            await read_body(reader, headers)
            return f"http_{status}", status, 0
        events = 0
        async for data in sse_events(reader, headers):
            if data == "[DONE]":
                tally.turns = 1
                return "ok:done", status, events
            event = json.loads(data)
            tally.add_usage(event.get("usage"))
            events += 1
        return "stream_ended_without_done", status, events
    finally:
        close_writer(writer)


async def do_cancel_prefix(port, rng, tally):
    """A request the cache can serve (a canned multi-turn history or the long system prompt), streamed and
    closed after 0-4 chunks: 0 closes right after the response head, usually while the prompt is prefilled."""
    if rng.random() < 0.5:
        messages = [{"role": "system", "content": CONVERSATION_SYSTEM}]
        for question, answer in CANNED_HISTORY[: rng.randint(1, len(CANNED_HISTORY))]:
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": rng.choice(SHARED_QUESTIONS)})
    else:
        messages = shared_messages(rng.choice(SHARED_QUESTIONS))
    body = chat_body(messages, rng, stream=True, max_tokens=rng.randint(16, 64))
    stop_after = rng.randint(0, 4)
    abort = rng.random() < 0.5
    reader, writer = await open_conn(port)
    try:
        writer.write(request_head("POST", "/v1/chat/completions", port, len(body)) + body)
        await writer.drain()
        status, headers = await read_head(reader)
        if status != 200:
            await read_body(reader, headers)
            return f"http_{status}", status, 0
        how = "abort" if abort else "close"
        if stop_after == 0:
            close_writer(writer, abort)
            return f"ok:cancelled_at_head_{how}", status, 0
        events = 0
        async for data in sse_events(reader, headers):
            if data == "[DONE]":
                return "ok:done", status, events
            json.loads(data)
            events += 1
            if events >= stop_after:
                close_writer(writer, abort)
                return f"ok:cancelled_{how}", status, events
        return "stream_ended_without_done", status, events
    finally:
        close_writer(writer)


KIND_FUNCS = {
    "normal": do_normal,
    "stream": do_stream,
    "cancel": do_cancel,
    "malformed": do_malformed,
    "oversized": do_oversized,
    "slow": do_slow,
    "multiturn": do_multiturn,
    "shared": do_shared,
    "cancel_prefix": do_cancel_prefix,
}


async def run_one(kind: str, port: int, rng: random.Random, timeout: float) -> Outcome:
    start = time.monotonic()
    tally = Tally()
    try:
        outcome, status, events = await asyncio.wait_for(KIND_FUNCS[kind](port, rng, tally), timeout)
    except asyncio.CancelledError:
        return Outcome(kind, "cut_at_deadline", time.monotonic() - start, tally=tally)
    except Exception as exc:  # every failure is classified and counted, never raised
        return Outcome(kind, classify_exception(exc), time.monotonic() - start, tally=tally)
    return Outcome(kind, outcome, time.monotonic() - start, status, events, tally)


# ---------------------------------------------------------------------------------------------- server side


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


async def metrics(port: int) -> dict[str, float]:
    status, _, body = await asyncio.wait_for(simple_request(port, "GET", "/metrics"), 10)
    if status != 200:
        raise ProtocolError(f"/metrics answered {status}")
    values = {}
    for line in body.decode().splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if m and not m.group(2):
            values[m.group(1)] = float(m.group(3))
    return values


async def wait_health(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before /health answered 200")
        try:
            status, _, _ = await asyncio.wait_for(simple_request(port, "GET", "/health"), 5)
            if status == 200:
                return
        except (OSError, asyncio.TimeoutError, ProtocolError):
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"/health did not answer 200 within {timeout} s")


# The greedy references: a short prompt (below the cache's 64-token grid: never cached) and a question under
# the long system prompt, which resumes from the cached system prompt once the cache holds it.
GREEDY_PROMPTS = {
    "short": [{"role": "user", "content": REFERENCE_PROMPT}],
    "shared_prefix": shared_messages(SHARED_REFERENCE_QUESTION),
}


async def greedy_reply(port: int, messages: list[dict]) -> tuple[dict, int]:
    """The greedy reply to `messages` (what must not change) and its cached prompt tokens (which may)."""
    body = json.dumps({"messages": messages, "max_tokens": 48, "temperature": 0}).encode()
    status, _, reply = await asyncio.wait_for(simple_request(port, "POST", "/v1/chat/completions", body), 120)
    if status != 200:
        raise RuntimeError(f"greedy reference request answered {status}: {reply[:200]!r}")
    doc = json.loads(reply)
    choice = doc["choices"][0]
    msg = choice["message"]
    cached = ((doc.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "content": msg.get("content"),
        "reasoning_content": msg.get("reasoning_content"),
        "tool_calls": msg.get("tool_calls"),
        "finish_reason": choice.get("finish_reason"),
    }, cached


async def greedy_replies(port: int) -> tuple[dict, dict]:
    replies, cached = {}, {}
    for name, messages in GREEDY_PROMPTS.items():
        replies[name], cached[name] = await greedy_reply(port, messages)
    return replies, cached


def idle_and_only_cache(m: dict[str, float]) -> bool:
    """Nothing running or queued, and the pools hold exactly what the prefix cache holds."""
    return (
        m["deltaserve_running_requests"] == 0
        and m["deltaserve_queued_requests"] == 0
        and m["deltaserve_kv_blocks_used"] == m["deltaserve_prefix_cache_kv_blocks"]
        and m["deltaserve_state_slots_used"] == m["deltaserve_prefix_cache_snapshots"]
    )


def all_zero(m: dict[str, float]) -> bool:
    return all(m[g] == 0 for g in POOL_GAUGES + CACHE_GAUGES)


async def drain_pools(port: int, timeout: float, done=all_zero) -> tuple[bool, dict[str, float], float]:
    """Polls /metrics until `done` holds for the pool and cache gauges (or `timeout` passes)."""
    start = time.monotonic()
    last: dict[str, float] = {}
    while time.monotonic() - start < timeout:
        try:
            m = await metrics(port)
            last = {g: m.get(g, float("nan")) for g in POOL_GAUGES + CACHE_GAUGES}
            if done(last):
                return True, last, time.monotonic() - start
        except (OSError, asyncio.TimeoutError, ProtocolError):
            pass
        await asyncio.sleep(0.5)
    return False, last, time.monotonic() - start


async def flush_cache(port: int) -> dict:
    status, _, body = await asyncio.wait_for(simple_request(port, "POST", "/flush_cache", b""), 10)
    doc = json.loads(body) if status == 200 else {}
    return {"status": status, "success": doc.get("success"), "message": doc.get("message")}


async def sample_rss(pid: int, n: int, gap: float) -> list[int]:
    samples = []
    for _ in range(n):
        v = rss_kib(pid)
        if v is not None:
            samples.append(v)
        await asyncio.sleep(gap)
    return samples


# ---------------------------------------------------------------------------------------------- the run


@dataclass
class Mix:
    outcomes: list[Outcome] = field(default_factory=list)
    peak_rss_kib: int = 0
    rss_timeline_kib: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, VmRSS)
    pool_peaks: dict[str, float] = field(default_factory=dict)  # highest value of each gauge seen in /metrics


async def run_mix(port, pid, seconds, concurrency, seed, grace, mix: Mix) -> None:
    kinds = list(KIND_WEIGHTS)
    weights = [KIND_WEIGHTS[k] for k in kinds]
    deadline = time.monotonic() + seconds

    async def worker(i: int):
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            timeout = min(REQUEST_TIMEOUT_S, deadline + grace - time.monotonic())
            mix.outcomes.append(await run_one(kind, port, rng, max(timeout, 1.0)))

    async def sampler():
        t0 = time.monotonic()
        next_mark = 0.0
        while True:
            v = rss_kib(pid)
            if v is not None:
                mix.peak_rss_kib = max(mix.peak_rss_kib, v)
                if time.monotonic() - t0 >= next_mark:
                    mix.rss_timeline_kib.append((round(time.monotonic() - t0, 1), v))
                    next_mark += 10.0
            await asyncio.sleep(0.25)

    async def pool_sampler():  # proves the run really queued and filled the pools
        while True:
            try:
                m = await metrics(port)
                for g in POOL_GAUGES + CACHE_GAUGES + ("deltaserve_http_requests_in_flight",):
                    if g in m:
                        mix.pool_peaks[g] = max(mix.pool_peaks.get(g, 0.0), m[g])
            except (OSError, asyncio.TimeoutError, ProtocolError):
                pass
            await asyncio.sleep(1.0)

    sampler_task = asyncio.ensure_future(sampler())
    pool_task = asyncio.ensure_future(pool_sampler())
    workers = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
    _, pending = await asyncio.wait(workers, timeout=seconds + grace + 5)
    for t in pending:  # run_one records cancelled requests as cut_at_deadline
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    sampler_task.cancel()
    pool_task.cancel()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 4)


def summarize(outcomes: list[Outcome]) -> dict:
    by_kind: dict[str, dict] = {}
    for kind in KIND_WEIGHTS:
        rows = [o for o in outcomes if o.kind == kind]
        classes: dict[str, int] = {}
        statuses: dict[str, int] = {}
        for o in rows:
            classes[o.outcome] = classes.get(o.outcome, 0) + 1
            key = str(o.status) if o.status is not None else "none"
            statuses[key] = statuses.get(key, 0) + 1
        ok_lat = [o.latency_s for o in rows if o.outcome.startswith("ok:")]
        by_kind[kind] = {
            "requests": len(rows),
            "expected": len(ok_lat),
            "unexpected": len(rows) - len(ok_lat),
            "outcomes": dict(sorted(classes.items())),
            "status_codes": dict(sorted(statuses.items())),
            "latency_p50_s": percentile(ok_lat, 0.50),
            "latency_p99_s": percentile(ok_lat, 0.99),
            "stream_chunks_total": sum(o.events for o in rows),
        }
        tallies = [o.tally for o in rows if o.tally is not None and o.tally.turns > 0]
        if kind in ("multiturn", "shared"):
            by_kind[kind]["replies_with_usage"] = sum(t.turns for t in tallies)
            by_kind[kind]["prompt_tokens"] = sum(t.prompt_tokens for t in tallies)
            by_kind[kind]["cached_tokens"] = sum(t.cached_tokens for t in tallies)
            by_kind[kind]["replies_with_cached_tokens"] = sum(t.hits for t in tallies)
    return by_kind


def log_digest(log_path: Path) -> dict:
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    lines = text.splitlines()
    interesting = [
        ln for ln in lines if re.search(r"panic|error|warn|overflow|poison|abort", ln, re.IGNORECASE)
    ]
    return {
        "lines": len(lines),
        "panic_lines": sum("panic" in ln.lower() for ln in lines),
        "error_or_warn_lines": len(interesting),
        "first_error_or_warn_lines": interesting[:10],
    }


async def soak(args) -> int:
    port = args.port or free_port()
    log_path = Path(args.log) if args.log else Path(tempfile.mkstemp(prefix="deltaserve_soak_", suffix=".log")[1])
    cmd = [
        str(args.binary), "serve", "--port", str(port), "--enable-metrics",
        "--max-running-requests", str(args.max_running_requests),
    ]
    if args.disable_radix_cache:
        cmd.append("--disable-radix-cache")
    cmd += args.serve_arg
    log_file = open(log_path, "wb")
    nice = ["nice", "-n", str(args.nice)] if args.nice else []
    proc = subprocess.Popen(nice + cmd, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    summary: dict = {
        "command": " ".join(nice + cmd),
        "server_log": str(log_path),
        "seed": args.seed,
        "prefix_cache": not args.disable_radix_cache,
        "kind_weights": KIND_WEIGHTS,
    }
    t_start = time.monotonic()
    try:
        await wait_health(port, proc, args.startup_timeout)
        summary["startup_s"] = round(time.monotonic() - t_start, 2)
        reference, reference_cached = await greedy_replies(port)
        summary["greedy_reference"] = reference
        summary["greedy_reference_cached_tokens"] = reference_cached

        warm = Mix()
        await run_mix(port, proc.pid, args.warmup, args.concurrency, args.seed + 1, 30, warm)
        await drain_pools(port, POOL_DRAIN_TIMEOUT_S, idle_and_only_cache)
        await asyncio.sleep(2)
        baseline_samples = await sample_rss(proc.pid, 3, 0.5)
        baseline = int(statistics.median(baseline_samples))
        summary["warmup"] = {
            "seconds": args.warmup,
            "requests": len(warm.outcomes),
            "rss_kib": baseline_samples,
            # The KV pool is allocated zeroed and committed on first write (blocks are reused last-freed
            # first), so a soak that reaches further into it than the warm-up did adds RSS without leaking:
            # compare with pool_peaks_during_soak
            "pool_peaks": warm.pool_peaks,
        }

        t_soak = time.monotonic()
        run = Mix(peak_rss_kib=baseline)
        await run_mix(port, proc.pid, args.duration, args.concurrency, args.seed, args.grace, run)
        summary["soak_wall_s"] = round(time.monotonic() - t_soak, 1)
        summary["requests_total"] = len(run.outcomes)
        summary["by_kind"] = summarize(run.outcomes)

        alive = proc.poll() is None
        cache_on = not args.disable_radix_cache
        # With the cache on the pools drain to exactly what the cache holds (and to 0 only after a flush);
        # without it they drain to 0 at once.
        pools_ok, pools, drain_s = (False, {}, 0.0)
        flushed_ok, flushed, flush_s, flush_reply = (False, {}, 0.0, None)
        counters: dict[str, float] = {}
        final_samples: list[int] = []
        greedy_warm = greedy_now = None
        cached_warm = cached_now = None
        if alive:
            pools_ok, pools, drain_s = await drain_pools(
                port, POOL_DRAIN_TIMEOUT_S, idle_and_only_cache if cache_on else all_zero
            )
            m = await metrics(port)
            counters = {c: m.get(c) for c in CACHE_COUNTERS}
            # The greedy replies with whatever the soak left cached, the shared-prefix one once more (now
            # certainly resuming from its cached system prompt), then after the flush (cold).
            greedy_warm, cached_warm = await greedy_replies(port)
            greedy_warm["shared_prefix_again"], cached_warm["shared_prefix_again"] = await greedy_reply(
                port, GREEDY_PROMPTS["shared_prefix"]
            )
            await drain_pools(port, POOL_DRAIN_TIMEOUT_S, idle_and_only_cache)
            flush_reply = await flush_cache(port)
            flushed_ok, flushed, flush_s = await drain_pools(port, POOL_DRAIN_TIMEOUT_S, all_zero)
            await asyncio.sleep(args.settle)
            final_samples = await sample_rss(proc.pid, 5, 1.0)
            greedy_now, cached_now = await greedy_replies(port)
        final = int(statistics.median(final_samples)) if final_samples else None
        five_xx = sum(1 for o in run.outcomes if o.status is not None and o.status >= 500)
        summary["memory_kib"] = {
            "post_warmup": baseline,
            "peak_during_soak": run.peak_rss_kib,
            "final": final,
            "final_samples": final_samples,
            "final_over_post_warmup": round(final / baseline, 4) if final else None,
            "timeline_during_soak": run.rss_timeline_kib,
        }
        summary["pool_peaks_during_soak"] = run.pool_peaks
        summary["pools_after"] = {
            "gauges": pools,
            "drained_in_s": round(drain_s, 2),
            "kv_blocks_used_minus_cached": pools and pools["deltaserve_kv_blocks_used"]
            - pools["deltaserve_prefix_cache_kv_blocks"],
            "state_slots_used_minus_cached": pools and pools["deltaserve_state_slots_used"]
            - pools["deltaserve_prefix_cache_snapshots"],
        }
        summary["cache_counters_after"] = counters
        summary["flush"] = {"reply": flush_reply, "gauges": flushed, "drained_in_s": round(flush_s, 2)}
        summary["greedy_with_soak_cache"] = greedy_warm
        summary["greedy_with_soak_cache_cached_tokens"] = cached_warm
        summary["greedy_after_flush"] = greedy_now
        summary["greedy_after_flush_cached_tokens"] = cached_now
        hits = counters.get("deltaserve_prefix_cache_hits_total") or 0
        summary["verdicts"] = {
            "process_alive": alive,
            # cache on: running = queued = 0, used - cached = 0 in both pools; cache off: all 0, no flush
            "pools_idle_level": pools_ok,
            "pools_zero_after_flush": flushed_ok and bool(flush_reply) and flush_reply["status"] == 200,
            # the soak really went through the cache (hits), or, with it off, never did
            "cache_exercised" if cache_on else "cache_unused": (hits > 0) if cache_on else (hits == 0),
            "memory_within_10pct": final is not None and final <= baseline * (1 + MEMORY_TOLERANCE),
            "greedy_unchanged": greedy_now == reference
            and bool(greedy_warm)
            and all(greedy_warm[k] == reference[k] for k in reference)
            and greedy_warm["shared_prefix_again"] == reference["shared_prefix"],
            # the repeated shared-prefix greedy request did resume from the cache (so the check above
            # compared a cached hit with a cold run), or, with the cache off, did not
            "greedy_hit" if cache_on else "greedy_no_hit": bool(cached_warm)
            and ((cached_warm["shared_prefix_again"] > 0) == cache_on),
            "no_5xx": five_xx == 0,
        }
        summary["five_xx_responses"] = five_xx
        summary["unexpected_outcomes"] = sum(k["unexpected"] for k in summary["by_kind"].values())
    except Exception as exc:  # the summary still goes out, with the failure named
        summary["fatal"] = f"{type(exc).__name__}: {exc}"
        summary.setdefault("verdicts", {})["completed"] = False
    finally:
        summary["exit_code_before_kill"] = proc.poll()
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        log_file.close()
        summary["server_log_digest"] = log_digest(log_path)

    passed = bool(summary.get("verdicts")) and all(summary["verdicts"].values())
    summary["passed"] = passed
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0 if passed else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", type=Path, default=DEFAULT_BINARY, help="deltaserve binary")
    p.add_argument("--port", type=int, default=0, help="server port (0: pick a free one)")
    p.add_argument("--duration", type=float, default=120, help="soak seconds")
    p.add_argument("--warmup", type=float, default=10, help="warm-up seconds of the same mix")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--max-running-requests", type=int, default=16)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--grace", type=float, default=30, help="seconds in-flight requests get past the deadline")
    p.add_argument("--settle", type=float, default=3, help="seconds between drain and the final RSS samples")
    p.add_argument("--startup-timeout", type=float, default=120)
    p.add_argument("--log", help="server log file (default: a temp file)")
    p.add_argument("--json-out", help="also write the JSON summary here")
    p.add_argument(
        "--disable-radix-cache",
        action="store_true",
        help="serve without the prefix cache: the pools must then be empty right after the soak, with no flush",
    )
    p.add_argument("--nice", type=int, default=10, help="run the server under `nice -n N` (0: not at all)")
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        help="one more argument for `serve` (repeatable; a flag as --serve-arg=--page-size --serve-arg=32)",
    )
    args = p.parse_args()
    if not os.access(args.binary, os.X_OK):
        print(f"soak: binary {args.binary} is not executable", file=sys.stderr)
        return 2
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
