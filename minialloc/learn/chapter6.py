"""Chapter 6 (beyond): the opening picture, the three failures to fix, and the exercise checkers.

The hidden references live here, not in the notebook: a learner who opens this file reads the answers, which is
fine for a self-learner and no secret worth guarding; the notebook itself gives none away. The fixes are checked
by replay: the failing trace runs again on minialloc with the learner's fix, and the fix counts when no
allocation fails.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..allocator import CachingAllocator
from ..budget import LLAMA_7B, Model, estimate, plot_budget
from ..device import SimulatedGPU
from ..replay import ReplayResult, replay
from ..sizes import GiB, MiB, format_size
from ..workloads import CANONICAL_CAPACITY, Event, alloc, canonical_scenario, free
from . import NotYet, Wrong, call, expect, say

__all__ = ["FAILURES", "PROGRAM_FIXES", "TEXT", "WHY", "check_fit_7b", "check_fixes", "opening_figure", "program_fix",
           "try_fix", "why"]

# Every sentence a learner reads from this chapter (the picture's title, the three stories, the replays' outcomes,
# the checkers' feedback), in the course's three languages (minialloc.lang).
TEXT: dict[str, dict[str, str]] = {
    "opening_title": {
        "en": "Who shares the GPU: training a 1.3B model with Adam, sequences of 2048 tokens",
        "vi": "Ai chia nhau GPU: huấn luyện mô hình 1,3B với Adam, chuỗi 2048 token",
        "de": "Wer sich die GPU teilt: Training eines 1,3B-Modells mit Adam, Sequenzen von 2048 Tokens",
    },
    "micro_batch": {"en": "micro-batch {n}", "vi": "micro-batch {n}", "de": "Micro-Batch {n}"},
    "plan_dict": {"en": "return a dict of changes, like {{'micro_batch': 4}}, got {type}",
                  "vi": "hãy trả về một dict các thay đổi, như {{'micro_batch': 4}}, nhưng nhận được {type}",
                  "de": "geben Sie ein dict mit Änderungen zurück, etwa {{'micro_batch': 4}}, erhalten: {type}"},
    "plan_dict_hint": {"en": "the keys are Training's field names", "vi": "các khóa là tên trường của Training",
                       "de": "die Schlüssel sind die Feldnamen von Training"},
    "unknown_levers": {"en": "{keys} cannot be changed here", "vi": "không thể thay đổi {keys} ở đây",
                       "de": "{keys} lässt sich hier nicht ändern"},
    "unknown_levers_hint": {
        "en": "the sequence length, the weights' dtype, the workspaces and the CUDA context are given; the levers "
              "are {levers}",
        "vi": "độ dài chuỗi, dtype của trọng số, các vùng nhớ làm việc (workspace) và CUDA context là cố định; "
              "những gì bạn được chỉnh là {levers}",
        "de": "Sequenzlänge, dtype der Gewichte, Workspaces und CUDA-Kontext sind vorgegeben; die Stellschrauben "
              "sind {levers}",
    },
    "plan_blank": {"en": "a value in your plan is still ...", "vi": "một giá trị trong kế hoạch của bạn vẫn là ...",
                   "de": "ein Wert in Ihrem Plan ist noch ..."},
    "whole_number": {"en": "{key} must be a whole number, got {value}",
                     "vi": "{key} phải là số nguyên, nhưng nhận được {value}",
                     "de": "{key} muss eine ganze Zahl sein, erhalten: {value}"},
    "whole_number_hint": {"en": "write it without quotes or a decimal point",
                          "vi": "hãy viết không có dấu nháy và không có phần thập phân",
                          "de": "schreiben Sie sie ohne Anführungszeichen und ohne Dezimalpunkt"},
    "on_off": {"en": "{key} is on or off: True or False, got {value}",
               "vi": "{key} chỉ có bật hoặc tắt: True hoặc False, nhưng nhận được {value}",
               "de": "{key} ist an oder aus: True oder False, erhalten: {value}"},
    "on_off_hint": {"en": "write True or False, without quotes", "vi": "hãy viết True hoặc False, không có dấu nháy",
                    "de": "schreiben Sie True oder False, ohne Anführungszeichen"},
    "refused": {"en": "estimate() refused your plan: {error}", "vi": "estimate() từ chối kế hoạch của bạn: {error}",
                "de": "estimate() hat Ihren Plan abgelehnt: {error}"},
    "refused_hint": {"en": "look at the values each setting accepts",
                     "vi": "hãy xem mỗi thiết lập chấp nhận những giá trị nào",
                     "de": "sehen Sie nach, welche Werte jede Einstellung annimmt"},
    "batch_too_small": {
        "en": "your micro-batch is {n} sequence(s); the team needs at least {min}",
        "vi": "micro-batch của bạn có {n} chuỗi; nhóm cần ít nhất {min}",
        "de": "Ihr Micro-Batch hat {n} Sequenz(en); das Team braucht mindestens {min}",
    },
    "batch_too_small_hint": {
        "en": "keep the batch and change how its memory is held instead",
        "vi": "hãy giữ nguyên batch, thay vào đó hãy đổi cách giữ bộ nhớ của nó",
        "de": "behalten Sie den Batch und ändern Sie stattdessen, wie sein Speicher gehalten wird",
    },
    "over_limit": {
        "en": "your plan needs {total} GiB, over the {limit} GiB you may plan for; its largest item is {top} "
              "({top_size} GiB)",
        "vi": "kế hoạch của bạn cần {total} GiB, vượt quá {limit} GiB được phép; khoản lớn nhất của nó là {top} "
              "({top_size} GiB)",
        "de": "Ihr Plan braucht {total} GiB, mehr als die {limit} GiB, die Sie einplanen dürfen; sein größter "
              "Posten ist {top} ({top_size} GiB)",
    },
    "over_limit_hint": {"en": "which lever shrinks that item, and what does it cost?",
                        "vi": "núm chỉnh nào làm khoản đó nhỏ lại, và cái giá phải trả là gì?",
                        "de": "welche Stellschraube verkleinert diesen Posten, und was kostet sie?"},
    "fit_passed": {"en": "{total} GiB of {limit} GiB", "vi": "{total} GiB trên {limit} GiB",
                   "de": "{total} GiB von {limit} GiB"},
    "story_A": {
        "en": "Training on an 8 GiB GPU dies in the backward pass asking for 2 GiB; the message says 3.24 GiB is "
              "reserved by PyTorch but unallocated. The batch and the model are fixed by the experiment: you may "
              "change only allocator settings.",
        "vi": "Huấn luyện trên GPU 8 GiB bị dừng ở lượt lan truyền ngược (backward) khi xin 2 GiB; thông báo lỗi "
              "cho biết PyTorch đang giữ 3,24 GiB bộ nhớ dành riêng (reserved) mà chưa cấp phát. Batch và mô hình "
              "do thí nghiệm cố định: bạn chỉ được đổi thiết lập của bộ cấp phát.",
        "de": "Ein Training auf einer 8-GiB-GPU bricht im Backward-Pass ab, als es 2 GiB anfordert; laut Meldung "
              "sind 3,24 GiB von PyTorch reserviert, aber nicht zugewiesen. Batch und Modell legt das Experiment "
              "fest: Sie dürfen nur Einstellungen des Allokators ändern.",
    },
    "story_B": {
        "en": "Training on an 8 GiB GPU dies in the forward pass; the message says almost everything is allocated "
              "and little is reserved but unallocated. You may change anything.",
        "vi": "Huấn luyện trên GPU 8 GiB bị dừng ở lượt lan truyền xuôi (forward); thông báo lỗi cho biết gần như "
              "toàn bộ đã được cấp phát, chỉ một ít là dành riêng mà chưa cấp phát. Bạn được thay đổi bất cứ thứ gì.",
        "de": "Ein Training auf einer 8-GiB-GPU bricht im Forward-Pass ab; laut Meldung ist fast alles zugewiesen "
              "und nur wenig reserviert, aber nicht zugewiesen. Sie dürfen alles ändern.",
    },
    "story_C": {
        "en": "Two jobs share an 8 GiB GPU. Job 1 ran an evaluation with big temporary buffers and goes on training "
              "with little memory; job 2 then starts and fails asking for 3 GiB, although job 1's tensors take only "
              "512 MiB. Job 1's batch is fixed; you may add one line to job 1.",
        "vi": "Hai tác vụ dùng chung một GPU 8 GiB. Tác vụ 1 đã chạy đánh giá với các bộ đệm tạm lớn, rồi tiếp tục "
              "huấn luyện với ít bộ nhớ; sau đó tác vụ 2 khởi động và thất bại khi xin 3 GiB, dù các tensor của tác "
              "vụ 1 chỉ chiếm 512 MiB. Batch của tác vụ 1 là cố định; bạn được thêm một dòng vào tác vụ 1.",
        "de": "Zwei Jobs teilen sich eine 8-GiB-GPU. Job 1 hat eine Evaluation mit großen temporären Puffern "
              "ausgeführt und trainiert mit wenig Speicher weiter; dann startet Job 2 und scheitert an einer "
              "Anforderung von 3 GiB, obwohl die Tensoren von Job 1 nur 512 MiB belegen. Der Batch von Job 1 ist "
              "fest; Sie dürfen Job 1 eine Zeile hinzufügen.",
    },
    "job1_itself": {"en": "job 1 itself: {outcome}", "vi": "chính tác vụ 1: {outcome}",
                    "de": "schon Job 1: {outcome}"},
    "job2": {"en": "job 2: {outcome}; job 1 holds {reserved} reserved, {allocated} allocated",
             "vi": "tác vụ 2: {outcome}; tác vụ 1 giữ {reserved} dành riêng (reserved), {allocated} đã cấp phát",
             "de": "Job 2: {outcome}; Job 1 hält {reserved} reserviert, {allocated} zugewiesen"},
    "no_failure": {"en": "no failure {key}; the failures are {keys}", "vi": "không có sự cố {key}; các sự cố là {keys}",
                   "de": "keinen Fehlerfall {key}; die Fehlerfälle sind {keys}"},
    "none_fail": {
        "en": "no allocation fails (peak allocated {allocated}, peak reserved {reserved})",
        "vi": "không lần cấp phát nào thất bại (đỉnh cấp phát {allocated}, đỉnh dành riêng {reserved})",
        "de": "keine Zuweisung scheitert (Spitze zugewiesen {allocated}, Spitze reserviert {reserved})",
    },
    "some_fail": {
        "en": "{n} allocation(s) fail, the first at '{label}'; peak allocated {allocated}, peak reserved {reserved}",
        "vi": "{n} lần cấp phát thất bại, lần đầu ở '{label}'; đỉnh cấp phát {allocated}, đỉnh dành riêng {reserved}",
        "de": "{n} Zuweisung(en) scheitern, die erste bei '{label}'; Spitze zugewiesen {allocated}, Spitze "
              "reserviert {reserved}",
    },
    "hint_A": {
        "en": "compare reserved-but-unallocated with the request: the memory is there, in pieces, each in a "
              "different segment. Chapter 3's settings act on exactly that kind of waste",
        "vi": "hãy so lượng dành riêng mà chưa cấp phát với yêu cầu: bộ nhớ vẫn có đó, nhưng bị chia thành nhiều "
              "mảnh, mỗi mảnh nằm trong một phân đoạn khác nhau. Các thiết lập ở chương 3 nhắm đúng vào kiểu lãng "
              "phí này",
        "de": "vergleichen Sie „reserviert, aber nicht zugewiesen“ mit der Anforderung: der Speicher ist da, in "
              "Stücken, jedes in einem anderen Segment. Die Einstellungen aus Kapitel 3 wirken genau auf diese Art "
              "von Verschwendung",
    },
    "hint_B": {
        "en": "compare what is allocated with the GPU: if live tensors alone exceed it, no allocator setting can "
              "help",
        "vi": "hãy so lượng đã cấp phát với GPU: nếu riêng các tensor đang dùng đã vượt quá nó thì không thiết "
              "lập nào của bộ cấp phát cứu được",
        "de": "vergleichen Sie den zugewiesenen Speicher mit der GPU: wenn schon die belegten Tensoren allein sie "
              "übersteigen, hilft keine Einstellung des Allokators",
    },
    "hint_C": {
        "en": "who holds the memory job 2 needs, and in what state: allocated, or cached by job 1's allocator?",
        "vi": "ai đang giữ phần bộ nhớ mà tác vụ 2 cần, và ở trạng thái nào: đã cấp phát, hay nằm trong bộ nhớ "
              "đệm của bộ cấp phát của tác vụ 1?",
        "de": "wer hält den Speicher, den Job 2 braucht, und in welchem Zustand: zugewiesen oder im Cache des "
              "Allokators von Job 1?",
    },
    "fixes_dict": {"en": "return a dict with the keys {keys}, got {got}",
                   "vi": "hãy trả về một dict có các khóa {keys}, nhưng nhận được {got}",
                   "de": "geben Sie ein dict mit den Schlüsseln {keys} zurück, erhalten: {got}"},
    "fixes_dict_hint": {"en": "one fix per failure", "vi": "mỗi sự cố một cách sửa", "de": "ein Fix pro Fehlerfall"},
    "fix_blank": {"en": "a fix is still ...", "vi": "một cách sửa vẫn còn là ...", "de": "ein Fix ist noch ..."},
    "fix_string": {"en": "the fix for {key} must be a string, got {got}",
                   "vi": "cách sửa cho {key} phải là một chuỗi ký tự (string), nhưng nhận được {got}",
                   "de": "der Fix für {key} muss ein String sein, erhalten: {got}"},
    "fix_string_hint": {"en": "an allocator config like 'max_split_size_mb:128', or one of {fixes}",
                        "vi": "một cấu hình bộ cấp phát như 'max_split_size_mb:128', hoặc một trong {fixes}",
                        "de": "eine Allokator-Konfiguration wie 'max_split_size_mb:128' oder eines von {fixes}"},
    "not_allowed": {
        "en": "failure {key}: '{fix}' changes the program, and the story of {key} does not allow that",
        "vi": "sự cố {key}: '{fix}' thay đổi chương trình, mà câu chuyện của {key} không cho phép điều đó",
        "de": "Fehlerfall {key}: '{fix}' ändert das Programm, und die Geschichte von {key} erlaubt das nicht",
    },
    "not_allowed_hint": {"en": "re-read what the story lets you change",
                         "vi": "hãy đọc lại xem câu chuyện cho phép bạn thay đổi những gì",
                         "de": "lesen Sie noch einmal nach, was die Geschichte Ihnen zu ändern erlaubt"},
    "neither": {
        "en": "failure {key}: {fix} is neither an allocator setting (key:value) nor one of the program changes "
              "{fixes}",
        "vi": "sự cố {key}: {fix} không phải thiết lập của bộ cấp phát (key:value), cũng không phải một trong các "
              "thay đổi chương trình {fixes}",
        "de": "Fehlerfall {key}: {fix} ist weder eine Allokator-Einstellung (key:value) noch eine der "
              "Programmänderungen {fixes}",
    },
    "neither_hint": {
        "en": "write a PYTORCH_CUDA_ALLOC_CONF setting as in chapter 3, or one of those three names",
        "vi": "hãy viết một thiết lập PYTORCH_CUDA_ALLOC_CONF như ở chương 3, hoặc một trong ba tên đó",
        "de": "schreiben Sie eine PYTORCH_CUDA_ALLOC_CONF-Einstellung wie in Kapitel 3 oder einen dieser drei "
              "Namen",
    },
    "bad_setting": {"en": "failure {key}: minialloc cannot use the setting {fix}: {error}",
                    "vi": "sự cố {key}: minialloc không dùng được thiết lập {fix}: {error}",
                    "de": "Fehlerfall {key}: minialloc kann die Einstellung {fix} nicht verwenden: {error}"},
    "bad_setting_hint": {
        "en": "PYTORCH_CUDA_ALLOC_CONF's syntax is key:value, as in chapter 3 (the value only, without "
              "PYTORCH_CUDA_ALLOC_CONF=)",
        "vi": "cú pháp của PYTORCH_CUDA_ALLOC_CONF là key:value, như ở chương 3 (chỉ phần giá trị, không có "
              "PYTORCH_CUDA_ALLOC_CONF=)",
        "de": "die Syntax von PYTORCH_CUDA_ALLOC_CONF ist key:value, wie in Kapitel 3 (nur der Wert, ohne "
              "PYTORCH_CUDA_ALLOC_CONF=)",
    },
    "not_saved": {"en": "failure {key} replayed with {fix}: {what}",
                  "vi": "sự cố {key} chạy lại với {fix}: {what}",
                  "de": "Fehlerfall {key}, erneut abgespielt mit {fix}: {what}"},
    "saved": {"en": "{key} with {fix}: {what}", "vi": "{key} với {fix}: {what}", "de": "{key} mit {fix}: {what}"},
    "all_saved": {"en": "every failure is saved by its fix, on replay:",
                  "vi": "khi chạy lại, mọi sự cố đều được cách sửa của nó cứu:",
                  "de": "beim erneuten Abspielen wird jeder Fehlerfall durch seinen Fix gerettet:"},
    "fixes_rule": {
        "en": "chapter 6, 'When each fix wins': read this failure's numbers, name its cause, and match it with what a"
              " fix changes",
        "vi": "chương 6, 'Khi nào cách sửa nào thắng': hãy đọc các con số của sự cố này, gọi tên nguyên nhân, rồi đối"
              " chiếu với điều mà một cách sửa thay đổi",
        "de": "Kapitel 6, 'Wann welche Abhilfe gewinnt': Lesen Sie die Zahlen dieses Fehlerfalls, benennen Sie die "
              "Ursache und ordnen Sie sie dem zu, was eine Abhilfe ändert",
    },
}

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY: dict[str, dict[str, str]] = {
    "c6-model-state": {
        "en": "2 + 2 + 4 + 4 + 4 = 16 bytes per parameter, times {params} parameters, is {gb} GB, which is {gib} GiB "
              "(a GiB is 2**30 bytes, a GB 10**9). That alone is more than an 80 GiB GPU, before a single activation.",
        "vi": "2 + 2 + 4 + 4 + 4 = 16 byte mỗi tham số, nhân với {params} tham số, được {gb} GB, tức {gib} GiB (một "
              "GiB là 2**30 byte, một GB là 10**9). Riêng phần này đã vượt quá một GPU 80 GiB, khi chưa có một "
              "activation nào.",
        "de": "2 + 2 + 4 + 4 + 4 = 16 Bytes pro Parameter, mal {params} Parameter, ergibt {gb} GB, also {gib} GiB "
              "(ein GiB sind 2**30 Bytes, ein GB 10**9). Das allein ist mehr, als eine 80-GiB-GPU fasst, noch vor der"
              " ersten Aktivierung.",
    },
    "c6-ckpt-fits": {
        "en": "checkpointing shrinks only the activations ({before} -> {after} GiB here); the {state} GiB of weights,"
              " gradients and optimizer states stay. The largest item is the optimizer's, so that is where a fix must"
              " act.",
        "vi": "checkpointing chỉ làm giảm activation (ở đây từ {before} -> {after} GiB); {state} GiB của trọng số, "
              "gradient và trạng thái bộ tối ưu vẫn còn nguyên. Khoản lớn nhất thuộc về bộ tối ưu, nên cách sửa phải "
              "tác động vào đó.",
        "de": "Checkpointing verkleinert nur die Aktivierungen (hier {before} -> {after} GiB); die {state} GiB für "
              "Gewichte, Gradienten und Optimiererzustände bleiben. Der größte Posten gehört dem Optimierer, also "
              "muss eine Abhilfe dort ansetzen.",
    },
    "c6-defrag-helps": {
        "en": "each segment already had its free space in one piece (the live block at the front, the hole behind "
              "it), so sliding blocks to the front changes nothing. The holes are in eight different segments, and a "
              "segment is one cudaMalloc: blocks are cut from one segment's address range only. Joining them takes a "
              "new mapping (expandable segments, stitching), not a move.",
        "vi": "mỗi phân đoạn vốn đã có không gian trống liền một mảnh (khối còn sống ở đầu, lỗ ở phía sau), nên trượt"
              " các khối về đầu chẳng thay đổi gì. Các lỗ nằm ở tám phân đoạn khác nhau, mà một phân đoạn là một lần "
              "gọi cudaMalloc: khối chỉ được cắt từ dải địa chỉ của một phân đoạn. Muốn nối chúng lại phải có một ánh"
              " xạ mới (phân đoạn có thể mở rộng (expandable segments), ghép nối), chứ không phải di chuyển.",
        "de": "jedes Segment hatte seinen freien Platz schon an einem Stück (der lebende Block vorn, die Lücke "
              "dahinter), also ändert das Verschieben der Blöcke nach vorn nichts. Die Lücken liegen in acht "
              "verschiedenen Segmenten, und ein Segment ist ein cudaMalloc: Blöcke werden immer nur aus dem "
              "Adressbereich eines Segments geschnitten. Um sie zusammenzuführen, braucht es eine neue Abbildung der "
              "Adressen (erweiterbare Segmente, Stitching), kein Verschieben.",
    },
    "c6-stitch-used": {
        "en": "device memory is taken by the physical chunks (cuMemCreate), once each: 3 x 4 MiB. A virtual range "
              "(cuMemAddressReserve) costs no device memory, and mapping a chunk at a new address adds nothing.",
        "vi": "bộ nhớ thiết bị bị chiếm bởi các mảnh vật lý (cuMemCreate), mỗi mảnh một lần: 3 x 4 MiB. Một dải địa "
              "chỉ ảo (cuMemAddressReserve) không tốn bộ nhớ thiết bị, và ánh xạ một mảnh ở địa chỉ mới cũng không "
              "thêm gì.",
        "de": "Gerätespeicher belegen die physischen Chunks (cuMemCreate), jeder einmal: 3 x 4 MiB. Ein virtueller "
              "Bereich (cuMemAddressReserve) kostet keinen Gerätespeicher, und einen Chunk an einer neuen Adresse "
              "einzublenden, fügt nichts hinzu.",
    },
    "c6-rollout-peak": {
        "en": "the trace starts with {start} already reserved, which is also the run's peak, and a replay starts from"
              " that state, so no setting can show a gain on this trace. The benchmark does not resemble the part of "
              "the run where memory grows: record from earlier (before the model is loaded), and never read \"no "
              "change on this trace\" as \"no benefit\".",
        "vi": "trace bắt đầu khi đã có {start} được dành riêng, cũng chính là đỉnh của lần chạy, và lần phát lại bắt "
              "đầu từ trạng thái đó, nên không thiết lập nào có thể cho thấy lợi ích trên trace này. Phép đo chuẩn "
              "này không giống đoạn của lần chạy mà bộ nhớ tăng lên: hãy ghi lại từ sớm hơn (trước khi nạp mô hình), "
              "và đừng bao giờ hiểu \"không đổi trên trace này\" thành \"không có lợi\".",
        "de": "der Trace beginnt mit bereits {start} reserviert, was auch die Spitze des Laufs ist, und eine "
              "Wiedergabe beginnt in diesem Zustand; also kann keine Einstellung auf diesem Trace einen Gewinn "
              "zeigen. Der Benchmark ähnelt nicht dem Teil des Laufs, in dem der Speicher wächst: Zeichnen Sie früher"
              " auf (bevor das Modell geladen wird), und lesen Sie \"keine Änderung auf diesem Trace\" nie als \"kein "
              "Nutzen\".",
    },
    "c6-canary": {
        "en": "the target was \"no slower\", and the canary missed it: 40 release-and-retry events per step each free "
              "the cache and synchronize the device, which is where the 8% went. No OOM is not the whole target. Roll"
              " back (remove the setting, restart the job), then find out on a replay of this job's snapshot why the "
              "new setting keeps running out of cached room.",
        "vi": "mục tiêu là \"không chậm hơn\", và bản chạy thử (canary) đã không đạt: 40 lần giải phóng rồi thử lại mỗi"
              " bước, lần nào cũng trả bộ nhớ đệm và đồng bộ hóa thiết bị, chính là chỗ 8% kia đã đi đâu. Không có "
              "OOM chưa phải là toàn bộ mục tiêu. Hãy quay lui (bỏ thiết lập, khởi động lại tác vụ), rồi dùng một lần"
              " phát lại ảnh chụp bộ nhớ của tác vụ này để tìm hiểu vì sao thiết lập mới cứ hết chỗ trong bộ nhớ đệm.",
        "de": "das Ziel war \"nicht langsamer\", und der Canary hat es verfehlt: 40 Freigabe-und-Wiederholungs-Vorgänge"
              " pro Schritt geben jedes Mal den Cache frei und synchronisieren das Gerät, und dorthin sind die 8 % "
              "gegangen. Kein OOM ist nicht das ganze Ziel. Rollen Sie zurück (Einstellung entfernen, Job neu "
              "starten) und finden Sie dann auf einer Wiedergabe des Snapshots dieses Jobs heraus, warum der neuen "
              "Einstellung der Platz im Cache immer wieder ausgeht.",
    },
}


def why(pid: str, **fields: object) -> str:
    """The explanation of prediction ``pid`` in the notebook's language, with the measured ``fields`` filled in."""
    return say(WHY, pid, **fields)

