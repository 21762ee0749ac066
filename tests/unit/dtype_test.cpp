#include "fusebox/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fusebox/status.h"

using namespace fusebox;

namespace {
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST(DType, NamesRoundTripAndAliases) {
  for (DType t : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt32,
                  DType::kInt64}) {
    auto p = parse_dtype(dtype_name(t));
    ASSERT_TRUE(p.has_value()) << dtype_name(t);
    EXPECT_EQ(*p, t);
  }
  EXPECT_EQ(parse_dtype("half"), DType::kFP16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float"), DType::kFP32);
  EXPECT_EQ(parse_dtype("e4m3"), DType::kFP8E4M3);
  EXPECT_FALSE(parse_dtype("fp64").has_value());
  EXPECT_EQ(dtype_size_bytes(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size_bytes(DType::kFP8E5M2), 1u);
  EXPECT_EQ(dtype_size_bytes(DType::kInt64), 8u);
  EXPECT_FALSE(dtype_is_float(DType::kInt32));
  EXPECT_TRUE(dtype_is_float(DType::kFP8E4M3));
  EXPECT_NE(std::string(dtype_accepted_names()).find("fp8_e5m2"), std::string::npos);
}

TEST(DType, Bf16KnownBits) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  // ties to even: 1 + 2^-8 is halfway between 1 and 1+2^-7 -> 1 (even)
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F808000u)), 0x3F80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 -> rounds up to even 0x3F82
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F818000u)), 0x3F82);
  EXPECT_EQ(float_to_bf16_bits(from_bits(0x3F808001u)), 0x3F81);  // above half rounds up
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7F80);  // overflows to inf
  uint16_t nan = float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(nan)));
  // a NaN whose payload is only in the low bits must stay NaN (not become inf)
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(from_bits(0x7F800001u)))));
  EXPECT_EQ(bf16_bits_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0x0001), from_bits(0x00010000u));  // subnormal
}

TEST(DType, Fp16KnownBits) {
  EXPECT_EQ(float_to_fp16_bits(1.0f), 0x3C00);
  EXPECT_EQ(float_to_fp16_bits(-2.0f), 0xC000);
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16_bits(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7C00);  // ties to even -> inf
  EXPECT_EQ(float_to_fp16_bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(float_to_fp16_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -25)), 0x0000);         // tie -> even (0)
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(3.0f, -25)), 0x0002);         // tie 1.5 -> 2
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(float_to_fp16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even
  EXPECT_EQ(float_to_fp16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  EXPECT_TRUE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(std::nanf("")))));
  EXPECT_EQ(fp16_bits_to_float(0x3C00), 1.0f);
  EXPECT_EQ(fp16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(fp16_bits_to_float(0x7C00)));
  EXPECT_EQ(float_to_fp16_bits(-0.0f), 0x8000);
}

TEST(DType, Fp8E4M3) {
  const DType t = DType::kFP8E4M3;
  EXPECT_EQ(float_to_fp8_bits(1.0f, t), 0x38);
  EXPECT_EQ(float_to_fp8_bits(448.0f, t), 0x7E);
  EXPECT_EQ(float_to_fp8_bits(1000.0f, t), 0x7E);  // saturates
  EXPECT_EQ(float_to_fp8_bits(470.0f, t), 0x7E);   // would round to 480 (NaN pattern): saturates
  EXPECT_EQ(float_to_fp8_bits(-1e9f, t), 0xFE);
  EXPECT_EQ(float_to_fp8_bits(std::numeric_limits<float>::infinity(), t), 0x7E);
  uint8_t n = float_to_fp8_bits(std::nanf(""), t);
  EXPECT_TRUE(n == 0x7F || n == 0xFF);
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(0x7F, t)));
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(0xFF, t)));
  EXPECT_EQ(fp8_bits_to_float(0x7E, t), 448.0f);
  EXPECT_EQ(fp8_bits_to_float(0x01, t), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(float_to_fp8_bits(std::ldexp(1.0f, -9), t), 0x01);
  EXPECT_EQ(float_to_fp8_bits(1.0625f, t), 0x38);  // 1 + 2^-4: tie -> even (1.0)
  EXPECT_EQ(float_to_fp8_bits(1.1875f, t), 0x3A);  // 1 + 3*2^-4: tie -> 1.25
  EXPECT_EQ(fp8_bits_to_float(0x78, t), 256.0f);   // e=15 is a normal exponent in e4m3
}

