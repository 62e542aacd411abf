"""Certificates for the mutual-TLS tests, made with ``cryptography``: a certificate authority
and certificates it signs, for 127.0.0.1 and localhost, valid for a day."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertPair:
    """A certificate and its private key (PEM files)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA certificate file and the certificates it signed, by name."""

    ca_file: Path
    pairs: dict[str, CertPair]

    def tls(self, name: str) -> dict[str, str]:
        """The ``tls`` settings of the pair ``name`` (the keys of kahm-dask's ``tls`` section)."""
        return {"ca_file": str(self.ca_file), "cert": str(self.pairs[name].cert), "key": str(self.pairs[name].key)}

    def cli(self, name: str) -> list[str]:
        """The ``--tls-*`` options of ``dask scheduler``/``dask worker`` and of kahm-dask."""
        pair = self.pairs[name]
        return ["--tls-ca-file", str(self.ca_file), "--tls-cert", str(pair.cert), "--tls-key", str(pair.key)]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)))


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_authority(directory: Path, name: str, leaves: tuple[str, ...] = ("server", "client")) -> Authority:
    """A CA ``name`` in ``directory`` (``ca.pem``) and one certificate and key per leaf name
    (``<leaf>.pem``, ``<leaf>-key.pem``) for 127.0.0.1 and localhost, usable by servers and
    clients (Dask's scheduler, workers and clients all are both)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"kahm-dask test CA {name}")
    ca = (_builder(ca_name, ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    _write_cert(ca, directory / "ca.pem")
    loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    alt_names = x509.SubjectAlternativeName([x509.DNSName("localhost"), loopback])
    usages = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    pairs = {}
    for leaf in leaves:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (_builder(_name("127.0.0.1"), ca_name, key.public_key())
                .add_extension(alt_names, critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(usages, critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
                .sign(ca_key, hashes.SHA256()))
        pair = CertPair(directory / f"{leaf}.pem", directory / f"{leaf}-key.pem")
        _write_cert(cert, pair.cert)
        _write_key(key, pair.key)
        pairs[leaf] = pair
    return Authority(directory / "ca.pem", pairs)
