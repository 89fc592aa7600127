"""The allocator's settings, read from MINIALLOC_ALLOC_CONF with PYTORCH_CUDA_ALLOC_CONF's grammar (PyTorch 2.13).

The parser mirrors PyTorch 2.13's AcceleratorAllocatorConfig::parseArgs (c10/core/AllocatorConfig.cpp) and
CUDAAllocatorConfig::parseArgs (c10/cuda/CUDAAllocatorConfig.cpp): comma-separated key:value pairs, whitespace
ignored, booleans exactly True or False, e.g. "max_split_size_mb:128,expandable_segments:True". Where PyTorch
silently misreads a value ("12abc" read as 12, "-1" wrapping round) minialloc raises ConfigError instead, and a
string with an error changes nothing (PyTorch has applied the keys before the bad one by then).

Keys:
  backend                        native (the only allocator minialloc models) or cudaMallocAsync (refused)
  large_segment_size_mb          the segment for large requests under 10 MiB, and the large pool's expandable page
                                 size (MB, > 10); default 20. It is also the minimum of the next two keys.
  max_split_size_mb              blocks this large (MB, >= large_segment_size_mb) or larger are never split;
                                 unset = no limit
  max_non_split_rounding_mb      a cached block at most this much (MB, >= large_segment_size_mb) bigger than a
                                 large request may serve it unsplit; default large_segment_size_mb
  garbage_collection_threshold   in (0, 1): free cached blocks when reserved memory passes this fraction of
                                 the memory fraction's limit; default 0 = off
  roundup_power2_divisions       round requests up to one of N steps between powers of two: one power of two
                                 for every size, or a list keyed by size in MB, e.g. [256:1,512:2,1024:4,>:8]
  expandable_segments            True: grow one segment per stream by mapping pages instead of new segments
  per_process_memory_fraction    in [0, 1]: the limit set_per_process_memory_fraction sets, applied when the
                                 allocator is created; default 1.0 = no limit
  release_lock_on_cudamalloc     True: drop the allocator lock around cudaMalloc (recorded, no effect here)
  pinned_use_cuda_host_register  True: pinned host memory via cudaHostRegister (recorded, no effect here)
  pinned_num_register_threads    threads for that registration, a power of two up to 128; default 1
  debug_guards                   minialloc's own key, not PyTorch's: True puts guard bytes after each block

Changing settings at runtime (AllocatorConfig.updated, as torch._C._accelerator_setAllocatorSettings) parses the
new string from PyTorch's defaults for max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions
and garbage_collection_threshold (AcceleratorAllocatorConfig::parseArgs resets exactly these four); every other
key keeps its value unless the string names it. The values and errors here were checked against PyTorch 2.13.0's
own parser (torch._C._accelerator_setAllocatorSettings and AcceleratorAllocatorConfig's getters).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from minialloc.sizes import K_LARGE_BUFFER, MiB

ENV_VAR = "MINIALLOC_ALLOC_CONF"
NUM_DIVISION_CLASSES = 16  # kRoundUpPowerOfTwoIntervals: size classes 1 MiB, 2 MiB, ... 32 GiB and above
MIN_SPLIT_SIZE_MB = K_LARGE_BUFFER // MiB  # the default large segment: the least max_split_size_mb (>= since 2.9)
MIN_LARGE_SEGMENT_MB = 10  # parseLargeSegmentSize: large_segment_size_mb must be > 10 (kMinLargeAlloc / kMB)
MAX_REGISTER_THREADS = 128  # CUDAAllocatorConfig::pinned_max_register_threads

# AcceleratorAllocatorConfig::parseArgs starts every parse from these values (PyTorch 2.13); the other keys keep
# whatever the previous parse left (checked with 2.13.0's own parser: expandable_segments and
# large_segment_size_mb survive a later string that does not name them; the CUDA-side keys are never reset).
_RESET_EACH_PARSE = ("max_split_size", "max_non_split_rounding", "garbage_collection_threshold",
                     "roundup_power2_divisions")


class ConfigError(ValueError):
    """A bad allocator config: the message names the key or token, what is accepted, and an example."""


def _error(key: str, problem: str, example: str) -> ConfigError:
    return ConfigError(f"{key}: {problem}; example: {example}")


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0  # llvm::isPowerOf2_64: 0 is not a power of two


def _class_index(size: int) -> int:
    """Table index for a size of >= 1 byte: log2(size) - 20 clamped to [0, 15] (roundup_power2_divisions)."""
    return min(max(size.bit_length() - 1 - 20, 0), NUM_DIVISION_CLASSES - 1)


@dataclass(frozen=True)
class AllocatorConfig:
    """minialloc's allocator settings; sizes are in bytes (the config string gives them in MB)."""

    backend: str = "native"
    max_split_size: int | None = None
    # None means "the large segment size", PyTorch's default (max_non_split_rounding_size_ = large_segment_size)
    max_non_split_rounding: int | None = None
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: tuple[int, ...] = (0,) * NUM_DIVISION_CLASSES
    expandable_segments: bool = False
    release_lock_on_cudamalloc: bool = False
    pinned_use_cuda_host_register: bool = False
    pinned_num_register_threads: int = 1
    debug_guards: bool = False
    large_segment_size: int = K_LARGE_BUFFER
    per_process_memory_fraction: float = 1.0
    text: str = ""

    def __post_init__(self) -> None:
        # Check here too, so with_changes() and direct construction cannot build what parse() would refuse.
        if self.backend != "native":
            _check_backend(self.backend)
        large = self.large_segment_size
        if isinstance(large, bool) or not isinstance(large, int) or large <= MIN_LARGE_SEGMENT_MB * MiB:
            raise ConfigError(f"large_segment_size must be an int number of bytes over 10 MiB, got {large!r}")
        least = large // MiB * MiB  # PyTorch compares whole MB: max_split_size_mb >= large_segment_size / kMB
        if self.max_split_size is not None and self.max_split_size < least:
            raise ConfigError(f"max_split_size must be None (no limit) or >= {least // MiB} MiB: "
                              f"{self.max_split_size}")
        if self.max_non_split_rounding is None:
            object.__setattr__(self, "max_non_split_rounding", large)
        elif self.max_non_split_rounding < least:
            raise ConfigError(f"max_non_split_rounding must be >= {least // MiB} MiB, "
                              f"got {self.max_non_split_rounding}")
        if self.garbage_collection_threshold != 0 and not 0 < self.garbage_collection_threshold < 1:
            raise ConfigError(
                f"garbage_collection_threshold must be 0 (off) or strictly between 0 and 1, "
                f"got {self.garbage_collection_threshold}"
            )
        fraction = self.per_process_memory_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"per_process_memory_fraction must be within [0, 1], got {fraction!r}")
        table = tuple(self.roundup_power2_divisions)
        if len(table) != NUM_DIVISION_CLASSES or any(d != 0 and not _is_power_of_two(d) for d in table):
            raise ConfigError(f"roundup_power2_divisions needs 16 entries, each 0 or a power of 2: {table}")
        object.__setattr__(self, "roundup_power2_divisions", table)  # a list given to with_changes -> tuple
        n = self.pinned_num_register_threads
        if not (_is_power_of_two(n) and n <= MAX_REGISTER_THREADS):
            raise ConfigError(f"pinned_num_register_threads must be a power of two up to 128, got {n}")

    def roundup_divisions_for(self, size: int) -> int:
        """The divisions for a request of `size` bytes (0 or 1 = no power-of-two rounding)."""
        return self.roundup_power2_divisions[_class_index(size)]

    def settings_dict(self) -> dict[str, Any]:
        """A snapshot's allocator_settings, with the keys and order PyTorch uses in _memory_snapshot_pickled
        (torch/csrc/cuda/memory_snapshot.cpp) and THCPModule_memorySnapshot (torch/csrc/cuda/Module.cpp)."""
        return {
            "PYTORCH_CUDA_ALLOC_CONF": self.text,
            # PyTorch stores "unset" as SIZE_MAX and reports int64_t(SIZE_MAX), which is -1.
            "max_split_size": -1 if self.max_split_size is None else self.max_split_size,
            "garbage_collection_threshold": float(self.garbage_collection_threshold),
            "expandable_segments": self.expandable_segments,
            "pinned_num_register_threads": self.pinned_num_register_threads,
            "release_lock_on_cudamalloc": self.release_lock_on_cudamalloc,
            "pinned_use_cuda_host_register": self.pinned_use_cuda_host_register,
            "graph_capture_record_stream_reuse": False,  # newer PyTorch reports it; minialloc has no graphs
            # PyTorch keys the 16 entries by their size class's start in MB, as strings: "1", "2", ... "32768"
            "roundup_power2_divisions": {str(1 << i): d for i, d in enumerate(self.roundup_power2_divisions)},
        }

    def with_changes(self, **changes: Any) -> AllocatorConfig:
        """A copy with some fields replaced (text is kept as it was). A new large_segment_size moves a
        max_non_split_rounding that was left at its default along with it."""
        if "large_segment_size" in changes and "max_non_split_rounding" not in changes:
            if self.max_non_split_rounding == self.large_segment_size:
                changes["max_non_split_rounding"] = None
        return dataclasses.replace(self, **changes)

    def updated(self, text: str) -> AllocatorConfig:
        """The settings after torch._C._accelerator_setAllocatorSettings(text) (what
        torch.cuda.memory._set_allocator_settings calls) on top of these ones.

        As in PyTorch 2.13, max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions and
        garbage_collection_threshold start again from their defaults, so a key not named in `text` is unset;
        every other setting keeps its value unless `text` names it. `text` becomes the config's text, as
        PyTorch's last_allocator_settings (the snapshot's PYTORCH_CUDA_ALLOC_CONF) is the last string parsed.
        """
        kept = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in _RESET_EACH_PARSE and f.name != "text"}
        return _Parser(text, kept).parse()

    @classmethod
    def parse(cls, text: str) -> AllocatorConfig:
        """Read a config string; "" gives the defaults. Raises ConfigError naming what is wrong."""
        return _Parser(text).parse()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AllocatorConfig:
        """Read MINIALLOC_ALLOC_CONF from `environ` (default os.environ); unset or empty: the defaults."""
        text = (os.environ if environ is None else environ).get(ENV_VAR, "")
        try:
            return cls.parse(text)
        except ConfigError as e:
            raise ConfigError(f"{ENV_VAR}={text!r}: {e}") from e


