// guard_check: find the first byte of [offset, offset + nbytes) of buf that differs from the fill pattern.
//
// The pattern is laid out exactly as fill_pattern writes it (byte i of the range is byte i % 4 of `pattern`).
// *first_bad must hold ULLONG_MAX before the launch (the host wrapper sets it); afterwards it holds the smallest
// offset, relative to the range, whose byte differs, or still ULLONG_MAX when every byte matches. Threads find
// mismatches in any order, so they agree on the smallest with atomicMin; a thread stops at its first mismatch
// because its later indices are larger. The NumPy twin is minialloc.kernels.reference.guard_check.
extern "C" __global__ void guard_check(const unsigned char* buf, unsigned long long offset,
                                       unsigned long long nbytes, unsigned int pattern,
                                       unsigned long long* first_bad) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes;
         i += stride) {
        const unsigned char expected = (unsigned char)(pattern >> (8u * (unsigned int)(i & 3ull)));
        if (buf[offset + i] != expected) {
            atomicMin(first_bad, i);
            return;
        }
    }
}
