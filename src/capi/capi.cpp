// fusebox C API over the C++ API (include/fusebox/fusebox.h). Every entry
// point runs its body through guarded(), so no exception reaches C code: a
// std::bad_alloc becomes FUSEBOX_OUT_OF_MEMORY, anything else FUSEBOX_INTERNAL.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <set>
#include <string>
#include <utility>

#include "common/file_io.h"
#include "fusebox/autodiff.h"
#include "fusebox/dtype.h"
#include "fusebox/fusebox.h"
#include "fusebox/plan_file.h"
#include "fusebox/report_json.h"
#include "fusebox/serve.h"
#include "fusebox/train.h"
#include "handles.h"

namespace {

using fusebox::Result;
using fusebox::Status;
using fusebox::StatusCode;

struct ThreadError {
  fusebox_status code = FUSEBOX_OK;
  std::string message;
};
thread_local ThreadError t_error;

fusebox_status to_c(StatusCode c) {
  switch (c) {
    case StatusCode::kOk:
      return FUSEBOX_OK;
    case StatusCode::kInvalidArgument:
      return FUSEBOX_INVALID_ARGUMENT;
    case StatusCode::kParseError:
      return FUSEBOX_PARSE_ERROR;
    case StatusCode::kNotSupported:
      return FUSEBOX_NOT_SUPPORTED;
    case StatusCode::kIoError:
      return FUSEBOX_IO_ERROR;
    case StatusCode::kCudnnError:
      return FUSEBOX_CUDNN_ERROR;
    case StatusCode::kCudaError:
      return FUSEBOX_CUDA_ERROR;
    case StatusCode::kNoDevice:
      return FUSEBOX_NO_DEVICE;
    case StatusCode::kVersionMismatch:
      return FUSEBOX_VERSION_MISMATCH;
    case StatusCode::kVerificationFailed:
      return FUSEBOX_VERIFICATION_FAILED;
    case StatusCode::kInternal:
      return FUSEBOX_INTERNAL;
  }
  return FUSEBOX_INTERNAL;
}

fusebox_status fail(fusebox_status code, std::string message) {
  // Assigning may throw bad_alloc; the code still gets through.
  t_error.code = code;
  try {
    t_error.message = std::move(message);
  } catch (...) {
    t_error.message.clear();
  }
  return code;
}

fusebox_status fail(const char* fn, const Status& st) {
  return fail(to_c(st.code()), std::string(fn) + ": " + st.message());
}

fusebox_status null_arg(const char* fn, const char* what) {
  return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": " + what + " is NULL");
}

template <typename F>
fusebox_status guarded(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(FUSEBOX_OUT_OF_MEMORY, std::string(fn) + ": out of host memory");
  } catch (const std::exception& e) {
    return fail(FUSEBOX_INTERNAL, std::string(fn) + ": unexpected exception: " + e.what());
  } catch (...) {
    return fail(FUSEBOX_INTERNAL, std::string(fn) + ": unexpected exception");
  }
}

fusebox_status make_graph(const char* fn, Result<fusebox::GraphSpec> spec, fusebox_graph** out) {
  if (!spec.ok()) return fail(fn, spec.status());
  Result<fusebox::ResolvedGraph> g = fusebox::resolve(*spec);
  if (!g.ok()) return fail(fn, g.status());
  auto h = std::make_unique<fusebox_graph>();
  h->graph = std::make_shared<const fusebox::ResolvedGraph>(std::move(*g));
  const auto& tensors = h->graph->tensors;
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i) {
    // By-value scalars are taken from the graph, never bound.
    if (!tensors[i].is_virtual && !tensors[i].scalar_value) h->bindable.push_back(i);
  }
  *out = h.release();
  return FUSEBOX_OK;
}

std::string bindable_names(const fusebox_graph& g) {
  std::string s;
  for (int i : g.bindable) s += (s.empty() ? "" : ", ") + g.graph->tensors[i].name;
  return s;
}

}  // namespace

