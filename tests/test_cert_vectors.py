"""The W3C vc-di-eddsa test vectors (TestVectors/eddsa-jcs-2022 and eddsa-rdfc-2022 of the final spec), byte for byte.

The spec publishes the key pair, the unsigned credential, every intermediate value (canonical forms, hashes, the
signature in hex) and the signed credential. Ed25519 is deterministic, so signing the same document with the same
key must give exactly the spec's proofValue, and every intermediate value must match on the way.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from quizzes.certs import CertError
from quizzes.certs.base58 import b58decode, b58encode
from quizzes.certs.contexts import document_loader
from quizzes.certs.keys import public_key_from_did
from quizzes.certs.proof import add_proof, canonical, hash_data, verify_proof
from quizzes.certs.rdfc import canonize

# TestVectors/keyPair.json: multibase base58btc of the multicodec-tagged keys (0xed01 public, 0x8026 private)
PUBLIC_MULTIBASE = "z6MkrJVnaZkeFzdQyMZu1cgjg7k1pZZ6pvBQ7XJPt4swbTQ2"
PRIVATE_MULTIBASE = "z3u2en7t5LR2WtQH5PfFqMqwVHBeXouLzo6haApm8XHqvjxq"
DID = "did:key:" + PUBLIC_MULTIBASE
VERIFICATION_METHOD = f"{DID}#{PUBLIC_MULTIBASE}"
CREATED = "2023-02-24T23:36:38Z"
CONTEXT = ["https://www.w3.org/ns/credentials/v2", "https://www.w3.org/ns/credentials/examples/v2"]
# TestVectors/unsigned.json
UNSIGNED = {
    "@context": CONTEXT,
    "id": "urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33",
    "type": ["VerifiableCredential", "AlumniCredential"],
    "name": "Alumni Credential",
    "description": "A minimum viable example of an Alumni Credential.",
    "issuer": "https://vc.example/issuers/5678",
    "validFrom": "2023-01-01T00:00:00Z",
    "credentialSubject": {"id": "did:example:abcdefgh", "alumniOf": "The School of Examples"},
}
# The examples context is one line ({"@vocab": ...}); it is a test vector's, not the package's, so it lives here.
EXAMPLES_CONTEXT = {"@context": {"@vocab": "https://www.w3.org/ns/credentials/examples#"}}
LOADER = document_loader({CONTEXT[1]: EXAMPLES_CONTEXT})

# TestVectors/eddsa-jcs-2022/
JCS = {
    "proof_canon": (
        '{"@context":["https://www.w3.org/ns/credentials/v2","https://www.w3.org/ns/credentials/examples/v2"],'
        '"created":"2023-02-24T23:36:38Z","cryptosuite":"eddsa-jcs-2022","proofPurpose":"assertionMethod",'
        '"type":"DataIntegrityProof","verificationMethod":"' + VERIFICATION_METHOD + '"}'),
    "doc_canon": (
        '{"@context":["https://www.w3.org/ns/credentials/v2","https://www.w3.org/ns/credentials/examples/v2"],'
        '"credentialSubject":{"alumniOf":"The School of Examples","id":"did:example:abcdefgh"},'
        '"description":"A minimum viable example of an Alumni Credential.",'
        '"id":"urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33","issuer":"https://vc.example/issuers/5678",'
        '"name":"Alumni Credential","type":["VerifiableCredential","AlumniCredential"],'
        '"validFrom":"2023-01-01T00:00:00Z"}'),
    "doc_hash": "59b7cb6251b8991add1ce0bc83107e3db9dbbab5bd2c28f687db1a03abc92f19",
    "proof_hash": "66ab154f5c2890a140cb8388a22a160454f80575f6eae09e5a097cabe539a1db",
    "sig_hex": "407cd12654b33d718ecbb99179a1506daaa849450bf3fc523cce3e1c96f8b80351da3f253d725c6f00b07c9e5448d50b"
               "3ef78012b9ab54255116d069c6dd2808",
    "proof_value": "z2HnFSSPPBzR36zdDgK8PbEHeXbR56YF24jwMpt3R1eHXQzJDMWS93FCzpvJpwTWd3GAVFuUfjoJdcnTMuVor51aX",
}
# TestVectors/eddsa-rdfc-2022/
RDFC = {
    "proof_canon": (
        '_:c14n0 <http://purl.org/dc/terms/created> "2023-02-24T23:36:38Z"'
        '^^<http://www.w3.org/2001/XMLSchema#dateTime> .\n'
        '_:c14n0 <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <https://w3id.org/security#DataIntegrityProof> .\n'
        '_:c14n0 <https://w3id.org/security#cryptosuite> "eddsa-rdfc-2022"'
        '^^<https://w3id.org/security#cryptosuiteString> .\n'
        '_:c14n0 <https://w3id.org/security#proofPurpose> <https://w3id.org/security#assertionMethod> .\n'
        '_:c14n0 <https://w3id.org/security#verificationMethod> <' + VERIFICATION_METHOD + '> .\n'),
    "doc_canon": (
        '<did:example:abcdefgh> <https://www.w3.org/ns/credentials/examples#alumniOf> "The School of Examples" .\n'
        '<urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33> <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> '
        '<https://www.w3.org/2018/credentials#VerifiableCredential> .\n'
        '<urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33> <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> '
        '<https://www.w3.org/ns/credentials/examples#AlumniCredential> .\n'
        '<urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33> <https://schema.org/description> '
        '"A minimum viable example of an Alumni Credential." .\n'
        '<urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33> <https://schema.org/name> "Alumni Credential" .\n'
        '<urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33> <https://www.w3.org/2018/credentials#credentialSubject> '
        '<did:example:abcdefgh> .\n'
        '<urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33> <https://www.w3.org/2018/credentials#issuer> '
        '<https://vc.example/issuers/5678> .\n'
        '<urn:uuid:58172aac-d8ba-11ed-83dd-0b3aef56cc33> <https://www.w3.org/2018/credentials#validFrom> '
        '"2023-01-01T00:00:00Z"^^<http://www.w3.org/2001/XMLSchema#dateTime> .\n'),
    "doc_hash": "517744132ae165a5349155bef0bb0cf2258fff99dfe1dbd914b938d775a36017",
    "proof_hash": "bea7b7acfbad0126b135104024a5f1733e705108f42d59668b05c0c50004c6b0",
    "sig_hex": "4d8e53c2d5b3f2a7891753eb16ca993325bdb0d3cfc5be1093d0a18426f5ef8578cadc0fd4b5f4dd0d1ce0aefd15ab12"
               "0b7a894d0eb094ffda4e6553cd1ed50d",
    "proof_value": "z2YwC8z3ap7yx1nZYCg4L3j3ApHsF8kgPdSb5xoS1VR7vPG3F561B52hYnQF9iseabecm3ijx4K1FBTQsCZahKZme",
}


def _private_key() -> Ed25519PrivateKey:
    raw = b58decode(PRIVATE_MULTIBASE[1:])
    assert raw[:2] == b"\x80\x26" and len(raw) == 34  # multicodec ed25519-priv + the 32-byte seed
    key = Ed25519PrivateKey.from_private_bytes(raw[2:])
    assert "did:key:z" + b58encode(b"\xed\x01" + key.public_key().public_bytes_raw()) == DID
    return key


def _signed(suite: str) -> dict:
    """The spec's signedJCS.json / signedDataInt.json."""
    vector = JCS if suite == "eddsa-jcs-2022" else RDFC
    proof = {"type": "DataIntegrityProof", "cryptosuite": suite, "created": CREATED,
             "verificationMethod": VERIFICATION_METHOD, "proofPurpose": "assertionMethod"}
    if suite == "eddsa-jcs-2022":
        proof["@context"] = CONTEXT
    return copy.deepcopy({**UNSIGNED, "proof": {**proof, "proofValue": vector["proof_value"]}})


