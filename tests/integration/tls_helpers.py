"""TLS endpoints for the connection tests: a throwaway PKI made with the `openssl` CLI, and TLS terminators on
loopback in front of a plaintext Temporal frontend.

Two terminators, because Debian's stunnel cannot carry gRPC for the Temporal SDK: stunnel 5.68 has no ALPN option
(its binary imports none of OpenSSL's ALPN functions), and the SDK's Rust core (tonic) refuses a TLS connection on
which the server did not select ALPN `h2` ("H2NotNegotiated"). So a worker and a trajectory run through
`alpn_terminator` (this module run as a program: OpenSSL through Python's `ssl`, mutual TLS, ALPN `h2`, bytes
relayed as they are), and stunnel serves the tests of what a client is told when its TLS settings are wrong.

Not a production proxy: one connection per upstream connection, no timeouts, no logging.
"""

from __future__ import annotations

import argparse
import socket
import ssl
import subprocess
import sys
import threading
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
        _openssl("req", "-x509", *NEW_KEY, "-nodes", "-days", "2", "-subj", f"/CN=trajflow test {ca}",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=directory)
    leaves = {
        "server": ("/CN=localhost", "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
                   "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
        "client": ("/CN=trajflow test client", "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n"),
    }
    for name, (subject, extensions) in leaves.items():
        (directory / f"{name}.ext").write_text(extensions)
        _openssl("req", *NEW_KEY, "-nodes", "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory)
    return Pki(directory)


def stunnel_config(pki: Pki, accept_port: int, upstream: str, log: Path) -> str:
    """stunnel in front of `upstream`, requiring a client certificate signed by the CA (`verify = 2`)."""
    return "\n".join([
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
        "",
    ])


def alpn_terminator_argv(pki: Pki, upstream: str) -> list[str]:
    """The command line of the ALPN-capable terminator; it prints `listening PORT` once it accepts connections."""
    return [sys.executable, "-m", "tests.integration.tls_helpers", "--upstream", upstream,
            "--cert", str(pki.path("server.pem")), "--key", str(pki.path("server.key")), "--ca", str(pki.ca)]


def _relay(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass  # the other side went away (ssl.SSLError is an OSError); shutting down below ends the pair
    finally:
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(upstream: str, cert: str, key: str, ca: str) -> None:
    """Blocking sockets and a thread per direction: OpenSSL then writes its alerts (e.g. "certificate required")
    straight to the socket before closing, as stunnel does; asyncio's TLS transport aborts without sending them."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    host, _, port = upstream.rpartition(":")

    def handle(conn: socket.socket) -> None:
        try:
            tls = context.wrap_socket(conn, server_side=True)
        except OSError:
            conn.close()
            return
        try:
            up = socket.create_connection((host, int(port)))
        except OSError:
            tls.close()
            return
        threading.Thread(target=_relay, args=(up, tls), daemon=True).start()
        _relay(tls, up)

    listener = socket.create_server(("127.0.0.1", 0))
    print(f"listening {listener.getsockname()[1]}", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description="A mutual-TLS terminator with ALPN h2, for tests only.")
    parser.add_argument("--upstream", required=True, help="host:port of the plaintext server")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ca", required=True, help="CA that client certificates must be signed by")
    args = parser.parse_args()
    _serve(args.upstream, args.cert, args.key, args.ca)


if __name__ == "__main__":
    main()