extern "C" {

const char* fusebox_version(void) { return FUSEBOX_VERSION; }
int fusebox_c_api_version(void) { return FUSEBOX_C_API_VERSION; }

const char* fusebox_status_name(fusebox_status status) {
  switch (status) {
    case FUSEBOX_OK:
      return "Ok";
    case FUSEBOX_INVALID_ARGUMENT:
      return "InvalidArgument";
    case FUSEBOX_PARSE_ERROR:
      return "ParseError";
    case FUSEBOX_NOT_SUPPORTED:
      return "NotSupported";
    case FUSEBOX_IO_ERROR:
      return "IoError";
    case FUSEBOX_CUDNN_ERROR:
      return "CudnnError";
    case FUSEBOX_CUDA_ERROR:
      return "CudaError";
    case FUSEBOX_NO_DEVICE:
      return "NoDevice";
    case FUSEBOX_VERSION_MISMATCH:
      return "VersionMismatch";
    case FUSEBOX_VERIFICATION_FAILED:
      return "VerificationFailed";
    case FUSEBOX_INTERNAL:
      return "Internal";
    case FUSEBOX_OUT_OF_MEMORY:
      return "OutOfMemory";
  }
  return "Unknown";
}

const char* fusebox_last_error(void) { return t_error.message.c_str(); }
fusebox_status fusebox_last_status(void) { return t_error.code; }

// ---------------------------------------------------------------- graphs

fusebox_status fusebox_graph_from_json(const char* json, size_t length, fusebox_graph** out) {
  const char* fn = "fusebox_graph_from_json";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!json) return null_arg(fn, "json");
    return make_graph(fn, fusebox::parse_graph_json(std::string_view(json, length), "<json text>"), out);
  });
}

fusebox_status fusebox_graph_load(const char* path, fusebox_graph** out) {
  const char* fn = "fusebox_graph_load";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!path) return null_arg(fn, "path");
    const fusebox_status st = make_graph(fn, fusebox::load_graph_file(path), out);
    if (st == FUSEBOX_OK) (*out)->source_path = path;
    return st;
  });
}

void fusebox_graph_free(fusebox_graph* graph) { delete graph; }

const char* fusebox_graph_name(const fusebox_graph* graph) {
  return graph ? graph->graph->name.c_str() : nullptr;
}

const char* fusebox_graph_describe(const fusebox_graph* graph) {
  if (!graph) return nullptr;
  auto* g = const_cast<fusebox_graph*>(graph);  // a cache, filled once
  if (g->describe.empty()) {
    try {
      g->describe = fusebox::describe(*g->graph);
    } catch (...) {
      return "";
    }
  }
  return g->describe.c_str();
}

fusebox_status fusebox_graph_backward(const fusebox_graph* graph, const char* wrt, const char* seeds,
                                      fusebox_graph** out) {
  const char* fn = "fusebox_graph_backward";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!graph) return null_arg(fn, "graph");
    auto names = [](const char* s) {
      std::vector<std::string> v;
      std::string cur;
      for (const char* p = s ? s : ""; *p; ++p) {
        if (*p == ',') {
          if (!cur.empty()) v.push_back(cur);
          cur.clear();
        } else {
          cur += *p;
        }
      }
      if (!cur.empty()) v.push_back(cur);
      return v;
    };
    fusebox::BackwardOptions opt;
    opt.wrt = names(wrt);
    opt.seeds = names(seeds);
    auto b = fusebox::derive_backward(*graph->graph, opt);
    if (!b.ok()) return fail(fn, b.status());
    const fusebox_status st = make_graph(fn, b->spec, out);
    if (st != FUSEBOX_OK) return st;
    (*out)->backward_json = fusebox::graph_to_json(b->spec);
    (*out)->backward_bindings = fusebox::backward_bindings_json(*b);
    return FUSEBOX_OK;
  });
}

const char* fusebox_graph_backward_json(const fusebox_graph* graph) {
  return graph ? graph->backward_json.c_str() : nullptr;
}
const char* fusebox_graph_backward_bindings(const fusebox_graph* graph) {
  return graph ? graph->backward_bindings.c_str() : nullptr;
}

size_t fusebox_graph_tensor_count(const fusebox_graph* graph) { return graph ? graph->bindable.size() : 0; }

fusebox_status fusebox_graph_tensor(const fusebox_graph* graph, size_t index, fusebox_tensor_info* info) {
  const char* fn = "fusebox_graph_tensor";
  return guarded(fn, [&] {
    if (!graph) return null_arg(fn, "graph");
    if (!info) return null_arg(fn, "info");
    if (index >= graph->bindable.size()) {
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": index " + std::to_string(index) +
                                                " out of range; graph '" + graph->graph->name + "' has " +
                                                std::to_string(graph->bindable.size()) + " tensors to bind");
    }
    const fusebox::ResolvedTensor& t = graph->graph->tensors[graph->bindable[index]];
    info->name = t.name.c_str();
    info->kind = t.is_output ? FUSEBOX_TENSOR_OUTPUT : FUSEBOX_TENSOR_INPUT;
    info->dtype = fusebox::dtype_name(t.dtype).data();  // names are string literals
    info->rank = static_cast<int>(t.dims.size());
    info->dims = t.dims.data();
    info->strides = t.strides.data();
    info->bytes = t.storage_bytes();
    return FUSEBOX_OK;
  });
}

