"""Chapter 5 (diagnosing a real run): the exercise checkers, each run on snapshots with known answers.

Exercise c5-who-holds: find who holds the memory in a snapshot: the bytes of live blocks grouped by the top user
frame that allocated them. Exercise c5-pinned: the segments that are mostly free but pinned by live blocks (none
of them can go back to the device). Each is checked on snapshots built from minialloc runs with stack frames of
three kinds (the program's Python, C++ only from the backward pass, none at all), and on the chapter's real
snapshot when it is present beside the course.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..allocator import CachingAllocator
from ..device import SimulatedGPU
from ..sizes import KiB, MiB, format_size
from ..snapshot import load_snapshot
from ..trace import top_user_frame
from . import NotYet, Wrong, call, expect, say

__all__ = ["REAL_SNAPSHOT", "TEXT", "WHY", "check_pinned_segments", "check_who_holds", "practice_snapshots", "why"]

# Every sentence a learner reads from this chapter's checkers, in the course's three languages (minialloc.lang).
TEXT: dict[str, dict[str, str]] = {
    # the German name is dative: the sentences below say "bei {name}" and "von {name}"
    "run_name": {"en": "a minialloc run ({config})", "vi": "một lần chạy minialloc ({config})",
                 "de": "einem minialloc-Lauf ({config})"},
    "not_dict": {"en": "on {name}, who_holds returned a {type}, not a dict",
                 "vi": "trên {name}, who_holds trả về một {type}, không phải dict",
                 "de": "bei {name} gab who_holds ein {type} zurück, kein dict"},
    "not_dict_hint": {"en": "return a dict such as {{'forward (train.py:41)': 123456, ...}}",
                      "vi": "hãy trả về một dict như {{'forward (train.py:41)': 123456, ...}}",
                      "de": "geben Sie ein dict wie {{'forward (train.py:41)': 123456, ...}} zurück"},
    "extra_key": {
        "en": "on {name}, your dict has the key {key}, which is the top user frame of no live block",
        "vi": "trên {name}, dict của bạn có khóa {key}, nhưng đó không phải frame người dùng trên cùng của khối "
              "đang dùng nào",
        "de": "bei {name} enthält Ihr dict den Schlüssel {key}, der oberster Benutzer-Frame keines belegten "
              "Blocks ist",
    },
    "extra_key_hint": {
        "en": "name each block with top_user_frame(block['frames']), and count only live blocks",
        "vi": "hãy đặt tên cho từng khối bằng top_user_frame(block['frames']), và chỉ đếm các khối đang dùng",
        "de": "benennen Sie jeden Block mit top_user_frame(block['frames']) und zählen Sie nur belegte Blöcke",
    },
    "missing_key": {"en": "on {name}, no entry for {key}, which holds live blocks",
                    "vi": "trên {name}, không có mục nào cho {key}, dù nó đang giữ các khối đang dùng",
                    "de": "bei {name} fehlt ein Eintrag für {key}, das belegte Blöcke hält"},
    "missing_key_hint": {
        "en": "every active_allocated block counts, including those whose frames are empty or C++ only",
        "vi": "mọi khối active_allocated đều được tính, kể cả những khối có frames rỗng hoặc chỉ có C++",
        "de": "jeder Block im Zustand active_allocated zählt, auch solche, deren frames leer sind oder nur C++ "
              "enthalten",
    },
    "pending_hint": {
        "en": "blocks in state 'active_pending_free' were freed by the program (they only wait for another "
              "stream): they are not live",
        "vi": "các khối ở trạng thái 'active_pending_free' đã được chương trình giải phóng (chúng chỉ đang chờ một "
              "luồng CUDA khác): chúng không còn được dùng",
        "de": "Blöcke im Zustand 'active_pending_free' hat das Programm freigegeben (sie warten nur auf einen "
              "anderen Stream): sie sind nicht belegt",
    },
    "every_block_hint": {
        "en": "you counted every block of the segments, free ones too: the question is who holds memory now, so "
              "only live blocks (state 'active_allocated') count",
        "vi": "bạn đã đếm mọi khối của các phân đoạn, cả khối trống: câu hỏi là ai đang giữ bộ nhớ lúc này, nên "
              "chỉ các khối đang dùng (trạng thái 'active_allocated') được tính",
        "de": "Sie haben jeden Block der Segmente gezählt, auch freie: gefragt ist, wer jetzt Speicher hält, also "
              "zählen nur belegte Blöcke (Zustand 'active_allocated')",
    },
    "size_hint": {
        "en": "add the blocks' 'size' (what they hold), not 'requested_size', for state 'active_allocated' only",
        "vi": "hãy cộng 'size' của các khối (lượng chúng giữ), không phải 'requested_size', và chỉ với trạng thái "
              "'active_allocated'",
        "de": "addieren Sie die 'size' der Blöcke (was sie belegen), nicht 'requested_size', und nur für den "
              "Zustand 'active_allocated'",
    },
    "bytes_wrong": {"en": "on {name}, the bytes for {key} are not what its live blocks hold",
                    "vi": "trên {name}, số byte của {key} không bằng lượng mà các khối đang dùng của nó giữ",
                    "de": "bei {name} stimmen die Bytes für {key} nicht mit dem überein, was seine belegten "
                          "Blöcke halten"},
    "who_passed": {"en": "on {name}, the largest holder is {holder} with {size}",
                   "vi": "trên {name}, nơi giữ nhiều bộ nhớ nhất là {holder} với {size}",
                   "de": "bei {name} hält {holder} am meisten, nämlich {size}"},
    "not_list": {"en": "on {name}, pinned_segments returned a {type}, not a list",
                 "vi": "trên {name}, pinned_segments trả về một {type}, không phải list",
                 "de": "bei {name} gab pinned_segments ein {type} zurück, keine Liste"},
    "not_list_hint": {"en": "return a list of segment addresses (ints), sorted",
                      "vi": "hãy trả về một list địa chỉ phân đoạn (int), đã sắp xếp",
                      "de": "geben Sie eine sortierte Liste von Segmentadressen (ints) zurück"},
    "unsorted": {"en": "on {name}, your addresses are not sorted",
                 "vi": "trên {name}, các địa chỉ của bạn chưa được sắp xếp",
                 "de": "bei {name} sind Ihre Adressen nicht sortiert"},
    "unsorted_hint": {"en": "return sorted(addresses)", "vi": "hãy trả về sorted(addresses)",
                      "de": "geben Sie sorted(addresses) zurück"},
    "not_segment": {"en": "on {name}, {address} is not the address of a segment",
                    "vi": "trên {name}, {address} không phải địa chỉ của một phân đoạn",
                    "de": "bei {name} ist {address} keine Segmentadresse"},
    "not_segment_hint": {"en": "use segment['address'], the start of the segment",
                         "vi": "hãy dùng segment['address'], địa chỉ đầu của phân đoạn",
                         "de": "nehmen Sie segment['address'], den Anfang des Segments"},
    "not_pinned": {
        "en": "on {name} with min_free_fraction={fraction}, the segment at {address} is in your list but is not "
              "pinned",
        "vi": "trên {name} với min_free_fraction={fraction}, phân đoạn ở {address} có trong list của bạn nhưng "
              "không bị giữ chặt",
        "de": "bei {name} mit min_free_fraction={fraction} steht das Segment bei {address} in Ihrer Liste, ist "
              "aber nicht festgehalten",
    },
    "wholly_free_hint": {
        "en": "a wholly free segment is not pinned: empty_cache() can give it back",
        "vi": "phân đoạn trống hoàn toàn thì không bị giữ chặt: empty_cache() trả lại được",
        "de": "ein ganz freies Segment ist nicht festgehalten: empty_cache() kann es zurückgeben",
    },
    "fraction_hint": {
        "en": "compare the freed bytes (blocks in any state but active_allocated) with min_free_fraction * "
              "segment['total_size']",
        "vi": "hãy so sánh số byte đã giải phóng (các khối ở mọi trạng thái trừ active_allocated) với "
              "min_free_fraction * segment['total_size']",
        "de": "vergleichen Sie die freigegebenen Bytes (Blöcke in jedem Zustand außer active_allocated) mit "
              "min_free_fraction * segment['total_size']",
    },
    "missing_pinned": {
        "en": "on {name} with min_free_fraction={fraction}, the segment at {address} is pinned but not in your list",
        "vi": "trên {name} với min_free_fraction={fraction}, phân đoạn ở {address} bị giữ chặt nhưng không có "
              "trong list của bạn",
        "de": "bei {name} mit min_free_fraction={fraction} ist das Segment bei {address} festgehalten, fehlt aber "
              "in Ihrer Liste",
    },
    "missing_pinned_hint": {
        "en": "the freed bytes are those of every block the program has freed: 'inactive' and also "
              "'active_pending_free' (waiting only for another stream); and 'at least' includes the fraction itself",
        "vi": "số byte đã giải phóng là của mọi khối mà chương trình đã giải phóng: 'inactive' và cả "
              "'active_pending_free' (chỉ đang chờ một luồng CUDA khác); và 'ít nhất' bao gồm cả đúng tỉ lệ đó",
        "de": "die freigegebenen Bytes sind die aller Blöcke, die das Programm freigegeben hat: 'inactive' und auch "
              "'active_pending_free' (wartet nur auf einen anderen Stream); und 'mindestens' schließt den Anteil "
              "selbst ein",
    },
    "pending_pins_hint": {
        "en": "only a live block (active_allocated) pins a segment: a block in active_pending_free only waits for "
              "another stream, and empty_cache() and the OOM retry synchronize before they release",
        "vi": "chỉ khối đang dùng (active_allocated) mới giữ chặt phân đoạn: khối ở trạng thái active_pending_free "
              "chỉ đang chờ một luồng CUDA khác, và empty_cache() cũng như lần thử lại khi OOM đều đồng bộ hóa trước "
              "khi trả bộ nhớ",
        "de": "nur ein belegter Block (active_allocated) hält ein Segment fest: ein Block in active_pending_free "
              "wartet nur auf einen anderen Stream, und empty_cache() wie auch der Wiederholungsversuch nach einem "
              "OOM synchronisieren, bevor sie freigeben",
    },
    "at_least_hint": {
        "en": "this segment's free share is exactly min_free_fraction: 'at least' includes the fraction itself",
        "vi": "phần trống của phân đoạn này đúng bằng min_free_fraction: 'ít nhất' bao gồm cả đúng tỉ lệ đó",
        "de": "der freie Anteil dieses Segments ist genau min_free_fraction: 'mindestens' schließt den Anteil "
              "selbst ein",
    },
    "none_found": {"en": "no pinned segment was found in the practice snapshots",
                   "vi": "không tìm thấy phân đoạn bị giữ chặt nào trong các snapshot luyện tập",
                   "de": "in den Übungs-Snapshots wurde kein festgehaltenes Segment gefunden"},
    "pinned_passed": {"en": "{n} segments of {name} are at least half free and still pinned",
                      "vi": "{n} phân đoạn của {name} trống ít nhất một nửa mà vẫn bị giữ chặt",
                      "de": "{n} Segmente von {name} sind mindestens zur Hälfte frei und trotzdem festgehalten"},
}

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY: dict[str, dict[str, str]] = {
    "c5-from-empty": {
        "en": "the tensors allocated before the first entry (the model, its gradients, the optimizer's state) and the"
              " segments that held them are missing from an empty-GPU replay, so its figures describe no run that "
              "happened. A replay must start from the state at the first trace entry.",
        "vi": "các tensor được cấp phát trước mục đầu tiên (mô hình, gradient của nó, trạng thái của bộ tối ưu) cùng "
              "các phân đoạn chứa chúng đều vắng mặt trong lần phát lại từ GPU trống, nên các con số của nó không mô "
              "tả lần chạy nào đã thực sự diễn ra. Một lần phát lại phải bắt đầu từ trạng thái tại mục đầu tiên của "
              "trace.",
        "de": "die Tensoren, die vor dem ersten Eintrag angelegt wurden (das Modell, seine Gradienten, der Zustand "
              "des Optimierers), und die Segmente, die sie hielten, fehlen in einem Replay ab leerer GPU; seine "
              "Zahlen beschreiben also keinen Lauf, den es je gegeben hat. Ein Replay muss vom Zustand beim ersten "
              "Trace-Eintrag ausgehen.",
    },
    "c5-check": {
        "en": "minialloc's allocator follows PyTorch's rules (best fit per stream, splitting, merging, rounding), so "
              "from the same state the same requests get the same blocks. Any divergence would be printed with its "
              "trace entry. This is what makes the what-if answers below worth trusting.",
        "vi": "bộ cấp phát của minialloc tuân theo các quy tắc của PyTorch (best fit theo từng luồng CUDA (stream), "
              "tách khối, gộp khối, làm tròn), nên từ cùng một trạng thái, cùng những yêu cầu sẽ nhận đúng những khối"
              " ấy. Chỗ nào lệch sẽ được in ra kèm mục trace tương ứng. Chính điều này khiến các câu trả lời \"nếu… "
              "thì sao\" bên dưới đáng tin cậy.",
        "de": "der Allokator von minialloc folgt den Regeln von PyTorch (Best Fit je Stream, Aufteilen, Verschmelzen,"
              " Runden); vom selben Zustand aus bekommen dieselben Anforderungen also dieselben Blöcke. Jede "
              "Abweichung würde mit ihrem Trace-Eintrag ausgegeben. Deshalb kann man den Was-wäre-wenn-Antworten "
              "weiter unten trauen.",
    },
    "c5-new-segments": {
        "en": "a training loop repeats the same allocations every step, so after the first steps every request is "
              "served from cached blocks: the cache is warm. Steady state is what a caching allocator is for.",
        "vi": "một vòng lặp huấn luyện lặp lại đúng các lần cấp phát ấy ở mỗi bước, nên sau vài bước đầu, mọi yêu cầu"
              " đều được đáp ứng từ các khối trong bộ nhớ đệm: bộ nhớ đệm đã \"nóng\". Trạng thái ổn định này chính là "
              "lý do bộ cấp phát bộ nhớ đệm (caching allocator) tồn tại.",
        "de": "eine Trainingsschleife wiederholt in jedem Schritt dieselben Anforderungen; nach den ersten Schritten "
              "wird also jede aus Blöcken im Cache bedient: Der Cache ist warm. Für genau diesen eingeschwungenen "
              "Zustand ist ein Caching-Allokator da.",
    },
}


def why(pid: str, **fields: object) -> str:
    """The explanation of prediction ``pid`` in the notebook's language, with the measured ``fields`` filled in."""
    return say(WHY, pid, **fields)

