"""The stack's own certificate authority, and a certificate for each server it runs (PostgreSQL,
Cassandra) naming 127.0.0.1, localhost and the local cluster's node address: made at the first
start, made again when they near their end (or name other hosts). The CA's certificate is what a Secret's `ca` key holds (`dbq.connection.tls`)."""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dbq.devstack.base import NODE_IP, Paths

CA_DAYS = 3650
SERVER_DAYS = 365
RENEW_DAYS = 30  # a certificate that ends sooner is made again
# Where clients reach the servers: loopback (the three-node Cassandra on 127.0.0.2-4), and the
# single-node cluster's node address (its pods).
IPS = ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", NODE_IP)
DNS_NAMES = ("localhost",)


class StackTls:
    def __init__(self, paths: Paths) -> None:
        self.dir = paths.state / "tls"
        self.ca_cert = self.dir / "ca.pem"
        self.ca_key = self.dir / "ca-key.pem"

    def ca_pem(self) -> str:
        """The CA's certificate (PEM), made first if need be."""
        self.server("postgres")  # makes the CA too
        return self.ca_cert.read_text()

    def server(self, name: str) -> tuple[Path, Path]:
        """`name`'s certificate (chained to the CA) and private key, made or renewed as needed."""
        self.dir.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = self.dir / f"{name}.pem", self.dir / f"{name}-key.pem"
        with open(self.dir / "tls.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # test workers start servers at once
            fresh_ca = not _lasting(self.ca_cert)
            if fresh_ca:
                key = _new_key(self.ca_key)
                name_ = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dbq local stack CA")])
                cert = (
                    _builder(name_, name_, key, CA_DAYS)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                    .add_extension(_usage(ca=True), critical=True)
                    .sign(key, hashes.SHA256())
                )
                self.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            if fresh_ca or not _lasting(cert_path, _names()):
                ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
                assert isinstance(ca_key, rsa.RSAPrivateKey)
                ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
                key = _new_key(key_path)
                subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"dbq local {name}")])
                cert = (
                    _builder(subject, ca.subject, key, SERVER_DAYS)
                    .add_extension(x509.SubjectAlternativeName(_names()), critical=False)
                    .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                    .add_extension(_usage(ca=False), critical=True)
                    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                    .sign(ca_key, hashes.SHA256())
                )
                cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, key_path

    def keystore(self, name: str) -> tuple[Path, str]:
        """`name`'s key and certificate chain as a PKCS12 keystore (what Java servers read), and
        its password (made once, kept beside it)."""
        cert_path, key_path = self.server(name)
        store, password_file = self.dir / f"{name}.p12", self.dir / f"{name}.p12.password"
        if not password_file.exists():
            password_file.touch(mode=0o600)
            password_file.write_text(secrets.token_hex(16))
        password = password_file.read_text()
        if not store.exists() or store.stat().st_mtime < cert_path.stat().st_mtime:
            key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            assert isinstance(key, rsa.RSAPrivateKey)
            chain = x509.load_pem_x509_certificates(cert_path.read_bytes() + self.ca_cert.read_bytes())
            store.touch(mode=0o600)
            store.write_bytes(
                pkcs12.serialize_key_and_certificates(
                    name.encode(),
                    key,
                    chain[0],
                    chain[1:],
                    serialization.BestAvailableEncryption(password.encode()),
                )
            )
        return store, password


def _names() -> list[x509.GeneralName]:
    return [
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in IPS),
        *(x509.DNSName(name) for name in DNS_NAMES),
    ]


def _lasting(cert_path: Path, names: list[x509.GeneralName] | None = None) -> bool:
    """Whether the certificate exists, lasts past RENEW_DAYS and names at least `names`."""
    if not cert_path.exists():
        return False
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    if names:
        held = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        if not set(names) <= set(held):
            return False
    return left > datetime.timedelta(days=RENEW_DAYS)


def _new_key(path: Path) -> rsa.RSAPrivateKey:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return key


def _builder(
    subject: x509.Name, issuer: x509.Name, key: rsa.RSAPrivateKey, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca, content_commitment=False, key_encipherment=not ca, data_encipherment=False,
        key_agreement=False, key_cert_sign=ca, crl_sign=ca, encipher_only=False, decipher_only=False,
    )  # fmt: skip
