"""The fakes' test CA for TLS mode, made and used by mitmproxy's certificate store.

The CA is created once, in a per-user temp directory, so every fake in every process shares
one CA file that clients can be told to trust; each start signs a ``localhost`` certificate
with it (mitmproxy's store signs leaves with the CA's own key, as the proxy does).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mitmproxy import certs

BASENAME = "ctrlrun-testing"
KEY_SIZE = 2048
SERVER_NAMES = (
    x509.DNSName("localhost"),
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    x509.IPAddress(ipaddress.ip_address("::1")),
)


@dataclass(frozen=True)
class FakeCA:
    """A directory holding mitmproxy's CA files; ``ca_file`` is what clients trust."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / f"{BASENAME}-ca-cert.pem"

    def server_context(self, host: str | None = None) -> ssl.SSLContext:
        """A server context with a fresh ``localhost`` certificate signed by this CA.

        ``host``, an IP address the fake listens on, is named in the certificate too (a fake
        in a network namespace a test creates is not reached as localhost).
        """
        store = certs.CertStore.from_store(self.directory, BASENAME, KEY_SIZE)
        names = list(SERVER_NAMES)
        with contextlib.suppress(ValueError):  # a name, not an address: localhost covers it
            address = x509.IPAddress(ipaddress.ip_address(host or ""))
            if address not in names:
                names.append(address)
        entry = store.get_cert("localhost", names)
        key = entry.privatekey.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="ctrlrun-cert-") as tmp:  # mode 0700
            cert_file, key_file = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert_file.write_bytes(entry.cert.to_pem())
            key_file.write_bytes(key)
            ctx.load_cert_chain(cert_file, key_file)
        ctx.set_alpn_protocols(["http/1.1"])  # no h2: the fakes speak HTTP/1.1 only
        return ctx


def fake_ca(directory: Path | None = None) -> FakeCA:
    """Return the cached test CA, creating it (atomically, for racing processes) on first use."""
    base = directory or Path(tempfile.gettempdir()) / f"{BASENAME}-ca-{os.getuid()}"
    ca = FakeCA(base)
    if _usable(ca):
        return ca
    staging = Path(tempfile.mkdtemp(prefix=".ctrlrun-ca-", dir=base.parent))  # mode 0700
    try:
        certs.CertStore.create_store(staging, BASENAME, KEY_SIZE)
        if base.exists():  # stale or broken cache: replace it
            shutil.rmtree(base, ignore_errors=True)
        with contextlib.suppress(OSError):  # another process won the race: use its files
            staging.rename(base)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not _usable(ca):
        raise RuntimeError(f"could not create the fakes' test CA in {base}")
    return ca


def _usable(ca: FakeCA) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(ca.ca_file.read_bytes())
        (ca.directory / f"{BASENAME}-ca.pem").stat()  # the key mitmproxy signs with
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
