"""Open Badges 3.0 credentials (on W3C Verifiable Credentials 2.0): build, sign, read, verify.

A credential says: this issuer (a did:key, so its public key is in the id) states that the learner identified by
a salted SHA-256 hash of their e-mail (and of their name) passed this course's graded quiz, with this score, on
this date; the eddsa-jcs-2022 proof signs every byte of that. The e-mail and the name never appear in clear:
whoever knows them can check them with `verify --email ... --name ...`.

Verification is offline and strict: a credential that is not shaped like the ones `issue` makes is refused with
the reason, before the signature is even checked. Revocation cannot be checked offline, so there is none.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .. import strict_json
from .errors import CertError
from .keys import did_key, public_key_from_did, verification_method
from .proof import add_proof, jcs, verify_proof

VC_CONTEXT = "https://www.w3.org/ns/credentials/v2"
OB_CONTEXT = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"
CONTEXT = [VC_CONTEXT, OB_CONTEXT]
TYPES = ["VerifiableCredential", "OpenBadgeCredential"]
COURSE_NAME = "GPU Memory Management and Fragmentation"
DEFAULT_ISSUER_NAME = "minialloc course"
MAX_FILE_BYTES = 1 << 20  # a credential is a few kB; refuse to parse anything huge
CLOCK_SKEW = timedelta(minutes=5)  # tolerated when a credential's validFrom lies just ahead of this clock
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_HASH = re.compile(r"^sha256\$[0-9a-f]{64}$")


@dataclass(frozen=True)
class Score:
    """points of max_points, or only a fraction when the score was given as a percentage."""

    fraction: float
    points: float | None = None
    max_points: float | None = None

    @classmethod
    def parse(cls, text: str) -> Score:
        """ "18/21", "86%", or "0.86"."""
        t = text.strip()
        try:
            if "/" in t:
                a, b = (float(x) for x in t.split("/", 1))
                if b <= 0 or not 0 <= a <= b:
                    raise ValueError
                return cls(a / b, a, b)
            if t.endswith("%"):
                value = float(t[:-1]) / 100
            else:
                value = float(t)
        except ValueError:
            raise CertError(f"cannot read the score {text!r}: write it as 18/21, 86% or 0.86") from None
        if not 0 <= value <= 1:
            raise CertError(f"score {text!r} is outside 0-100%")
        return cls(value)

    def describe(self, lang: str = "en") -> str:
        """The score in words, for the narrative (English) and the printed certificate (any course language)."""
        pct = f"{self.fraction:.0%}" if lang == "en" else f"{self.fraction * 100:.0f} %"
        if self.points is None:
            return pct
        a, b = f"{self.points:g}", f"{self.max_points:g}"
        return {"en": f"{a} of {b} points ({pct})", "vi": f"{a}/{b} điểm ({pct})",
                "de": f"{a} von {b} Punkten ({pct})"}.get(lang, f"{a}/{b} ({pct})")


def normalize_email(email: str) -> str:
    e = email.strip().lower()
    if not _EMAIL.match(e):
        raise CertError(f"{email!r} does not look like an e-mail address")
    return e


def normalize_name(name: str) -> str:
    n = " ".join(unicodedata.normalize("NFC", name).split())
    if not n:
        raise CertError("the learner's name is empty")
    return n


def identity_hash(value: str, salt: str) -> str:
    """Open Badges' salted identity hash: "sha256$" + hex(SHA-256(value + salt))."""
    return "sha256$" + hashlib.sha256((value + salt).encode()).hexdigest()


