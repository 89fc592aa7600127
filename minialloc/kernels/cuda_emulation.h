// cuda_emulation.h: just enough of CUDA to run minialloc's kernels on the CPU, one thread at a time.
//
// Why: the kernels' index arithmetic (grid-stride loops, offsets, tails that are not a multiple of the block)
// is where their bugs live, and it needs no GPU to check. Included before a .cu file and compiled with the
// host C++ compiler, this header turns `__global__` functions into plain functions, makes threadIdx, blockIdx,
// blockDim and gridDim globals, and emulates a launch by calling the kernel once per (block, thread).
//
// Threads run to completion one after another, so there is no __syncthreads and no shared memory: kernels
// that need them cannot be checked here. The order of the (block, thread) pairs is chosen per launch (in order,
// reversed, or shuffled by a seed), so a kernel whose result depends on thread order shows it.
//
// A launch takes its arguments as CUDA's own launch API does: an array of pointers, one per kernel parameter.
// MINIALLOC_EMULATE(name) exports `emu_<name>(grid, block, order, args)` for ctypes.
#pragma once

#include <algorithm>
#include <cstddef>
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

// Calls kernel(*(P0*)args[0], *(P1*)args[1], ...): the kernel's own parameter types say how to read each slot.
template <typename... P, std::size_t... I>
void call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<P>*>(args[I])...);
}

// order 0: block by block, threads in order; 1: everything reversed; any other value: shuffled with that seed.
template <typename... P>
void launch(void (*kernel)(P...), unsigned int grid, unsigned int block, unsigned long long order, void** args) {
    std::vector<std::pair<unsigned int, unsigned int>> work;
    work.reserve(static_cast<std::size_t>(grid) * block);
    for (unsigned int b = 0; b < grid; ++b)
        for (unsigned int t = 0; t < block; ++t) work.emplace_back(b, t);
    if (order == 1) {
        std::reverse(work.begin(), work.end());
    } else if (order > 1) {
        std::mt19937_64 rng(order);
        std::shuffle(work.begin(), work.end(), rng);
    }
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    for (const auto& [b, t] : work) {
        blockIdx = dim3{b, 0, 0};
        threadIdx = dim3{t, 0, 0};
        call(kernel, args, std::index_sequence_for<P...>{});
    }
}

}  // namespace emu

#define MINIALLOC_EMULATE(name)                                                                           \
    extern "C" void emu_##name(unsigned int grid, unsigned int block, unsigned long long order,             \
                               void** args) {                                                             \
        emu::launch(name, grid, block, order, args);                                                      \
    }
