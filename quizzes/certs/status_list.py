"""Revocation that every verifier can see: a W3C Bitstring Status List (Bitstring Status List v1.0).

Each credential carries a `credentialStatus` entry naming a bit of the issuer's status list credential:

    "credentialStatus": {"id": "https://course.example.org/status-list.json#94567",
                         "type": "BitstringStatusListEntry", "statusPurpose": "revocation",
                         "statusListIndex": "94567",
                         "statusListCredential": "https://course.example.org/status-list.json"}

The status list credential (BitstringStatusListCredential, signed by the issuer's key with eddsa-rdfc-2022) holds
`encodedList`: "u" (multibase base64url, no padding) + base64url(GZIP(the bits)), at least 131,072 bits (16 KiB)
so that one credential hides in the crowd (the spec's minimum); bit 0 is the most significant bit of the first
byte (section 3.2, "the first index, with a value of zero, is located at the left-most bit"). A set bit means
revoked. The instructor creates it with `status-list`, commits it beside issuer.json and serves it at its id (the
URL the credentials name); `revoke` sets a credential's bit and signs the list again; `verify` reads it.

Indices are drawn at random (the spec's privacy advice: sequential ones would date a credential) from those not
yet used; the ledger beside the list (`status-list.issued.json`: index -> credential id) records them, so that no
two credentials share a bit and `revoke --id` finds one. The ledger is not secret and need not be published.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import secrets
import tempfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .. import strict_json
from .display import shown
from .errors import CertError
from .keys import did_key, public_key_from_did, verification_method
from .proof import RDFC_SUITE, add_proof, single_proof, verify_proof

VC_CONTEXT = "https://www.w3.org/ns/credentials/v2"
ENTRY_TYPE = "BitstringStatusListEntry"
LIST_TYPES = ["VerifiableCredential", "BitstringStatusListCredential"]
PURPOSE = "revocation"
MIN_BITS = 131072  # Bitstring Status List v1.0, section 3.1: "a minimum of 131,072 entries"
MAX_BITS = 1 << 23  # 1 MiB of bits: far more than a course issues; bounds what a crafted list can inflate to
MAX_FILE_BYTES = 1 << 20
LEDGER_FORMAT = "minialloc-status-ledger"


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def encode_bits(bits: bytes) -> str:
    """Multibase base64url (no padding) of the GZIP-compressed bitstring. mtime 0: the same bits, the same text."""
    return "u" + base64.urlsafe_b64encode(gzip.compress(bytes(bits), mtime=0)).decode().rstrip("=")


def decode_bits(text: object) -> bytes:
    """The bitstring from encodedList; CertError for anything but multibase base64url GZIP of 16 KiB to 1 MiB.
    Decompression stops at the cap, so a small crafted list cannot inflate into gigabytes."""
    if not isinstance(text, str) or not text.startswith("u") or len(text) > MAX_FILE_BYTES:
        raise CertError("encodedList must be a multibase base64url string starting with 'u'")
    body = text[1:]
    if body.strip("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"):
        raise CertError("encodedList holds characters outside base64url")
    try:
        packed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # 16 +: a GZIP header and trailer are required
        bits = inflater.decompress(packed, MAX_BITS // 8 + 1)
    except (ValueError, zlib.error) as e:
        raise CertError(f"encodedList is not base64url GZIP data ({shown(str(e), 80)})") from None
    if len(bits) > MAX_BITS // 8 or not inflater.eof or inflater.unused_data:
        raise CertError(f"encodedList is not one GZIP stream of at most {MAX_BITS} bits")
    if len(bits) * 8 < MIN_BITS:
        raise CertError(f"encodedList holds {len(bits) * 8} bits, fewer than the {MIN_BITS} the spec requires")
    return bits


def bit(bits: bytes, index: int) -> bool:
    return bool(bits[index // 8] >> (7 - index % 8) & 1)


@dataclass(frozen=True)
class StatusEntry:
    """A credential's credentialStatus, checked."""

    list_url: str
    index: int


def status_entry(list_url: str, index: int) -> dict[str, Any]:
    return {"id": f"{list_url}#{index}", "type": ENTRY_TYPE, "statusPurpose": PURPOSE,
            "statusListIndex": str(index), "statusListCredential": list_url}


def _check_url(url: object, where: str) -> str:
    if not isinstance(url, str) or not url.startswith("https://") or len(url) > 500 or "#" in url \
            or any(c.isspace() or ord(c) < 0x21 or c in '<>"{}|^`\\' for c in url):
        raise CertError(f"{where} must be an https:// URL without a fragment (at most 500 characters)")
    return url


