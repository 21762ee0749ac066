/* The C API from C99 (include/fusebox/fusebox.h): a deviceless plan build
 * for the H200, the error paths (bad JSON, an invalid graph, unknown and
 * missing tensor names, NULL handles), and on a GPU a run whose output is
 * checked (skipped, with a message, without one). Prints "FAIL: ..." and
 * exits 1 on any failed check. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusebox/fusebox.h"

static int failures = 0;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      ++failures;                                          \
      printf("FAIL (line %d): %s: ", __LINE__, #cond);     \
      printf(__VA_ARGS__);                                 \
      printf(" [last error: %s]\n", fusebox_last_error()); \
    }                                                      \
  } while (0)

/* A small conv + bias + relu: every value of the output is known when x and
 * w are all 1 and b is all -4 (below). */
static const char kGraphJson[] =
    "{\"name\": \"capi_conv_bias_relu\", \"io_dtype\": \"bf16\", \"intermediate_dtype\": \"fp32\","
    " \"compute_dtype\": \"fp32\","
    " \"tensors\": ["
    "  {\"name\": \"x\", \"dims\": [2, 64, 8, 8], \"layout\": \"nhwc\"},"
    "  {\"name\": \"w\", \"dims\": [64, 64, 3, 3], \"layout\": \"nhwc\"},"
    "  {\"name\": \"b\", \"dims\": [1, 64, 1, 1], \"layout\": \"nhwc\"},"
    "  {\"name\": \"y\", \"layout\": \"nhwc\"}],"
    " \"ops\": ["
    "  {\"op\": \"conv_fprop\", \"name\": \"conv1\", \"inputs\": {\"x\": \"x\", \"w\": \"w\"},"
    "   \"outputs\": {\"y\": \"conv_out\"}, \"padding\": [1, 1], \"stride\": [1, 1], \"dilation\": [1, 1]},"
    "  {\"op\": \"bias_add\", \"name\": \"bias\", \"inputs\": {\"x\": \"conv_out\", \"bias\": \"b\"},"
    "   \"outputs\": {\"y\": \"biased\"}},"
    "  {\"op\": \"relu\", \"name\": \"act\", \"inputs\": {\"x\": \"biased\"}, \"outputs\": {\"y\": \"y\"}}]}";

static fusebox_graph* load_example(void) {
  fusebox_graph* g = NULL;
  fusebox_status st = fusebox_graph_from_json(kGraphJson, strlen(kGraphJson), &g);
  CHECK(st == FUSEBOX_OK && g != NULL, "the test graph loads (%s)", fusebox_status_name(st));
  return g;
}

/* The backward graph (C API 5): conv + bias + relu gives dgrad, wgrad and the bias sum. */
static void test_backward(void) {
  fusebox_graph* g = load_example();
  fusebox_graph* b = NULL;
  fusebox_tensor_info info;
  fusebox_status st;
  if (!g) return;
  st = fusebox_graph_backward(g, NULL, NULL, &b);
  CHECK(st == FUSEBOX_OK && b != NULL, "backward derived (%s: %s)", fusebox_status_name(st),
        fusebox_last_error());
  if (b) {
    CHECK(fusebox_graph_find_tensor(b, "x.grad", &info) == FUSEBOX_OK && info.kind == FUSEBOX_TENSOR_OUTPUT,
          "x.grad is an output");
    CHECK(fusebox_graph_find_tensor(b, "y.grad", &info) == FUSEBOX_OK && info.kind == FUSEBOX_TENSOR_INPUT,
          "y.grad is an input");
    CHECK(strstr(fusebox_graph_backward_bindings(b), "\"gradient\"") != NULL, "bindings: %s",
          fusebox_graph_backward_bindings(b));
    CHECK(strstr(fusebox_graph_backward_json(b), "conv_wgrad") != NULL, "the graph has a wgrad");
    fusebox_graph_free(b);
  }
  b = NULL;
  st = fusebox_graph_backward(g, "nosuch", NULL, &b);
  CHECK(st == FUSEBOX_INVALID_ARGUMENT && b == NULL && strstr(fusebox_last_error(), "wrt 'nosuch'") != NULL,
        "a wrong wrt is refused: %s", fusebox_last_error());
  CHECK(strcmp(fusebox_graph_backward_json(g), "") == 0, "a loaded graph has no backward JSON");
  fusebox_graph_free(g);
}

