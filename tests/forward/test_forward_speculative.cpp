// Speculative decoding at the forward level (docs/speculative.md): Forward::checkpoint /
// Forward::rollback on the CPU backend restore the main layers' state (window rings, CSA/HCA
// compressor rings, compressed entries, indexer keys) and the MTP layer's window ring bit for bit:
// a state that ran a verify chunk with rejected tokens and was rolled back equals a state that
// never saw them, and both continue with identical logits. Prefix lengths cross the ring wrap
// (16), the first CSA entries (4) and the first HCA entry (128).
#include <gtest/gtest.h>

#include <cstring>

#include "forward_test_util.h"
#include "model/deepseek_v4/state_access.h"

namespace ds::dsv4::test {
namespace {

// Any two float vectors (the logits are HostVectors, the states std::vectors).
template <typename A, typename B>
bool same_floats(const A& a, const B& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Every per-layer structure of the main (or MTP) layers, bitwise.
void expect_same_state(SequenceState* a, SequenceState* b, bool mtp, const std::string& what) {
  ASSERT_EQ(StateAccess::position(a, mtp), StateAccess::position(b, mtp)) << what;
  for (size_t l = 0; l < StateAccess::num_layers(a, mtp); ++l) {
    const LayerState& x = StateAccess::layer(a, mtp, int64_t(l));
    const LayerState& y = StateAccess::layer(b, mtp, int64_t(l));
    const std::string at = what + " layer " + std::to_string(l);
    EXPECT_TRUE(same_floats(x.window, y.window)) << at << ": window ring";
    EXPECT_EQ(x.num_compressed, y.num_compressed) << at;
    EXPECT_EQ(x.num_index_keys, y.num_index_keys) << at;
    EXPECT_TRUE(same_floats(x.compressed, y.compressed)) << at << ": compressed entries";
    EXPECT_TRUE(same_floats(x.index_keys, y.index_keys)) << at << ": indexer keys";
    EXPECT_TRUE(same_floats(x.compressor.kv, y.compressor.kv)) << at << ": compressor kv";
    EXPECT_TRUE(same_floats(x.compressor.score, y.compressor.score)) << at << ": compressor score";
    EXPECT_TRUE(same_floats(x.indexer_compressor.kv, y.indexer_compressor.kv)) << at;
    EXPECT_TRUE(same_floats(x.indexer_compressor.score, y.indexer_compressor.score)) << at;
  }
}

Status feed(const Forward& f, SequenceState* s, std::span<const int32_t> tokens,
            std::vector<ChunkOutput>* out, bool all_rows = false) {
  SequenceChunk c;
  c.state = s;
  c.tokens = tokens;
  if (all_rows) {
    for (int64_t r = 0; r < int64_t(tokens.size()); ++r) c.logit_rows.push_back(r);
  } else {
    c.logit_rows = {int64_t(tokens.size()) - 1};
  }
  return f.run(std::span<SequenceChunk>(&c, 1), out);
}

TEST(ForwardSpeculative, RollbackRestoresTheMainStateBitExactly) {
  const Forward f(&tiny_model(), ForwardOptions{});
  constexpr int64_t k = 4;  // verify chunk of 1 + 4 tokens
  const auto tokens = random_tokens(160, 21);
  for (int64_t n : {2, 13, 125}) {
    SequenceState base = f.new_sequence();
    std::vector<ChunkOutput> out;
    ASSERT_TRUE(feed(f, &base, std::span<const int32_t>(tokens.data(), size_t(n)), &out).ok());
    for (int64_t j = 0; j <= k + 1; ++j) {
      const std::string what = "n=" + std::to_string(n) + " accepted rows=" + std::to_string(j);
      // A: verify [tokens n.., junk] and keep j rows.
      SequenceState a = base;
      ASSERT_TRUE(f.checkpoint(&a, false, k + 1).ok());
      std::vector<int32_t> verify(tokens.begin() + n, tokens.begin() + n + k + 1);
      for (int64_t i = j; i <= k; ++i) {
        verify[size_t(i)] = int32_t(2 + (verify[size_t(i)] + 7) % 1000);  // rejected rows
      }
      ASSERT_TRUE(feed(f, &a, verify, &out, true).ok());
      ASSERT_TRUE(f.rollback(&a, false, n + j).ok());
      // B: only the kept rows.
      SequenceState b = base;
      if (j > 0) {
        ASSERT_TRUE(feed(f, &b, std::span<const int32_t>(tokens.data() + n, size_t(j)), &out).ok());
      }
      expect_same_state(&a, &b, false, what);
      // Both continue identically (logits of 6 more tokens, bitwise).
      std::vector<ChunkOutput> oa, ob;
      const std::span<const int32_t> more(tokens.data() + n + j, 6);
      ASSERT_TRUE(feed(f, &a, more, &oa, true).ok());
      ASSERT_TRUE(feed(f, &b, more, &ob, true).ok());
      EXPECT_TRUE(same_floats(oa[0].logits, ob[0].logits)) << what;
    }
  }
}

TEST(ForwardSpeculative, RollbackRestoresTheMtpWindowBitExactly) {
  const Forward f(&tiny_model(), ForwardOptions{});
  const int64_t n = 30, width = f.config().hc_mult * f.config().hidden_size;
  const auto tokens = random_tokens(n + 8, 22);
  SequenceState s = f.new_sequence();
  SequenceChunk c;
  c.state = &s;
  c.tokens = std::span<const int32_t>(tokens.data(), size_t(n + 6));
  for (int64_t r = 0; r < n + 6; ++r) c.stream_rows.push_back(r);
  std::vector<ChunkOutput> out;
  ASSERT_TRUE(f.run(std::span<SequenceChunk>(&c, 1), &out).ok());
  const std::vector<float>& streams = out[0].row_streams;
  ASSERT_EQ(int64_t(streams.size()), (n + 6) * width);
  auto mtp = [&](SequenceState* st, int64_t pos, int64_t m, const int32_t* next) {
    MtpChunk mc;
    mc.state = st;
    mc.streams = std::span<const float>(streams.data() + pos * width, size_t(m * width));
    mc.next_tokens = std::span<const int32_t>(next, size_t(m));
    mc.logit_rows = {m - 1};
    std::vector<ChunkOutput> o;
    EXPECT_TRUE(f.run_mtp(std::span<MtpChunk>(&mc, 1), &o).ok());
    return o[0].logits;
  };
  SequenceState base = f.new_sequence();
  mtp(&base, 0, n, tokens.data() + 1);
  for (int64_t j = 0; j <= 3; ++j) {
    SequenceState a = base, b = base;
    ASSERT_TRUE(f.checkpoint(&a, true, 3).ok());
    std::vector<int32_t> junk = {5, 6, 7};
    for (int64_t i = 0; i < j; ++i) junk[size_t(i)] = tokens[size_t(n + 1 + i)];
    for (int64_t i = 0; i < 3; ++i) mtp(&a, n + i, 1, &junk[size_t(i)]);
    ASSERT_TRUE(f.rollback(&a, true, n + j).ok());
    if (j > 0) mtp(&b, n, j, tokens.data() + n + 1);
    expect_same_state(&a, &b, true, "mtp j=" + std::to_string(j));
    EXPECT_TRUE(same_floats(mtp(&a, n + j, 2, tokens.data() + n + j + 1),
                            mtp(&b, n + j, 2, tokens.data() + n + j + 1)));
  }
}

TEST(ForwardSpeculative, CheckpointBoundsAreEnforced) {
  const Forward f(&tiny_model(), ForwardOptions{});
  const auto tokens = random_tokens(20, 23);
  SequenceState s = f.new_sequence();
  std::vector<ChunkOutput> out;
  EXPECT_FALSE(f.rollback(&s, false, 0).ok());  // no checkpoint
  EXPECT_FALSE(f.checkpoint(&s, false, 0).ok());
  EXPECT_FALSE(f.checkpoint(&s, false, f.config().sliding_window + 1).ok());
  ASSERT_TRUE(feed(f, &s, std::span<const int32_t>(tokens.data(), 5), &out).ok());
  ASSERT_TRUE(f.checkpoint(&s, false, 2).ok());
  // Three tokens would advance past what the checkpoint can undo: refused, state untouched.
  EXPECT_FALSE(feed(f, &s, std::span<const int32_t>(tokens.data() + 5, 3), &out).ok());
  EXPECT_EQ(s.position(), 5);
  ASSERT_TRUE(feed(f, &s, std::span<const int32_t>(tokens.data() + 5, 2), &out).ok());
  EXPECT_FALSE(f.rollback(&s, false, 4).ok());  // before the checkpoint
  EXPECT_FALSE(f.rollback(&s, false, 8).ok());  // past the position
  EXPECT_TRUE(f.rollback(&s, false, 6).ok());
  EXPECT_EQ(s.position(), 6);
  EXPECT_FALSE(f.rollback(&s, false, 6).ok());  // consumed
}

}  // namespace
}  // namespace ds::dsv4::test