fusebox_status fusebox_graph_find_tensor(const fusebox_graph* graph, const char* name,
                                         fusebox_tensor_info* info) {
  const char* fn = "fusebox_graph_find_tensor";
  return guarded(fn, [&] {
    if (!graph) return null_arg(fn, "graph");
    if (!name) return null_arg(fn, "name");
    if (!info) return null_arg(fn, "info");
    for (size_t i = 0; i < graph->bindable.size(); ++i) {
      if (graph->graph->tensors[graph->bindable[i]].name == name) return fusebox_graph_tensor(graph, i, info);
    }
    return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": graph '" + graph->graph->name +
                                              "' binds no tensor '" + name + "'; it binds " +
                                              bindable_names(*graph));
  });
}

// ---------------------------------------------------------------- sessions

fusebox_status fusebox_session_create(int device_id, const char* device_properties_file,
                                      const char* cache_path, fusebox_session** out) {
  const char* fn = "fusebox_session_create";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    auto box = std::make_shared<SessionBox>();
    fusebox::SessionOptions so;
    so.device_id = device_id;
    if (device_properties_file) so.device_properties_file = device_properties_file;
    box->device_properties_file = so.device_properties_file;
    if (cache_path) box->cache_path = cache_path;
    if (cache_path) {
      box->cache.emplace(fusebox::PlanCache::open(cache_path));
      so.cache = &*box->cache;
    }
    Result<std::unique_ptr<fusebox::Session>> s = fusebox::Session::create(so);
    if (!s.ok()) return fail(fn, s.status());
    box->session = std::move(*s);
    *out = new fusebox_session{std::move(box)};
    return FUSEBOX_OK;
  });
}

void fusebox_session_free(fusebox_session* session) { delete session; }

int fusebox_session_deviceless(const fusebox_session* session) {
  return session ? (session->box->session->deviceless() ? 1 : 0) : -1;
}

const char* fusebox_session_device_name(const fusebox_session* session) {
  return session ? session->box->session->target().device_name.c_str() : nullptr;
}

int fusebox_session_device_id(const fusebox_session* session) {
  if (!session) return -1;
  fusebox::GpuContext* ctx = session->box->session->context();
  return ctx ? ctx->device_id() : -1;
}

// ---------------------------------------------------------------- plans

fusebox_plan_request fusebox_plan_request_default(void) {
  fusebox_plan_request r;
  r.plan_file = nullptr;
  r.engine = nullptr;
  r.heuristics = nullptr;
  r.max_workspace_bytes = -1;
  r.use_tuned_cache = 1;
  return r;
}

fusebox_status fusebox_session_get_plan(fusebox_session* session, const fusebox_graph* graph,
                                        const fusebox_plan_request* request, fusebox_plan** out) {
  const char* fn = "fusebox_session_get_plan";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!session) return null_arg(fn, "session");
    if (!graph) return null_arg(fn, "graph");
    fusebox::PlanRequest req;
    if (request) {
      if (request->plan_file) req.plan_file = request->plan_file;
      if (request->engine) req.engine = request->engine;
      if (request->heuristics) {
        Result<std::vector<fusebox::HeuristicMode>> modes =
            fusebox::parse_heuristic_modes(request->heuristics);
        if (!modes.ok()) return fail(fn, modes.status());
        req.heuristics = std::move(*modes);
      }
      req.max_workspace_bytes = request->max_workspace_bytes;
      req.use_tuned_cache = request->use_tuned_cache != 0;
    }
    fusebox::PlanReport report;
    Result<fusebox::Plan> plan = session->box->session->get_plan(*graph->graph, req, &report);
    if (!plan.ok()) return fail(fn, plan.status());
    auto h = std::make_unique<fusebox_plan>();
    h->graph = graph->graph;
    h->graph_path = graph->source_path;
    h->box = session->box;
    h->plan = std::make_shared<fusebox::Plan>(std::move(*plan));
    h->source = report.source_text();
    h->cache = report.cache;
    h->report_json = fusebox::plan_report_with_build_json(report);
    *out = h.release();
    return FUSEBOX_OK;
  });
}

