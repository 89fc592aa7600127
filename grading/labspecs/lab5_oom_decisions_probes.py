"""Lab 5's probes: run in the grading sandbox after the cells before each graded test cell (probe_common.py is
prepended). read_oom reads the grader's messages; decide decides on the grader's figures, each a fresh dict.
"""

if __name__ != "grader_probes":  # read as a module (linting, tests); in the sandbox probe_common.py comes first
    from .probe_common import call, need


def task1_read_tests(ns, args):
    read = need(ns, "read_oom")
    return [call(read, str(message)) for message in args["messages"]]


task1_wrapped_tests = task1_read_tests


def _figures(fields):
    """The figures as read_oom returns them: the pids' pairs back into a dict {pid: bytes}."""
    return {**fields, "other_processes": {int(pid): int(used) for pid, used in fields["other_processes"]}}


def task2_kinds_tests(ns, args):
    decide = need(ns, "decide")
    return [call(decide, _figures(fields)) for fields in args["fields"]]


task2_container_tests = task2_kinds_tests
