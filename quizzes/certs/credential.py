"""Open Badges 3.0 credentials (on W3C Verifiable Credentials 2.0): build, sign, read, verify.

A credential says: this issuer (a did:key, so its public key is in the id) states that the learner identified by
a salted SHA-256 hash of their e-mail (and of their name) passed this course's graded quiz, with this score, on
this date; the eddsa-rdfc-2022 (or, on request, eddsa-jcs-2022) proof signs all of that. The e-mail and the
name never appear in clear: whoever knows them can check them with `verify --email ... --name ...`.

The score is data, not prose: `credentialSubject.result` holds it as Open Badges Results (percent, points, extra
credit), each pointing at a ResultDescription of the achievement (its range and the value required to pass).
The percentage is capped at 100: extra credit is shown as its own result, never as 119%.

Verification is offline and strict: a credential that is not shaped like the ones `issue` makes is refused with
the reason, before the signature is even checked. Everything it prints from the file goes through
display.shown (escaped, cut), and nothing here runs a regular expression over the file's text, so the cost of
`verify` is linear in the file's size, which load_credential caps. Revocation is checked against the issuer's
signed list when one is given (quizzes.certs.revocation).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import unicodedata
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from minialloc.lang import messages

from .. import strict_json
from ..i18n import LANGS
from .display import shown
from .errors import CertError
from .keys import did_key, public_key_from_did, verification_method
from .proof import RDFC_SUITE, add_proof, jcs, single_proof, verify_proof
from .status_list import StatusEntry, allocate_index, read_status_entry, status_entry

# The score in words on the certificate: "18 of 21 points (86%)", then " + " an extra credit, ", " a late penalty.
SCORE = messages("quizzes.certs.credential.SCORE", {
    "points": "{a} of {b} points ({pct})",
    "extra": "{x} extra credit",
    "late": "after a late penalty of {p}",
})

VC_CONTEXT = "https://www.w3.org/ns/credentials/v2"
OB_CONTEXT = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"
CONTEXT = [VC_CONTEXT, OB_CONTEXT]
TYPES = ["VerifiableCredential", "OpenBadgeCredential"]
COURSE_NAME = "GPU Memory Management and Fragmentation"
DEFAULT_ISSUER_NAME = "minialloc course"
MAX_FILE_BYTES = 1 << 20  # a credential is a few kB; refuse to parse anything huge
CLOCK_SKEW = timedelta(minutes=5)  # tolerated when a credential's validFrom lies just ahead of this clock
_HEX = frozenset("0123456789abcdef")


def _num(x: float) -> str:
    return f"{round(x, 4):g}"


def _percent_text(fraction: float, lang: str = "en") -> str:
    pct = round(fraction * 100)
    if pct == 100 and fraction < 1:  # 99.6% is not full marks: never print 100% for it
        pct = 99
    return f"{pct}%" if lang == "en" else f"{pct} %"


@dataclass(frozen=True)
class Score:
    """A score as certified: `fraction` of the maximum (capped at 1), from `points` of `max_points` (capped at
    the maximum) when known; `extra_points` above the maximum are extra credit, shown as such; `late_penalty`
    points were already deducted for a late submission."""

    fraction: float
    points: float | None = None
    max_points: float | None = None
    extra_points: float = 0.0
    late_penalty: float = 0.0

    @classmethod
    def from_points(cls, raw: float, max_points: float, late_penalty: float = 0.0) -> Score:
        """nbgrader's numbers: the submission's score (extra credit included), the assignment's maximum, and the
        late submission penalty. The penalty comes off first; what exceeds the maximum is extra credit."""
        if max_points <= 0:
            raise CertError("the maximum score must be positive")
        penalty = max(0.0, float(late_penalty or 0.0))
        net = max(0.0, float(raw) - penalty)
        counted = min(net, float(max_points))
        return cls(counted / max_points, counted, float(max_points), net - counted, penalty)

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
        pct = _percent_text(self.fraction, lang)
        if self.points is None or self.max_points is None:
            return pct
        a, b = _num(self.points), _num(self.max_points)
        known = lang in LANGS  # another language gets the bare numbers

        def words(key: str, bare: str, **fields: str) -> str:
            return SCORE[key][lang].format(**fields) if known else bare

        text = words("points", f"{a}/{b} ({pct})", a=a, b=b, pct=pct)
        if self.extra_points > 0:
            x = _num(self.extra_points)
            text += " + " + words("extra", x, x=x)
        if self.late_penalty > 0:
            p = _num(self.late_penalty)
            text += ", " + words("late", f"-{p}", p=p)
        return text


def normalize_email(email: str) -> str:
    e = email.strip().lower()
    # one "@", something before it, a dot inside the domain, no whitespace: checked by splitting, in linear time
    local, at, domain = e.partition("@")
    if not (at and local and "@" not in domain and "." in domain.strip(".") and not domain.startswith(".")
            and not domain.endswith(".") and not any(c.isspace() for c in e)):
        raise CertError(f"{email!r} does not look like an e-mail address")
    return e


def _is_identity_hash(value: object) -> bool:
    """sha256$ + 64 lowercase hex digits."""
    return isinstance(value, str) and len(value) == 71 and value.startswith("sha256$") \
        and all(c in _HEX for c in value[7:])


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


def result_description_id(assignment: str, kind: str) -> str:
    return f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'minialloc-course/{assignment}/result/{kind}')}"


def results(score: Score, pass_mark: float, assignment: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(achievement.resultDescription, credentialSubject.result): the percentage, and the points and the extra
    credit when the score came with points. Values are strings, as Open Badges 3.0 defines them."""
    pct_id = result_description_id(assignment, "percent")
    descriptions: list[dict[str, Any]] = [
        {"id": pct_id, "type": ["ResultDescription"], "name": "Score, percent of the maximum (capped at 100)",
         "resultType": "Percent", "valueMin": "0", "valueMax": "100", "requiredValue": _num(pass_mark * 100)}]
    found: list[dict[str, Any]] = [
        {"type": ["Result"], "resultDescription": pct_id, "value": _num(score.fraction * 100),
         "status": "Completed"}]
    if score.points is not None and score.max_points is not None:
        points_id, extra_id = result_description_id(assignment, "points"), result_description_id(assignment, "extra")
        descriptions += [
            {"id": points_id, "type": ["ResultDescription"], "name": "Points (after any late penalty)",
             "resultType": "RawScore", "valueMin": "0", "valueMax": _num(score.max_points),
             "requiredValue": _num(pass_mark * score.max_points)},
            {"id": extra_id, "type": ["ResultDescription"], "name": "Extra credit points, beyond the maximum",
             "resultType": "RawScore", "valueMin": "0"}]
        found.append({"type": ["Result"], "resultDescription": points_id, "value": _num(score.points)})
        if score.extra_points > 0:
            found.append({"type": ["Result"], "resultDescription": extra_id, "value": _num(score.extra_points)})
    return descriptions, found


