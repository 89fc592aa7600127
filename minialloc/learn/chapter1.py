"""Chapter 1 (why a caching allocator): the facts the predictions are revealed against, and the exercise checkers.

The hidden references live here, not in the notebook: a learner who opens this file reads the answers, which is
fine for a self-learner and no secret worth guarding; the notebook itself gives none away.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..allocator import CachingAllocator, round_size
from ..device import SimulatedGPU
from ..sizes import MiB, format_size
from . import Wrong, call, expect, say

__all__ = ["TEXT", "WHY", "check_get_segment", "check_step_peak", "request_facts", "why"]

# Every sentence a learner reads from this chapter's checkers, in the course's three languages (minialloc.lang).
TEXT: dict[str, dict[str, str]] = {
    "case_fits": {"en": "a cached segment fits", "vi": "có một phân đoạn trong bộ nhớ đệm vừa",
                  "de": "ein Segment im Cache passt"},
    "case_exact": {"en": "a cached segment of exactly the size asked for", "vi": "có một phân đoạn trong bộ nhớ đệm "
                   "đúng bằng kích thước được yêu cầu", "de": "ein Segment im Cache mit genau der verlangten Größe"},
    "case_room": {"en": "nothing cached fits, the device has room",
                  "vi": "không phân đoạn nào trong bộ nhớ đệm vừa, thiết bị còn chỗ",
                  "de": "kein Segment im Cache passt, das Gerät hat noch Platz"},
    "case_release": {"en": "nothing cached fits, the device is full, the cache holds enough",
                     "vi": "không phân đoạn nào trong bộ nhớ đệm vừa, thiết bị đã đầy, bộ nhớ đệm giữ đủ",
                     "de": "kein Segment im Cache passt, das Gerät ist voll, der Cache hält genug"},
    "case_oom": {"en": "nothing fits even after releasing the cache",
                 "vi": "giải phóng cả bộ nhớ đệm rồi vẫn không đủ chỗ",
                 "de": "nichts passt, auch nicht nach dem Freigeben des Caches"},
    "case": {"en": "case '{what}' (request {size}, cache {cache})",
             "vi": "trường hợp '{what}' (yêu cầu {size}, bộ nhớ đệm {cache})",
             "de": "Fall '{what}' (Anforderung {size}, Cache {cache})"},
    "no_call": {"en": "no driver call", "vi": "không gọi trình điều khiển lần nào",
                "de": "kein Treiberaufruf"},
    "malloc_failed": {"en": "malloc failed", "vi": "malloc thất bại", "de": "malloc fehlgeschlagen"},
    "should_raise": {
        "en": "{case}: your function returned {got}, but there is not enough memory even after releasing the cache",
        "vi": "{case}: hàm của bạn trả về {got}, nhưng kể cả khi đã giải phóng bộ nhớ đệm vẫn không đủ bộ nhớ",
        "de": "{case}: Ihre Funktion gab {got} zurück, aber selbst nach dem Freigeben des Caches reicht der "
              "Speicher nicht",
    },
    "should_raise_hint": {
        "en": "after the second device.malloc fails, let its MemoryError propagate: that is the OOM",
        "vi": "khi device.malloc thất bại lần thứ hai, hãy để MemoryError của nó truyền ra ngoài: đó chính là lỗi "
              "hết bộ nhớ (OOM)",
        "de": "wenn das zweite device.malloc scheitert, lassen Sie seinen MemoryError durch: das ist der OOM",
    },
    "should_serve": {
        "en": "{case}: your function raised MemoryError, but the request can be served",
        "vi": "{case}: hàm của bạn báo MemoryError, nhưng yêu cầu này vẫn đáp ứng được",
        "de": "{case}: Ihre Funktion hat MemoryError ausgelöst, obwohl sich die Anforderung erfüllen lässt",
    },
    "should_serve_hint": {
        "en": "a MemoryError from the device is the signal to release the cache and try again, once",
        "vi": "MemoryError từ thiết bị là tín hiệu để giải phóng bộ nhớ đệm rồi thử lại, đúng một lần",
        "de": "ein MemoryError des Geräts ist das Signal, den Cache freizugeben und es noch einmal zu versuchen, "
              "ein einziges Mal",
    },
    "not_address": {"en": "{case}: your function returned {got}, not an address",
                    "vi": "{case}: hàm của bạn trả về {got}, không phải một địa chỉ",
                    "de": "{case}: Ihre Funktion gab {got} zurück, keine Adresse"},
    "not_address_hint": {
        "en": "return the address: the cached segment's, or what device.malloc returned",
        "vi": "hãy trả về địa chỉ: của phân đoạn lấy từ bộ nhớ đệm, hoặc giá trị device.malloc trả về",
        "de": "geben Sie die Adresse zurück: die des Segments aus dem Cache oder die, die device.malloc liefert",
    },
    "calls": {
        "en": "{case}: your driver calls were [{calls}], which is not what the allocator does",
        "vi": "{case}: các lần gọi trình điều khiển của bạn là [{calls}], không giống cách bộ cấp phát làm",
        "de": "{case}: Ihre Treiberaufrufe waren [{calls}], der Allokator geht anders vor",
    },
    "calls_hint": {
        "en": "the order is: best fit from the cache (no driver call); else device.malloc; only if that raises, "
              "device.free every cached segment, empty the list, and device.malloc again",
        "vi": "thứ tự là: tìm khối vừa khít nhất (best fit) trong bộ nhớ đệm (không gọi trình điều khiển); nếu "
              "không có thì device.malloc; chỉ khi lệnh đó báo lỗi mới device.free mọi phân đoạn trong bộ nhớ "
              "đệm, làm rỗng danh sách, rồi device.malloc lại",
        "de": "die Reihenfolge: zuerst Best Fit aus dem Cache (kein Treiberaufruf); sonst device.malloc; nur wenn "
              "das scheitert, jedes Segment im Cache mit device.free freigeben, die Liste leeren und erneut "
              "device.malloc",
    },
    "calls_cached_hint": {
        "en": "a cached segment that fits is handed out without any driver call",
        "vi": "nếu có phân đoạn trong bộ nhớ đệm vừa thì giao nó đi luôn, không gọi trình điều khiển lần nào",
        "de": "ein passendes Segment aus dem Cache wird ohne jeden Treiberaufruf herausgegeben",
    },
    "calls_release_early_hint": {
        "en": "releasing the cache costs driver calls and throws away segments the next step may want: do it only "
              "after device.malloc has refused",
        "vi": "giải phóng bộ nhớ đệm tốn lời gọi trình điều khiển và bỏ đi những phân đoạn mà bước sau có thể cần: "
              "chỉ làm vậy sau khi device.malloc đã từ chối",
        "de": "den Cache freizugeben kostet Treiberaufrufe und wirft Segmente weg, die der nächste Schritt brauchen "
              "könnte: tun Sie es erst, nachdem device.malloc abgelehnt hat",
    },
    "calls_release_all_hint": {
        "en": "when the device refuses, release the whole cache, every cached segment (what empty_cache() does), "
              "not just enough of it",
        "vi": "khi thiết bị từ chối, hãy giải phóng toàn bộ bộ nhớ đệm, tức mọi phân đoạn trong đó (đúng như "
              "empty_cache() làm), chứ không chỉ vừa đủ",
        "de": "wenn das Gerät ablehnt, geben Sie den ganzen Cache frei, jedes Segment darin (wie empty_cache()), "
              "nicht nur so viel wie nötig",
    },
    "best_fit": {
        "en": "{case}: you returned the segment at {address}, not the one best fit picks",
        "vi": "{case}: bạn trả về phân đoạn ở {address}, không phải phân đoạn mà best fit chọn",
        "de": "{case}: Sie gaben das Segment bei {address} zurück, nicht das, das Best Fit wählt",
    },
    "best_fit_hint": {
        "en": "best fit: the smallest cached segment of at least `size` bytes (lowest address on a tie)",
        "vi": "best fit: phân đoạn nhỏ nhất trong bộ nhớ đệm có ít nhất `size` byte (nếu bằng nhau, lấy địa chỉ "
              "thấp hơn)",
        "de": "Best Fit: das kleinste Segment im Cache mit mindestens `size` Bytes (bei Gleichstand die "
              "niedrigere Adresse)",
    },
    "cache_after": {"en": "{case}: afterwards your cache holds {cache}",
                    "vi": "{case}: sau đó bộ nhớ đệm của bạn còn {cache}",
                    "de": "{case}: danach enthält Ihr Cache {cache}"},
    "cache_after_hint": {
        "en": "a segment you hand out or give back to the device must leave the cache list",
        "vi": "phân đoạn nào bạn đã giao đi hoặc trả lại cho thiết bị thì phải rời khỏi danh sách bộ nhớ đệm",
        "de": "ein Segment, das Sie herausgeben oder dem Gerät zurückgeben, muss aus der Cache-Liste verschwinden",
    },
    "retry_passed": {
        "en": "{cases} cases. minialloc's allocator, asked for 400 MiB with 400 MiB cached on a 512 MiB GPU, "
              "released {released} cached segments and retried ({retries} retry), then served it",
        "vi": "{cases} trường hợp. Với yêu cầu 400 MiB trên GPU 512 MiB đang giữ 400 MiB trong bộ nhớ đệm, bộ "
              "cấp phát của minialloc đã giải phóng {released} phân đoạn trong bộ nhớ đệm, thử lại ({retries} "
              "lần) rồi đáp ứng được",
        "de": "{cases} Fälle. Der Allokator von minialloc, nach 400 MiB gefragt, während auf einer 512-MiB-GPU "
              "400 MiB im Cache liegen, gab {released} Segmente aus dem Cache frei, versuchte es erneut "
              "({retries} Wiederholung) und erfüllte die Anforderung",
    },
    "not_int": {"en": "step_peak returned {got}, a {type}", "vi": "step_peak trả về {got}, kiểu {type}",
                "de": "step_peak gab {got} zurück, vom Typ {type}"},
    "not_int_hint": {"en": "return a number of bytes, an int", "vi": "hãy trả về số byte, kiểu int",
                     "de": "geben Sie eine Anzahl Bytes zurück, ein int"},
    "earlier_peak": {
        "en": "you returned {got}: the peak of an EARLIER step, still in the statistics",
        "vi": "bạn trả về {got}: đó là đỉnh của một bước TRƯỚC ĐÓ, vẫn còn lưu trong số liệu thống kê",
        "de": "Sie gaben {got} zurück: die Spitze eines FRÜHEREN Schritts, die noch in der Statistik steht",
    },
    "earlier_peak_hint": {
        "en": "peaks are remembered until reset_peak_memory_stats() is called; call it before the step",
        "vi": "giá trị đỉnh được nhớ cho đến khi gọi reset_peak_memory_stats(); hãy gọi hàm đó trước bước này",
        "de": "Spitzenwerte bleiben gespeichert, bis reset_peak_memory_stats() aufgerufen wird; rufen Sie es vor "
              "dem Schritt auf",
    },
    "reserved_peak": {
        "en": "you returned {got}: the peak of RESERVED memory (segments held from the device, cached free blocks "
              "included), not of allocated memory",
        "vi": "bạn trả về {got}: đó là đỉnh của bộ nhớ ĐƯỢC GIỮ (reserved: các phân đoạn lấy từ thiết bị, kể cả "
              "các khối trống trong bộ nhớ đệm), không phải của bộ nhớ được cấp phát",
        "de": "Sie gaben {got} zurück: die Spitze des RESERVIERTEN Speichers (die vom Gerät geholten Segmente, "
              "freie Blöcke im Cache eingeschlossen), nicht die des zugewiesenen Speichers",
    },
    "reserved_peak_hint": {
        "en": "the exercise asks for the highest memory_allocated(): use the peak statistic that goes with it",
        "vi": "bài tập hỏi giá trị memory_allocated() cao nhất: hãy dùng số liệu đỉnh đi kèm với hàm đó",
        "de": "gefragt ist der höchste Wert von memory_allocated(): verwenden Sie die Spitzenstatistik, die dazu "
              "gehört",
    },
    "after_step": {
        "en": "you returned {got}: what is allocated AFTER the step, not the highest point during it",
        "vi": "bạn trả về {got}: lượng bộ nhớ được cấp phát SAU bước này, không phải điểm cao nhất trong lúc chạy",
        "de": "Sie gaben {got} zurück: was NACH dem Schritt zugewiesen ist, nicht der Höchststand währenddessen",
    },
    "after_step_hint": {
        "en": "max_memory_allocated() remembers the highest point; memory_allocated() is only the current value",
        "vi": "max_memory_allocated() nhớ điểm cao nhất; memory_allocated() chỉ là giá trị hiện tại",
        "de": "max_memory_allocated() merkt sich den Höchststand; memory_allocated() ist nur der aktuelle Wert",
    },
    "growth": {
        "en": "you returned {got}: the step's growth over what was live before it",
        "vi": "bạn trả về {got}: phần tăng thêm của bước này so với lượng bộ nhớ đang dùng trước đó",
        "de": "Sie gaben {got} zurück: nur den Zuwachs des Schritts gegenüber dem, was vorher belegt war",
    },
    "growth_hint": {
        "en": "the weights live before the step sit on the GPU during it too: the peak counts them",
        "vi": "các trọng số đã nằm trên GPU từ trước bước này thì trong lúc chạy vẫn còn đó: đỉnh phải tính cả "
              "chúng",
        "de": "die Gewichte, die schon vor dem Schritt auf der GPU liegen, liegen auch währenddessen dort: die "
              "Spitze zählt sie mit",
    },
    "not_peak": {
        "en": "you returned {got}, which is not the highest allocated memory during the step",
        "vi": "bạn trả về {got}, đó không phải lượng bộ nhớ được cấp phát cao nhất trong bước này",
        "de": "Sie gaben {got} zurück, das ist nicht der höchste zugewiesene Speicher während des Schritts",
    },
    "not_peak_hint": {
        "en": "reset the peak statistics, run the step once, then read the peak",
        "vi": "hãy đặt lại số liệu đỉnh, chạy bước này một lần, rồi đọc giá trị đỉnh",
        "de": "setzen Sie die Spitzenstatistik zurück, führen Sie den Schritt einmal aus und lesen Sie dann die "
              "Spitze ab",
    },
    "peak_passed": {
        "en": "the step peaked at {peak}, of which {before} was live before it",
        "vi": "bước này đạt đỉnh {peak}, trong đó {before} đã được dùng từ trước",
        "de": "der Schritt erreichte seine Spitze bei {peak}, davon waren {before} schon vorher belegt",
    },
    "retry_rule": {
        "en": "chapter 1, rule 4 (best fit per stream) and rule 7 (release and retry): re-read both and follow them "
              "for this case, one driver call at a time",
        "vi": "chương 1, quy tắc 4 (best fit, theo từng luồng CUDA) và quy tắc 7 (giải phóng rồi thử lại): hãy "
              "đọc lại cả hai và làm theo chúng cho trường hợp này, từng lời gọi trình điều khiển một",
        "de": "Kapitel 1, Regel 4 (Best Fit pro Stream) und Regel 7 (Freigeben und erneut versuchen): Lesen Sie beide"
              " noch einmal und folgen Sie ihnen für diesen Fall, einen Treiberaufruf nach dem anderen",
    },
}

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY: dict[str, dict[str, str]] = {
    "c1-small-request": {
        "en": "1000 B rounds up to 1024 B (rule 1), which is under 1 MiB: small pool (rule 2), whose segments are 2 "
              "MiB (rule 3). The small pool splits whenever 512 B or more remain (rule 5), so allocated counts only "
              "the 1024-byte block, while the whole 2 MiB segment is reserved.",
        "vi": "1000 B được làm tròn lên 1024 B (quy tắc 1), dưới 1 MiB nên vào nhóm nhỏ (quy tắc 2), mà phân đoạn của"
              " nhóm nhỏ là 2 MiB (quy tắc 3). Nhóm nhỏ tách khối bất cứ khi nào còn dư từ 512 B trở lên (quy tắc 5),"
              " nên bộ nhớ được cấp phát chỉ tính khối 1024 byte, trong khi cả phân đoạn 2 MiB đều là bộ nhớ dành "
              "riêng.",
        "de": "1000 B werden auf 1024 B aufgerundet (Regel 1), das ist weniger als 1 MiB: kleiner Pool (Regel 2), "
              "dessen Segmente 2 MiB groß sind (Regel 3). Der kleine Pool teilt auf, sobald 512 B oder mehr übrig "
              "bleiben (Regel 5); zugewiesen ist also nur der 1024-Byte-Block, reserviert dagegen das ganze "
              "2-MiB-Segment.",
    },
    "c1-large-request": {
        "en": "19.5 MiB is already a multiple of 512 B (rule 1) and over 1 MiB: large pool (rule 2). It is not under "
              "10 MiB, so its segment is its size rounded up to 2 MiB: 20 MiB (rule 3). The 512 KiB left over is not "
              "over 1 MiB, so the large pool does not split it off (rule 5): the tensor's block is the whole segment,"
              " and allocated counts 20 MiB, not 19.5.",
        "vi": "19.5 MiB vốn đã là bội số của 512 B (quy tắc 1) và lớn hơn 1 MiB: vào nhóm lớn (quy tắc 2). Nó không "
              "nhỏ hơn 10 MiB, nên phân đoạn của nó bằng chính kích thước đó làm tròn lên bội số của 2 MiB: 20 MiB "
              "(quy tắc 3). Phần dư 512 KiB không lớn hơn 1 MiB, nên nhóm lớn không tách nó ra (quy tắc 5): khối của "
              "tensor chính là cả phân đoạn, và bộ nhớ được cấp phát tính 20 MiB chứ không phải 19.5.",
        "de": "19,5 MiB sind schon ein Vielfaches von 512 B (Regel 1) und größer als 1 MiB: großer Pool (Regel 2). "
              "Die Anforderung liegt nicht unter 10 MiB, also ist ihr Segment ihre Größe, aufgerundet auf ein "
              "Vielfaches von 2 MiB: 20 MiB (Regel 3). Die übrigen 512 KiB sind nicht größer als 1 MiB, also trennt "
              "der große Pool sie nicht ab (Regel 5): Der Block des Tensors ist das ganze Segment, und zugewiesen "
              "sind 20 MiB, nicht 19,5.",
    },
    "c1-empty-cache": {
        "en": "a segment goes back to the device only whole: y, alive in the middle, pins all 20 MiB, and the free "
              "pieces around it (6 MiB before, 8 MiB after) stay reserved.",
        "vi": "một phân đoạn chỉ được trả về thiết bị khi trả được cả phân đoạn: y còn sống ở giữa nên giữ chặt cả 20"
              " MiB, và các mảnh trống quanh nó (6 MiB phía trước, 8 MiB phía sau) vẫn là bộ nhớ dành riêng.",
        "de": "ein Segment geht nur als Ganzes an das Gerät zurück: y lebt in der Mitte und hält alle 20 MiB fest, "
              "und die freien Stücke um y herum (6 MiB davor, 8 MiB dahinter) bleiben reserviert.",
    },
    "c1-stream": {
        "en": "after the free, p's block is in state {state}: it waits until the work queued on stream 1 so far is "
              "done, because reusing it now would let a new tensor overwrite memory a stream 1 kernel may still read.",
        "vi": "sau khi giải phóng, khối của p ở trạng thái {state}: nó phải chờ đến khi phần công việc đã xếp hàng "
              "trên luồng CUDA 1 tính đến lúc đó chạy xong, vì nếu dùng lại ngay thì một tensor mới có thể ghi đè lên"
              " vùng nhớ mà một kernel của luồng CUDA 1 có thể vẫn đang đọc.",
        "de": "nach der Freigabe ist der Block von p im Zustand {state}: Er wartet, bis die bis dahin in Stream 1 "
              "eingereihte Arbeit erledigt ist, denn würde er jetzt wiederverwendet, könnte ein neuer Tensor Speicher"
              " überschreiben, den ein Kernel auf Stream 1 womöglich noch liest.",
    },
    "c1-peak": {
        "en": "the peak is reached just before the workspace is freed: weights + activations + workspace. "
              "memory_allocated() after the step has fallen back to the weights alone.",
        "vi": "mức đỉnh đạt được ngay trước khi workspace được giải phóng: trọng số + các activation + workspace. Sau"
              " bước, memory_allocated() đã lùi về chỉ còn trọng số.",
        "de": "der Spitzenwert wird erreicht, kurz bevor der Arbeitsbereich freigegeben wird: Gewichte + "
              "Aktivierungen + Arbeitsbereich. memory_allocated() ist nach dem Schritt wieder auf die Gewichte allein"
              " gefallen.",
    },
}


def why(pid: str, **fields: object) -> str:
    """The explanation of prediction ``pid`` in the notebook's language, with the measured ``fields`` filled in."""
    return say(WHY, pid, **fields)


