// libFuzzer target: arbitrary bytes as a stored plan-cache row, through the
// validation lookup() uses (cache_internal::validate_entry_bytes). See fuzz/README.md.
//
// The first byte picks a mode:
//   0: raw row "key\nmeta\npayload": must never crash, hang or throw;
//   1: round trip: the rest is a payload plus field text; encode_entry_meta
//      then validate must accept it and give back the same fields;
//   2: a valid row with one byte of the metadata or payload XORed: must not
//      crash, and a changed payload must be rejected.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "entry_codec.h"

using fusebox::CacheEntry;
using fusebox::cache_internal::encode_entry_meta;
using fusebox::cache_internal::validate_entry_bytes;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "plan_cache_entry_fuzzer: property violated: %s\n", what);
    abort();
  }
}

CacheEntry entry_from(std::string_view text) {
  CacheEntry e;
  e.key = std::string(text.substr(0, 16));
  e.info.engine = std::string(text.substr(std::min<size_t>(16, text.size()), 24));
  e.info.device_name = std::string(text);
  e.info.frontend_version = "1.17.0";
  e.info.workspace_bytes = static_cast<int64_t>(text.size()) * 4096;
  e.info.sm_count = static_cast<int>(text.size());
  e.tuned_median_ms = text.empty() ? -1 : static_cast<double>(static_cast<uint8_t>(text[0])) / 8;
  e.created_utc = "2026-11-29T21:00:05.000000Z";
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);

  if (mode == 0) {
    const size_t a = rest.find('\n');
    const std::string_view key = rest.substr(0, a);
    std::string_view meta, payload;
    if (a != std::string_view::npos) {
      const size_t b = rest.find('\n', a + 1);
      meta = rest.substr(a + 1, b == std::string_view::npos ? std::string_view::npos : b - a - 1);
      if (b != std::string_view::npos) payload = rest.substr(b + 1);
    }
    CacheEntry out;
    const auto st = validate_entry_bytes(key, meta, reinterpret_cast<const uint8_t*>(payload.data()),
                                         payload.size(), &out);
    if (st.ok())
      check(out.payload_bytes == static_cast<int64_t>(payload.size()), "accepted a length mismatch");
    return 0;
  }

  // Modes 1 and 2: split the rest into field text and a payload.
  const size_t cut = rest.empty() ? 0 : static_cast<uint8_t>(rest[0]) % (rest.size());
  const std::string_view text = rest.substr(std::min<size_t>(1, rest.size()), cut);
  const std::string_view pay = rest.substr(std::min(rest.size(), 1 + cut));
  if (pay.empty()) return 0;
  const auto* p = reinterpret_cast<const uint8_t*>(pay.data());
  const CacheEntry in = entry_from(text);
  const std::string meta = encode_entry_meta(in, p, pay.size());

  if (mode == 1) {
    CacheEntry out;
    const auto st = validate_entry_bytes(in.key, meta, p, pay.size(), &out);
    // Strings with invalid UTF-8 are replaced on encoding; then the key no longer matches, which must be an
    // error.
    if (!st.ok()) return 0;
    check(out.key == in.key, "key changed");
    check(out.payload_bytes == static_cast<int64_t>(pay.size()), "length changed");
    check(out.info.workspace_bytes == in.info.workspace_bytes, "workspace changed");
    check(out.tuned_median_ms == in.tuned_median_ms, "median changed");
    check(out.created_utc == in.created_utc, "created changed");
    // Valid UTF-8 input must always round trip.
    bool ascii = true;
    for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    if (ascii)
      check(out.info.device_name == in.info.device_name && out.info.engine == in.info.engine, "text changed");
    return 0;
  }

  // mode 2: flip one byte chosen by the payload's first bytes.
  std::string m = meta;
  std::string q(pay);
  const uint8_t x = pay.size() > 1 ? static_cast<uint8_t>(pay[1]) : 1;
  const size_t at = pay.size() > 2 ? static_cast<uint8_t>(pay[2]) * 131u + pay.size() : pay.size();
  const bool hit_payload = (pay[0] & 1) != 0;
  if (hit_payload) {
    q[at % q.size()] = static_cast<char>(q[at % q.size()] ^ (x ? x : 1));
  } else {
    m[at % m.size()] = static_cast<char>(m[at % m.size()] ^ (x ? x : 1));
  }
  const auto st =
      validate_entry_bytes(in.key, m, reinterpret_cast<const uint8_t*>(q.data()), q.size(), nullptr);
  if (hit_payload) check(!st.ok(), "a changed payload was accepted");
  return 0;
}
