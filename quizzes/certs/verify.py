"""`verify`'s whole decision, as one function that answers with an exit code and one printable line.

A credential is VALID only when all of these hold: its shape, dates and signature (credential.verify_credential);
its issuer is the one expected, the course's published issuer unless --issuer names another (a flawless
signature by any other key proves nothing about the course); its bit in the issuer's Bitstring Status List is
not set (the list given with --status-list, else the status-list.json published beside the issuer file, when there
is one); it is not on the issuer's older revocation list, when one is given; and the e-mail and name match, when
given. Every string from the file is printed escaped (display.shown), and a file crafted to break the checker
still gets one INVALID line, never a traceback.
"""

from __future__ import annotations

import os
from pathlib import Path

from .credential import identity_matches, load_credential, verify_credential
from .display import shown
from .errors import CertError
from .issuer import describe_source, expected_issuer
from .revocation import load_revocation_list
from .status_list import load_status_list

STATUS_LIST_FILE = "status-list.json"  # what `status-list --out` writes beside issuer.json, by convention


def verify_file(path: Path | str, *, issuer: str | None = None, revocation_list: Path | str | None = None,
                email: str | None = None, name: str | None = None,
                status_list: Path | str | None = None) -> tuple[int, str]:
    """(0, "VALID: ...") or (1, "INVALID: <reason>")."""
    try:
        return _verify(Path(path), issuer, revocation_list, email, name, status_list)
    except CertError as e:
        return 1, f"INVALID: {shown(str(e), 400)}"
    except Exception as e:  # a credential crafted to break the checker must still get a one-line answer
        if os.environ.get("QUIZZES_DEBUG"):
            raise
        return 1, f"INVALID: the file could not be checked ({type(e).__name__}: {shown(str(e), 200)})"


def _published_status_list(source: str) -> Path | None:
    """status-list.json beside the issuer file `verify` read, if there is one."""
    if source == "--issuer":
        return None
    beside = Path(source).parent / STATUS_LIST_FILE
    return beside if beside.is_file() else None


def _verify(path: Path, issuer: str | None, revocation_list: Path | str | None, email: str | None,
            name: str | None, status_list: Path | str | None = None) -> tuple[int, str]:
    expected = expected_issuer(issuer)  # first: without an issuer to compare with, no answer can be VALID
    credential = load_credential(path)
    verified = verify_credential(credential)
    if verified.issuer_did != expected.did:
        return 1, (f"INVALID: the signature is valid, but it was made by {verified.issuer_did} "
                   f"(calling itself {shown(verified.issuer_name, 80)}), not by {describe_source(expected)} "
                   f"{expected.did}: anyone can sign a badge with their own key")
    notes = [f"issuer is {describe_source(expected)}"]
    if verified.status is not None:
        wanted = verified.status.list_url
        beside = _published_status_list(expected.source) if status_list is None else None
        # a list given must be the credential's; the one beside issuer.json may be another list of the issuer's
        current = load_status_list(status_list, expected.did, wanted) if status_list is not None else \
            load_status_list(beside, expected.did) if beside is not None else None
        if current is None or current.url != wanted:
            notes.append(f"revocation not checked: give --status-list FILE, the list published at "
                         f"{shown(wanted, 120)}")
        else:
            if current.revoked(verified.status.index):
                return 1, (f"INVALID: the issuer revoked this credential (bit {verified.status.index} of its status "
                           f"list {shown(current.url, 120)}, signed {shown(current.valid_from, 25)})")
            notes.append(f"not revoked in its status list as of {shown(current.valid_from, 25)}")
    elif status_list is not None:
        notes.append("the credential has no credentialStatus, so the status list given does not cover it")
    if revocation_list is not None:
        revoked = load_revocation_list(revocation_list, expected.did)
        entry = revoked.find(verified.credential_id)
        if entry is not None:
            why = f" ({shown(entry.reason, 120)})" if entry.reason else ""
            return 1, f"INVALID: the issuer revoked this credential on {shown(entry.date, 25)}{why}"
        notes.append(f"not revoked as of {shown(revoked.updated, 25)}")
    failed = identity_matches(credential, email=email, name=name)
    if failed:
        return 1, f"INVALID: the credential is genuine, but was not issued to this {' and '.join(failed)}"
    checked = [w for w, given in (("e-mail", email), ("name", name)) if given]
    if checked:
        notes.append(f"{' and '.join(checked)} match")
    return 0, f"{verified.summary()}; {'; '.join(notes)}"