def request_facts(size: int, capacity: str = "8GiB") -> tuple[int, str, int, int, int]:
    """What one malloc(size) does to a fresh allocator, measured on minialloc:
    (rounded size, pool, segment size, allocated, reserved)."""
    alloc = CachingAllocator(SimulatedGPU(capacity), "")
    alloc.malloc(size)
    (seg,) = alloc.snapshot()["segments"]
    return (round_size(size, 0), seg["segment_type"], seg["total_size"], alloc.memory_allocated(),
            alloc.memory_reserved())


# --- exercise c1-retry: release and retry (rule 7, without max_split_size) --------------------------------------


class _RecordingGPU(SimulatedGPU):
    """A simulated GPU that writes down every driver call, so the checker can compare call sequences."""

    def __init__(self, capacity: int | str) -> None:
        super().__init__(capacity)
        self.calls: list[tuple[str, int]] = []

    def malloc(self, nbytes: int) -> int:
        try:
            address = super().malloc(nbytes)
        except MemoryError:
            self.calls.append(("malloc failed", nbytes))
            raise
        self.calls.append(("malloc", nbytes))
        return address

    def free(self, address: int) -> None:
        self.calls.append(("free", self.allocation_size(address) or 0))
        super().free(address)


def _reference_get_segment(device: Any, cache: list[tuple[int, int]], size: int) -> int:
    fits = [entry for entry in cache if entry[1] >= size]
    if fits:
        best = min(fits, key=lambda e: (e[1], e[0]))  # best fit: smallest, then lowest address
        cache.remove(best)
        return best[0]
    try:
        return device.malloc(size)
    except MemoryError:
        for address, _ in cache:
            device.free(address)
        cache.clear()
        return device.malloc(size)  # a second failure is the out-of-memory error


