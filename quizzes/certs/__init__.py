"""Open Badges 3.0 certificates: keys (did:key), eddsa-rdfc-2022 (default) and eddsa-jcs-2022 proofs, credentials,
printable copies, revocation through a W3C Bitstring Status List, the course's did:web document, and certification
from nbgrader's gradebook. The command line is `python -m quizzes` (quizzes.cli)."""

from .credential import Score, Verified, identity_matches, issue_credential, load_credential, verify_credential
from .errors import CertError
from .keys import did_key, keygen, load_private_key

__all__ = ["CertError", "Score", "Verified", "did_key", "identity_matches", "issue_credential", "keygen",
           "load_credential", "load_private_key", "verify_credential"]
