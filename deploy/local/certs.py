"""A throwaway certificate authority for a secure local cluster (``millpond up --secure``)
and for the tests: a CA, one certificate per identity, PEM files on disk.

Not for production: keys are unencrypted files and nothing revokes a certificate. A real
deployment brings certificates from its own CA (see ``deploy/multihost/``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVICE_IDENTITY = "millpond-service"
"""The common name of the services' certificate (the default ``MILLPOND_SERVICE_IDENTITIES``)."""
VALID_FOR = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as PEM files, with the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


class LocalCa:
    """A CA whose key lives in ``directory`` (created on first use, reused after)."""

    def __init__(self, directory: Path, name: str = "Millpond local CA"):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cert_file = self.directory / "ca.pem"
        key_file = self.directory / "ca-key.pem"
        if self.cert_file.exists() and key_file.exists():
            self.key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
            self.cert = x509.load_pem_x509_certificate(self.cert_file.read_bytes())
            return
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        _write(key_file, _key_pem(self.key))
        _write(self.cert_file, self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, file_stem: str | None = None,
              hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Issued:
        """A certificate for ``common_name``, valid as a server for ``hosts`` and as a client;
        written to ``<file_stem>.pem`` and ``<file_stem>-key.pem`` (replacing older ones)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALID_FOR)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256())  # type: ignore[arg-type]
        )
        stem = file_stem or common_name
        cert_file, key_file = self.directory / f"{stem}.pem", self.directory / f"{stem}-key.pem"
        _write(key_file, _key_pem(key))
        _write(cert_file, cert.public_bytes(serialization.Encoding.PEM))
        return Issued(cert_file, key_file, self.cert_file)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes) -> None:
    """Replace ``path`` in one rename, so a reader never sees half a file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    temporary.chmod(0o600)
    temporary.replace(path)
