// fusebox: LmStepProfile summed by kind, and its JSON (include/fusebox/train.h). The numbers come
// from LmTrainer::profile_step on a GPU; the summing is plain arithmetic, tested on the CPU.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>

#include "fusebox/train.h"

namespace fusebox {
namespace {

// A stage row's weight per step: the forward and backward run once per micro-batch.
double per_step(const LmStepProfile& p, const LmStepProfileRow& r) {
  return r.part == "optimizer" ? 1.0 : static_cast<double>(p.accum);
}

}  // namespace

std::vector<LmStepProfileKind> lm_profile_by_kind(const LmStepProfile& p) {
  const std::regex layer("\\.[0-9]+\\.");
  std::map<std::pair<std::string, std::string>, LmStepProfileKind> kinds;
  std::map<std::pair<std::string, std::string>, std::set<std::string>> engines;
  for (const LmStepProfileRow& r : p.rows) {
    const std::string stage = std::regex_replace(r.stage, layer, ".*.");
    LmStepProfileKind& k = kinds[{r.part, stage}];
    k.part = r.part;
    k.stage = stage;
    k.ms += r.ms * per_step(p, r);
    k.flops += r.flops * per_step(p, r);
    ++k.count;
    if (!r.engine.empty()) engines[{r.part, stage}].insert(r.engine);
  }
  std::vector<LmStepProfileKind> out;
  for (auto& [key, k] : kinds) {
    k.engines.assign(engines[key].begin(), engines[key].end());
    out.push_back(std::move(k));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const LmStepProfileKind& a, const LmStepProfileKind& b) { return a.ms > b.ms; });
  return out;
}

double lm_profile_sum_ms(const LmStepProfile& p) {
  double sum = 0;
  for (const LmStepProfileRow& r : p.rows) sum += r.ms * per_step(p, r);
  return sum;
}

std::string lm_profile_json(const LmStepProfile& p) {
  nlohmann::json rows = nlohmann::json::array();
  for (const LmStepProfileRow& r : p.rows)
    rows.push_back(
        {{"part", r.part}, {"stage", r.stage}, {"engine", r.engine}, {"ms", r.ms}, {"flops", r.flops}});
  nlohmann::json kinds = nlohmann::json::array();
  for (const LmStepProfileKind& k : lm_profile_by_kind(p))
    kinds.push_back({{"part", k.part},
                     {"stage", k.stage},
                     {"ms_per_step", k.ms},
                     {"flops_per_step", k.flops},
                     {"runs", k.count},
                     {"engines", k.engines}});
  const nlohmann::json doc = {{"iters", p.iters},
                              {"accum", p.accum},
                              {"step_ms", p.step_ms},
                              {"step_eager_ms", p.step_eager_ms},
                              {"graph_note", p.graph_note},
                              {"sum_ms", lm_profile_sum_ms(p)},
                              {"kinds", kinds},
                              {"rows", rows}};
  return doc.dump(1) + "\n";
}

}  // namespace fusebox
