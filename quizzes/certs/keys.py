"""The instructor's Ed25519 key pair, and did:key, which carries the public key inside the issuer id.

did:key:z6Mk... is "z" (multibase base58btc) + base58(0xed 0x01 (the multicodec ed25519-pub) + 32 key bytes), so
a verifier gets the public key from the credential itself, offline. The private key is a PKCS#8 PEM file of
mode 0600; keygen refuses to overwrite one, and refuses to write inside a git work tree, so that a key cannot
be committed by accident. Loading refuses a key file that others can read, as ssh does.

With a passphrase the PEM is encrypted at rest (PKCS#8 PBES2, cryptography's BestAvailableEncryption), so a copy
of the file (a backup, a leaked feedback page) is not the key; every command that signs asks for the passphrase.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .base58 import b58decode, b58encode
from .errors import CertError
from .passphrase import PassphraseSource

PRIVATE_KEY_FILE = "issuer-ed25519.pem"
PUBLIC_DID_FILE = "issuer-did.txt"
ED25519_PUB_MULTICODEC = b"\xed\x01"


def public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def did_key(public_key: Ed25519PublicKey) -> str:
    return "did:key:z" + b58encode(ED25519_PUB_MULTICODEC + public_bytes(public_key))


def verification_method(did: str) -> str:
    """did:key's one verification method: the did, "#", and the key's multibase value."""
    return f"{did}#{did.removeprefix('did:key:')}"


def public_key_from_did(did: object) -> Ed25519PublicKey:
    if not isinstance(did, str) or not did.startswith("did:key:z"):
        raise CertError(f"issuer id {did!r} is not a did:key (did:key:z6Mk...): cannot check it offline")
    try:
        raw = b58decode(did.removeprefix("did:key:z"))
    except ValueError as e:
        raise CertError(f"issuer did:key is not valid base58: {e}") from None
    if len(raw) != 34 or raw[:2] != ED25519_PUB_MULTICODEC:
        raise CertError("issuer did:key does not hold an Ed25519 public key (multicodec 0xed01 + 32 bytes)")
    return Ed25519PublicKey.from_public_bytes(raw[2:])


def _git_work_tree(path: Path) -> Path | None:
    for folder in (path, *path.parents):
        if (folder / ".git").exists():
            return folder
    return None


def keygen(out_dir: Path | str, passphrase: bytes | None = None) -> tuple[Path, Path, str]:
    """Make a key pair in out_dir: (private key file, public did file, did). Refuses to overwrite.
    With a passphrase the private key file is encrypted (PKCS#8 PBES2)."""
    out = Path(out_dir).expanduser().resolve()
    repo = _git_work_tree(out)
    if repo is not None:
        raise CertError(f"refusing to write a private key inside the git work tree {repo}: "
                        "keep the instructor key outside every repository (e.g. --out ~/.minialloc-issuer)")
    private_path, did_path = out / PRIVATE_KEY_FILE, out / PUBLIC_DID_FILE
    for path in (private_path, did_path):
        if path.exists():
            raise CertError(f"refusing to overwrite {path}: a key pair already exists there")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    encryption = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    # O_EXCL: never clobber a file that appeared since the check; the mode is set at creation, not after
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise CertError(f"refusing to overwrite {private_path}: a key pair already exists there") from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # the umask may have removed bits, never added them; make it exact
        f.write(pem)
    did = did_key(key.public_key())
    with open(did_path, "x", encoding="utf-8") as f:
        f.write(did + "\n")
    return private_path, did_path, did


# assembled, so that this source file does not itself look like a key to scanners (and to the repository test)
ENCRYPTED_PEM_HEADER = b"-----BEGIN " + b"ENCRYPTED PRIVATE KEY-----"


def load_private_key(path: Path | str, passphrase: PassphraseSource | None = None) -> Ed25519PrivateKey:
    """The issuer key; an encrypted one asks `passphrase` (default: the terminal prompt) for its passphrase."""
    path = Path(path).expanduser()
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as e:
        raise CertError(f"cannot read the key {path}: {e.strerror or e}") from None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CertError(f"{path} can be read by other users (mode {stat.S_IMODE(mode):04o}); "
                        f"run: chmod 600 {path}")
    if data.lstrip().startswith(ENCRYPTED_PEM_HEADER):
        secret = (passphrase or PassphraseSource()).read(purpose=f"of the issuer key {path}")
        try:
            key = serialization.load_pem_private_key(data, password=secret)
        except (ValueError, TypeError):
            raise CertError(f"wrong passphrase for {path} (or the file is damaged)") from None
    else:
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError) as e:
            raise CertError(f"{path} is not a PEM private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CertError(f"{path} is not an Ed25519 key (the eddsa proofs need Ed25519)")
    return key
