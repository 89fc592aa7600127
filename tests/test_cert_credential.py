"""Credentials: the W3C test vector, round trips, and every signed field guarded by the signature."""

from __future__ import annotations

import base64
import copy
import json
from datetime import datetime, timedelta, timezone

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from quizzes.certs import CertError, Score, identity_matches, issue_credential, verify_credential
from quizzes.certs.base58 import b58decode, b58encode
from quizzes.certs.credential import CONTEXT, verification_id
from quizzes.certs.keys import did_key, public_key_from_did
from quizzes.certs.proof import jcs, verify_proof

NOW = datetime(2025, 11, 29, 12, 0, tzinfo=timezone.utc)
KEY = Ed25519PrivateKey.generate()
FIELDS = dict(name="Nguyễn Văn A", email="a.nguyen@example.org", score=Score.parse("18/21"), pass_mark=0.8,
              valid_from=NOW)

# The eddsa-jcs-2022 example of the W3C spec (vc-di-eddsa, TestVectors/eddsa-jcs-2022/signedJCS.json) and the
# public key it was signed with: our verifier must accept it as the spec's own implementations do.
W3C_PUBLIC_MULTIBASE = "z6MkrJVnaZkeFzdQyMZu1cgjg7k1pZZ6pvBQ7XJPt4swbTQ2"
W3C_SIGNED = {
    "@context": ["https://www.w3.org/ns/credentials/v2", "https://www.w3.org/ns/credentials/examples/v2"],
    "id": "urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33",
    "type": ["VerifiableCredential", "AlumniCredential"],
    "name": "Alumni Credential",
    "description": "A minimum viable example of an Alumni Credential.",
    "issuer": "https://vc.example/issuers/5678",
    "validFrom": "2023-01-01T00:00:00Z",
    "credentialSubject": {"id": "did:example:abcdefgh", "alumniOf": "The School of Examples"},
    "proof": {
        "type": "DataIntegrityProof",
        "cryptosuite": "eddsa-jcs-2022",
        "created": "2023-02-24T23:36:38Z",
        "verificationMethod": "https://vc.example/issuers/5678#" + W3C_PUBLIC_MULTIBASE,
        "proofPurpose": "assertionMethod",
        "@context": ["https://www.w3.org/ns/credentials/v2", "https://www.w3.org/ns/credentials/examples/v2"],
        "proofValue": "z63t83Y53KfzJ5ZosfKTnqfMcKB2dmTrfjSaQjeNNjAD5srBowQfmWqeRb8rRjmeEuCBEsddF9LsVogtuTsijJKh4",
    },
}
# The spec's canonical form of that document without its proof (canonDocJCS.txt).
W3C_CANONICAL = (
    '{"@context":["https://www.w3.org/ns/credentials/v2","https://www.w3.org/ns/credentials/examples/v2"],'
    '"credentialSubject":{"alumniOf":"The School of Examples","id":"did:example:abcdefgh"},'
    '"description":"A minimum viable example of an Alumni Credential.",'
    '"id":"urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33","issuer":"https://vc.example/issuers/5678",'
    '"name":"Alumni Credential","type":["VerifiableCredential","AlumniCredential"],"validFrom":"2023-01-01T00:00:00Z"}'
)


def _credential() -> dict:
    return issue_credential(KEY, **FIELDS)


CREDENTIAL = _credential()


def test_w3c_test_vector_verifies():
    public = public_key_from_did("did:key:" + W3C_PUBLIC_MULTIBASE)
    document = {k: v for k, v in W3C_SIGNED.items() if k != "proof"}
    assert jcs(document).decode() == W3C_CANONICAL
    verify_proof(W3C_SIGNED, public)
    tampered = copy.deepcopy(W3C_SIGNED)
    tampered["credentialSubject"]["alumniOf"] = "Another School"
    with pytest.raises(CertError, match="signature does not match"):
        verify_proof(tampered, public)


def test_base58_and_did_key():
    for data in (b"", b"\0", b"\0\0abc", bytes(range(256)), b"\xff" * 33):
        assert b58decode(b58encode(data)) == data
    assert b58encode(b"hello world") == "StV1DL6CwTryKyV"  # the classic base58btc example
    did = did_key(KEY.public_key())
    assert did.startswith("did:key:z6Mk")
    raw = KEY.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert b58decode(did.removeprefix("did:key:z")) == b"\xed\x01" + raw
    assert isinstance(public_key_from_did(did), Ed25519PublicKey)
    for bad in ("did:web:example.org", "did:key:z0OIl", "did:key:z" + b58encode(b"\xed\x01" + b"x" * 5), 42):
        with pytest.raises(CertError):
            public_key_from_did(bad)


def test_round_trip():
    v = verify_credential(CREDENTIAL, now=NOW)
    assert v.issuer_did == did_key(KEY.public_key())
    assert v.achievement == "GPU Memory Management and Fragmentation"
    assert "18 of 21 points (86%)" in v.narrative and "80%" in v.narrative
    assert v.verification_id == verification_id(CREDENTIAL)
    line = v.summary()
    assert line.startswith("VALID: ") and "\n" not in line and v.verification_id in line
    assert CREDENTIAL["@context"] == CONTEXT
    assert CREDENTIAL["type"] == ["VerifiableCredential", "OpenBadgeCredential"]
    proof = CREDENTIAL["proof"]
    assert (proof["type"], proof["cryptosuite"], proof["proofPurpose"]) == \
           ("DataIntegrityProof", "eddsa-jcs-2022", "assertionMethod")
    assert proof["verificationMethod"] == f"{v.issuer_did}#{v.issuer_did.removeprefix('did:key:')}"
    assert proof["proofValue"].startswith("z") and len(b58decode(proof["proofValue"][1:])) == 64


