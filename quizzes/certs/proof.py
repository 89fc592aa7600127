"""Data Integrity proofs with the eddsa-jcs-2022 cryptosuite (W3C "Data Integrity EdDSA Cryptosuites v1.0").

Signing (Add Proof, section 3.3 of the spec):
  1. proof configuration = {type: DataIntegrityProof, cryptosuite, created, verificationMethod, proofPurpose},
     plus the document's @context, as the spec's proof configuration step sets it;
  2. hashData = SHA-256(JCS(proof configuration)) || SHA-256(JCS(document without proof));
  3. proofValue = "z" + base58btc(Ed25519 signature of hashData).
JCS is RFC 8785 (the `rfc8785` package): sorted keys, ECMAScript number format, no whitespace.

Verifying reverses it: the proof options are the proof minus proofValue. The spec lets a document's @context
merely START with the proof's @context; this verifier demands equality, so nothing in @context is unsigned.
tests/test_cert_credential.py checks this module against the spec's own test vector.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .base58 import b58decode, b58encode
from .errors import CertError

PROOF_TYPE = "DataIntegrityProof"
CRYPTOSUITE = "eddsa-jcs-2022"
PROOF_PURPOSE = "assertionMethod"


def jcs(value: Any) -> bytes:
    """RFC 8785 canonical JSON; a value JSON cannot hold (NaN, 2**60) is an invalid document."""
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as e:
        raise CertError(f"the document cannot be canonicalized (RFC 8785): {e}") from None


def hash_data(proof_config: dict[str, Any], document: dict[str, Any]) -> bytes:
    return hashlib.sha256(jcs(proof_config)).digest() + hashlib.sha256(jcs(document)).digest()


def add_proof(document: dict[str, Any], key: Ed25519PrivateKey, verification_method: str,
              created: str) -> dict[str, Any]:
    """A copy of `document` with an eddsa-jcs-2022 proof; the document must not have one already."""
    if "proof" in document:
        raise CertError("the document already has a proof")
    config: dict[str, Any] = {
        "type": PROOF_TYPE,
        "cryptosuite": CRYPTOSUITE,
        "created": created,
        "verificationMethod": verification_method,
        "proofPurpose": PROOF_PURPOSE,
    }
    if "@context" in document:
        config["@context"] = document["@context"]
    signature = key.sign(hash_data(config, document))
    return {**document, "proof": {**config, "proofValue": "z" + b58encode(signature)}}


def verify_proof(secured: dict[str, Any], public_key: Ed25519PublicKey) -> None:
    """Raise CertError saying why, unless `secured` carries a valid eddsa-jcs-2022 proof by `public_key`."""
    proof = secured.get("proof")
    if not isinstance(proof, dict):
        raise CertError("proof must be one JSON object (a DataIntegrityProof)")
    if proof.get("type") != PROOF_TYPE:
        raise CertError(f"proof.type must be {PROOF_TYPE!r}, not {proof.get('type')!r}")
    if proof.get("cryptosuite") != CRYPTOSUITE:
        raise CertError(f"proof.cryptosuite must be {CRYPTOSUITE!r}, not {proof.get('cryptosuite')!r}")
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
    try:
        public_key.verify(signature, hash_data(options, document))
    except InvalidSignature:
        raise CertError("the signature does not match: the credential was changed after it was signed, "
                        "or it was signed by another key") from None
