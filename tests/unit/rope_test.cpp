// The rope op (include/fusebox/ops/rope.h): resolve()'s rules and their
// messages, and the CPU reference: against RoPE written out here with complex
// numbers (both layouts, a pass-through prefix, offsets, a scale), rope_bwd as
// the exact transpose of rope (<rope(x), dy> = <x, rope_bwd(dy)> on random
// values), and NaN for a position outside freqs.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <map>
#include <random>
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

struct RopeCase {
  std::string op = "rope", io = "fp32", layout = "half";
  int64_t b = 2, h = 3, s = 5, d = 8, rope_dim = 0, p = 7;
  double scale = 1.0;
  bool offset = false;
  std::string x_fields, freqs_fields, offset_fields;  // replace the defaults when given
};

std::string rope_json(const RopeCase& c) {
  const int64_t r = c.rope_dim ? c.rope_dim : c.d;
  const std::string in = c.op == "rope" ? "x" : "dy", out = c.op == "rope" ? "y" : "dx";
  auto dims = [](std::initializer_list<int64_t> v) {
    std::string s = "[";
    for (int64_t x : v) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
    return s + "]";
  };
  const std::string x = c.x_fields.empty() ? "\"dims\": " + dims({c.b, c.h, c.s, c.d}) : c.x_fields;
  const std::string f = c.freqs_fields.empty()
                            ? "\"dims\": " + dims({1, 1, c.p, r / 2}) + ", \"dtype\": \"fp32\""
                            : c.freqs_fields;
  const std::string o = c.offset_fields.empty()
                            ? "\"dims\": " + dims({c.b, 1, 1, 1}) + ", \"dtype\": \"int32\""
                            : c.offset_fields;
  std::string attrs = "\"layout\": \"" + c.layout + "\", \"scale\": " + std::to_string(c.scale);
  if (c.rope_dim) attrs += ", \"rope_dim\": " + std::to_string(c.rope_dim);
  return R"({"name": "g", "io_dtype": ")" + c.io + R"(", "tensors": [
    {"name": ")" +
         in + "\", " + x + R"(}, {"name": "freqs", )" + f + "}" +
         (c.offset ? R"(, {"name": "offset", )" + o + "}" : "") + R"(, {"name": ")" + out + R"("}],
  "ops": [{"op": ")" +
         c.op + R"(", "name": "rot", )" + attrs + R"(, "inputs": {")" + in + "\": \"" + in +
         R"(", "freqs": "freqs")" + (c.offset ? R"(, "offset": "offset")" : "") + R"(}, "outputs": {")" +
         out + "\": \"" + out + "\"}}]}";
}

TEST(Rope, ResolvesShapesDefaultsAndRandomRanges) {
  RopeCase c;
  c.offset = true;
  c.io = "bf16";
  auto g = resolve_json(rope_json(c));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ResolvedTensor& y = g->tensors[g->find_tensor("y")];
  EXPECT_EQ(y.dims, (std::vector<int64_t>{2, 3, 5, 8}));
  EXPECT_EQ(y.dtype, DType::kBF16);
  EXPECT_FALSE(y.is_virtual);
  const ResolvedTensor& off = g->tensors[g->find_tensor("offset")];
  EXPECT_EQ(off.random_lo, 0);
  EXPECT_EQ(off.random_hi, 2);  // P - S: random offsets keep every token inside freqs
  EXPECT_DOUBLE_EQ(g->flops(), 2.0 * 3 * 5 * 3 * 8);
  c.op = "rope_bwd";
  c.rope_dim = 4;
  auto b = resolve_json(rope_json(c));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->tensors[b->find_tensor("dx")].dims, (std::vector<int64_t>{2, 3, 5, 8}));
  EXPECT_DOUBLE_EQ(b->flops(), 2.0 * 3 * 5 * (3 * 4 + 4));
}

TEST(Rope, RefusesWithTheRuleThatFailed) {
  RopeCase c;
  c.x_fields = R"("dims": [2, 5, 8])";
  expect_error(rope_json(c), {"[rope 'rot'] input 'x' ('x')", "[B, H, S, D]"});
  c = {};
  c.rope_dim = 3;
  c.freqs_fields = R"("dims": [1, 1, 7, 1], "dtype": "fp32")";
  expect_error(rope_json(c), {"[rope 'rot'] rotates 3 values", "even rope_dim"});
  c = {};
  c.rope_dim = 10;
  expect_error(rope_json(c), {"rope_dim is 10", "up to the head dim 8"});
  c = {};
  c.freqs_fields = R"("dims": [1, 1, 7, 8], "dtype": "fp32")";
  expect_error(rope_json(c), {"input 'freqs' ('freqs') has dims [1, 1, 7, 8]", "[1, 1, P, 4]"});
  c = {};
  c.freqs_fields = R"("dims": [1, 1, 7, 4], "dtype": "bf16")";
  expect_error(rope_json(c), {"input 'freqs'", "fp32"});
  c = {};
  c.p = 4;
  expect_error(rope_json(c), {"has 4 positions for a sequence of 5", "P >= S"});
  c = {};
  c.layout = "neox";
  expect_error(rope_json(c), {"layout", "is 'neox'", "\"half\"", "\"interleaved\""});
  c = {};
  c.offset = true;
  c.offset_fields = R"("dims": [2, 1, 1, 1])";
  expect_error(rope_json(c), {"input 'offset' ('offset')", "int32"});
  c.offset_fields = R"("dims": [3, 1, 1, 1], "dtype": "int32")";
  expect_error(rope_json(c), {"input 'offset' ('offset') has dims [3, 1, 1, 1]", "[2, 1, 1, 1]"});
  c.offset_fields = R"("dims": [2, 1, 1, 1], "dtype": "int32", "values": [0, 3])";
  expect_error(rope_json(c), {"values[1] = 3", "integer in [0, 2]"});
}

// RoPE written out independently of the reference: each rotated pair as a
// complex number times e^{i theta}; the leading values pass through.
std::vector<double> rope_by_hand(const RopeCase& c, const std::vector<double>& x,
                                 const std::vector<double>& f, const std::vector<double>& off) {
  const int64_t r = c.rope_dim ? c.rope_dim : c.d, lead = c.d - r, half = r / 2;
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t s = 0; s < c.s; ++s) {
        const int64_t row = ((b * c.h + h) * c.s + s) * c.d;
        const int64_t pos = s + (c.offset ? static_cast<int64_t>(off[b]) : 0);
        for (int64_t j = 0; j < lead; ++j) y[row + j] = c.scale * x[row + j];
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = row + lead + (c.layout == "half" ? i : 2 * i);
          const int64_t e = row + lead + (c.layout == "half" ? i + half : 2 * i + 1);
          const std::complex<double> z =
              std::complex<double>(x[a], x[e]) * std::polar(c.scale, f[pos * half + i]);
          y[a] = z.real();
          y[e] = z.imag();
        }
      }
  return y;
}

struct Filled {
  std::vector<double> x, f, off;
};
Filled random_inputs(const RopeCase& c, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1), angle(-20, 20);
  const int64_t r = c.rope_dim ? c.rope_dim : c.d;
  Filled in;
  in.x.resize(static_cast<size_t>(c.b * c.h * c.s * c.d));
  for (double& v : in.x) v = static_cast<float>(u(rng));
  in.f.resize(static_cast<size_t>(c.p * r / 2));
  for (double& v : in.f) v = static_cast<float>(angle(rng));
  for (int64_t b = 0; b < c.b; ++b) in.off.push_back(static_cast<double>(rng() % (c.p - c.s + 1)));
  return in;
}

