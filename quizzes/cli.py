"""`python -m quizzes`: certificates, the pass mark, and the bank's tools.

  keygen   --out DIR                                   the instructor's Ed25519 key pair (private key mode 0600)
  issue    --key KEY --name N --email E --score S --out FILE   one credential + printable certificate
  certify  --gradebook URL --assignment A --key KEY --out DIR  one per student at or above the pass mark
  verify   FILE [--email E] [--name N] [--issuer DID]  offline check; exit 0 and one line when valid
  passmark --gradebook URL --assignment A [--pass-mark 80%]    record the pass mark in the gradebook
  check    [BANK.json ...]                             check the question bank
  show     --chapter N [--lang vi] [--seed S]           print a chapter's practice questions as text
  build-graded [--quiz quiz1]                          rewrite the graded quiz's nbgrader source notebook

Errors print one line saying why (exit 1; usage errors exit 2), never a traceback; QUIZZES_DEBUG=1 shows it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .bank import BankError
from .certs.errors import CertError

DEFAULT_PASS_MARK = 0.8


def _pass_mark(text: str) -> float:
    t = text.strip().removesuffix("%")
    try:
        value = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"pass mark {text!r}: write 0.8 or 80%") from None
    value = value / 100 if text.strip().endswith("%") or value > 1 else value
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"pass mark {text!r} must lie in (0, 100%]")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m quizzes", description="Quizzes and certificates for minialloc.")
    sub = p.add_subparsers(dest="command", required=True)

    k = sub.add_parser("keygen", help="make the instructor's Ed25519 key pair")
    k.add_argument("--out", required=True, type=Path, help="folder for the key files (outside any repository)")

    i = sub.add_parser("issue", help="issue one credential")
    i.add_argument("--key", required=True, type=Path, help="the private key file from keygen")
    i.add_argument("--name", required=True, help="the learner's name (printed, hashed in the credential)")
    i.add_argument("--email", required=True, help="the learner's e-mail (only its salted hash is stored)")
    i.add_argument("--score", required=True, help="18/21, 86%% or 0.86")
    i.add_argument("--out", required=True, type=Path, help="the credential file to write (JSON)")
    i.add_argument("--pass-mark", type=_pass_mark, default=DEFAULT_PASS_MARK, help="default 80%%")
    i.add_argument("--assignment", default="quiz1")
    i.add_argument("--issuer-name", default=None)
    i.add_argument("--lang", choices=("en", "vi", "de"), default="en", help="language of the printed certificate")

    c = sub.add_parser("certify", help="issue credentials from nbgrader's gradebook")
    c.add_argument("--gradebook", required=True, help="database URL, e.g. sqlite:///gradebook.db")
    c.add_argument("--assignment", required=True)
    c.add_argument("--key", required=True, type=Path)
    c.add_argument("--out", required=True, type=Path, help="folder for the credentials and certificates")
    c.add_argument("--issuer-name", default=None)
    c.add_argument("--lang", choices=("en", "vi", "de"), default="en")

    v = sub.add_parser("verify", help="verify a credential offline")
    v.add_argument("file", type=Path)
    v.add_argument("--email", help="also check that it was issued to this e-mail")
    v.add_argument("--name", help="also check that it was issued to this name")
    v.add_argument("--issuer", help="also check that this did:key issued it (the course's published issuer id)")

    m = sub.add_parser("passmark", help="record an assignment's pass mark in the gradebook")
    m.add_argument("--gradebook", required=True)
    m.add_argument("--assignment", required=True)
    m.add_argument("--pass-mark", type=_pass_mark, default=None, help="default: the quiz's own (80%% for quiz1)")

    b = sub.add_parser("check", help="check the question bank")
    b.add_argument("files", nargs="*", type=Path)

    s = sub.add_parser("show", help="print practice questions as text")
    s.add_argument("--chapter", type=int, required=True)
    s.add_argument("--lang", choices=("en", "vi", "de"), default="en")
    s.add_argument("--seed", default=None)

    g = sub.add_parser("build-graded", help="rewrite the graded quiz's nbgrader source notebook from the bank")
    g.add_argument("--quiz", default="quiz1")
    return p


def _keygen(args: argparse.Namespace) -> int:
    from .certs.keys import keygen

    private, public, did = keygen(args.out)
    print(f"private key: {private} (mode 0600: keep it secret, out of every repository)")
    print(f"issuer id:   {did}  (also in {public})")
    return 0


def _issue(args: argparse.Namespace) -> int:
    from .certs.credential import DEFAULT_ISSUER_NAME, Score, issue_credential, verification_id
    from .certs.files import write_credential_files
    from .certs.keys import load_private_key

    key = load_private_key(args.key)
    score = Score.parse(args.score)
    credential = issue_credential(key, name=args.name, email=args.email, score=score, pass_mark=args.pass_mark,
                                  issuer_name=args.issuer_name or DEFAULT_ISSUER_NAME, assignment=args.assignment)
    files = write_credential_files(credential, args.out, name=args.name, score_text=score.describe(args.lang),
                                   lang=args.lang)
    print(f"issued {files[0]} (verification ID {verification_id(credential)}); printable: "
          + ", ".join(str(f) for f in files[1:]))
    return 0


def _certify(args: argparse.Namespace) -> int:
    from .certs.credential import DEFAULT_ISSUER_NAME
    from .certs.gradebook import certify

    outcomes = certify(args.gradebook, args.assignment, args.key, args.out,
                       issuer_name=args.issuer_name or DEFAULT_ISSUER_NAME, lang=args.lang)
    for outcome in outcomes:
        print(outcome.line())
    issued = sum(o.status == "certified" for o in outcomes)
    print(f"{issued} credential(s) issued for {args.assignment}, {len(outcomes)} student(s) in the gradebook")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .certs.credential import identity_matches, load_credential, verify_credential

    try:
        credential = load_credential(args.file)
        verified = verify_credential(credential)
        failed = identity_matches(credential, email=args.email, name=args.name)
    except CertError as e:
        print(f"INVALID: {e}")
        return 1
    except Exception as e:  # a credential crafted to break the checker must still get a one-line answer
        if os.environ.get("QUIZZES_DEBUG"):
            raise
        print(f"INVALID: the file could not be checked ({type(e).__name__}: {e})")
        return 1
    if failed:
        print(f"INVALID: the credential is genuine, but was not issued to this {' and '.join(failed)}")
        return 1
    if args.issuer and args.issuer.strip() != verified.issuer_did:
        print(f"INVALID: the signature is valid, but the issuer is {verified.issuer_did}, not {args.issuer.strip()}")
        return 1
    checked = [w for w, given in (("e-mail", args.email), ("name", args.name), ("issuer", args.issuer)) if given]
    print(verified.summary() + (f"; {' and '.join(checked)} match" if checked else ""))
    return 0


def _passmark(args: argparse.Namespace) -> int:
    from .certs.gradebook import record_pass_mark
    from .graded import QUIZZES

    pass_mark = args.pass_mark
    if pass_mark is None:
        if args.assignment not in QUIZZES:
            raise CertError(f"{args.assignment!r} is not one of this package's quizzes: give --pass-mark")
        pass_mark = QUIZZES[args.assignment].pass_mark
    record_pass_mark(args.gradebook, args.assignment, pass_mark)
    print(f"pass mark of {args.assignment}: {pass_mark:.0%}, recorded in {args.gradebook}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from .bank import load_bank

    bank = load_bank(args.files or None)
    kinds: dict[str, int] = {}
    for q in bank:
        kinds[q.kind] = kinds.get(q.kind, 0) + 1
    print(f"bank OK: {len(bank)} questions ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
          f"chapters {', '.join(map(str, bank.chapters))}, languages en, vi, de")
    return 0


def _show(args: argparse.Namespace) -> int:
    from . import practice

    print(practice(chapter=args.chapter, lang=args.lang, seed=args.seed, mode="text"))
    return 0


def _build_graded(args: argparse.Namespace) -> int:
    from .graded import quiz
    from .graded.build import write

    print(f"wrote {write(quiz(args.quiz))}")
    return 0


COMMANDS = {"keygen": _keygen, "issue": _issue, "certify": _certify, "verify": _verify, "passmark": _passmark,
            "check": _check, "show": _show, "build-graded": _build_graded}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (CertError, BankError, KeyError, ValueError) as e:
        if os.environ.get("QUIZZES_DEBUG"):
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"error: {message}", file=sys.stderr)
        return 1