def _setup(capacity: str, cached: list[int], busy: int = 0) -> tuple[_RecordingGPU, list[tuple[int, int]]]:
    """A GPU whose cache holds segments of the given sizes (they occupy the device), plus `busy` bytes in use."""
    gpu = _RecordingGPU(capacity)
    cache = [(gpu.malloc(n), n) for n in cached]
    if busy:
        gpu.malloc(busy)
    gpu.calls.clear()
    return gpu, cache


def _describe(calls: list[tuple[str, int]]) -> str:
    def kind(what: str) -> str:
        return say(TEXT, "malloc_failed") if what == "malloc failed" else what  # malloc and free are names

    return ", ".join(f"{kind(what)} {format_size(n)}" for what, n in calls) or say(TEXT, "no_call")


# (description's message id, capacity, cached segment sizes, other memory in use, request)
_RETRY_CASES = [
    ("case_fits", "1GiB", [30 * MiB, 20 * MiB, 64 * MiB], 0, 18 * MiB),
    ("case_exact", "1GiB", [30 * MiB, 18 * MiB, 64 * MiB], 0, 18 * MiB),  # "at least": a block of equal size fits
    ("case_room", "1GiB", [10 * MiB], 0, 20 * MiB),
    ("case_release", "512MiB", [300 * MiB, 100 * MiB], 0, 400 * MiB),
    ("case_oom", "512MiB", [100 * MiB], 300 * MiB, 400 * MiB),
]