# --- value readers: each takes (key, token, example) and returns the field's value or raises ConfigError ---


def _check_backend(token: str) -> str:
    if token == "cudaMallocAsync":
        raise ConfigError(
            "backend:cudaMallocAsync is a valid PyTorch backend, but minialloc models only the native "
            "caching allocator; remove the key or write backend:native"
        )
    if token != "native":  # parseAllocatorConfig's "Unknown allocator backend"
        raise ConfigError(f"backend: unknown allocator backend '{token}'; minialloc accepts only native")
    return token


def _read_backend(key: str, token: str, example: str) -> str:
    return _check_backend(token)


def _read_uint(key: str, token: str, example: str) -> int:
    if not token.isascii() or not token.isdigit():  # stricter than std::stoull, which reads "12abc" as 12
        raise _error(key, f"'{token}' is not a whole number", example)
    return int(token)


def _read_bool(key: str, token: str, example: str) -> bool:
    if token not in ("True", "False"):  # ConfigTokenizer::toBool: exactly these two spellings
        raise _error(key, f"expected True or False (capitalised, exactly), got '{token}'", example)
    return token == "True"


def _read_mb(key: str, token: str, example: str) -> int:
    """A size in MB, as bytes; its lower bound (the large segment size) is checked by the parser."""
    return _read_uint(key, token, example) * MiB


