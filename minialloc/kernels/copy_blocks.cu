// copy_blocks: copy whole blocks of a paged KV cache, as vLLM's copy-on-write does.
//
// `cache` is num_blocks x block_words 32-bit words (block size in bytes / 4). `pairs` holds num_pairs pairs
// (src_block, dst_block) as 64-bit ints, flattened. One CUDA block copies one pair, its threads striding over
// the words; a grid smaller than num_pairs strides over the pairs. Pairs run in parallel, so the host wrapper
// requires distinct destination blocks that are nobody's source. The NumPy twin is
// minialloc.kernels.reference.copy_blocks.
extern "C" __global__ void copy_blocks(unsigned int* cache, const long long* pairs,
                                       unsigned long long num_pairs, unsigned long long block_words) {
    for (unsigned long long p = blockIdx.x; p < num_pairs; p += gridDim.x) {
        const unsigned int* src = cache + (unsigned long long)pairs[2 * p] * block_words;
        unsigned int* dst = cache + (unsigned long long)pairs[2 * p + 1] * block_words;
        for (unsigned long long w = threadIdx.x; w < block_words; w += blockDim.x) {
            dst[w] = src[w];
        }
    }
}