def achievement_id(assignment: str) -> str:
    """The same achievement id for everyone who passes an assignment: a name-based UUID."""
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'minialloc-course/{assignment}')}"


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_credential(*, name: str, email: str, score: Score, pass_mark: float, issuer_did: str,
                     issuer_name: str = DEFAULT_ISSUER_NAME, assignment: str = "quiz1",
                     valid_from: datetime | None = None, salt: str | None = None) -> dict[str, Any]:
    """The unsigned credential."""
    if score.fraction + 1e-9 < pass_mark:
        raise CertError(f"score {score.describe()} is below the pass mark {pass_mark:.0%}: no certificate")
    salt = salt or secrets.token_hex(16)
    when = _timestamp(valid_from or datetime.now(timezone.utc))
    narrative = (f"Passed the graded quiz {assignment!r} of the course {COURSE_NAME} with {score.describe()}; "
                 f"the pass mark is {pass_mark:.0%}. Questions on the caching allocator, fragmentation, "
                 "expandable segments and paged KV caches, with calculations drawn for each learner and "
                 "answered by running the allocator.")
    return {
        "@context": list(CONTEXT),
        "id": f"urn:uuid:{uuid.uuid4()}",
        "type": list(TYPES),
        "name": f"{COURSE_NAME}: graded quiz passed",
        "description": f"Open Badge for passing the graded quiz of the course {COURSE_NAME}.",
        "issuer": {"id": issuer_did, "type": ["Profile"], "name": issuer_name},
        "validFrom": when,
        "credentialSubject": {
            "type": ["AchievementSubject"],
            "identifier": [
                {"type": "IdentityObject", "identityType": "emailAddress", "hashed": True,
                 "identityHash": identity_hash(normalize_email(email), salt), "salt": salt},
                {"type": "IdentityObject", "identityType": "name", "hashed": True,
                 "identityHash": identity_hash(normalize_name(name), salt), "salt": salt},
            ],
            "achievement": {
                "id": achievement_id(assignment),
                "type": ["Achievement"],
                "achievementType": "Certificate",
                "name": COURSE_NAME,
                "description": "Understands how a caching GPU memory allocator works, why fragmentation makes "
                               "requests fail although memory is free, and how expandable segments and paging "
                               "avoid it.",
                "criteria": {"narrative": narrative},
            },
        },
    }


def issue_credential(key: Ed25519PrivateKey, **fields: Any) -> dict[str, Any]:
    """Build and sign a credential with the instructor's key (fields: see build_credential)."""
    did = did_key(key.public_key())
    credential = build_credential(issuer_did=did, **fields)
    return add_proof(credential, key, verification_method(did), credential["validFrom"])


def verification_id(credential: dict[str, Any]) -> str:
    """A short id for the printed certificate: base32 of SHA-256 over the whole signed credential, 12 letters."""
    digest = hashlib.sha256(jcs(credential)).digest()
    code = base64.b32encode(digest).decode()[:12]
    return "-".join(code[i:i + 4] for i in range(0, 12, 4))


# -- reading and verifying ----------------------------------------------------------------------------------------

