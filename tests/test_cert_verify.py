"""`verify` against hostile files, and the key's and the list's protections: the course's issuer by default, escaped
output, linear cost, the signed revocation list, and the passphrase-encrypted key."""

from __future__ import annotations

import ast
import copy
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import quizzes.certs as certs_pkg
import quizzes.certs.issuer as issuer_module
from quizzes.certs import CertError, Score, issue_credential, keygen, load_private_key
from quizzes.certs.credential import build_credential
from quizzes.certs.display import shown
from quizzes.certs.issuer import write_issuer_file
from quizzes.certs.keys import ENCRYPTED_PEM_HEADER, did_key, verification_method
from quizzes.certs.passphrase import PassphraseSource
from quizzes.certs.proof import add_proof
from quizzes.certs.revocation import load_revocation_list, revoke
from quizzes.certs.verify import verify_file
from quizzes.cli import main

COURSE_KEY = Ed25519PrivateKey.generate()
COURSE_DID = did_key(COURSE_KEY.public_key())
FIELDS = dict(name="Lê Thị B", email="b@example.org", score=Score.parse("19/21"), pass_mark=0.8)
ESC, BIDI = "\x1b", "\u202e"
FAKE = f"minialloc course{ESC}[2K{ESC}[1A\rVALID: signed by the real course{BIDI}gnp.exe\n"


@pytest.fixture(autouse=True)
def course_issuer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = write_issuer_file(tmp_path / "issuer.json", COURSE_DID, "minialloc course")
    monkeypatch.setattr(issuer_module, "default_issuer_path", lambda: path)
    return path