void fusebox_plan_free(fusebox_plan* plan) { delete plan; }

const char* fusebox_plan_engine(const fusebox_plan* plan) {
  return plan ? plan->plan->engine_name().c_str() : nullptr;
}
int64_t fusebox_plan_workspace_bytes(const fusebox_plan* plan) {
  return plan ? plan->plan->workspace_bytes() : -1;
}
const char* fusebox_plan_source(const fusebox_plan* plan) { return plan ? plan->source.c_str() : nullptr; }

fusebox_status fusebox_plan_save(const fusebox_plan* plan, const char* path) {
  const char* fn = "fusebox_plan_save";
  return guarded(fn, [&] {
    if (!plan) return null_arg(fn, "plan");
    if (!path) return null_arg(fn, "path");
    // The shared output-vs-input check: never over the graph file, the cache or the device file.
    Status spare = fusebox::common::check_outputs_spare_inputs(
        {{"plan file", path}}, {{"graph file", plan->graph_path},
                                {"plan cache", plan->box->cache_path, /*database=*/true},
                                {"device-properties file", plan->box->device_properties_file}});
    if (!spare.ok()) return fail(fn, spare);
    Result<std::vector<uint8_t>> bytes = plan->plan->serialize();
    if (!bytes.ok()) return fail(fn, bytes.status());
    const fusebox::DeviceTarget& target = plan->box->session->target();
    Status st =
        fusebox::write_plan_file(path, fusebox::make_plan_info(*plan->graph, *plan->plan, target), *bytes);
    return st.ok() ? FUSEBOX_OK : fail(fn, st);
  });
}

const char* fusebox_plan_cache_result(const fusebox_plan* plan) {
  return plan ? plan->cache.c_str() : nullptr;
}
const char* fusebox_plan_report_json(const fusebox_plan* plan) {
  return plan ? plan->report_json.c_str() : nullptr;
}

fusebox_tune_request fusebox_tune_request_default(void) {
  const fusebox::TunePolicy p;
  fusebox_tune_request r;
  r.heuristics = nullptr;
  r.warmup = p.warmup;
  r.iters = p.iters;
  r.max_workspace_bytes = p.max_workspace_bytes;
  r.top_k = p.top_k;
  r.budget_ms = p.budget_ms;
  r.deterministic_only = p.deterministic_only ? 1 : 0;
  return r;
}

namespace {

// fusebox_session_tune and (v3) fusebox_session_tune_in_cuda_graph.
fusebox_status tune_plan(const char* fn, fusebox_session* session, const fusebox_graph* graph,
                         const fusebox_tune_request* request, bool cuda_graph, fusebox_plan** out) {
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!session) return null_arg(fn, "session");
    if (!graph) return null_arg(fn, "graph");
    const fusebox_tune_request r = request ? *request : fusebox_tune_request_default();
    fusebox::TunePolicy policy;
    if (r.heuristics) {
      Result<std::vector<fusebox::HeuristicMode>> modes = fusebox::parse_heuristic_modes(r.heuristics);
      if (!modes.ok()) return fail(fn, modes.status());
      policy.heuristics = std::move(*modes);
    }
    if (r.warmup < 0 || r.iters < 1) {
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": warmup " + std::to_string(r.warmup) +
                                                " and iters " + std::to_string(r.iters) +
                                                ": need warmup >= 0 and iters >= 1");
    }
    policy.warmup = r.warmup;
    policy.iters = r.iters;
    policy.max_workspace_bytes = r.max_workspace_bytes;
    policy.top_k = std::max(0, r.top_k);
    policy.budget_ms = std::max(0.0, r.budget_ms);
    policy.deterministic_only = r.deterministic_only != 0;
    policy.cuda_graph = cuda_graph;
    Result<fusebox::SessionTune> t = session->box->session->tune(*graph->graph, policy);
    if (!t.ok()) return fail(fn, t.status());
    std::string source = cuda_graph ? "plan cache (tuned in a CUDA graph)" : "plan cache (tuned)";
    if (!t->hit) {
      const fusebox::TuneResult& res = t->result;
      if (!res.winner_run.verified_ok) {
        return fail(FUSEBOX_VERIFICATION_FAILED,
                    std::string(fn) + ": graph '" + graph->graph->name + "': the fastest engine " +
                        t->plan.engine_name() + " failed verification against the reference; nothing stored");
      }
      int timed = 0;
      for (const auto& e : res.entries) timed += e.timed ? 1 : 0;
      source =
          "tuned now (" + std::to_string(timed) + " candidates timed" + (cuda_graph ? " in CUDA graphs" : "");
      if (res.heuristic >= 0 && res.speedup_over_heuristic > 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f", res.speedup_over_heuristic);
        source += std::string(", ") + buf + "x the heuristic choice";
      }
      source += t->stored ? ", stored)" : ")";
    }
    auto h = std::make_unique<fusebox_plan>();
    h->graph = graph->graph;
    h->graph_path = graph->source_path;
    h->box = session->box;
    h->plan = std::make_shared<fusebox::Plan>(std::move(t->plan));
    // The plan report of a tuned plan: the cache's part and the winner's build (when tuned now).
    fusebox::PlanReport report;
    report.source = t->hit ? fusebox::PlanSource::kTunedCache : fusebox::PlanSource::kBuilt;
    report.engine = h->plan->engine_name();
    report.workspace_bytes = h->plan->workspace_bytes();
    report.cache = t->cache;
    report.cache_key = t->cache_key;
    report.stored = t->stored;
    report.lookup_ms = t->lookup_ms;
    report.deserialize_ms = t->deserialize_ms;
    if (!t->hit) report.build = t->result.report;
    h->report_json = fusebox::plan_report_with_build_json(report);
    h->source = std::move(source);
    h->cache = t->cache;
    *out = h.release();
    return FUSEBOX_OK;
  });
}

}  // namespace