def load_credential(path: Path | str) -> dict[str, Any]:
    """Read a credential file; CertError with the reason if it is missing, too big, or not a JSON object."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise CertError(f"cannot read {path}: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise CertError(f"{path} is larger than {MAX_FILE_BYTES} bytes: not a credential")
    try:
        data = strict_json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise CertError(f"{path} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise CertError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except ValueError as e:
        raise CertError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise CertError(f"{path} does not hold a JSON object")
    return data




@dataclass(frozen=True)
class Verified:
    """What a valid credential states."""

    achievement: str
    narrative: str
    issuer_name: str
    issuer_did: str
    valid_from: str
    identity_hashes: dict[str, str]  # identityType -> identityHash
    verification_id: str

    def summary(self) -> str:
        did = self.issuer_did
        short_did = did if len(did) <= 28 else f"{did[:18]}…{did[-6:]}"
        email = self.identity_hashes.get("emailAddress", "?")
        found = _RESULT.search(self.narrative)
        result = f"passed {found['quiz']} with {found['score']}, pass mark {found['mark']}" if found else \
            self.narrative.split(";")[0]
        return (f"VALID: {self.achievement}: {result}; issued {self.valid_from[:10]} by {self.issuer_name} "
                f"({short_did}) to learner {email[:19]}…; verification ID {self.verification_id}")


_RESULT = re.compile(r"graded quiz '(?P<quiz>[^']+)' .* with (?P<score>.+?); the pass mark is (?P<mark>\d+%)")


def _get(obj: Any, path: str, kind: type | tuple[type, ...]) -> Any:
    """obj at a dotted path, checked against a type; CertError naming the path if absent or mistyped."""
    value = obj
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise CertError(f"{path} is missing")
        value = value[part]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise CertError(f"{path} has the wrong type")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise CertError(f"{path} must be a {names.replace('str', 'string').replace('dict', 'JSON object')}")
    return value


def _parse_time(text: str, path: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CertError(f"{path} is not a date-time ({text!r})") from None
    if moment.tzinfo is None:
        raise CertError(f"{path} has no time zone ({text!r})")
    return moment


def verify_credential(credential: Any, now: datetime | None = None) -> Verified:
    """Check shape, dates and signature; CertError with the first reason it is not valid."""
    if not isinstance(credential, dict):
        raise CertError("a credential must be a JSON object")
    now = now or datetime.now(timezone.utc)
    if _get(credential, "@context", list) != CONTEXT:
        raise CertError(f"@context must be exactly {CONTEXT}")
    types = _get(credential, "type", list)
    if any(t not in types for t in TYPES):
        raise CertError(f"type must list {' and '.join(TYPES)}")
    _get(credential, "id", str)
    issuer_did = _get(credential, "issuer.id", str)
    issuer_name = _get(credential, "issuer.name", str)
    if "Profile" not in _get(credential, "issuer.type", list):
        raise CertError("issuer.type must list Profile")
    public_key = public_key_from_did(issuer_did)
    valid_from = _get(credential, "validFrom", str)
    if _parse_time(valid_from, "validFrom") > now + CLOCK_SKEW:
        raise CertError(f"not valid yet: validFrom is {valid_from}")
    if "validUntil" in credential and _parse_time(_get(credential, "validUntil", str), "validUntil") < now:
        raise CertError(f"expired: validUntil was {credential['validUntil']}")
    if "AchievementSubject" not in _get(credential, "credentialSubject.type", list):
        raise CertError("credentialSubject.type must list AchievementSubject")
    identifiers = _get(credential, "credentialSubject.identifier", list)
    hashes = {}
    for i, ident in enumerate(identifiers):
        where = f"credentialSubject.identifier[{i}]"
        if not isinstance(ident, dict) or ident.get("type") != "IdentityObject":
            raise CertError(f"{where} must be an IdentityObject")
        if ident.get("hashed") is not True or not isinstance(ident.get("identityHash"), str) \
                or not _HASH.match(ident["identityHash"]) or not isinstance(ident.get("salt"), str):
            raise CertError(f"{where} must be hashed: identityHash sha256$<64 hex digits> with a salt")
        if not isinstance(ident.get("identityType"), str):
            raise CertError(f"{where}.identityType must be a string")
        hashes[ident["identityType"]] = ident["identityHash"]
    if "emailAddress" not in hashes:
        raise CertError("credentialSubject.identifier has no hashed emailAddress")
    achievement = _get(credential, "credentialSubject.achievement.name", str)
    _get(credential, "credentialSubject.achievement.id", str)
    _get(credential, "credentialSubject.achievement.description", str)
    if "Achievement" not in _get(credential, "credentialSubject.achievement.type", list):
        raise CertError("credentialSubject.achievement.type must list Achievement")
    narrative = _get(credential, "credentialSubject.achievement.criteria.narrative", str)
    proof = _get(credential, "proof", dict)
    if proof.get("proofPurpose") != "assertionMethod":
        raise CertError("proof.proofPurpose must be assertionMethod")
    if proof.get("verificationMethod") != verification_method(issuer_did):
        raise CertError("proof.verificationMethod is not the issuer's did:key key")
    _parse_time(_get(credential, "proof.created", str), "proof.created")
    verify_proof(credential, public_key)
    return Verified(achievement, narrative, issuer_name, issuer_did, valid_from, hashes, verification_id(credential))


def identity_matches(credential: dict[str, Any], *, email: str | None = None, name: str | None = None) -> list[str]:
    """The identity checks that fail (empty if all given ones match); call after verify_credential."""
    failed = []
    wanted = {"emailAddress": normalize_email(email) if email else None,
              "name": normalize_name(name) if name else None}
    idents = {i["identityType"]: i for i in credential["credentialSubject"]["identifier"]}
    for kind, value in wanted.items():
        if value is None:
            continue
        ident = idents.get(kind)
        if ident is None or identity_hash(value, ident["salt"]) != ident["identityHash"]:
            failed.append("e-mail" if kind == "emailAddress" else "name")
    return failed
