"""Certificates made by the README's commands, checked by verifiers this project did not write.

tests/interop/verify.mjs runs Digital Bazaar's @digitalbazaar/vc (with the eddsa-rdfc-2022 and eddsa-jcs-2022
Data Integrity cryptosuites and @digitalbazaar/vc-bitstring-status-list) and DCC's @digitalcredentials/verifier-core
(the engine of Learner Credential Wallet and VerifierPlus), as tests/interop/package-lock.json pins them (`make test`
runs `npm ci` there), offline: contexts from their npm packages, did:key computed locally, the status list served
from the file `status-list` wrote. Each must accept the genuine credentials, reject every tampered one, and see
the revoked one as revoked; jsonld.js must canonicalize every credential to the same N-Quads as the project.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from quizzes.certs.rdfc import canonize
from quizzes.certs.verify import verify_file
from quizzes.cli import main

INTEROP = Path(__file__).resolve().parent / "interop"
STATUS_URL = "https://course.example.org/status-list.json"
SCHEMA_URL = "https://purl.imsglobal.org/spec/ob/v3p0/schema/json/ob_v3p0_achievementcredential_schema.json"
CONTROLS = "minialloc course\x01\x08\x0b\x0c\x7f"  # each escaped differently by RDFC-1.0 (\u0001 \b \u000B \f \u007F)


def _quizzes(*argv: str) -> str:
    """`python -m quizzes ARGV`, as the README writes it; its output, or the test fails with it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(list(argv))
    assert code == 0, out.getvalue()
    return out.getvalue()


def _node_verify(tmp: Path, credentials: dict[str, Path], status_list: Path) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None or not (INTEROP / "node_modules" / ".installed").exists():
        pytest.fail("the independent verifiers are not installed: run `make test` (it runs `npm ci` in "
                    "tests/interop; Debian's nodejs and npm come with `make system-packages`)")
    jobs = tmp / f"jobs-{len(list(tmp.glob('jobs-*')))}.json"
    jobs.write_text(json.dumps({"credentials": {k: str(v) for k, v in credentials.items()},
                                "statusLists": {STATUS_URL: str(status_list)}}))
    done = subprocess.run([node, str(INTEROP / "verify.mjs"), str(jobs)], capture_output=True, text=True,
                          timeout=600, cwd=INTEROP)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _tamper(source: Path, target: Path, change) -> Path:
    credential = json.loads(source.read_text())
    change(credential)
    target.write_text(json.dumps(credential, indent=2, ensure_ascii=False))
    return target


def _set_status_index(credential: dict[str, Any]) -> None:
    status = credential["credentialStatus"]
    index = (int(status["statusListIndex"]) + 1) % 131072
    status["statusListIndex"], status["id"] = str(index), f"{STATUS_URL}#{index}"


def _other_name(credential: dict[str, Any]) -> None:
    ident = credential["credentialSubject"]["identifier"][1]
    assert ident["identityType"] == "name"
    ident["identityHash"] = "sha256$" + hashlib.sha256(("Mallory" + ident["salt"]).encode()).hexdigest()