REAL_SNAPSHOT = Path(__file__).resolve().parents[2] / "course" / "data" / "wedsonlin-medium128-training.pickle"

_FRAMES = [
    [{"filename": "/home/me/train.py", "line": 41, "name": "forward"},
     {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1790, "name": "_call_impl"}],
    [{"filename": "/usr/lib/python3/site-packages/torch/optim/adamw.py", "line": 120, "name": "_init_group"},
     {"filename": "/home/me/train.py", "line": 77, "name": "train_step"}],
    [{"filename": "??", "line": 0, "name": "torch::autograd::generated::MmBackward0::apply(...)"},
     {"filename": "??", "line": 0, "name": "__clone"}],
    [],
]


def practice_snapshots() -> list[tuple[str, dict]]:
    """(name, snapshot) pairs the checkers use: two minialloc runs whose blocks carry made-up stack frames (the
    program's own Python, library frames above it, the backward pass's C++ only, no stack), one with a block
    waiting on another stream; and the chapter's real snapshot when it is there."""
    out = []
    for seed, config in ((1, ""), (2, "expandable_segments:True")):
        rng = random.Random(seed)
        a = CachingAllocator(SimulatedGPU("4GiB"), config)
        live = [a.malloc(rng.choice([700, 64 * KiB, 3 * MiB, 12 * MiB, 30 * MiB])) for _ in range(60)]
        for p in live[::3]:
            a.free(p)
        pending = a.malloc(3 * MiB, stream=2)  # alone in a 20 MiB segment of stream 2
        a.record_stream(pending, 1)
        a.free(pending)  # active_pending_free: freed, not live; it delays reuse but does not pin its segment
        snap = a.snapshot()
        for seg in snap["segments"]:
            for b in seg["blocks"]:
                b["frames"] = list(rng.choice(_FRAMES)) if b["state"] != "inactive" else []
        out.append((say(TEXT, "run_name", config=config or "native"), snap))
    if REAL_SNAPSHOT.exists():
        out.append((REAL_SNAPSHOT.name, load_snapshot(REAL_SNAPSHOT)))
    return out


