/* fusebox C API (C99): load a graph, get a plan through a session, bind
 * device pointers by tensor name, execute on a CUDA stream. The stable ABI
 * other languages bind to; libfusebox.so implements it over the C++ API and
 * no exception crosses it. Guide: docs/c-api.md.
 *
 * Every fallible call returns a fusebox_status; on an error the calling
 * thread's fusebox_last_error() says what and where (e.g.
 * "fusebox_bind: unknown tensor 'q'; the plan's tensors are b, w, x, y").
 * Output handles are set only on success (NULL otherwise).
 *
 * Handles: a graph is checked when it is created; a session owns one GPU
 * (or, deviceless, a device-properties file to build plans for); a plan is
 * built or fetched for one graph; a bound plan is a plan with a pointer for
 * every graph tensor. Each handle keeps what it needs alive (a bound plan its
 * plan and session, a plan its graph), so they may be freed in any order.
 * A session and its plans are not thread-safe: one thread at a time. */
#ifndef FUSEBOX_FUSEBOX_H_
#define FUSEBOX_FUSEBOX_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The C API's version: bumped when a declaration here changes. Additions
 * only: version 2 added the calls marked "(v2)", version 3 those marked
 * "(v3)", version 4 those marked "(v4)"; a program built against an earlier version runs unchanged. */
#define FUSEBOX_C_API_VERSION 9

typedef enum fusebox_status {
  FUSEBOX_OK = 0,
  FUSEBOX_INVALID_ARGUMENT = 1,    /* a NULL handle, an unknown tensor, a bad graph or option */
  FUSEBOX_PARSE_ERROR = 2,         /* JSON text or a file could not be parsed */
  FUSEBOX_NOT_SUPPORTED = 3,       /* valid, but no cuDNN engine accepts it */
  FUSEBOX_IO_ERROR = 4,            /* a file could not be read or written */
  FUSEBOX_CUDNN_ERROR = 5,         /* cuDNN or the cuDNN Frontend reported an error */
  FUSEBOX_CUDA_ERROR = 6,          /* the CUDA runtime reported an error */
  FUSEBOX_NO_DEVICE = 7,           /* a GPU is needed and none is there (or the session is deviceless) */
  FUSEBOX_VERSION_MISMATCH = 8,    /* the loaded cuDNN is older than the one fusebox was built with */
  FUSEBOX_VERIFICATION_FAILED = 9, /* outputs did not match the reference */
  FUSEBOX_INTERNAL = 10,           /* a fusebox bug */
  FUSEBOX_OUT_OF_MEMORY = 11       /* host memory ran out */
} fusebox_status;

typedef struct fusebox_graph fusebox_graph;
typedef struct fusebox_session fusebox_session;
typedef struct fusebox_plan fusebox_plan;
typedef struct fusebox_bound_plan fusebox_bound_plan;

/* ---- versions and errors */

/* The library's version, e.g. "0.1.0". */
const char* fusebox_version(void);
/* FUSEBOX_C_API_VERSION of the library loaded (compare with the header's). */
int fusebox_c_api_version(void);
/* "Ok", "InvalidArgument", ... ("Unknown" for a value not in the enum). */
const char* fusebox_status_name(fusebox_status status);
/* The message of the last call on this thread that failed ("" if none).
 * Valid until the next failing call on this thread. */
const char* fusebox_last_error(void);
/* The code of that call (FUSEBOX_OK if none). */
fusebox_status fusebox_last_status(void);

/* ---- graphs (docs/graph-format.md) */

/* Parses and checks a graph (shapes, strides and dtypes inferred).
 * `json` need not be NUL-terminated: `length` bytes are read. */
fusebox_status fusebox_graph_from_json(const char* json, size_t length, fusebox_graph** out);
fusebox_status fusebox_graph_load(const char* path, fusebox_graph** out);
void fusebox_graph_free(fusebox_graph* graph);

const char* fusebox_graph_name(const fusebox_graph* graph);
/* A readable listing of tensors and ops, as `fusebox check` prints. */
const char* fusebox_graph_describe(const fusebox_graph* graph);

/* The backward graph of `graph` by the ops' gradient rules (docs/training.md), in
 * *out (free it with fusebox_graph_free). `wrt`: the forward inputs to differentiate,
 * comma-separated; `seeds`: the forward outputs whose gradients come in; NULL or ""
 * for the defaults. FUSEBOX_NOT_SUPPORTED names an op without a rule and what would
 * work. (C API 5) */
fusebox_status fusebox_graph_backward(const fusebox_graph* graph, const char* wrt, const char* seeds,
                                      fusebox_graph** out);
