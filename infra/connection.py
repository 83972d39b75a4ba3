"""How a client reaches Temporal: TLS and the API key from settings as `Client.connect` options, and what a failed
connection means.

`connect_options` reads and checks the TLS files before anything is sent: a missing, unreadable or non-PEM file, a
certificate without its key, or a key that is not the certificate's fails at once with `ConnectionSettingsError`
naming the file and its `TRAJFLOW_*` variable. `explain_failure` turns the SDK's connection error into a
`TemporalConnectionError` that says what is probably wrong, and whether retrying can help (`permanent`): a server
certificate that the configured CA did not sign, a server that does not speak TLS while TLS is on (or the reverse),
a client certificate the server rejected, a TLS endpoint that does not offer HTTP/2 (ALPN `h2`, which gRPC needs),
refused credentials. Nothing listening, a reset while the server restarts, and whatever it cannot classify are not
permanent: `trajflow.infra.temporal.wait_until_reachable` retries those until its deadline.

Limits: the files are read when a client connects, so a rotated certificate takes effect on the next connection,
not on a live client. The two probes (`_speaks_tls`, `_rejected_client_cert`) use Python's `ssl` on a second
connection, only after a connection failed in a way the SDK's message leaves open; an endpoint that answers the
probe differently from the SDK's own connection (a load balancer routing by SNI) is reported as not permanent.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from trajflow.infra.settings import Settings

PROBE_TIMEOUT_S = 3.0


class ConnectionSettingsError(ValueError):
    """TLS or API-key settings that cannot work; raised before anything is sent to the server."""


class TemporalConnectionError(RuntimeError):
    """A connection to Temporal failed; the message says what is probably wrong. `permanent`: retrying the same
    settings cannot help (fix the settings or the server)."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def variable(field: str) -> str:
    """The environment variable of a settings field."""
    return f"TRAJFLOW_{field.upper()}"


@dataclass(frozen=True)
class ConnectOptions:
    """What `Client.connect` gets besides the address and namespace."""

    tls: TLSConfig | bool
    api_key: str | None


def connect_options(settings: Settings) -> ConnectOptions:
    """The TLS config and API key of these settings; raises ConnectionSettingsError for files that cannot work."""
    api_key = settings.temporal_api_key.get_secret_value() if settings.temporal_api_key else None
    if api_key is not None and not api_key.strip():
        raise ConnectionSettingsError(f"{variable('temporal_api_key')} is set but empty: unset it or give the key")
    if not settings.temporal_tls_enabled:
        return ConnectOptions(tls=False, api_key=None)
    ca = _read_pem(settings.temporal_tls_ca_file, "temporal_tls_ca_file", "CERTIFICATE")
    cert_path, key_path = settings.temporal_tls_cert_file, settings.temporal_tls_key_file
    if (cert_path is None) != (key_path is None):
        given, missing = ("cert", "key") if key_path is None else ("key", "cert")
        raise ConnectionSettingsError(
            f"{variable(f'temporal_tls_{given}_file')} is set but {variable(f'temporal_tls_{missing}_file')} is not: "
            "mutual TLS needs both the client certificate and its private key"
        )
    cert = _read_pem(cert_path, "temporal_tls_cert_file", "CERTIFICATE")
    key = _read_pem(key_path, "temporal_tls_key_file", "PRIVATE KEY")
    if ca is not None:
        _check_ca(settings)
    if cert is not None:
        _check_cert_and_key(settings)
    tls = TLSConfig(
        server_root_ca_cert=ca, client_cert=cert, client_private_key=key, domain=settings.temporal_tls_server_name
    )
    return ConnectOptions(tls=tls, api_key=api_key)


def _read_pem(path: Path | None, field: str, kind: str) -> bytes | None:
    if path is None:
        return None
    where = f"{variable(field)}={path}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConnectionSettingsError(f"{where}: no such file") from None
    except OSError as e:
        raise ConnectionSettingsError(f"{where}: cannot read it: {e.strerror or e}") from None
    if not re.search(rb"-----BEGIN [A-Z ]*" + kind.encode() + rb"-----", data):
        raise ConnectionSettingsError(f"{where}: not a PEM file with a {kind} (no '-----BEGIN ...{kind}-----' line)")
    return data