def _who_holds(snapshot: dict, states: tuple[str, ...] = ("active_allocated",), size: str = "size"
               ) -> dict[str, int]:
    """The reference (live blocks, their size); other ``states`` or ``size`` give the usual slips to diagnose."""
    held: dict[str, int] = {}
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["state"] in states:
                name = top_user_frame(b.get("frames"))
                held[name] = held.get(name, 0) + b.get(size, b["size"])
    return held


def _slip_hint(got: dict, snapshot: dict) -> str:
    """Which known slip gives exactly the learner's dict: the hint for it, or the general one."""
    slips = [
        ("every_block_hint", _who_holds(snapshot, ("active_allocated", "active_pending_free", "inactive"))),
        ("pending_hint", _who_holds(snapshot, ("active_allocated", "active_pending_free"))),
        ("size_hint", _who_holds(snapshot, size="requested_size")),
    ]
    for hint, wrong in slips:
        if {k: v for k, v in got.items() if v} == {k: v for k, v in wrong.items() if v}:
            return hint
    return "size_hint"


def check_who_holds(who_holds: Callable[[dict], Any]) -> str:
    """Exercise c5-who-holds: who_holds(snapshot) -> {top user frame: bytes of live blocks}."""
    for name, snap in practice_snapshots():
        got = call(who_holds, snap)
        if not isinstance(got, dict):
            raise Wrong(say(TEXT, "not_dict", name=name, type=type(got).__name__), say(TEXT, "not_dict_hint"))
        want = _who_holds(snap)
        extra = sorted(set(got) - set(want))
        missing = sorted(set(want) - set(got))
        if got != want and _slip_hint(got, snap) != "size_hint":  # a known slip, named before its symptoms
            raise Wrong(say(TEXT, "bytes_wrong", name=name, key=repr(next(k for k in got if got[k] != want.get(k)))),
                        say(TEXT, _slip_hint(got, snap)))
        if extra:
            raise Wrong(say(TEXT, "extra_key", name=name, key=repr(extra[0])), say(TEXT, "extra_key_hint"))
        if missing:
            raise Wrong(say(TEXT, "missing_key", name=name, key=repr(missing[0])), say(TEXT, "missing_key_hint"))
        for key in want:
            if got[key] != want[key]:
                raise Wrong(say(TEXT, "bytes_wrong", name=name, key=repr(key)), say(TEXT, _slip_hint(got, snap)))
    top = max(want.items(), key=lambda kv: kv[1])
    return say(TEXT, "who_passed", name=name, holder=top[0], size=format_size(top[1]))


