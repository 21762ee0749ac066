// Block masks for sdpa_fwd (SdpaOptions::block_mask): the uint8 dtype, the
// resolve() rules and their messages, and the CPU reference, which must equal
// the same attention with the masked tiles' scores pushed to -inf by a bias.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::expect_error;
using testing_util::host_from;
using testing_util::resolve_json;

// q [2, 4, 256, 64], k and v [2, 2, 384, 64] (GQA): 2 query tiles, 3 key tiles.
// `mask` replaces the block mask tensor's fields, `op` the op type.
std::string block_json(const std::string& mask = R"("dims": [2, 4, 2, 1], "dtype": "uint8")",
                       const std::string& op = "sdpa_fwd") {
  return R"({"name": "blocks", "io_dtype": "bf16", "tensors": [
    {"name": "q", "dims": [2, 4, 256, 64]}, {"name": "k", "dims": [2, 2, 384, 64]},
    {"name": "v", "dims": [2, 2, 384, 64]}, {"name": "bm", )" +
         mask + R"(}, {"name": "o"}, {"name": "stats", "dtype": "fp32"}],
  "ops": [{"op": ")" +
         op +
         R"(", "name": "attn", "inputs": {"q": "q", "k": "k", "v": "v", "block_mask": "bm"}, "outputs": {"o": "o", "stats": "stats"}}]})";
}

TEST(SdpaBlockMask, Uint8IsADtype) {
  EXPECT_EQ(parse_dtype("uint8"), DType::kUInt8);
  EXPECT_EQ(dtype_name(DType::kUInt8), "uint8");
  EXPECT_EQ(dtype_size_bytes(DType::kUInt8), 1u);
  EXPECT_FALSE(dtype_is_float(DType::kUInt8));
  unsigned char b = 0;
  store_element(&b, DType::kUInt8, 300.0);  // saturates
  EXPECT_EQ(b, 255);
  store_element(&b, DType::kUInt8, 5.4);
  EXPECT_EQ(load_element(&b, DType::kUInt8), 5.0);
}

TEST(SdpaBlockMask, DimsFromTheTileCounts) {
  EXPECT_EQ(sdpa_block_mask_dims(2, 4, 256, 384), (std::vector<int64_t>{2, 4, 2, 1}));
  EXPECT_EQ(sdpa_block_mask_dims(1, 1, 129, 1024), (std::vector<int64_t>{1, 1, 2, 1}));
  EXPECT_EQ(sdpa_block_mask_dims(1, 1, 1, 1025), (std::vector<int64_t>{1, 1, 1, 2}));  // 9 key tiles
  EXPECT_TRUE(sdpa_block_keeps(0b100, 256));                                           // key tile 2: bit 2
  EXPECT_FALSE(sdpa_block_keeps(0b100, 255));                                          // key tile 1
  EXPECT_TRUE(sdpa_block_keeps(0b1, 8 * 128));  // tile 8: bit 0 of the next byte
}

TEST(SdpaBlockMask, ResolvesAndDescribes) {
  auto r = resolve_json(block_json());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& a = std::get<SdpaFwdAttrs>(r->ops[0].attrs);
  EXPECT_TRUE(a.block_mask);
  const ResolvedTensor& bm = r->tensors[r->find_tensor("bm")];
  EXPECT_EQ(bm.random_lo, 1);  // random masks keep a tile in every byte
  EXPECT_EQ(bm.random_hi, 255);
}

// FLOPs count the kept tiles when the bytes are known (all kept: the dense
// count; unknown random bytes: the dense count too).
TEST(SdpaBlockMask, FlopsCountTheKeptTiles) {
  auto all = resolve_json(block_json(
      R"("dims": [2, 4, 2, 1], "dtype": "uint8", "values": [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7])"));
  auto some = resolve_json(block_json(
      R"("dims": [2, 4, 2, 1], "dtype": "uint8", "values": [1, 3, 5, 6, 4, 7, 2, 5, 7, 1, 6, 3, 3, 4, 5, 0])"));
  auto random = resolve_json(block_json());
  ASSERT_TRUE(all.ok() && some.ok() && random.ok());
  const double dense = 2.0 * 2 * 4 * 256 * 384 * (64 + 64);
  EXPECT_DOUBLE_EQ(all->flops(), dense);
  EXPECT_DOUBLE_EQ(random->flops(), dense);  // unknown bytes: every tile
  int kept_tiles = 0;
  for (int byte : {1, 3, 5, 6, 4, 7, 2, 5, 7, 1, 6, 3, 3, 4, 5, 0}) kept_tiles += __builtin_popcount(byte);
  EXPECT_DOUBLE_EQ(some->flops(), dense * kept_tiles / 48.0);  // 48 tiles of 128 x 128 in all
}

