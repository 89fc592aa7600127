"""The printable certificate shows a learner's name as typed, but never a control character or a bidi override
raw: those are shown as visible escapes in the HTML page and the PNG (quizzes/certs/printable.py)."""

from __future__ import annotations

import io

from quizzes.certs import printable

CREDENTIAL = {
    "credentialSubject": {"achievement": {"name": "GPU Memory\u202e Management"}},
    "validFrom": "2026-12-01T00:00:00Z",
    "issuer": {"id": "did:key:z6Mk\x1b[2Kfake", "name": "Course\u2066 team"},
}
NAME = "Alice \u202eecilA\x1b[31m\u200b"


def test_control_and_bidi_characters_in_names_are_shown_escaped():
    fields = printable._fields(CREDENTIAL, NAME, "19 of 21", "en", "alice\u202e.credential.json")
    assert fields["name"] == "Alice \\u202eecilA\\x1b[31m\\u200b"
    for text in fields.values():
        assert not any(c in text for c in "\u202e\u2066\u200b\x1b"), text
    page = printable.certificate_html(CREDENTIAL, NAME, "19 of 21")
    assert not any(c in page for c in "\u202e\u2066\u200b\x1b")
    assert "Alice \\u202eecilA" in page


def test_png_draws_the_escaped_name(monkeypatch):
    drawn: list[str] = []
    real = printable._fields

    def spy(*args, **kwargs):
        fields = real(*args, **kwargs)
        drawn.extend(fields.values())
        return fields

    monkeypatch.setattr(printable, "_fields", spy)
    out = printable.certificate_png(CREDENTIAL, NAME, "19 of 21", io.BytesIO())
    assert out.getvalue().startswith(b"\x89PNG")
    assert "Alice \\u202eecilA\\x1b[31m\\u200b" in drawn
    assert not any(c in "".join(drawn) for c in "\u202e\u2066\u200b\x1b")