TEST(DType, Fp8E5M2) {
  const DType t = DType::kFP8E5M2;
  EXPECT_EQ(float_to_fp8_bits(1.0f, t), 0x3C);
  EXPECT_EQ(float_to_fp8_bits(57344.0f, t), 0x7B);
  EXPECT_EQ(float_to_fp8_bits(1e6f, t), 0x7B);  // finite overflow saturates
  EXPECT_EQ(float_to_fp8_bits(-1e6f, t), 0xFB);
  EXPECT_EQ(float_to_fp8_bits(std::numeric_limits<float>::infinity(), t), 0x7C);
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(float_to_fp8_bits(std::nanf(""), t), t)));
  EXPECT_TRUE(std::isinf(fp8_bits_to_float(0x7C, t)));
  EXPECT_EQ(fp8_bits_to_float(0x7B, t), 57344.0f);
  EXPECT_EQ(fp8_bits_to_float(0x01, t), std::ldexp(1.0f, -16));
  EXPECT_EQ(float_to_fp8_bits(1.125f, t), 0x3C);  // tie -> even
  EXPECT_EQ(float_to_fp8_bits(1.375f, t), 0x3E);  // tie -> 1.5
}

TEST(DType, AllFp8PatternsRoundTrip) {
  for (DType t : {DType::kFP8E4M3, DType::kFP8E5M2}) {
    for (int b = 0; b < 256; ++b) {
      float f = fp8_bits_to_float(static_cast<uint8_t>(b), t);
      if (std::isnan(f)) continue;
      EXPECT_EQ(float_to_fp8_bits(f, t), b) << dtype_name(t) << " pattern " << b;
    }
  }
  for (int b = 0; b < 65536; ++b) {
    float f = fp16_bits_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_fp16_bits(f), b);
  }
}

// The spacing the fp8 casts round to: man_bits below the binade, the subnormals' below the
// smallest normal (e4m3 2^-6, e5m2 2^-14); the neighbours of every representable value differ by it.
TEST(DType, Fp8Spacing) {
  EXPECT_EQ(fp8_spacing(DType::kFP8E4M3, 136.0), 16.0);
  EXPECT_EQ(fp8_spacing(DType::kFP8E4M3, -100.0), 8.0);
  EXPECT_EQ(fp8_spacing(DType::kFP8E4M3, 0x1p-8), 0x1p-9);
  EXPECT_EQ(fp8_spacing(DType::kFP8E4M3, 0.0), 0x1p-9);
  EXPECT_EQ(fp8_spacing(DType::kFP8E5M2, 1.0), 0.25);
  EXPECT_EQ(fp8_spacing(DType::kFP8E5M2, 0x1p-15), 0x1p-16);
  for (DType t : {DType::kFP8E4M3, DType::kFP8E5M2})
    for (unsigned b = 0; b < 0x7E; ++b) {  // positive finite values below the largest
      const float v = fp8_bits_to_float(static_cast<unsigned char>(b), t);
      const float next = fp8_bits_to_float(static_cast<unsigned char>(b + 1), t);
      if (!std::isfinite(next)) continue;
      EXPECT_EQ(next - v, fp8_spacing(t, v)) << dtype_name(t) << " at " << v;
    }
}

TEST(DType, LoadStoreElement) {
  unsigned char buf[8];
  for (DType t : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3, DType::kFP8E5M2, DType::kInt32,
                  DType::kInt64}) {
    store_element(buf, t, -3.0);
    EXPECT_EQ(load_element(buf, t), -3.0) << dtype_name(t);
  }
  store_element(buf, DType::kInt32, 1e12);
  EXPECT_EQ(load_element(buf, DType::kInt32), 2147483647.0);
  store_element(buf, DType::kInt64, 123456789012.0);
  EXPECT_EQ(load_element(buf, DType::kInt64), 123456789012.0);
  store_element(buf, DType::kBF16, 1.0);
  uint16_t bits;
  std::memcpy(&bits, buf, 2);
  EXPECT_EQ(bits, 0x3F80);
  store_element(buf, DType::kFP8E4M3, 1e6);
  EXPECT_EQ(load_element(buf, DType::kFP8E4M3), 448.0);
  store_element(buf, DType::kFP16, 0.1);
  EXPECT_EQ(load_element(buf, DType::kFP16),
            static_cast<double>(fp16_bits_to_float(float_to_fp16_bits(0.1f))));
}

