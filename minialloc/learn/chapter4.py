"""Chapter 4 (paging for the KV cache): the opening picture and the exercise checkers.

The hidden references live here, not in the notebook: a learner who opens this file reads the answers, which is
fine for a self-learner and no secret worth guarding; the notebook itself gives none away. Every check runs the
real block manager (minialloc.paging.BlockManager) and compares the learner's answer with what it did.
"""

from __future__ import annotations

import numbers
import random
from collections.abc import Callable
from typing import Any

from ..paging import BlockManager
from . import NotYet, Wrong, call, expect, say

__all__ = ["COW_SCENARIO", "TEXT", "WHY", "check_cow_by_hand", "check_sampling_blocks", "opening_figure",
           "run_cow_scenario", "run_sampling", "why"]

# Every sentence a learner reads from this chapter (its picture's title, the checkers' feedback), in the course's
# three languages (minialloc.lang).
TEXT: dict[str, dict[str, str]] = {
    "opening_title": {
        "en": "Two samples of one prompt: a block table per sequence, blocks anywhere in the pool, the full block "
              "shared",
        "vi": "Hai mẫu sinh từ cùng một prompt: mỗi chuỗi một bảng khối, các khối nằm bất kỳ đâu trong nhóm, khối "
              "đã đầy được dùng chung",
        "de": "Zwei Samples eines Prompts: eine Blocktabelle pro Sequenz, Blöcke irgendwo im Pool, der volle "
              "Block geteilt",
    },
    "copies_list": {"en": "the copies must be a list of (source, destination) pairs, got {type}",
                    "vi": "các bản sao phải là một list gồm các cặp (nguồn, đích), nhưng nhận được {type}",
                    "de": "die Kopien müssen eine Liste von Paaren (Quelle, Ziel) sein, erhalten: {type}"},
    "copies_list_hint": {"en": "write [] if you think nothing is copied",
                         "vi": "hãy viết [] nếu bạn nghĩ không có gì được sao chép",
                         "de": "schreiben Sie [], wenn Ihrer Meinung nach nichts kopiert wird"},
    "copy_pair": {"en": "each copy is a (source, destination) pair, got {item}",
                  "vi": "mỗi bản sao là một cặp (nguồn, đích), nhưng nhận được {item}",
                  "de": "jede Kopie ist ein Paar (Quelle, Ziel), erhalten: {item}"},
    "copy_pair_hint": {"en": "a copy names the shared block it reads and the new block it writes",
                       "vi": "một bản sao ghi rõ khối dùng chung mà nó đọc và khối mới mà nó ghi vào",
                       "de": "eine Kopie nennt den geteilten Block, den sie liest, und den neuen Block, den sie "
                             "schreibt"},
    "two_things": {"en": "return two things: the tables (a dict) and the copies (a list)",
                   "vi": "hãy trả về hai thứ: các bảng (một dict) và các bản sao (một list)",
                   "de": "geben Sie zwei Dinge zurück: die Tabellen (ein dict) und die Kopien (eine Liste)"},
    "two_things_hint": {"en": "end with `return tables, copies`", "vi": "hãy kết thúc bằng `return tables, copies`",
                        "de": "enden Sie mit `return tables, copies`"},
    "tables_dict": {
        "en": "the tables must be a dict with the keys 1 and 2 (the two sequences), got {got}",
        "vi": "các bảng phải là một dict có khóa 1 và 2 (hai chuỗi), nhưng nhận được {got}",
        "de": "die Tabellen müssen ein dict mit den Schlüsseln 1 und 2 sein (die beiden Sequenzen), erhalten: {got}",
    },
    "tables_dict_hint": {"en": "one entry per sequence: {{1: [...], 2: [...]}}",
                         "vi": "mỗi chuỗi một mục: {{1: [...], 2: [...]}}",
                         "de": "ein Eintrag pro Sequenz: {{1: [...], 2: [...]}}"},
    "still_blank": {"en": "a table or the copies are still ...", "vi": "một bảng hoặc các bản sao vẫn còn là ...",
                    "de": "eine Tabelle oder die Kopien sind noch ..."},
    "table_list": {
        "en": "sequence {seq}'s table must be a list of physical block numbers, got {got}",
        "vi": "bảng của chuỗi {seq} phải là một list các số hiệu khối vật lý, nhưng nhận được {got}",
        "de": "die Tabelle von Sequenz {seq} muss eine Liste physischer Blocknummern sein, erhalten: {got}",
    },
    "table_list_hint": {
        "en": "a block table lists one physical block number per logical block: [logical 0's block, ...]",
        "vi": "bảng khối ghi một số hiệu khối vật lý cho mỗi khối logic: [khối của logic 0, ...]",
        "de": "eine Blocktabelle nennt pro logischem Block eine physische Blocknummer: [Block von logisch 0, ...]",
    },
    "table_length": {
        "en": "sequence {seq} ends with {n} logical blocks in your table; its token count needs a different number",
        "vi": "trong bảng của bạn, chuỗi {seq} kết thúc với {n} khối logic; số token của nó cần một số khối khác",
        "de": "Sequenz {seq} endet in Ihrer Tabelle mit {n} logischen Blöcken; ihre Tokenzahl braucht eine andere "
              "Anzahl",
    },
    "table_length_hint": {
        "en": "count the tokens of the sequence at the end, then divide by 4 tokens per block, rounding up",
        "vi": "hãy đếm số token của chuỗi lúc kết thúc, rồi chia cho 4 token mỗi khối, làm tròn lên",
        "de": "zählen Sie die Tokens der Sequenz am Ende und teilen Sie durch 4 Tokens pro Block, aufgerundet",
    },
    "fork_hint": {"en": "a fork copies nothing: the child starts with exactly the parent's table",
                  "vi": "fork không sao chép gì: chuỗi con bắt đầu với đúng bảng khối của chuỗi cha",
                  "de": "ein Fork kopiert nichts: das Kind beginnt mit genau der Tabelle der Elternsequenz"},
    "append_hint": {
        "en": "at each append ask: is the last block full (take the lowest free block) or shared (ref count > 1: "
              "copy it to the lowest free block) or neither (write in place)? A block that the other sequence has "
              "already copied away from is no longer shared",
        "vi": "ở mỗi lần append, hãy tự hỏi: khối cuối đã đầy (lấy khối trống có số nhỏ nhất), hay đang dùng chung "
              "(số tham chiếu > 1: sao chép sang khối trống có số nhỏ nhất), hay không phải cả hai (ghi tại chỗ)? "
              "Khối mà chuỗi kia đã sao chép đi rồi thì không còn dùng chung nữa",
        "de": "fragen Sie bei jedem Append: Ist der letzte Block voll (den niedrigsten freien Block nehmen), geteilt "
              "(Referenzzähler > 1: in den niedrigsten freien Block kopieren) oder keins von beiden (an Ort und "
              "Stelle schreiben)? Ein Block, von dem die andere Sequenz schon wegkopiert hat, ist nicht mehr geteilt",
    },
    "wrong_block": {
        "en": "sequence {seq}, logical block {i}: your table says physical block {block}, which is not where the "
              "block manager put it",
        "vi": "chuỗi {seq}, khối logic {i}: bảng của bạn ghi khối vật lý {block}, nhưng bộ quản lý khối không đặt "
              "nó ở đó",
        "de": "Sequenz {seq}, logischer Block {i}: Ihre Tabelle nennt den physischen Block {block}, dort hat der "
              "Blockmanager ihn nicht abgelegt",
    },
    "copy_count": {
        "en": "your tables are right, but you list {n} copies; the block manager made a different number",
        "vi": "các bảng của bạn đều đúng, nhưng bạn liệt kê {n} bản sao; bộ quản lý khối tạo ra số bản sao khác",
        "de": "Ihre Tabellen stimmen, aber Sie nennen {n} Kopien; der Blockmanager hat eine andere Anzahl gemacht",
    },
    "copy_count_hint": {
        "en": "a copy happens only when a write hits a block whose ref count is above 1",
        "vi": "chỉ sao chép khi một lần ghi chạm vào khối có số tham chiếu lớn hơn 1",
        "de": "kopiert wird nur, wenn ein Schreibzugriff einen Block mit Referenzzähler über 1 trifft",
    },
    "copy_wrong": {
        "en": "your tables are right, but a copy's source or destination is not",
        "vi": "các bảng của bạn đều đúng, nhưng nguồn hoặc đích của một bản sao thì chưa đúng",
        "de": "Ihre Tabellen stimmen, aber Quelle oder Ziel einer Kopie nicht",
    },
    "copy_wrong_hint": {
        "en": "the source is the shared block before the write, the destination the block the writer's table names "
              "afterwards",
        "vi": "nguồn là khối dùng chung trước lần ghi, đích là khối mà bảng của chuỗi đang ghi trỏ tới sau đó",
        "de": "die Quelle ist der geteilte Block vor dem Schreiben, das Ziel der Block, den die Tabelle der "
              "schreibenden Sequenz danach nennt",
    },
    "cow_passed": {"en": "tables {tables}, copies {copies}, as the block manager made them",
                   "vi": "bảng {tables}, bản sao {copies}, đúng như bộ quản lý khối đã tạo",
                   "de": "Tabellen {tables}, Kopien {copies}, wie der Blockmanager sie angelegt hat"},
    "not_int": {"en": "blocks_after_sampling({args}) returned {got}, not an int",
                "vi": "blocks_after_sampling({args}) trả về {got}, không phải một int",
                "de": "blocks_after_sampling({args}) gab {got} zurück, kein int"},
    "not_int_hint": {
        "en": "a number of blocks is a whole number: use // and the ceiling trick -(-a // b)",
        "vi": "số khối là số nguyên: hãy dùng // và mẹo làm tròn lên -(-a // b)",
        "de": "eine Anzahl Blöcke ist ganzzahlig: nehmen Sie // und den Aufrundungstrick -(-a // b)",
    },
    "no_writes_hint": {
        "en": "before anyone writes, nothing has been copied: what do the samples share right after a fork?",
        "vi": "trước khi ai ghi gì thì chưa có gì được sao chép: ngay sau fork, các mẫu dùng chung những gì?",
        "de": "bevor jemand schreibt, ist nichts kopiert: was teilen die Samples direkt nach einem Fork?",
    },
    "full_prompt_hint": {
        "en": "when the prompt fills its last block exactly, every prompt block is full: does the first generated "
              "token go into one of them, or into a new block? Is anything copied?",
        "vi": "khi prompt lấp vừa khít khối cuối cùng, mọi khối của prompt đều đầy: token sinh ra đầu tiên nằm "
              "trong một khối đó, hay trong một khối mới? Có gì bị sao chép không?",
        "de": "wenn der Prompt seinen letzten Block genau füllt, sind alle Prompt-Blöcke voll: kommt das erste "
              "erzeugte Token in einen davon oder in einen neuen Block? Wird etwas kopiert?",
    },
    "partial_hint": {
        "en": "full prompt blocks stay shared; the partly filled one is copied by every writer but the last, which "
              "finds it no longer shared; count each sample's blocks from there on",
        "vi": "các khối prompt đã đầy vẫn được dùng chung; khối chỉ đầy một phần thì mẫu nào ghi vào cũng sao chép nó, "
              "trừ mẫu cuối cùng, vì lúc đó khối không còn dùng chung nữa; từ đó hãy đếm khối của từng mẫu",
        "de": "volle Prompt-Blöcke bleiben geteilt; den teilweise gefüllten kopiert jede schreibende Sequenz außer "
              "der letzten, die ihn nicht mehr geteilt vorfindet; zählen Sie von da an die Blöcke jedes Samples",
    },
    "more": {"en": "more", "vi": "nhiều", "de": "mehr"},
    "fewer": {"en": "fewer", "vi": "ít", "de": "weniger"},
    "sampling_wrong": {
        "en": "blocks_after_sampling(prompt={prompt}, samples={samples}, generated={generated}, block_size={bs}) "
              "returned {got}; the block manager ends with {more} blocks in use",
        "vi": "blocks_after_sampling(prompt={prompt}, samples={samples}, generated={generated}, block_size={bs}) "
              "trả về {got}; bộ quản lý khối kết thúc với {more} khối đang dùng hơn thế",
        "de": "blocks_after_sampling(prompt={prompt}, samples={samples}, generated={generated}, block_size={bs}) "
              "gab {got} zurück; beim Blockmanager sind am Ende {more} Blöcke belegt",
    },
    "sampling_passed": {"en": "{n} cases agree with the block manager, boundaries included",
                        "vi": "{n} trường hợp đều khớp với bộ quản lý khối, kể cả các trường hợp biên",
                        "de": "{n} Fälle stimmen mit dem Blockmanager überein, Grenzfälle eingeschlossen"},
    "cow_rule": {
        "en": "chapter 4, 'Sharing: fork and copy-on-write': what a fork copies, and which write makes a copy",
        "vi": "chương 4, 'Dùng chung: fork và sao chép khi ghi (copy-on-write)': một lần fork sao chép những gì, "
              "và lần ghi nào tạo ra một "
              "bản sao",
        "de": "Kapitel 4, 'Teilen: Fork und Copy-on-Write': was ein Fork kopiert und welcher Schreibzugriff eine "
              "Kopie auslöst",
    },
}