def test_learner_is_a_salted_hash():
    text = json.dumps(CREDENTIAL, ensure_ascii=False)
    for clear in ("a.nguyen@example.org", "a.nguyen", "Nguyễn Văn A", "Nguyễn", "A.NGUYEN@EXAMPLE.ORG"):
        assert clear not in text
    assert identity_matches(CREDENTIAL, email=" A.Nguyen@Example.org ", name="Nguyễn  Văn A") == []
    assert identity_matches(CREDENTIAL, email="b@example.org") == ["e-mail"]
    assert identity_matches(CREDENTIAL, name="Trần Thị B") == ["name"]
    other = issue_credential(KEY, **FIELDS)  # same learner, new salt: the hashes cannot be linked
    hashes = {i["identityHash"] for c in (CREDENTIAL, other) for i in c["credentialSubject"]["identifier"]}
    assert len(hashes) == 4


def test_private_key_is_not_in_the_credential():
    text = json.dumps(CREDENTIAL)
    raw = KEY.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    pem = KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    for form in (raw.hex(), base64.b64encode(raw).decode(), b58encode(raw), b58encode(b"\x80\x26" + raw),
                 pem.splitlines()[1]):
        assert form not in text


def _paths(value, path=()):
    """Every place in a JSON value: dict keys, list items, leaves (depth first)."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*path, i))


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def _mutations(doc, path):
    """Ways to change the value at `path`: alter it, remove it, add beside it."""
    value = _get(doc, path)
    changed = []
    if isinstance(value, str):
        changed += [value + "x", value[:-1] if value else "x", value.upper() if value != value.upper() else "y"]
    elif isinstance(value, bool):
        changed.append(not value)
    elif isinstance(value, list):
        changed += [value[:-1], value + [value[-1] if value else "x"], list(reversed(value)) if len(value) > 1
                    else value + ["x"]]
    elif isinstance(value, dict):
        changed += [{**value, "extra": "x"}]
    for new in changed:
        if new == value:
            continue
        out = copy.deepcopy(doc)
        if path:
            _get(out, path[:-1])[path[-1]] = new
        else:
            out = new
        yield f"{path} -> {str(new)[:30]}", out
    if path:  # remove the key or item
        out = copy.deepcopy(doc)
        parent = _get(out, path[:-1])
        del parent[path[-1]]
        yield f"del {path}", out


def test_any_change_to_any_field_fails_verification():
    paths = [p for p in _paths(CREDENTIAL) if p]
    assert any(p[0] == "issuer" for p in paths) and any(p[0] == "proof" for p in paths)
    tried = 0
    for path in paths:
        for what, tampered in _mutations(CREDENTIAL, path):
            try:
                verify_credential(tampered, now=NOW)
            except CertError:
                tried += 1
            else:
                pytest.fail(f"verify accepted a changed credential: {what}")
    assert tried > 100
    verify_credential(CREDENTIAL, now=NOW)  # the original still verifies: the walk changed copies only


def test_a_new_top_level_field_fails_verification():
    with pytest.raises(CertError, match="signature"):
        verify_credential({**CREDENTIAL, "evidence": "I passed"}, now=NOW)


def test_resigning_with_another_key_changes_the_issuer():
    """Anyone can sign their own credential; it then names their did, which `verify --issuer` pins."""
    other = issue_credential(Ed25519PrivateKey.generate(), **FIELDS)
    assert verify_credential(other, now=NOW).issuer_did != verify_credential(CREDENTIAL, now=NOW).issuer_did
    forged = copy.deepcopy(other)
    forged["issuer"]["id"] = CREDENTIAL["issuer"]["id"]  # claim the course's did, keep the other signature
    with pytest.raises(CertError):
        verify_credential(forged, now=NOW)


def test_dates():
    with pytest.raises(CertError, match="not valid yet"):
        verify_credential(CREDENTIAL, now=NOW - timedelta(days=1))
    verify_credential(CREDENTIAL, now=NOW + timedelta(days=3650))  # no expiry was set


@pytest.mark.parametrize(("text", "fraction", "described"), [
    ("18/21", 18 / 21, "18 of 21 points (86%)"), ("86%", 0.86, "86%"), ("0.9", 0.9, "90%"), ("21/21", 1, None),
])
def test_score_parse(text, fraction, described):
    score = Score.parse(text)
    assert score.fraction == pytest.approx(fraction)
    if described:
        assert score.describe() == described


@pytest.mark.parametrize("text", ["", "abc", "22/21", "-1", "150%", "5/0"])
def test_score_parse_refuses(text):
    with pytest.raises(CertError):
        Score.parse(text)


def test_below_pass_mark_is_refused():
    with pytest.raises(CertError, match="below the pass mark"):
        issue_credential(KEY, **{**FIELDS, "score": Score.parse("16/21")})


def test_unrepresentable_numbers_are_refused():
    with pytest.raises(CertError, match="canonicalized"):
        verify_credential({**CREDENTIAL, "evidence": 2**60}, now=NOW)