def read_status_entry(credential: dict[str, Any]) -> StatusEntry | None:
    """A credential's credentialStatus (None when it has none); CertError unless it is exactly what `issue` writes."""
    if "credentialStatus" not in credential:
        return None
    entry = credential["credentialStatus"]
    if not isinstance(entry, dict) or set(entry) != {"id", "type", "statusPurpose", "statusListIndex",
                                                      "statusListCredential"}:
        raise CertError("credentialStatus must be one BitstringStatusListEntry with id, type, statusPurpose, "
                        "statusListIndex and statusListCredential")
    if entry["type"] != ENTRY_TYPE or entry["statusPurpose"] != PURPOSE:
        raise CertError(f"credentialStatus must be a {ENTRY_TYPE} of purpose {PURPOSE!r}")
    url = _check_url(entry["statusListCredential"], "credentialStatus.statusListCredential")
    index_text = entry["statusListIndex"]
    if not isinstance(index_text, str) or not index_text.isascii() or not index_text.isdigit() \
            or len(index_text) > 8 or (index_text.startswith("0") and index_text != "0") \
            or int(index_text) >= MAX_BITS:
        raise CertError(f"credentialStatus.statusListIndex must be a decimal string below {MAX_BITS}")
    if entry["id"] != f"{url}#{index_text}":
        raise CertError("credentialStatus.id must be statusListCredential#statusListIndex")
    return StatusEntry(url, int(index_text))


@dataclass(frozen=True)
class StatusList:
    url: str
    issuer: str
    valid_from: str
    bits: bytes

    def revoked(self, index: int) -> bool:
        if index >= len(self.bits) * 8:
            raise CertError(f"the status list has {len(self.bits) * 8} bits: index {index} is not in it")
        return bit(self.bits, index)


def status_list_credential(key: Ed25519PrivateKey, url: str, bits: bytes, now: datetime | None = None
                           ) -> dict[str, Any]:
    """The signed BitstringStatusListCredential for `bits`."""
    did = did_key(key.public_key())
    when = _timestamp(now or datetime.now(timezone.utc))
    unsigned = {
        "@context": [VC_CONTEXT],
        "id": _check_url(url, "the status list URL"),
        "type": list(LIST_TYPES),
        "issuer": did,
        "validFrom": when,
        "credentialSubject": {"id": f"{url}#list", "type": "BitstringStatusList", "statusPurpose": PURPOSE,
                              "encodedList": encode_bits(bits)},
    }
    return add_proof(unsigned, key, verification_method(did), when, RDFC_SUITE)


def parse_status_list(data: object, issuer_did: str, url: str | None = None) -> StatusList:
    """Check a status list credential: its shape, that `issuer_did` signed it, and (given) that it is `url`."""
    if not isinstance(data, dict) or data.get("@context") != [VC_CONTEXT] or data.get("type") != LIST_TYPES:
        raise CertError(f"not a status list credential (@context [{VC_CONTEXT}], type {LIST_TYPES})")
    list_url = _check_url(data.get("id"), "the status list's id")
    if url is not None and list_url != url:
        raise CertError(f"the status list given is {shown(list_url, 120)}, but the credential names "
                        f"{shown(url, 120)}")
    if data.get("issuer") != issuer_did:
        raise CertError(f"the status list is not the expected issuer's (it names {shown(data.get('issuer'), 80)})")
    subject = data.get("credentialSubject")
    if not isinstance(subject, dict) or subject.get("type") != "BitstringStatusList" \
            or subject.get("statusPurpose") != PURPOSE or subject.get("id") != f"{list_url}#list":
        raise CertError(f"the status list's credentialSubject must be a BitstringStatusList of purpose {PURPOSE!r}")
    _check_dates(data)
    proof = single_proof(data)
    if proof.get("verificationMethod") != verification_method(issuer_did) \
            or proof.get("proofPurpose") != "assertionMethod":
        raise CertError("the status list is not signed by the issuer's key")
    verify_proof(data, public_key_from_did(issuer_did))  # before anything in it is trusted
    return StatusList(list_url, issuer_did, data["validFrom"], decode_bits(subject.get("encodedList")))


def _parse_date(data: dict[str, Any], key: str) -> datetime:
    text = data.get(key)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00")) if isinstance(text, str) else None
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise CertError(f"the status list's {key} is not a date-time with a time zone")
    return moment