fusebox_status fusebox_session_tune(fusebox_session* session, const fusebox_graph* graph,
                                    const fusebox_tune_request* request, fusebox_plan** out) {
  return tune_plan("fusebox_session_tune", session, graph, request, /*cuda_graph=*/false, out);
}

fusebox_status fusebox_session_tune_in_cuda_graph(fusebox_session* session, const fusebox_graph* graph,
                                                  const fusebox_tune_request* request, fusebox_plan** out) {
  return tune_plan("fusebox_session_tune_in_cuda_graph", session, graph, request, /*cuda_graph=*/true, out);
}

// ---------------------------------------------------------------- binding and execution

namespace {

// fusebox_bind and fusebox_bind_with_workspace: `workspace` null binds to
// the session's arena.
fusebox_status bind_plan(const char* fn, fusebox_session* session, const fusebox_plan* plan, size_t count,
                         const char* const* names, void* const* pointers,
                         std::shared_ptr<fusebox::WorkspaceBinding> workspace, fusebox_bound_plan** out) {
  if (!session) return null_arg(fn, "session");
  if (!plan) return null_arg(fn, "plan");
  if (count > 0 && !names) return null_arg(fn, "names");
  if (count > 0 && !pointers) return null_arg(fn, "pointers");
  // Checked here, before the session, so a deviceless caller sees name errors too.
  fusebox_graph view;  // the plan's graph, for its bindable tensors
  view.graph = plan->graph;
  std::set<std::string> expected;
  for (int i = 0; i < static_cast<int>(plan->graph->tensors.size()); ++i) {
    const auto& t = plan->graph->tensors[i];
    if (!t.is_virtual && !t.scalar_value) {
      view.bindable.push_back(i);
      expected.insert(t.name);
    }
  }
  std::map<std::string, void*> buffers;
  for (size_t i = 0; i < count; ++i) {
    if (!names[i]) return null_arg(fn, ("names[" + std::to_string(i) + "]").c_str());
    std::string name = names[i];
    if (!expected.count(name)) {
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": unknown tensor '" + name + "'; graph '" +
                                                plan->graph->name + "' binds " + bindable_names(view));
    }
    if (!pointers[i]) {
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": tensor '" + name + "' has a NULL pointer");
    }
    if (!buffers.emplace(name, pointers[i]).second) {
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": tensor '" + name + "' given twice");
    }
  }
  std::string missing;
  for (const std::string& name : expected) {
    if (!buffers.count(name)) missing += (missing.empty() ? "'" : ", '") + name + "'";
  }
  if (!missing.empty()) {
    return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": no pointer for " + missing + " of graph '" +
                                              plan->graph->name + "' (it binds " + bindable_names(view) +
                                              ")");
  }
  if (session->box->session->deviceless()) {
    return fail(FUSEBOX_NO_DEVICE, std::string(fn) + ": the session is deviceless (built for " +
                                       session->box->session->target().device_name +
                                       "); create one with a device id to run plans");
  }
  Result<fusebox::BoundPlan> bound =
      workspace ? fusebox::BoundPlan::bind(*plan->plan, *session->box->session->context(), buffers,
                                           std::move(workspace))
                : session->box->session->bind(*plan->plan, buffers);
  if (!bound.ok()) return fail(fn, bound.status());
  *out = new fusebox_bound_plan{session->box, plan->plan, std::move(*bound)};
  return FUSEBOX_OK;
}

}  // namespace