/* For a graph made by fusebox_graph_backward: the graph as JSON text (a graph file),
 * and its bindings to the forward as JSON (where each input comes from, which output
 * holds each gradient, what is saved and recomputed). "" for other graphs. */
const char* fusebox_graph_backward_json(const fusebox_graph* graph);
const char* fusebox_graph_backward_bindings(const fusebox_graph* graph);

typedef enum fusebox_tensor_kind {
  FUSEBOX_TENSOR_INPUT = 0, /* the caller supplies it */
  FUSEBOX_TENSOR_OUTPUT = 1 /* an op writes it */
} fusebox_tensor_kind;

/* One tensor the caller binds (virtual tensors and by-value scalars are not
 * listed). Pointers are valid while the graph lives. */
typedef struct fusebox_tensor_info {
  const char* name;
  fusebox_tensor_kind kind;
  const char* dtype; /* "bf16", "fp16", "fp32", "fp8_e4m3", ... */
  int rank;
  const int64_t* dims;    /* rank values, logical order */
  const int64_t* strides; /* rank values, in elements */
  int64_t bytes;          /* the device memory it spans */
} fusebox_tensor_info;

/* The tensors to bind, in the graph's order: indices 0 .. count-1. */
size_t fusebox_graph_tensor_count(const fusebox_graph* graph);
fusebox_status fusebox_graph_tensor(const fusebox_graph* graph, size_t index, fusebox_tensor_info* info);
/* (v2) The same by name; an unknown name (or a virtual tensor, or a by-value
 * scalar) is FUSEBOX_INVALID_ARGUMENT, and the message lists the names. */
fusebox_status fusebox_graph_find_tensor(const fusebox_graph* graph, const char* name,
                                         fusebox_tensor_info* info);

/* ---- sessions */

/* device_properties_file NULL: a session on GPU `device_id` (its own cuDNN
 * handle and stream); otherwise a deviceless session that builds plans for
 * the GPU that file describes (e.g. devices/h200-cudnn-9.27.devprop) and
 * cannot bind or run them. cache_path NULL: no plan cache; otherwise the
 * SQLite plan cache there (created if missing), as `fusebox --cache`. */
fusebox_status fusebox_session_create(int device_id, const char* device_properties_file,
                                      const char* cache_path, fusebox_session** out);
void fusebox_session_free(fusebox_session* session);
/* 1 for a deviceless session, 0 for a GPU one, -1 for NULL. */
int fusebox_session_deviceless(const fusebox_session* session);
/* The target GPU's name, e.g. "NVIDIA H200". */
const char* fusebox_session_device_name(const fusebox_session* session);
/* (v2) The CUDA device id of a GPU session; -1 for a deviceless one or NULL. */
int fusebox_session_device_id(const fusebox_session* session);

/* ---- plans */

/* How a plan is found (the session's plan policy, docs/architecture.md). */
typedef struct fusebox_plan_request {
  const char* plan_file;       /* non-NULL: load this plan file, nothing else */
  const char* engine;          /* non-NULL: pin this engine by name */
  const char* heuristics;      /* non-NULL: pinned modes, e.g. "a" or "a,b"; NULL: a, then b, then fallback */
  int64_t max_workspace_bytes; /* -1: no limit */
  int use_tuned_cache;         /* nonzero: a tuned cache entry wins */
} fusebox_plan_request;

/* The default request: a tuned cache entry, then a heuristic cache entry,
 * then a build trying heuristic modes a, b and fallback in turn. */
fusebox_plan_request fusebox_plan_request_default(void);

/* request NULL: the default. */
fusebox_status fusebox_session_get_plan(fusebox_session* session, const fusebox_graph* graph,
                                        const fusebox_plan_request* request, fusebox_plan** out);
void fusebox_plan_free(fusebox_plan* plan);
/* The engine and knobs, e.g. "eng41_k2=4_k13=0_k18=0_k25=1_k27=7_k28=1". */
const char* fusebox_plan_engine(const fusebox_plan* plan);
int64_t fusebox_plan_workspace_bytes(const fusebox_plan* plan);
/* Where it came from: "built now", "plan cache (heuristic)", "plan file (built deviceless)", ... */
const char* fusebox_plan_source(const fusebox_plan* plan);
/* Writes the plan file `fusebox run --plan` and plan_file requests read. */
fusebox_status fusebox_plan_save(const fusebox_plan* plan, const char* path);
/* (v2) The plan cache's part: "hit", "miss" (looked up, then built or tuned)
 * or "off" (no cache, or a plan file). */
