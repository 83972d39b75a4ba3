"""TLS endpoints for the connection tests: a throwaway PKI made with the `openssl` CLI, and TLS terminators on
loopback in front of a plaintext Temporal frontend.

Two terminators, because Debian's stunnel cannot carry gRPC for the Temporal SDK: stunnel 5.68 has no ALPN option
(its binary imports none of OpenSSL's ALPN functions), and the SDK's Rust core (tonic) refuses a TLS connection on
which the server did not select ALPN `h2` ("H2NotNegotiated"). So a worker and a trajectory run through nginx
(Debian's `nginx-light`: HTTP/2, `grpc_pass`, mutual TLS — what a real deployment puts in front of Temporal), and
stunnel serves the tests of what a client is told when its TLS settings are wrong (it answers a bad certificate
with a TLS alert, where nginx completes the handshake and answers HTTP 400).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate it signed for 127.0.0.1/localhost, a client certificate it signed, and a second CA
    that signed nothing here (the wrong CA)."""

    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def other_ca(self) -> Path:
        return self.dir / "other-ca.pem"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr}")


NEW_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")
"""ECDSA P-256 keys: made in milliseconds (RSA-2048 takes a noticeable fraction of a second each)."""


def make_pki(directory: Path) -> Pki:
    """Keys and certificates with the `openssl` CLI. rustls (the SDK's TLS) needs X.509 v3 throughout: a v1 leaf is
    rejected as `UnsupportedCertVersion`, so every leaf gets an extensions file."""
    directory.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl(
            "req",
            "-x509",
            *NEW_KEY,
            "-nodes",
            "-days",
            "2",
            "-subj",
            f"/CN=trajflow test {ca}",
            "-keyout",
            f"{ca}.key",
            "-out",
            f"{ca}.pem",
            cwd=directory,
        )
    leaves = {
        "server": (
            "/CN=localhost",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n",
        ),
        "client": ("/CN=trajflow test client", "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"),
    }
    for name, (subject, extensions) in leaves.items():
        (directory / f"{name}.ext").write_text(extensions)
        _openssl(
            "req", *NEW_KEY, "-nodes", "-subj", subject, "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.pem",
            cwd=directory,
        )
    return Pki(directory)


def stunnel_config(pki: Pki, accept_port: int, upstream: str, log: Path) -> str:
    """stunnel in front of `upstream`, requiring a client certificate signed by the CA (`verify = 2`)."""
    return "\n".join(
        [
            "foreground = yes",
            "pid =",
            f"output = {log}",
            "[temporal]",
            f"accept = 127.0.0.1:{accept_port}",
            f"connect = {upstream}",
            f"cert = {pki.path('server.pem')}",
            f"key = {pki.path('server.key')}",
            f"CAfile = {pki.ca}",
            "verify = 2",
            # TLS 1.2: a rejected client certificate then ends the handshake itself with an alert (in TLS 1.3 the
            # client finishes first and sees the missing ALPN h2 before the alert).
            "sslVersionMax = TLSv1.2",
            "",
        ]
    )


def nginx_config(pki: Pki, accept_port: int, upstream: str, prefix: Path) -> str:
    """nginx proxying gRPC to `upstream` behind mutual TLS (a client certificate signed by the CA required). The
    timeouts outlast Temporal's long polls (about 70 s), which nginx's 60 s defaults would cut."""
    return f"""
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{}}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    server {{
        listen 127.0.0.1:{accept_port} ssl http2;
        ssl_certificate {pki.path("server.pem")};
        ssl_certificate_key {pki.path("server.key")};
        ssl_client_certificate {pki.ca};
        ssl_verify_client on;
        location / {{
            grpc_pass grpc://{upstream};
            grpc_read_timeout 300s;
            grpc_send_timeout 300s;
        }}
    }}
}}
"""