fusebox_status fusebox_bind(fusebox_session* session, const fusebox_plan* plan, size_t count,
                            const char* const* names, void* const* pointers, fusebox_bound_plan** out) {
  const char* fn = "fusebox_bind";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    return bind_plan(fn, session, plan, count, names, pointers, nullptr, out);
  });
}

fusebox_status fusebox_bind_with_workspace(fusebox_session* session, const fusebox_plan* plan, size_t count,
                                           const char* const* names, void* const* pointers, void* workspace,
                                           int64_t workspace_bytes, fusebox_bound_plan** out) {
  const char* fn = "fusebox_bind_with_workspace";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!plan) return null_arg(fn, "plan");
    const int64_t need = plan->plan->workspace_bytes();
    if (workspace_bytes < need) {
      return fail(FUSEBOX_INVALID_ARGUMENT,
                  std::string(fn) + ": the plan (engine " + plan->plan->engine_name() + ") needs " +
                      std::to_string(need) + " bytes of workspace; given " + std::to_string(workspace_bytes));
    }
    if (need > 0 && !workspace) {
      return fail(FUSEBOX_INVALID_ARGUMENT,
                  std::string(fn) + ": workspace is NULL; the plan needs " + std::to_string(need) + " bytes");
    }
    auto ws = std::make_shared<fusebox::WorkspaceBinding>();
    ws->ptr = workspace;
    ws->bytes = workspace_bytes;
    return bind_plan(fn, session, plan, count, names, pointers, std::move(ws), out);
  });
}

void fusebox_bound_plan_free(fusebox_bound_plan* bound) { delete bound; }

fusebox_status fusebox_bound_plan_rebind(fusebox_bound_plan* bound, const char* name, void* pointer) {
  const char* fn = "fusebox_bound_plan_rebind";
  return guarded(fn, [&] {
    if (!bound) return null_arg(fn, "bound");
    if (!name) return null_arg(fn, "name");
    if (!pointer)
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": tensor '" + name + "' has a NULL pointer");
    Status st = bound->bound.rebind(std::string_view(name), pointer);
    return st.ok() ? FUSEBOX_OK : fail(fn, st);
  });
}

fusebox_status fusebox_execute(fusebox_bound_plan* bound, void* stream) {
  const char* fn = "fusebox_execute";
  return guarded(fn, [&] {
    if (!bound) return null_arg(fn, "bound");
    fusebox::GpuContext* ctx = bound->box->session->context();
    Status st = ctx->set_stream(stream);
    if (st.ok()) st = bound->bound.execute();
    return st.ok() ? FUSEBOX_OK : fail(fn, st);
  });
}

// ---- (v6) the language model

fusebox_status fusebox_lm_trainer_create(const char* config_path, const char* work_dir, int64_t total_steps,
                                         const char* backend, const char* plan_cache,
                                         fusebox_lm_trainer** out) {
  const char* fn = "fusebox_lm_trainer_create";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!config_path) return null_arg(fn, "config_path");
    if (!work_dir) return null_arg(fn, "work_dir");
    fusebox::LmTrainerOptions o;
    o.work_dir = work_dir;
    o.total_steps = total_steps;
    const std::string b = backend ? backend : "reference";
    if (b != "reference" && b != "gpu")
      return fail(FUSEBOX_INVALID_ARGUMENT,
                  std::string(fn) + ": backend '" + b + "' (accepted: reference, gpu)");
    o.backend = b == "gpu" ? fusebox::TrainBackend::kGpu : fusebox::TrainBackend::kReference;
    o.plan_cache = plan_cache ? plan_cache : "";
    auto cfg = fusebox::load_lm_config(config_path);
    if (!cfg.ok()) return fail(fn, cfg.status());
    auto t = fusebox::LmTrainer::create(*cfg, o);
    if (!t.ok()) return fail(fn, t.status());
    auto h = std::make_unique<fusebox_lm_trainer>();
    h->trainer = std::move(*t);
    *out = h.release();
    return FUSEBOX_OK;
  });
}