def _check_ca(settings: Settings) -> None:
    try:
        ssl.create_default_context(cafile=str(settings.temporal_tls_ca_file))
    except ssl.SSLError as e:
        raise ConnectionSettingsError(
            f"{variable('temporal_tls_ca_file')}={settings.temporal_tls_ca_file}: not a CA certificate OpenSSL can "
            "load: "
            f"{e.reason or e}"
        ) from None


def _check_cert_and_key(settings: Settings) -> None:
    cert, key = settings.temporal_tls_cert_file, settings.temporal_tls_key_file
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(str(cert), str(key), password=b"")
    except ssl.SSLError as e:
        reason = e.reason or str(e)
        if "KEY_VALUES_MISMATCH" in reason:
            what = "the key is not this certificate's private key"
        elif "BAD_DECRYPT" in reason or "PASSWORD" in reason.upper():
            what = "the key is encrypted; give an unencrypted key (the SDK cannot take a passphrase)"
        else:
            what = f"OpenSSL cannot load them: {reason}"
        raise ConnectionSettingsError(
            f"{variable('temporal_tls_cert_file')}={cert} and {variable('temporal_tls_key_file')}={key}: {what}"
        ) from None


async def explain_failure(settings: Settings, error: BaseException) -> TemporalConnectionError:
    """What a failed connect or first call means, in words a user can act on."""
    address = settings.temporal_address
    text = str(error)
    if isinstance(error, RPCError) and error.status in (RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.PERMISSION_DENIED):
        return _refused_credentials(settings, error.message)
    if re.search(r"code: (Unauthenticated|PermissionDenied)", text):
        return _refused_credentials(settings, text)
    if settings.temporal_tls_enabled:
        found = _tls_failure(settings, text)
        if found is not None:
            return found
    if "Connection refused" in text or "ConnectionRefused" in text:
        return TemporalConnectionError(
            f"Temporal at {address}: nothing accepts connections there ({text})", permanent=False
        )
    host, port = _host_port(address)
    if not settings.temporal_tls_enabled:
        if await asyncio.to_thread(_speaks_tls, host, port, settings.temporal_tls_server_name):
            return TemporalConnectionError(
                f"Temporal at {address} speaks TLS, but TLS is off: set {variable('temporal_tls_ca_file')} to the CA "
                f"that signed its certificate (or {variable('temporal_tls')}=true for a publicly signed one), and "
                f"{variable('temporal_tls_cert_file')}/{variable('temporal_tls_key_file')} if it requires a client "
                f"certificate. The SDK said: {text}",
                permanent=True,
            )
    else:
        alert = await asyncio.to_thread(_rejected_client_cert, settings, host, port)
        if alert is not None:
            return _rejected(settings, alert, text)
    return TemporalConnectionError(f"Temporal at {address} not reachable: {text}", permanent=False)