TEST(Status, ToStringAndContext) {
  Status ok;
  EXPECT_TRUE(ok.ok());
  Status s = InvalidArgument("[relu 'act'] bad");
  EXPECT_EQ(s.ToString(), "InvalidArgument: [relu 'act'] bad");
  EXPECT_EQ(s.WithContext("graph.json").message(), "graph.json: [relu 'act'] bad");
  EXPECT_EQ(s.WithContext("x").code(), StatusCode::kInvalidArgument);
  EXPECT_STREQ(status_code_name(StatusCode::kIoError), "IoError");
  Result<int> r = Status(IoError("nope"));
  EXPECT_FALSE(r.ok());
}

// store_element to bf16 rounds to the nearest bf16, ties to even, for every kind of float
// (normal, subnormal, near the overflow threshold, infinities) and for doubles between two
// floats (which must not be rounded to float first). Checked as a property: the stored value is
// no further from v than either neighbouring bf16, and on a tie its last mantissa bit is 0.
TEST(DType, Bf16StoreIsNearestEven) {
  auto bf16 = [](uint16_t b) { return static_cast<double>(from_bits(static_cast<uint32_t>(b) << 16)); };
  auto check = [&](double v) {
    uint16_t got;
    store_element(&got, DType::kBF16, v);
    const double g = bf16(got);
    if (std::isinf(g)) {  // only beyond the largest bf16 plus half its last step
      EXPECT_GE(std::fabs(v), 0x1.FFp127) << v;
      EXPECT_EQ(std::signbit(g), std::signbit(v)) << v;
      return;
    }
    for (int step : {-1, 1}) {
      const uint16_t nb = static_cast<uint16_t>(got + step);
      const double n = bf16(nb);
      if (std::isnan(n) || (got & 0x7FFF) == 0 && step == -1) continue;  // no neighbour that way
      const double dg = std::fabs(g - v), dn = std::fabs(n - v);
      EXPECT_LE(dg, dn) << "v " << v << " stored as 0x" << std::hex << got;
      if (dg == dn) EXPECT_EQ(got & 1, 0) << "tie not to even: v " << v << " 0x" << std::hex << got;
    }
  };
  uint64_t s = 12345;
  auto next = [&] {
    return s = s * 6364136223846793005ULL + 1442695040888963407ULL, static_cast<uint32_t>(s >> 32);
  };
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(next());
    if (!std::isnan(f)) check(f);
  }
  for (uint32_t u :
       {0x00000001u, 0x00008000u, 0x00018000u, 0x007FFFFFu, 0x3F808000u, 0x3F818000u, 0x7F7F7FFFu,
        0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u, 0x80008000u, 0xFF7FFFFFu, 0xFF800000u}) {
    check(from_bits(u));
  }
  // Doubles just beyond a tie between two bf16 (not floats): rounding to float first would make
  // them ties and round them to even.
  check(1.0 + 0x1p-8 + 0x1p-40);
  check(1.0 + 3 * 0x1p-8 - 0x1p-40);
  uint16_t b;
  store_element(&b, DType::kBF16, 1.0 + 0x1p-8 + 0x1p-40);
  EXPECT_EQ(b, 0x3F81);
}