def _free_bytes(seg: dict) -> int:
    """Bytes of a segment's blocks the program has freed: 'inactive', and 'active_pending_free' (waiting only for
    another stream; empty_cache() and the OOM retry synchronize first, so such a block does not pin)."""
    return sum(b["size"] for b in seg["blocks"] if b["state"] != "active_allocated")


def _pinned(snapshot: dict, min_free_fraction: float) -> list[int]:
    out = []
    for seg in snapshot["segments"]:
        live = any(b["state"] == "active_allocated" for b in seg["blocks"])
        free = _free_bytes(seg)
        if live and free >= min_free_fraction * seg["total_size"]:
            out.append(seg["address"])
    return sorted(out)


def check_pinned_segments(pinned_segments: Callable[..., Any]) -> str:
    """Exercise c5-pinned: pinned_segments(snapshot, min_free_fraction) -> sorted addresses of the segments holding
    at least one live (active_allocated) block and at least that fraction of freed bytes (any other state)."""
    found = 0
    for name, snap in practice_snapshots():
        for fraction in (0.5, 0.9):
            got = call(pinned_segments, snap, fraction)
            if not isinstance(got, (list, tuple)):
                raise Wrong(say(TEXT, "not_list", name=name, type=type(got).__name__), say(TEXT, "not_list_hint"))
            want = _pinned(snap, fraction)
            got = list(got)
            expect(got == sorted(got), say(TEXT, "unsorted", name=name), say(TEXT, "unsorted_hint"))
            extra = [a for a in got if a not in want]
            if extra:
                seg = next((s for s in snap["segments"] if s["address"] == extra[0]), None)
                if seg is None:
                    raise Wrong(say(TEXT, "not_segment", name=name, address=repr(extra[0])),
                                say(TEXT, "not_segment_hint"))
                wholly_free = all(b["state"] == "inactive" for b in seg["blocks"])
                no_live = not any(b["state"] == "active_allocated" for b in seg["blocks"])
                hint = "wholly_free_hint" if wholly_free else "pending_pins_hint" if no_live else "fraction_hint"
                raise Wrong(say(TEXT, "not_pinned", name=name, fraction=fraction, address=f"{extra[0]:#x}"),
                            say(TEXT, hint))
            missing = [a for a in want if a not in got]
            if missing:
                seg = next(s for s in snap["segments"] if s["address"] == missing[0])
                hint = "at_least_hint" if _free_bytes(seg) == fraction * seg["total_size"] else "missing_pinned_hint"
                raise Wrong(say(TEXT, "missing_pinned", name=name, fraction=fraction, address=f"{missing[0]:#x}"),
                            say(TEXT, hint))
            found += len(want)
            if fraction == 0.5:
                last = (name, len(want))
    if not found:
        raise NotYet(say(TEXT, "none_found"))
    return say(TEXT, "pinned_passed", n=last[1], name=last[0])