def _check_dates(data: dict[str, Any]) -> None:
    """validFrom not ahead of this clock (5 minutes' skew allowed), validUntil (if any) not past."""
    now = datetime.now(timezone.utc)
    if _parse_date(data, "validFrom") > now + timedelta(minutes=5):
        raise CertError(f"the status list is not valid yet (validFrom {shown(data['validFrom'], 25)})")
    if "validUntil" in data and _parse_date(data, "validUntil") < now:
        raise CertError(f"the status list expired (validUntil {shown(data['validUntil'], 25)}): fetch the current one")


def _read_json(path: Path, what: str) -> Any:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise CertError(f"cannot read the {what} {path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CertError(f"{path} is larger than {MAX_FILE_BYTES} bytes: not a {what}")
    try:
        return strict_json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CertError(f"the {what} {path} is not valid JSON: {shown(str(e), 120)}") from None


def load_status_list(path: Path | str, issuer_did: str, url: str | None = None) -> StatusList:
    return parse_status_list(_read_json(Path(path).expanduser(), "status list"), issuer_did, url)


def write_public_json(path: Path, data: dict[str, Any]) -> None:
    """A file the issuer publishes (0644, like issuer.json), written beside, then renamed: a reader (or a crash)
    never sees half a file. The revocation list is written the same way."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, ensure_ascii=False)
            f.write("\n")
        os.chmod(tmp, 0o644)  # public, like issuer.json
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def ledger_path(list_path: Path | str) -> Path:
    """status-list.json -> status-list.issued.json, beside it."""
    path = Path(list_path).expanduser()
    return path.with_name(f"{path.name.removesuffix('.json')}.issued.json")


def create_status_list(path: Path | str, key: Ed25519PrivateKey, url: str, now: datetime | None = None) -> Path:
    """A new, empty (nothing revoked) status list at `path`, to be served at `url`; refuses to replace one (its
    credentials would lose their revocation bits)."""
    path = Path(path).expanduser()
    ledger = ledger_path(path)
    for p in (path, ledger):
        if p.exists():
            raise CertError(f"refusing to overwrite {p}: the credentials issued against it would lose their status")
    write_public_json(path, status_list_credential(key, url, bytes(MIN_BITS // 8), now))
    write_public_json(ledger, {"format": LEDGER_FORMAT, "version": 1, "list": url, "issued": {}})
    return path


def _ledger(list_path: Path, url: str) -> dict[str, str]:
    data = _read_json(ledger_path(list_path), "status list ledger")
    if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT or data.get("list") != url \
            or not isinstance(data.get("issued"), dict):
        raise CertError(f"{ledger_path(list_path)} is not the ledger of the status list {url}")
    return data["issued"]


def allocate_index(list_path: Path | str, key: Ed25519PrivateKey, credential_id: str) -> StatusEntry:
    """Draw an unused index at random, record it for `credential_id` in the ledger, and return the entry."""
    path = Path(list_path).expanduser()
    current = load_status_list(path, did_key(key.public_key()))
    issued = _ledger(path, current.url)
    size = len(current.bits) * 8
    if len(issued) >= size // 2:
        raise CertError(f"the status list {path} has {len(issued)} of its {size} indices in use: start a new one")
    while True:
        index = secrets.randbelow(size)
        if str(index) not in issued:
            break
    issued[str(index)] = credential_id
    write_public_json(ledger_path(path), {"format": LEDGER_FORMAT, "version": 1, "list": current.url,
                                      "issued": issued})
    return StatusEntry(current.url, index)


def index_of(list_path: Path | str, url: str, credential_id: str) -> int:
    """The index the ledger gave `credential_id`."""
    found = [int(i) for i, cid in _ledger(Path(list_path).expanduser(), url).items() if cid == credential_id]
    if not found:
        raise CertError(f"{credential_id} has no index in the ledger of {url}: give --credential FILE instead")
    return found[0]


def revoke_index(list_path: Path | str, key: Ed25519PrivateKey, index: int, now: datetime | None = None
                 ) -> StatusList:
    """Set bit `index` of the list at `list_path` and sign it again; the list must verify under this key."""
    path = Path(list_path).expanduser()
    did = did_key(key.public_key())
    current = load_status_list(path, did)
    if current.revoked(index):
        raise CertError(f"index {index} of {current.url} is already revoked (list signed {current.valid_from})")
    bits = bytearray(current.bits)
    bits[index // 8] |= 0x80 >> (index % 8)
    signed = status_list_credential(key, current.url, bytes(bits), now)
    write_public_json(path, signed)
    return parse_status_list(signed, did)
