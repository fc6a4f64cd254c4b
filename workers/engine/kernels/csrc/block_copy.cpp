// kvferry::write_blocks: whole blocks of K/V bytes (warm-tier entries, packs read from Redis) copied
// into their slots of the CPU pool, with non-temporal stores.
//
// A block lies in the pool as one run of block_size slots per (layer, K or V), so loading 128
// blocks of SmolLM2 is 7,680 copies of 12 KiB: too small for memcpy's own non-temporal path, so
// each store first reads its cache line from memory (write-allocate) and later evicts it, three
// memory transfers per byte. Streaming stores skip the read; the lines go out in whole. Nothing
// here reads the blocks back soon enough to want them cached: the step that loaded them reads
// 94 MB of context. Streamed, a load beats both memcpy and numpy's copies (docs/benchmarks.md).
//
// pool [layers, 2, slots, Hkv, D] contiguous CPU; block_ids [n] int64; sources [n] int64: the
// address of each block's bytes (read_block's layout, [layers, 2, block_size, Hkv, D]), which the
// caller owns and keeps alive for the call. Addresses are not checked: the Python wrapper
// (workers/engine/kernels/block_writer.py) takes them from buffers of the right length, and loads each
// block once (the threads split a block's runs between them).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace {

// dst[0, bytes) = src[0, bytes): streamed from dst's first 64-byte boundary, the edges by memcpy.
void stream_copy(char* dst, const char* src, int64_t bytes) {
#if defined(__SSE2__)
  const int64_t head = std::min<int64_t>(bytes, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
  std::memcpy(dst, src, head);
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_loadu_si512(src + i));
#elif defined(__AVX__)
    const __m256i* s = reinterpret_cast<const __m256i*>(src + i);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_loadu_si256(s));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), _mm256_loadu_si256(s + 1));
#else
    for (int j = 0; j < 64; j += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + j),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + j)));
#endif
  }
  std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void write_blocks(at::Tensor pool, const at::Tensor& block_ids, const at::Tensor& sources, int64_t block_size) {
  TORCH_CHECK(pool.dim() == 5 && pool.size(1) == 2 && pool.is_contiguous() && pool.device().is_cpu(),
              "kvferry::write_blocks: pool must be a contiguous CPU [layers, 2, slots, Hkv, D]");
  for (const at::Tensor* t : {&block_ids, &sources})
    TORCH_CHECK(t->dim() == 1 && t->is_contiguous() && t->scalar_type() == at::kLong && t->size(0) == block_ids.size(0),
                "kvferry::write_blocks: block_ids and sources must be contiguous int64 [n]");
  const int64_t slots = pool.size(2);
  TORCH_CHECK(block_size > 0 && slots % block_size == 0, "kvferry::write_blocks: slots must be whole blocks");
  const int64_t n = block_ids.size(0), num_blocks = slots / block_size, halves = pool.size(0) * 2;
  const int64_t* ids = block_ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(ids[i] >= 0 && ids[i] < num_blocks, "kvferry::write_blocks: block ", ids[i], " is not in the pool's ",
                num_blocks);
  const int64_t run = block_size * pool.size(3) * pool.size(4) * pool.element_size();  // one (layer, K|V) of a block
  char* base = static_cast<char*>(pool.data_ptr());
  const int64_t* src = sources.data_ptr<int64_t>();
  at::parallel_for(0, n * halves, 16, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t i = k / halves, half = k % halves;
      const char* from = reinterpret_cast<const char*>(src[i]) + half * run;
      stream_copy(base + (half * num_blocks + ids[i]) * run, from, run);
    }
#if defined(__SSE2__)
    _mm_sfence();  // this thread's streamed lines are out before the region ends
#endif
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvferry, m) {
  m.def("write_blocks(Tensor(a!) pool, Tensor block_ids, Tensor sources, int block_size) -> ()");
}

TORCH_LIBRARY_IMPL(kvferry, CPU, m) { m.impl("write_blocks", &write_blocks); }
