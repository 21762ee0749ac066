// fusebox C API: what the opaque handles of include/fusebox/fusebox.h hold.
// Each keeps what it depends on alive through shared_ptr, so C callers may
// free handles in any order.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/plan_cache.h"
#include "fusebox/serve.h"
#include "fusebox/session.h"
#include "fusebox/train.h"

struct fusebox_graph {
  std::shared_ptr<const fusebox::ResolvedGraph> graph;
  std::vector<int> bindable;  // indices of the tensors the caller binds, in graph order
  std::string describe;       // filled on first fusebox_graph_describe
  std::string source_path;    // the file fusebox_graph_load read ("" for text): plan_save never writes it
  // fusebox_graph_backward: the graph's JSON and its bindings to the forward ("" otherwise).
  std::string backward_json, backward_bindings;
};

// The cache outlives the session that points at it (members die in reverse order).
struct SessionBox {
  std::string cache_path, device_properties_file;  // inputs plan_save never writes over
  std::optional<fusebox::PlanCache> cache;
  std::unique_ptr<fusebox::Session> session;
};

struct fusebox_session {
  std::shared_ptr<SessionBox> box;
};

struct fusebox_plan {
  std::shared_ptr<const fusebox::ResolvedGraph> graph;
  std::shared_ptr<SessionBox> box;  // plans built on a GPU use its context
  std::shared_ptr<fusebox::Plan> plan;
  std::string source;
  std::string cache = "off";  // the plan cache's part: "hit", "miss", "off"
  std::string graph_path;     // the graph's source_path
  std::string report_json;    // where it came from and what it cost (fusebox/report_json.h)
};

struct fusebox_bound_plan {
  std::shared_ptr<SessionBox> box;
  std::shared_ptr<fusebox::Plan> plan;
  fusebox::BoundPlan bound;
};

struct fusebox_lm_trainer {
  std::unique_ptr<fusebox::LmTrainer> trainer;
};

struct fusebox_lm_engine {
  std::unique_ptr<fusebox::LmEngine> engine;
  int64_t max_batch = 0;
};