def _write(tmp_path: Path, credential: dict, name: str = "c.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(credential, ensure_ascii=False), encoding="utf-8")
    return path


def _sign(key: Ed25519PrivateKey, unsigned: dict) -> dict:
    return add_proof(unsigned, key, verification_method(did_key(key.public_key())), unsigned["validFrom"])


# -- the course's issuer by default ---------------------------------------------------------------------------------

def test_a_badge_signed_by_any_other_key_fails_by_default(tmp_path: Path):
    own = _write(tmp_path, issue_credential(COURSE_KEY, **FIELDS), "own.json")
    code, line = verify_file(own)
    assert code == 0 and line.endswith("issuer is the course's issuer"), line
    forger = Ed25519PrivateKey.generate()  # a flawless credential, by the forger's own key, under the course's name
    forged = _write(tmp_path, issue_credential(forger, issuer_name="minialloc course", **FIELDS), "forged.json")
    code, line = verify_file(forged)
    assert code == 1 and line.startswith("INVALID: the signature is valid, but it was made by ")
    assert f"not by the course's issuer {COURSE_DID}" in line and "anyone can sign" in line
    assert verify_file(forged, issuer=did_key(forger.public_key()))[0] == 0  # unless that issuer is asked for


def test_without_a_course_issuer_nothing_is_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(issuer_module, "default_issuer_path", lambda: tmp_path / "missing" / "issuer.json")
    code, line = verify_file(_write(tmp_path, issue_credential(COURSE_KEY, **FIELDS)))
    assert code == 1 and "names no course issuer" in line and "--issuer" in line


def test_the_package_default_is_quizzes_issuer_json(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.undo()  # the real default, not this file's fixture
    assert issuer_module.default_issuer_path() == Path(certs_pkg.__file__).resolve().parent.parent / "issuer.json"


def test_keygen_publishes_the_issuer_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    published = tmp_path / "course" / "issuer.json"
    assert main(["keygen", "--out", str(tmp_path / "keys"), "--publish", str(published)]) == 0
    data = json.loads(published.read_text(encoding="utf-8"))
    assert data["format"] == "minialloc-course-issuer" and data["id"].startswith("did:key:z6Mk")
    assert "PRIVATE" not in published.read_text()
    assert main(["keygen", "--out", str(tmp_path / "keys2"), "--publish", str(published)]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err


# -- escaped output --------------------------------------------------------------------------------------------------

def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c in (ESC, BIDI, "\r") or (c == "\n" and text.index(c) != len(text) - 1)]


def test_attacker_text_is_printed_escaped(tmp_path: Path, capsys):
    forger = Ed25519PrivateKey.generate()
    forged = _write(tmp_path, issue_credential(forger, issuer_name=FAKE, **FIELDS))
    code = main(["verify", str(forged)])
    out = capsys.readouterr().out
    assert code == 1 and out.count("\n") == 1 and not _raw_controls(out)
    assert "\\x1b[2K" in out and "\\u202e" in out and "\\x0a" in out
    # the course's own key with an odd issuer name (an instructor's typo): valid, still escaped
    odd = _write(tmp_path, issue_credential(COURSE_KEY, issuer_name=FAKE, **FIELDS), "odd.json")
    code = main(["verify", str(odd)])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("VALID: ") and out.count("\n") == 1 and not _raw_controls(out)


def test_shown_escapes_and_cuts():
    assert shown("a\x1b[31mb") == "a\\x1b[31mb"
    assert shown("x\u202ey\u2066z\u200b") == "x\\u202ey\\u2066z\\u200b"
    assert shown("back\\x1b") == "back\\\\x1b"  # a typed backslash cannot fake an escape
    assert shown("Nguyễn Văn A — 日本") == "Nguyễn Văn A — 日本"
    assert shown("y" * 1000, 10) == "y" * 10 + "…"
    assert shown("\U000e0001") == "\\U000e0001"  # a tag character (format, invisible)


# -- linear cost -----------------------------------------------------------------------------------------------------

VERIFY_PATH = ("credential", "display", "issuer", "keys", "proof", "revocation", "verify", "base58", "rdfc",
               "contexts")


def test_no_regular_expression_on_the_verify_path():
    """The old summary regex backtracked quadratically on a crafted narrative (92 KB: 7.7 s). Nothing on the
    verify path may run a regular expression over the file's text again: none of its modules imports `re`."""
    folder = Path(certs_pkg.__file__).parent
    for name in VERIFY_PATH:
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"re", "regex"}, name


def _crafted(size: int) -> dict:
    """A credential signed by the course key whose narrative is the old regex's worst case."""
    unsigned = build_credential(issuer_did=COURSE_DID, valid_from=datetime(2025, 1, 1, tzinfo=timezone.utc),
                                **FIELDS)
    unit = "graded quiz 'q' with x"
    unsigned["credentialSubject"]["achievement"]["criteria"]["narrative"] = unit * (size // len(unit))
    return _sign(COURSE_KEY, unsigned)


def _python_line_events(path: Path) -> int:
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += 1
        return tracer

    sys.settrace(tracer)
    try:
        code, _ = verify_file(path)
    finally:
        sys.settrace(None)
    assert code == 0
    return count


def test_verify_cost_grows_linearly_with_a_crafted_narrative(tmp_path: Path):
    small = _write(tmp_path, _crafted(50_000), "small.json")
    large = _write(tmp_path, _crafted(800_000), "large.json")  # 16 times larger, under the 1 MiB cap
    code, line = verify_file(large)
    assert code == 0 and "score 90.4762% (19 of 21 points)" in line and len(line) < 600
    small_ops, large_ops = _python_line_events(small), _python_line_events(large)
    # Python steps counted by the tracer: quadratic work would multiply them by 256, linear by at most 16
    assert large_ops <= 16 * small_ops + 10_000, (small_ops, large_ops)


def test_old_credentials_show_their_narrative_cut_and_escaped(tmp_path: Path):
    unsigned = build_credential(issuer_did=COURSE_DID, **FIELDS)
    del unsigned["credentialSubject"]["result"], unsigned["credentialSubject"]["achievement"]["resultDescription"]
    unsigned["credentialSubject"]["achievement"]["criteria"]["narrative"] = FAKE * 5_000
    code, line = verify_file(_write(tmp_path, _sign(COURSE_KEY, unsigned)))
    assert code == 0 and not _raw_controls(line + "\n") and len(line) < 1200 and "…" in line


# -- the revocation list ---------------------------------------------------------------------------------------------

def test_revocation_list(tmp_path: Path, capsys):
    keys = tmp_path / "keys"
    private, _, did = keygen(keys)
    published = tmp_path / "issuer2.json"
    write_issuer_file(published, did, "course")
    key = load_private_key(private)
    first = _write(tmp_path, issue_credential(key, **FIELDS), "first.json")
    second = _write(tmp_path, issue_credential(key, **FIELDS), "second.json")
    lst = tmp_path / "public" / "revoked.json"
    assert main(["revoke", "--key", str(private), "--list", str(lst), "--credential", str(first),
                 "--reason", "copied answers\x1b[2K"]) == 0
    assert "now lists 1 credential(s)" in capsys.readouterr().out
    code, line = verify_file(first, issuer=str(published), revocation_list=lst)
    assert code == 1 and line.startswith("INVALID: the issuer revoked this credential on ")
    assert "copied answers\\x1b[2K" in line
    code, line = verify_file(second, issuer=str(published), revocation_list=lst)
    assert code == 0 and "not revoked as of" in line
    assert verify_file(first, issuer=str(published))[0] == 0  # without the list, revocation is not checked
    # the same id twice, and a list signed by another key, are refused
    with pytest.raises(CertError, match="already revoked"):
        revoke(lst, key, json.loads(first.read_text())["id"])
    with pytest.raises(CertError, match="not the expected issuer's"):
        revoke(lst, Ed25519PrivateKey.generate(), json.loads(second.read_text())["id"])
    # a list with the entry removed by hand no longer verifies
    data = json.loads(lst.read_text())
    data["revoked"] = []
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data))
    code, line = verify_file(first, issuer=str(published), revocation_list=tampered)
    assert code == 1 and "signature does not match" in line
    # a list made by another key for this issuer's name is refused before it is read
    forged = copy.deepcopy(data)
    other = Ed25519PrivateKey.generate()
    forged = add_proof({k: v for k, v in forged.items() if k != "proof"}, other,
                       verification_method(did_key(other.public_key())), forged["updated"])
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    code, line = verify_file(second, issuer=str(published), revocation_list=tmp_path / "forged.json")
    assert code == 1 and "not signed by the issuer's key" in line
    assert len(load_revocation_list(lst, did).entries) == 1


