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
Afterwards it checks: the process is alive; /metrics drains to running = queued = kv_blocks_used =
state_slots_used = 0 (within 30 s); VmRSS is within 10 % of its post-warm-up level; the greedy reply equals
the reference; no 5xx was answered. Prints a JSON summary and exits 1 when a check fails. The server is always
killed at the end. Standard library only (asyncio raw TCP streams, HTTP/1.1, Connection: close).

Usage:
  python3 scripts/soak.py                                   # 120 s, concurrency 64, binary target/release/deltaserve
  python3 scripts/soak.py --duration 20 --json-out /tmp/soak.json --log /tmp/soak_server.log
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

KIND_WEIGHTS = {"normal": 25, "stream": 25, "cancel": 15, "malformed": 10, "oversized": 5, "slow": 20}
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


async def do_normal(port, rng) -> tuple[str, int | None, int]:
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


async def do_stream(port, rng):
    return await stream_until(port, rng, None, slow=False)


async def do_cancel(port, rng):
    return await stream_until(port, rng, rng.randint(1, 4), slow=False)


async def do_slow(port, rng):
    return await stream_until(port, rng, None, slow=True)


async def do_malformed(port, rng):
    body = rng.choice(MALFORMED_BODIES)
    path = rng.choice(["/v1/chat/completions", "/v1/completions"])
    status, _, _ = await simple_request(port, "POST", path, body)
    return ("ok:400" if status == 400 else f"http_{status}"), status, 0


async def do_oversized(port, rng):
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


KIND_FUNCS = {
    "normal": do_normal,
    "stream": do_stream,
    "cancel": do_cancel,
    "malformed": do_malformed,
    "oversized": do_oversized,
    "slow": do_slow,
}


async def run_one(kind: str, port: int, rng: random.Random, timeout: float) -> Outcome:
    start = time.monotonic()
    try:
        outcome, status, events = await asyncio.wait_for(KIND_FUNCS[kind](port, rng), timeout)
    except asyncio.CancelledError:
        return Outcome(kind, "cut_at_deadline", time.monotonic() - start)
    except Exception as exc:  # every failure is classified and counted, never raised
        return Outcome(kind, classify_exception(exc), time.monotonic() - start)
    return Outcome(kind, outcome, time.monotonic() - start, status, events)


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


async def greedy_reply(port: int) -> dict:
    body = json.dumps(
        {"messages": [{"role": "user", "content": REFERENCE_PROMPT}], "max_tokens": 48, "temperature": 0}
    ).encode()
    status, _, reply = await asyncio.wait_for(simple_request(port, "POST", "/v1/chat/completions", body), 120)
    if status != 200:
        raise RuntimeError(f"greedy reference request answered {status}: {reply[:200]!r}")
    choice = json.loads(reply)["choices"][0]
    msg = choice["message"]
    return {
        "content": msg.get("content"),
        "reasoning_content": msg.get("reasoning_content"),
        "tool_calls": msg.get("tool_calls"),
        "finish_reason": choice.get("finish_reason"),
    }


async def drain_pools(port: int, timeout: float) -> tuple[bool, dict[str, float], float]:
    start = time.monotonic()
    last: dict[str, float] = {}
    while time.monotonic() - start < timeout:
        try:
            m = await metrics(port)
            last = {g: m.get(g, float("nan")) for g in POOL_GAUGES}
            if all(v == 0 for v in last.values()):
                return True, last, time.monotonic() - start
        except (OSError, asyncio.TimeoutError, ProtocolError):
            pass
        await asyncio.sleep(0.5)
    return False, last, time.monotonic() - start


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
                for g in POOL_GAUGES + ("deltaserve_http_requests_in_flight",):
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
    log_file = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    summary: dict = {"command": " ".join(cmd), "server_log": str(log_path), "seed": args.seed}
    t_start = time.monotonic()
    try:
        await wait_health(port, proc, args.startup_timeout)
        summary["startup_s"] = round(time.monotonic() - t_start, 2)
        reference = await greedy_reply(port)
        summary["greedy_reference"] = reference

        warm = Mix()
        await run_mix(port, proc.pid, args.warmup, args.concurrency, args.seed + 1, 30, warm)
        await drain_pools(port, POOL_DRAIN_TIMEOUT_S)
        await asyncio.sleep(2)
        baseline_samples = await sample_rss(proc.pid, 3, 0.5)
        baseline = int(statistics.median(baseline_samples))
        summary["warmup"] = {"seconds": args.warmup, "requests": len(warm.outcomes), "rss_kib": baseline_samples}

        t_soak = time.monotonic()
        run = Mix(peak_rss_kib=baseline)
        await run_mix(port, proc.pid, args.duration, args.concurrency, args.seed, args.grace, run)
        summary["soak_wall_s"] = round(time.monotonic() - t_soak, 1)
        summary["requests_total"] = len(run.outcomes)
        summary["by_kind"] = summarize(run.outcomes)

        alive = proc.poll() is None
        pools_ok, pools, drain_s = (False, {}, 0.0)
        final_samples: list[int] = []
        greedy_now = None
        if alive:
            pools_ok, pools, drain_s = await drain_pools(port, POOL_DRAIN_TIMEOUT_S)
            await asyncio.sleep(args.settle)
            final_samples = await sample_rss(proc.pid, 5, 1.0)
            greedy_now = await greedy_reply(port)
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
        summary["pools_after"] = {"gauges": pools, "drained_in_s": round(drain_s, 2)}
        summary["greedy_after"] = greedy_now
        summary["verdicts"] = {
            "process_alive": alive,
            "pools_empty": pools_ok,
            "memory_within_10pct": final is not None and final <= baseline * (1 + MEMORY_TOLERANCE),
            "greedy_unchanged": greedy_now == reference,
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
    args = p.parse_args()
    if not os.access(args.binary, os.X_OK):
        print(f"soak: binary {args.binary} is not executable", file=sys.stderr)
        return 2
    return asyncio.run(soak(args))


if __name__ == "__main__":
    sys.exit(main())
