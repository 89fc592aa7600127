// paged_attention: decode attention (one query token per sequence) reading K and V through block tables, as
// vLLM's PagedAttention kernel does; dense_attention: the same code over contiguous K and V, the baseline that
// the paged kernel's cost is measured against. float32 throughout.
//
//   q             [num_seqs, num_heads, head_dim]
//   kv_cache      [num_blocks, 2, block_size, num_kv_heads, head_dim]   (2: K then V; one layer)
//   block_tables  [num_seqs, max_blocks] int32: logical block j of sequence s lives in physical block
//                 block_tables[s][j]; entries past a sequence's context are never read
//   context_lens  [num_seqs] int32, each >= 1 and <= max_blocks * block_size
//   k, v (dense)  [num_seqs, max_len, num_kv_heads, head_dim]
//   out           [num_seqs, num_heads, head_dim] = softmax(scale * q . K^T) V over each sequence's context
// Query head h reads KV head h / (num_heads / num_kv_heads) (grouped-query attention). The NumPy twins are
// minialloc.paging.paged_attention_reference and dense_attention_reference.
//
// Work split. One CUDA block per (sequence, query head), striding over them when the grid is smaller. Its
// threads form groups of 8 lanes (16 when head_dim > 128); a group takes one token at a time (group g: tokens g,
// g + groups, ...) and lane i of the group holds dimensions i, i + 8, i + 16, ... of q, K, V and the output. So
// one warp load reads 4 tokens x 32 contiguous bytes, whole sectors, and a token's dot product needs only 3
// shuffles. Each lane holds at most 16 dimensions, which keeps registers (and so occupancy) reasonable. Each
// group keeps its own online softmax (running max m, sum l, weighted V sum acc), so a group never waits for
// another; the groups of a warp merge their states with shuffles at the end, and the warps through shared
// memory. K and V are each read once per query head: with grouped-query attention the heads sharing a KV head
// are neighbouring CUDA blocks, so the re-reads mostly hit L2.
//
// Uniform control flow, on purpose: every lane runs every round of the token loop (a lane past the context
// loads nothing and skips the update), so every shuffle has all 32 lanes, and every __syncthreads is reached by
// the whole block. The CPU emulation (cuda_emulation.h, cooperative launch) refuses anything else.
//
// Launch: blockDim a multiple of 32 and at most kMaxThreads, head_dim at most kMaxHeadDim (the launch wrapper,
// minialloc.kernels.launch, checks; a kernel launched otherwise returns without writing).

namespace paged_attention_impl {

constexpr unsigned int kMaxThreads = 256;   // blockDim limit: sizes the shared arrays
constexpr unsigned int kMaxWarps = kMaxThreads / 32;
constexpr unsigned int kMaxHeadDim = 256;   // 16 lanes per token x 16 dimensions per lane
constexpr unsigned int kFullMask = 0xffffffffu;
constexpr float kNoScore = -3.0e38f;        // "no token yet": finite, so merging two empty states gives no NaN

// Where token t of sequence s keeps its K row and its V row for KV head h.
struct PagedLayout {
    const float* cache;
    const int* tables;
    unsigned long long max_blocks;
    unsigned int block_size;
    unsigned int num_kv_heads;
    unsigned int head_dim;

    __device__ __forceinline__ const float* key(unsigned long long s, unsigned int t, unsigned int h) const {
        const unsigned long long block = (unsigned long long)tables[s * max_blocks + t / block_size];
        return cache + ((block * 2ull * block_size + t % block_size) * num_kv_heads + h) * head_dim;
    }
    __device__ __forceinline__ const float* value(const float* key) const {
        return key + (unsigned long long)block_size * num_kv_heads * head_dim;  // V follows K in each block
    }
};

struct DenseLayout {
    const float* k;
    const float* v;
    unsigned long long max_len;
    unsigned int num_kv_heads;
    unsigned int head_dim;

