"""Data Integrity proofs with the eddsa-jcs-2022 and eddsa-rdfc-2022 cryptosuites (W3C "Data Integrity EdDSA
Cryptosuites v1.0").

Signing (Add Proof, section 3.3 of the spec):
  1. proof configuration = {type: DataIntegrityProof, cryptosuite, created, verificationMethod, proofPurpose},
     plus the document's @context, as the spec's proof configuration step sets it;
  2. hashData = SHA-256(JCS(proof configuration)) || SHA-256(JCS(document without proof));
  3. proofValue = "z" + base58btc(Ed25519 signature of hashData).
JCS is RFC 8785 (the `rfc8785` package): sorted keys, ECMAScript number format, no whitespace.
eddsa-rdfc-2022 is the same with RDF canonicalization (quizzes.certs.rdfc) in place of JCS, and its proof keeps
no @context of its own: the proof configuration borrows the document's while it is canonicalized.

Verifying reverses it: the proof options are the proof minus proofValue. The spec lets a document's @context
merely START with the proof's @context; this verifier demands equality, so nothing in @context is unsigned.
tests/test_cert_vectors.py checks this module against the spec's test vectors for both suites, byte for byte.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .base58 import b58decode, b58encode
from .display import shown
from .errors import CertError

PROOF_TYPE = "DataIntegrityProof"
JCS_SUITE = "eddsa-jcs-2022"
RDFC_SUITE = "eddsa-rdfc-2022"
CRYPTOSUITES = (JCS_SUITE, RDFC_SUITE)
PROOF_PURPOSE = "assertionMethod"


def jcs(value: Any) -> bytes:
    """RFC 8785 canonical JSON; a value JSON cannot hold (NaN, 2**60) is an invalid document."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as e:
        raise CertError(f"the document cannot be canonicalized (RFC 8785): {e}") from None


def canonical(value: dict[str, Any], cryptosuite: str = JCS_SUITE) -> bytes:
    """The bytes a suite hashes: JCS for eddsa-jcs-2022, canonical N-Quads (UTF-8) for eddsa-rdfc-2022."""
    if cryptosuite == JCS_SUITE:
        return jcs(value)
    if cryptosuite == RDFC_SUITE:
        from .rdfc import canonize

        return canonize(value).encode("utf-8")
    raise CertError(f"unknown cryptosuite {cryptosuite!r} (this verifier knows {', '.join(CRYPTOSUITES)})")


def hash_data(proof_config: dict[str, Any], document: dict[str, Any], cryptosuite: str = JCS_SUITE) -> bytes:
    """SHA-256(canonical proof configuration) || SHA-256(canonical document), the bytes Ed25519 signs."""
    return hashlib.sha256(canonical(proof_config, cryptosuite)).digest() + \
        hashlib.sha256(canonical(document, cryptosuite)).digest()


def _config_for_hashing(options: dict[str, Any], document: dict[str, Any], cryptosuite: str) -> dict[str, Any]:
    # both suites canonicalize the proof configuration with the document's @context; jcs keeps it in the proof
    if cryptosuite == RDFC_SUITE and "@context" in document:
        return {**options, "@context": document["@context"]}
    return options


def add_proof(document: dict[str, Any], key: Ed25519PrivateKey, verification_method: str,
              created: str, cryptosuite: str = JCS_SUITE, *, as_array: bool = False) -> dict[str, Any]:
    """A copy of `document` with an eddsa proof of `cryptosuite` (an array of that one proof with `as_array`);
    the document must not have one already."""
    if "proof" in document:
        raise CertError("the document already has a proof")
    if cryptosuite not in CRYPTOSUITES:
        raise CertError(f"unknown cryptosuite {cryptosuite!r} (choose {' or '.join(CRYPTOSUITES)})")
    config: dict[str, Any] = {
        "type": PROOF_TYPE,
        "cryptosuite": cryptosuite,
        "created": created,
        "verificationMethod": verification_method,
        "proofPurpose": PROOF_PURPOSE,
    }
    if cryptosuite == JCS_SUITE and "@context" in document:
        config["@context"] = document["@context"]
    signature = key.sign(hash_data(_config_for_hashing(config, document, cryptosuite), document, cryptosuite))
    proof = {**config, "proofValue": "z" + b58encode(signature)}
    return {**document, "proof": [proof] if as_array else proof}


def single_proof(secured: dict[str, Any]) -> dict[str, Any]:
    """The document's one proof, written as an object or as an array of one (VC Data Integrity allows both; 1EdTech's
    Open Badges 3.0 JSON schema wants the array). A proof set of several is refused: this issuer signs once, and
    a second proof would be one more thing a reader might trust without this verifier checking it."""
    proof = secured.get("proof")
    if isinstance(proof, list):
        if len(proof) != 1:
            raise CertError(f"proof is an array of {len(proof)} proofs: this verifier accepts exactly one")
        proof = proof[0]
    if not isinstance(proof, dict):
        raise CertError("proof must be a JSON object (a DataIntegrityProof), or an array holding one")
    return proof


def verify_proof(secured: dict[str, Any], public_key: Ed25519PublicKey) -> None:
    """Raise CertError saying why, unless `secured` carries a valid eddsa proof (either suite) by `public_key`,
    as an object or an array of one."""
    proof = single_proof(secured)
    if proof.get("type") != PROOF_TYPE:
        raise CertError(f"proof.type must be {PROOF_TYPE!r}, not {proof.get('type')!r}")
    cryptosuite = proof.get("cryptosuite")
    if cryptosuite not in CRYPTOSUITES:
        raise CertError(f"proof.cryptosuite must be one of {', '.join(CRYPTOSUITES)}, not {shown(cryptosuite, 60)}")
    value = proof.get("proofValue")
    if not isinstance(value, str) or not value.startswith("z"):
        raise CertError("proof.proofValue must be a multibase base58btc string starting with 'z'")
    try:
        signature = b58decode(value[1:])
    except ValueError as e:
        raise CertError(f"proof.proofValue is not base58btc: {e}") from None
    if len(signature) != 64:
        raise CertError(f"proof.proofValue holds {len(signature)} bytes, an Ed25519 signature has 64")
    options = {k: v for k, v in proof.items() if k != "proofValue"}
    document = {k: v for k, v in secured.items() if k != "proof"}
    if "@context" in options and options["@context"] != document.get("@context"):
        raise CertError("the document's @context differs from the one in its proof")
    if cryptosuite == RDFC_SUITE and "@context" in options:
        raise CertError("an eddsa-rdfc-2022 proof carries no @context of its own")
    try:
        public_key.verify(signature, hash_data(_config_for_hashing(options, document, cryptosuite), document,
                                               cryptosuite))
    except InvalidSignature:
        raise CertError("the signature does not match: the credential was changed after it was signed, "
                        "or it was signed by another key") from None
