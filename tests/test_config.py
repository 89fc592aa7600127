"""Tests for minialloc.config: PYTORCH_CUDA_ALLOC_CONF's grammar, read from MINIALLOC_ALLOC_CONF."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minialloc.config import ENV_VAR, AllocatorConfig, ConfigError
from minialloc.sizes import GiB, MiB

parse = AllocatorConfig.parse


# --- defaults ---


def test_defaults():
    c = AllocatorConfig()
    assert c.backend == "native"
    assert c.max_split_size is None
    assert c.max_non_split_rounding == 20 * MiB
    assert c.garbage_collection_threshold == 0.0
    assert c.roundup_power2_divisions == (0,) * 16
    assert not (c.expandable_segments or c.release_lock_on_cudamalloc or c.pinned_use_cuda_host_register)
    assert c.pinned_num_register_threads == 1
    assert c.debug_guards is False
    assert c.text == ""


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_empty_string_gives_defaults(text):
    assert parse(text) == AllocatorConfig()


def test_default_settings_dict_matches_pytorch_snapshot():
    d = AllocatorConfig().settings_dict()
    assert list(d) == [
        "PYTORCH_CUDA_ALLOC_CONF",
        "max_split_size",
        "garbage_collection_threshold",
        "expandable_segments",
        "pinned_num_register_threads",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "graph_capture_record_stream_reuse",
        "roundup_power2_divisions",
    ]
    assert d["PYTORCH_CUDA_ALLOC_CONF"] == ""
    assert d["max_split_size"] == -1  # int64_t(SIZE_MAX), PyTorch's "unset"
    assert d["garbage_collection_threshold"] == 0.0
    assert d["roundup_power2_divisions"] == {str(2**i): 0 for i in range(16)}
    assert list(d["roundup_power2_divisions"])[:3] == ["1", "2", "4"]
    assert list(d["roundup_power2_divisions"])[-1] == "32768"


def test_settings_dict_with_values():
    text = "max_split_size_mb:128,garbage_collection_threshold:0.6,roundup_power2_divisions:4"
    d = parse(text).settings_dict()
    assert d["max_split_size"] == 128 * MiB
    assert d["garbage_collection_threshold"] == 0.6
    assert set(d["roundup_power2_divisions"].values()) == {4}
    assert d["PYTORCH_CUDA_ALLOC_CONF"] == text


# --- each key ---


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("backend:native", "backend", "native"),
        ("max_split_size_mb:20", "max_split_size", 20 * MiB),
        ("max_split_size_mb:128", "max_split_size", 128 * MiB),
        ("max_non_split_rounding_mb:256", "max_non_split_rounding", 256 * MiB),
        ("garbage_collection_threshold:0.6", "garbage_collection_threshold", 0.6),
        ("garbage_collection_threshold:.25", "garbage_collection_threshold", 0.25),
        ("garbage_collection_threshold:5e-1", "garbage_collection_threshold", 0.5),
        ("expandable_segments:True", "expandable_segments", True),
        ("expandable_segments:False", "expandable_segments", False),
        ("release_lock_on_cudamalloc:True", "release_lock_on_cudamalloc", True),
        ("release_lock_on_hipmalloc:True", "release_lock_on_cudamalloc", True),  # PyTorch's ROCm spelling
        ("pinned_use_cuda_host_register:True", "pinned_use_cuda_host_register", True),
        ("pinned_use_hip_host_register:True", "pinned_use_cuda_host_register", True),
        ("pinned_num_register_threads:8", "pinned_num_register_threads", 8),
        ("pinned_num_register_threads:128", "pinned_num_register_threads", 128),
        ("debug_guards:True", "debug_guards", True),
        ("large_segment_size_mb:11", "large_segment_size", 11 * MiB),
        ("per_process_memory_fraction:0.5", "per_process_memory_fraction", 0.5),
        ("per_process_memory_fraction:0", "per_process_memory_fraction", 0.0),
        ("per_process_memory_fraction:1", "per_process_memory_fraction", 1.0),
    ],
)
def test_each_key(text, field, value):
    c = parse(text)
    assert getattr(c, field) == value
    # large_segment_size_mb also moves max_non_split_rounding's default (PyTorch's default is the large segment)
    others = {f.name for f in dataclasses.fields(c)} - {field, "text", "max_non_split_rounding"}
    assert all(getattr(c, f) == getattr(AllocatorConfig(), f) for f in others)


def test_spaces_ignored_and_text_normalised():
    c = parse(" max_split_size_mb : 128 ,\texpandable_segments: True ")
    assert c.max_split_size == 128 * MiB and c.expandable_segments
    assert c.text == "max_split_size_mb:128,expandable_segments:True"


def test_trailing_comma_allowed_as_in_pytorch():
    assert parse("expandable_segments:True,").expandable_segments


def test_duplicate_key_last_wins():
    assert parse("max_split_size_mb:40,max_split_size_mb:80").max_split_size == 80 * MiB
    assert not parse("expandable_segments:True,expandable_segments:False").expandable_segments


# --- roundup_power2_divisions ---


def test_roundup_single_value_fills_all_16():
    assert parse("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16
    assert parse("roundup_power2_divisions:1").roundup_power2_divisions == (1,) * 16


def test_roundup_list_worked_example():
    # [256:1,512:2,1024:4,>:8]: 256 MB is entry log2(256) = 8 and, being first, fills entries 0-7 too;
    # 512 -> entry 9, 1024 -> entry 10; '>' fills from the entry after the last one set (11) to the end.
    c = parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert c.roundup_power2_divisions == (1,) * 9 + (2, 4) + (8,) * 5
    assert c.roundup_divisions_for(1) == 1
    assert c.roundup_divisions_for(300 * MiB) == 1  # class 256 MB
    assert c.roundup_divisions_for(600 * MiB) == 2
    assert c.roundup_divisions_for(1 * GiB) == 4
    assert c.roundup_divisions_for(2 * GiB) == 8


def test_roundup_list_pytorch_test_cases():
    # The expectations of PyTorch's c10/test/core/AllocatorConfig_test.cpp (allocator_config_test).
    c = parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
    expected = [(32, 8), (64, 8), (128, 2), (256, 4), (512, 2), (1024, 4), (2048, 1), (4096, 1), (8192, 1)]
    for mb, want in expected:
        assert c.roundup_divisions_for(mb * MiB) == want, mb
    c = parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    for mb, want in [(64, 8), (128, 8), (256, 16), (512, 1), (1024, 0), (2048, 8), (4096, 2)]:
        assert c.roundup_divisions_for(mb * MiB) == want, mb
    assert c.roundup_power2_divisions == (8,) * 8 + (16, 1, 0, 8) + (2,) * 4


def test_roundup_list_edges():
    assert parse("roundup_power2_divisions:[]").roundup_power2_divisions == (0,) * 16
    assert parse("roundup_power2_divisions:[256:4,]").roundup_power2_divisions == (4,) * 9 + (0,) * 7
    # '>' first: nothing set yet, so it fills from entry 1 and leaves entry 0 alone, as PyTorch does.
    assert parse("roundup_power2_divisions:[>:4]").roundup_power2_divisions == (0,) + (4,) * 15
    # Sizes beyond 32768 MB clamp to the last entry; 1 MB is entry 0.
    assert parse("roundup_power2_divisions:[65536:4]").roundup_power2_divisions == (4,) * 16
    assert parse("roundup_power2_divisions:[1:2]").roundup_power2_divisions == (2,) + (0,) * 15
    # 0 inside the list turns rounding off for that class.
    assert parse("roundup_power2_divisions:[1:0,2:4]").roundup_power2_divisions == (0, 4) + (0,) * 14


def test_roundup_repeated_list_updates_the_table():
    # PyTorch resets the table once per parse, not per key: a second list edits the first one's table.
    c = parse("roundup_power2_divisions:[256:1,>:8],roundup_power2_divisions:[1:2]")
    assert c.roundup_power2_divisions == (2,) + (1,) * 8 + (8,) * 7


@pytest.mark.parametrize(
    ("size", "index"),
    [(1, 0), (MiB - 1, 0), (MiB, 0), (2 * MiB - 1, 0), (2 * MiB, 1), (256 * MiB, 8), (32 * 1024 * GiB, 15)],
)
def test_roundup_divisions_for_size_class(size, index):
    c = AllocatorConfig(roundup_power2_divisions=tuple(2**i for i in range(16)))
    assert c.roundup_divisions_for(size) == 2**index


# --- errors: each names the key or token ---


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("foo:1", ["Unrecognized key 'foo'", "Accepted keys:", "max_split_size_mb", "MINIALLOC_ALLOC_CONF"]),
        ("Expandable_segments:True", ["Unrecognized key 'Expandable_segments'", "case-sensitive"]),
        ("pinned_use_background_threads:True", ["'pinned_use_background_threads'", "does not model"]),
        ("max_split_size_mb", ["max_split_size_mb", "expected ':'", "max_split_size_mb:128"]),
        ("max_split_size_mb=128", ["Unrecognized key 'max_split_size_mb=128'"]),
        ("max_split_size_mb:", ["max_split_size_mb", "expected a value"]),
        ("max_split_size_mb:,expandable_segments:True", ["max_split_size_mb", "empty value"]),
        ("max_split_size_mb:abc", ["max_split_size_mb", "'abc' is not a whole number"]),
        ("max_split_size_mb:12abc", ["'12abc'"]),
        ("max_split_size_mb:-1", ["'-1'"]),
        ("max_split_size_mb:1.5", ["'1.5'"]),
        ("max_split_size_mb:19", ["CachingAllocator option max_split_size_mb too small, must be >= 20", "got 19"]),
        ("max_non_split_rounding_mb:10", ["option max_non_split_rounding_mb too small, must be >= 20"]),
        ("large_segment_size_mb:10", ["CachingAllocator option large_segment_size_mb must be > 10 MB"]),
        ("large_segment_size_mb:abc", ["large_segment_size_mb", "'abc' is not a whole number"]),
        ("max_split_size_mb:30,large_segment_size_mb:40", ["max_split_size_mb too small, must be >= 40"]),
        ("large_segment_size_mb:40,max_non_split_rounding_mb:39", ["rounding_mb too small, must be >= 40"]),
        ("per_process_memory_fraction:1.5", ["per_process_memory_fraction is invalid, set it in [0.0, 1.0]"]),
        ("per_process_memory_fraction:half", ["per_process_memory_fraction", "'half'"]),
        ("max_split_size_mb:40:50", ["max_split_size_mb", "expected ','", "':'"]),
        ("garbage_collection_threshold:0", ["garbage_collection_threshold", "between 0.0 and 1.0"]),
        ("garbage_collection_threshold:1.0", ["garbage_collection_threshold", "out of range"]),
        ("garbage_collection_threshold:nan", ["garbage_collection_threshold", "'nan'"]),
        ("garbage_collection_threshold:half", ["'half'", "decimal"]),
        ("expandable_segments:true", ["expandable_segments", "'true'", "True or False"]),
        ("expandable_segments:1", ["expandable_segments", "'1'"]),
        ("debug_guards:yes", ["debug_guards", "'yes'"]),
        ("release_lock_on_cudamalloc:TRUE", ["release_lock_on_cudamalloc", "'TRUE'"]),
        ("expandable_segments:True expandable_segments:False", ["'Trueexpandable_segments'"]),
        ("backend:cudaMallocAsync", ["cudaMallocAsync", "models only the native"]),
        ("backend:foo", ["backend", "'foo'", "accepts only native"]),
        ("pinned_num_register_threads:3", ["pinned_num_register_threads", "power of two"]),
        ("pinned_num_register_threads:256", ["pinned_num_register_threads", "up to 128"]),
        ("pinned_num_register_threads:0", ["pinned_num_register_threads", "0 is not"]),
        (",expandable_segments:True", ["expected a key, got ','"]),
        ("expandable_segments:True,,debug_guards:True", ["expected a key, got ','"]),
        ("roundup_power2_divisions:0", ["roundup_power2_divisions", "power of two", "only inside the list"]),
        ("roundup_power2_divisions:3", ["roundup_power2_divisions", "3 must be a power of two"]),
        ("roundup_power2_divisions:[256:3]", ["roundup_power2_divisions", "divisions 3", "'256'"]),
        ("roundup_power2_divisions:[300:2]", ["roundup_power2_divisions", "300 MB must be a power of two"]),
        ("roundup_power2_divisions:[0:2]", ["roundup_power2_divisions", "0 MB"]),
        ("roundup_power2_divisions:[256:1", ["roundup_power2_divisions", "closing ']'"]),
        ("roundup_power2_divisions:[256:1:2]", ["expected ',' or ']'", "':'"]),
        ("roundup_power2_divisions:[256]", ["roundup_power2_divisions", "expected ':'"]),
        ("roundup_power2_divisions:[256:]", ["roundup_power2_divisions", "empty value"]),
        ("roundup_power2_divisions:[,]", ["roundup_power2_divisions", "got ','"]),
        ("roundup_power2_divisions:[big:2]", ["roundup_power2_divisions", "'big'"]),
        ("roundup_power2_divisions:]", ["roundup_power2_divisions", "empty value"]),
    ],
)
def test_errors_name_the_problem(text, fragments):
    with pytest.raises(ConfigError) as info:
        parse(text)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_errors_give_an_example():
    with pytest.raises(ConfigError, match="example: roundup_power2_divisions:"):
        parse("roundup_power2_divisions:[256:3]")
    with pytest.raises(ConfigError, match="example: expandable_segments:True"):
        parse("expandable_segments:yes")


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# --- construction, with_changes ---


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        AllocatorConfig().debug_guards = True  # type: ignore[misc]


def test_with_changes():
    c = parse("max_split_size_mb:128")
    d = c.with_changes(expandable_segments=True, roundup_power2_divisions=[2] * 16)
    assert d.expandable_segments and d.max_split_size == 128 * MiB
    assert d.roundup_power2_divisions == (2,) * 16  # a list becomes a tuple: the config stays hashable
    assert hash(d) != hash(c)
    assert c.expandable_segments is False


@pytest.mark.parametrize(
    "changes",
    [
        {"backend": "cudaMallocAsync"},
        {"backend": "bogus"},
        {"max_split_size": 19 * MiB},
        {"max_non_split_rounding": MiB},
        {"garbage_collection_threshold": 1.0},
        {"garbage_collection_threshold": -0.5},
        {"roundup_power2_divisions": (4,) * 15},
        {"roundup_power2_divisions": (3,) * 16},
        {"pinned_num_register_threads": 6},
        {"large_segment_size": 10 * MiB},
        {"per_process_memory_fraction": 1.5},
        {"large_segment_size": 40 * MiB, "max_split_size": 30 * MiB},
    ],
)
def test_with_changes_validates(changes):
    with pytest.raises(ConfigError):
        AllocatorConfig().with_changes(**changes)


# --- environment ---


def test_from_env_unset_or_empty():
    assert AllocatorConfig.from_env({}) == AllocatorConfig()
    assert AllocatorConfig.from_env({ENV_VAR: ""}) == AllocatorConfig()
    # Only MINIALLOC_ALLOC_CONF is read: a PyTorch setting in the same environment is not minialloc's.
    assert AllocatorConfig.from_env({"PYTORCH_CUDA_ALLOC_CONF": "foo:1"}) == AllocatorConfig()


def test_from_env_reads_variable():
    c = AllocatorConfig.from_env({ENV_VAR: "expandable_segments:True,debug_guards:True"})
    assert c.expandable_segments and c.debug_guards


def test_from_env_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "max_split_size_mb:64")
    assert AllocatorConfig.from_env().max_split_size == 64 * MiB
    monkeypatch.delenv(ENV_VAR)
    assert AllocatorConfig.from_env() == AllocatorConfig()


def test_from_env_error_names_the_variable():
    with pytest.raises(ConfigError, match=r"MINIALLOC_ALLOC_CONF='expandable_segments:yes'.*'yes'"):
        AllocatorConfig.from_env({ENV_VAR: "expandable_segments:yes"})


# --- properties ---

_VALUES = {
    "backend": st.just("native"),
    "max_split_size_mb": st.integers(20, 10**6).map(str),
    "max_non_split_rounding_mb": st.integers(20, 10**6).map(str),
    "garbage_collection_threshold": st.floats(0.01, 0.99).map(lambda x: f"{x:.3f}"),
    "roundup_power2_divisions": st.one_of(
        st.integers(0, 6).map(lambda k: str(2**k)),
        st.lists(
            st.tuples(
                st.one_of(st.just(">"), st.integers(0, 17).map(lambda k: str(2**k))),
                st.sampled_from([0, 1, 2, 4, 8, 16]),
            ),
            max_size=5,
        ).map(lambda items: "[" + ",".join(f"{b}:{n}" for b, n in items) + "]"),
    ),
    "expandable_segments": st.sampled_from(["True", "False"]),
    "release_lock_on_cudamalloc": st.sampled_from(["True", "False"]),
    "pinned_use_cuda_host_register": st.sampled_from(["True", "False"]),
    "pinned_num_register_threads": st.integers(0, 7).map(lambda k: str(2**k)),
    "debug_guards": st.sampled_from(["True", "False"]),
    "per_process_memory_fraction": st.floats(0.0, 1.0).map(lambda x: f"{x:.3f}"),
}
_valid_texts = st.lists(
    st.sampled_from(sorted(_VALUES)).flatmap(lambda key: _VALUES[key].map(lambda v: f"{key}:{v}")), max_size=6
).map(",".join)


@given(_valid_texts, st.data())
def test_valid_configs_round_trip(text, data):
    c = parse(text)
    assert parse(c.text) == c
    assert c.text == text and not any(ch.isspace() for ch in c.text)
    # Whitespace anywhere changes nothing (ConfigTokenizer drops it): up to 8 runs at drawn positions (a draw per
    # character, as before, made this the slowest test of `make check`; the positions still range over the text)
    spaced = text
    for at, gap in data.draw(st.lists(st.tuples(st.integers(0, len(text)), st.sampled_from([" ", "  ", "\t"])),
                                      max_size=8)):
        spaced = spaced[:at] + gap + spaced[at:]
    assert parse(spaced) == c


@given(st.text())
def test_random_text_raises_only_config_error(text):
    try:
        c = parse(text)
    except ConfigError:
        return
    assert parse(c.text) == c


_TOKENS = [*_VALUES, "foo", ",", ":", "[", "]", ">", "True", "False", "0", "1", "3", "20", "256", "0.5", "-1"]
_TOKENS.append(" ")


@given(st.lists(st.sampled_from(_TOKENS), max_size=12).map("".join))
def test_near_miss_text_raises_only_config_error(text):
    try:
        c = parse(text)
    except ConfigError:
        return
    assert parse(c.text) == c
    assert len(c.roundup_power2_divisions) == 16


# --- PyTorch 2.13: large_segment_size_mb, per_process_memory_fraction, runtime changes (issue 15) ---


def test_large_segment_size_sets_the_least_split_sizes():
    # Measured with PyTorch 2.13.0's AcceleratorAllocatorConfig: large_segment_size_mb:40 gives
    # max_non_split_rounding_size() == 40 MiB, and max_split_size_mb must then be >= 40.
    c = parse("large_segment_size_mb:40")
    assert (c.large_segment_size, c.max_non_split_rounding, c.max_split_size) == (40 * MiB, 40 * MiB, None)
    assert parse("large_segment_size_mb:40,max_split_size_mb:40").max_split_size == 40 * MiB
    # Taken before the sizes it bounds, wherever it stands in the string; the last one wins.
    assert parse("max_split_size_mb:30,large_segment_size_mb:20").max_split_size == 30 * MiB
    assert parse("large_segment_size_mb:40,large_segment_size_mb:12").large_segment_size == 12 * MiB
    assert parse("max_split_size_mb:20").max_split_size == 20 * MiB  # 20 accepted, as since 2.9


def test_runtime_change_reparses_from_defaults():
    # torch._C._accelerator_setAllocatorSettings in 2.13: parseArgs resets max_split_size, the rounding
    # divisions, garbage_collection_threshold and max_non_split_rounding (to the large segment size) first.
    c = parse("max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.5,"
              "max_non_split_rounding_mb:64")
    d = c.updated("expandable_segments:True")
    assert d.expandable_segments
    assert d.max_split_size is None and d.roundup_power2_divisions == (0,) * 16
    assert d.garbage_collection_threshold == 0.0 and d.max_non_split_rounding == 20 * MiB
    assert d.text == "expandable_segments:True"  # last_allocator_settings: the last string, not a concatenation
    # ... and keeps the rest: expandable_segments, large_segment_size_mb and the CUDA-side keys.
    e = parse("expandable_segments:True,large_segment_size_mb:40,per_process_memory_fraction:0.5,"
              "release_lock_on_cudamalloc:True,pinned_num_register_threads:8").updated("max_split_size_mb:64")
    assert e.expandable_segments and e.large_segment_size == 40 * MiB and e.max_non_split_rounding == 40 * MiB
    assert e.per_process_memory_fraction == 0.5 and e.release_lock_on_cudamalloc
    assert e.pinned_num_register_threads == 8 and e.max_split_size == 64 * MiB
    # the kept large segment still bounds max_split_size_mb
    with pytest.raises(ConfigError, match="must be >= 40"):
        e.updated("max_split_size_mb:30")
    assert parse("").updated("") == AllocatorConfig()


def test_with_changes_moves_default_rounding_with_the_large_segment():
    assert AllocatorConfig().with_changes(large_segment_size=40 * MiB).max_non_split_rounding == 40 * MiB
    assert parse("max_non_split_rounding_mb:64").with_changes(
        large_segment_size=40 * MiB).max_non_split_rounding == 64 * MiB


_torch = pytest.importorskip("torch")


def _pytorch_error(text: str) -> str | None:
    """PyTorch 2.13's own parser (the one in c10, which a CPU build has): its error message, or None."""
    try:
        _torch._C._accelerator_setAllocatorSettings(text)
    except Exception as e:  # noqa: BLE001 - TORCH_CHECK raises RuntimeError, TORCH_CHECK_VALUE ValueError
        return str(e).split("\nException raised from")[0]
    finally:
        # back to the defaults, including the two settings a later parse keeps
        _torch._C._accelerator_setAllocatorSettings("large_segment_size_mb:20,expandable_segments:False")
    return None