def _tls_failure(settings: Settings, text: str) -> TemporalConnectionError | None:
    """The failures the SDK's TLS layer names itself."""
    address = settings.temporal_address
    ca = settings.temporal_tls_ca_file
    against = f"the CA in {variable('temporal_tls_ca_file')}={ca}" if ca else "the system's root CAs"
    if "UnknownIssuer" in text or "BadSignature" in text:
        hint = (
            "the server's certificate was not signed by it: give the CA that signed the server's certificate"
            if ca
            else f"set {variable('temporal_tls_ca_file')} to the CA that signed the server's certificate"
        )
        return TemporalConnectionError(
            f"TLS verification of Temporal at {address} failed against {against}: {hint}. The SDK said: {text}",
            permanent=True,
        )
    if "NotValidForName" in text:
        presented = re.findall(r'(?:DnsName|IpAddress)\(\\?"?([^")\\]+)', text.split("presented", 1)[-1])
        return TemporalConnectionError(
            f"TLS verification of Temporal at {address} failed: the server's certificate is not valid for the name "
            f"dialled (it names {', '.join(presented) or 'other hosts'}); connect by one of those names or set "
            f"{variable('temporal_tls_server_name')} to one. The SDK said: {text}",
            permanent=True,
        )
    if "InvalidCertificate" in text:
        return TemporalConnectionError(
            f"TLS verification of Temporal at {address} failed against {against}: {text}", permanent=True
        )
    if "InvalidContentType" in text or "InvalidMessage" in text or "CorruptMessage" in text:
        return TemporalConnectionError(
            f"Temporal at {address} did not answer in TLS, but TLS is on: it is probably a plaintext server (the dev "
            f"server is one). Unset {variable('temporal_tls')}, the {variable('temporal_tls')}_* files and "
            f"{variable('temporal_api_key')}, or point {variable('temporal_address')} at its TLS endpoint. The SDK "
            f"said: {text}",
            permanent=True,
        )
    if "H2NotNegotiated" in text:
        return TemporalConnectionError(
            f"Temporal at {address} completed the TLS handshake but did not offer HTTP/2 (ALPN `h2`), which gRPC "
            "clients require: the TLS terminator in front of Temporal must negotiate ALPN h2 (stunnel cannot; "
            "Temporal's own TLS, Envoy or nginx's grpc_pass can)",
            permanent=True,
        )
    proxied = re.search(r"while receiving response with status: (4\d\d)", text)
    if proxied is not None:
        return TemporalConnectionError(
            f"Temporal at {address}: the proxy in front of it answered HTTP {proxied.group(1)} instead of gRPC. nginx "
            f"answers 400 to a missing or rejected client certificate: check {variable('temporal_tls_cert_file')} and "
            f"{variable('temporal_tls_key_file')} (a certificate signed by a CA the proxy trusts). The SDK said: "
            f"{text}",
            permanent=True,
        )
    alert = re.search(r"received fatal alert: (\w+)", text)
    if alert is not None and alert.group(1) in (
        "CertificateRequired",
        "UnknownCA",
        "BadCertificate",
        "CertificateUnknown",
        "CertificateExpired",
        "AccessDenied",
    ):
        return _rejected(settings, f"TLS alert {alert.group(1)}", text)
    if "PrivateKeyParseError" in text or "InvalidPrivateKey" in text:
        return TemporalConnectionError(
            f"the SDK cannot use {variable('temporal_tls_key_file')}={settings.temporal_tls_key_file}: {text}",
            permanent=True,
        )
    return None


def _refused_credentials(settings: Settings, detail: str) -> TemporalConnectionError:
    used = [
        v
        for v, on in (
            ("the API key", settings.temporal_api_key),
            ("the client certificate", settings.temporal_tls_cert_file),
        )
        if on
    ]
    return TemporalConnectionError(
        f"Temporal at {settings.temporal_address} refused {' and '.join(used) or 'the call (no credentials given)'} "
        f"for namespace {settings.temporal_namespace!r}: check {variable('temporal_api_key')}, the certificate files "
        f"and {variable('temporal_namespace')}. The server said: {detail}",
        permanent=True,
    )


def _rejected(settings: Settings, alert: str, text: str) -> TemporalConnectionError:
    cert = settings.temporal_tls_cert_file
    if cert is None:
        hint = (
            f"it requires a client certificate: set {variable('temporal_tls_cert_file')} and "
            f"{variable('temporal_tls_key_file')}"
        )
    else:
        hint = f"it does not accept {variable('temporal_tls_cert_file')}={cert}: give one signed by a CA it trusts"
    return TemporalConnectionError(
        f"Temporal at {settings.temporal_address} rejected this client's TLS certificate ({alert}): {hint}. "
        f"The SDK said: {text}",
        permanent=True,
    )


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _speaks_tls(host: str, port: int, server_name: str | None) -> bool:
    """Whether the endpoint answers a TLS ClientHello with TLS (a handshake, or a TLS alert such as "certificate
    required"); False for a plaintext server, a refused connection or silence."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as raw:
            with context.wrap_socket(raw, server_hostname=server_name or host):
                return True
    except ssl.SSLError as e:
        return "ALERT" in (e.reason or "")
    except OSError:
        return False


def _rejected_client_cert(settings: Settings, host: str, port: int) -> str | None:
    """The TLS alert with which the endpoint rejects this client's certificate (or its absence), if it does. In TLS
    1.3 the server judges the client's certificate after the handshake, so the alert comes on the first read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the server was already verified, or failed for another reason
    context.set_alpn_protocols(["h2"])
    if settings.temporal_tls_cert_file and settings.temporal_tls_key_file:
        context.load_cert_chain(str(settings.temporal_tls_cert_file), str(settings.temporal_tls_key_file))
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as raw:
            with context.wrap_socket(raw, server_hostname=settings.temporal_tls_server_name or host) as tls:
                tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # the HTTP/2 preface: an accepted client gets frames
                tls.recv(1)
    except ssl.SSLError as e:
        reason = e.reason or ""
        return reason.lower().replace("_", " ") if "ALERT" in reason else None
    except OSError:
        return None
    return None
