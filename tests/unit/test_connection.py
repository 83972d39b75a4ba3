"""Temporal connection settings: what TRAJFLOW_* TLS and API-key variables become in the SDK's connect options, which
settings mean a cluster (no dev server), bad files failing before any connection, and the SDK's connection errors
(as the Rust core words them, captured from real failures) explained. No server: see
tests/integration/test_tls_connection.py for the real endpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.service import ConnectConfig, TLSConfig

from tests.integration.tls_helpers import Pki, make_pki
from trajflow.infra.connection import ConnectionSettingsError, connect_options, explain_failure
from trajflow.infra.settings import Settings, load_settings


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def mtls(pki: Pki, **more: object) -> Settings:
    fields: dict[str, object] = {
        "temporal_address": "temporal.example.com:7233",
        "temporal_tls_ca_file": pki.ca,
        "temporal_tls_cert_file": pki.path("client.pem"),
        "temporal_tls_key_file": pki.path("client.key"),
    }
    return Settings(**{**fields, **more})  # type: ignore[arg-type]


def test_the_default_is_plaintext_and_embedded() -> None:
    s = Settings()
    assert connect_options(s).tls is False and connect_options(s).api_key is None
    assert s.temporal_embedded and not s.temporal_tls_enabled


def test_environment_variables_map_to_the_tls_config(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_ADDRESS", "10.0.0.5:7233")
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_NAMESPACE", "research")
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_TLS_CA_FILE", str(pki.ca))
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_TLS_CERT_FILE", str(pki.path("client.pem")))
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_TLS_KEY_FILE", str(pki.path("client.key")))
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_TLS_SERVER_NAME", "localhost")
    s = load_settings()
    tls = connect_options(s).tls
    assert isinstance(tls, TLSConfig)
    assert tls.server_root_ca_cert == pki.ca.read_bytes()
    assert tls.client_cert == pki.path("client.pem").read_bytes()
    assert tls.client_private_key == pki.path("client.key").read_bytes()
    assert tls.domain == "localhost"
    assert s.temporal_namespace == "research" and not s.temporal_embedded


def test_an_api_key_is_sent_by_the_sdk_as_a_bearer_token_over_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_ADDRESS", "us-east-1.aws.api.temporal.io:7233")
    monkeypatch.setenv("TRAJFLOW_TEMPORAL_API_KEY", "tk-secret")
    s = load_settings()
    options = connect_options(s)
    assert options.api_key == "tk-secret"
    assert isinstance(options.tls, TLSConfig) and options.tls.server_root_ca_cert is None  # the system's roots
    # What the SDK hands its Rust core: the key (sent as `authorization: Bearer tk-secret`) on an https target.
    bridge = ConnectConfig(target_host=s.temporal_address, tls=options.tls, api_key=options.api_key)._to_bridge_config()
    assert bridge.api_key == "tk-secret"
    assert bridge.target_url == "https://us-east-1.aws.api.temporal.io:7233" and bridge.tls_config is not None
    assert "tk-secret" not in repr(s) and "tk-secret" not in str(s.model_dump())
    assert not s.temporal_embedded


@pytest.mark.parametrize(
    ("fields", "embedded"),
    [
        ({"temporal_address": "127.0.0.1:7233"}, True),
        ({"temporal_address": "localhost:7233"}, True),
        ({"temporal_address": "127.0.0.5:17233"}, True),
        ({"temporal_address": "[::1]:7233"}, True),
        ({"temporal_address": "10.1.2.3:7233"}, False),
        ({"temporal_address": "temporal.internal:7233"}, False),
        ({"temporal_address": "127.0.0.1:7233", "temporal_tls": True}, False),
        ({"temporal_address": "127.0.0.1:7233", "temporal_api_key": "k"}, False),
        ({"temporal_address": "10.1.2.3:7233", "temporal_dev_server": True}, True),
        ({"temporal_address": "127.0.0.1:7233", "temporal_dev_server": False}, False),
    ],
)
def test_which_settings_mean_a_cluster(fields: dict[str, object], embedded: bool) -> None:
    assert Settings(**fields).temporal_embedded is embedded  # type: ignore[arg-type]


def test_up_starts_no_dev_server_for_a_cluster(tmp_path: Path) -> None:
    from trajflow.contracts.config import load_run_config
    from trajflow.infra.stack import components

    config_path = Path("trajflow/configs/tiny.toml")
    config = load_run_config(config_path)
    embedded = [c.name for c in components(Settings(state_dir=tmp_path), config, config_path)]
    cluster = [c.name for c in components(Settings(state_dir=tmp_path, temporal_tls=True), config, config_path)]
    assert embedded[0] == "temporal" and cluster == embedded[1:]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"temporal_tls_ca_file": "missing.pem"}, "TRAJFLOW_TEMPORAL_TLS_CA_FILE={dir}/missing.pem: no such file"),
        ({"temporal_tls_ca_file": "."}, "TRAJFLOW_TEMPORAL_TLS_CA_FILE={dir}: cannot read it: Is a directory"),
        ({"temporal_tls_ca_file": "client.ext"}, "not a PEM file with a CERTIFICATE"),
        ({"temporal_tls_cert_file": "client.key"}, "TRAJFLOW_TEMPORAL_TLS_CERT_FILE={dir}/client.key: not a PEM file"),
        (
            {"temporal_tls_key_file": None},
            "TRAJFLOW_TEMPORAL_TLS_CERT_FILE is set but TRAJFLOW_TEMPORAL_TLS_KEY_FILE is not",
        ),
        (
            {"temporal_tls_cert_file": None},
            "TRAJFLOW_TEMPORAL_TLS_KEY_FILE is set but TRAJFLOW_TEMPORAL_TLS_CERT_FILE is not",
        ),
        ({"temporal_tls_key_file": "server.key"}, "the key is not this certificate's private key"),
        ({"temporal_api_key": " "}, "TRAJFLOW_TEMPORAL_API_KEY is set but empty"),
    ],
)
def test_bad_tls_settings_fail_before_connecting_naming_file_and_variable(
    pki: Pki, fields: dict[str, str | None], says: str
) -> None:
    paths = {k: (None if v is None else pki.dir / v) if k.endswith("_file") else v for k, v in fields.items()}
    with pytest.raises(ConnectionSettingsError) as info:
        connect_options(mtls(pki, **paths))
    assert says.format(dir=pki.dir) in str(info.value)


# The Rust core's words for real failures (seen against stunnel, a TLS terminator and the plaintext dev server).
WRONG_CA = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { "
    "kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }))"
)
PLAINTEXT = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { "
    "kind: InvalidData, error: InvalidMessage(InvalidContentType) }))"
)
NO_ALPN = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(H2NotNegotiated))"
)
WRONG_NAME = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(Custom { "
    'kind: InvalidData, error: InvalidCertificate(NotValidForNameContext { expected: DnsName("example.com"), '
    'presented: ["IpAddress(127.0.0.1)", "DnsName(\\"localhost\\")"] }) }))'
)
REFUSED = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, ConnectError(ConnectError("
    '"tcp connect error", 127.0.0.1:7233, Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })))'
)
UNAUTHENTICATED = (
    "Failed client connect: `get_system_info` call error after connection: Status { code: Unauthenticated, "
    'message: "Request unauthorized." }'
)


@pytest.mark.parametrize(
    ("sdk_said", "permanent", "says"),
    [
        (
            WRONG_CA,
            True,
            "TLS verification of Temporal at temporal.example.com:7233 failed against the CA in "
            "TRAJFLOW_TEMPORAL_TLS_CA_FILE={dir}/ca.pem",
        ),
        (PLAINTEXT, True, "did not answer in TLS, but TLS is on: it is probably a plaintext server"),
        (NO_ALPN, True, "did not offer HTTP/2 (ALPN `h2`)"),
        (WRONG_NAME, True, "not valid for the name dialled (it names 127.0.0.1, localhost)"),
        (UNAUTHENTICATED, True, "refused the client certificate for namespace 'default'"),
        (REFUSED, False, "nothing accepts connections there"),
    ],
)
async def test_connection_errors_are_explained(pki: Pki, sdk_said: str, permanent: bool, says: str) -> None:
    failure = await explain_failure(mtls(pki), RuntimeError(sdk_said))
    assert failure.permanent is permanent
    assert says.format(dir=pki.dir) in str(failure)
