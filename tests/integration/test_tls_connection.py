"""Cluster-ready connections against real TLS endpoints on loopback, in front of the session's dev server: the whole
stack (`trajflow up`: reward service and every pool's worker, and no dev server of its own) and a trajectory through
mutual TLS through nginx; and what a client is told when its TLS settings are wrong, against stunnel.

Why two endpoints: see tests/integration/tls_helpers.py (stunnel 5.68 cannot negotiate ALPN h2, which the SDK needs).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CliStack, free_port, stack_state_dir, wait_for
from tests.integration.tls_helpers import Pki, make_pki, nginx_config, stunnel_config
from trajflow.infra.connection import TemporalConnectionError
from trajflow.infra.settings import Settings
from trajflow.infra.temporal import wait_until_reachable

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def frontend(temporal_env) -> str:
    """host:port of the session dev server's plaintext gRPC frontend."""
    return temporal_env.client.service_client.config.target_host


def _listening(proc: subprocess.Popen[bytes], port: int, what: str) -> None:
    def accepts() -> bool:
        assert proc.poll() is None, f"{what} exited {proc.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for(accepts, 30, what=f"{what} to listen")


@pytest.fixture(scope="module")
def tls_endpoint(pki: Pki, frontend: str) -> Iterator[str]:
    """nginx: mutual TLS, HTTP/2 (ALPN h2) and gRPC proxied to the dev server."""
    exe = shutil.which("nginx")
    if exe is None:
        pytest.fail("nginx is not installed: apt-get install nginx-light (scripts/bootstrap.sh --test installs it)")
    port = free_port()
    prefix = pki.path("nginx")
    prefix.mkdir(exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(nginx_config(pki, port, frontend, prefix))
    proc = subprocess.Popen([exe, "-c", str(conf), "-e", str(prefix / "error.log")], stderr=subprocess.DEVNULL)
    try:
        _listening(proc, port, f"nginx (log {prefix / 'error.log'})")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def stunnel_endpoint(pki: Pki, frontend: str) -> Iterator[str]:
    """stunnel with `verify = 2` (a client certificate signed by the CA required) in front of the dev server."""
    exe = shutil.which("stunnel4") or shutil.which("stunnel")
    if exe is None:
        pytest.fail("stunnel is not installed: apt-get install stunnel4 (scripts/bootstrap.sh --test installs it)")
    port = free_port()
    conf = pki.path("stunnel.conf")
    conf.write_text(stunnel_config(pki, port, frontend, pki.path("stunnel.log")))
    proc = subprocess.Popen([exe, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _listening(proc, port, f"stunnel (log {pki.path('stunnel.log')})")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def tls_env(pki: Pki, address: str, **override: str) -> dict[str, str]:
    return {
        "TRAJFLOW_TEMPORAL_ADDRESS": address,
        "TRAJFLOW_TEMPORAL_TLS_CA_FILE": str(pki.ca),
        "TRAJFLOW_TEMPORAL_TLS_CERT_FILE": str(pki.path("client.pem")),
        "TRAJFLOW_TEMPORAL_TLS_KEY_FILE": str(pki.path("client.key")),
        **override,
    }


def settings(pki: Pki, address: str, **override: object) -> Settings:
    fields: dict[str, object] = {
        "temporal_address": address,
        "temporal_tls_ca_file": pki.ca,
        "temporal_tls_cert_file": pki.path("client.pem"),
        "temporal_tls_key_file": pki.path("client.key"),
    }
    return Settings(**{**fields, **override})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tls_stack(pki: Pki, tls_endpoint: str, cache_dir: Path) -> Iterator[tuple[CliStack, str]]:
    """`trajflow up` with the tiny config whose every process reaches Temporal only through mutual TLS; with what
    `up` said."""
    state_dir = stack_state_dir(cache_dir, "tf-tls-")
    env = {
        **os.environ,
        **tls_env(pki, tls_endpoint),
        "TRAJFLOW_STATE_DIR": str(state_dir),
        "TRAJFLOW_REWARD_PORT": str(free_port()),
        "TRAJFLOW_PROMETHEUS_PORT": str(free_port()),
    }
    stack = CliStack(env=env, state_dir=state_dir, ui_url="", config=ROOT / "trajflow" / "configs" / "tiny.toml")
    try:
        yield stack, stack.trajflow("up", "-c", str(stack.config)).stderr
    finally:
        stack.trajflow("down", check=False)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_the_stack_and_a_trajectory_run_through_mutual_tls(tls_stack: tuple[CliStack, str], tls_endpoint: str) -> None:
    stack, said = tls_stack
    assert f"temporal: using the cluster at {tls_endpoint} (namespace default, TLS on)" in said
    assert "no dev server started" in said
    table = json.loads((stack.state_dir / "run" / "processes.json").read_text())
    started = {rec["name"] for rec in table}
    assert "temporal" not in started and {"orchestrator", "decode", "env", "reward", "trainer"} <= started

    rollout = stack.trajflow(
        "rollout",
        "-c",
        str(stack.config),
        "--env",
        "game:GuessTheNumber-v0-easy",
        "--seed",
        "3",
        "--max-turns",
        "2",
        "--json",
    )
    result = json.loads(rollout.stdout)
    assert result["status"] == "completed", result
    assert 1 <= result["turns"] <= 2 and result["reward"] is not None

    status = stack.trajflow("status", "-c", str(stack.config))
    assert f"cluster {tls_endpoint}" in status.stdout
    pollers = {
        line.split()[1]: int(line.split()[-1]) for line in status.stdout.splitlines() if line.startswith("queue ")
    }
    assert pollers and all(n >= 1 for n in pollers.values()), status.stdout


async def test_a_wrong_ca_fails_at_once_saying_tls_verification_failed(pki: Pki, stunnel_endpoint: str) -> None:
    wrong = settings(pki, stunnel_endpoint, temporal_tls_ca_file=pki.other_ca)
    with pytest.raises(TemporalConnectionError) as info:
        await wait_until_reachable(wrong, timeout_s=60)  # a TimeoutError would mean it retried to the deadline
    assert info.value.permanent
    assert str(info.value).startswith(
        f"TLS verification of Temporal at {stunnel_endpoint} failed against the CA in "
        f"TRAJFLOW_TEMPORAL_TLS_CA_FILE={pki.other_ca}: the server's certificate was not signed by it"
    )


def test_a_worker_with_a_wrong_ca_exits_with_the_reason(pki: Pki, tls_endpoint: str) -> None:
    env = {**os.environ, **tls_env(pki, tls_endpoint, TRAJFLOW_TEMPORAL_TLS_CA_FILE=str(pki.other_ca))}
    proc = subprocess.run(
        [sys.executable, "-m", "trajflow", "worker", "orchestrator"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "trajflow worker: cannot connect to Temporal: TLS verification of Temporal at" in proc.stderr
    assert f"TRAJFLOW_TEMPORAL_TLS_CA_FILE={pki.other_ca}" in proc.stderr
    assert "Traceback" not in proc.stderr


async def test_tls_against_a_plaintext_server_and_the_reverse_say_so(
    pki: Pki, frontend: str, stunnel_endpoint: str
) -> None:
    with pytest.raises(TemporalConnectionError) as tls_on:
        await wait_until_reachable(settings(pki, frontend), timeout_s=60)
    assert tls_on.value.permanent
    assert "did not answer in TLS, but TLS is on: it is probably a plaintext server" in str(tls_on.value)

    with pytest.raises(TemporalConnectionError) as tls_off:
        await wait_until_reachable(Settings(temporal_address=stunnel_endpoint), timeout_s=60)
    assert tls_off.value.permanent
    assert f"Temporal at {stunnel_endpoint} speaks TLS, but TLS is off" in str(tls_off.value)


async def test_a_missing_or_foreign_client_certificate_is_named(pki: Pki, stunnel_endpoint: str) -> None:
    """Against stunnel, which refuses a bad client certificate in the handshake with a TLS alert (nginx would finish
    the handshake and answer HTTP 400)."""
    no_cert = settings(pki, stunnel_endpoint, temporal_tls_cert_file=None, temporal_tls_key_file=None)
    with pytest.raises(TemporalConnectionError) as missing:
        await wait_until_reachable(no_cert, timeout_s=60)
    assert "rejected this client's TLS certificate" in str(missing.value)
    assert "it requires a client certificate: set TRAJFLOW_TEMPORAL_TLS_CERT_FILE" in str(missing.value)

    foreign = settings(
        pki, stunnel_endpoint, temporal_tls_cert_file=pki.other_ca, temporal_tls_key_file=pki.path("other-ca.key")
    )
    with pytest.raises(TemporalConnectionError) as rejected:
        await wait_until_reachable(foreign, timeout_s=60)
    assert f"it does not accept TRAJFLOW_TEMPORAL_TLS_CERT_FILE={pki.other_ca}" in str(rejected.value)


async def test_a_proxy_refusing_the_client_certificate_says_check_it(pki: Pki, tls_endpoint: str) -> None:
    """nginx finishes the handshake without a client certificate and answers HTTP 400, not gRPC."""
    no_cert = settings(pki, tls_endpoint, temporal_tls_cert_file=None, temporal_tls_key_file=None)
    with pytest.raises(TemporalConnectionError) as info:
        await wait_until_reachable(no_cert, timeout_s=60)
    assert info.value.permanent
    assert f"Temporal at {tls_endpoint}: the proxy in front of it answered HTTP 400 instead of gRPC" in str(info.value)


async def test_an_api_key_and_a_server_name_go_through_tls(pki: Pki, tls_endpoint: str) -> None:
    """The dev server ignores the key; this shows the key, a custom CA, a client certificate and an SNI name work
    together on one connection (what a secured self-hosted cluster with an auth plugin would take)."""
    port = tls_endpoint.rpartition(":")[2]
    client = await wait_until_reachable(
        settings(pki, tls_endpoint, temporal_api_key="tk-test", temporal_tls_server_name="localhost"), timeout_s=60
    )
    assert client.api_key == "tk-test"
    by_name = await wait_until_reachable(settings(pki, f"localhost:{port}"), timeout_s=60)
    assert by_name.namespace == "default"


async def test_stunnel_is_named_as_lacking_alpn_h2(pki: Pki, stunnel_endpoint: str) -> None:
    """The right CA and client certificate through stunnel: the handshake passes, and the SDK refuses the connection
    for want of ALPN h2. If a later stunnel negotiates h2, this fails: then run the stack through stunnel instead."""
    with pytest.raises(TemporalConnectionError) as info:
        await wait_until_reachable(settings(pki, stunnel_endpoint), timeout_s=60)
    assert info.value.permanent
    assert "completed the TLS handshake but did not offer HTTP/2 (ALPN `h2`)" in str(info.value)