static void test_versions(void) {
  CHECK(fusebox_c_api_version() == FUSEBOX_C_API_VERSION, "library C API %d, header %d",
        fusebox_c_api_version(), FUSEBOX_C_API_VERSION);
  CHECK(strcmp(fusebox_version(), "0.1.0") == 0, "version %s", fusebox_version());
  CHECK(strcmp(fusebox_status_name(FUSEBOX_PARSE_ERROR), "ParseError") == 0, "%s",
        fusebox_status_name(FUSEBOX_PARSE_ERROR));
  printf("fusebox %s, C API %d\n", fusebox_version(), fusebox_c_api_version());
}

static void test_graph(void) {
  fusebox_graph* g = load_example();
  fusebox_tensor_info info;
  size_t i;
  if (!g) return;
  CHECK(strcmp(fusebox_graph_name(g), "capi_conv_bias_relu") == 0, "name %s", fusebox_graph_name(g));
  CHECK(fusebox_graph_tensor_count(g) == 4, "%u tensors to bind", (unsigned)fusebox_graph_tensor_count(g));
  for (i = 0; i < fusebox_graph_tensor_count(g); ++i) {
    CHECK(fusebox_graph_tensor(g, i, &info) == FUSEBOX_OK, "tensor %u", (unsigned)i);
    if (strcmp(info.name, "y") == 0) {
      CHECK(info.kind == FUSEBOX_TENSOR_OUTPUT, "y is an output");
      CHECK(
          info.rank == 4 && info.dims[0] == 2 && info.dims[1] == 64 && info.dims[2] == 8 && info.dims[3] == 8,
          "y's inferred dims");
      CHECK(info.strides[1] == 1, "y is nhwc (C stride %lld)", (long long)info.strides[1]);
      CHECK(strcmp(info.dtype, "bf16") == 0 && info.bytes == 2 * 64 * 8 * 8 * 2, "y: %s, %lld bytes",
            info.dtype, (long long)info.bytes);
    }
  }
  CHECK(fusebox_graph_tensor(g, 4, &info) == FUSEBOX_INVALID_ARGUMENT, "index 4 is out of range");
  CHECK(strstr(fusebox_last_error(), "out of range") != NULL, "message: %s", fusebox_last_error());
  /* (v2) by name */
  CHECK(fusebox_graph_find_tensor(g, "w", &info) == FUSEBOX_OK && strcmp(info.name, "w") == 0 &&
            info.kind == FUSEBOX_TENSOR_INPUT && info.rank == 4 && info.dims[0] == 64,
        "find_tensor w");
  CHECK(fusebox_graph_find_tensor(g, "conv_out", &info) == FUSEBOX_INVALID_ARGUMENT,
        "virtual tensor not bindable");
  CHECK(strstr(fusebox_last_error(), "binds no tensor 'conv_out'; it binds x, w, b, y") != NULL,
        "message: %s", fusebox_last_error());
  CHECK(fusebox_graph_find_tensor(g, NULL, &info) == FUSEBOX_INVALID_ARGUMENT, "NULL name");
  CHECK(strstr(fusebox_graph_describe(g), "conv_fprop") != NULL, "describe lists the ops");
  fusebox_graph_free(g);

  /* From a file: the repository's example. */
  g = NULL;
  CHECK(fusebox_graph_load(FUSEBOX_SOURCE_DIR "/examples/graphs/conv_bias_relu.json", &g) == FUSEBOX_OK,
        "example file loads");
  fusebox_graph_free(g);
}