// Every narrow float format rounds a double to nearest, ties to even, on the fast path read off
// the double's bits (normal results) and on the general one (zeros, subnormals, overflow) alike:
// every midpoint between two neighbouring values of the format (exactly a tie), the doubles just
// beside it, and random doubles from below the subnormals to beyond the largest value.
TEST(DType, EveryNarrowFormatStoresToNearestEven) {
  struct Format {
    DType t;
    int bits;
    bool saturates;  // beyond the largest value: the largest (fp8), else infinity
  };
  uint64_t s = 99;
  auto next = [&] { return s = s * 6364136223846793005ULL + 1442695040888963407ULL, s >> 11; };
  for (const Format f : {Format{DType::kBF16, 16, false}, Format{DType::kFP16, 16, false},
                         Format{DType::kFP8E4M3, 8, true}, Format{DType::kFP8E5M2, 8, true}}) {
    SCOPED_TRACE(std::string(dtype_name(f.t)));
    auto load = [&](uint32_t b) {
      uint16_t raw = static_cast<uint16_t>(b);
      return load_element(&raw, f.t);
    };
    auto store = [&](double v) {
      uint16_t raw = 0;
      store_element(&raw, f.t, v);
      return static_cast<uint32_t>(raw);
    };
    // The positive finite patterns in increasing order of value: 0 .. the largest.
    std::vector<uint32_t> ladder;
    for (uint32_t b = 0; b < (1u << (f.bits - 1)); ++b)
      if (std::isfinite(load(b))) ladder.push_back(b);
    const double largest = load(ladder.back());
    for (size_t i = 0; i + 1 < ladder.size(); ++i) {
      const double lo = load(ladder[i]), hi = load(ladder[i + 1]);
      const double mid = lo + (hi - lo) / 2;  // exact: a double holds it
      const uint32_t even = (ladder[i] & 1) == 0 ? ladder[i] : ladder[i + 1];
      ASSERT_EQ(store(mid), even) << "tie " << mid << " between " << lo << " and " << hi;
      ASSERT_EQ(store(-mid), even | (1u << (f.bits - 1))) << "tie " << -mid;
      ASSERT_EQ(store(std::nextafter(mid, 0.0)), ladder[i]) << mid;
      ASSERT_EQ(store(std::nextafter(mid, 1e300)), ladder[i + 1]) << mid;
      ASSERT_EQ(store(lo), ladder[i]) << lo;
    }
    for (int i = 0; i < 200000; ++i) {
      const double mag =
          std::ldexp(1.0 + static_cast<double>(next()) * 0x1p-53, static_cast<int>(next() % 200) - 150);
      const double v = (next() & 1) ? -mag : mag;
      if (std::fabs(v) > largest) {
        const double g = load(store(v));
        if (f.saturates) {
          ASSERT_EQ(std::fabs(g), largest) << v;
        } else if (!std::isinf(g)) {  // within half a step above the largest: rounds down to it
          ASSERT_EQ(std::fabs(g), largest) << v;
        }
        continue;
      }
      const uint32_t got = store(v);
      const uint32_t mag_bits = got & ((1u << (f.bits - 1)) - 1);
      const auto at = std::find(ladder.begin(), ladder.end(), mag_bits);
      ASSERT_NE(at, ladder.end()) << v;
      const double g = std::fabs(load(got)), a = std::fabs(v);
      if (at != ladder.begin()) ASSERT_LE(std::fabs(g - a), std::fabs(load(*(at - 1)) - a)) << v;
      if (at + 1 != ladder.end()) ASSERT_LE(std::fabs(g - a), std::fabs(load(*(at + 1)) - a)) << v;
      if (mag_bits != 0) ASSERT_EQ(std::signbit(load(got)), std::signbit(v)) << v;
    }
  }
}

// Every 16- and 8-bit pattern decodes to the value its fields say (the table and the bf16 shift
// against the formula), NaN patterns to NaN.
TEST(DType, EveryNarrowPatternLoadsToItsValue) {
  struct Format {
    DType t;
    int exp_bits, man_bits, bias;
    bool ieee;  // all-ones exponent is inf / NaN (else e4m3: only S.1111.111 is NaN)
  };
  for (const Format f : {Format{DType::kBF16, 8, 7, 127, true}, Format{DType::kFP16, 5, 10, 15, true},
                         Format{DType::kFP8E4M3, 4, 3, 7, false}, Format{DType::kFP8E5M2, 5, 2, 15, true}}) {
    const int bits = 1 + f.exp_bits + f.man_bits;
    for (uint32_t b = 0; b < (1u << bits); ++b) {
      const uint32_t e = (b >> f.man_bits) & ((1u << f.exp_bits) - 1), m = b & ((1u << f.man_bits) - 1);
      const bool neg = (b >> (bits - 1)) & 1;
      const uint32_t e_all = (1u << f.exp_bits) - 1;
      uint16_t raw = static_cast<uint16_t>(b);
      const double got = load_element(&raw, f.t);
      if ((f.ieee && e == e_all && m != 0) || (!f.ieee && e == e_all && m == (1u << f.man_bits) - 1)) {
        ASSERT_TRUE(std::isnan(got)) << dtype_name(f.t) << " 0x" << std::hex << b;
        continue;
      }
      double want;
      if (f.ieee && e == e_all) {
        want = std::numeric_limits<double>::infinity();
      } else if (e == 0) {
        want = std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
      } else {
        want = std::ldexp(static_cast<double>(m + (1u << f.man_bits)),
                          static_cast<int>(e) - f.bias - f.man_bits);
      }
      ASSERT_EQ(got, neg ? -want : want) << dtype_name(f.t) << " 0x" << std::hex << b;
    }
  }
}