def check_get_segment(get_segment: Callable[..., int]) -> str:
    """Exercise c1-retry: get_segment(device, cache, size) must find a cached segment by best fit, else ask the
    device, and only when the device refuses, release every cached segment and ask once more."""
    for what, capacity, cached, busy, size in _RETRY_CASES:
        gpu, cache = _setup(capacity, cached, busy)
        ref_gpu, ref_cache = _setup(capacity, cached, busy)
        try:
            expected: int | None = _reference_get_segment(ref_gpu, ref_cache, size)
        except MemoryError:
            expected = None
        raised = False
        try:
            got: int | None = call(get_segment, gpu, cache, size)
        except MemoryError:
            got, raised = None, True
        case = say(TEXT, "case", what=say(TEXT, what), size=format_size(size),
                   cache=[format_size(n) for n in cached])
        if expected is None:
            expect(raised, say(TEXT, "should_raise", case=case, got=repr(got)), say(TEXT, "should_raise_hint"),
                   rule=say(TEXT, "retry_rule"))
        else:
            expect(not raised, say(TEXT, "should_serve", case=case), say(TEXT, "should_serve_hint"),
                   rule=say(TEXT, "retry_rule"))
            expect(isinstance(got, int), say(TEXT, "not_address", case=case, got=repr(got)),
                   say(TEXT, "not_address_hint"))
        if gpu.calls != ref_gpu.calls:
            if not ref_gpu.calls:
                hint = "calls_cached_hint"
            elif gpu.calls and gpu.calls[0][0] == "free" and ref_gpu.calls[0][0] != "free":
                hint = "calls_release_early_hint"
            elif 0 < sum(c[0] == "free" for c in gpu.calls) < sum(c[0] == "free" for c in ref_gpu.calls):
                hint = "calls_release_all_hint"
            else:
                hint = "calls_hint"
            raise Wrong(say(TEXT, "calls", case=case, calls=_describe(gpu.calls)), say(TEXT, hint),
                        rule=say(TEXT, "retry_rule"))
        if expected is not None:
            # addresses of fresh mallocs depend on the order of calls, already compared: compare the outcome
            expect(got == expected, say(TEXT, "best_fit", case=case, address=f"{got:#x}"), say(TEXT, "best_fit_hint"),
                   rule=say(TEXT, "retry_rule"))
        expect(sorted(cache) == sorted(ref_cache),
               say(TEXT, "cache_after", case=case, cache=[format_size(n) for _, n in cache]),
               say(TEXT, "cache_after_hint"), rule=say(TEXT, "retry_rule"))
    # the same situation through minialloc's own allocator: it releases and retries the same way
    alloc = CachingAllocator(SimulatedGPU("512MiB"), "")
    for p in [alloc.malloc(n) for n in (300 * MiB, 100 * MiB)]:  # both live at once: two segments
        alloc.free(p)
    alloc.malloc(400 * MiB)
    s = alloc.memory_stats()
    return say(TEXT, "retry_passed", cases=len(_RETRY_CASES), released=s["num_device_free"],
               retries=s["num_alloc_retries"])


