// Incremental decoding with a KV cache (nn/kv_cache.h,
// Transformer::last_logits with a cache) against running the whole sequence
// again each time (last_logits without one).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/transformer.h"
#include "test_util.h"

namespace zt::nn {
namespace {

struct Form {
  const char* preset;
  const char* fused_qkv;  // ZT_FUSED_QKV while the model is built (null: the CPU's default)
  const char* what;
};

// Every way a block makes q, k and v (nn/transformer.h, QkvForm), for a dense
// GPT-2 and Llama and a mixture of experts.
const Form kForms[] = {
    {"gpt2-tiny", nullptr, "gpt2, three products"},
    {"gpt2-tiny", "1", "gpt2, one product read in place (packed)"},
    {"llama3-tiny", nullptr, "llama3, one product split by RoPE"},
    {"llama3-tiny", "0", "llama3, three products"},
    {"llama3-tiny", "1", "llama3, one product rotated in place (packed)"},
    {"llama3-moe-tiny", nullptr, "llama3 MoE"},
};

// Builds the model of `f` in dtype dt with weights of seed 7.
std::unique_ptr<Transformer> build(const Form& f, DType dt, ModelConfig c) {
  EXPECT_EQ(std::getenv("ZT_FUSED_QKV"), nullptr) << "the test sets it itself";
  if (f.fused_qkv) ::setenv("ZT_FUSED_QKV", f.fused_qkv, 1);
  auto m = std::make_unique<Transformer>(c, dt);
  ::unsetenv("ZT_FUSED_QKV");
  m->init_weights(7);
  return m;
}

// A prompt run into an empty cache, a continuation of several tokens, then
// one token at a time: each call's logits are those of the whole sequence
// so far run without a cache - bit for bit on the first call (the same
// passes), to rounding after it (products and attention over fewer rows).
TEST(KvCache, DecodingMatchesRunningTheWholeSequenceAgain) {
  for (const Form& f : kForms)
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(f.what) + ", " + std::string(dtype_name(dt)));
      const ModelConfig c = model_preset(f.preset);
      auto m = build(f, dt, c);
      auto rng = test::make_rng(23);
      const int64_t B = 2, T = 14, Vp = c.padded_vocab();
      const Tensor tokens = test::random_tokens(Shape{B, T}, c.vocab_size, rng);
      KvCache cache = m->make_kv_cache(B);
      EXPECT_EQ(cache.capacity(), c.max_seq_len);
      // The calls' ends: a 5-token prompt, 3 more at once, then one by one.
      const std::vector<int64_t> ends = {5, 8, 9, 10, 11, 12, 13, 14};
      int64_t start = 0;
      for (int64_t end : ends) {
        SCOPED_TRACE("positions [" + std::to_string(start) + ", " + std::to_string(end) + ")");
        const Tensor cached = Tensor::empty(Shape{B, Vp}, DType::f32), whole = Tensor::empty(Shape{B, Vp}, DType::f32);
        test::poison(cached);
        m->last_logits(cached, test::token_columns(tokens, start, end), cache);
        m->last_logits(whole, test::token_columns(tokens, 0, end));
        EXPECT_EQ(cache.length(), end);
        if (start == 0) {
          EXPECT_TRUE(test::all_close(cached, test::to_f64(whole), 0, 0));
        } else {
          // f32: sums in another order; bf16: those feed roundings to 8 bits.
          EXPECT_TRUE(test::rel_error_within(cached, test::to_f64(whole), dt == DType::f32 ? 1e-5 : 2e-2, "logits"));
        }
        start = end;
      }
    }
}

// A cache that is full, made for another batch, or larger than the model's
// context is refused with what to do instead; a cleared cache starts over.
TEST(KvCache, RefusesWhatDoesNotFitAndStartsOverWhenCleared) {
  const ModelConfig c = model_preset("llama3-tiny");
  Transformer m(c, DType::f32);
  m.init_weights(3);
  auto rng = test::make_rng(5);
  const int64_t Vp = c.padded_vocab();
  KvCache cache = m.make_kv_cache(1, 6);
  EXPECT_EQ(cache.blocks(), c.n_layer);
  EXPECT_EQ(cache.nbytes(), 2 * c.n_layer * 6 * c.n_kv_head * c.head_dim() * 4);
  const Tensor out = Tensor::empty(Shape{1, Vp}, DType::f32), first = Tensor::empty(Shape{1, Vp}, DType::f32);
  const Tensor four = test::random_tokens(Shape{1, 4}, c.vocab_size, rng);
  m.last_logits(first, four, cache);
  const std::string full = test::error_of([&] { m.last_logits(out, four, cache); });
  EXPECT_NE(full.find("holds 4 of its 6 positions; 4 more tokens do not fit: clear() it"), std::string::npos) << full;
  EXPECT_EQ(cache.length(), 4) << "a refused call leaves the cache as it was";
  const std::string batch = test::error_of(
      [&] { m.last_logits(Tensor::empty(Shape{2, Vp}, DType::f32), test::random_tokens(Shape{2, 1}, 9, rng), cache); });
  EXPECT_NE(batch.find("make it with make_kv_cache(2)"), std::string::npos) << batch;
  const std::string big = test::error_of([&] { m.make_kv_cache(1, c.max_seq_len + 1); });
  EXPECT_NE(big.find("up to model.max_seq_len = " + std::to_string(c.max_seq_len)), std::string::npos) << big;
  cache.clear();
  test::poison(out);
  m.last_logits(out, four, cache);
  EXPECT_TRUE(test::all_close(out, test::to_f64(first), 0, 0)) << "after clear() the same tokens give the same logits";
}

// Two pipeline stages, each with its own cache, decode as the whole model does.
TEST(KvCache, PipelineStagesDecodeWithTheirOwnCaches) {
  const ModelConfig c = model_preset("gpt2-tiny");
  const ModelPart cuts[] = {{0, 1, true, false}, {1, c.n_layer, false, true}};
  Transformer whole(c, DType::f32), first(c, DType::f32, Device::cpu(), 1, TensorParallel{}, cuts[0]),
      second(c, DType::f32, Device::cpu(), 1, TensorParallel{}, cuts[1]);
  for (Transformer* m : {&whole, &first, &second}) m->init_weights(9);
  KvCache cw = whole.make_kv_cache(1), c1 = first.make_kv_cache(1), c2 = second.make_kv_cache(1);
  EXPECT_EQ(c1.blocks() + c2.blocks(), c.n_layer);
  auto rng = test::make_rng(29);
  const Tensor tokens = test::random_tokens(Shape{1, 9}, c.vocab_size, rng);
  for (int64_t start : {0, 6, 7, 8}) {
    const int64_t end = start == 0 ? 6 : start + 1;
    const Tensor step = test::token_columns(tokens, start, end);
    const Tensor want = Tensor::empty(Shape{1, c.padded_vocab()}, DType::f32), got = Tensor::empty(want.shape(), DType::f32);
    test::poison(got);
    whole.last_logits(want, step, cw);
    second.logits_part(got, first.logits_part(Tensor(), Tensor(), step, true, &c1), step, true, &c2);
    EXPECT_TRUE(test::all_close(got, test::to_f64(want), 0, 0)) << "positions from " << start;
  }
}

}  // namespace
}  // namespace zt::nn
