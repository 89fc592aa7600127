"""`python -m quizzes`: certificates and the bank's tools.

  keygen   --out DIR [--passphrase] [--publish issuer.json]   the instructor's Ed25519 key pair (mode 0600)
  issue    --key KEY --name N --email E --score S --out FILE   one credential + printable certificate
  certify  --gradebook URL --assignment A --key KEY --out DIR --pass-mark 80%   one per student who passed
  verify   FILE [--issuer DID|FILE] [--status-list FILE] [--revocation-list FILE] [--email E] [--name N]
                                                       offline check
  status-list --key KEY --url URL --out FILE           the issuer's empty, signed Bitstring Status List
  revoke   --key KEY (--status-list FILE | --list FILE) (--id urn:uuid:... | --credential FILE) [--reason R]
                                                       sign a revocation
  did-web  --issuer issuer.json --domain DOMAIN --out did.json   the course's did:web document naming its did:key
  (issue and certify sign with eddsa-rdfc-2022 unless --cryptosuite eddsa-jcs-2022; --status-list FILE gives each
  credential a credentialStatus entry in that list)
  (every command that loads a key takes --passphrase-file FILE or --passphrase-env VAR, or asks at the terminal)
  check    [BANK.json ...] [--private-bank DIR [--quiz Q]]   check the question bank (schema, option-form cues)
  show     --chapter N [--lang vi] [--seed S]           print a chapter's practice questions as text
  build-graded --bank PRIVATE_DIR [--quiz Q] [--secret-file F] [--new-secret] [--out SOURCE_DIR] [--allow-cues]
                                                       the graded quiz's nbgrader source notebook (prompts only)

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
from .certs.passphrase import PassphraseSource
from .certs.proof import CRYPTOSUITES, RDFC_SUITE

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
    k.add_argument("--passphrase", action="store_true",
                   help="encrypt the private key (asked at the terminal, or --passphrase-file/--passphrase-env)")
    k.add_argument("--publish", type=Path, default=None,
                   help="also write the public issuer file verify checks by default (commit it: quizzes/issuer.json)")
    k.add_argument("--issuer-name", default=None, help="the issuer's display name in the published file")
    _passphrase_options(k)

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
    _signing_options(i)

    c = sub.add_parser("certify", help="issue credentials from nbgrader's gradebook")
    c.add_argument("--gradebook", required=True, help="database URL, e.g. sqlite:///gradebook.db")
    c.add_argument("--assignment", required=True)
    c.add_argument("--key", required=True, type=Path)
    c.add_argument("--out", required=True, type=Path, help="folder for the credentials and certificates")
    c.add_argument("--pass-mark", required=True, type=_pass_mark,
                   help="the instructor's pass mark, e.g. 80%% (never read from the gradebook)")
    c.add_argument("--issuer-name", default=None)
    c.add_argument("--lang", choices=("en", "vi", "de"), default="en")
    c.add_argument("--name-order", choices=("given-first", "family-first"), default=None,
                   help="how to join the gradebook's first and last name (default: the order of --lang's language: "
                        "family-first for vi, given-first for en and de)")
    _signing_options(c)

    v = sub.add_parser("verify", help="verify a credential offline")
    v.add_argument("file", type=Path)
    v.add_argument("--email", help="also check that it was issued to this e-mail")
    v.add_argument("--name", help="also check that it was issued to this name")
    v.add_argument("--issuer", help="the issuer to demand: a did:key, an issuer.json file, or the course's did:web "
                                    "document (did.json) (default: the course's, quizzes/issuer.json)")
    v.add_argument("--status-list", type=Path, default=None,
                   help="the issuer's Bitstring Status List credential (default: status-list.json beside the issuer "
                        "file, when there is one)")
    v.add_argument("--revocation-list", type=Path, help="the issuer's signed revocation list: also check this one")

    t = sub.add_parser("status-list", help="create the issuer's signed, empty Bitstring Status List credential")
    t.add_argument("--key", required=True, type=Path)
    t.add_argument("--url", required=True, help="the https URL it will be served at (the credentials name it)")
    t.add_argument("--out", required=True, type=Path, help="the file to write, e.g. quizzes/status-list.json")
    _passphrase_options(t)

    r = sub.add_parser("revoke", help="revoke a credential: set its bit in the status list, or list it")
    r.add_argument("--key", required=True, type=Path)
    lists = r.add_mutually_exclusive_group(required=True)
    lists.add_argument("--status-list", type=Path, help="the Bitstring Status List file the credential names")
    lists.add_argument("--list", type=Path, help="the older revocation list file (created if missing)")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", help="the credential's id (urn:uuid:...)")
    which.add_argument("--credential", type=Path, help="the credential file (its id is taken)")
    r.add_argument("--reason", default="")
    _passphrase_options(r)

    b = sub.add_parser("check", help="check the question bank: its schema, and that no option's form gives it away")
    b.add_argument("files", nargs="*", type=Path, help="bank files (default: the practice bank, quizzes/bank/*.json)")
    b.add_argument("--private-bank", type=Path, default=None, metavar="DIR",
                   help="also check a graded quiz's private bank folder (its single-choice questions)")
    b.add_argument("--quiz", default=None, help="the quiz in the private bank (default: its only one)")

    s = sub.add_parser("show", help="print practice questions as text")
    s.add_argument("--chapter", type=int, required=True)
    s.add_argument("--lang", choices=("en", "vi", "de"), default="en")
    s.add_argument("--seed", default=None)

    d = sub.add_parser("did-web", help="write the course's did:web document, which names its did:key")
    d.add_argument("--issuer", required=True, help="the issuer file (issuer.json) or the did:key")
    d.add_argument("--domain", required=True, help="the course's domain (and path): course.example.org")
    d.add_argument("--out", required=True, type=Path, help="the did.json to write (serve it at the URL printed)")

    g = sub.add_parser("build-graded", help="write a graded quiz's nbgrader source notebook from a private bank")
    g.add_argument("--bank", required=True, type=Path, help="the instructor's private bank folder (never the package)")
    g.add_argument("--quiz", default=None, help="the quiz in the bank (default: its only one)")
    g.add_argument("--secret-file", type=Path, default=None, help="the course secret (default: BANK/course.secret)")
    g.add_argument("--new-secret", action="store_true", help="create the secret file first (refuses to replace one)")
    g.add_argument("--out", type=Path, default=Path("source"),
                   help="the nbgrader course's source folder (default: ./source); writes OUT/QUIZ/QUIZ.ipynb")
    g.add_argument("--allow-cues", action="store_true",
                   help="build even when a strategy without the idea (a length rank, a position, the most "
                        "qualified-looking option) passes the single-choice questions")
    return p


def _passphrase_options(p: argparse.ArgumentParser) -> None:
    # never the passphrase itself as an argument: argv is visible in `ps` and kept in shell history
    p.add_argument("--passphrase-file", type=Path, default=None, help="read the key's passphrase from this file")
    p.add_argument("--passphrase-env", default=None, metavar="VAR", help="read it from this environment variable")


def _signing_options(p: argparse.ArgumentParser) -> None:
    _passphrase_options(p)
    p.add_argument("--cryptosuite", choices=CRYPTOSUITES, default=RDFC_SUITE,
                   help="RDF canonicalization (default: what wallets and 1EdTech's OB 3.0 certification accept) or "
                        "JSON canonicalization")
    p.add_argument("--proof-array", action="store_true",
                   help="write the proof as an array of one, as 1EdTech's OB 3.0 JSON schema wants")
    p.add_argument("--status-list", type=Path, default=None,
                   help="the issuer's status list file (status-list): give each credential a credentialStatus")


def _passphrase(args: argparse.Namespace) -> PassphraseSource:
    return PassphraseSource(file=args.passphrase_file, env=args.passphrase_env)


def _keygen(args: argparse.Namespace) -> int:
    from .certs.credential import DEFAULT_ISSUER_NAME
    from .certs.issuer import write_issuer_file
    from .certs.keys import keygen
    from .certs.passphrase import new_passphrase

    given = args.passphrase_file is not None or args.passphrase_env is not None
    secret = new_passphrase(_passphrase(args)) if args.passphrase or given else None
    private, public, did = keygen(args.out, secret)
    print(f"private key: {private} (mode 0600{', encrypted' if secret else ''}: keep it secret, out of every "
          "repository and out of autograde's reach)")
    print(f"issuer id:   {did}  (also in {public})")
    if args.publish:
        path = write_issuer_file(args.publish, did, args.issuer_name or DEFAULT_ISSUER_NAME)
        print(f"published:   {path} (public: commit it, so that verify checks this issuer by default)")
    return 0


def _issue(args: argparse.Namespace) -> int:
    from .certs.credential import DEFAULT_ISSUER_NAME, Score, issue_credential, verification_id
    from .certs.files import write_credential_files
    from .certs.keys import load_private_key

    key = load_private_key(args.key, _passphrase(args))
    score = Score.parse(args.score)
    credential = issue_credential(key, name=args.name, email=args.email, score=score, pass_mark=args.pass_mark,
                                  issuer_name=args.issuer_name or DEFAULT_ISSUER_NAME, assignment=args.assignment,
                                  cryptosuite=args.cryptosuite, proof_array=args.proof_array,
                                  status_list=args.status_list)
    files = write_credential_files(credential, args.out, name=args.name, score_text=score.describe(args.lang),
                                   lang=args.lang)
    print(f"issued {files[0]} (verification ID {verification_id(credential)}); printable: "
          + ", ".join(str(f) for f in files[1:]))
    return 0


def _certify(args: argparse.Namespace) -> int:
    from .certs.credential import DEFAULT_ISSUER_NAME
    from .certs.gradebook import certify

    outcomes = certify(args.gradebook, args.assignment, args.key, args.out, pass_mark=args.pass_mark,
                       issuer_name=args.issuer_name or DEFAULT_ISSUER_NAME, lang=args.lang,
                       passphrase=_passphrase(args), cryptosuite=args.cryptosuite, proof_array=args.proof_array,
                       status_list=args.status_list, name_order=args.name_order)
    for outcome in outcomes:
        print(outcome.line())
    issued = sum(o.status == "certified" for o in outcomes)
    errors = sum(o.status == "error" for o in outcomes)
    print(f"{issued} credential(s) issued for {args.assignment} at pass mark {args.pass_mark:.0%}, "
          f"{len(outcomes)} student(s) in the gradebook, {errors} error(s)")
    return 1 if errors else 0


def _verify(args: argparse.Namespace) -> int:
    from .certs.verify import verify_file

    code, line = verify_file(args.file, issuer=args.issuer, revocation_list=args.revocation_list,
                             email=args.email, name=args.name, status_list=args.status_list)
    print(line)
    return code


def _status_list(args: argparse.Namespace) -> int:
    from .certs.keys import load_private_key
    from .certs.status_list import create_status_list, ledger_path

    key = load_private_key(args.key, _passphrase(args))
    path = create_status_list(args.out, key, args.url.strip())
    print(f"status list: {path} (signed, nothing revoked; serve it at {args.url.strip()}, commit it beside "
          f"issuer.json); its ledger of issued indices: {ledger_path(path)}")
    return 0


def _revoke_in_status_list(args: argparse.Namespace, credential: dict | None, credential_id: str) -> int:
    from .certs.keys import did_key, load_private_key
    from .certs.status_list import index_of, load_status_list, read_status_entry, revoke_index

    key = load_private_key(args.key, _passphrase(args))
    current = load_status_list(args.status_list, did_key(key.public_key()))
    if credential is not None:
        entry = read_status_entry(credential)
        if entry is None:
            raise CertError(f"{args.credential} has no credentialStatus: revoke it with --list instead")
        if entry.list_url != current.url:
            raise CertError(f"{args.credential} names the status list {entry.list_url}, not {current.url}")
        index = entry.index
    else:
        index = index_of(args.status_list, current.url, credential_id)
    updated = revoke_index(args.status_list, key, index)
    print(f"revoked {credential_id} (bit {index}); {args.status_list} signed again {updated.valid_from}: publish "
          f"it at {updated.url}")
    if args.reason:
        print("the reason is not recorded: a status list holds one bit per credential")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from .certs.credential import load_credential
    from .certs.keys import load_private_key
    from .certs.revocation import revoke

    credential = None
    if args.credential is not None:
        credential = load_credential(args.credential)
        credential_id = credential.get("id")
        if not isinstance(credential_id, str):
            raise CertError(f"{args.credential} has no credential id")
    else:
        credential_id = args.id.strip()
    if args.status_list is not None:
        return _revoke_in_status_list(args, credential, credential_id)
    key = load_private_key(args.key, _passphrase(args))
    revoked = revoke(args.list, key, credential_id, args.reason)
    print(f"revoked {credential_id}; {args.list} now lists {len(revoked.entries)} credential(s), signed "
          f"{revoked.updated}: publish it where verifiers fetch it")
    return 0


def _did_web(args: argparse.Namespace) -> int:
    from .certs.issuer import expected_issuer, write_did_web

    issuer = expected_issuer(args.issuer)
    path, url = write_did_web(args.out, args.domain, issuer.did)
    print(f"wrote {path}: serve it at {url}; it names {issuer.did}, so anyone can check there that a "
          "credential's issuer is the course's")
    return 0


def _check(args: argparse.Namespace) -> int:
    from .bank import load_bank
    from .cues import cue_reports, practice_items, private_items, refusal
    from .graded.private_bank import load_quiz

    bank = load_bank(args.files or None)
    kinds: dict[str, int] = {}
    for q in bank:
        kinds[q.kind] = kinds.get(q.kind, 0) + 1
    reports = cue_reports(practice_items(bank))
    reasons = [refusal("the practice bank", reports)]
    for report in reports:
        print(f"practice bank, {report.line()}")
    if args.private_bank is not None:
        if not args.private_bank.is_dir():
            raise ValueError(f"{args.private_bank}: no such private bank folder")
        quiz = load_quiz(args.private_bank, args.quiz)
        private = cue_reports(private_items(quiz.questions))
        reasons.append(refusal(f"the private bank's quiz {quiz.name!r}", private))
        for report in private:
            print(f"private bank {quiz.name}, {report.line()}")
    failed = [r for r in reasons if r is not None]
    for reason in failed:
        print(f"error: {reason}", file=sys.stderr)
    if failed:
        return 1
    print(f"bank OK: {len(bank)} questions ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
          f"chapters {', '.join(map(str, bank.chapters))}, languages en, vi, de")
    return 0


def _show(args: argparse.Namespace) -> int:
    from . import practice

    print(practice(chapter=args.chapter, lang=args.lang, seed=args.seed, mode="text"))
    return 0


def _build_graded(args: argparse.Namespace) -> int:
    from .graded.build import build, describe, refuse_option_cues
    from .graded.private_bank import load_quiz
    from .graded.secret import default_secret_path, load_secret, new_secret

    if not args.bank.is_dir():
        raise ValueError(f"{args.bank}: no such private bank folder")
    if not args.allow_cues:  # before a new secret is made for a bank that will not be built
        refuse_option_cues(load_quiz(args.bank, args.quiz))
    secret_file = args.secret_file or default_secret_path(args.bank)
    if args.new_secret:
        print(f"new course secret: {new_secret(secret_file)} (mode 0600: keep it with the private bank)")
    path, pool = build(args.bank, load_secret(secret_file), quiz=args.quiz, out_dir=args.out,
                       allow_cues=args.allow_cues)
    print(f"wrote {path}: {describe(pool)}")
    return 0


COMMANDS = {"keygen": _keygen, "issue": _issue, "certify": _certify, "verify": _verify, "revoke": _revoke,
            "status-list": _status_list, "did-web": _did_web, "check": _check, "show": _show,
            "build-graded": _build_graded}


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