# -- the passphrase-encrypted key ------------------------------------------------------------------------------------

def _secret_file(tmp_path: Path, text: str, name: str = "pass.txt", mode: int = 0o600) -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_keygen_passphrase_encrypts_the_key_at_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    secret = _secret_file(tmp_path, "correct horse battery staple")
    assert main(["keygen", "--out", str(tmp_path / "k"), "--passphrase-file", str(secret)]) == 0
    assert "encrypted" in capsys.readouterr().out
    private = tmp_path / "k" / "issuer-ed25519.pem"
    assert private.read_bytes().startswith(ENCRYPTED_PEM_HEADER)
    # every command that loads it asks for the passphrase
    out = tmp_path / "x.credential.json"
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    assert main(["issue", "--key", str(private), "--name", "X", "--email", "x@example.org", "--score", "20/21",
                 "--out", str(out)]) == 1
    assert "no terminal to ask on" in capsys.readouterr().err and not out.exists()
    wrong = _secret_file(tmp_path, "not the passphrase at all", "wrong.txt")
    assert main(["issue", "--key", str(private), "--name", "X", "--email", "x@example.org", "--score", "20/21",
                 "--out", str(out), "--passphrase-file", str(wrong)]) == 1
    assert "wrong passphrase" in capsys.readouterr().err
    monkeypatch.setenv("ISSUER_PASSPHRASE", "correct horse battery staple")
    assert main(["issue", "--key", str(private), "--name", "X", "--email", "x@example.org", "--score", "20/21",
                 "--out", str(out), "--passphrase-env", "ISSUER_PASSPHRASE"]) == 0
    assert out.exists()
    assert main(["revoke", "--key", str(private), "--list", str(tmp_path / "r.json"), "--credential", str(out),
                 "--passphrase-file", str(secret)]) == 0
    # the prompt, at a terminal
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("getpass.getpass", lambda prompt="": "correct horse battery staple")
    assert isinstance(load_private_key(private), Ed25519PrivateKey)
    capsys.readouterr()


def test_passphrase_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    short = _secret_file(tmp_path, "short")
    assert main(["keygen", "--out", str(tmp_path / "k1"), "--passphrase-file", str(short)]) == 1
    assert "at least 12" in capsys.readouterr().err and not (tmp_path / "k1").exists()
    loose = _secret_file(tmp_path, "a long enough passphrase", "loose.txt", 0o644)
    assert main(["keygen", "--out", str(tmp_path / "k2"), "--passphrase-file", str(loose)]) == 1
    assert "chmod 600" in capsys.readouterr().err
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    answers = iter(["first passphrase here", "second passphrase here"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    assert main(["keygen", "--out", str(tmp_path / "k3"), "--passphrase"]) == 1
    assert "differ" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the passphrase is never an argument's value (ps, shell history)
        main(["keygen", "--out", str(tmp_path / "k4"), "--passphrase", "hunter2hunter2"])
    capsys.readouterr()
    with pytest.raises(CertError, match="not both"):
        PassphraseSource(file=short, env="X").read(purpose="test")
