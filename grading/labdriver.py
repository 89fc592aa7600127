"""The program a lab's answers run in at grading: started by grading.labrun inside the bubblewrap sandbox.

Never imported by the grader. Its text, with the run's input appended as one string literal (`main(INPUT)`), is
Python's script on standard input (`python -I -`): Python reads standard input to its end before the first line
runs, so no file, argument or environment variable of the process holds the input, the probes or the channel's
number. INPUT (JSON) holds the steps, in the notebook's order: the lab's locked cells (the instructor's text,
from the gradebook) and the student's answer cells, each run like a notebook cell; and at each graded test cell a
probe, a function of the lab's probe file that calls the student's functions on the inputs the grader chose and
returns plain data. Nothing in INPUT is an expected value: the grader compares the data in its own process.

What goes back to the grader, one JSON object a line on the descriptor the process got as its standard output
(moved to another number before any cell runs; standard output and error then lead to /dev/null), is a step's
end: `{"step": i, "result": DATA}`, or `{"step": i, "failed": KIND, "type": NAME}` where KIND is one of
"raised", "interrupted", "missing" and "unplain". The student's code runs in this process and can write on that
descriptor too: the grader takes each line as untrusted data (grading/labrun.py), never as text to show.

Cells run as a kernel runs them: each is interrupted (SIGINT, KeyboardInterrupt) after its timeout and the next one
runs. The deadline that counts is the grader's own clock: a step that has not ended `grace` seconds after its
timeout (the interrupt ignored, the timer turned off) is killed from outside with the whole sandbox.
"""

import builtins
import json
import os
import signal
import sys


def main(text: str) -> None:
    spec = json.loads(text)
    del text
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sink = open(os.devnull, "w", encoding="utf-8")
    os.dup2(sink.fileno(), 1)
    os.dup2(sink.fileno(), 2)
    sys.stdout = sys.stderr = sink  # the student's prints go nowhere: the grader shows its own verdicts
    sys.argv, sys.orig_argv = spec["argv"], spec["orig_argv"]  # a sandboxed kernel's (grading.labrun.kernel_argv)

    def send(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    sys.path.insert(0, spec["packages"])  # the grading copy of minialloc: the simulated device, sizes, workloads
    builtins.display = lambda *objects, **kwargs: print(*objects, file=sink)  # IPython's, for cells that call it
    timeout = spec["cell_timeout"]
    stage = {"interrupted": False}

    def on_alarm(signum, frame) -> None:  # the cell's time is up: interrupt it, as the kernel's grader does
        stage["interrupted"] = True
        signal.raise_signal(signal.SIGINT)

    probes: dict = {"__name__": "grader_probes"}
    exec(compile(spec["probes"], "<grader probes>", "exec"), probes)
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    steps = spec.pop("steps")
    del spec
    for index, step in enumerate(steps):
        stage["interrupted"] = False
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        message: dict = {"step": index}
        try:
            if step["kind"] == "cell":
                exec(compile(step["source"], f"<cell {step['name']}>", "exec"), namespace)
            else:
                message["result"] = probes[step["probe"]](namespace, step["args"])
        except KeyboardInterrupt:
            message.update(failed="interrupted" if stage["interrupted"] else "raised", type="KeyboardInterrupt")
        except probes["Missing"] as missing:  # a name the probe looks up is not defined
            message.update(failed="missing", type=str(missing.args[0]))
        except BaseException as error:  # the student's code failed (SystemExit included): the next cell runs
            message.update(failed="raised", type=type(error).__name__)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            send(message)
        except (TypeError, ValueError):  # a result that is not plain data: the probe's fault
            send({"step": index, "failed": "unplain", "type": ""})
    send({"done": True})