def _read_large_segment(key: str, token: str, example: str) -> int:
    mb = _read_uint(key, token, example)
    if mb <= MIN_LARGE_SEGMENT_MB:  # parseLargeSegmentSize; PyTorch 2.13's own words
        raise _error(key, f"CachingAllocator option large_segment_size_mb must be > {MIN_LARGE_SEGMENT_MB} MB, "
                          f"got {mb}", example)
    return mb * MiB


def _decimal(key: str, token: str, example: str) -> float:
    # std::stod would also read "0.5abc" as 0.5 and accept "nan"; minialloc wants the whole token to be a number
    if not re.fullmatch(r"(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", token):
        raise _error(key, f"'{token}' is not a decimal number", example)
    return float(token)


def _read_fraction(key: str, token: str, example: str) -> float:
    value = _decimal(key, token, example)
    if not 0.0 <= value <= 1.0:  # CUDAAllocatorConfig::parsePerProcessMemoryFraction; PyTorch 2.13's own words
        raise _error(key, f"per_process_memory_fraction is invalid, set it in [0.0, 1.0] (got {token})", example)
    return value


def _read_threshold(key: str, token: str, example: str) -> float:
    value = _decimal(key, token, example)
    # parseGarbageCollectionThreshold: "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
    if not 0 < value < 1:
        raise _error(key, f"{token} is out of range, set it strictly between 0.0 and 1.0", example)
    return value


