"""Certificates and kubeconfigs for the local control plane (EC P-256, via ``cryptography``)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=365)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class PKI:
    """A throw-away CA in ``directory`` that signs serving and client certificates."""

    def __init__(self, directory: Path) -> None:
        """Create a new CA in ``directory`` (use :meth:`load` to open an existing one)."""
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ca_key = _key()
        now = dt.datetime.now(dt.timezone.utc)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ddpjob-local-ca")])
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        _write_key(self.ca_key, self.path("ca.key"))
        _write_cert(self.ca_cert, self.path("ca.crt"))

    @classmethod
    def load(cls, directory: Path) -> PKI:
        """The CA already in ``directory`` (to issue more certificates, or read paths)."""
        pki = cls.__new__(cls)
        pki.dir = directory
        pki.ca_key = serialization.load_pem_private_key(
            (directory / "ca.key").read_bytes(), password=None
        )
        pki.ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        return pki

    def path(self, name: str) -> Path:
        """Return the path of a file in the PKI directory."""
        return self.dir / name

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """Issue ``<name>.crt``/``<name>.key`` signed by the CA; return both paths."""
        key = _key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.timezone.utc)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        crt, keyp = self.path(f"{name}.crt"), self.path(f"{name}.key")
        _write_cert(cert, crt)
        _write_key(key, keyp)
        return crt, keyp

    def service_account_keys(self) -> tuple[Path, Path]:
        """Write the service-account signing key pair; return (private, public) paths."""
        key = _key()
        priv, pub = self.path("sa.key"), self.path("sa.pub")
        _write_key(key, priv)
        pub.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return priv, pub

    def kubeconfig(self, path: Path, server: str, user: str, crt: Path, key: Path) -> Path:
        """Write a kubeconfig for ``user`` authenticating with a client certificate."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "ddpjob-local",
                    "cluster": {
                        "server": server,
                        "certificate-authority": str(self.path("ca.crt")),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate": str(crt), "client-key": str(key)},
                }
            ],
            "contexts": [
                {"name": "ddpjob-local", "context": {"cluster": "ddpjob-local", "user": user}}
            ],
            "current-context": "ddpjob-local",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path