static void test_errors(void) {
  fusebox_graph* g = (fusebox_graph*)1; /* must be reset to NULL on failure */
  fusebox_status st;
  const char bad[] = "{\"name\": \"broken\", \"tensors\": [";
  const char* names[1];
  void* ptrs[1];
  fusebox_bound_plan* bound = NULL;

  st = fusebox_graph_from_json(bad, strlen(bad), &g);
  CHECK(st == FUSEBOX_PARSE_ERROR, "bad JSON: %s", fusebox_status_name(st));
  CHECK(g == NULL, "no graph on failure");
  CHECK(fusebox_last_status() == FUSEBOX_PARSE_ERROR, "last status");
  CHECK(strncmp(fusebox_last_error(), "fusebox_graph_from_json: ", 25) == 0, "message says where: %s",
        fusebox_last_error());
  printf("bad JSON -> %s: %s\n", fusebox_status_name(st), fusebox_last_error());

  st = fusebox_graph_load(FUSEBOX_SOURCE_DIR "/examples/graphs/invalid_shapes.json", &g);
  CHECK(st == FUSEBOX_INVALID_ARGUMENT, "invalid graph: %s", fusebox_status_name(st));
  CHECK(strstr(fusebox_last_error(), "[conv_fprop") != NULL, "message names the op: %s",
        fusebox_last_error());
  printf("invalid graph -> %s: %s\n", fusebox_status_name(st), fusebox_last_error());

  st = fusebox_graph_load(FUSEBOX_SOURCE_DIR "/no/such/graph.json", &g);
  CHECK(st == FUSEBOX_IO_ERROR, "missing file: %s", fusebox_status_name(st));

  /* NULL handles and arguments: an error, never a crash. */
  CHECK(fusebox_graph_from_json(NULL, 0, &g) == FUSEBOX_INVALID_ARGUMENT, "NULL json");
  CHECK(strstr(fusebox_last_error(), "json is NULL") != NULL, "%s", fusebox_last_error());
  CHECK(fusebox_graph_load("x.json", NULL) == FUSEBOX_INVALID_ARGUMENT, "NULL out");
  CHECK(fusebox_session_get_plan(NULL, NULL, NULL, NULL) == FUSEBOX_INVALID_ARGUMENT, "NULL everything");
  names[0] = "x";
  ptrs[0] = (void*)16;
  CHECK(fusebox_bind(NULL, NULL, 1, names, ptrs, &bound) == FUSEBOX_INVALID_ARGUMENT, "NULL session");
  CHECK(bound == NULL, "no bound plan");
  CHECK(fusebox_execute(NULL, NULL) == FUSEBOX_INVALID_ARGUMENT, "NULL bound plan");
  CHECK(strcmp(fusebox_last_error(), "fusebox_execute: bound is NULL") == 0, "%s", fusebox_last_error());
  CHECK(fusebox_bound_plan_rebind(NULL, "x", ptrs[0]) == FUSEBOX_INVALID_ARGUMENT, "NULL bound plan");
  CHECK(fusebox_graph_tensor(NULL, 0, NULL) == FUSEBOX_INVALID_ARGUMENT, "NULL graph");
  CHECK(fusebox_plan_save(NULL, "p.plan") == FUSEBOX_INVALID_ARGUMENT, "NULL plan");
  CHECK(fusebox_graph_name(NULL) == NULL && fusebox_plan_engine(NULL) == NULL, "NULL getters");
  CHECK(fusebox_session_deviceless(NULL) == -1, "NULL session");
  CHECK(fusebox_session_device_id(NULL) == -1 && fusebox_plan_cache_result(NULL) == NULL,
        "NULL getters (v2)");
  CHECK(fusebox_session_tune(NULL, NULL, NULL, NULL) == FUSEBOX_INVALID_ARGUMENT, "NULL tune");
  CHECK(fusebox_session_tune_in_cuda_graph(NULL, NULL, NULL, NULL) == FUSEBOX_INVALID_ARGUMENT,
        "NULL tune in a CUDA graph");
  CHECK(fusebox_bind_with_workspace(NULL, NULL, 0, NULL, NULL, NULL, 0, &bound) == FUSEBOX_INVALID_ARGUMENT &&
            bound == NULL,
        "NULL bind_with_workspace");
  {
    fusebox_tune_request tr = fusebox_tune_request_default();
    CHECK(tr.heuristics == NULL && tr.warmup == 5 && tr.iters == 20 && tr.max_workspace_bytes == -1 &&
              tr.top_k == 0 && tr.deterministic_only == 0,
          "tune request defaults");
  }
  fusebox_graph_free(NULL);
  fusebox_session_free(NULL);
  fusebox_plan_free(NULL);
  fusebox_bound_plan_free(NULL);

  st = fusebox_session_create(0, FUSEBOX_SOURCE_DIR "/no/such.devprop", NULL, NULL);
  CHECK(st == FUSEBOX_INVALID_ARGUMENT, "NULL out: %s", fusebox_status_name(st));
  {
    fusebox_session* s = NULL;
    st = fusebox_session_create(0, FUSEBOX_SOURCE_DIR "/no/such.devprop", NULL, &s);
    CHECK(st == FUSEBOX_IO_ERROR && s == NULL, "missing device file: %s", fusebox_status_name(st));
    printf("missing device file -> %s: %s\n", fusebox_status_name(st), fusebox_last_error());
  }
}