# A model of OPT-1.3B's shape (Zhang et al., 2022: 24 layers, hidden 2048, 32 heads, vocabulary 50272), with the
# parameter count estimated from the shape (12 L h^2 for the layers + V h for the embedding).
SMALL = Model("1.3B (OPT-1.3B's shape)", 12 * 24 * 2048**2 + 50272 * 2048, 24, 2048, 32, 50272)


def opening_figure() -> Any:
    """The chapter's picture: who shares a 24 GiB GPU while a 1.3B model trains, for three micro-batch sizes."""
    budgets = [(say(TEXT, "micro_batch", n=b), estimate(SMALL, micro_batch=b, seq_len=2048)) for b in (1, 4, 8)]
    ax = plot_budget(budgets, 24 * GiB, title=say(TEXT, "opening_title"))
    return ax.figure


# --- exercise c6-fit-7b: make the 7B step fit ------------------------------------------------------------------

FIT_CAPACITY = 80 * GiB
FIT_SHARE = 0.9  # plan for 90%: the caching allocator's rounding and cache need the rest (chapters 1-3)
FIT_MIN_BATCH = 4
_LEVERS = {"micro_batch", "checkpointing", "offload_optimizer", "master_weights", "adam_state_bytes",
           "flash_attention"}


def check_fit_7b(fn: Callable[[], Any]) -> str:
    """fn() returns changes to budget.Training's defaults; the 7B step must fit in 90% of 80 GiB with a
    micro-batch of at least 4 sequences of 4096 tokens."""
    plan = call(fn)
    expect(isinstance(plan, dict), say(TEXT, "plan_dict", type=type(plan).__name__), say(TEXT, "plan_dict_hint"))
    unknown = set(plan) - _LEVERS
    expect(not unknown, say(TEXT, "unknown_levers", keys=sorted(unknown)),
           say(TEXT, "unknown_levers_hint", levers=sorted(_LEVERS)))
    if any(v is Ellipsis for v in plan.values()):
        raise NotYet(say(TEXT, "plan_blank"))
    for key, value in plan.items():  # "checkpointing": "no" would count as on: say so rather than guess
        if key == "micro_batch" or key == "adam_state_bytes":
            expect(isinstance(value, int) and not isinstance(value, bool),
                   say(TEXT, "whole_number", key=key, value=repr(value)), say(TEXT, "whole_number_hint"))
        else:
            expect(isinstance(value, bool), say(TEXT, "on_off", key=key, value=repr(value)), say(TEXT, "on_off_hint"))
    try:
        budget = estimate(LLAMA_7B, **plan)
    except (TypeError, ValueError) as e:
        raise Wrong(say(TEXT, "refused", error=e), say(TEXT, "refused_hint")) from None
    expect(budget.training.micro_batch >= FIT_MIN_BATCH,
           say(TEXT, "batch_too_small", n=budget.training.micro_batch, min=FIT_MIN_BATCH),
           say(TEXT, "batch_too_small_hint"))
    limit = int(FIT_SHARE * FIT_CAPACITY)
    if not budget.fits(limit):
        top = max(budget.items, key=lambda k: budget.items[k])
        raise Wrong(say(TEXT, "over_limit", total=f"{budget.total / GiB:.1f}", limit=f"{limit / GiB:.0f}", top=top,
                        top_size=f"{budget.items[top] / GiB:.1f}"),
                    say(TEXT, "over_limit_hint"))
    return (say(TEXT, "fit_passed", total=f"{budget.total / GiB:.1f}", limit=f"{limit / GiB:.0f}") + "\n"
            + budget.table(FIT_CAPACITY))


