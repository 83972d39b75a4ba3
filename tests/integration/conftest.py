"""Fixtures of the integration tests beyond tests/conftest.py's: the `vllm serve` of the tiny model, one a session
(it takes 40 s to start on an idle 2-core CPU, and idles between the modules that use it)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, wait_for
from tests.integration.vllm_serve import API_KEY, SERVER_START_S, Server, vllm_python


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    python = vllm_python()
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--api-key", API_KEY,
        "--dtype", "float32", "--logprobs-mode", "processed_logprobs", "--max-model-len", "512",
        "--kv-cache-memory-bytes", str(2**28), "--max-num-seqs", "16", "--enforce-eager", "--seed", "0",
    ]  # fmt: skip
    started = time.monotonic()
    with log_path.open("wb") as log:
        # Its own session: the server's engine-core and worker processes are ended with it, by its group id.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"

    def up() -> bool:
        assert proc.poll() is None, f"vllm serve exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
        try:
            return httpx.get(f"{base_url}/models", headers={"authorization": f"Bearer {API_KEY}"}, timeout=2).is_success
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, SERVER_START_S, interval_s=0.5, what="vllm serve to answer")
        start_s = time.monotonic() - started
        print(f"vllm serve answered after {start_s:.1f} s")
        yield Server(base_url, tiny_model, start_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