@pytest.mark.parametrize(
    "text",
    [
        "max_split_size_mb:19",
        "max_non_split_rounding_mb:19",
        "large_segment_size_mb:10",
        "max_split_size_mb:30,large_segment_size_mb:40",
        "large_segment_size_mb:40,max_non_split_rounding_mb:30",
    ],
)
def test_size_errors_are_pytorchs(text):
    expected = _pytorch_error(text)
    assert expected is not None and expected.startswith("CachingAllocator option")
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    "text",
    ["max_split_size_mb:20", "large_segment_size_mb:11", "large_segment_size_mb:40,max_split_size_mb:40",
     "max_split_size_mb:30,large_segment_size_mb:20", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"],
)
def test_pytorch_accepts_what_minialloc_accepts(text):
    assert _pytorch_error(text) is None
    parse(text)


_FIELD_OF_KEY = {"max_split_size_mb": "max_split_size", "max_non_split_rounding_mb": "max_non_split_rounding",
                 "large_segment_size_mb": "large_segment_size"}
_RESET = {"max_split_size", "max_non_split_rounding", "garbage_collection_threshold", "roundup_power2_divisions"}


@given(_valid_texts, _valid_texts)
def test_runtime_change_is_a_fresh_parse_for_the_reset_keys_and_keeps_the_rest(first, second):
    before = parse(first)
    after = before.updated(second)
    fresh = parse(second)
    named = {_FIELD_OF_KEY.get(item.split(":")[0], item.split(":")[0]) for item in second.split(",") if item}
    for f in dataclasses.fields(AllocatorConfig):
        if f.name in _RESET or f.name in named or f.name == "text":
            assert getattr(after, f.name) == getattr(fresh, f.name), f.name
        else:
            assert getattr(after, f.name) == getattr(before, f.name), f.name