const char* fusebox_plan_cache_result(const fusebox_plan* plan);
/* (v4) The plan's report as one JSON object (UTF-8, owned by the plan): the
 * document `fusebox build --json` prints under "plan" (source, cache, plan
 * check, partition, ...) with the serving build's five steps as "build"
 * (docs/c-api.md). The CLI and Python print the same serializer's output. */
const char* fusebox_plan_report_json(const fusebox_plan* plan);

/* (v2) Autotuning (GPU sessions only): every admissible candidate is built
 * and timed on the session's GPU, the fastest is verified against the
 * reference and stored in the session's plan cache, where a later
 * fusebox_session_get_plan (use_tuned_cache) finds it. A tuned entry already
 * in the cache is returned without tuning ("plan cache (tuned)"). */
typedef struct fusebox_tune_request {
  const char* heuristics;      /* NULL: "a,b,fallback" (the candidates of every mode) */
  int warmup;                  /* untimed executions per candidate (default 5) */
  int iters;                   /* timed executions per candidate (default 20) */
  int64_t max_workspace_bytes; /* -1: no limit */
  int top_k;                   /* >0: time only the first K admissible candidates */
  double budget_ms;            /* >0: stop timing once this much wall time is spent */
  int deterministic_only;      /* nonzero: drop non-deterministic candidates */
} fusebox_tune_request;

fusebox_tune_request fusebox_tune_request_default(void);
/* request NULL: the default. A deviceless session is FUSEBOX_NO_DEVICE; a
 * winner that fails verification is FUSEBOX_VERIFICATION_FAILED (nothing is
 * stored). fusebox_plan_source says "tuned now (N candidates timed, ...)"
 * or "plan cache (tuned)". */
fusebox_status fusebox_session_tune(fusebox_session* session, const fusebox_graph* graph,
                                    const fusebox_tune_request* request, fusebox_plan** out);
/* (v3) The same, each candidate timed as GPU time per execute inside a CUDA
 * graph of `iters` executes, replayed (for plans the caller replays in CUDA
 * graphs, e.g. inside torch.cuda.graph: small graphs rank differently than
 * eager). Its winner is cached apart from the eager-timed one; a later call
 * returns it as "plan cache (tuned in a CUDA graph)". */
fusebox_status fusebox_session_tune_in_cuda_graph(fusebox_session* session, const fusebox_graph* graph,
                                                  const fusebox_tune_request* request, fusebox_plan** out);

/* ---- binding and execution (GPU sessions only) */

/* Binds every tensor of the graph (fusebox_graph_tensor) to a device
 * pointer: names[i] -> pointers[i] for i < count. A missing, unknown or
 * repeated name, or a NULL pointer, is FUSEBOX_INVALID_ARGUMENT. */
fusebox_status fusebox_bind(fusebox_session* session, const fusebox_plan* plan, size_t count,
                            const char* const* names, void* const* pointers, fusebox_bound_plan** out);
/* (v2) The same, executing with the caller's workspace instead of the
 * session's arena: `workspace` must hold at least `workspace_bytes` bytes and
 * workspace_bytes must be at least fusebox_plan_workspace_bytes (NULL and 0
 * when the plan needs none). Nothing is allocated and nothing waits for the
 * GPU (safe while a stream is being captured into a CUDA graph); the caller
 * keeps the workspace alive, and unused by other work, while executes of the
 * bound plan are pending. */
fusebox_status fusebox_bind_with_workspace(fusebox_session* session, const fusebox_plan* plan, size_t count,
                                           const char* const* names, void* const* pointers, void* workspace,
                                           int64_t workspace_bytes, fusebox_bound_plan** out);
void fusebox_bound_plan_free(fusebox_bound_plan* bound);
/* Points one tensor elsewhere (cheap: no rebuild at execute). */
fusebox_status fusebox_bound_plan_rebind(fusebox_bound_plan* bound, const char* name, void* pointer);
/* Enqueues one execution on `stream` (a cudaStream_t; NULL: CUDA's default
 * stream) and returns without waiting. Plans bound by fusebox_bind share the
 * session's workspace: their executes on different streams must not overlap
 * (fusebox_bind_with_workspace gives each its own). */
fusebox_status fusebox_execute(fusebox_bound_plan* bound, void* stream);

/* ---- (v6) training and serving the language model of docs/lm.md (docs/training.md,
 * docs/serving.md). backend: "reference" (the CPU reference: small models) or "gpu". */

typedef struct fusebox_lm_trainer fusebox_lm_trainer;
typedef struct fusebox_lm_engine fusebox_lm_engine;

