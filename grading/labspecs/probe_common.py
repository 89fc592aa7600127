"""Helpers every lab's probes use, run inside the grading sandbox (grading/labdriver.py) and imported by the
grader to encode its references the same way. Standard library only.

`plain` turns a value into JSON data that keeps its exact type (a tuple, a range, an int that is not a bool); any
other object becomes its type's name, so an object that claims to equal everything is no answer. `call` runs the
student's function and returns its plain result, or what it raised.
"""


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



def shown(value) -> str:
    """A probe's value as the labs' messages show it (the tagged forms plain() writes, read back)."""
    if raised(value):
        return f"raised {value['!raised']}"
    if isinstance(value, dict) and "!type" in value:
        return f"a {value['!type']}"
    if isinstance(value, dict) and "!tuple" in value:
        return repr(tuple(value["!tuple"]))
    if isinstance(value, dict) and "!range" in value:
        return repr(range(*value["!range"]))
    if isinstance(value, dict) and "!dict" in value:
        return repr({shown(k): v for k, v in value["!dict"]})
    return repr(value)

def need(ns, name):
    """The student's (or the locked cells') definition of `name`, as a test cell would look it up."""
    if name not in ns:
        raise NameError(f"name {name!r} is not defined")
    return ns[name]
