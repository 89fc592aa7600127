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
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from quizzes.certs.rdfc import canonize
from quizzes.certs.verify import verify_file
from quizzes.cli import main

ROOT = Path(__file__).resolve().parent.parent
INTEROP = ROOT / "tests" / "interop"
STATUS_URL = "https://course.example.org/status-list.json"
DID_WEB, DID_WEB_URL = "did:web:course.example.org", "https://course.example.org/.well-known/did.json"
SCHEMA_URL = "https://purl.imsglobal.org/spec/ob/v3p0/schema/json/ob_v3p0_achievementcredential_schema.json"
CONTROLS = "minialloc course\x01\x08\x0b\x0c\x7f"  # each escaped differently by RDFC-1.0 (\u0001 \b \u000B \f \u007F)


def readme_commands() -> dict[str, list[str]]:
    """quizzes/README.md's `python -m quizzes` certificate commands, by subcommand, as argument lists (continued
    lines joined, optional [...] parts left out)."""
    text = (ROOT / "quizzes" / "README.md").read_text(encoding="utf-8")
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands: dict[str, list[str]] = {}
    for line in block.splitlines():
        words = shlex.split(line.split("  #", 1)[0].replace("[", " [").replace("]", "] "))
        depth, kept = 0, []
        for word in words:
            depth += word.count("[")
            if depth == 0:
                kept.append(word)
            depth -= word.count("]")
        if kept[:3] == ["python", "-m", "quizzes"]:
            commands[kept[3]] = kept[4:]
    return commands


def _quizzes(command: str, places: dict[str, str], *extra: str, replace: dict[str, str] | None = None) -> str:
    """The README's `python -m quizzes COMMAND ...`, its paths moved under a test folder (`places`: prefix ->
    folder), its values changed by `replace` (option -> value) and `extra` options added; what it printed."""
    argv = []
    for word in readme_commands()[command]:
        for prefix, folder in places.items():
            if word.startswith(prefix):
                word = folder + word[len(prefix):]
        argv.append(word)
    for option, value in (replace or {}).items():
        argv[argv.index(option) + 1] = value
    if "--passphrase" in argv or "--key" in argv:
        extra = ("--passphrase-env", "MINIALLOC_TEST_PASSPHRASE", *extra)  # the prompt, answered
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main([command, *argv, *extra])
    assert code == 0, out.getvalue()
    return out.getvalue()


def _node_verify(tmp: Path, credentials: dict[str, Path], status_list: Path, did_web: Path | None = None
                 ) -> dict[str, Any]:
    """verify.mjs on `credentials`, the course's site serving `status_list` (and `did_web` at its did:web URL)."""
    node = shutil.which("node")
    if node is None or not (INTEROP / "node_modules" / ".installed").exists():
        pytest.fail("the independent verifiers are not installed: run `make test` (it runs `npm ci` in "
                    "tests/interop; Debian's nodejs and npm come with `make system-packages`)")
    jobs = tmp / f"jobs-{len(list(tmp.glob('jobs-*')))}.json"
    served = {STATUS_URL: str(status_list)}
    job: dict[str, Any] = {"credentials": {k: str(v) for k, v in credentials.items()}, "served": served}
    if did_web is not None:
        served[DID_WEB_URL] = str(did_web)
        job["didWeb"] = DID_WEB
    jobs.write_text(json.dumps(job))
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
    """The README's commands: keygen --passphrase --publish, status-list, did-web, issue (the default suite, and
    eddsa-jcs-2022, a proof array, an issuer name with control characters on request), revoke; then tampered
    copies."""
    tmp = tmp_path_factory.mktemp("interop")
    places = {"~/.minialloc-issuer": str(tmp / "issuer-keys"), "quizzes/": str(tmp / "quizzes") + "/",
              "site/": str(tmp / "site") + "/", "a.credential.json": str(tmp / "a.credential.json")}
    issuer, status_list = tmp / "quizzes" / "issuer.json", tmp / "quizzes" / "status-list.json"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MINIALLOC_TEST_PASSPHRASE", "a long test passphrase, typed at the prompt")
        _quizzes("keygen", places)
        assert STATUS_URL in readme_commands()["status-list"]
        _quizzes("status-list", places)
        _quizzes("did-web", places)
        files: dict[str, Path] = {}
        for name, extra in (("ada", []), ("bob", []), ("jo", ["--cryptosuite", "eddsa-jcs-2022"]),
                            ("cy", ["--issuer-name", CONTROLS]), ("di", ["--proof-array"])):
            files[name] = tmp / "out" / f"{name}.credential.json"
            _quizzes("issue", places, *extra, replace={"--out": str(files[name]), "--email": f"{name}@example.org"})
        _quizzes("revoke", places, replace={"--credential": str(files["bob"])})
    for what, change in TAMPERINGS.items():
        for genuine in ("ada", "jo"):
            files[f"{genuine} {what}"] = _tamper(files[genuine], tmp / "out" / f"{genuine}-{what}.json", change)
    did_web = tmp / "site" / ".well-known" / "did.json"
    return {"tmp": tmp, "files": files, "issuer": issuer, "status_list": status_list, "did_web": did_web,
            "verdicts": _node_verify(tmp, files, status_list, did_web)}


def test_the_readme_commands_were_run_as_written():
    commands = readme_commands()
    assert {"keygen", "status-list", "did-web", "issue", "certify", "verify", "revoke"} <= set(commands)
    assert "--status-list" in commands["issue"] and "--status-list" in commands["revoke"]
    assert "--cryptosuite" not in commands["issue"]  # the default suite is the one wallets accept


def test_the_course_did_web_document_vouches_for_the_issuer(made):
    """Digital Bazaar's did:web resolver, given the course's domain, finds the key the credentials are signed by."""
    issuer = json.loads(made["files"]["ada"].read_text())["issuer"]["id"]
    resolved = made["verdicts"]["didWeb"]
    assert resolved["id"] == DID_WEB and resolved["alsoKnownAs"] == [issuer], resolved
    assert [k["publicKeyMultibase"] for k in resolved["assertionKeys"]] == [issuer.removeprefix("did:key:")]
    assert resolved["assertionKeys"][0]["type"] == "Multikey"
    code, line = verify_file(made["files"]["ada"], issuer=str(made["did_web"]))
    assert code == 0 and "the issuer in did.json" in line, line


def test_nothing_is_fetched_but_the_course_site(made):
    verdicts = made["verdicts"]
    assert set(verdicts["fetched"]) == {STATUS_URL, DID_WEB_URL}
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
