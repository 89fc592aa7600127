"""Every kind of snapshot users have, read without a traceback (issue 24): PyTorch 2.0's block layout, a trace too
short to replay, no trace at all, the segments-only list of torch.cuda.memory_snapshot(), an Ascend NPU snapshot,
and an expandable run written without allocator_settings. Each on a small synthetic snapshot in that format, and
on the real files where there is one."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from minialloc import CachingAllocator, MiB, SimulatedGPU
from minialloc.cli import main
from minialloc.trace import read_snapshot, recorded_config, unmodelled_allocator, why_not_replayable

REAL = Path(__file__).parent / "fixtures" / "real_snapshots"
BASE = 0x7F0000000000


def frames(filename: str, name: str, line: int = 1) -> list[dict]:
    return [{"filename": filename, "line": line, "name": name}]


def torch20_snapshot(trace: list[dict]) -> dict:
    """PyTorch 2.0's layout: blocks with no address and no frames, their stack in history."""
    seg = {"device": 0, "address": BASE, "total_size": 20 * MiB, "allocated_size": 8 * MiB, "active_size": 8 * MiB,
           "requested_size": 8 * MiB, "stream": 0, "segment_type": "large",
           "blocks": [
               {"size": 3 * MiB, "requested_size": 3 * MiB, "state": "active_allocated",
                "history": [{"addr": BASE, "real_size": 3 * MiB, "frames": frames("model.py", "forward", 7)}]},
               {"size": 5 * MiB, "requested_size": 5 * MiB, "state": "active_allocated",
                "history": [{"addr": BASE + 3 * MiB, "real_size": 5 * MiB, "frames": frames("train.py", "step", 9)}]},
               {"size": 12 * MiB, "requested_size": 0, "state": "inactive",
                "history": [{"addr": BASE + 8 * MiB, "real_size": 12 * MiB, "frames": frames("old.py", "gone")}]},
           ]}
    return {"segments": [seg], "device_traces": [trace]}


def write(path: Path, obj: object) -> str:
    path.write_bytes(pickle.dumps(obj))
    return str(path)


def test_torch20_blocks_get_their_address_and_the_stack_of_their_allocation(tmp_path):
    snap = read_snapshot(write(tmp_path / "old.pickle", torch20_snapshot([])))
    blocks = snap["segments"][0]["blocks"]
    assert [b["address"] - BASE for b in blocks] == [0, 3 * MiB, 8 * MiB]
    assert blocks[1]["frames"][0]["name"] == "step" and blocks[2]["frames"] == []  # a free block holds no tensor