def _read_threads(key: str, token: str, example: str) -> int:
    n = _read_uint(key, token, example)
    if not (_is_power_of_two(n) and n <= MAX_REGISTER_THREADS):  # parsePinnedNumRegisterThreads
        raise _error(key, f"{n} is not a power of two up to {MAX_REGISTER_THREADS}", example)
    return n


Reader = Callable[[str, str, str], Any]

# key -> (reader, an example value). roundup_power2_divisions has no reader here: _Parser.divisions reads it.
_KEYS: dict[str, tuple[Reader | None, str]] = {
    "backend": (_read_backend, "native"),
    "large_segment_size_mb": (_read_large_segment, "40"),
    "max_split_size_mb": (_read_mb, "128"),
    "max_non_split_rounding_mb": (_read_mb, "256"),
    "garbage_collection_threshold": (_read_threshold, "0.6"),
    "roundup_power2_divisions": (None, "[256:1,512:2,>:4]"),
    "expandable_segments": (_read_bool, "True"),
    "release_lock_on_cudamalloc": (_read_bool, "True"),
    "pinned_use_cuda_host_register": (_read_bool, "True"),
    "per_process_memory_fraction": (_read_fraction, "0.8"),
    "pinned_num_register_threads": (_read_threads, "8"),
    "debug_guards": (_read_bool, "True"),
}
# The field is named as the key, except that sizes are kept in bytes, not MB.
_FIELDS = {"max_split_size_mb": "max_split_size", "max_non_split_rounding_mb": "max_non_split_rounding",
           "large_segment_size_mb": "large_segment_size"}
# Sizes whose least value is the large segment size (parseMaxSplitSize, parseMaxNonSplitRoundingSize)
_AT_LEAST_LARGE_SEGMENT = ("max_split_size_mb", "max_non_split_rounding_mb")
# PyTorch accepts the ROCm spellings too (CUDAAllocatorConfig::parseArgs), so minialloc does.
_ALIASES = {
    "release_lock_on_hipmalloc": "release_lock_on_cudamalloc",
    "pinned_use_hip_host_register": "pinned_use_cuda_host_register",
}
# Keys PyTorch knows but minialloc does not model: the error says so, to explain a pasted PyTorch config.
_PYTORCH_ONLY = (
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
)
_PUNCTUATION = (",", ":", "[", "]")


def _tokenize(text: str) -> list[str]:
    """Split like ConfigTokenizer: ',', ':', '[' and ']' are tokens of their own; whitespace is dropped."""
    return [t for t in re.split(r"([,:\[\]])", "".join(text.split())) if t]


