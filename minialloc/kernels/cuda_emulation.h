// cuda_emulation.h: just enough of CUDA to run minialloc's kernels on the CPU.
//
// Why: the kernels' index arithmetic (grid-stride loops, offsets, tails that are not a multiple of the block)
// is where their bugs live, and it needs no GPU to check. Included before a .cu file and compiled with the
// host C++ compiler, this header turns `__global__` functions into plain functions, makes threadIdx, blockIdx,
// blockDim and gridDim globals, and emulates a launch. There are two kinds of launch:
//
// - MINIALLOC_EMULATE(name): threads run to completion one after another, in an order chosen per launch (in
//   order, reversed, or shuffled by a seed, across blocks too), so a kernel whose result depends on thread order
//   shows it. No __syncthreads, no shared memory, no warp shuffles: a kernel that calls them fails the launch.
// - MINIALLOC_EMULATE_COOPERATIVE(name): blocks run one at a time, and each thread of the block is a fiber
//   (ucontext) with its own stack, so it can stop at a barrier and resume there. __syncthreads() waits for every
//   thread of the block; __syncwarp() and __shfl_xor_sync() for every thread of the warp (full mask only). Between
//   barriers the runnable threads run in an order chosen per phase (in order, reversed, or shuffled), so a missing
//   barrier shows as an order-dependent result. __shared__ variables become function statics: one copy, which
//   every thread of the running block sees, as on a GPU. They are not cleared between blocks (a GPU does not
//   clear them either; a kernel must write shared memory before reading it).
//   Strict where CUDA leaves things undefined: a barrier or shuffle that some thread of its block or warp never
//   reaches (it exited, or waits at another barrier) fails the launch instead of guessing. Needs <ucontext.h>
//   (Linux, glibc).
//
// A launch takes its arguments as CUDA's own launch API does: an array of pointers, one per kernel parameter.
// The exported `emu_<name>(grid, block, order, args)` returns 0, or 1 with the reason in emu_last_error().
#pragma once

#include <ucontext.h>

#include <math.h>  // expf, fmaxf in the global namespace, as CUDA device code has them

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

struct dim3 {
    unsigned int x, y, z;
};

inline dim3 threadIdx{0, 0, 0};
inline dim3 blockIdx{0, 0, 0};
inline dim3 blockDim{1, 1, 1};
inline dim3 gridDim{1, 1, 1};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

// Threads run one at a time, so the read-modify-write needs no real atomicity; the return value is CUDA's.
inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
    const unsigned long long old = *address;
    if (value < old) *address = value;
    return old;
}

inline unsigned int atomicMin(unsigned int* address, unsigned int value) {
    const unsigned int old = *address;
    if (value < old) *address = value;
    return old;
}

inline int atomicMin(int* address, int value) {
    const int old = *address;
    if (value < old) *address = value;
    return old;
}

namespace emu {

constexpr unsigned int kWarpSize = 32;
constexpr unsigned int kFullMask = 0xffffffffu;
constexpr std::size_t kFiberStack = 64 * 1024;  // kernels keep a few small arrays: 64 KiB is plenty

inline const char* launch_error = nullptr;  // the first thing that went wrong in the current launch

inline void fail(const char* why) {
    if (launch_error == nullptr) launch_error = why;
}

// Calls kernel(*(P0*)args[0], *(P1*)args[1], ...): the kernel's own parameter types say how to read each slot.
template <typename... P, std::size_t... I>
void call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<P>*>(args[I])...);
}

// order 0: as given; 1: reversed; any other value: shuffled by rng (seeded with that value by the caller).
template <typename T>
void arrange(std::vector<T>& items, unsigned long long order, std::mt19937_64& rng) {
    if (order == 1) {
        std::reverse(items.begin(), items.end());
    } else if (order > 1) {
        std::shuffle(items.begin(), items.end(), rng);
    }
}

template <typename... P>
void launch(void (*kernel)(P...), unsigned int grid, unsigned int block, unsigned long long order, void** args) {
    std::vector<std::pair<unsigned int, unsigned int>> work;
    work.reserve(static_cast<std::size_t>(grid) * block);
    for (unsigned int b = 0; b < grid; ++b)
        for (unsigned int t = 0; t < block; ++t) work.emplace_back(b, t);
    std::mt19937_64 rng(order);
    arrange(work, order, rng);
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    for (const auto& [b, t] : work) {
        blockIdx = dim3{b, 0, 0};
        threadIdx = dim3{t, 0, 0};
        call(kernel, args, std::index_sequence_for<P...>{});
    }
}

// -- cooperative launches: one fiber per thread of the running block ------------------------------------------
enum class State { runnable, at_block_barrier, at_warp_barrier, done };

struct Fiber {
    ucontext_t context;
    std::unique_ptr<char[]> stack;
    State state = State::runnable;
};

struct BlockRun {
    std::vector<Fiber> fibers;
    std::vector<std::uint64_t> exchange;  // one slot per thread: what __shfl_xor_sync passes between lanes
    ucontext_t scheduler;
    unsigned int current = 0;
    std::function<void()> body;  // runs the kernel for the current fiber's thread
};

inline BlockRun* running_block = nullptr;  // set while a cooperative launch runs

inline void fiber_main() {
    running_block->body();
    running_block->fibers[running_block->current].state = State::done;
    // returning resumes uc_link: the scheduler
}

// Park the current thread at a barrier and return to the scheduler; resumes once the barrier is released.
inline void wait_at(State barrier) {
    BlockRun* run = running_block;
    if (run == nullptr) {
        fail("__syncthreads, __syncwarp or a warp shuffle in a kernel not launched cooperatively "
             "(register it with cooperative=True)");
        return;
    }
    Fiber& self = run->fibers[run->current];
    self.state = barrier;
    swapcontext(&self.context, &run->scheduler);
}