/* The deviceless build, then binding errors on the deviceless session. */
static void test_deviceless(const char* plan_path) {
  fusebox_graph* g = load_example();
  fusebox_session* s = NULL;
  fusebox_plan* p = NULL;
  fusebox_plan_request req = fusebox_plan_request_default();
  fusebox_bound_plan* bound = NULL;
  const char* names[4] = {"x", "w", "b", "q"};
  void* ptrs[4] = {(void*)256, (void*)512, (void*)768, (void*)1024};
  fusebox_status st;
  if (!g) return;

  st = fusebox_session_create(0, FUSEBOX_DEVPROP, NULL, &s);
  CHECK(st == FUSEBOX_OK && s != NULL, "deviceless session: %s", fusebox_status_name(st));
  if (!s) goto done;
  CHECK(fusebox_session_deviceless(s) == 1, "deviceless");
  st = fusebox_session_get_plan(s, g, NULL, &p);
  CHECK(st == FUSEBOX_OK && p != NULL, "deviceless plan: %s", fusebox_status_name(st));
  if (!p) goto done;
  printf("deviceless plan for %s: engine %s, workspace %lld B, %s\n", fusebox_session_device_name(s),
         fusebox_plan_engine(p), (long long)fusebox_plan_workspace_bytes(p), fusebox_plan_source(p));
  CHECK(strncmp(fusebox_plan_engine(p), "eng", 3) == 0, "an engine name: %s", fusebox_plan_engine(p));
  CHECK(strcmp(fusebox_plan_source(p), "built now") == 0, "source: %s", fusebox_plan_source(p));
  CHECK(fusebox_plan_save(p, plan_path) == FUSEBOX_OK, "plan file written");

  /* The plan file again, through a request. */
  {
    fusebox_plan* again = NULL;
    req.plan_file = plan_path;
    st = fusebox_session_get_plan(s, g, &req, &again);
    CHECK(st == FUSEBOX_OK, "plan file: %s", fusebox_status_name(st));
    if (again) {
      CHECK(strcmp(fusebox_plan_engine(again), fusebox_plan_engine(p)) == 0, "same engine");
      CHECK(strstr(fusebox_plan_source(again), "plan file") != NULL, "source: %s",
            fusebox_plan_source(again));
    }
    fusebox_plan_free(again);
  }
  req = fusebox_plan_request_default();
  req.heuristics = "z";
  {
    fusebox_plan* none = NULL;
    st = fusebox_session_get_plan(s, g, &req, &none);
    CHECK(st == FUSEBOX_INVALID_ARGUMENT && none == NULL, "bad heuristics: %s", fusebox_status_name(st));
  }

  st = fusebox_bind(s, p, 4, names, ptrs, &bound);
  CHECK(st == FUSEBOX_INVALID_ARGUMENT && bound == NULL, "unknown tensor: %s", fusebox_status_name(st));
  CHECK(strstr(fusebox_last_error(), "unknown tensor 'q'") != NULL, "%s", fusebox_last_error());
  printf("unknown tensor -> %s: %s\n", fusebox_status_name(st), fusebox_last_error());
  st = fusebox_bind(s, p, 3, names, ptrs, &bound);
  CHECK(st == FUSEBOX_INVALID_ARGUMENT && strstr(fusebox_last_error(), "no pointer for 'y'") != NULL,
        "missing tensor: %s", fusebox_last_error());
  names[3] = "y";
  ptrs[3] = NULL;
  st = fusebox_bind(s, p, 4, names, ptrs, &bound);
  CHECK(st == FUSEBOX_INVALID_ARGUMENT && strstr(fusebox_last_error(), "'y' has a NULL pointer") != NULL,
        "NULL pointer: %s", fusebox_last_error());
  ptrs[3] = (void*)1024;
  st = fusebox_bind(s, p, 4, names, ptrs, &bound);
  CHECK(st == FUSEBOX_NO_DEVICE && bound == NULL, "deviceless bind: %s", fusebox_status_name(st));

  /* (v2) the caller's workspace: its size is checked first, then names, then the device */
  CHECK(fusebox_session_device_id(s) == -1, "deviceless: no device id");
  CHECK(strcmp(fusebox_plan_cache_result(p), "off") == 0, "no cache: %s", fusebox_plan_cache_result(p));
  /* (v4) the plan's report, the library's JSON serializer (the CLI's document) */
  CHECK(fusebox_plan_report_json(NULL) == NULL, "NULL report (v4)");
  CHECK(strstr(fusebox_plan_report_json(p), "\"source\":\"built\"") != NULL &&
            strstr(fusebox_plan_report_json(p), "\"build\":{") != NULL &&
            strstr(fusebox_plan_report_json(p), "\"plan_check\":{") != NULL,
        "report: %.200s", fusebox_plan_report_json(p));
  if (fusebox_plan_workspace_bytes(p) > 0) {
    st = fusebox_bind_with_workspace(s, p, 4, names, ptrs, (void*)4096, fusebox_plan_workspace_bytes(p) - 1,
                                     &bound);
    CHECK(st == FUSEBOX_INVALID_ARGUMENT && strstr(fusebox_last_error(), "bytes of workspace; given") != NULL,
          "small workspace: %s", fusebox_last_error());
    st = fusebox_bind_with_workspace(s, p, 4, names, ptrs, NULL, fusebox_plan_workspace_bytes(p), &bound);
    CHECK(st == FUSEBOX_INVALID_ARGUMENT && strstr(fusebox_last_error(), "workspace is NULL") != NULL,
          "NULL workspace: %s", fusebox_last_error());
  }
  st = fusebox_bind_with_workspace(s, p, 3, names, ptrs, (void*)4096, 1 << 20, &bound);
  CHECK(st == FUSEBOX_INVALID_ARGUMENT &&
            strstr(fusebox_last_error(), "fusebox_bind_with_workspace: no pointer for 'y'"),
        "missing tensor: %s", fusebox_last_error());
  st = fusebox_bind_with_workspace(s, p, 4, names, ptrs, (void*)4096, 1 << 20, &bound);
  CHECK(st == FUSEBOX_NO_DEVICE && bound == NULL, "deviceless bind_with_workspace: %s",
        fusebox_status_name(st));
  {
    fusebox_plan* tuned = NULL;
    st = fusebox_session_tune(s, g, NULL, &tuned);
    CHECK(st == FUSEBOX_NO_DEVICE && tuned == NULL, "deviceless tune: %s", fusebox_status_name(st));
    printf("deviceless tune -> %s: %s\n", fusebox_status_name(st), fusebox_last_error());
    st = fusebox_session_tune_in_cuda_graph(s, g, NULL, &tuned);
    CHECK(st == FUSEBOX_NO_DEVICE && tuned == NULL &&
              strstr(fusebox_last_error(), "fusebox_session_tune_in_cuda_graph"),
          "deviceless tune in a CUDA graph: %s: %s", fusebox_status_name(st), fusebox_last_error());
  }

done:
  /* Freed out of order on purpose: handles keep what they need alive. */
  fusebox_session_free(s);
  fusebox_graph_free(g);
  fusebox_plan_free(p);
}