# --- exercise c6-choose-fix: three failures, one fix each, checked by replay ---------------------------------------

PROGRAM_FIXES = ("smaller batch", "checkpointing", "empty_cache")


def _training_program(batch: int, checkpointing: bool, layers: int = 8) -> list[Event]:
    """Failure B's program: 1.5 GiB of weights, then per layer an activation of batch x 256 MiB kept for the
    backward pass and a short-lived workspace of batch x 64 MiB. With checkpointing only each layer's input
    (an eighth of its activations) is kept and the layer is recomputed during backward."""
    events = [alloc(f"w{i}", 256 * MiB, f"weights, part {i}") for i in range(6)]
    act, keep = batch * 256 * MiB, batch * 32 * MiB
    for i in range(layers):
        events.append(alloc(f"act{i}", keep if checkpointing else act, f"forward: activation of layer {i}"))
        events.append(alloc(f"ws{i}", batch * 64 * MiB, f"forward: workspace of layer {i}"))
        events.append(free(f"ws{i}"))
    for i in reversed(range(layers)):
        if checkpointing:
            events.append(alloc(f"re{i}", act, f"backward: layer {i} recomputed"))
        events.append(alloc(f"grad{i}", act, f"backward: gradient of layer {i}"))
        if checkpointing:
            events.append(free(f"re{i}"))
        events.append(free(f"act{i}"))
        events.append(free(f"grad{i}"))
    return events


