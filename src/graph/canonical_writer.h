// fusebox graph layer: the writer of the canonical form (canonical.cpp).
// Exact numbers: doubles in shortest round-trip form (std::to_chars), so two
// values that differ in the last bit never print alike.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fusebox {

class CanonicalWriter {
 public:
  void field(std::string_view key, std::string_view value);
  void field(std::string_view key, int64_t value);
  void field(std::string_view key, bool value);
  void field(std::string_view key, double value);
  void field(std::string_view key, const std::vector<int64_t>& values);
  void field(std::string_view key, const std::vector<double>& values);
  // Integer and bool overloads would otherwise be ambiguous for int literals.
  void field(std::string_view key, int value) { field(key, static_cast<int64_t>(value)); }
  void line();  // ends the current record
  const std::string& text() const { return text_; }

  static std::string exact(double v);  // shortest round-trip decimal

 private:
  void key(std::string_view k);
  std::string text_;
  bool fresh_ = true;
};

}  // namespace fusebox
