// fusebox: element types and conversions between float and stored bit patterns.
#include "fusebox/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace fusebox {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kBF16:
      return "bf16";
    case DType::kFP16:
      return "fp16";
    case DType::kFP32:
      return "fp32";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
    case DType::kFP8E5M2:
      return "fp8_e5m2";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "fp16" || s == "half" || s == "float16") return DType::kFP16;
  if (s == "fp32" || s == "float" || s == "float32") return DType::kFP32;
  if (s == "fp8_e4m3" || s == "e4m3") return DType::kFP8E4M3;
  if (s == "fp8_e5m2" || s == "e5m2") return DType::kFP8E5M2;
  if (s == "int32") return DType::kInt32;
  if (s == "int64") return DType::kInt64;
  if (s == "uint8") return DType::kUInt8;
  return std::nullopt;
}

std::size_t dtype_size_bytes(DType t) {
  switch (t) {
    case DType::kBF16:
    case DType::kFP16:
      return 2;
    case DType::kFP32:
    case DType::kInt32:
      return 4;
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kUInt8:
      return 1;
    case DType::kInt64:
      return 8;
  }
  return 0;
}

bool dtype_is_float(DType t) { return t != DType::kInt32 && t != DType::kInt64 && t != DType::kUInt8; }

std::string_view dtype_accepted_names() {
  return "bf16 (bfloat16), fp16 (half, float16), fp32 (float, float32), fp8_e4m3 (e4m3), "
         "fp8_e5m2 (e5m2), int32, int64, uint8";
}

namespace {

// A small binary float format: 1 sign bit, `exp_bits`, `man_bits`.
struct SmallFloat {
  int exp_bits;
  int man_bits;
  int bias;
  double max_finite;
  bool has_inf;       // IEEE-like: all-ones exponent means inf/NaN
  bool saturate;      // finite overflow clamps to max_finite (else becomes inf)
  unsigned nan_bits;  // canonical NaN pattern without the sign
};

constexpr SmallFloat kFP16{5, 10, 15, 65504.0, true, false, 0x7E00u};
constexpr SmallFloat kBF16{8, 7, 127, 0x1.FEp127, true, false, 0x7FC0u};
// OCP FP8: e4m3 has no infinity (S.1111.111 is NaN); e5m2 is IEEE-like.
constexpr SmallFloat kE4M3{4, 3, 7, 448.0, false, true, 0x7Fu};
constexpr SmallFloat kE5M2{5, 2, 15, 57344.0, true, true, 0x7Eu};

// The bits of v rounded to nearest even in f, read off the double's own bits, where v and the
// result are normal numbers of f no larger than max_finite; -1 elsewhere (zeros, subnormals,
// overflow, inf, NaN: encode_small's general path). The same rounding as encode_small's without
// its frexp / ldexp / floor (6 ns a value on this project's 2-core machine): every random input and
// reference output goes through here.
int64_t encode_normal_fast(double v, const SmallFloat& f) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  const int e_double = static_cast<int>((u >> 52) & 0x7FFu);
  if (e_double == 0 || e_double == 0x7FF) return -1;
  const int e = e_double - 1023 + f.bias;  // f's biased exponent before rounding
  if (e < 1) return -1;                    // below f's normals: the subnormals' spacing
  const int shift = 52 - f.man_bits;
  const uint64_t m = u & ((uint64_t{1} << 52) - 1);
  const uint64_t r = m + ((uint64_t{1} << (shift - 1)) - 1) + ((m >> shift) & 1u);  // ties to even
  const uint64_t carry = r >> 52;  // rounded up into the next binade (mantissa 0)
  const uint64_t mant = (r >> shift) & ((uint64_t{1} << f.man_bits) - 1);
  const uint64_t magnitude = (static_cast<uint64_t>(e) + carry) << f.man_bits | mant;
  // The largest finite value's bits: every format's is below its inf / NaN patterns.
  const uint64_t exp_all = (uint64_t{1} << f.exp_bits) - 1;
  const uint64_t max_bits = f.has_inf ? ((exp_all - 1) << f.man_bits | ((uint64_t{1} << f.man_bits) - 1))
                                      : (exp_all << f.man_bits | ((uint64_t{1} << f.man_bits) - 2));
  if (magnitude > max_bits) return -1;
  const uint64_t sign = (u >> 63) << (f.exp_bits + f.man_bits);
  return static_cast<int64_t>(sign | magnitude);
}

