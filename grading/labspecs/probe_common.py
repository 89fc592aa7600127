"""Helpers every lab's probes use, run inside the grading sandbox (grading/labdriver.py) and imported by the
grader to encode its references the same way. Standard library only.

`plain` turns a value into JSON data that keeps its exact type (a tuple, a range, an int that is not a bool); any
other object becomes its type's name, so an object that claims to equal everything is no answer. `call` runs the
student's function and returns its plain result, or what it raised.
"""

import builtins


def plain(value, depth=0):
    kind = type(value)
    if value is None or kind in (bool, int, float):
        return value
    if kind is str:
        return value[:200]
    if kind is range:
        return {"!range": [value.start, value.stop, value.step]}
    if kind in (list, tuple) and depth < 6:
        items = [plain(v, depth + 1) for v in value[:20000]]
        return items if kind is list else {"!tuple": items}
    if kind is dict and depth < 6:  # keys keep their types too (JSON's would all be strings)
        return {"!dict": [[plain(k, depth + 1), plain(v, depth + 1)] for k, v in list(value.items())[:20000]]}
    return {"!type": kind.__name__[:60]}


def call(fn, *args):
    """fn(*args) as plain data, or {"!raised": name, "memory": bool} when it raised (a timeout is not caught)."""
    try:
        return plain(fn(*args))
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        return failure(error)


def failure(error):
    """What raised, as data: its type's name, and whether it is a MemoryError or a ValueError."""
    return {"!raised": type(error).__name__[:60], "memory": isinstance(error, MemoryError),
            "value": isinstance(error, ValueError)}


def construct(cls, *args):
    """(the object, None), or (None, what raised) when making it failed."""
    try:
        return cls(*args), None
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        return None, failure(error)


def raised(value):
    return isinstance(value, dict) and "!raised" in value


# The names of exceptions and types a verdict may say: Python's own, the simulated device's and minialloc's. Any
# other name is the student's (a class of their own can be called anything) and is never copied into a verdict.
KNOWN_NAMES = frozenset(name for name in dir(builtins) if isinstance(getattr(builtins, name), type)) | {
    "Withheld", "CellTimeoutError", "NotRun", "DeadKernelError", "OutputTooLarge",  # the grader's own
    "DeviceOutOfMemory", "DeviceError", "OutOfMemoryError",  # the device, the OOM
    "OutOfBlocksError", "PagingError", "RequestTooLongError", "UnknownSequenceError", "FinishedSequenceError",
    "SwappedSequenceError", "InvalidPointerError", "ConfigError"}  # what minialloc's references raise


def known_name(name, what: str = "an exception") -> str:
    """`name` when the verdict may say it (a builtin's or the device's), else words of the grader's own."""
    return name if type(name) is str and name in KNOWN_NAMES else f"{what} of the answer's own class"


def shown(value, depth: int = 0) -> str:
    """A probe's value as a verdict shows it (the tagged forms plain() writes, read back), in the grader's words:
    numbers, booleans and None as Python writes them, containers a few items deep, and no text of the student's
    (a string is "a string of N characters", another object its type's name only when that is a builtin's)."""
    if depth > 3:
        return "..."
    kind = type(value)
    if value is None or kind in (bool, int, float):
        return repr(value)
    if kind is str:
        return f"a string of {len(value)} characters"
    if kind is list:
        return _items(value, "[", "]", depth)
    if kind is dict and len(value) == 1:
        (tag, inner), = value.items()
        if tag == "!raised":
            return f"raised {known_name(inner)}"
        if tag == "!type":
            known = type(inner) is str and inner in KNOWN_NAMES
            return f"a {inner}" if known else "an object of the answer's own class"
        if tag == "!tuple" and type(inner) is list:
            return _items(inner, "(", ",)" if len(inner) == 1 else ")", depth)
        if tag == "!range" and type(inner) is list and all(type(v) is int for v in inner) and len(inner) == 3:
            return repr(range(*inner))
        if tag == "!dict" and type(inner) is list:
            pairs = [f"{shown(p[0], depth + 1)}: {shown(p[1], depth + 1)}" for p in inner[:6]
                     if type(p) is list and len(p) == 2]
            return "{" + ", ".join(pairs) + (", ..." if len(inner) > 6 else "") + "}"
    if kind is dict and "!raised" in value:
        return f"raised {known_name(value['!raised'])}"
    return "an object the grader does not show"


def _items(items: list, opening: str, closing: str, depth: int) -> str:
    text = ", ".join(shown(v, depth + 1) for v in items[:8]) + (", ..." if len(items) > 8 else "")
    return (opening + text + closing)[:300]


class Missing(Exception):
    """A name a probe needs is not defined (its name is the probe's, never the student's)."""


def need(ns, name):
    """The student's (or the locked cells') definition of `name`, as a test cell would look it up."""
    if name not in ns:
        raise Missing(name)
    return ns[name]
