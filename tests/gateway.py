#!/usr/bin/env python3
"""deltaserve behind SGLang Model Gateway (`sglang-router`, pinned in scripts/requirements-gateway.txt),
on 127.0.0.1 only: two `deltaserve serve` demo workers and the gateway in front of them.

    python3 -m venv /tmp/gw && /tmp/gw/bin/pip install -r scripts/requirements-gateway.txt
    /tmp/gw/bin/python tests/gateway.py --deltaserve target/debug/deltaserve

Checks, in order:
  1. the gateway registers both workers under the served model name (it read /server_info and
     /model_info) and gets a load figure from each (/get_load), and /flush_cache fans out;
  2. `deltaserve smoke` passes through the gateway; `bench serve` at concurrency 16 and single chat
     requests through it succeed, and both workers serve some of each;
  3. worker A is SIGKILLed while streams and whole (non-streamed) requests run through the gateway:
     what each saw is printed, and every stream on B must complete; once the gateway has marked A
     unhealthy, every new request succeeds on B. (Seen with 0.3.2: a stream on A ends without an
     error event or [DONE], since the gateway cannot retry a stream once bytes went out; a whole
     request on A is retried by the gateway on B and completes.)
  4. A is restarted on its port: the gateway marks it healthy and sends it requests again;
  5. A is SIGTERMed (as in a rolling update) while streams run: every stream completes, requests
     sent meanwhile succeed, A exits 0.

Every wait is bounded; exits 1 naming the first check that failed. Needs only the standard library
and the gateway package in the running interpreter's environment.
"""

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HOST = "127.0.0.1"
PROMPT = "What is 2+2? Answer briefly."


class CheckFailed(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def call(port, method, path, body=None, timeout=60.0):
    """(status, body text); raises OSError when the connection fails."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {} if body is None else {"content-type": "application/json"}
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def wait_until(what, condition, timeout, process=None, log=None):
    """Polls `condition` every 0.25 s for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise CheckFailed(f"{what}: the process exited ({process.returncode})\n{tail(log)}")
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.25)
    raise CheckFailed(f"{what}: not within {timeout:.0f} s\n{tail(log)}")


def tail(path, lines=30):
    if path is None or not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-lines:])


class Worker:
    def __init__(self, name, binary, port, logdir):
        self.name, self.binary, self.port = name, binary, port
        self.url = f"http://{HOST}:{port}"
        self.log = os.path.join(logdir, f"worker-{name}.log")
        self.process = None

    def start(self, timeout):
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                # A grace period far above what the streams need, so a slow machine cannot cut them.
                [self.binary, "serve", "--host", HOST, "--port", str(self.port), "--enable-metrics",
                 "--shutdown-grace-period", "120"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(
            f"worker {self.name} /health",
            lambda: call(self.port, "GET", "/health", timeout=5)[0] == 200,
            timeout,
            self.process,
            self.log,
        )

    def chat_requests_served(self):
        status, text = call(self.port, "GET", "/metrics", timeout=10)
        expect(status == 200, f"worker {self.name} /metrics: {status}")
        pattern = r'^deltaserve_http_requests_total\{route="/v1/chat/completions",status="200"\} (\d+)'
        return sum(int(n) for n in re.findall(pattern, text, re.MULTILINE))

    def kill(self, sig):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


class Gateway:
    def __init__(self, python, port, workers, logdir):
        self.port = port
        self.log = os.path.join(logdir, "gateway.log")
        command = [
            python, "-m", "sglang_router.launch_router",
            "--host", HOST, "--port", str(port),
            "--worker-urls", *[w.url for w in workers],
            # Round robin makes "both workers got traffic" certain; the load and model figures the
            # load-based policies use are checked through /get_loads and /workers.
            "--policy", "round_robin",
            "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
            "--health-check-interval-secs", "1",
            "--health-failure-threshold", "1",
            "--health-success-threshold", "1",
            "--health-check-timeout-secs", "2",
            "--worker-startup-timeout-secs", "60",
            "--log-level", "info",
        ]
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def workers(self):
        status, text = call(self.port, "GET", "/workers", timeout=10)
        expect(status == 200, f"gateway /workers: {status} {text}")
        return {w["url"]: w for w in json.loads(text)["workers"]}

    def healthy(self, worker):
        entry = self.workers().get(worker.url)
        return entry is not None and entry.get("is_healthy") is True

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def chat(port, content=PROMPT, max_tokens=200, timeout=60.0):
    status, text = call(
        port,
        "POST",
        "/v1/chat/completions",
        {"model": "demo", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens},
        timeout=timeout,
    )
    expect(status == 200, f"chat through the gateway: {status} {text[:300]}")
    answer = json.loads(text)["choices"][0]["message"]["content"]
    expect("4" in answer, f"chat through the gateway answered {answer!r}")


class Whole(threading.Thread):
    """A non-streamed chat through the gateway; `outcome` says how it ended."""

    def __init__(self, port, max_tokens):
        super().__init__(daemon=True)
        self.port, self.max_tokens = port, max_tokens
        self.outcome = "still running"

    def run(self):
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": "Count to one hundred."}],
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
        }
        try:
            status, text = call(self.port, "POST", "/v1/chat/completions", body, timeout=90)
            if status == 200:
                tokens = json.loads(text)["usage"]["completion_tokens"]
                self.outcome = f"completed ({tokens} tokens)"
            else:
                self.outcome = f"HTTP {status}: {text[:200]}"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.outcome = f"{type(exc).__name__}: {exc}"