// Release the barriers every thread concerned has reached; false when none can be (a deadlock on a GPU).
inline bool release(BlockRun& run) {
    const auto n = static_cast<unsigned int>(run.fibers.size());
    bool any = false;
    bool all_at_block = true;
    for (const Fiber& f : run.fibers) all_at_block = all_at_block && f.state == State::at_block_barrier;
    if (all_at_block) {
        for (Fiber& f : run.fibers) f.state = State::runnable;
        return true;
    }
    for (unsigned int w = 0; w < n; w += kWarpSize) {
        const unsigned int end = std::min(n, w + kWarpSize);
        bool all_at_warp = true;
        for (unsigned int t = w; t < end; ++t) {
            all_at_warp = all_at_warp && run.fibers[t].state == State::at_warp_barrier;
        }
        if (all_at_warp) {
            for (unsigned int t = w; t < end; ++t) run.fibers[t].state = State::runnable;
            any = true;
        }
    }
    return any;
}

template <typename... P>
void launch_cooperative(void (*kernel)(P...), unsigned int grid, unsigned int block, unsigned long long order,
                        void** args) {
    std::vector<unsigned int> blocks(grid), threads(block);
    for (unsigned int b = 0; b < grid; ++b) blocks[b] = b;
    std::mt19937_64 rng(order);
    arrange(blocks, order, rng);
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    BlockRun run;
    run.fibers.resize(block);
    run.exchange.assign(block, 0);
    for (Fiber& f : run.fibers) f.stack = std::make_unique<char[]>(kFiberStack);
    run.body = [&] { call(kernel, args, std::index_sequence_for<P...>{}); };
    running_block = &run;
    for (const unsigned int b : blocks) {
        blockIdx = dim3{b, 0, 0};
        for (Fiber& f : run.fibers) {
            getcontext(&f.context);
            f.context.uc_stack.ss_sp = f.stack.get();
            f.context.uc_stack.ss_size = kFiberStack;
            f.context.uc_link = &run.scheduler;
            makecontext(&f.context, fiber_main, 0);
            f.state = State::runnable;
        }
        while (launch_error == nullptr) {
            for (unsigned int t = 0; t < block; ++t) threads[t] = t;
            arrange(threads, order, rng);
            for (const unsigned int t : threads) {
                if (run.fibers[t].state != State::runnable || launch_error != nullptr) continue;
                run.current = t;
                threadIdx = dim3{t, 0, 0};
                swapcontext(&run.scheduler, &run.fibers[t].context);
            }
            bool all_done = true;
            for (const Fiber& f : run.fibers) all_done = all_done && f.state == State::done;
            if (all_done) break;
            if (!release(run)) {
                fail("a barrier or warp shuffle that some thread of its block or warp never reaches "
                     "(it exited, or waits at another barrier): a deadlock or undefined behaviour on a GPU");
            }
        }
        if (launch_error != nullptr) break;  // the parked fibers are abandoned: kernels hold no resources
    }
    running_block = nullptr;
}

}  // namespace emu

inline void __syncthreads() { emu::wait_at(emu::State::at_block_barrier); }

inline void __syncwarp(unsigned int mask = emu::kFullMask) {
    if (mask != emu::kFullMask) emu::fail("__syncwarp: only the full mask is emulated");
    emu::wait_at(emu::State::at_warp_barrier);
}

// Every lane publishes its value, the warp meets, each lane reads its partner's, the warp meets again (so no
// lane overwrites its slot with a later shuffle's value before its partner has read it).
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T var, int lane_mask, int width = 32) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(std::uint64_t), "a 1-8 byte value");
    emu::BlockRun* run = emu::running_block;
    if (run == nullptr) {
        emu::fail("a warp shuffle in a kernel not launched cooperatively (register it with cooperative=True)");
        return var;
    }
    if (mask != emu::kFullMask || width != 32 || lane_mask < 0 || lane_mask >= 32) {
        emu::fail("__shfl_xor_sync: only the full mask, width 32 and lane masks 0-31 are emulated");
        return var;
    }
    const unsigned int self = threadIdx.x;
    const unsigned int partner = (self & ~31u) | ((self & 31u) ^ static_cast<unsigned int>(lane_mask));
    std::memcpy(&run->exchange[self], &var, sizeof(T));
    emu::wait_at(emu::State::at_warp_barrier);
    T out = var;
    if (partner >= run->exchange.size()) {
        emu::fail("__shfl_xor_sync from a lane past the end of the block (blockDim is not a multiple of 32)");
    } else {
        std::memcpy(&out, &run->exchange[partner], sizeof(T));
    }
    emu::wait_at(emu::State::at_warp_barrier);
    return out;
}

extern "C" const char* emu_last_error() { return emu::launch_error == nullptr ? "" : emu::launch_error; }

#define MINIALLOC_EMULATE(name)                                                                           \
    extern "C" int emu_##name(unsigned int grid, unsigned int block, unsigned long long order, void** args) { \
        emu::launch_error = nullptr;                                                                      \
        emu::launch(name, grid, block, order, args);                                                      \
        return emu::launch_error == nullptr ? 0 : 1;                                                      \
    }

#define MINIALLOC_EMULATE_COOPERATIVE(name)                                                               \
    extern "C" int emu_##name(unsigned int grid, unsigned int block, unsigned long long order, void** args) { \
        emu::launch_error = nullptr;                                                                      \
        emu::launch_cooperative(name, grid, block, order, args);                                          \
        return emu::launch_error == nullptr ? 0 : 1;                                                      \
    }