    __device__ __forceinline__ const float* key(unsigned long long s, unsigned int t, unsigned int h) const {
        return k + ((s * max_len + t) * num_kv_heads + h) * head_dim;
    }
    __device__ __forceinline__ const float* value(const float* key) const {
        return v + (key - k);  // the same row of the other array
    }
};

struct Shared {
    float acc[kMaxWarps][kMaxHeadDim];
    float m[kMaxWarps];
    float l[kMaxWarps];
};

// kGroup lanes per token, kDims dimensions per lane: kGroup * kDims >= head_dim (chosen by dispatch below).
template <unsigned int kGroup, unsigned int kDims, typename Layout>
__device__ void attend(float* out, const float* q, const int* context_lens, unsigned long long num_seqs,
                       unsigned int num_heads, unsigned int num_kv_heads, unsigned int head_dim, float scale,
                       const Layout& layout, Shared& shared) {
    const unsigned int lane = threadIdx.x % 32u;
    const unsigned int warp = threadIdx.x / 32u;
    const unsigned int warps = blockDim.x / 32u;
    const unsigned int sub = lane % kGroup;           // this lane's dimensions: sub, sub + kGroup, ...
    const unsigned int group = threadIdx.x / kGroup;  // this lane's tokens: group, group + groups, ...
    const unsigned int groups = blockDim.x / kGroup;
    const unsigned int heads_per_kv = num_heads / num_kv_heads;
    for (unsigned long long item = blockIdx.x; item < num_seqs * num_heads; item += gridDim.x) {
        const unsigned long long s = item / num_heads;
        const unsigned int kv_head = (unsigned int)(item % num_heads) / heads_per_kv;
        const unsigned int len = (unsigned int)context_lens[s];
        float qr[kDims], acc[kDims];
        for (unsigned int j = 0; j < kDims; ++j) {
            const unsigned int d = sub + j * kGroup;
            qr[j] = d < head_dim ? q[item * head_dim + d] * scale : 0.0f;
            acc[j] = 0.0f;
        }
        float m = kNoScore, l = 0.0f;
        for (unsigned int base = 0; base < len; base += groups) {  // the same rounds for the whole block
            const unsigned int t = base + group;
            const bool active = t < len;
            float kr[kDims], vr[kDims];
            const float* key = active ? layout.key(s, t, kv_head) : nullptr;
            const float* value = active ? layout.value(key) : nullptr;
            for (unsigned int j = 0; j < kDims; ++j) {  // K and V loads together: both in flight at once
                const unsigned int d = sub + j * kGroup;
                const bool load = active && d < head_dim;
                kr[j] = load ? key[d] : 0.0f;
                vr[j] = load ? value[d] : 0.0f;
            }
            float score = 0.0f;
            for (unsigned int j = 0; j < kDims; ++j) score += qr[j] * kr[j];
            for (unsigned int o = kGroup / 2; o > 0; o /= 2) score += __shfl_xor_sync(kFullMask, score, (int)o);
            if (active) {
                const float m_new = fmaxf(m, score);
                const float rescale = expf(m - m_new);
                const float p = expf(score - m_new);
                l = l * rescale + p;
                for (unsigned int j = 0; j < kDims; ++j) acc[j] = acc[j] * rescale + p * vr[j];
                m = m_new;
            }
        }
        // merge the groups of this warp: lanes holding the same dimensions are kGroup, 2 kGroup, ... apart
        for (unsigned int o = kGroup; o < 32u; o *= 2) {
            const float m_other = __shfl_xor_sync(kFullMask, m, (int)o);
            const float l_other = __shfl_xor_sync(kFullMask, l, (int)o);
            const float m_new = fmaxf(m, m_other);
            const float mine = expf(m - m_new), theirs = expf(m_other - m_new);
            l = l * mine + l_other * theirs;
            for (unsigned int j = 0; j < kDims; ++j) {
                acc[j] = acc[j] * mine + __shfl_xor_sync(kFullMask, acc[j], (int)o) * theirs;
            }
            m = m_new;
        }
        if (lane < kGroup) {
            for (unsigned int j = 0; j < kDims; ++j) {
                const unsigned int d = lane + j * kGroup;
                if (d < head_dim) shared.acc[warp][d] = acc[j];
            }
            if (lane == 0) {
                shared.m[warp] = m;
                shared.l[warp] = l;
            }
        }
        __syncthreads();
        // merge the warps; every thread does the few scalar steps, then writes its share of the dimensions
        float m_all = kNoScore;
        for (unsigned int w = 0; w < warps; ++w) m_all = fmaxf(m_all, shared.m[w]);
        float l_all = 0.0f;
        for (unsigned int w = 0; w < warps; ++w) l_all += shared.l[w] * expf(shared.m[w] - m_all);
        for (unsigned int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float o = 0.0f;
            for (unsigned int w = 0; w < warps; ++w) o += shared.acc[w][d] * expf(shared.m[w] - m_all);
            out[item * head_dim + d] = o / l_all;
        }
        __syncthreads();  // the next item overwrites the shared arrays
    }
}

template <typename Layout>
__device__ void dispatch(float* out, const float* q, const int* context_lens, unsigned long long num_seqs,
                         unsigned int num_heads, unsigned int num_kv_heads, unsigned int head_dim, float scale,
                         const Layout& layout, Shared& shared) {
    if (blockDim.x % 32u != 0u || blockDim.x > kMaxThreads || head_dim == 0u || head_dim > kMaxHeadDim ||
        num_kv_heads == 0u || num_heads % num_kv_heads != 0u) {
        return;  // the launch wrapper never does this; refusing beats overflowing the shared arrays
    }
    const unsigned int dims = (head_dim + 7u) / 8u;  // dimensions per lane with 8 lanes per token
    if (dims <= 1) {
        attend<8, 1>(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
    } else if (dims <= 2) {
        attend<8, 2>(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
    } else if (dims <= 4) {
        attend<8, 4>(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
    } else if (dims <= 8) {
        attend<8, 8>(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
    } else if (dims <= 16) {
        attend<8, 16>(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
    } else {  // head_dim 129-256: 16 lanes per token rather than 32 dimensions per lane
        attend<16, 16>(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
    }
}

}  // namespace paged_attention_impl

extern "C" __global__ void paged_attention(float* out, const float* q, const float* kv_cache,
                                           const int* block_tables, const int* context_lens,
                                           unsigned long long num_seqs, unsigned int num_heads,
                                           unsigned int num_kv_heads, unsigned int head_dim,
                                           unsigned int block_size, unsigned long long max_blocks, float scale) {
    namespace impl = paged_attention_impl;
    __shared__ impl::Shared shared;
    const impl::PagedLayout layout{kv_cache, block_tables, max_blocks, block_size, num_kv_heads, head_dim};
    impl::dispatch(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
}

extern "C" __global__ void dense_attention(float* out, const float* q, const float* k, const float* v,
                                           const int* context_lens, unsigned long long num_seqs,
                                           unsigned int num_heads, unsigned int num_kv_heads,
                                           unsigned int head_dim, unsigned long long max_len, float scale) {
    namespace impl = paged_attention_impl;
    __shared__ impl::Shared shared;
    const impl::DenseLayout layout{k, v, max_len, num_kv_heads, head_dim};
    impl::dispatch(out, q, context_lens, num_seqs, num_heads, num_kv_heads, head_dim, scale, layout, shared);
}