# Why each prediction of this chapter comes out as it does: shown by learn.reveal once the learner has
# predicted, never in the notebook's visible source (a Run All would show it under the blank cell).
WHY: dict[str, dict[str, str]] = {
    "c4-grow": {
        "en": "9 tokens need 3 blocks of 4 (9 / 4, rounded up). A block is taken only when the last one is full: the "
              "prompt took 2, and the 9th token opened the 3rd. The other 5 stay free for other sequences; this "
              "sequence wastes 3 slots of its last block, never more than one block's worth.",
        "vi": "9 token cần 3 khối 4 token (9 / 4, làm tròn lên). Một khối mới chỉ được lấy khi khối cuối đã đầy: "
              "prompt chiếm 2 khối, và token thứ 9 mở ra khối thứ 3. 5 khối còn lại vẫn trống cho các chuỗi khác; "
              "chuỗi này lãng phí 3 ô trong khối cuối, và không bao giờ lãng phí quá một khối.",
        "de": "9 Token brauchen 3 Blöcke zu 4 (9 / 4, aufgerundet). Ein Block wird erst genommen, wenn der letzte "
              "voll ist: Der Prompt hat 2 belegt, und das 9. Token hat den 3. begonnen. Die übrigen 5 bleiben für "
              "andere Sequenzen frei; diese Sequenz verschwendet 3 Plätze ihres letzten Blocks, nie mehr als einen "
              "Block.",
    },
    "c4-cow-used": {
        "en": "the fork copied nothing: both tables named the same 3 blocks, each with reference count 2. Sequence "
              "2's token went into the shared, partly filled last block, so that one block was copied first (3 + 1 = "
              "4 in use); the two full blocks stay shared.",
        "vi": "lần fork không sao chép gì: cả hai bảng cùng trỏ tới 3 khối giống nhau, mỗi khối có số tham chiếu 2. "
              "Token của chuỗi 2 được ghi vào khối cuối đang dùng chung và chưa đầy, nên riêng khối đó được sao chép "
              "trước (3 + 1 = 4 khối đang dùng); hai khối đầy vẫn được dùng chung.",
        "de": "der Fork hat nichts kopiert: Beide Tabellen nannten dieselben 3 Blöcke, jeden mit Referenzzähler 2. "
              "Das Token von Sequenz 2 kam in den geteilten, teilweise gefüllten letzten Block, also wurde dieser "
              "eine Block zuerst kopiert (3 + 1 = 4 belegt); die beiden vollen Blöcke bleiben geteilt.",
    },
    "c4-prefix-hit": {
        "en": "the system prompt fills two full blocks, cached under chained hashes, so request 11 reuses both (8 "
              "tokens). Each request's last block holds its own tokens and is its own: 3 blocks for request 10, 1 new"
              " one for request 11, 4 in all.",
        "vi": "system prompt lấp đầy hai khối, được lưu trong bộ đệm theo các hash móc nối, nên yêu cầu 11 dùng lại "
              "cả hai (8 token). Khối cuối của mỗi yêu cầu chứa token riêng của nó và thuộc về riêng nó: 3 khối cho "
              "yêu cầu 10, 1 khối mới cho yêu cầu 11, tổng cộng 4.",
        "de": "der System-Prompt füllt zwei volle Blöcke, die unter verketteten Hashes im Cache liegen, also "
              "verwendet Anfrage 11 beide wieder (8 Token). Der letzte Block jeder Anfrage enthält ihre eigenen Token"
              " und gehört ihr allein: 3 Blöcke für Anfrage 10, 1 neuer für Anfrage 11, insgesamt 4.",
    },
}