# --- exercise c1-step-peak: measure one step's peak ---------------------------------------------------------------


def _big_step(alloc: CachingAllocator) -> None:
    x = alloc.malloc(900 * MiB)
    alloc.free(x)
    alloc.empty_cache()  # so that no reserved figure equals this step's peak: each wrong answer is told apart


def _small_step(alloc: CachingAllocator) -> None:
    # the peak (activations plus the second workspace) is in the middle; the second workspace does not fit the
    # first one's cached block, so peak reserved (a new segment) is above peak allocated
    acts = [alloc.malloc(40 * MiB) for _ in range(3)]
    ws = alloc.malloc(100 * MiB)
    alloc.free(ws)
    ws = alloc.malloc(110 * MiB)
    alloc.free(ws)
    for p in acts:
        alloc.free(p)


def check_step_peak(step_peak: Callable[[CachingAllocator, Callable[[CachingAllocator], None]], int]) -> str:
    """Exercise c1-step-peak: step_peak(alloc, step) runs step(alloc) once and returns the highest allocated
    memory during it (memory live before the step included), whatever ran before."""
    alloc = CachingAllocator(SimulatedGPU("8GiB"), "")
    _big_step(alloc)  # an earlier, bigger peak that must not leak into the measurement
    weights = alloc.malloc(200 * MiB)  # live during the step: it counts
    before = alloc.memory_allocated()
    got = call(step_peak, alloc, _small_step)
    ref = CachingAllocator(SimulatedGPU("8GiB"), "")
    _big_step(ref)
    ref.malloc(200 * MiB)
    ref.reset_peak_memory_stats()
    _small_step(ref)
    expected = ref.max_memory_allocated()
    expect(isinstance(got, int) and not isinstance(got, bool),
           say(TEXT, "not_int", got=repr(got), type=type(got).__name__), say(TEXT, "not_int_hint"))
    shown = format_size(got)
    if got >= 900 * MiB:
        raise Wrong(say(TEXT, "earlier_peak", got=shown), say(TEXT, "earlier_peak_hint"))
    if got in (alloc.max_memory_reserved(), alloc.memory_reserved()) and got != expected:
        raise Wrong(say(TEXT, "reserved_peak", got=shown), say(TEXT, "reserved_peak_hint"))
    expect(got != alloc.memory_allocated(), say(TEXT, "after_step", got=shown), say(TEXT, "after_step_hint"))
    expect(got != expected - before, say(TEXT, "growth", got=shown), say(TEXT, "growth_hint"))
    expect(got == expected, say(TEXT, "not_peak", got=shown), say(TEXT, "not_peak_hint"))
    alloc.free(weights)
    return say(TEXT, "peak_passed", peak=shown, before=format_size(before))