// Round-to-nearest-even of a non-negative double to an integer (exact for |q| < 2^52).
double round_half_even(double q) {
  double r = std::floor(q);
  double diff = q - r;
  if (diff > 0.5 || (diff == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  return r;
}

// The exponent of the format's spacing at magnitude a >= 0: its subnormals' below the smallest
// normal, else man_bits below a's binade.
int quantum_exponent(double a, const SmallFloat& f) {
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  if (a < std::ldexp(1.0, emin)) return emin - f.man_bits;
  int ex = 0;
  std::frexp(a, &ex);
  return (ex - 1) - f.man_bits;
}

// Encodes v (any double) into the format, rounding to nearest even.
// Infinity: inf where the format has one, else max_finite (saturating).
unsigned encode_small(double v, const SmallFloat& f) {
  if (const int64_t fast = encode_normal_fast(v, f); fast >= 0) return static_cast<unsigned>(fast);
  const int total_bits = 1 + f.exp_bits + f.man_bits;
  const unsigned sign = std::signbit(v) ? (1u << (total_bits - 1)) : 0u;
  const unsigned exp_all = (1u << f.exp_bits) - 1;
  const unsigned inf_bits = exp_all << f.man_bits;
  if (std::isnan(v)) return sign | f.nan_bits;
  double a = std::fabs(v);
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  auto encode_finite = [&](double value) -> unsigned {
    // value is representable exactly.
    if (value == 0.0) return sign;
    if (value < std::ldexp(1.0, emin)) {
      auto mant = static_cast<unsigned>(std::ldexp(value, f.man_bits - emin));
      return sign | mant;
    }
    int ex = 0;
    std::frexp(value, &ex);
    const int e = ex - 1;  // value in [2^e, 2^(e+1))
    auto mant = static_cast<unsigned>(std::ldexp(value, f.man_bits - e)) - (1u << f.man_bits);
    return sign | (static_cast<unsigned>(e + f.bias) << f.man_bits) | mant;
  };
  auto overflow = [&]() -> unsigned {
    if (f.saturate) return encode_finite(f.max_finite);
    return sign | inf_bits;
  };
  if (std::isinf(a)) {
    if (f.has_inf) return sign | inf_bits;
    return encode_finite(f.max_finite);
  }
  if (a == 0.0) return sign;
  const int quantum_exp = quantum_exponent(a, f);
  // Values far above the range: avoid huge quotients.
  if (a > 2.0 * f.max_finite) return overflow();
  double q = std::ldexp(a, -quantum_exp);  // exact: scaling by a power of two
  double r = round_half_even(q);
  double rounded = std::ldexp(r, quantum_exp);
  if (rounded > f.max_finite) return overflow();
  return encode_finite(rounded);
}

double decode_small(unsigned bits, const SmallFloat& f) {
  const int total_bits = 1 + f.exp_bits + f.man_bits;
  const bool neg = (bits >> (total_bits - 1)) & 1u;
  const unsigned exp_all = (1u << f.exp_bits) - 1;
  const unsigned e = (bits >> f.man_bits) & exp_all;
  const unsigned m = bits & ((1u << f.man_bits) - 1);
  double v;
  if (f.has_inf && e == exp_all) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && e == exp_all && m == (1u << f.man_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1u << f.man_bits)), static_cast<int>(e) - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

const SmallFloat& fp8_format(DType t) { return t == DType::kFP8E5M2 ? kE5M2 : kE4M3; }

// Every value of a 16- or 8-bit format, decoded once (decode_small's ldexp per element was most of
// the time of reading a large tensor on the host).
template <int kBits>
struct DecodeTable {
  explicit DecodeTable(const SmallFloat& f) {
    for (unsigned b = 0; b < (1u << kBits); ++b) values[b] = decode_small(b, f);
  }
  double values[1u << kBits];
};
const DecodeTable<16>& fp16_table() {
  static const auto* t = new DecodeTable<16>(kFP16);  // 512 KiB, built on first use, never freed
  return *t;
}
const DecodeTable<8>& fp8_table(DType t) {
  static const DecodeTable<8> e4m3(kE4M3), e5m2(kE5M2);
  return t == DType::kFP8E5M2 ? e5m2 : e4m3;
}

template <typename T>
T load_raw(const void* src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  return v;
}

template <typename T>
void store_raw(void* dst, T v) {
  std::memcpy(dst, &v, sizeof(T));
}

// Rounds to nearest (ties away from zero) and clamps into T; NaN becomes 0.
template <typename T>
T to_int_saturating(double v) {
  if (std::isnan(v)) return 0;
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  const double hi = static_cast<double>(std::numeric_limits<T>::max());
  double r = std::round(v);
  if (r <= lo) return std::numeric_limits<T>::min();
  if (r >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(r);
}

}  // namespace

unsigned short float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<unsigned short>((u >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest even on the 16 dropped bits; overflow carries into inf correctly.
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}

float bf16_bits_to_float(unsigned short b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

unsigned short float_to_fp16_bits(float f) {
  return static_cast<unsigned short>(encode_small(static_cast<double>(f), kFP16));
}

float fp16_bits_to_float(unsigned short b) { return static_cast<float>(fp16_table().values[b]); }

unsigned char float_to_fp8_bits(float f, DType t) {
  return static_cast<unsigned char>(encode_small(static_cast<double>(f), fp8_format(t)));
}

float fp8_bits_to_float(unsigned char b, DType t) { return static_cast<float>(fp8_table(t).values[b]); }

double load_element(const void* src, DType t) {
  switch (t) {
    case DType::kBF16: {  // the top half of a float: exact, NaN aside (decode_small's quiet NaN)
      const uint16_t b = load_raw<uint16_t>(src);
      return (b & 0x7FFFu) > 0x7F80u ? decode_small(b, kBF16) : static_cast<double>(bf16_bits_to_float(b));
    }
    case DType::kFP16:
      return fp16_table().values[load_raw<uint16_t>(src)];
    case DType::kFP32:
      return static_cast<double>(load_raw<float>(src));
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
      return fp8_table(t).values[load_raw<uint8_t>(src)];
    case DType::kInt32:
      return static_cast<double>(load_raw<int32_t>(src));
    case DType::kInt64:
      return static_cast<double>(load_raw<int64_t>(src));
    case DType::kUInt8:
      return static_cast<double>(load_raw<uint8_t>(src));
  }
  return 0.0;
}

// bf16 of v, rounded to nearest even. A value that is exactly a float (every fp32 weight and
// input) takes the float's bits: rounding its low 16 bits to nearest even is exact, subnormals
// and overflow to infinity included, and 20 times faster than the general encoder, which the
// others take (a double between two floats must not be rounded twice).
static uint16_t bf16_bits(double v) {
  const float f = static_cast<float>(v);
  if (static_cast<double>(f) != v)
    return static_cast<uint16_t>(encode_small(v, kBF16));  // NaN too (NaN != NaN)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

void store_element(void* dst, DType t, double v) {
  // Narrow float types round straight from double (no double rounding through float).
  switch (t) {
    case DType::kBF16:
      store_raw<uint16_t>(dst, bf16_bits(v));
      return;
    case DType::kFP16:
      store_raw<uint16_t>(dst, static_cast<uint16_t>(encode_small(v, kFP16)));
      return;
    case DType::kFP32:
      store_raw<float>(dst, static_cast<float>(v));
      return;
    case DType::kFP8E4M3:
      store_raw<uint8_t>(dst, static_cast<uint8_t>(encode_small(v, kE4M3)));
      return;
    case DType::kFP8E5M2:
      store_raw<uint8_t>(dst, static_cast<uint8_t>(encode_small(v, kE5M2)));
      return;
    case DType::kInt32:
      store_raw<int32_t>(dst, to_int_saturating<int32_t>(v));
      return;
    case DType::kInt64:
      store_raw<int64_t>(dst, to_int_saturating<int64_t>(v));
      return;
    case DType::kUInt8:
      store_raw<uint8_t>(dst, to_int_saturating<uint8_t>(v));
      return;
  }
}

double fp8_spacing(DType t, double v) {
  return std::ldexp(1.0, quantum_exponent(std::fabs(v), fp8_format(t)));
}

double dtype_saturation(DType t) {
  if (t != DType::kFP8E4M3 && t != DType::kFP8E5M2) return 0.0;
  const SmallFloat& f = fp8_format(t);
  return f.saturate ? f.max_finite : 0.0;
}

}  // namespace fusebox