def why(pid: str, **fields: object) -> str:
    """The explanation of prediction ``pid`` in the notebook's language, with the measured ``fields`` filled in."""
    return say(WHY, pid, **fields)


def opening_figure() -> Any:
    """The chapter's picture: two samples of one prompt after a fork and one write each (copy-on-write)."""
    from ..viz.block_table import plot_block_table

    m = BlockManager(num_blocks=8, block_size=4)
    m.allocate(1, [11, 12, 13, 14, 15, 16])
    m.fork(1, 2)
    m.append_token(2, 99)
    return plot_block_table(m, title=say(TEXT, "opening_title"))


# --- exercise c4-cow-by-hand: fill two block tables for a fork with copy-on-write ---------------------------------

# The scenario the notebook describes in words, step by step. A fresh manager hands out its free blocks lowest
# number first, which is what makes the tables predictable by hand.
COW_SCENARIO: list[tuple[str, int, Any]] = [
    ("allocate", 1, [1, 2, 3, 4, 5, 6]),
    ("fork", 1, 2),
    ("append", 1, 7),
    ("append", 1, 8),
    ("append", 2, 70),
    ("append", 2, 80),
    ("append", 2, 90),
]


def run_cow_scenario() -> tuple[dict[int, list[int]], list[tuple[int, int]]]:
    """Run COW_SCENARIO on a BlockManager(num_blocks=8, block_size=4): (tables by sequence, copies in order)."""
    m = BlockManager(num_blocks=8, block_size=4)
    for op, seq, arg in COW_SCENARIO:
        if op == "allocate":
            m.allocate(seq, arg)
        elif op == "fork":
            m.fork(seq, arg)
        else:
            m.append_token(seq, arg)
    return {sid: list(m.seq(sid).table) for sid in (1, 2)}, m.take_copies()


