"""The issuer's older revocation list: a signed JSON list of revoked credential ids that `verify` checks when given
one. Credentials issued with --status-list are revoked through the W3C Bitstring Status List instead
(quizzes.certs.status_list), which wallets and other verifiers read too; this list remains for the credentials
issued before it, which carry no credentialStatus.

    {"format": "minialloc-revocation-list", "version": 1, "issuer": "did:key:z6Mk...",
     "updated": "2026-01-05T10:00:00Z",
     "revoked": [{"id": "urn:uuid:...", "date": "2026-01-05T10:00:00Z", "reason": "..."}],
     "proof": {eddsa-jcs-2022 DataIntegrityProof by the issuer's key}}

Only the issuer's key can add to it (`python -m quizzes revoke`), so nobody else can revoke a learner's badge,
and `verify --revocation-list FILE` refuses a list signed by any key but the expected issuer's. What a signature
cannot give is freshness: an older list, from before a revocation, is validly signed too. The instructor
publishes the current list in one place (beside issuer.json) and verifiers fetch that one; `updated` says when
it was signed. Only this project's `verify` reads it, and it names revoked ids (random UUIDs that identify no one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .. import strict_json
from .credential import _timestamp  # the credentials' own date-time format: one writer for both
from .display import shown
from .errors import CertError
from .keys import did_key, public_key_from_did, verification_method
from .proof import JCS_SUITE, add_proof, verify_proof
from .status_list import write_public_json

FORMAT = "minialloc-revocation-list"
MAX_FILE_BYTES = 4 << 20  # about 20,000 entries; refuse anything larger unread
MAX_ID_CHARS = 200
MAX_REASON_CHARS = 500


@dataclass(frozen=True)
class Revocation:
    id: str
    date: str
    reason: str


@dataclass(frozen=True)
class RevocationList:
    issuer: str
    updated: str
    entries: dict[str, Revocation]

    def find(self, credential_id: str) -> Revocation | None:
        return self.entries.get(credential_id)


def _check_id(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.startswith("urn:uuid:") or len(value) > MAX_ID_CHARS:
        raise CertError(f"{where} must be a credential id (urn:uuid:..., at most {MAX_ID_CHARS} characters)")
    return value


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise CertError(f"cannot read the revocation list {path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CertError(f"{path} is larger than {MAX_FILE_BYTES} bytes: not a revocation list")
    try:
        data = strict_json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CertError(f"the revocation list {path} is not valid JSON: {shown(str(e), 120)}") from None
    if not isinstance(data, dict):
        raise CertError(f"the revocation list {path} is not a JSON object")
    return data


def parse_revocation_list(data: dict[str, Any], issuer_did: str) -> RevocationList:
    """Check a revocation list's shape and its signature by `issuer_did`; CertError saying why not."""
    if data.get("format") != FORMAT or data.get("version") != 1:
        raise CertError(f"not a revocation list (format {FORMAT!r}, version 1)")
    if data.get("issuer") != issuer_did:
        raise CertError(f"the revocation list is not the expected issuer's (it names {shown(data.get('issuer'), 80)})")
    if not isinstance(data.get("updated"), str) or not isinstance(data.get("revoked"), list):
        raise CertError("the revocation list needs 'updated' (a date-time) and 'revoked' (a list)")
    proof = data.get("proof")
    if not isinstance(proof, dict) or proof.get("verificationMethod") != verification_method(issuer_did) \
            or proof.get("proofPurpose") != "assertionMethod":
        raise CertError("the revocation list is not signed by the issuer's key")
    verify_proof(data, public_key_from_did(issuer_did))  # before anything in it is trusted
    entries: dict[str, Revocation] = {}
    for i, entry in enumerate(data["revoked"]):
        where = f"revoked[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("date"), str) \
                or not isinstance(entry.get("reason", ""), str):
            raise CertError(f"{where} must be an object with id, date and an optional reason")
        entries[_check_id(entry.get("id"), f"{where}.id")] = Revocation(entry["id"], entry["date"],
                                                                       entry.get("reason", ""))
    return RevocationList(issuer_did, data["updated"], entries)


def load_revocation_list(path: Path | str, issuer_did: str) -> RevocationList:
    return parse_revocation_list(_read(Path(path).expanduser()), issuer_did)


def revoke(list_path: Path | str, key: Ed25519PrivateKey, credential_id: str, reason: str = "",
           now: datetime | None = None) -> RevocationList:
    """Add `credential_id` to the list at `list_path` (created if missing), re-signed with the issuer key.

    An existing list must verify under this same key: a key cannot take over another issuer's list."""
    path = Path(list_path).expanduser()
    did = did_key(key.public_key())
    _check_id(credential_id, "the credential id")
    if len(reason) > MAX_REASON_CHARS:
        raise CertError(f"the reason has more than {MAX_REASON_CHARS} characters")
    when = _timestamp(now or datetime.now(timezone.utc))
    if path.exists():
        data = _read(path)
        current = parse_revocation_list(data, did)
        if current.find(credential_id):
            raise CertError(f"{credential_id} is already revoked (since {current.entries[credential_id].date})")
        revoked = list(data["revoked"])
    else:
        revoked = []
    revoked.append({"id": credential_id, "date": when, **({"reason": reason} if reason else {})})
    unsigned = {"format": FORMAT, "version": 1, "issuer": did, "updated": when, "revoked": revoked}
    signed = add_proof(unsigned, key, verification_method(did), when, JCS_SUITE)
    write_public_json(path, signed)
    return parse_revocation_list(signed, did)
