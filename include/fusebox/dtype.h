// fusebox: element types.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace fusebox {

enum class DType {
  kBF16,
  kFP16,
  kFP32,
  kFP8E4M3,
  kFP8E5M2,
  kInt32,
  kInt64,
  kUInt8,  // bytes of bits (an sdpa block mask); appended: the values above are stable
};

// "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int32", "int64", "uint8".
std::string_view dtype_name(DType t);
// Accepts the names above; also "bfloat16", "half", "float16", "float", "float32", "e4m3", "e5m2".
std::optional<DType> parse_dtype(std::string_view s);
std::size_t dtype_size_bytes(DType t);
bool dtype_is_float(DType t);
// The names parse_dtype accepts, for error messages.
std::string_view dtype_accepted_names();

// Conversions between float and the stored bit patterns (round to nearest even).
unsigned short float_to_bf16_bits(float f);
float bf16_bits_to_float(unsigned short b);
unsigned short float_to_fp16_bits(float f);
float fp16_bits_to_float(unsigned short b);
unsigned char float_to_fp8_bits(float f, DType t);  // saturating, t is e4m3 or e5m2
float fp8_bits_to_float(unsigned char b, DType t);
// The distance between neighbouring values of t (e4m3 or e5m2) at magnitude |v|: the subnormals'
// spacing below the smallest normal.
double fp8_spacing(DType t, double v);
// The value a saturating cast to t clamps to (fp8: e4m3 448, e5m2 57344), or 0 for a dtype whose
// casts do not saturate.
double dtype_saturation(DType t);

// Converts one element stored at `src` with type t to double / stores v into dst.
double load_element(const void* src, DType t);
void store_element(void* dst, DType t, double v);

}  // namespace fusebox
