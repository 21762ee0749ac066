// fusebox_common: the serialized form of a partitioned plan (fusebox/partition.h):
// one payload holding each part's own serialized plan, with which ops of the
// whole graph each part runs. Checked like any plan payload before anything
// reads it: a hostile container is a ParseError, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/status.h"

namespace fusebox::common {

inline constexpr char kPlanPartsMagic[] = "FUSEBOX-PLAN-PARTS-1\n";
inline constexpr size_t kMaxPlanParts = 64;

struct SerializedPart {
  int first_op = 0;
  int op_count = 0;
  std::string engine;
  // The part's own plan (the frontend's serialized form); empty for a part fusebox runs with a
  // kernel of its own (engine kOwnKernelPrefix*), rebuilt from its graph by engine name.
  std::vector<uint8_t> payload;
};

// The engine names of fusebox's own kernels start so ("fusebox_reference", "fusebox_pool").
inline constexpr char kOwnKernelPrefix[] = "fusebox_";

// Whether `data` starts like a partitioned plan (the magic).
bool is_plan_parts(const uint8_t* data, size_t n);
// A temporary between parts: its tensor index in the whole graph and the dtype it is stored in.
using TemporaryDtypes = std::vector<std::pair<int, std::string>>;
std::vector<uint8_t> encode_plan_parts(const std::vector<SerializedPart>& parts,
                                       const TemporaryDtypes& temporaries = {});
// Parses and checks the container (header, part ranges contiguous from op 0,
// lengths adding up) and every part's payload (check_plan_payload); a container of one part
// is a whole graph on fusebox's own kernel (no payload: Plan::serialize of a native plan). `op_count`:
// the whole graph's ops, which the parts must cover exactly.
Result<std::vector<SerializedPart>> decode_plan_parts(const uint8_t* data, size_t n, int op_count,
                                                      const std::string& where,
                                                      TemporaryDtypes* temporaries = nullptr);

}  // namespace fusebox::common