class Stream(threading.Thread):
    """A streamed chat through the gateway; `outcome` says how it ended."""

    def __init__(self, port, max_tokens):
        super().__init__(daemon=True)
        self.port, self.max_tokens = port, max_tokens
        self.chunks = 0
        self.started = threading.Event()
        self.outcome = "still running"

    def run(self):
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": "Count to one hundred."}],
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        conn = http.client.HTTPConnection(HOST, self.port, timeout=60)
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                self.outcome = f"HTTP {response.status}: {response.read()[:200]!r}"
                return
            for raw in response:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    self.outcome = f"completed ({self.chunks} chunks)"
                    return
                event = json.loads(data)
                if "error" in event:
                    self.outcome = f"error event after {self.chunks} chunks: {event['error'].get('message')}"
                    return
                self.chunks += 1
                self.started.set()
            self.outcome = f"stream ended without [DONE] after {self.chunks} chunks"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.outcome = f"{type(exc).__name__} after {self.chunks} chunks: {exc}"
        finally:
            self.started.set()
            conn.close()


def run(args, logdir):
    a = Worker("A", args.deltaserve, free_port(), logdir)
    b = Worker("B", args.deltaserve, free_port(), logdir)
    gateway = None
    try:
        a.start(args.startup_timeout)
        b.start(args.startup_timeout)
        gateway = Gateway(sys.executable, free_port(), [a, b], logdir)
        wait_until(
            "the gateway marks both workers healthy",
            lambda: gateway.healthy(a) and gateway.healthy(b),
            args.startup_timeout,
            gateway.process,
            gateway.log,
        )

        # 1. What the gateway learnt from the workers.
        for url, entry in gateway.workers().items():
            expect(entry.get("model_id") == "demo", f"gateway model id of {url}: {entry.get('model_id')!r}")
            metadata = entry.get("metadata", {})
            expect(metadata.get("model_type") == "qwen3_5", f"gateway metadata of {url}: {metadata}")
        status, text = call(gateway.port, "GET", "/get_loads", timeout=10)
        expect(status == 200, f"gateway /get_loads: {status} {text}")
        loads = {w["worker"]: w["load"] for w in json.loads(text)["workers"]}
        expect(all(loads.get(w.url, -1) >= 0 for w in (a, b)), f"gateway /get_loads (-1 = unknown): {loads}")
        status, text = call(gateway.port, "POST", "/flush_cache", timeout=10)
        expect(status == 200 and json.loads(text).get("workers_flushed") == 2, f"gateway /flush_cache: {text}")
        print(f"ok   gateway registered both workers as model 'demo', loads {loads}, flush reached both")

        # 2. The smoke suite through the gateway, then traffic reaches both workers.
        smoke = subprocess.run(
            [args.deltaserve, "smoke", "--url", f"http://{HOST}:{gateway.port}"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        expect(smoke.returncode == 0, f"smoke through the gateway:\n{smoke.stdout}{smoke.stderr}")
        print("ok   `deltaserve smoke` passes through the gateway")

        # `bench serve` at concurrency 16 through the gateway: every request succeeds, both serve.
        before = {w.name: w.chat_requests_served() for w in (a, b)}
        bench = subprocess.run(
            [args.deltaserve, "bench", "serve", "--url", f"http://{HOST}:{gateway.port}", "--endpoint", "chat",
             "--concurrency", "16", "--num-prompts", "32", "--input-len", "32", "--output-len", "32",
             "--request-timeout", "120"],
            capture_output=True,
            text=True,
            timeout=300,
        )  # fmt: skip
        expect(bench.returncode == 0, f"bench serve through the gateway:\n{bench.stdout}{bench.stderr}")
        spread = {w.name: w.chat_requests_served() - before[w.name] for w in (a, b)}
        expect(sum(spread.values()) == 32 and min(spread.values()) > 0, f"bench serve requests per worker: {spread}")
        print(f"ok   bench serve at concurrency 16 through the gateway: 32 requests, per worker {spread}")
        before = {w.name: w.chat_requests_served() for w in (a, b)}
        for _ in range(args.requests):
            chat(gateway.port)
        served = {w.name: w.chat_requests_served() - before[w.name] for w in (a, b)}
        expect(all(n > 0 for n in served.values()), f"chat requests served per worker: {served}")
        print(f"ok   {args.requests} chats through the gateway, served per worker: {served}")

        # 3. SIGKILL A while streams and whole requests run on both workers.
        on_a_before = a.chat_requests_served()
        streams = [Stream(gateway.port, args.stream_tokens) for _ in range(args.streams)]
        for s in streams:
            s.start()
        for s in streams:
            expect(s.started.wait(60), "a stream through the gateway produced nothing within 60 s")
        # A stream is counted when its response head goes out, so all of them are by now.
        streams_on_a = a.chat_requests_served() - on_a_before
        # A whole response is counted only when it is done, so these cannot be attributed to a
        # worker; what they saw is reported, not checked.
        wholes = [Whole(gateway.port, args.stream_tokens) for _ in range(2)]
        for w in wholes:
            w.start()

        def in_flight_everywhere():
            running = sum(json.loads(call(x.port, "GET", "/get_load", timeout=5)[1])[0]["num_reqs"] for x in (a, b))
            finished_streams = sum(not s.is_alive() for s in streams)
            return running + finished_streams >= len(streams) + len(wholes)

        wait_until("the whole requests reach the workers", in_flight_everywhere, 30)
        a.kill(signal.SIGKILL)
        for t in streams + wholes:
            t.join(90)
        expect(all(not t.is_alive() for t in streams + wholes), "a request still hangs 90 s after the kill")
        print(f"info in flight when worker A was SIGKILLed ({streams_on_a} of the {len(streams)} streams on A):")
        for i, t in enumerate(streams + wholes):
            print(f"info   {'stream' if isinstance(t, Stream) else 'whole '} {i}: {t.outcome}")
        completed = sum(s.outcome.startswith("completed") for s in streams)
        expect(
            completed == len(streams) - streams_on_a,
            f"{completed} streams completed; every stream on B should have, none on A could",
        )
        wait_until(
            "the gateway marks the killed worker unhealthy",
            lambda: not gateway.healthy(a),
            30,
            gateway.process,
            gateway.log,
        )
        before = b.chat_requests_served()
        for _ in range(args.requests):
            chat(gateway.port)
        expect(b.chat_requests_served() - before == args.requests, "new requests after the kill did not all go to B")
        print(f"ok   A killed: the gateway marked it unhealthy, {args.requests} new chats all succeeded on B")

        # 4. Restart A: the gateway takes it back.
        a.start(args.startup_timeout)
        wait_until(
            "the gateway marks the restarted worker healthy",
            lambda: gateway.healthy(a),
            30,
            gateway.process,
            gateway.log,
        )
        for _ in range(args.requests):
            chat(gateway.port)
        on_a = a.chat_requests_served()
        expect(on_a > 0, "the restarted worker got no requests")
        print(f"ok   A restarted: the gateway marked it healthy and sent it {on_a} of {args.requests} chats")

        # 5. SIGTERM A (a rolling update) while streams run: A drains its streams within the grace
        # period and exits 0; requests sent meanwhile go to B.
        streams = [Stream(gateway.port, args.stream_tokens) for _ in range(args.streams)]
        for s in streams:
            s.start()
        for s in streams:
            expect(s.started.wait(60), "a stream through the gateway produced nothing within 60 s")
        a.process.send_signal(signal.SIGTERM)
        for _ in range(args.requests):
            chat(gateway.port)
        for s in streams:
            s.join(150)
        outcomes = [s.outcome for s in streams]
        expect(all(o.startswith("completed") for o in outcomes), f"streams across A's SIGTERM: {outcomes}")
        expect(a.process.wait(timeout=150) == 0, f"A exited {a.process.returncode} after SIGTERM")
        print(f"ok   A SIGTERMed: all {len(streams)} streams completed, {args.requests} chats sent meanwhile succeeded, A exited 0")
    finally:
        if gateway is not None:
            gateway.stop()
        for w in (a, b):
            w.kill(signal.SIGTERM)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deltaserve", default="target/debug/deltaserve", help="the deltaserve binary")
    parser.add_argument("--requests", type=int, default=6, help="chats per round")
    parser.add_argument("--streams", type=int, default=4, help="streams in flight at the kill")
    parser.add_argument("--stream-tokens", type=int, default=1000, help="max_tokens of each stream")
    parser.add_argument("--startup-timeout", type=float, default=120.0)
    parser.add_argument("--keep-logs", metavar="DIR", help="write the logs here instead of a temporary directory")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="deltaserve-gateway-") as scratch:
        logdir = scratch
        if args.keep_logs:
            os.makedirs(args.keep_logs, exist_ok=True)
            logdir = args.keep_logs
        try:
            run(args, logdir)
        except (CheckFailed, subprocess.TimeoutExpired) as failure:
            print(f"FAIL {failure}")
            for name in ("gateway.log", "worker-A.log", "worker-B.log"):
                print(f"--- {name} (tail)\n{tail(os.path.join(logdir, name))}")
            return 1
    print(f"gateway test passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
