"""The Bitstring Status List (status-list, issue --status-list, revoke --status-list, verify), the proof as an object
or an array, RDFC-1.0's escapes for control characters, and the course's did:web document. The same credentials
checked by independent verifiers: tests/test_cert_interop.py."""

from __future__ import annotations

import base64
import copy
import gzip
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import quizzes.certs.issuer as issuer_module
from quizzes.certs import CertError, Score, issue_credential, verify_credential
from quizzes.certs.credential import verification_id
from quizzes.certs.issuer import did_web, did_web_document, write_issuer_file
from quizzes.certs.keys import did_key
from quizzes.certs.rdfc import canonize, serialize_nquad
from quizzes.certs.status_list import (
    MIN_BITS,
    create_status_list,
    decode_bits,
    encode_bits,
    ledger_path,
    load_status_list,
    read_status_entry,
    revoke_index,
    status_list_credential,
)
from quizzes.certs.verify import verify_file
from quizzes.cli import main

KEY = Ed25519PrivateKey.generate()
DID = did_key(KEY.public_key())
URL = "https://course.example.org/status-list.json"
FIELDS = dict(name="Ada Lovelace", email="ada@example.org", score=Score.parse("18/21"), pass_mark=0.8)
NOW = datetime(2026, 1, 5, 10, 0, tzinfo=timezone.utc)


@pytest.fixture
def published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The course's folder: issuer.json and status-list.json side by side, issuer.json the default."""
    folder = tmp_path / "quizzes"
    issuer = write_issuer_file(folder / "issuer.json", DID, "minialloc course")
    monkeypatch.setattr(issuer_module, "default_issuer_path", lambda: issuer)
    create_status_list(folder / "status-list.json", KEY, URL)
    return folder


def _write(path: Path, credential: dict) -> Path:
    path.write_text(json.dumps(credential, ensure_ascii=False), encoding="utf-8")
    return path


# -- the bitstring ---------------------------------------------------------------------------------------------------

