"""course_i18n.english_scan: what counts as an English sentence left in a translated notebook's output."""

from __future__ import annotations

import re

from course_i18n.english_scan import english_sentences

OOM = re.compile(r"CUDA out of memory\. Tried to allocate [\d.]+ [KMG]iB\.")


def test_an_english_line_is_found_once() -> None:
    text = "device 0: 6526 of 6526 allocations at the recorded address\n6526 allocations at the recorded address"
    assert english_sentences(text) == ["allocations at the recorded address"]


def test_translations_code_names_and_kept_terms_pass() -> None:
    assert english_sentences("thiết bị 0: 6526 trên 6526 lần cấp phát nằm ở địa chỉ đã ghi (trace, batch x 0.75)") == []
    assert english_sentences("Gerät 0: 6526 von 6526 Anforderungen an der aufgezeichneten Adresse; die Segmente") == []
    assert english_sentences("expandable_segments:True max_split_size_mb:256 best fit, native, re-laid") == []


def test_the_allow_list_cuts_out_pytorchs_message_and_ends_the_run_there() -> None:
    text = "Lỗi: CUDA out of memory. Tried to allocate 2.00 GiB. the run fails"
    assert english_sentences(text) == ["out of memory. Tried to allocate", "the run fails"]
    assert english_sentences(text, [OOM]) == ["the run fails"]
    assert english_sentences("the state at the first trace entry", ["the first trace entry"]) == ["the state at"]


def test_a_multiple_choice_letter_is_no_word() -> None:
    assert english_sentences("nhóm nhỏ (small pool)? A) một B) hai") == []
    assert english_sentences("small pool or a large one") == ["small pool or a large one"]