TEST(SdpaBlockMask, BadMasksNameTheTensorAndWhatIsAccepted) {
  expect_error(
      block_json(R"("dims": [2, 4, 2, 2], "dtype": "uint8")"),
      {"[sdpa_fwd 'attn']", "block_mask", "'bm'", "[2, 4, 2, 2]", "[2, 4, 2, 1]", "128 x 128", "Skv 384"});
  expect_error(block_json(R"("dims": [2, 4, 2, 1], "dtype": "int32")"), {"'bm'", "int32", "uint8"});
  expect_error(
      block_json(
          R"("dims": [2, 4, 2, 1], "dtype": "uint8", "values": [1, 2, 3, 4, 5, 6, 7, 256, 1, 1, 1, 1, 1, 1, 1, 1])"),
      {"'bm'", "256", "[0, 255]"});
  // Refused when parsed (exit 2 at check), before the roles sdpa_bwd needs are counted.
  auto bwd = parse_graph_json(block_json(R"("dims": [2, 4, 2, 1], "dtype": "uint8")", "sdpa_bwd"));
  ASSERT_FALSE(bwd.ok());
  for (const char* n : {"ops[0]", "inputs.block_mask", "only sdpa_fwd takes a block mask"})
    EXPECT_NE(bwd.status().message().find(n), std::string::npos) << n << ": " << bwd.status().message();
}

// The reference with a block mask equals the reference without one and with
// a bias of -inf on the masked tiles' scores (0 elsewhere): two code paths of
// the reference, the mask's bit order written out here independently.
TEST(SdpaBlockMaskReferenceCpu, EqualsAMinusInfinityBias) {
  auto masked = resolve_json(block_json());
  auto biased = resolve_json(R"({"name": "bias", "io_dtype": "bf16", "tensors": [
    {"name": "q", "dims": [2, 4, 256, 64]}, {"name": "k", "dims": [2, 2, 384, 64]},
    {"name": "v", "dims": [2, 2, 384, 64]}, {"name": "bias", "dims": [2, 4, 256, 384], "dtype": "fp32"},
    {"name": "o"}, {"name": "stats", "dtype": "fp32"}],
  "ops": [{"op": "sdpa_fwd", "name": "attn", "inputs": {"q": "q", "k": "k", "v": "v", "bias": "bias"},
           "outputs": {"o": "o", "stats": "stats"}}]})");
  ASSERT_TRUE(masked.ok()) << masked.status().ToString();
  ASSERT_TRUE(biased.ok()) << biased.status().ToString();
  // Per (b, h): query tile 0 and 1 bytes; tile 1 of head 3 of batch 1 keeps nothing.
  const std::vector<double> bytes = {1, 3, 5, 6, 4, 7, 2, 5, 7, 1, 6, 3, 3, 4, 5, 0};
  std::map<std::string, HostTensor> in;
  for (const char* name : {"q", "k", "v"}) {
    const ResolvedTensor& t = masked->tensors[masked->find_tensor(name)];
    in[name] = random_tensor(t, 11, t.random_lo, t.random_hi);
  }
  std::map<std::string, HostTensor> bin = in;
  in["bm"] = host_from(masked->tensors[masked->find_tensor("bm")], bytes);
  std::vector<double> bias;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t i = 0; i < 256; ++i)
        for (int64_t j = 0; j < 384; ++j) {
          const int byte = static_cast<int>(bytes[(b * 4 + h) * 2 + i / 128]);
          bias.push_back((byte >> (j / 128)) & 1 ? 0.0 : -INFINITY);
        }
  bin["bias"] = host_from(biased->tensors[biased->find_tensor("bias")], bias);
  auto got = reference_cpu(*masked, in);
  auto want = reference_cpu(*biased, bin);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_EQ(got->at("o"), want->at("o"));
  EXPECT_EQ(got->at("stats"), want->at("stats"));
  // The empty row tile: o = 0 and stats = -inf, as for any row that keeps no key.
  const std::vector<float>& o = got->at("o");
  const std::vector<float>& st = got->at("stats");
  const int64_t row = (1 * 4 + 3) * 256 + 200;  // batch 1, head 3, query 200 (tile 1)
  EXPECT_EQ(o[row * 64], 0.0f);
  EXPECT_TRUE(std::isinf(st[row]) && st[row] < 0);
  // And the mask matters: all ones gives another answer.
  in["bm"] = host_from(masked->tensors[masked->find_tensor("bm")], std::vector<double>(16, 7));
  auto full = reference_cpu(*masked, in);
  ASSERT_TRUE(full.ok());
  EXPECT_NE(full->at("o"), got->at("o"));
}

}  // namespace
}  // namespace fusebox