def _other_issuer(credential: dict[str, Any]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from quizzes.certs.keys import did_key
    credential["issuer"]["id"] = did_key(Ed25519PrivateKey.generate().public_key())


TAMPERINGS = {
    "score": lambda c: c["credentialSubject"]["result"][0].update(value="100"),
    "name": _other_name,
    "date": lambda c: c.update(validFrom="2020-01-01T00:00:00Z"),
    "issuer name": lambda c: c["issuer"].update(name="Another course"),
    "issuer id": _other_issuer,
    "status": _set_status_index,
}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The README's commands: keygen --publish, status-list, issue (both suites), revoke; then tampered copies."""
    tmp = tmp_path_factory.mktemp("interop")
    keys, published, out = tmp / "issuer-keys", tmp / "quizzes", tmp / "out"
    key = str(keys / "issuer-ed25519.pem")
    issuer, status_list = published / "issuer.json", published / "status-list.json"
    _quizzes("keygen", "--out", str(keys), "--publish", str(issuer))
    _quizzes("status-list", "--key", key, "--url", STATUS_URL, "--out", str(status_list))
    files: dict[str, Path] = {}
    for name, extra in (("ada", []), ("bob", []), ("jo", ["--cryptosuite", "eddsa-jcs-2022"]),
                        ("cy", ["--issuer-name", CONTROLS]), ("di", ["--proof-array"])):
        files[name] = out / f"{name}.credential.json"
        _quizzes("issue", "--key", key, "--name", f"{name.title()} Lovelace", "--email", f"{name}@example.org",
                 "--score", "18/21", "--status-list", str(status_list), "--out", str(files[name]), *extra)
    _quizzes("revoke", "--key", key, "--status-list", str(status_list), "--credential", str(files["bob"]))
    for what, change in TAMPERINGS.items():
        for genuine in ("ada", "jo"):
            files[f"{genuine} {what}"] = _tamper(files[genuine], out / f"{genuine}-{what}.json", change)
    return {"tmp": tmp, "files": files, "issuer": issuer, "status_list": status_list,
            "verdicts": _node_verify(tmp, files, status_list)}


def test_nothing_is_fetched_but_the_status_list(made):
    verdicts = made["verdicts"]
    assert set(verdicts["fetched"]) == {STATUS_URL}
    assert set(verdicts["refused"]) <= {SCHEMA_URL}  # DCC's informational schema check, not part of its verdict
    assert verdicts["unknown"] == []
    assert verdicts["versions"]["@digitalbazaar/vc"] == "7.3.0"
    assert verdicts["versions"]["@digitalcredentials/verifier-core"] == "1.0.0-beta.11"


@pytest.mark.parametrize("name", ["ada", "cy", "di"])
def test_genuine_rdfc_credentials_pass_every_verifier(made, name):
    result = made["verdicts"]["results"][name]
    assert result["digitalBazaar"]["verified"] is True, result
    assert result["digitalBazaar"]["revoked"] is False, result
    assert result["dcc"]["signature"] is True and result["dcc"]["errors"] == [], result
    assert result["dcc"]["revoked"] is False, result
    code, line = verify_file(made["files"][name], issuer=str(made["issuer"]))
    assert code == 0 and "not revoked in its status list" in line, line


def test_the_proof_array_form_is_what_was_asked(made):
    assert isinstance(json.loads(made["files"]["di"].read_text())["proof"], list)
    assert isinstance(json.loads(made["files"]["ada"].read_text())["proof"], dict)


def test_eddsa_jcs_2022_on_request_passes_digital_bazaar_but_not_dcc(made):
    """Why eddsa-rdfc-2022 is the default: DCC's verifier-core has no eddsa-jcs-2022 suite."""
    result = made["verdicts"]["results"]["jo"]
    assert result["digitalBazaar"]["verified"] is True and result["digitalBazaar"]["revoked"] is False, result
    assert any("signature is not valid" in e for e in result["dcc"]["errors"]), result
    assert verify_file(made["files"]["jo"], issuer=str(made["issuer"]))[0] == 0


@pytest.mark.parametrize("name", ["ada", "bob", "jo", "cy", "di"])
def test_jsonld_js_canonicalizes_like_the_project(made, name):
    credential = json.loads(made["files"][name].read_text())
    credential.pop("proof")
    assert made["verdicts"]["results"][name]["canonical"] == canonize(credential)


def test_control_characters_are_escaped_as_rdfc_says_and_accepted(made):
    canonical = made["verdicts"]["results"]["cy"]["canonical"]
    assert '"minialloc course\\u0001\\b\\u000B\\f\\u007F"' in canonical


@pytest.mark.parametrize("what", list(TAMPERINGS))
def test_tampering_fails_in_every_verifier(made, what):
    rdfc, jcs = made["verdicts"]["results"][f"ada {what}"], made["verdicts"]["results"][f"jo {what}"]
    assert rdfc["digitalBazaar"]["verified"] is False, rdfc
    assert jcs["digitalBazaar"]["verified"] is False, jcs
    assert rdfc["dcc"]["signature"] is not True and rdfc["dcc"]["errors"], rdfc
    for name in (f"ada {what}", f"jo {what}"):
        code, line = verify_file(made["files"][name], issuer=str(made["issuer"]))
        assert code == 1 and line.startswith("INVALID: "), line


def test_a_revoked_certificate_fails_here_and_shows_revoked_in_the_status_list(made):
    result = made["verdicts"]["results"]["bob"]
    assert result["digitalBazaar"]["revoked"] is True and result["digitalBazaar"]["statusVerified"] is True, result
    assert result["dcc"]["revoked"] is True, result
    code, line = verify_file(made["files"]["bob"], issuer=str(made["issuer"]))
    assert code == 1 and "revoked this credential" in line, line


def test_a_status_list_edited_by_hand_is_refused_by_every_verifier(made):
    """Clearing the revoked bit without the issuer's key: the list's signature no longer holds."""
    from quizzes.certs.status_list import decode_bits, encode_bits

    forged = copy.deepcopy(json.loads(made["status_list"].read_text()))
    forged["credentialSubject"]["encodedList"] = encode_bits(
        bytes(len(decode_bits(forged["credentialSubject"]["encodedList"]))))
    path = made["tmp"] / "forged-status-list.json"
    path.write_text(json.dumps(forged))
    verdicts = _node_verify(made["tmp"], {"bob": made["files"]["bob"]}, path)["results"]["bob"]
    assert verdicts["digitalBazaar"]["statusVerified"] is False, verdicts
    assert "not verified" in verdicts["digitalBazaar"]["statusError"], verdicts
    assert verdicts["dcc"]["revoked"] is None and verdicts["dcc"]["statusError"], verdicts
    code, line = verify_file(made["files"]["bob"], issuer=str(made["issuer"]), status_list=path)
    assert code == 1 and "signature does not match" in line, line
