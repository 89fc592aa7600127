"""Lab 3's probes: run in the grading sandbox after the cells before each graded test cell (probe_common.py is
prepended). The device's page table comes back after every operation, as plain data.
"""

from minialloc import SimulatedGPU

if __name__ != "grader_probes":  # read as a module (linting, tests); in the sandbox probe_common.py comes first
    from .probe_common import call, construct, need, plain

PAGE = 2 * 1024 * 1024


def task1_costs_tests(ns, args):
    page_costs = need(ns, "page_costs")
    return [call(page_costs, case["page_mb"] * 1024 * 1024, [tuple(op) for op in case["trace"]])
            for case in args["cases"]]


def task2_contiguous_tests(ns, args):
    map_contiguous = need(ns, "map_contiguous")
    out = []
    for case in args["cases"]:
        gpu = SimulatedGPU("1GiB")
        handles = [gpu.mem_create(n * PAGE) for n in case["handles"]]
        pages = [(handles[h], i * PAGE) for h, i in case["pages"]]
        free = gpu.mem_get_info()[0]
        other = gpu.mem_address_reserve(PAGE) if case["other"] else None
        va = call(map_contiguous, gpu, pages)
        if type(va) is not int:
            out.append({"va": va})
            continue
        seen = {"va": va, "other": other, "mapped": gpu.mapped_pages, "free": gpu.mem_get_info()[0] - free,
                "mapping": [plain(gpu.mapping(va + k * PAGE)) for k in range(len(pages))],
                "access": [gpu.is_accessible(va + k * PAGE) for k in range(len(pages))]}
        seen["unmap"] = call(gpu.mem_unmap, va, len(pages) * PAGE)
        seen["release"] = call(gpu.mem_address_free, va, len(pages) * PAGE)
        out.append(seen)
    return out


def _mapped(gpu, base, page_size):
    return sorted({(va - base) // page_size for va in gpu.mapped_addresses() if va >= base})


def _segment(cls, trace):
    gpu = SimulatedGPU(trace["capacity"])
    page_size = trace["page_size"]
    segment, failed = construct(cls, gpu, page_size)
    if failed:
        return {"init": failed}
    start = [call(lambda: segment.ptr), call(lambda: segment.max_pages)]
    steps = []
    for op, offset, size in trace["ops"]:
        if op == "fail":
            gpu.fail_next_mallocs(offset)
            continue
        got = call(lambda o=op, off=offset, s=size: getattr(segment, o)(segment.ptr + off, s))
        pages = _mapped(gpu, segment.ptr, page_size)
        handles = call(lambda: [i for i, h in enumerate(segment.handles) if h is not None])
        steps.append([got, pages, list(gpu.mem_get_info()), handles,
                      all(gpu.is_accessible(segment.ptr + i * page_size) for i in pages)])
    return {"start": start, "steps": steps}


def segments(ns, args):
    cls = need(ns, "MiniExpandableSegment")
    return [_segment(cls, trace) for trace in args["traces"]]


task3_map_tests = task3_unmap_tests = task3_random_tests = segments