def _with_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    # the package's canonicalization uses the bundled contexts only; the vector also names the examples context
    import quizzes.certs.rdfc as rdfc

    original = rdfc.canonize
    monkeypatch.setattr(rdfc, "canonize", lambda doc, loader=None: original(doc, loader or LOADER))


@pytest.mark.parametrize("suite", ["eddsa-jcs-2022", "eddsa-rdfc-2022"])
def test_intermediate_values(suite: str, monkeypatch: pytest.MonkeyPatch):
    _with_loader(monkeypatch)
    vector = JCS if suite == "eddsa-jcs-2022" else RDFC
    config = {"type": "DataIntegrityProof", "cryptosuite": suite, "created": CREATED,
              "verificationMethod": VERIFICATION_METHOD, "proofPurpose": "assertionMethod", "@context": CONTEXT}
    assert canonical(config, suite).decode() == vector["proof_canon"]
    assert canonical(UNSIGNED, suite).decode() == vector["doc_canon"]
    combined = hash_data(config, UNSIGNED, suite)
    assert combined.hex() == vector["proof_hash"] + vector["doc_hash"]
    assert hashlib.sha256(vector["doc_canon"].encode()).hexdigest() == vector["doc_hash"]
    assert _private_key().sign(combined).hex() == vector["sig_hex"]


