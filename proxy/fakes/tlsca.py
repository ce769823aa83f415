"""A throw-away test CA and a loopback server certificate for the fakes' TLS mode.

Generated with ``cryptography`` at first use and cached in a per-user temp directory, so
every fake in every process shares one CA file that clients can be told to trust.
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
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID_DAYS = 3650


@dataclass(frozen=True)
class FakeCA:
    """Paths of the cached CA certificate and of the server certificate it signed."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        ctx.set_alpn_protocols(["http/1.1"])  # no h2: the fakes speak HTTP/1.1 only
        return ctx


def fake_ca(directory: Path | None = None) -> FakeCA:
    """Return the cached test CA, generating it (atomically) on first use."""
    base = directory or Path(tempfile.gettempdir()) / f"ctrlrun-fakes-ca-{os.getuid()}"
    ca = FakeCA(base / "ca.pem", base / "server.pem", base / "server-key.pem")
    if _usable(ca):
        return ca
    staging = Path(tempfile.mkdtemp(prefix=".ctrlrun-ca-", dir=base.parent))
    try:
        _generate(staging)
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
        cert = x509.load_pem_x509_certificate(ca.cert_file.read_bytes())
        x509.load_pem_x509_certificate(ca.ca_file.read_bytes())
        ca.key_file.stat()
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(days=1)


def _generate(out: Path) -> None:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ctrlrun fakes test CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (
        _builder(name, ca_name, key.public_key(), now)
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (out / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (out / "server.pem").write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    key_path = out / "server-key.pem"
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    # The CA key is not kept: nothing else is ever signed with it.


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
    )


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )
