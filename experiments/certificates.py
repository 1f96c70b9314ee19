"""Throw-away key material for a Deployment Engine federation on one machine.

* :func:`write_tls_certificates`: a self-signed CA and a server certificate signed by
  it, valid for ``127.0.0.1`` and ``localhost``; the SuperLink serves with the server
  certificate, SuperNodes and the ``flwr`` CLI trust the CA.
* :func:`write_supernode_key_pair`: an ECDSA key pair in OpenSSH format, the format
  ``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register``
  read (Flower accepts NIST curves; P-384 as in Flower's documentation).

The keys are unencrypted and valid for a few days: for tests and local trials, not for
a federation that outlives them.

    .venv/bin/python -m experiments.certificates DIR [--supernodes N]   # DIR/ca.crt … DIR/supernode-K(.pub)
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LOCAL_HOSTS = ("127.0.0.1", "localhost")
VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class TlsFiles:
    """Paths of the PEM files a TLS SuperLink and its clients need."""

    ca_certificate: Path  # ca.crt: the root the SuperNodes and the flwr CLI trust
    server_certificate: Path  # server.pem
    server_key: Path  # server.key


@dataclass(frozen=True)
class KeyPair:
    """Paths of a SuperNode's OpenSSH-format ECDSA key pair."""

    private_key: Path
    public_key: Path


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_tls_certificates(directory: Path, hosts: tuple[str, ...] = LOCAL_HOSTS) -> TlsFiles:
    """Write ``ca.crt``, ``server.pem`` and ``server.key`` into ``directory``.

    The server certificate names every host in ``hosts`` (IP addresses as IP SANs,
    names as DNS SANs): TLS clients check the address they dial against these.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + VALIDITY

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = _name("Basin throw-away CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False,
        ), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    alt_names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt_names.append(x509.DNSName(host))
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0])).issuer_name(ca_name)
        .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    pem = serialization.Encoding.PEM
    return TlsFiles(
        ca_certificate=_write(directory / "ca.crt", ca_cert.public_bytes(pem)),
        server_certificate=_write(directory / "server.pem", server_cert.public_bytes(pem)),
        server_key=_write(directory / "server.key", server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), private=True),
    )


def write_supernode_key_pair(directory: Path, name: str) -> KeyPair:
    """Write ``NAME`` (private) and ``NAME.pub`` (public), OpenSSH ECDSA P-384, into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    ssh = serialization.Encoding.OpenSSH
    return KeyPair(
        private_key=_write(directory / name, key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()), private=True),
        public_key=_write(directory / f"{name}.pub", key.public_key().public_bytes(
            ssh, serialization.PublicFormat.OpenSSH)),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path, help="where to write the files")
    parser.add_argument("--supernodes", type=int, default=0, metavar="N",
                        help="also write key pairs supernode-0 … supernode-<N-1> (for SuperNode authentication)")
    args = parser.parse_args(argv)
    for path in vars(write_tls_certificates(args.directory)).values():
        print(path)
    for k in range(args.supernodes):
        for path in vars(write_supernode_key_pair(args.directory, f"supernode-{k}")).values():
            print(path)


if __name__ == "__main__":
    main()