Result<std::vector<float>> run(const RopeCase& c, const std::vector<double>& x, const Filled& in) {
  auto g = resolve_json(rope_json(c));
  if (!g.ok()) return g.status();
  const std::string xin = c.op == "rope" ? "x" : "dy";
  std::map<std::string, HostTensor> inputs{{xin, host_from(g->tensors[g->find_tensor(xin)], x)},
                                           {"freqs", host_from(g->tensors[g->find_tensor("freqs")], in.f)}};
  if (c.offset) inputs["offset"] = host_from(g->tensors[g->find_tensor("offset")], in.off);
  auto ref = reference_cpu(*g, inputs);
  if (!ref.ok()) return ref.status();
  return ref->at(c.op == "rope" ? "y" : "dx");
}

std::vector<RopeCase> cases() {
  std::vector<RopeCase> out;
  for (const char* layout : {"half", "interleaved"}) {
    for (int64_t rope_dim : {0, 4}) {
      for (bool offset : {false, true}) {
        RopeCase c;
        c.layout = layout;
        c.rope_dim = rope_dim;
        c.offset = offset;
        c.scale = offset ? 0.75 : 1.0;
        out.push_back(c);
      }
    }
  }
  return out;
}

TEST(Rope, CpuReferenceMatchesRopeWrittenWithComplexNumbers) {
  unsigned seed = 1;
  for (const RopeCase& c : cases()) {
    SCOPED_TRACE(c.layout + " rope_dim " + std::to_string(c.rope_dim) + (c.offset ? " offset" : ""));
    const Filled in = random_inputs(c, seed++);
    auto y = run(c, in.x, in);
    ASSERT_TRUE(y.ok()) << y.status().ToString();
    const std::vector<double> want = rope_by_hand(c, in.x, in.f, in.off);
    ASSERT_EQ(y->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR((*y)[i], want[i], 2e-6) << "at " << i;
  }
}

TEST(Rope, BackwardIsTheTransposeOfTheForward) {
  unsigned seed = 100;
  for (RopeCase c : cases()) {
    SCOPED_TRACE(c.layout + " rope_dim " + std::to_string(c.rope_dim) + (c.offset ? " offset" : ""));
    const Filled in = random_inputs(c, seed++);
    const Filled dy = random_inputs(c, seed++);  // its x is the gradient
    auto y = run(c, in.x, in);
    c.op = "rope_bwd";
    auto dx = run(c, dy.x, in);
    ASSERT_TRUE(y.ok() && dx.ok());
    double lhs = 0, rhs = 0, norm = 0;
    for (size_t i = 0; i < in.x.size(); ++i) {
      lhs += (*y)[i] * dy.x[i];
      rhs += in.x[i] * (*dx)[i];
      norm += std::fabs((*y)[i] * dy.x[i]);
    }
    EXPECT_NEAR(lhs, rhs, 1e-6 * norm) << "<rope(x), dy> against <x, rope_bwd(dy)>";
    // and rope_bwd undoes rope when scale is 1 (a rotation's transpose is its inverse)
    if (c.scale == 1.0) {
      auto back = run(c, std::vector<double>(y->begin(), y->end()), in);
      ASSERT_TRUE(back.ok());
      for (size_t i = 0; i < in.x.size(); ++i) ASSERT_NEAR((*back)[i], in.x[i], 1e-5) << "at " << i;
    }
  }
}

TEST(Rope, PositionOutsideFreqsIsNan) {
  RopeCase c;
  c.offset = true;
  const Filled in = random_inputs(c, 7);
  Filled bad = in;
  bad.off = {2, 3};  // batch 1: positions 3..7, and freqs has 7 (0..6)
  auto y = run(c, in.x, bad);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  const int64_t row = c.h * c.s * c.d;  // batch 1 starts here
  EXPECT_FALSE(std::isnan((*y)[0]));
  EXPECT_FALSE(std::isnan((*y)[static_cast<size_t>(row + 3 * c.d)]));     // position 6
  EXPECT_TRUE(std::isnan((*y)[static_cast<size_t>(row + 4 * c.d)]));      // position 7
  EXPECT_TRUE(std::isnan((*y)[static_cast<size_t>(row + 4 * c.d + 7)]));  // its last value
}

}  // namespace
}  // namespace fusebox