def test_encoded_list_is_multibase_base64url_gzip_with_index_0_leftmost():
    bits = bytearray(MIN_BITS // 8)
    bits[0] = 0x80  # index 0: the most significant bit of the first byte (Bitstring Status List, section 3.2)
    bits[-1] = 0x01  # index 131071
    text = encode_bits(bytes(bits))
    assert text.startswith("u") and "=" not in text and "+" not in text and "/" not in text
    raw = gzip.decompress(base64.urlsafe_b64decode(text[1:] + "=" * (-len(text[1:]) % 4)))
    assert raw == bytes(bits) and decode_bits(text) == bytes(bits)
    signed = status_list_credential(KEY, URL, bytes(bits))
    parsed = load_status_list_from(signed)
    assert parsed.revoked(0) and parsed.revoked(MIN_BITS - 1) and not parsed.revoked(1)
    with pytest.raises(CertError, match="not in it"):
        parsed.revoked(MIN_BITS)


def load_status_list_from(data: dict):
    from quizzes.certs.status_list import parse_status_list

    return parse_status_list(data, DID)


@pytest.mark.parametrize(("text", "reason"), [
    ("z" + "A" * 40, "starting with 'u'"),
    ("u" + base64.urlsafe_b64encode(b"not gzip").decode().rstrip("="), "not base64url GZIP"),
    ("u" + base64.urlsafe_b64encode(gzip.compress(bytes(1024), mtime=0)).decode().rstrip("="), "fewer than the 131072"),
    ("u" + base64.urlsafe_b64encode(gzip.compress(bytes(2 << 20), mtime=0)).decode().rstrip("="), "at most"),
    ("u$$$", "outside base64url"),
], ids=["not multibase base64url", "not gzip", "too short", "inflates too far", "not base64url"])
def test_a_bad_encoded_list_is_refused(text, reason):
    with pytest.raises(CertError, match=reason):
        decode_bits(text)


# -- issuing, revoking, verifying ------------------------------------------------------------------------------------

def test_issue_revoke_verify_through_the_status_list(published: Path, tmp_path: Path, capsys):
    status_list = published / "status-list.json"
    files = []
    for n in range(3):
        out = tmp_path / f"s{n}.credential.json"
        assert main(["issue", "--key", str(keyfile(tmp_path)), "--name", f"S{n}", "--email", f"s{n}@example.org",
                     "--score", "18/21", "--status-list", str(status_list), "--out", str(out)]) == 0
        files.append(out)
    capsys.readouterr()
    entries = [read_status_entry(json.loads(f.read_text())) for f in files]
    assert len({e.index for e in entries}) == 3 and all(e.list_url == URL for e in entries)
    ledger = json.loads(ledger_path(status_list).read_text())["issued"]
    assert {int(i) for i in ledger} == {e.index for e in entries}
    # verify finds the status list published beside issuer.json by itself
    code, line = verify_file(files[0])
    assert code == 0 and "not revoked in its status list" in line, line
    # revoke by credential file and by id (the ledger gives the index)
    assert main(["revoke", "--key", str(keyfile(tmp_path)), "--status-list", str(status_list),
                 "--credential", str(files[0])]) == 0
    first_id = json.loads(files[1].read_text())["id"]
    assert main(["revoke", "--key", str(keyfile(tmp_path)), "--status-list", str(status_list), "--id", first_id]) == 0
    assert f"bit {entries[1].index}" in capsys.readouterr().out
    for revoked in files[:2]:
        code, line = verify_file(revoked)
        assert code == 1 and "revoked this credential" in line, line
    assert verify_file(files[2])[0] == 0
    with pytest.raises(CertError, match="already revoked"):
        revoke_index(status_list, KEY, entries[0].index)
    # without a status list to read, the line says revocation was not checked, and where the list lives
    code, line = verify_file(files[0], issuer=DID)
    assert code == 0 and "revocation not checked" in line and URL in line


def test_revoke_refuses_a_credential_without_status_or_of_another_list(published: Path, tmp_path: Path, capsys):
    status_list = str(published / "status-list.json")
    plain = _write(tmp_path / "plain.json", issue_credential(KEY, **FIELDS))
    other_list = create_status_list(tmp_path / "other" / "status-list.json", KEY, "https://other.example.org/s.json")
    elsewhere = _write(tmp_path / "elsewhere.json", issue_credential(KEY, status_list=other_list, **FIELDS))
    for credential, reason in ((plain, "has no credentialStatus: revoke it with --list"),
                               (elsewhere, "names the status list https://other.example.org/s.json")):
        assert main(["revoke", "--key", str(keyfile(tmp_path)), "--status-list", status_list,
                     "--credential", str(credential)]) == 1
        err = capsys.readouterr().err
        assert reason in err and err.count("\n") == 1, err
    assert main(["revoke", "--key", str(keyfile(tmp_path)), "--status-list", status_list,
                 "--id", "urn:uuid:00000000-0000-0000-0000-000000000000"]) == 1
    assert "has no index in the ledger" in capsys.readouterr().err


def keyfile(tmp_path: Path) -> Path:
    """KEY as a PKCS#8 file of mode 0600, as keygen writes it."""
    from cryptography.hazmat.primitives import serialization

    path = tmp_path / "keys" / "issuer-ed25519.pem"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
    return path


def test_a_status_list_by_another_key_or_for_another_url_is_refused(published: Path, tmp_path: Path):
    status_list = published / "status-list.json"
    credential = _write(tmp_path / "c.json", issue_credential(KEY, status_list=status_list, **FIELDS))
    other = Ed25519PrivateKey.generate()
    forged = status_list_credential(other, URL, bytes(MIN_BITS // 8))
    forged["issuer"] = DID  # claims to be the course's, signed by another key
    code, line = verify_file(credential, status_list=_write(tmp_path / "forged.json", forged))
    assert code == 1 and ("not signed by the issuer's key" in line or "signature does not match" in line), line
    elsewhere = status_list_credential(KEY, "https://elsewhere.example.org/list.json", bytes(MIN_BITS // 8))
    code, line = verify_file(credential, status_list=_write(tmp_path / "elsewhere.json", elsewhere))
    assert code == 1 and "but the credential names" in line, line
    with pytest.raises(CertError, match="refusing to overwrite"):
        create_status_list(status_list, KEY, URL)
    with pytest.raises(CertError, match="not the expected issuer's"):
        revoke_index(status_list, other, 0)


@pytest.mark.parametrize(("dates", "reason"), [
    ({"validFrom": "2099-01-01T00:00:00Z"}, "not valid yet"),
    ({"validUntil": "2020-01-01T00:00:00Z"}, "expired"),
    ({"validFrom": "yesterday"}, "not a date-time"),
])
def test_a_status_list_out_of_its_dates_is_refused(published: Path, tmp_path: Path, dates, reason):
    from quizzes.certs.keys import verification_method
    from quizzes.certs.proof import add_proof

    signed = status_list_credential(KEY, URL, bytes(MIN_BITS // 8))
    unsigned = {**{k: v for k, v in signed.items() if k != "proof"}, **dates}
    dated = add_proof(unsigned, KEY, verification_method(DID), signed["validFrom"], "eddsa-rdfc-2022")
    credential = _write(tmp_path / "c.json", issue_credential(KEY, status_list=published / "status-list.json",
                                                              **FIELDS))
    code, line = verify_file(credential, status_list=_write(tmp_path / "dated.json", dated))
    assert code == 1 and reason in line, line


@pytest.mark.parametrize(("change", "reason"), [
    (lambda s: s.update(statusPurpose="suspension"), "of purpose 'revocation'"),
    (lambda s: s.update(statusListIndex="007", id=f"{URL}#007"), "decimal string"),
    (lambda s: s.update(statusListIndex="99999999", id=f"{URL}#99999999"), "decimal string"),
    (lambda s: s.update(statusListCredential="http://course.example.org/x"), "https:// URL"),
    (lambda s: s.update(id=f"{URL}#1"), "statusListCredential#statusListIndex"),
    (lambda s: s.update(extra="unsigned?"), "one BitstringStatusListEntry"),
])
def test_a_credential_status_that_issue_never_writes_is_refused(published: Path, change, reason):
    credential = issue_credential(KEY, status_list=published / "status-list.json", **FIELDS)
    tampered = copy.deepcopy(credential)
    change(tampered["credentialStatus"])
    with pytest.raises(CertError, match=reason):
        verify_credential(tampered)


# -- the proof as an object or an array ------------------------------------------------------------------------------

def test_proof_as_an_array_of_one_verifies_with_the_same_verification_id():
    credential = issue_credential(KEY, **FIELDS)
    as_array = {**credential, "proof": [credential["proof"]]}
    assert verify_credential(as_array).verification_id == verify_credential(credential).verification_id
    issued = issue_credential(KEY, proof_array=True, **FIELDS)
    assert isinstance(issued["proof"], list) and verify_credential(issued).cryptosuite == "eddsa-rdfc-2022"
    for bad, reason in (([], "array of 0"), ([credential["proof"]] * 2, "array of 2"), (["x"], "JSON object")):
        with pytest.raises(CertError, match=reason):
            verify_credential({**credential, "proof": bad})


# -- control characters in signed strings (RDFC-1.0 canonical N-Quads) -----------------------------------------------

def test_literals_and_iris_are_escaped_as_rdfc_1_0_says():
    """RDFC-1.0 section 4.3 (N-Triples' canonical form): ECHAR for BS, HT, LF, FF, CR, '"' and '\\', UCHAR with
    upper-case hex for the other C0 controls and DEL, nothing else escaped; the same bytes rdf-canonize 5 writes
    (tests/test_cert_interop.py compares whole credentials)."""
    text = "a\x00\x01\x07\x08\t\n\x0b\x0c\r\x0e\x1f\x7f\"\\\x85\u2028é"
    quad = {"subject": {"type": "IRI", "value": "urn:x"}, "predicate": {"type": "IRI", "value": "urn:p"},
            "object": {"type": "literal", "value": text, "datatype": "http://www.w3.org/2001/XMLSchema#string"}}
    assert serialize_nquad(quad) == ('<urn:x> <urn:p> "a\\u0000\\u0001\\u0007\\b\\t\\n\\u000B\\f\\r\\u000E\\u001F'
                                     '\\u007F\\"\\\\\x85\u2028é" .\n')
    iri = {**quad, "object": {"type": "IRI", "value": "urn:a b<c>"}}
    assert serialize_nquad(iri) == "<urn:x> <urn:p> <urn:a\\u0020b\\u003Cc\\u003E> .\n"


def test_a_signed_issuer_name_with_control_characters_round_trips():
    credential = issue_credential(KEY, issuer_name="course\x01\x08\x0b\x0c\x7f", **FIELDS)
    assert '"course\\u0001\\b\\u000B\\f\\u007F"' in canonize({k: v for k, v in credential.items() if k != "proof"})
    verified = verify_credential(credential)
    assert "course\\x01\\x08\\x0b\\x0c\\x7f" in verified.summary()  # shown escaped on the terminal
    tampered = {**credential, "issuer": {**credential["issuer"], "name": "course\x01\x08\x0b\x0c"}}
    with pytest.raises(CertError, match="signature"):
        verify_credential(tampered)
    assert verification_id(credential)


def test_text_that_is_not_unicode_is_refused_at_issue_with_one_line(tmp_path: Path, capsys):
    """A byte that is not UTF-8 on the command line becomes a lone surrogate, which no canonical form can carry."""
    code = main(["issue", "--key", str(keyfile(tmp_path)), "--name", "Zed", "--email", "z@example.org",
                 "--score", "20/21", "--issuer-name", "bad\udcff", "--out", str(tmp_path / "z.json")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: the issuer name bad\\udcff is not valid text") and \
        err.count("\n") == 1, err
    assert not (tmp_path / "z.json").exists()


# -- the course's did:web --------------------------------------------------------------------------------------------

def test_did_web_ids_and_urls():
    assert did_web("course.example.org") == ("did:web:course.example.org",
                                             "https://course.example.org/.well-known/did.json")
    assert did_web("https://Example.org/gpu/") == ("did:web:example.org:gpu", "https://example.org/gpu/did.json")
    for bad in ("", "localhost", "exa mple.org", "example.org/a b", ".example.org", "ex:ample.org"):
        with pytest.raises(CertError, match="not a domain"):
            did_web(bad)


def test_did_web_document_names_the_did_key_and_verify_accepts_it(published: Path, tmp_path: Path, capsys):
    out = tmp_path / "site" / ".well-known" / "did.json"
    assert main(["did-web", "--issuer", str(published / "issuer.json"), "--domain", "course.example.org",
                 "--out", str(out)]) == 0
    assert "https://course.example.org/.well-known/did.json" in capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document == did_web_document("course.example.org", DID)[0]
    method = document["verificationMethod"][0]
    assert document["alsoKnownAs"] == [DID] and method["publicKeyMultibase"] == DID.removeprefix("did:key:")
    assert document["assertionMethod"] == [method["id"]] and method["controller"] == document["id"]
    credential = _write(tmp_path / "c.json", issue_credential(KEY, **FIELDS))
    code, line = verify_file(credential, issuer=str(out))
    assert code == 0 and "the issuer in did.json" in line, line
    # a document that names a key it does not carry, or another key than the credential's, vouches for nothing
    lying = copy.deepcopy(document)
    lying["alsoKnownAs"] = [did_key(Ed25519PrivateKey.generate().public_key())]
    code, line = verify_file(credential, issuer=str(_write(tmp_path / "lying.json", lying)))
    assert code == 1 and "naming one did:key" in line, line
    other, _ = did_web_document("course.example.org", did_key(Ed25519PrivateKey.generate().public_key()))
    code, line = verify_file(credential, issuer=str(_write(tmp_path / "other.json", other)))
    assert code == 1 and "anyone can sign a badge with their own key" in line, line


def test_the_old_revocation_list_still_works_beside_the_status_list(published: Path, tmp_path: Path):
    from quizzes.certs.revocation import revoke

    credential = issue_credential(KEY, status_list=published / "status-list.json", **FIELDS)
    path = _write(tmp_path / "c.json", credential)
    revoke(tmp_path / "revoked.json", KEY, credential["id"], now=NOW)
    code, line = verify_file(path, revocation_list=tmp_path / "revoked.json")
    assert code == 1 and "revoked this credential on 2026-01-05" in line, line
    assert load_status_list(published / "status-list.json", DID).revoked(read_status_entry(credential).index) is False


def test_a_list_beside_issuer_json_for_another_url_leaves_revocation_unchecked(published: Path, tmp_path: Path):
    other_list = create_status_list(tmp_path / "other" / "status-list.json", KEY, "https://other.example.org/s.json")
    credential = _write(tmp_path / "c.json", issue_credential(KEY, status_list=other_list, **FIELDS))
    code, line = verify_file(credential)  # the course's own list, beside issuer.json, is not this credential's
    assert code == 0 and "revocation not checked" in line and "https://other.example.org/s.json" in line, line
    code, line = verify_file(credential, status_list=published / "status-list.json")  # given: it must match
    assert code == 1 and "but the credential names" in line, line