def _as_pairs(copies: Any) -> list[tuple[int, int]]:
    expect(isinstance(copies, (list, tuple)), say(TEXT, "copies_list", type=type(copies).__name__),
           say(TEXT, "copies_list_hint"))
    pairs = []
    for c in copies:
        expect(isinstance(c, (list, tuple)) and len(c) == 2, say(TEXT, "copy_pair", item=repr(c)),
               say(TEXT, "copy_pair_hint"))
        pairs.append((c[0], c[1]))
    return pairs


def check_cow_by_hand(fn: Callable[[], Any]) -> str:
    """fn() returns ({1: table, 2: table}, [(src, dst), ...]) for COW_SCENARIO, filled in by hand."""
    answer = call(fn)
    expect(isinstance(answer, tuple) and len(answer) == 2, say(TEXT, "two_things"), say(TEXT, "two_things_hint"))
    tables, copies = answer
    expect(isinstance(tables, dict) and set(tables) == {1, 2}, say(TEXT, "tables_dict", got=repr(tables)),
           say(TEXT, "tables_dict_hint"))
    if any(t is Ellipsis for t in tables.values()) or copies is Ellipsis:
        raise NotYet(say(TEXT, "still_blank"))
    right_tables, right_copies = run_cow_scenario()
    pairs = _as_pairs(copies)
    for sid in (1, 2):
        table = tables[sid]
        expect(isinstance(table, (list, tuple)) and all(isinstance(b, numbers.Integral) and not isinstance(b, bool)
                                                        for b in table),
               say(TEXT, "table_list", seq=sid, got=repr(table)), say(TEXT, "table_list_hint"))
        mine, real = [int(b) for b in table], right_tables[sid]
        if len(mine) != len(real):
            raise Wrong(say(TEXT, "table_length", seq=sid, n=len(mine)), say(TEXT, "table_length_hint"),
                        rule=say(TEXT, "cow_rule"))
        for i, (a, b) in enumerate(zip(mine, real, strict=True)):
            if a != b:
                hint = say(TEXT, "fork_hint" if i == 0 else "append_hint")
                raise Wrong(say(TEXT, "wrong_block", seq=sid, i=i, block=a), hint, rule=say(TEXT, "cow_rule"))
    if len(pairs) != len(right_copies):
        raise Wrong(say(TEXT, "copy_count", n=len(pairs)), say(TEXT, "copy_count_hint"), rule=say(TEXT, "cow_rule"))
    expect(pairs == right_copies, say(TEXT, "copy_wrong"), say(TEXT, "copy_wrong_hint"), rule=say(TEXT, "cow_rule"))
    return say(TEXT, "cow_passed", tables=right_tables, copies=right_copies)


