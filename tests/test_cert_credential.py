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
    """eddsa-jcs-2022, issued on request: its JSON bytes are signed, so every change (even a reordered `type`)
    fails; the default suite, eddsa-rdfc-2022, is tested below."""
    return issue_credential(KEY, cryptosuite="eddsa-jcs-2022", **FIELDS)


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


# -- the score as Open Badges results -------------------------------------------------------------------------------

def _results(credential: dict) -> dict[str, str]:
    """resultType/name of each result's description -> its value."""
    described = {d["id"]: d for d in credential["credentialSubject"]["achievement"]["resultDescription"]}
    return {described[r["resultDescription"]]["name"].split(",")[0].split(" (")[0]: r["value"]
            for r in credential["credentialSubject"]["result"]}


def test_score_is_in_credential_subject_result():
    results = _results(CREDENTIAL)
    assert results == {"Score": "85.7143", "Points": "18"}
    described = {d["resultType"] + ("" if "valueMax" in d else "-open"): d
                 for d in CREDENTIAL["credentialSubject"]["achievement"]["resultDescription"]}
    assert described["Percent"]["valueMax"] == "100" and described["Percent"]["requiredValue"] == "80"
    assert described["RawScore"]["valueMax"] == "21" and described["RawScore"]["requiredValue"] == "16.8"
    assert "extra credit" in described["RawScore-open"]["name"].lower()
    line = verify_credential(CREDENTIAL, now=NOW).summary()
    assert "score 85.7143% (18 of 21 points), pass mark 80%" in line


def test_extra_credit_is_capped_at_100_percent_and_shown_as_such():
    score = Score.from_points(25, 21)
    assert (score.fraction, score.points, score.extra_points) == (1.0, 21.0, 4.0)
    assert score.describe() == "21 of 21 points (100%) + 4 extra credit"
    assert "119" not in score.describe() and "25" not in score.describe()
    credential = issue_credential(KEY, **{**FIELDS, "score": score})
    assert _results(credential) == {"Score": "100", "Points": "21", "Extra credit points": "4"}
    line = verify_credential(credential, now=NOW).summary()
    assert "score 100% (21 of 21 points + 4 extra credit)" in line


def test_late_penalty_comes_off_before_the_cap():
    score = Score.from_points(20, 21, late_penalty=3)
    assert score.points == 17 and score.extra_points == 0 and score.late_penalty == 3
    assert score.describe() == "17 of 21 points (81%), after a late penalty of 3"
    below = Score.from_points(18, 21, late_penalty=2)  # 16 of 21: below 80% although the raw score passes
    with pytest.raises(CertError, match="below the pass mark"):
        issue_credential(KEY, **{**FIELDS, "score": below})
    extra_left = Score.from_points(25, 21, late_penalty=2)
    assert (extra_left.points, extra_left.extra_points) == (21, 2)
    assert Score.from_points(1, 21, late_penalty=5).points == 0  # never negative


def test_nearly_full_marks_never_print_100_percent():
    assert Score.from_points(20.95, 21).describe().endswith("(99%)")


def test_results_are_checked_as_numbers():
    for bad in ("1e400", "-5", "NaN", "8 6", "", "1.2.3", "٨٦"):  # the last: Arabic-Indic digits
        tampered = copy.deepcopy(CREDENTIAL)
        tampered["credentialSubject"]["result"][0]["value"] = bad
        with pytest.raises(CertError, match="decimal number"):
            verify_credential(tampered, now=NOW)
    tampered = copy.deepcopy(CREDENTIAL)
    tampered["credentialSubject"]["result"][0]["value"] = "119"
    with pytest.raises(CertError, match="above its maximum"):
        verify_credential(tampered, now=NOW)


def test_credentials_without_results_still_verify_with_the_narrative():
    """Certificates issued before results existed stay valid; the summary then shows the narrative, escaped."""
    from quizzes.certs.keys import verification_method
    from quizzes.certs.proof import add_proof

    old = copy.deepcopy({k: v for k, v in CREDENTIAL.items() if k != "proof"})
    del old["credentialSubject"]["result"], old["credentialSubject"]["achievement"]["resultDescription"]
    signed = add_proof(old, KEY, verification_method(did_key(KEY.public_key())), old["validFrom"])
    line = verify_credential(signed, now=NOW).summary()
    assert "Passed the graded quiz 'quiz1'" in line and "\n" not in line


# -- eddsa-rdfc-2022 --------------------------------------------------------------------------------------------------

RDFC_CREDENTIAL = issue_credential(KEY, **FIELDS)  # the default suite


def _same_set(before, after) -> bool:
    """Lists with the same distinct items: a JSON-LD set (like `type`) means the same in RDF, in any order, with
    any repetition, so eddsa-rdfc-2022 signs them as one."""
    return isinstance(before, list) and isinstance(after, list) and before != after and \
        set(map(json.dumps, before)) == set(map(json.dumps, after))


def test_rdfc_round_trip_and_any_change_fails():
    # the default: DCC's verifier-core and LearnCard reject eddsa-jcs-2022 (tests/test_cert_interop.py)
    assert RDFC_CREDENTIAL["proof"]["cryptosuite"] == "eddsa-rdfc-2022" and "@context" not in RDFC_CREDENTIAL["proof"]
    v = verify_credential(RDFC_CREDENTIAL, now=NOW)
    assert v.cryptosuite == "eddsa-rdfc-2022" and "18 of 21 points" in v.summary()
    tried = 0
    for path in [p for p in _paths(RDFC_CREDENTIAL) if p]:
        for what, tampered in _mutations(RDFC_CREDENTIAL, path):
            if not what.startswith("del") and path[-1] != "@context" \
                    and _same_set(_get(RDFC_CREDENTIAL, path), _get(tampered, path)):
                continue
            with pytest.raises(CertError):
                verify_credential(tampered, now=NOW)
                pytest.fail(f"verify accepted a changed credential: {what}")
            tried += 1
    assert tried > 100


def test_rdfc_refuses_unsigned_keyword_keys():
    for where in ("top", "nested"):
        tampered = copy.deepcopy(RDFC_CREDENTIAL)
        target = tampered if where == "top" else tampered["credentialSubject"]["achievement"]
        target["@comment"] = "JSON-LD ignores this key, so the signature does not cover it"
        with pytest.raises(CertError, match="starts with '@'"):
            verify_credential(tampered, now=NOW)
