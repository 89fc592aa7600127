// fill_pattern: write a repeating 4-byte pattern over bytes [offset, offset + nbytes) of buf.
//
// Byte i of the range (counted from `offset`) gets byte (i % 4) of `pattern`, least significant byte first,
// so 0xDBDBDBDB poisons freed memory, 0 zeroes new memory, and 0xEFBEADDE writes "DEADBEEF" in memory order.
// One thread per byte in a grid-stride loop: any grid, however small, covers any range, and bytes outside the
// range are never touched. The NumPy twin is minialloc.kernels.reference.fill.
extern "C" __global__ void fill_pattern(unsigned char* buf, unsigned long long offset,
                                        unsigned long long nbytes, unsigned int pattern) {
    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes;
         i += stride) {
        buf[offset + i] = (unsigned char)(pattern >> (8u * (unsigned int)(i & 3ull)));
    }
}
