// Private to src/cudnn/: fusebox's named rules that keep engines out of a
// build where they are known to compute wrong values for a pattern. Every
// rule cites its evidence (the case, the cuDNN version, what came back); the
// plan check (fusebox/plan_check.h) catches what no rule names yet.
#pragma once

#include <string>
#include <vector>

#include "fusebox/graph.h"

namespace fusebox::cudnn {

struct EngineBar {
  std::string rule;     // the rule's name
  std::string pattern;  // the engine barred, with any knobs: "eng8" bars "eng8" and "eng8_k2=1", not "eng80"
  std::string evidence;
};

// The bars every rule that applies to `g` sets, for the cuDNN version loaded; `dynamic_shape`: for a
// dynamic-shape build (some rules apply only there).
std::vector<EngineBar> engine_bars_for(const ResolvedGraph& g, bool dynamic_shape = false);

// Whether `engine` (a full candidate name) is barred by `bars` or named in
// `excluded` (exact names); *why gets the rule or "failed the plan check".
bool engine_barred(const std::string& engine, const std::vector<EngineBar>& bars,
                   const std::vector<std::string>& excluded, std::string* why);

}  // namespace fusebox::cudnn