def test_a_trace_of_one_entry_is_too_short_to_replay_and_still_diagnosed(tmp_path, capsys):
    # a ring buffer of one entry (the boolean _record_memory_history(True) call keeps one, in 2.0 and in every
    # release since); this one is the 'snapshot' action, and an oom wrote 'addr'
    path = write(tmp_path / "old.pickle", torch20_snapshot([{"action": "snapshot", "addr": 0, "size": 0,
                                                             "stream": 0}]))
    assert main(["replay", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds 1 entry: history was recorded with a ring buffer of one entry" in err
    assert "_record_memory_history(True)" in err and "max_entries" in err
    assert "PyTorch 2" not in err  # the same call writes one entry in 2.1 and later: no version to blame
    assert main(["diagnose", path]) == 0
    out = capsys.readouterr().out
    assert "the state the snapshot holds" in out and "too short to replay" in out
    assert "5.00 MiB      1 block     1 segment  step (train.py:9)" in out
    assert "default large pool: 1 segment, 20.00 MiB reserved, 12.00 MiB cached free (largest 12.00 MiB" in out


def test_a_torch20_oom_entry_holds_device_free_in_addr(tmp_path):
    old = torch20_snapshot([{"action": "oom", "addr": 1 * MiB, "size": 30 * MiB, "stream": 0}])
    snap = read_snapshot(write(tmp_path / "old.pickle", old))
    assert why_not_replayable(snap, 0) is None


def test_the_real_torch20_snapshot_is_diagnosed_and_its_replay_refused_in_one_line(capsys):
    path = str(REAL / "flexgen-opt1.3b-torch20.pickle")
    assert main(["replay", path, "--check"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["diagnose", path, "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["devices"]
    snap = read_snapshot(path)
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] != "inactive"]
    # the address each block gets (its segment's plus the sizes before it) is the one its history recorded
    assert live and all(b["address"] == b["history"][-1]["addr"] for b in live)
    total = sum(s["total_size"] for s in snap["segments"])
    assert d["moment"] == "snapshot" and d["reserved"] == total
    assert d["holders"][0]["frame"] == "allocate (pytorch_backend.py:195)" and d["holders"][0]["blocks"] == 778


@pytest.mark.parametrize("kind", ["dict", "segments-only list"])
def test_no_trace_diagnoses_the_state_and_replay_refuses_in_one_line(tmp_path, capsys, kind):
    a = CachingAllocator(SimulatedGPU("1GiB"))
    a.record_memory_history(stacks=True)  # blocks carry their allocation's stack, as with history on in PyTorch
    keep = [a.malloc(3 * MiB), a.malloc(1000)]
    gone = a.malloc(6 * MiB)
    a.free(gone)
    snap = a.snapshot()
    snap["device_traces"] = [[]]
    path = write(tmp_path / "s.pickle", snap if kind == "dict" else snap["segments"])
    assert main(["replay", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no trace for device 0" in err and "_record_memory_history" in err
    assert main(["diagnose", path]) == 0
    out = capsys.readouterr().out
    assert "no replay: no trace for device 0 (history was not recorded), so no what-if is possible" in out
    assert "default large pool: 1 segment, 20.00 MiB reserved, 17.00 MiB cached free (largest 17.00 MiB" in out
    assert "default small pool: 1 segment, 2.00 MiB reserved" in out
    assert "test_no_trace_diagnoses_the_state_and_replay_refuses_in_one_line (test_snapshot_kinds.py" in out
    assert keep


def test_the_real_no_trace_snapshot_reads_per_pool(capsys):
    path = str(REAL / "zijiandu-attention-no-trace.pickle")
    assert main(["replay", path]) == 2
    capsys.readouterr()
    assert main(["diagnose", path, "--json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["devices"]
    pools = {p["pool"]: p for p in d["pools"]}
    assert pools["default large"]["segments"] == 222 and pools["default small"]["segments"] == 227
    assert d["reserved"] == sum(p["reserved"] for p in d["pools"]) and d["pinned"]
    assert 0 < pools["default small"]["fragmentation"] < 1


def npu_snapshot() -> dict:
    a = CachingAllocator(SimulatedGPU("1GiB"))
    a.record_memory_history()
    a.free(a.malloc(3 * MiB))
    a.malloc(1 * MiB)
    snap = a.snapshot()
    for e in snap["device_traces"][0]:
        e["frames"] = frames("/usr/lib/python3/site-packages/torch_npu/npu/memory.py", "empty_cache")
    return snap


def test_an_ascend_npu_snapshot_is_named_replay_refuses_and_diagnose_reads_it(tmp_path, capsys):
    path = write(tmp_path / "npu.pickle", npu_snapshot())
    assert main(["replay", path, "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "an Ascend NPU snapshot (torch_npu): its allocator's rules differ from CUDA's" in err
    assert main(["diagnose", path]) == 0
    out = capsys.readouterr().out
    assert "no replay: an Ascend NPU snapshot (torch_npu)" in out and "default large pool: 1 segment, 20.00 MiB" in out


def test_a_cuda_malloc_async_snapshot_is_refused_in_one_line(tmp_path, capsys):
    snap = npu_snapshot()
    for e in snap["device_traces"][0]:
        e.pop("frames")
    snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    assert main(["replay", write(tmp_path / "async.pickle", snap)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a cudaMallocAsync snapshot" in err


def test_a_cuda_snapshot_is_not_taken_for_another_allocator():
    assert unmodelled_allocator(read_snapshot(REAL / "magma27-assignment2-systems.pickle")) is None


def test_an_expandable_run_without_allocator_settings_replays_as_expandable(tmp_path, capsys):
    a = CachingAllocator(SimulatedGPU("1GiB"), "expandable_segments:True")
    a.record_memory_history()
    ptrs = [a.malloc(n * MiB) for n in (30, 5, 50)]
    a.free(ptrs[1])
    a.malloc(4 * MiB)
    snap = a.snapshot()
    del snap["allocator_settings"]
    assert recorded_config(snap) == "expandable_segments:True"
    path = write(tmp_path / "exp.pickle", snap)
    assert main(["replay", path, "--check", "--json"]) == 0
    (check,) = json.loads(capsys.readouterr().out)["devices"]
    assert check["at_recorded_address"] == check["allocations"] == 4


def npu_sized_snapshot() -> dict:
    """A run sized as torch_npu's round_size sizes it (request + 32, rounded up to 512), with no name of torch_npu
    in it: the allocator is asked for 32 bytes more than the requested size the file then records, as
    NPUCachingAllocator's round_size adds them (Ascend/pytorch, torch_npu/csrc/core/npu/NPUCachingAllocator.cpp)."""
    a = CachingAllocator(SimulatedGPU("1GiB"))
    a.record_memory_history()
    requests = [65536, 4096, 1024, 512 * 3, 65536, 8 * MiB]
    ptrs = [a.malloc(n + 32) for n in requests]
    a.free(ptrs[1])
    snap = a.snapshot()
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                b["requested_size"] -= 32
    for e in snap["device_traces"][0]:
        if e["action"] in ("alloc", "free_requested", "free_completed"):
            e["size"] -= 32
        e["frames"] = frames("train.py", "step")
    return snap


def test_an_npu_snapshot_is_told_by_its_block_sizes_and_refused_by_name(tmp_path, capsys):
    from minialloc.trace import npu_block_sizes

    snap = npu_sized_snapshot()
    assert npu_block_sizes(snap) == ({0}, set())
    path = write(tmp_path / "npu-sized.pickle", snap)
    assert main(["replay", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "an Ascend NPU snapshot (torch_npu)" in err
    assert "request + 32 bytes rounded up to 512" in err and "NPUCachingAllocator.cpp" in err
    assert main(["diagnose", path]) == 0  # its state is still read
    assert "no replay: an Ascend NPU snapshot (torch_npu)" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.glob("*.pickle")))
def test_cuda_snapshots_are_not_taken_for_npu_ones(name):
    from minialloc.trace import npu_block_sizes

    npu, _ = npu_block_sizes(read_snapshot(REAL / name))
    assert npu == set()