class _Parser:
    """One pass over the tokens, key by key, as CUDAAllocatorConfig::parseArgs walks them.

    A repeated key is applied again in order, as in PyTorch: the last scalar wins, and a second
    roundup_power2_divisions list updates the table the first one left. `kept` holds the settings a runtime
    change does not reset (AllocatorConfig.updated); a fresh parse starts from the defaults.
    """

    def __init__(self, text: str, kept: dict[str, Any] | None = None) -> None:
        self.tokens = _tokenize(text)
        self.i = 0
        self.values: dict[str, Any] = dict(kept or {})
        self.values["text"] = "".join(self.tokens)
        self.table = [0] * NUM_DIVISION_CLASSES
        self.large_segment_size = self.values.get("large_segment_size", K_LARGE_BUFFER)
        # PyTorch 2.13 takes large_segment_size_mb before the sizes whose least value it is: in
        # "max_split_size_mb:30,large_segment_size_mb:40" the 30 is refused ("must be >= 40").
        tokens = self.tokens
        for j in range(len(tokens) - 2):
            if tokens[j] == "large_segment_size_mb" and tokens[j + 1] == ":" and tokens[j + 2] not in _PUNCTUATION:
                self.large_segment_size = _read_large_segment(tokens[j], tokens[j + 2], "large_segment_size_mb:40")

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, key: str, wanted: str, example: str) -> str:
        token = self.peek()
        if token is None:
            raise _error(key, f"expected {wanted} but the config ends there", example)
        self.i += 1
        return token

    def expect(self, key: str, punct: str, example: str) -> None:
        token = self.take(key, f"'{punct}'", example)
        if token != punct:
            raise _error(key, f"expected '{punct}', got '{token}'", example)

    def value(self, key: str, example: str) -> str:
        token = self.take(key, "a value", example)
        if token in (",", ":", "]"):
            raise _error(key, f"empty value (got '{token}')", example)
        return token

    def parse(self) -> AllocatorConfig:
        while self.peek() is not None:
            key = self.take("config", "a key", "max_split_size_mb:128")
            if key in _PUNCTUATION:
                raise ConfigError(
                    f"expected a key, got '{key}'; write key:value pairs separated by single commas, "
                    "e.g. max_split_size_mb:128,expandable_segments:True"
                )
            key = _ALIASES.get(key, key)
            if key not in _KEYS:
                note = " It is a PyTorch key that minialloc does not model: remove it."
                note = note if key in _PYTORCH_ONLY else ""
                raise ConfigError(
                    f"Unrecognized key '{key}' in minialloc allocator config ({ENV_VAR}).{note} "
                    f"Accepted keys: {', '.join(_KEYS)}. Keys are case-sensitive; "
                    "example: expandable_segments:True"
                )
            reader, value = _KEYS[key]
            example = f"{key}:{value}"
            self.expect(key, ":", example)
            if reader is None:
                self.divisions(key, example)
            else:
                token = self.value(key, example)
                value = reader(key, token, example)
                least = self.large_segment_size // MiB
                if key in _AT_LEAST_LARGE_SEGMENT and value < least * MiB:  # PyTorch 2.13's own words
                    raise _error(key, f"CachingAllocator option {key} too small, must be >= {least} "
                                      f"(got {value // MiB})", example)
                self.values[_FIELDS.get(key, key)] = value
            if self.peek() is not None:  # a trailing comma is allowed, as in PyTorch
                self.expect(key, ",", f"{example},expandable_segments:True")
        return AllocatorConfig(**self.values, roundup_power2_divisions=tuple(self.table))

    def divisions(self, key: str, example: str) -> None:
        """Fill the 16-entry table as AcceleratorAllocatorConfig::parseRoundUpPower2Divisions does.

        One number N (a power of two; 0 is refused here, as in PyTorch): every entry is N.
        A list [MB:N, ...]: each MB (a power of two) sets entry log2(MB), clamped to 15; the first such
        item also fills every entry below it; '>:N' fills every entry above the last MB item (from entry 1
        if there is none). Inside the list N may be 0 (no rounding). So [256:1,512:2,1024:4,>:8] gives
        entries 0-8 = 1, 9 = 2, 10 = 4, 11-15 = 8, as PyTorch 2.13 does (checked with its own parser); 2.9 and
        earlier started '>' AT the last MB item's entry and so also overwrote it (entry 10 = 8 there).
        """
        token = self.value(key, example)
        if token != "[":
            n = _read_uint(key, token, example)
            if not _is_power_of_two(n):
                raise ConfigError(
                    f"{key}: {n} must be a power of two (1, 2, 4, 8, ...); 1 means no rounding, and 0 is "
                    f"accepted only inside the list form; example: {key}:4 or {example}"
                )
            self.table[:] = [n] * NUM_DIVISION_CLASSES
            return
        first, last_index = True, 0
        while (bound := self.take(key, "an 'MB:N' item or ']'", example)) != "]":
            if bound in _PUNCTUATION:
                raise _error(key, f"expected a size in MB or '>', got '{bound}'", example)
            self.expect(key, ":", example)
            n = _read_uint(key, self.value(key, example), example)
            if n != 0 and not _is_power_of_two(n):
                raise _error(key, f"divisions {n} for '{bound}' must be 0 or a power of two", example)
            if bound == ">":
                start = last_index + 1
                self.table[start:] = [n] * (NUM_DIVISION_CLASSES - start)
            else:
                mb = _read_uint(key, bound, example)
                if not _is_power_of_two(mb):
                    raise _error(key, f"size {mb} MB must be a power of two (1, 2, ... 1024, ...)", example)
                index = min(mb.bit_length() - 1, NUM_DIVISION_CLASSES - 1)
                if first:  # the first MB item also covers every smaller size class
                    self.table[:index] = [n] * index
                    first = False
                self.table[index] = n
                last_index = index
            after = self.take(key, "',' or the closing ']'", example)
            if after == "]":
                return
            if after != ",":
                raise _error(key, f"expected ',' or ']' after an item, got '{after}'", example)
