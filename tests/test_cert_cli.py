"""`python -m quizzes keygen | issue | verify`: key files, printable certificates, and clean refusals."""

from __future__ import annotations

import base64
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from quizzes.certs import CertError, load_private_key
from quizzes.certs.credential import verification_id
from quizzes.certs.keys import PRIVATE_KEY_FILE, PUBLIC_DID_FILE, did_key, keygen
from quizzes.cli import main

ROOT = Path(__file__).resolve().parent.parent
# a PEM private key block (plain, OPENSSH, EC, RSA, ENCRYPTED) with its base64 body; built from parts so that this
# file does not contain a marker itself
PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE" + rb" KEY-----([A-Za-z0-9+/=\s]*)-----END")


@pytest.fixture(scope="module")
def issued(tmp_path_factory) -> dict:
    """One key pair (published as the course's issuer.json) and one credential with its printable certificate,
    made through the command line."""
    tmp = tmp_path_factory.mktemp("certs")
    assert main(["keygen", "--out", str(tmp / "keys"), "--publish", str(tmp / "course" / "issuer.json"),
                 "--issuer-name", "GPU course"]) == 0
    key = tmp / "keys" / PRIVATE_KEY_FILE
    out = tmp / "out" / "nguyen.credential.json"
    assert main(["issue", "--key", str(key), "--name", "Nguyễn Văn A", "--email", "a@example.org",
                 "--score", "19/21", "--out", str(out), "--lang", "vi"]) == 0
    return {"tmp": tmp, "key": key, "credential": out, "did": (tmp / "keys" / PUBLIC_DID_FILE).read_text().strip(),
            "issuer_file": tmp / "course" / "issuer.json"}


@pytest.fixture(autouse=True)
def course_issuer(issued, monkeypatch: pytest.MonkeyPatch) -> Path:
    """verify's default issuer: the published issuer.json, as the course's copy in the package would be."""
    import quizzes.certs.issuer as issuer

    monkeypatch.setattr(issuer, "default_issuer_path", lambda: issued["issuer_file"])
    return issued["issuer_file"]