# --- exercise c4-sampling-blocks: physical blocks after parallel sampling ------------------------------------------


def run_sampling(prompt: int, samples: int, generated: int, block_size: int = 16) -> int:
    """Physical blocks in use after `samples` parallel samples of a `prompt`-token prompt each generated
    `generated` tokens, measured on the block manager (fork, then decode step by step)."""
    needed = samples * (-(-(prompt + generated) // block_size)) + 1
    m = BlockManager(num_blocks=needed, block_size=block_size, enable_prefix_caching=False)
    m.allocate(0, list(range(prompt)))
    for s in range(1, samples):
        m.fork(0, s)
    for step in range(generated):  # one decoding step appends a token to every sample
        for s in range(samples):
            m.append_token(s, 10_000 + step)
    return needed - m.num_free_blocks


def _sampling_cases(seed: int = 4) -> list[tuple[int, int, int, int]]:
    """Boundaries first (prompt a multiple of the block size, nothing generated, one sample), then random ones."""
    cases = [(20, 3, 5, 16), (32, 2, 1, 16), (32, 3, 0, 16), (20, 3, 0, 16), (7, 1, 30, 16), (16, 4, 16, 16),
             (5, 2, 3, 4), (1, 5, 1, 4)]
    rng = random.Random(seed)
    for _ in range(30):
        bs = rng.choice((4, 8, 16))
        cases.append((rng.randint(1, 70), rng.randint(1, 6), rng.randint(0, 40), bs))
    return cases


def check_sampling_blocks(fn: Callable[..., Any]) -> str:
    """fn(prompt, samples, generated, block_size) -> physical blocks in use, checked against the block manager."""
    cases = _sampling_cases()
    for prompt, samples, generated, bs in cases:
        got = call(fn, prompt, samples, generated, bs)
        # an int or any whole-number type (numpy's int64 too); a float, even 4.0, is not a count of blocks
        expect(isinstance(got, numbers.Integral) and not isinstance(got, bool),
               say(TEXT, "not_int", args=f"{prompt}, {samples}, {generated}, {bs}", got=repr(got)),
               say(TEXT, "not_int_hint"))
        got = int(got)
        real = run_sampling(prompt, samples, generated, bs)
        if got != real:
            more = say(TEXT, "more" if real > got else "fewer")
            if generated == 0:
                hint = say(TEXT, "no_writes_hint")
            elif prompt % bs == 0:
                hint = say(TEXT, "full_prompt_hint")
            else:
                hint = say(TEXT, "partial_hint")
            raise Wrong(say(TEXT, "sampling_wrong", prompt=prompt, samples=samples, generated=generated, bs=bs,
                            got=got, more=more), hint, rule=say(TEXT, "cow_rule"))
    return say(TEXT, "sampling_passed", n=len(cases))