@pytest.mark.parametrize("suite", ["eddsa-jcs-2022", "eddsa-rdfc-2022"])
def test_sign_gives_the_spec_bytes(suite: str, monkeypatch: pytest.MonkeyPatch):
    _with_loader(monkeypatch)
    secured = add_proof(copy.deepcopy(UNSIGNED), _private_key(), VERIFICATION_METHOD, CREATED, suite)
    assert secured == _signed(suite)
    assert b58decode(secured["proof"]["proofValue"][1:]).hex() == (JCS if suite == "eddsa-jcs-2022" else RDFC)[
        "sig_hex"]


@pytest.mark.parametrize("suite", ["eddsa-jcs-2022", "eddsa-rdfc-2022"])
def test_verify_the_spec_credential_and_refuse_changes(suite: str, monkeypatch: pytest.MonkeyPatch):
    _with_loader(monkeypatch)
    public = public_key_from_did(DID)
    verify_proof(_signed(suite), public)
    changed = _signed(suite)
    changed["credentialSubject"]["alumniOf"] = "Another School"
    with pytest.raises(CertError, match="signature does not match"):
        verify_proof(changed, public)
    other = _signed(suite)
    other["proof"]["cryptosuite"] = "eddsa-rdfc-2022" if suite == "eddsa-jcs-2022" else "eddsa-jcs-2022"
    with pytest.raises(CertError):  # the same signature read under the other suite proves nothing
        verify_proof(other, public)


def test_rdfc_never_fetches_an_unknown_context():
    doc = {**UNSIGNED, "@context": ["https://www.w3.org/ns/credentials/v2", "https://evil.example/ctx"]}
    with pytest.raises(CertError, match="never fetches contexts"):
        canonize(doc)
    with pytest.raises(CertError, match="never fetches contexts"):
        canonize(UNSIGNED)  # the examples context is not bundled: the package's loader refuses it too


def test_rdfc_refuses_indistinguishable_blank_nodes():
    """Blank nodes that only N-degree hashing tells apart (the start of a poison graph) are refused, not hashed."""
    vc = "https://www.w3.org/ns/credentials/v2"
    ring = [{"@id": f"_:b{i}", "https://example.org/next": {"@id": f"_:b{(i + 1) % 6}"}} for i in range(6)]
    with pytest.raises(CertError, match="N-degree"):
        canonize({"@context": [vc], "@graph": ring})
    distinct = [{"@id": f"_:b{i}", "https://example.org/n": str(i)} for i in range(6)]
    assert canonize({"@context": [vc], "@graph": distinct}).count("_:c14n") == 6


def test_rdfc_refuses_a_term_no_context_defines():
    """The final VC 2.0 context has no @vocab: JSON-LD would drop such a key, unsigned. It is refused instead."""
    doc = {"@context": ["https://www.w3.org/ns/credentials/v2"], "id": "urn:x", "type": ["VerifiableCredential"],
           "praise": "an unsigned sentence a verifier reading the JSON would show"}
    with pytest.raises(CertError, match="defined by no context"):
        canonize(doc)
    del doc["praise"]
    assert "VerifiableCredential" in canonize(doc)


def test_bundled_contexts_are_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import quizzes.certs.contexts as contexts

    for url in ("https://www.w3.org/ns/credentials/v2", "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json"):
        assert "@context" in contexts.bundled_context(url)
    altered = tmp_path / "contexts"
    shutil.copytree(contexts.CONTEXT_DIR, altered)
    path = altered / "credentials-v2.jsonld"
    path.write_bytes(path.read_bytes().replace(b"https://schema.org/name", b"https://evil.example/name"))
    monkeypatch.setattr(contexts, "CONTEXT_DIR", altered)
    contexts._bundled_bytes.cache_clear()
    contexts._index.cache_clear()
    try:
        with pytest.raises(CertError, match="pinned SHA-256"):
            contexts.bundled_context("https://www.w3.org/ns/credentials/v2")
    finally:
        contexts._bundled_bytes.cache_clear()
        contexts._index.cache_clear()
