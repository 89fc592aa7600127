"""What CuPy needs from the CUDA toolkit, and whether this machine has it: one line instead of a loader traceback.

CuPy wheels bring the CUDA runtime but load NVRTC (which compiles every RawModule kernel and elementwise op) and
cuRAND at first use. On a GPU machine without the toolkit's libraries the first kernel launch would fail deep inside
CuPy; `toolkit_problem()` says what is missing and what to install (`pip install "minialloc[cuda12]"` or
`"minialloc[cuda13]"`: CuPy with its `ctk` extra, the toolkit's wheels, for the driver's CUDA major). Loading these
libraries needs no GPU, so this answers on any machine with CuPy.
"""

from __future__ import annotations


class MissingCudaLibrary(RuntimeError):
    """CuPy is there but a CUDA library it loads on first use is not; the message says what to install."""


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _curand():
    from cupy.cuda import curand  # a lazy attribute of cupy.cuda: importing it loads libcurand

    return curand


def cuda_libraries() -> dict[str, str]:
    """What the GPU path loads, each with its version or "missing: <why>": CuPy, the CUDA runtime, NVRTC, cuRAND.

    Loading NVRTC or cuRAND needs no GPU, so this answers on any machine with CuPy."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken install failing inside its own imports
        return {"CuPy": f'missing: CuPy is not installed ({_first_line(e)}): pip install "minialloc[cuda12]" '
                        "(or [cuda13] for a CUDA 13 driver)"}
    found = {"CuPy": cupy.__version__}

    def version(v: int) -> str:  # the runtime's 12090 -> 12.9
        return f"{v // 1000}.{v % 1000 // 10}"

    probes = {
        "CUDA runtime": lambda: version(cupy.cuda.runtime.runtimeGetVersion()),
        "NVRTC": lambda: "{}.{}".format(*cupy.cuda.nvrtc.getVersion()),
        "cuRAND": lambda: str(_curand().getVersion()),
    }
    for name, probe in probes.items():
        try:
            found[name] = probe()
        except Exception as e:  # DynamicLibNotFoundError, ImportError, CUDARuntimeError: the library cannot load
            found[name] = f"missing: {_first_line(e)}"
    return found


def toolkit_problem(libraries: dict[str, str] | None = None) -> str | None:
    """None when CuPy can compile kernels and draw random numbers here, else one line: what is missing, what to do."""
    libraries = cuda_libraries() if libraries is None else libraries
    if libraries["CuPy"].startswith("missing"):
        return libraries["CuPy"].removeprefix("missing: ")
    missing = [name for name in ("NVRTC", "cuRAND") if libraries.get(name, "").startswith("missing")]
    if not missing:
        return None
    runtime = libraries.get("CUDA runtime", "")
    major = runtime.split(".")[0] if runtime[:1].isdigit() else "12"
    return (f"CuPy {libraries['CuPy']} cannot load {' and '.join(missing)} (the CUDA toolkit's libraries): "
            f'pip install "minialloc[cuda{major}]" (CuPy with its ctk extra) or install a CUDA {major} toolkit')