def _evaluation_then_second_job(empty_cache: bool) -> tuple[list[Event], list[Event]]:
    """Failure C: job 1 evaluates with big temporaries (6 GiB, all freed) and keeps running on 512 MiB; then
    job 2 starts on the same GPU and needs 4 GiB."""
    job1 = [alloc("model", 512 * MiB, "job 1: model")]
    job1 += [alloc(f"eval{i}", 1536 * MiB, f"job 1: evaluation buffer {i}") for i in range(4)]
    job1 += [free(f"eval{i}") for i in range(4)]
    if empty_cache:
        job1.append(Event("empty_cache"))
    job2 = [alloc("weights2", 3 * GiB, "job 2: model"), alloc("act2", 1 * GiB, "job 2: activations")]
    return job1, job2


@dataclass(frozen=True)
class Failure:
    key: str
    program_changes: tuple[str, ...]  # the program fixes the story allows

    @property
    def story(self) -> str:
        """The failure's story, in the notebook's language (TEXT["story_" + key])."""
        return say(TEXT, f"story_{self.key}")


FAILURES: dict[str, Failure] = {
    "A": Failure("A", ()),
    "B": Failure("B", ("smaller batch", "checkpointing")),
    "C": Failure("C", ("empty_cache",)),
}


def _replay_on(events: list[Event], conf: str, gpu: SimulatedGPU | None = None) -> ReplayResult:
    allocator = CachingAllocator(gpu or SimulatedGPU(CANONICAL_CAPACITY), conf)
    return replay(events, allocator)


