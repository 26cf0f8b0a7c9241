"""Certificates and keys for the local control plane, made with the openssl command line.

One CA signs the API server's serving certificate and the client certificates (admin is in
`system:masters`); a separate key pair signs service-account tokens. EC P-256 keys, because
they take milliseconds where RSA takes a second on this machine.
"""

import subprocess
from dataclasses import dataclass
from pathlib import Path

# The first address of the service range: what `kubernetes.default` resolves to in a real pod.
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"

API_SERVER_SANS = (
    "IP:127.0.0.1",
    f"IP:{KUBERNETES_SERVICE_IP}",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def sa_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.folder / "sa.pub"

    def cert(self, name: str) -> Path:
        return self.folder / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.folder / f"{name}.key"


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"cluster: openssl {args[0]} failed: {result.stderr.strip()}")


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    path.chmod(0o600)


def _issue(pki: Pki, name: str, subject: str, extensions: str) -> None:
    _new_key(pki.key(name))
    csr = pki.folder / f"{name}.csr"
    ext = pki.folder / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-key", str(pki.key(name)), "-subj", subject, "-out", str(csr))
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(pki.ca_cert), "-CAkey", str(pki.ca_key),
        "-CAcreateserial", "-days", "3650", "-sha256", "-extfile", str(ext), "-out", str(pki.cert(name)),
    )  # fmt: skip
    csr.unlink()
    ext.unlink()


def create(folder: Path) -> Pki:
    """A fresh CA, the serving and client certificates, and the token signing key pair."""
    folder.mkdir(parents=True, exist_ok=True)
    pki = Pki(folder)
    _new_key(pki.ca_key)
    _openssl(
        "req", "-x509", "-new", "-key", str(pki.ca_key), "-subj", "/CN=finetune-local-ca", "-days", "3650",
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", str(pki.ca_cert),
    )  # fmt: skip
    server = "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    client = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    _issue(pki, "apiserver", "/CN=kube-apiserver", server + f"subjectAltName={','.join(API_SERVER_SANS)}\n")
    _issue(pki, "admin", "/O=system:masters/CN=kubernetes-admin", client)
    # The aggregation layer's client: without it the controllers log a missing request-header CA forever.
    _issue(pki, "front-proxy-client", "/CN=front-proxy-client", client)
    _new_key(pki.sa_key)
    _openssl("pkey", "-in", str(pki.sa_key), "-pubout", "-out", str(pki.sa_pub))
    return pki