typedef struct {
  int64_t step;     /* the optimizer step just taken (from 0) */
  double loss;      /* mean over its micro-batches */
  double grad_norm; /* before clipping */
  double lr;
  double seconds;
  int64_t tokens;
  int cuda_graph; /* nonzero: replayed as one CUDA graph (gpu) */
} fusebox_lm_step;

/* The model and optimizer config (a JSON file); the generated pipelines go to work_dir;
 * total_steps is the schedule's length; plan_cache: a plan cache file or NULL (gpu). */
fusebox_status fusebox_lm_trainer_create(const char* config_path, const char* work_dir, int64_t total_steps,
                                         const char* backend, const char* plan_cache,
                                         fusebox_lm_trainer** out);
void fusebox_lm_trainer_free(fusebox_lm_trainer* trainer);
/* The ids and labels one step takes: accum x batch x context each. */
int64_t fusebox_lm_trainer_tokens_per_step(const fusebox_lm_trainer* trainer);
int64_t fusebox_lm_trainer_steps_done(const fusebox_lm_trainer* trainer);
/* One optimizer step on `count` ids and labels (fusebox_lm_trainer_tokens_per_step). A
 * non-finite loss or gradient is an error naming the step; nothing changes then. */
fusebox_status fusebox_lm_trainer_step(fusebox_lm_trainer* trainer, const int32_t* ids, const int32_t* labels,
                                       size_t count, fusebox_lm_step* result);
/* Checkpoints (safetensors, docs/lm.md): written through a temporary file; loading refuses
 * another model config, naming the first mismatched tensor. */
fusebox_status fusebox_lm_trainer_save(const fusebox_lm_trainer* trainer, const char* path);
fusebox_status fusebox_lm_trainer_load(fusebox_lm_trainer* trainer, const char* path);

/* The serving engine over a checkpoint (its metadata holds the config). */
fusebox_status fusebox_lm_engine_create(const char* checkpoint, const char* backend, int64_t page_size,
                                        int64_t pool_pages, int64_t max_batch, fusebox_lm_engine** out);
/* Version 7: the same with the layers' weights "bf16" (NULL too), "fp8" (e4m3, a scale per output
 * channel) or "fp8-tensor" (one scale per matrix); docs/serving.md. */
fusebox_status fusebox_lm_engine_create_with_weights(const char* checkpoint, const char* backend,
                                                     const char* weights, int64_t page_size,
                                                     int64_t pool_pages, int64_t max_batch,
                                                     fusebox_lm_engine** out);
/* Version 8: the same with `deterministic` nonzero: a request's tokens do not depend on the
 * requests beside it, bit for bit (slower; bf16 weights; docs/serving.md, "Deterministic mode"). */
fusebox_status fusebox_lm_engine_create_with_options(const char* checkpoint, const char* backend,
                                                     const char* weights, int64_t page_size,
                                                     int64_t pool_pages, int64_t max_batch, int deterministic,
                                                     fusebox_lm_engine** out);
/* Version 9: the same with the KV cache `kv_cache` "bf16" (NULL too) or "fp8" (e4m3 with an fp32
 * descale per token and KV head; docs/serving.md, "FP8 KV cache"). */
fusebox_status fusebox_lm_engine_create_with_kv_cache(const char* checkpoint, const char* backend,
                                                      const char* weights, const char* kv_cache,
                                                      int64_t page_size, int64_t pool_pages,
                                                      int64_t max_batch, int deterministic,
                                                      fusebox_lm_engine** out);
void fusebox_lm_engine_free(fusebox_lm_engine* engine);
/* Queues a request (temperature 0: greedy; top_k 0 and top_p 1: all; stop_token -1: none). */
fusebox_status fusebox_lm_engine_add(fusebox_lm_engine* engine, const int32_t* prompt, size_t length,
                                     int64_t max_new_tokens, double temperature, int64_t top_k, double top_p,
                                     uint64_t seed, int32_t stop_token, int64_t* id);
typedef struct {
  int64_t request;
  int32_t token;
  int finished;
} fusebox_lm_token;
/* One engine step; its tokens into `tokens` (at most `capacity`: one per running request, so
 * max_batch is enough), their number into `count`. */
fusebox_status fusebox_lm_engine_step(fusebox_lm_engine* engine, fusebox_lm_token* tokens, size_t capacity,
                                      size_t* count);
/* Nonzero when nothing waits or runs. */
int fusebox_lm_engine_idle(const fusebox_lm_engine* engine);

#ifdef __cplusplus
}
#endif

#endif /* FUSEBOX_FUSEBOX_H_ */