def _check_text(text: str, what: str) -> None:
    """A string that is signed (or hashed) must be Unicode text: a lone surrogate (what Python makes of a byte that
    is not UTF-8 on the command line) has no UTF-8 form, so neither JSON nor N-Quads can carry it. Control
    characters are fine: both canonical forms escape them (quizzes.certs.rdfc)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise CertError(f"the {what} {shown(text, 80)} is not valid text (a byte that is not UTF-8?): "
                        "give it as UTF-8") from None


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_credential(*, name: str, email: str, score: Score, pass_mark: float, issuer_did: str,
                     issuer_name: str = DEFAULT_ISSUER_NAME, assignment: str = "quiz1",
                     valid_from: datetime | None = None, salt: str | None = None) -> dict[str, Any]:
    """The unsigned credential."""
    for what, text in (("learner's name", name), ("e-mail", email), ("issuer name", issuer_name),
                       ("assignment", assignment)):
        _check_text(text, what)
    if score.fraction + 1e-9 < pass_mark:
        raise CertError(f"score {score.describe()} is below the pass mark {pass_mark:.0%}: no certificate")
    salt = salt or secrets.token_hex(16)
    descriptions, found = results(score, pass_mark, assignment)
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
                "resultDescription": descriptions,
            },
            "result": found,
        },
    }


def issue_credential(key: Ed25519PrivateKey, *, cryptosuite: str = RDFC_SUITE, proof_array: bool = False,
                     status_list: Path | str | None = None, **fields: Any) -> dict[str, Any]:
    """Build and sign a credential with the instructor's key (fields: see build_credential); eddsa-rdfc-2022 by
    default, the suite wallets accept (DCC's verifier-core and LearnCard reject eddsa-jcs-2022). With
    `status_list` (the issuer's status list file, quizzes.certs.status_list) it gets a credentialStatus entry at
    a fresh index of that list."""
    did = did_key(key.public_key())
    credential = build_credential(issuer_did=did, **fields)
    if status_list is not None:
        entry = allocate_index(status_list, key, credential["id"])
        credential["credentialStatus"] = status_entry(entry.list_url, entry.index)
    return add_proof(credential, key, verification_method(did), credential["validFrom"], cryptosuite,
                     as_array=proof_array)


def verification_id(credential: dict[str, Any]) -> str:
    """A short id for the printed certificate: base32 of SHA-256 over the whole signed credential, 12 letters;
    the proof counted as one object, so the same signature written as an array of one has the same id."""
    counted = {**credential, "proof": single_proof(credential)} if "proof" in credential else credential
    digest = hashlib.sha256(jcs(counted)).digest()
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
    """What a valid credential states. Its strings come from the file: print them only through summary()."""

    achievement: str
    narrative: str
    issuer_name: str
    issuer_did: str
    valid_from: str
    identity_hashes: dict[str, str]  # identityType -> identityHash
    verification_id: str
    score: str | None = None  # from credentialSubject.result, checked as numbers; None for older credentials
    credential_id: str = ""
    cryptosuite: str = RDFC_SUITE
    status: StatusEntry | None = None  # its Bitstring Status List entry, when it has one

    def summary(self) -> str:
        """One line, every value from the file escaped and cut (display.shown)."""
        email = self.identity_hashes.get("emailAddress", "?")
        result = self.score if self.score is not None else shown(self.narrative, 160)
        return (f"VALID: {shown(self.achievement, 120)}: {result}; issued {shown(self.valid_from[:10], 10)} by "
                f"{shown(self.issuer_name, 80)} ({self.issuer_did}) to learner {email[:19]}…; "
                f"verification ID {self.verification_id}")


def _decimal(value: object, where: str) -> float:
    """A result value: a short string of digits with at most one point (Open Badges values are strings)."""
    if not isinstance(value, str) or not 0 < len(value) <= 24 or value.count(".") > 1 \
            or value.strip("0123456789.") or value in (".",):
        raise CertError(f"{where} must be a decimal number written as a string, like \"86\"")
    return float(value)


def _read_score(credential: dict[str, Any]) -> str | None:
    """The score line from credentialSubject.result and the achievement's ResultDescriptions (None if absent)."""
    if "result" not in credential["credentialSubject"]:
        return None  # issued before results were written: the narrative says it
    found = _get(credential, "credentialSubject.result", list)
    described = _get(credential, "credentialSubject.achievement.resultDescription", list)
    kinds: dict[str, tuple[str, float | None, float | None]] = {}  # id -> (kind, valueMax, requiredValue)
    for i, d in enumerate(described):
        where = f"credentialSubject.achievement.resultDescription[{i}]"
        if not isinstance(d, dict) or not isinstance(d.get("id"), str) or d.get("type") != ["ResultDescription"]:
            raise CertError(f"{where} must be a ResultDescription with an id")
        top = _decimal(d["valueMax"], f"{where}.valueMax") if "valueMax" in d else None
        need = _decimal(d["requiredValue"], f"{where}.requiredValue") if "requiredValue" in d else None
        if d.get("resultType") == "Percent" and top == 100:
            kind = "percent"
        elif d.get("resultType") == "RawScore":
            kind = "points" if top is not None else "extra"
        else:
            raise CertError(f"{where} is not a result this issuer writes (Percent of 100, or RawScore)")
        if d["id"] in kinds:
            raise CertError(f"{where}.id is used twice")
        kinds[d["id"]] = (kind, top, need)
    values: dict[str, tuple[float, float | None, float | None]] = {}
    for i, r in enumerate(found):
        where = f"credentialSubject.result[{i}]"
        if not isinstance(r, dict) or r.get("type") != ["Result"] or r.get("resultDescription") not in kinds:
            raise CertError(f"{where} must be a Result naming one of the achievement's ResultDescriptions")
        kind, top, need = kinds[r["resultDescription"]]
        value = _decimal(r.get("value"), f"{where}.value")
        if kind in values or (top is not None and value > top):
            raise CertError(f"{where}: a second {kind} result, or a value above its maximum")
        values[kind] = (value, top, need)
    if "percent" not in values:
        raise CertError("credentialSubject.result has no percentage")
    pct, _, pct_needed = values["percent"]
    text = f"score {_num(pct)}%"
    if "points" in values:
        points, top, _ = values["points"]
        text += f" ({_num(points)} of {_num(top or 0)} points"
        if "extra" in values:
            text += f" + {_num(values['extra'][0])} extra credit"
        text += ")"
    if pct_needed is not None:
        text += f", pass mark {_num(pct_needed)}%"
    return text


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


def _no_ignored_keywords(credential: dict[str, Any]) -> None:
    """JSON-LD drops keys that look like keywords ("@anything") without signing them; eddsa-rdfc-2022 would then
    accept a file carrying unsigned text. Refuse them all, but the top-level @context (iterative: no recursion)."""
    if any(k.startswith("@") and k != "@context" for k in credential):
        raise CertError("a top-level key other than @context starts with '@': JSON-LD would not sign it")
    stack: list[Any] = [v for k, v in credential.items() if k != "@context"]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if any(k.startswith("@") for k in value):
                raise CertError("a nested key starts with '@': JSON-LD would not sign it (eddsa-rdfc-2022)")
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


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
        if ident.get("hashed") is not True or not _is_identity_hash(ident.get("identityHash")) \
                or not isinstance(ident.get("salt"), str):
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
    proof = single_proof(credential)
    if proof.get("proofPurpose") != "assertionMethod":
        raise CertError("proof.proofPurpose must be assertionMethod")
    if proof.get("verificationMethod") != verification_method(issuer_did):
        raise CertError("proof.verificationMethod is not the issuer's did:key key")
    _parse_time(_get({"proof": proof}, "proof.created", str), "proof.created")  # the one proof, either form
    if proof.get("cryptosuite") == RDFC_SUITE:
        _no_ignored_keywords(credential)
    score = _read_score(credential)
    status = read_status_entry(credential)
    verify_proof(credential, public_key)
    return Verified(achievement, narrative, issuer_name, issuer_did, valid_from, hashes, verification_id(credential),
                    score, credential["id"], proof["cryptosuite"], status)


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
