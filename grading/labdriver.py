"""The program a lab's answers run in at grading: started by grading.labrun inside the bubblewrap sandbox.

Never imported by the grader: it is copied into the sandbox and run as `python -I labdriver.py INPUT FD`. INPUT
(JSON) holds the steps, in the notebook's order: the lab's locked cells (the instructor's text, from the
gradebook) and the student's answer cells, each run like a notebook cell; and at each graded test cell a probe, a
function of the lab's probe file that calls the student's functions on the inputs the grader chose and returns
plain data. Everything goes back to the grader on descriptor FD, one JSON object a line; the grader compares the
data with references the sandbox never sees.

Cells run as a kernel runs them: each is interrupted (SIGINT, KeyboardInterrupt) after its timeout and the next one
runs; a cell that ignores the interrupt for `grace` more seconds ends the program (what follows is "not run").
The student's prints go nowhere (the grader shows its own verdicts, not the student's output).
"""

import builtins
import json
import os
import signal
import sys


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    channel = os.fdopen(int(sys.argv[2]), "w", buffering=1, encoding="utf-8")

    def send(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    sys.path.insert(0, spec["packages"])  # the grading copy of minialloc: the simulated device, sizes, workloads
    sink = open(os.devnull, "w", encoding="utf-8")
    sys.stdout = sys.stderr = sink
    builtins.display = lambda *objects, **kwargs: print(*objects, file=sink)  # IPython's, for cells that call it
    timeout, grace = spec["cell_timeout"], spec["grace"]
    stage = {"step": None, "interrupted": False}

    def on_alarm(signum, frame) -> None:
        if not stage["interrupted"]:  # the cell's time is up: interrupt it, as the kernel's grader does
            stage["interrupted"] = True
            signal.setitimer(signal.ITIMER_REAL, grace)
            signal.raise_signal(signal.SIGINT)
            return
        send({"step": stage["step"], "event": "killed"})  # the interrupt was ignored: the program ends here
        os._exit(3)

    probes: dict = {"__name__": "grader_probes"}
    exec(compile(spec["probes"], "<grader probes>", "exec"), probes)
    namespace: dict = {"__name__": "__main__", "__builtins__": builtins}
    for index, step in enumerate(spec["steps"]):
        stage.update(step=index, interrupted=False)
        send({"step": index, "event": "start"})
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        message: dict = {"step": index, "event": "end"}
        try:
            if step["kind"] == "cell":
                exec(compile(step["source"], f"<cell {step['name']}>", "exec"), namespace)
            else:
                message["result"] = probes[step["probe"]](namespace, step["args"])
        except KeyboardInterrupt:
            message["error"] = "CellTimeoutError: interrupted after the cell's time limit" if stage["interrupted"] \
                else "KeyboardInterrupt"
        except BaseException as error:  # the student's code failed (SystemExit included): the next cell runs
            message["error"] = describe(error)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        try:
            send(message)
        except (TypeError, ValueError) as error:  # a result that is not plain data: the probe's fault
            send({"step": index, "event": "end", "error": f"the probe's result is not JSON: {error}"})
    send({"event": "done"})


def describe(error: BaseException) -> str:
    """The exception's type and message, the message cut short (it is the student's text)."""
    try:
        text = str(error)
    except BaseException:
        text = "(its message could not be read)"
    return (f"{type(error).__name__}: {text}" if text else type(error).__name__)[:300]


if __name__ == "__main__":
    main()
