"""TLS to the databases: the CA a Secret carries (key `ca`, PEM), checked before any connection,
and handed to each driver the way it takes it (libpq and psqlODBC read a file; the Cassandra
driver an SSL context).

A Secret with `ca` verifies the server by default: the certificate must chain to that CA and name
the host dbq connects to (libpq's `sslmode=verify-full`). A user who says otherwise in the url
(`sslmode=require`, or `disable` for a plain connection) is followed. Cassandra takes the same
`sslmode` option: `verify-full`, `verify-ca` and `require` encrypt (without `ca`, against the
url's `sslrootcert` file, as libpq, or else the system's trusted CAs); no mode and no `ca`,
`disable`, `allow` and `prefer` connect plain.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import os
import ssl
import tempfile
from pathlib import Path

from dbq.errors import InvalidConnection

CA_KEY = "ca"  # the Secret key that holds the CA's certificate(s), PEM
VERIFY = "verify-full"


def check_ca(pem: str, where: str = f"Secret key {CA_KEY!r}") -> str:
    """`pem` when it holds at least one certificate valid now; else InvalidConnection naming
    `where` and the fix. (Needs `cryptography`: the kube and operator extras bring it; a client
    given a url never calls this.)"""
    try:
        from cryptography import x509
    except ImportError:
        raise InvalidConnection(
            f"{where}: checking a CA needs the `cryptography` package: install dbq-operator[kube]"
        ) from None
    try:
        certs = x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        raise InvalidConnection(
            f"{where} is not a PEM certificate: put the CA's certificate there"
            " (-----BEGIN CERTIFICATE----- ...)"
        ) from None
    now = datetime.datetime.now(datetime.UTC)
    for cert in certs:
        subject = cert.subject.rfc4514_string()
        if cert.not_valid_after_utc < now:
            raise InvalidConnection(
                f"{where}: certificate {subject!r} expired on {cert.not_valid_after_utc:%Y-%m-%d}:"
                " put the CA's current certificate there"
            )
        if cert.not_valid_before_utc > now:
            raise InvalidConnection(
                f"{where}: certificate {subject!r} is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M}"
                " UTC: check the clocks, or put the CA's current certificate there"
            )
    return pem


def ca_file(pem: str) -> str:
    """The path of a file holding `pem` (libpq and psqlODBC read the CA from a file): written
    once per content in a directory only this user may open."""
    return str(_ca_file(pem))


@functools.cache
def _ca_file(pem: str) -> Path:
    folder = Path(tempfile.gettempdir()) / f"dbq-ca-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.getuid() or folder.stat().st_mode & 0o077:
        raise InvalidConnection(f"{folder} is not this user's alone: remove it, dbq makes it again")
    path = folder / f"{hashlib.sha256(pem.encode()).hexdigest()[:32]}.pem"
    if not path.exists():
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as partial:
            partial.write(pem)
        os.replace(partial.name, path)  # whole or absent, whoever writes it at the same time
    return path


def sslmode(ca: str, options: dict[str, str]) -> str | None:
    """The url's `sslmode` (any case); verify-full when it names none and a CA is given."""
    named = next((v for k, v in options.items() if k.lower() == "sslmode"), None)
    return named or (VERIFY if ca else None)


def libpq_tls(ca: str, options: dict[str, str]) -> dict[str, str]:
    """The libpq parameters for a Secret's CA: its file as `sslrootcert`, and `sslmode`
    verify-full unless the url names a mode. None without a CA (the url's own options stand)."""
    if not ca:
        return {}
    return {"sslmode": sslmode(ca, options) or VERIFY, "sslrootcert": ca_file(ca)}


def ssl_context(ca: str, options: dict[str, str]) -> ssl.SSLContext | None:
    """The Cassandra driver's SSL context for these settings (the module's docstring), or None
    for a plain connection. With check_hostname on, the driver names each node by its address."""
    mode = sslmode(ca, options)
    if mode in (None, "disable", "allow", "prefer"):
        return None
    if mode not in ("require", "verify-ca", VERIFY):
        raise InvalidConnection(
            f"sslmode {mode!r} is not one dbq knows: use verify-full (the default with `ca`), verify-ca,"
            " require or disable"
        )
    root = None if ca else next((v for k, v in options.items() if k.lower() == "sslrootcert"), None)
    try:
        context = ssl.create_default_context(cadata=ca or None, cafile=root)
    except OSError as e:
        raise InvalidConnection(
            f"sslrootcert {root!r} in the url cannot be read ({e}): name a PEM file that is there"
        ) from None
    context.check_hostname = mode == VERIFY
    if mode == "require":
        context.verify_mode = ssl.CERT_NONE
    return context


# What a driver says when TLS stops a connection (libpq; Python's ssl under the Cassandra driver),
# and what to do about it; the first cue found wins.
_HOST = (
    "the server's certificate does not name the host dbq connects to: connect by a name the"
    " certificate has, or give the server a certificate for this name"
)
_PLAIN = "the server does not offer TLS: turn it on there, or say sslmode=disable in the url for a plain connection"
_REFUSALS = (
    (
        "root certificate file",
        "the server is to be verified but no CA was given: put the CA's"
        f" certificate in the Secret's {CA_KEY!r} key (or sslrootcert=FILE in the url)",
    ),
    ("does not match host name", _HOST),
    ("mismatch, certificate is not valid for", _HOST),
    (
        "certificate verify failed",
        f"the server's certificate does not chain to the CA in {CA_KEY!r}, or"
        " has expired: put the CA that signed it there, or renew the server's certificate",
    ),
    ("server does not support SSL", _PLAIN),
    ("WRONG_VERSION_NUMBER", _PLAIN),
)


def refusal(text: str) -> str | None:
    """For a driver's message about a connection TLS stopped: the reason and the fix, else None."""
    return next(
        (f"TLS refused the connection: {fix} ({text[:300]})" for cue, fix in _REFUSALS if cue in text), None
    )