void fusebox_lm_trainer_free(fusebox_lm_trainer* trainer) { delete trainer; }

int64_t fusebox_lm_trainer_tokens_per_step(const fusebox_lm_trainer* trainer) {
  if (!trainer) return 0;
  const fusebox::LmConfig& c = trainer->trainer->config();
  return c.train.accum * c.train.batch * c.model.context;
}

int64_t fusebox_lm_trainer_steps_done(const fusebox_lm_trainer* trainer) {
  return trainer ? trainer->trainer->steps_done() : 0;
}

fusebox_status fusebox_lm_trainer_step(fusebox_lm_trainer* trainer, const int32_t* ids, const int32_t* labels,
                                       size_t count, fusebox_lm_step* result) {
  const char* fn = "fusebox_lm_trainer_step";
  return guarded(fn, [&] {
    if (!trainer) return null_arg(fn, "trainer");
    if (!ids || !labels) return null_arg(fn, ids ? "labels" : "ids");
    auto r = trainer->trainer->step_tokens(std::vector<int32_t>(ids, ids + count),
                                           std::vector<int32_t>(labels, labels + count));
    if (!r.ok()) return fail(fn, r.status());
    if (result) {
      result->step = r->step;
      result->loss = r->loss;
      result->grad_norm = r->grad_norm;
      result->lr = r->lr;
      result->seconds = r->seconds;
      result->tokens = r->tokens;
      result->cuda_graph = r->cuda_graph ? 1 : 0;
    }
    return FUSEBOX_OK;
  });
}

fusebox_status fusebox_lm_trainer_save(const fusebox_lm_trainer* trainer, const char* path) {
  const char* fn = "fusebox_lm_trainer_save";
  return guarded(fn, [&] {
    if (!trainer) return null_arg(fn, "trainer");
    if (!path) return null_arg(fn, "path");
    const Status st = trainer->trainer->save_checkpoint(path);
    return st.ok() ? FUSEBOX_OK : fail(fn, st);
  });
}

fusebox_status fusebox_lm_trainer_load(fusebox_lm_trainer* trainer, const char* path) {
  const char* fn = "fusebox_lm_trainer_load";
  return guarded(fn, [&] {
    if (!trainer) return null_arg(fn, "trainer");
    if (!path) return null_arg(fn, "path");
    const Status st = trainer->trainer->load_checkpoint(path);
    return st.ok() ? FUSEBOX_OK : fail(fn, st);
  });
}

fusebox_status fusebox_lm_engine_create(const char* checkpoint, const char* backend, int64_t page_size,
                                        int64_t pool_pages, int64_t max_batch, fusebox_lm_engine** out) {
  return fusebox_lm_engine_create_with_weights(checkpoint, backend, nullptr, page_size, pool_pages, max_batch,
                                               out);
}

fusebox_status fusebox_lm_engine_create_with_weights(const char* checkpoint, const char* backend,
                                                     const char* weights, int64_t page_size,
                                                     int64_t pool_pages, int64_t max_batch,
                                                     fusebox_lm_engine** out) {
  return fusebox_lm_engine_create_with_options(checkpoint, backend, weights, page_size, pool_pages, max_batch,
                                               0, out);
}

fusebox_status fusebox_lm_engine_create_with_options(const char* checkpoint, const char* backend,
                                                     const char* weights, int64_t page_size,
                                                     int64_t pool_pages, int64_t max_batch, int deterministic,
                                                     fusebox_lm_engine** out) {
  return fusebox_lm_engine_create_with_kv_cache(checkpoint, backend, weights, nullptr, page_size, pool_pages,
                                                max_batch, deterministic, out);
}