# Ways people write the program changes: "gradient checkpointing", "torch.cuda.empty_cache()", ...
_PROGRAM_ALIASES = {
    "smaller batch size": "smaller batch", "smaller micro-batch": "smaller batch", "half the batch": "smaller batch",
    "halve the batch": "smaller batch", "gradient checkpointing": "checkpointing",
    "activation checkpointing": "checkpointing",
}


def program_fix(fix: str) -> str:
    """The PROGRAM_FIXES entry `fix` names ("Smaller  batch", "empty_cache()", "torch.cuda.empty_cache()",
    "gradient checkpointing" count too), else ""."""
    name = " ".join(fix.lower().split()).removesuffix("()").removeprefix("torch.cuda.")
    name = _PROGRAM_ALIASES.get(name, name)
    return name if name in PROGRAM_FIXES else ""


def try_fix(key: str, fix: str) -> tuple[bool, str]:
    """Replay failure `key` with `fix` (an allocator config string, or one of PROGRAM_FIXES).
    Returns (saved, what happened in words). Raises ValueError for a config minialloc cannot parse."""
    program = program_fix(fix)
    conf = "" if program else fix
    if key == "A":
        r = _replay_on(canonical_scenario(), conf)
        return r.ooms == 0, _outcome(r)
    if key == "B":
        batch = 2 if program == "smaller batch" else 4
        r = _replay_on(_training_program(batch, program == "checkpointing"), conf)
        return r.ooms == 0, _outcome(r)
    if key == "C":
        gpu = SimulatedGPU(CANONICAL_CAPACITY)
        job1_events, job2_events = _evaluation_then_second_job(program == "empty_cache")
        job1 = CachingAllocator(gpu, conf)
        r1 = replay(job1_events, job1)
        if r1.ooms:  # a setting that breaks job 1 saves nothing
            return False, say(TEXT, "job1_itself", outcome=_outcome(r1))
        r = _replay_on(job2_events, conf, gpu)
        return r.ooms == 0, say(TEXT, "job2", outcome=_outcome(r), reserved=format_size(job1.memory_reserved()),
                                allocated=format_size(job1.memory_allocated()))
    raise KeyError(say(TEXT, "no_failure", key=repr(key), keys=sorted(FAILURES)))


