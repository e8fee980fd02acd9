"""`trtspec serve` as a user runs it: the real CLI in its own process, an LLM repository, the OpenAI API beside
Triton, and a stop that is bounded even when Triton does not cooperate."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from trtspec.config import parse_config
from trtspec.repository import generate_repository

pytestmark = pytest.mark.slow

EXIT_TIMEOUT_S = 2
KILL_GRACE_S = 2  # `serve --kill-grace`: what it adds to the exit timeout before it kills Triton (default 10 s)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            out += [child, *_children(child)]
    return out


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (what a killed child of a killed parent stays until PID 1 reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    cfg = parse_config(
        {
            "name": "cli",
            "engine": "reference",
            "device": "cpu",
            "target": {"checkpoint": "demo:target", "dtype": "float32"},
            "speculative": {"draft_source": "ngram", "max_draft_len": 4, "num_draft_tokens": 2},
            "limits": {"max_batch_size": 2, "max_input_len": 256, "max_seq_len": 320},
        }
    )
    return generate_repository(cfg, tmp_path_factory.mktemp("cli") / "model_repository")


def test_serve_serves_the_openai_api_and_stops_within_its_bound_when_triton_hangs(repo: Path) -> None:
    openai_port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtspec.cli", "serve", str(repo), "--http-port", "0", "--grpc-port", "0",
         "--metrics-port", "0", "--openai-port", str(openai_port), "--exit-timeout", str(EXIT_TIMEOUT_S),
         "--kill-grace", str(KILL_GRACE_S)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200"),
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen: list[str] = []

    def read_until(pattern: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not re.search(pattern, "".join(seen)):
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n" + "".join(seen)
            try:
                seen.append(lines.get(timeout=0.2))
            except queue.Empty:
                assert proc.poll() is None, "serve exited:\n" + "".join(seen)

    try:
        read_until(r"Press Ctrl-C", 300)
        assert f"OpenAI   http://127.0.0.1:{openai_port}/v1" in "".join(seen) or f":{openai_port}" in "".join(seen)
        base = f"http://127.0.0.1:{openai_port}/v1"
        models = json.load(urllib.request.urlopen(f"{base}/models", timeout=30))
        name = repo.parent.name  # a repository without a build manifest is named after its folder
        assert {m["id"] for m in models["data"]} == {name, f"{name}-baseline"}
        body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}).encode()
        req = urllib.request.Request(f"{base}/chat/completions", body, {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(req, timeout=120))
        assert answer["choices"][0]["message"]["content"] and answer["usage"]["completion_tokens"] > 0

        # Triton stops answering (frozen): SIGTERM must still end `serve` within exit timeout + kill grace,
        # with exit code 1 and the reason, and leave no model process behind.
        tree = _children(proc.pid)
        (triton,) = [p for p in tree if _name(p) == "tritonserver"]
        os.kill(triton, signal.SIGSTOP)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=EXIT_TIMEOUT_S + KILL_GRACE_S + 30)
        took = time.monotonic() - stopped
        time.sleep(0.5)
        seen += list(iter(lambda: lines.get() if not lines.empty() else None, None))
        output = "".join(seen)
        assert rc == 1, output
        assert took >= EXIT_TIMEOUT_S + KILL_GRACE_S, f"killed before its bound ({took:.1f} s)"
        assert "Traceback" not in output and re.search(r"(?i)kill", output), output
        deadline = time.monotonic() + 10
        while [p for p in tree if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [(p, _name(p)) for p in tree if _alive(p)]
        assert not left, f"processes left behind: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_api_key_from_the_environment_guards_the_openai_api_and_leaves_health_open(repo: Path) -> None:
    """TRTSPEC_API_KEY (two keys: a rotation) as the Kubernetes manifests set it from a Secret; the official
    openai client gets a 401 without a right key and its answer with one."""
    import urllib.error

    import openai

    openai_port, health_port = _free_port(), _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtspec.cli", "serve", str(repo), "--http-port", "0", "--grpc-port", "0",
         "--metrics-port", "0", "--openai-port", str(openai_port), "--health-port", str(health_port),
         "--exit-timeout", str(EXIT_TIMEOUT_S), "--kill-grace", str(KILL_GRACE_S)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", TRTSPEC_API_KEY="old-key new-key"),
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while "Press Ctrl-C" not in "".join(seen):
            assert time.monotonic() < deadline and proc.poll() is None, "serve did not get ready:\n" + "".join(seen)
            try:
                seen.append(lines.get(timeout=0.2))
            except queue.Empty:
                pass
        assert "API key required" in "".join(seen)
        base = f"http://127.0.0.1:{openai_port}/v1"
        name = repo.parent.name
        chat = {"model": name, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}

        # no Authorization header at all: OpenAI's own 401
        req = urllib.request.Request(f"{base}/chat/completions", json.dumps(chat).encode(),
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(req, timeout=30)
        assert no_key.value.code == 401 and no_key.value.headers["WWW-Authenticate"] == "Bearer"
        error = json.loads(no_key.value.read())["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert "Authorization: Bearer" in error["message"]

        wrong = openai.OpenAI(base_url=base, api_key="not-the-key", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as denied:
            wrong.chat.completions.create(**chat)
        assert denied.value.status_code == 401 and "not-the-key" not in str(denied.value)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()

        for key in ("new-key", "old-key"):
            client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)
            answer = client.chat.completions.with_raw_response.create(**chat)
            assert answer.http_response.status_code == 200
            assert answer.parse().usage.completion_tokens > 0
        streamed = list(client.completions.create(model=name, prompt="Hello", max_tokens=3, stream=True))
        assert "".join(c.choices[0].text for c in streamed if c.choices)

        # probes need no key: the OpenAI port's /health and serve's health port, as vLLM leaves /health open
        assert urllib.request.urlopen(f"http://127.0.0.1:{openai_port}/health", timeout=30).status == 200
        assert urllib.request.urlopen(f"http://127.0.0.1:{health_port}/health/ready", timeout=30).status == 200
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=EXIT_TIMEOUT_S + KILL_GRACE_S + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