/* (v2) The plan cache's part, deviceless: a miss that stores, then a hit in a new session. */
static void test_cache(const char* plan_path) {
  char cache_path[4096];
  fusebox_graph* g = load_example();
  int round;
  if (!g) return;
  snprintf(cache_path, sizeof cache_path, "%s.cache.sqlite", plan_path);
  remove(cache_path);
  for (round = 0; round < 2; ++round) {
    fusebox_session* s = NULL;
    fusebox_plan* p = NULL;
    fusebox_status st = fusebox_session_create(0, FUSEBOX_DEVPROP, cache_path, &s);
    CHECK(st == FUSEBOX_OK, "deviceless session with a cache: %s", fusebox_status_name(st));
    if (s) st = fusebox_session_get_plan(s, g, NULL, &p);
    CHECK(p != NULL, "plan through the cache: %s", fusebox_status_name(st));
    if (p) {
      const char* want = round == 0 ? "miss" : "hit";
      CHECK(strcmp(fusebox_plan_cache_result(p), want) == 0, "round %d: cache %s, expected %s (source %s)",
            round, fusebox_plan_cache_result(p), want, fusebox_plan_source(p));
      printf("cache round %d: %s, %s\n", round, fusebox_plan_cache_result(p), fusebox_plan_source(p));
    }
    fusebox_plan_free(p);
    fusebox_session_free(s);
  }
  remove(cache_path);
  fusebox_graph_free(g);
}

