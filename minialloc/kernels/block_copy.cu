// block_copy: copy nbytes from src[src_offset...] to dst[dst_offset...]; the two ranges must NOT overlap.
//
// Threads copy bytes in no particular order, so an overlapping copy would read bytes another thread has
// already overwritten: the result would depend on scheduling. The host wrapper therefore rejects overlap, and
// minialloc.kernels.reference.move_plan turns an overlapping move (compaction sliding a block toward lower
// addresses) into a sequence of non-overlapping launches. The NumPy twin is minialloc.kernels.reference.block_copy.
extern "C" __global__ void block_copy(unsigned char* dst, unsigned long long dst_offset,
                                      const unsigned char* src, unsigned long long src_offset,
                                      unsigned long long nbytes) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes;
         i += stride) {
        dst[dst_offset + i] = src[src_offset + i];
    }
}