def _verify(path: Path, *extra: str, capsys) -> tuple[int, str]:
    code = main(["verify", str(path), *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_keygen_modes_and_no_overwrite(issued, capsys):
    keys = issued["tmp"] / "keys"
    assert stat.S_IMODE((keys / PRIVATE_KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert issued["did"].startswith("did:key:z6Mk")
    before = (keys / PRIVATE_KEY_FILE).read_bytes()
    capsys.readouterr()
    assert main(["keygen", "--out", str(keys)]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (keys / PRIVATE_KEY_FILE).read_bytes() == before


def test_keygen_refuses_a_git_work_tree(tmp_path: Path):
    (tmp_path / ".git").mkdir()
    with pytest.raises(CertError, match="git work tree"):
        keygen(tmp_path / "sub" / "keys")
    assert not (tmp_path / "sub").exists()


def test_keygen_mode_is_exact_under_a_loose_umask(tmp_path: Path):
    old = os.umask(0)
    try:
        private, _, _ = keygen(tmp_path / "k")
    finally:
        os.umask(old)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_a_readable_key_is_refused(tmp_path: Path):
    private, _, _ = keygen(tmp_path / "k")
    private.chmod(0o644)
    with pytest.raises(CertError, match="chmod 600"):
        load_private_key(private)
    private.chmod(0o600)
    load_private_key(private)
    with pytest.raises(CertError, match="cannot read"):
        load_private_key(tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("not a key")
    (tmp_path / "junk.pem").chmod(0o600)
    with pytest.raises(CertError, match="not a PEM private key"):
        load_private_key(tmp_path / "junk.pem")


def test_printable_certificate(issued):
    credential = json.loads(issued["credential"].read_text(encoding="utf-8"))
    folder = issued["credential"].parent
    html = (folder / "nguyen.certificate.html").read_text(encoding="utf-8")
    vid = verification_id(credential)
    for expected in ("Nguyễn Văn A", "GPU Memory Management and Fragmentation", credential["validFrom"][:10], vid,
                     "Chứng nhận hoàn thành", "python -m quizzes verify nguyen.credential.json"):
        assert expected in html
    png = (folder / "nguyen.certificate.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_issue_refuses_to_overwrite_and_below_pass_mark(issued, capsys):
    key, out = str(issued["key"]), str(issued["credential"])
    capsys.readouterr()
    assert main(["issue", "--key", key, "--name", "X", "--email", "x@example.org", "--score", "20/21",
                 "--out", out]) == 1
    assert "refusing to overwrite" in capsys.readouterr().err
    assert main(["issue", "--key", key, "--name", "X", "--email", "x@example.org", "--score", "60%",
                 "--out", str(issued["tmp"] / "x.json")]) == 1
    assert "below the pass mark" in capsys.readouterr().err
    assert not (issued["tmp"] / "x.json").exists()


def test_verify_valid(issued, capsys):
    code, out = _verify(issued["credential"], capsys=capsys)
    assert code == 0 and out.startswith("VALID: ") and out.count("\n") == 1
    credential = json.loads(issued["credential"].read_text(encoding="utf-8"))
    assert verification_id(credential) in out and "(19 of 21 points), pass mark 80%" in out
    assert f"({issued['did']})" in out and out.endswith("; issuer is the course's issuer\n")
    code, out = _verify(issued["credential"], "--email", "A@example.org", "--name", "Nguyễn Văn A",
                        "--issuer", issued["did"], capsys=capsys)
    assert code == 0 and "issuer is the --issuer given; e-mail and name match" in out
    copy = issued["tmp"] / "published-issuer.json"
    copy.write_bytes(issued["issuer_file"].read_bytes())
    code, out = _verify(issued["credential"], "--issuer", str(copy), capsys=capsys)
    assert code == 0 and "issuer is the issuer in published-issuer.json" in out


def test_verify_identity_and_issuer_mismatch(issued, capsys):
    code, out = _verify(issued["credential"], "--email", "b@example.org", capsys=capsys)
    assert code == 1 and out.startswith("INVALID:") and "e-mail" in out
    code, out = _verify(issued["credential"], "--issuer", "did:key:z6MkOther", capsys=capsys)
    assert code == 1 and "issuer did:key is not valid base58" in out  # a malformed --issuer is refused
    other = did_key(Ed25519PrivateKey.generate().public_key())
    code, out = _verify(issued["credential"], "--issuer", other, capsys=capsys)
    assert code == 1 and f"not by the --issuer given {other}" in out


def _corruptions(credential: dict, text: str) -> dict[str, str | bytes]:
    def changed(**top) -> str:
        return json.dumps({**credential, **top})
    proof_set = changed(proof=[credential["proof"], credential["proof"]])  # an array of ONE is valid (OB 3.0 schema)
    return {
        "truncated": text[: len(text) // 2],
        "empty": "",
        "not utf-8": b"\xff\xfe{\x00",
        "array": "[1, 2, 3]",
        "string": '"credential"',
        "NaN": text.replace('"hashed": true', '"hashed": NaN', 1),
        "duplicate key": text.replace('"type": [', '"type": "x", "type": [', 1),
        "proof is a list of two": proof_set,
        "proof is an empty list": changed(proof=[]),
        "proof is a string": changed(proof="z123"),
        "context is a string": changed(**{"@context": "https://www.w3.org/ns/credentials/v2"}),
        "issuer is a number": changed(issuer=42),
        "issuer id is not a did": changed(issuer={**credential["issuer"], "id": "https://example.org"}),
        "validFrom is a number": changed(validFrom=20251129),
        "validFrom is not a date": changed(validFrom="yesterday"),
        "subject is a list": changed(credentialSubject=[credential["credentialSubject"]]),
        "identifier is an object": changed(credentialSubject={**credential["credentialSubject"], "identifier": {}}),
        "proofValue not base58": changed(proof={**credential["proof"], "proofValue": "z0OIl"}),
        "proofValue too short": changed(proof={**credential["proof"], "proofValue": "z111"}),
        "huge number": changed(evidence=10**400),
        "deeply nested": "[" * 100_000 + "]" * 100_000,
        "too large": " " * (2 << 20) + "{}",
    }


def test_corrupt_credentials_are_refused_cleanly(issued, tmp_path: Path, capsys):
    text = issued["credential"].read_text(encoding="utf-8")
    for name, content in _corruptions(json.loads(text), text).items():
        path = tmp_path / "bad.json"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        code, out = _verify(path, capsys=capsys)
        assert code == 1, name
        assert out.startswith("INVALID: ") and out.count("\n") == 1 and "Traceback" not in out, (name, out)
    for missing in (tmp_path / "nope.json", tmp_path):  # no file; a directory
        code, out = _verify(missing, capsys=capsys)
        assert code == 1 and out.startswith("INVALID: cannot read"), out


def test_verify_in_a_real_process_prints_no_traceback(issued, tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text(issued["credential"].read_text(encoding="utf-8")[:-40], encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("QUIZZES_DEBUG", None)
    for path, code in ((issued["credential"], 0), (bad, 1)):
        done = subprocess.run([sys.executable, "-m", "quizzes", "verify", str(path), "--issuer", issued["did"]],
                              capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == code
        assert "Traceback" not in done.stdout + done.stderr
        assert done.stdout.startswith("VALID: " if code == 0 else "INVALID: ")


def _repository_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True, timeout=60).stdout
        return [ROOT / name for name in listed.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: scan the tree, skipping the venv
        return [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]


def test_no_private_key_in_the_repository(issued):
    generated = issued["key"].read_text()
    body = "".join(generated.splitlines()[1:-1])
    for path in _repository_files():
        if not path.is_file() or path.stat().st_size > 5_000_000:
            continue
        data = path.read_bytes()
        for block in PEM_BLOCK.finditer(data):
            # a marker with a made-up body (a scanner's test fixture) is no key; a body of key-sized DER is
            try:
                der = base64.b64decode(b"".join(block.group(2).split()), validate=True)
            except ValueError:
                continue
            assert len(der) < 40, f"{path} holds a PEM private key"
        assert body.encode() not in data, path