static uint16_t bf16_of_small_int(int v) {
  /* Exact for the small integers used here: a float's top 16 bits. */
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return (uint16_t)(bits >> 16);
}

static float float_of_bf16(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static int fill(void* dev, size_t count, int value) {
  uint16_t* host = (uint16_t*)malloc(count * sizeof(uint16_t));
  size_t i;
  int ok;
  if (!host) return 0;
  for (i = 0; i < count; ++i) host[i] = bf16_of_small_int(value);
  ok = cudaMemcpy(dev, host, count * sizeof(uint16_t), cudaMemcpyHostToDevice) == cudaSuccess;
  free(host);
  return ok;
}

/* On a GPU: x = 1, w = 1, b = -4, so y = relu(64 * taps - 4): 572 inside,
 * 380 on an edge, 252 in a corner (exact in bf16). */
static void test_gpu(void) {
  fusebox_graph* g = load_example();
  fusebox_session* s = NULL;
  fusebox_plan* p = NULL;
  fusebox_bound_plan* bound = NULL;
  const char* names[4] = {"x", "w", "b", "y"};
  void* ptrs[4] = {NULL, NULL, NULL, NULL};
  size_t counts[4] = {2 * 64 * 8 * 8, 64 * 64 * 3 * 3, 64, 2 * 64 * 8 * 8};
  uint16_t* y = NULL;
  cudaStream_t stream = NULL;
  fusebox_status st;
  int i;
  if (!g) return;

  st = fusebox_session_create(0, NULL, NULL, &s);
  if (st == FUSEBOX_NO_DEVICE) {
    printf("skipped GPU run: no CUDA GPU (%s)\n", fusebox_last_error());
    fusebox_graph_free(g);
    return;
  }
  CHECK(st == FUSEBOX_OK, "GPU session: %s", fusebox_status_name(st));
  if (!s) goto done;
  st = fusebox_session_get_plan(s, g, NULL, &p);
  CHECK(st == FUSEBOX_OK, "GPU plan: %s", fusebox_status_name(st));
  if (!p) goto done;
  for (i = 0; i < 4; ++i) {
    CHECK(cudaMalloc(&ptrs[i], counts[i] * 2) == cudaSuccess, "cudaMalloc %s", names[i]);
    if (!ptrs[i]) goto done;
  }
  CHECK(fill(ptrs[0], counts[0], 1) && fill(ptrs[1], counts[1], 1) && fill(ptrs[2], counts[2], -4),
        "uploads");
  CHECK(cudaMemset(ptrs[3], 0xFF, counts[3] * 2) == cudaSuccess, "poison y");
  st = fusebox_bind(s, p, 4, names, ptrs, &bound);
  CHECK(st == FUSEBOX_OK, "bind: %s", fusebox_status_name(st));
  if (!bound) goto done;
  CHECK(cudaStreamCreate(&stream) == cudaSuccess, "stream");
  st = fusebox_execute(bound, stream);
  CHECK(st == FUSEBOX_OK, "execute: %s", fusebox_status_name(st));
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "synchronize");
  y = (uint16_t*)malloc(counts[3] * 2);
  if (!y) goto done;
  CHECK(cudaMemcpy(y, ptrs[3], counts[3] * 2, cudaMemcpyDeviceToHost) == cudaSuccess, "download y");
  {
    /* nhwc: element (n, h, w, c) at ((n * 8 + h) * 8 + w) * 64 + c */
    float inside = float_of_bf16(y[((1 * 8 + 4) * 8 + 4) * 64 + 7]);
    float edge = float_of_bf16(y[((0 * 8 + 0) * 8 + 3) * 64 + 5]);
    float corner = float_of_bf16(y[((1 * 8 + 7) * 8 + 7) * 64 + 63]);
    CHECK(inside == 572.0f && edge == 380.0f && corner == 252.0f,
          "y inside %g (572), edge %g (380), corner %g (252)", inside, edge, corner);
    printf("GPU run on %s: engine %s, y inside %g, edge %g, corner %g (expected 572, 380, 252)\n",
           fusebox_session_device_name(s), fusebox_plan_engine(p), inside, edge, corner);
  }
  CHECK(fusebox_session_device_id(s) == 0, "device id %d", fusebox_session_device_id(s));

  /* (v2) again with the caller's workspace */
  {
    fusebox_bound_plan* own = NULL;
    void* ws = NULL;
    int64_t ws_bytes = fusebox_plan_workspace_bytes(p);
    if (ws_bytes > 0) CHECK(cudaMalloc(&ws, (size_t)ws_bytes) == cudaSuccess, "cudaMalloc workspace");
    CHECK(cudaMemset(ptrs[3], 0xFF, counts[3] * 2) == cudaSuccess, "poison y");
    st = fusebox_bind_with_workspace(s, p, 4, names, ptrs, ws, ws_bytes, &own);
    CHECK(st == FUSEBOX_OK, "bind_with_workspace: %s", fusebox_status_name(st));
    if (own) {
      CHECK(fusebox_execute(own, stream) == FUSEBOX_OK, "execute with own workspace");
      CHECK(cudaStreamSynchronize(stream) == cudaSuccess, "synchronize");
      CHECK(cudaMemcpy(y, ptrs[3], counts[3] * 2, cudaMemcpyDeviceToHost) == cudaSuccess, "download y");
      CHECK(float_of_bf16(y[((1 * 8 + 4) * 8 + 4) * 64 + 7]) == 572.0f, "own workspace: y inside %g",
            float_of_bf16(y[((1 * 8 + 4) * 8 + 4) * 64 + 7]));
      printf("GPU run with the caller's workspace (%lld B): y inside %g\n", (long long)ws_bytes,
             float_of_bf16(y[((1 * 8 + 4) * 8 + 4) * 64 + 7]));
    }
    fusebox_bound_plan_free(own);
    if (ws) cudaFree(ws);
  }

done:
  fusebox_bound_plan_free(bound);
  fusebox_plan_free(p);
  fusebox_session_free(s);
  fusebox_graph_free(g);
  if (stream) cudaStreamDestroy(stream);
  for (i = 0; i < 4; ++i) {
    if (ptrs[i]) cudaFree(ptrs[i]);
  }
  free(y);
}

int main(int argc, char** argv) {
  const char* plan_path = argc > 1 ? argv[1] : "capi_test.plan";
  test_versions();
  test_graph();
  test_backward();
  test_errors();
  test_deviceless(plan_path);
  test_cache(plan_path);
  test_gpu();
  if (failures) {
    printf("FAIL: %d check(s) failed\n", failures);
    return 1;
  }
  printf("capi: all checks passed\n");
  return 0;
}
