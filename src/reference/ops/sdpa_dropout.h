// fusebox: where the references find an sdpa op's dropout mask (private to
// the reference layer).
//
// cuDNN draws the dropout keep-mask from its Philox generator; the references
// do not reimplement it. Instead the op declares a "dropout_mask" output
// (SdpaOptions::dump_dropout_mask: cuDNN's RNG dump, fp32 [B,Hq,Sq,Skv]) and
// the caller feeds the dumped values back in to the reference as an input
// under that output tensor's name.
#pragma once

#include <string>

#include "common/op_where.h"
#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox::reference_detail {

// The name of sdpa op `op`'s "dropout_mask" output tensor, which `inputs`
// (HostTensors or device pointers, by tensor name) must hold. NotSupported,
// naming the op, when the op has no such output or `inputs` lacks it. Call it
// only for dropout > 0.
template <typename Map>
Result<std::string> sdpa_dropout_mask_name(const ResolvedGraph& g, const ResolvedOp& op, const Map& inputs) {
  std::string where = common::op_where(op_type_name(op.attrs), op.name);
  where += ' ';
  const SdpaOptions* o = sdpa_options(op.attrs);
  where += "dropout " + std::to_string(o && o->dropout ? *o->dropout : 0.0) + ": ";
  auto it = op.outputs.find("dropout_mask");
  if (it == op.outputs.end() || it->second < 0 || it->second >= static_cast<int>(g.tensors.size()))
    return NotSupported(where +
                        "the references need the keep-mask cuDNN drew (they do not implement its Philox "
                        "generator); declare a 'dropout_mask' output to verify dropout");
  const std::string& name = g.tensors[it->second].name;
  if (inputs.find(name) == inputs.end())
    return NotSupported(where + "the reference inputs hold no values for its 'dropout_mask' output '" + name +
                        "': feed cuDNN's dumped mask in under that name (declare a 'dropout_mask' output to "
                        "verify dropout)");
  return name;
}

}  // namespace fusebox::reference_detail