fusebox_status fusebox_lm_engine_create_with_kv_cache(const char* checkpoint, const char* backend,
                                                      const char* weights, const char* kv_cache,
                                                      int64_t page_size, int64_t pool_pages,
                                                      int64_t max_batch, int deterministic,
                                                      fusebox_lm_engine** out) {
  const char* fn = "fusebox_lm_engine_create";
  return guarded(fn, [&] {
    if (!out) return null_arg(fn, "out");
    *out = nullptr;
    if (!checkpoint) return null_arg(fn, "checkpoint");
    const std::string b = backend ? backend : "reference";
    if (b != "reference" && b != "gpu")
      return fail(FUSEBOX_INVALID_ARGUMENT,
                  std::string(fn) + ": backend '" + b + "' (accepted: reference, gpu)");
    const std::string w = weights ? weights : "bf16";
    if (w != "bf16" && w != "fp8" && w != "fp8-tensor")
      return fail(FUSEBOX_INVALID_ARGUMENT,
                  std::string(fn) + ": weights '" + w + "' (accepted: bf16, fp8, fp8-tensor)");
    const std::string kv = kv_cache ? kv_cache : "bf16";
    if (kv != "bf16" && kv != "fp8")
      return fail(FUSEBOX_INVALID_ARGUMENT,
                  std::string(fn) + ": kv_cache '" + kv + "' (accepted: bf16, fp8)");
    auto cfg = fusebox::lm_checkpoint_config(checkpoint);
    if (!cfg.ok()) return fail(fn, cfg.status());
    fusebox::EngineOptions o;
    o.fp8_kv = kv == "fp8";
    o.backend = b == "gpu" ? fusebox::ServeBackend::kGpu : fusebox::ServeBackend::kReference;
    o.weights = w == "fp8"          ? fusebox::ServeWeights::kFP8Channel
                : w == "fp8-tensor" ? fusebox::ServeWeights::kFP8Tensor
                                    : fusebox::ServeWeights::kBF16;
    o.page_size = page_size;
    o.pool_pages = pool_pages;
    o.max_batch = max_batch;
    o.deterministic = deterministic != 0;
    auto e = fusebox::LmEngine::create(*cfg, checkpoint, o);
    if (!e.ok()) return fail(fn, e.status());
    auto h = std::make_unique<fusebox_lm_engine>();
    h->engine = std::move(*e);
    h->max_batch = max_batch;
    *out = h.release();
    return FUSEBOX_OK;
  });
}

void fusebox_lm_engine_free(fusebox_lm_engine* engine) { delete engine; }

fusebox_status fusebox_lm_engine_add(fusebox_lm_engine* engine, const int32_t* prompt, size_t length,
                                     int64_t max_new_tokens, double temperature, int64_t top_k, double top_p,
                                     uint64_t seed, int32_t stop_token, int64_t* id) {
  const char* fn = "fusebox_lm_engine_add";
  return guarded(fn, [&] {
    if (!engine) return null_arg(fn, "engine");
    if (!prompt && length) return null_arg(fn, "prompt");
    fusebox::LmRequest r;
    r.prompt.assign(prompt, prompt + length);
    r.max_new_tokens = max_new_tokens;
    r.sampling = {temperature, top_k, top_p, seed};
    r.stop_token = stop_token;
    auto i = engine->engine->add_request(r);
    if (!i.ok()) return fail(fn, i.status());
    if (id) *id = *i;
    return FUSEBOX_OK;
  });
}

fusebox_status fusebox_lm_engine_step(fusebox_lm_engine* engine, fusebox_lm_token* tokens, size_t capacity,
                                      size_t* count) {
  const char* fn = "fusebox_lm_engine_step";
  return guarded(fn, [&] {
    if (!engine) return null_arg(fn, "engine");
    if (!count) return null_arg(fn, "count");
    *count = 0;
    if (!tokens) return null_arg(fn, "tokens");
    // Checked before stepping: a step's tokens are never lost for want of room.
    if (capacity < static_cast<size_t>(engine->max_batch))
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": capacity " + std::to_string(capacity) +
                                                " is below the engine's max_batch " +
                                                std::to_string(engine->max_batch));
    auto ev = engine->engine->step();
    if (!ev.ok()) return fail(fn, ev.status());
    if (ev->size() > capacity)
      return fail(FUSEBOX_INVALID_ARGUMENT, std::string(fn) + ": " + std::to_string(ev->size()) +
                                                " tokens, capacity " + std::to_string(capacity) +
                                                " (give max_batch entries); this step's tokens are lost");
    for (size_t i = 0; i < ev->size(); ++i)
      tokens[i] = {(*ev)[i].request, (*ev)[i].token, (*ev)[i].finished ? 1 : 0};
    *count = ev->size();
    return FUSEBOX_OK;
  });
}

int fusebox_lm_engine_idle(const fusebox_lm_engine* engine) {
  return !engine || engine->engine->idle() ? 1 : 0;
}

}  // extern "C"