def _outcome(r: ReplayResult) -> str:
    if r.ooms == 0:
        return say(TEXT, "none_fail", allocated=format_size(r.peak_allocated), reserved=format_size(r.peak_reserved))
    return say(TEXT, "some_fail", n=r.ooms, label=r.first_failure_label, allocated=format_size(r.peak_allocated),
               reserved=format_size(r.peak_reserved))


_HINTS = {key: TEXT[f"hint_{key}"] for key in "ABC"}  # each failure's hint, in the three languages


def check_fixes(fn: Callable[[], Any]) -> str:
    """fn() returns {"A": fix, "B": fix, "C": fix}; each fix is replayed on its failure."""
    fixes = call(fn)
    expect(isinstance(fixes, dict) and set(fixes) == set(FAILURES),
           say(TEXT, "fixes_dict", keys=sorted(FAILURES), got=repr(fixes)), say(TEXT, "fixes_dict_hint"))
    if any(v is Ellipsis for v in fixes.values()):
        raise NotYet(say(TEXT, "fix_blank"))
    lines = []
    for key in sorted(FAILURES):
        fix = fixes[key]
        expect(isinstance(fix, str), say(TEXT, "fix_string", key=key, got=repr(fix)),
               say(TEXT, "fix_string_hint", fixes=list(PROGRAM_FIXES)))
        failure = FAILURES[key]
        if program_fix(fix) and program_fix(fix) not in failure.program_changes:
            raise Wrong(say(TEXT, "not_allowed", key=key, fix=fix), say(TEXT, "not_allowed_hint"))
        try:
            saved, what = try_fix(key, fix)
        except (ValueError, TypeError) as e:
            if ":" not in fix:  # neither a setting nor a program change: do not bury that under the parser's list
                raise Wrong(say(TEXT, "neither", key=key, fix=repr(fix), fixes=list(PROGRAM_FIXES)),
                            say(TEXT, "neither_hint")) from None
            raise Wrong(say(TEXT, "bad_setting", key=key, fix=repr(fix), error=e),
                        say(TEXT, "bad_setting_hint")) from None
        if not saved:
            raise Wrong(say(TEXT, "not_saved", key=key, fix=repr(fix), what=what), say(TEXT, f"hint_{key}"),
                        rule=say(TEXT, "fixes_rule"))
        lines.append(say(TEXT, "saved", key=key, fix=repr(fix), what=what))
    return say(TEXT, "all_saved") + "\n" + "\n".join(lines)
