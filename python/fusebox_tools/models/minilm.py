"""all-MiniLM-L6-v2 (a 6-layer BERT encoder) as a fusebox pipeline.

Converts the model's safetensors into .npy weights in the layout the graphs
want, writes the graph files (shared by the layers) and the pipeline file for
a batch B and sequence length S, and holds a float32 numpy reference of the
whole model (docs/models.md, "all-MiniLM-L6-v2").

    python3 -m fusebox_tools.models.minilm convert --model models/minilm/hf --out models/minilm/fusebox
    python3 -m fusebox_tools.models.minilm pipeline --out models/minilm/fusebox --batch 4 --seq 128
    python3 -m fusebox_tools.models.minilm random --out DIR [--layers 2 --hidden 64 --heads 2 --ffn 128]

What runs where (B sequences of S tokens, N = B*S rows, H hidden):

  host/runner  tokenizer -> ids [N] (int32) and the S position rows plus the token-type row,
               pos_type [S, H] (pos_emb[:S] + type_emb[0], a few kB)
  stage embed          embedding: word_emb[ids] + pos_type[n % S], fusebox's own CUDA kernel
                       (cuDNN 9.19 has no gather op; docs/architecture.md, "Native ops")
                                                                        -> emb [N, H]
  stage emb_ln         layernorm(emb)                                   -> h0
  per layer l (9 stages, 7 graph files shared by all layers):
    q{l}, k{l}, v{l}   matmul + bias            h @ Wq^T + bq           -> [N, H]
    attn{l}            sdpa_fwd, bf16, [B, heads, S, head_dim] (bshd views of q, k, v),
                       padding mask: seq_len_kv = each sequence's tokens,
                       seq_len_q = S (padded query rows stay finite; pooling drops them)
    out{l}             matmul + bias + residual add (attention output projection)
    ln1_{l}            layernorm (post-LN)
    up{l}              matmul + bias + gelu_erf (FFN up)
    down{l}            matmul + bias + residual add (FFN down)
    ln2_{l}            layernorm (post-LN)                               -> h{l+1}
  stage pool           matmul of the 0/1 token mask [B, N] with h6: per-sequence sums over
                       the non-padding tokens, fp32                      -> pooled_sum [B, H]
  host/runner  mean (divide by the token count) and L2 normalisation (B x H: a host step;
               cuDNN 9.19 allows a reduction only as a graph's last op, so a norm after
               it cannot be fused)

The attention stage reads q, k, v and writes o through views (buffers marked
"reshape": docs/pipeline-format.md): the projections see [1, N, H] row-major,
the attention [B, heads, S, head_dim] bshd, the same bytes. Q, K and V are
three GEMMs (three stages), or with fused_qkv one batch-broadcast GEMM
[1, N, H] x [3, H, H] whose three parts the attention reads as view buffers.

Weights: the matmul weights are transposed here ([in, out], so `x @ W`), rounded
to bf16 (what the graphs read) and stored as float16 .npy (<f2: exact for every
bf16 value with |v| >= 2^-17; smaller ones round by less than 2^-25), half the
bytes of float32: the six layers take 21 MB. LayerNorm gains and biases are
rounded to bf16 too and stored as float32 (<f4): cuDNN 9.19's fast LayerNorm
engines need a bf16 gain and bias (with fp32 ones only its generic engine runs,
about 5 times slower). The word table is a pipeline constant (weights/word_emb.npy, [V, H, 1, 1],
rounded to bf16 and stored as float16); the position and token-type tables stay on the host
(host/, float16): the runner adds the S position rows and the token-type row in float32 and the
pipeline reads the sum rounded to bf16. Everything the GPU machine needs is about 50 MB (one carry).
"""
import argparse
import json
import math
import os
import shutil
import stat
import struct
import sys

import numpy as np

# ------------------------------------------------------------------ config

MINILM_CONFIG = {
    "hidden": 384, "heads": 12, "ffn": 1536, "layers": 6, "eps": 1e-12,
    "vocab": 30522, "max_pos": 512, "type_vocab": 2,
}
CONFIG_FILE = "minilm_config.json"
# Graph files per shape live in graphs/b{B}_s{S}/; weights in weights/, host tables in host/.
LAYER_TENSORS = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln1_g", "ln1_b",
                 "w1", "b1", "w2", "b2", "ln2_g", "ln2_b")


class MiniLMError(Exception):
    pass


def open_regular(path, what="file"):
    """`path` opened for reading in binary, only if it is a regular file: a FIFO, socket or device
    would block the read or never end. Opened non-blocking, then checked with fstat, so even a FIFO
    put there is refused without waiting. A MiniLMError naming `what` and the path otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise MiniLMError(f"{what} {path!r}: cannot read it ({e.strerror or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a folder" if stat.S_ISDIR(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "not a regular file")
            raise MiniLMError(f"{what} {path!r} is {kind}, not a regular file: give the file itself")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def require_regular(path, what="file"):
    """MiniLMError unless `path` is a regular file (for readers that take a path: the tokenizer)."""
    open_regular(path, what).close()


def check_config(cfg):
    for k in ("hidden", "heads", "ffn", "layers", "vocab", "max_pos", "type_vocab"):
        v = cfg.get(k)
        if not isinstance(v, int) or v < 1:
            raise MiniLMError(f"config: {k} must be a positive integer, got {v!r}")
    if cfg["hidden"] % cfg["heads"]:
        raise MiniLMError(f"config: hidden {cfg['hidden']} is not a multiple of heads {cfg['heads']}")
    d = cfg["hidden"] // cfg["heads"]
    if d % 8 or d > 256:
        raise MiniLMError(f"config: head dim {d} must be a multiple of 8 and <= 256 (cuDNN sdpa_fwd)")
    if not (isinstance(cfg.get("eps"), float) and cfg["eps"] > 0):
        raise MiniLMError(f"config: eps must be a positive number, got {cfg.get('eps')!r}")
    return cfg


def head_dim(cfg):
    return cfg["hidden"] // cfg["heads"]


# ------------------------------------------------------------------ safetensors

_ST_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"),
              "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "BF16": "bf16"}
_ST_MAX_HEADER = 100 << 20


def read_safetensors(path):
    """name -> numpy array (float32 for BF16) of a .safetensors file. A file that
    does not follow the format is a MiniLMError naming the file and the entry."""
    with open_regular(path, "safetensors file") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) != 8:
            raise MiniLMError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(_ST_MAX_HEADER, size - 8):
            raise MiniLMError(f"{path}: header length {n} exceeds the file ({size} bytes) or 100 MiB")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MiniLMError(f"{path}: header is not JSON: {e}") from e
        if not isinstance(header, dict):
            raise MiniLMError(f"{path}: header is not a JSON object")
        data_len = size - 8 - n
        out = {}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            try:
                dt, shape, (lo, hi) = _ST_DTYPES[e["dtype"]], [int(s) for s in e["shape"]], e["data_offsets"]
            except (KeyError, TypeError, ValueError) as err:
                raise MiniLMError(f"{path}: entry {name!r}: bad dtype, shape or data_offsets ({err})") from err
            count = math.prod(shape)
            itemsize = 2 if dt == "bf16" else dt.itemsize
            if any(s < 0 for s in shape) or not (0 <= lo <= hi <= data_len) or hi - lo != count * itemsize:
                raise MiniLMError(f"{path}: entry {name!r}: shape {shape} x {itemsize} bytes does not fit "
                                  f"data_offsets [{lo}, {hi}) of {data_len} data bytes")
            f.seek(8 + n + lo)
            raw = f.read(hi - lo)
            if dt == "bf16":
                arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                arr = np.frombuffer(raw, dtype=dt)
            out[name] = arr.reshape(shape).copy()
    return out


# ------------------------------------------------------------------ parameters

def params_from_hf(tensors, cfg):
    """The canonical parameter dict from BERT's HF names (transposes to [in, out])."""
    def get(name, shape):
        if name not in tensors:
            raise MiniLMError(f"weights: {name!r} missing")
        a = np.asarray(tensors[name], dtype=np.float32)
        if list(a.shape) != list(shape):
            raise MiniLMError(f"weights: {name!r} has shape {list(a.shape)}, expected {list(shape)}")
        return a

    H, F = cfg["hidden"], cfg["ffn"]
    p = {
        "word_emb": get("embeddings.word_embeddings.weight", (cfg["vocab"], H)),
        "pos_emb": get("embeddings.position_embeddings.weight", (cfg["max_pos"], H)),
        "type_emb": get("embeddings.token_type_embeddings.weight", (cfg["type_vocab"], H)),
        "emb_ln_g": get("embeddings.LayerNorm.weight", (H,)),
        "emb_ln_b": get("embeddings.LayerNorm.bias", (H,)),
        "layers": [],
    }
    for l in range(cfg["layers"]):
        pre = f"encoder.layer.{l}."
        L = {}
        for short, hf in (("q", "attention.self.query"), ("k", "attention.self.key"),
                          ("v", "attention.self.value"), ("o", "attention.output.dense")):
            L["w" + short] = get(pre + hf + ".weight", (H, H)).T.copy()
            L["b" + short] = get(pre + hf + ".bias", (H,))
        L["ln1_g"] = get(pre + "attention.output.LayerNorm.weight", (H,))
        L["ln1_b"] = get(pre + "attention.output.LayerNorm.bias", (H,))
        L["w1"] = get(pre + "intermediate.dense.weight", (F, H)).T.copy()
        L["b1"] = get(pre + "intermediate.dense.bias", (F,))
        L["w2"] = get(pre + "output.dense.weight", (H, F)).T.copy()
        L["b2"] = get(pre + "output.dense.bias", (H,))
        L["ln2_g"] = get(pre + "output.LayerNorm.weight", (H,))
        L["ln2_b"] = get(pre + "output.LayerNorm.bias", (H,))
        p["layers"].append(L)
    return p


def load_hf(model_dir):
    """(params, cfg) of the unpacked model (scripts/fetch_minilm.sh)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    if hf.get("hidden_act") not in ("gelu", "gelu_python") or hf.get("model_type") != "bert":
        raise MiniLMError(f"{model_dir}/config.json: a BERT with erf GELU is expected, got "
                          f"model_type {hf.get('model_type')!r}, hidden_act {hf.get('hidden_act')!r}")
    cfg = check_config({
        "hidden": hf["hidden_size"], "heads": hf["num_attention_heads"], "ffn": hf["intermediate_size"],
        "layers": hf["num_hidden_layers"], "eps": float(hf["layer_norm_eps"]), "vocab": hf["vocab_size"],
        "max_pos": hf["max_position_embeddings"], "type_vocab": hf["type_vocab_size"],
    })
    return params_from_hf(read_safetensors(os.path.join(model_dir, "model.safetensors")), cfg), cfg


def random_params(cfg, seed=0):
    """Random parameters of the right shapes (tests: no real weights needed)."""
    rng = np.random.default_rng(seed)
    H, F = cfg["hidden"], cfg["ffn"]

    def w(*shape, scale=None):
        s = scale if scale is not None else 1.0 / math.sqrt(shape[0])
        return rng.uniform(-s, s, size=shape).astype(np.float32)

    p = {"word_emb": w(cfg["vocab"], H, scale=1.0), "pos_emb": w(cfg["max_pos"], H, scale=0.5),
         "type_emb": w(cfg["type_vocab"], H, scale=0.5),
         "emb_ln_g": rng.uniform(0.5, 1.5, H).astype(np.float32), "emb_ln_b": w(H, scale=0.2), "layers": []}
    for _ in range(cfg["layers"]):
        L = {"wq": w(H, H), "bq": w(H, scale=0.1), "wk": w(H, H), "bk": w(H, scale=0.1),
             "wv": w(H, H), "bv": w(H, scale=0.1), "wo": w(H, H), "bo": w(H, scale=0.1),
             "ln1_g": rng.uniform(0.5, 1.5, H).astype(np.float32), "ln1_b": w(H, scale=0.2),
             "w1": w(H, F), "b1": w(F, scale=0.1), "w2": w(F, H), "b2": w(H, scale=0.1),
             "ln2_g": rng.uniform(0.5, 1.5, H).astype(np.float32), "ln2_b": w(H, scale=0.2)}
        p["layers"].append(L)
    return p


def round_bf16(x):
    """float32 -> nearest bf16 (ties to even), as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)).astype(np.uint32)
    nan = np.isnan(x)
    out = r.view(np.float32).copy()
    out[nan] = np.nan
    return out


def pipeline_params(p):
    """The parameters as the pipeline reads them: matmul weights and biases bf16,
    layernorm gains and biases bf16 (stored as float32), the word table bf16 (stored as float16:
    the embed stage reads it), the position and token-type tables float16 (the runner's)."""
    q = {"word_emb": f16_exact(round_bf16(p["word_emb"].astype(np.float16).astype(np.float32))),
         "pos_emb": p["pos_emb"].astype(np.float16).astype(np.float32),
         "type_emb": p["type_emb"].astype(np.float16).astype(np.float32),
         "emb_ln_g": round_bf16(p["emb_ln_g"]), "emb_ln_b": round_bf16(p["emb_ln_b"]), "layers": []}
    for L in p["layers"]:
        q["layers"].append({k: (round_bf16(v) if k.startswith("ln") else f16_exact(round_bf16(v))) for k, v in L.items()})
    return q


def f16_exact(x):
    """What a bf16 value stored as float16 reads back as (identical unless |x| < 2^-17)."""
    return x.astype(np.float16).astype(np.float32)


# ------------------------------------------------------------------ weights on disk

def weight_shapes(cfg):
    """Layer tensor -> (file shape, dtype) as the graphs read them."""
    H, F = cfg["hidden"], cfg["ffn"]
    s = {}
    for n in ("wq", "wk", "wv", "wo"):
        s[n] = ([1, H, H], "<f2")
    for n in ("bq", "bk", "bv", "bo", "b2"):
        s[n] = ([1, 1, H], "<f2")
    s["w1"], s["b1"], s["w2"] = ([1, H, F], "<f2"), ([1, 1, F], "<f2"), ([1, F, H], "<f2")
    for n in ("ln1_g", "ln1_b", "ln2_g", "ln2_b"):
        s[n] = ([1, H, 1, 1], "<f4")
    return s


def write_weights(p, cfg, out_dir):
    """Writes weights/*.npy (pipeline constants), host/*.npy (embedding tables)
    and minilm_config.json into out_dir. Returns the bytes written."""
    check_config(cfg)
    os.makedirs(os.path.join(out_dir, "weights"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "host"), exist_ok=True)
    total = 0

    def save(rel, arr):
        nonlocal total
        path = os.path.join(out_dir, rel)
        np.save(path, arr)
        total += os.path.getsize(path)

    q = pipeline_params(p)
    shapes = weight_shapes(cfg)
    H = cfg["hidden"]
    save("weights/emb_ln_g.npy", q["emb_ln_g"].reshape(1, H, 1, 1).astype("<f4"))
    save("weights/emb_ln_b.npy", q["emb_ln_b"].reshape(1, H, 1, 1).astype("<f4"))
    for l, L in enumerate(q["layers"]):
        for name in LAYER_TENSORS:
            shape, dt = shapes[name]
            save(f"weights/l{l}_{name}.npy", L[name].reshape(shape).astype(dt))
        # The fused Q/K/V GEMM's (write_*pipeline(fused_qkv=True)): the three stacked, [3, H, H] and [3, 1, H].
        save(f"weights/l{l}_wqkv.npy", np.stack([L[n].reshape(H, H) for n in ("wq", "wk", "wv")]).astype("<f2"))
        save(f"weights/l{l}_bqkv.npy", np.stack([L[n].reshape(1, H) for n in ("bq", "bk", "bv")]).astype("<f2"))
    save("weights/word_emb.npy", q["word_emb"].reshape(cfg["vocab"], H, 1, 1).astype("<f2"))
    for name in ("pos_emb", "type_emb"):
        save(f"host/{name}.npy", q[name].astype("<f2"))
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump(cfg, f, indent=1)
    return total


def load_config(out_dir):
    with open_regular(os.path.join(out_dir, CONFIG_FILE), "model config") as f:
        return check_config(json.load(f))


def load_converted(out_dir):
    """(params, cfg) read back from write_weights' files (float32 arrays, in the
    canonical layout): exactly the values the pipeline reads."""
    cfg = load_config(out_dir)
    H = cfg["hidden"]

    def ld(rel):
        with open_regular(os.path.join(out_dir, rel), "model file") as f:
            return np.load(f, allow_pickle=False).astype(np.float32)

    p = {n: ld(f"host/{n}.npy") for n in ("pos_emb", "type_emb")}
    p["word_emb"] = ld("weights/word_emb.npy").reshape(cfg["vocab"], H)
    p["emb_ln_g"], p["emb_ln_b"] = ld("weights/emb_ln_g.npy").reshape(H), ld("weights/emb_ln_b.npy").reshape(H)
    p["layers"] = []
    for l in range(cfg["layers"]):
        L = {}
        for name in LAYER_TENSORS:
            a = ld(f"weights/l{l}_{name}.npy")
            L[name] = a.reshape(a.shape[-2], a.shape[-1]) if name.startswith("w") else a.reshape(-1)
        p["layers"].append(L)
    return p, cfg


# ------------------------------------------------------------------ graphs and pipeline

def _t(name, dims, **kw):
    d = {"name": name}
    if dims is not None:
        d["dims"] = dims
    d.update(kw)
    return d


def _graph(name, tensors, ops, symbols=None):
    g = {"name": name, "io_dtype": "bf16", "intermediate_dtype": "fp32", "compute_dtype": "fp32"}
    if symbols:  # only those the graph's dims use, in a fixed order
        used = {d for t in tensors for d in t.get("dims", []) if isinstance(d, str)}
        g["symbols"] = {k: v for k, v in symbols.items() if k in used}
    g.update({"tensors": tensors, "ops": ops})
    return g


def _dim_name(v):
    return v if isinstance(v, str) else str(v)


def embed_graph(N, S, V, H, symbols=None):
    """The embedding lookup, fusebox's own kernel: emb [N, H, 1, 1] = word_emb[ids] + pos_type[n % S]
    (ids [N, 1, 1, 1] int32, word_emb [V, H, 1, 1], pos_type [S, H, 1, 1]; bf16, NHWC rows)."""
    return _graph(f"minilm_embed_{_dim_name(N)}x{H}", [
        _t("ids", [N, 1, 1, 1], dtype="int32"),
        _t("word_emb", [V, H, 1, 1], layout="nhwc"),
        _t("pos_type", [S, H, 1, 1], layout="nhwc"),
        _t("emb", None, layout="nhwc"),
    ], [{"op": "embedding", "name": "embed", "inputs": {"ids": "ids", "table": "word_emb", "add": "pos_type"},
         "outputs": {"y": "emb"}}], symbols)


def ln_graph(N, H, eps, symbols=None):
    """LayerNorm over H of N rows, cuDNN's own layout: x [N, H, 1, 1] NHWC, bf16 gain and bias (with
    fp32 ones cuDNN 9.19 offers only its generic engine: 80.8 us against 16.5 us at 32768 x 384 on
    the H200, 2026-12-01)."""
    return _graph(f"minilm_layernorm_{_dim_name(N)}x{H}", [
        _t("x", [N, H, 1, 1], layout="nhwc"),
        _t("scale", [1, H, 1, 1], layout="nhwc"),
        _t("bias", [1, H, 1, 1], layout="nhwc"),
        _t("y", None, layout="nhwc"),
    ], [{"op": "layernorm", "name": "ln", "epsilon": eps,
         "inputs": {"x": "x", "scale": "scale", "bias": "bias"}, "outputs": {"y": "y"}}], symbols)


def linear_graph(M, K, Nout, act=None, residual=False, symbols=None):
    """y = [act](a @ b + bias) [+ residual]; a [1, M, K], b [1, K, Nout]."""
    tag = "_gelu" if act else ""
    tag += "_residual" if residual else ""
    tensors = [_t("a", [1, M, K]), _t("b", [1, K, Nout]), _t("bias", [1, 1, Nout])]
    ops = [{"op": "matmul", "name": "gemm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "gemm_out"}},
           {"op": "bias_add", "name": "bias", "inputs": {"x": "gemm_out", "bias": "bias"},
            "outputs": {"y": "biased"}}]
    last = "biased"
    if act:
        ops.append({"op": "gelu_erf", "name": "gelu", "inputs": {"x": last}, "outputs": {"y": "act"}})
        last = "act"
    if residual:
        tensors.append(_t("residual", [1, M, Nout]))
        ops.append({"op": "add", "name": "residual", "inputs": {"a": last, "b": "residual"},
                    "outputs": {"y": "sum"}})
        last = "sum"
    ops[-1]["outputs"]["y"] = "y"
    tensors.append(_t("y", None))
    return _graph(f"minilm_linear_{_dim_name(M)}x{K}x{Nout}{tag}", tensors, ops, symbols)


def qkv_graph(M, H, symbols=None):
    """Q, K and V in one GEMM: y [3, M, H] = a [1, M, H] x b [3, H, H] + bias [3, 1, H] (a broadcast
    over the batch of 3); the pipeline reads the three [M, H] parts of y as q, k and v (views)."""
    return _graph(f"minilm_qkv_{_dim_name(M)}x{H}", [
        _t("a", [1, M, H]), _t("b", [3, H, H]), _t("bias", [3, 1, H]), _t("y", None),
    ], [{"op": "matmul", "name": "gemm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "gemm_out"}},
        {"op": "bias_add", "name": "bias", "inputs": {"x": "gemm_out", "bias": "bias"}, "outputs": {"y": "y"}}],
        symbols)


def attn_graph(B, heads, S, d, symbols=None):
    """Bidirectional attention with a key padding mask, q/k/v/o bshd (= [B*S, heads*d] row-major)."""
    # A symbolic S: seq_len_q is an input (the runner gives S for every sequence); fixed values
    # cannot follow the shape.
    seq_len_q = (_t("seq_len_q", [B, 1, 1, 1], dtype="int32") if symbols
                 else _t("seq_len_q", [B, 1, 1, 1], dtype="int32", values=[S] * B))
    return _graph(f"minilm_attention_b{_dim_name(B)}_h{heads}_s{_dim_name(S)}_d{d}", [
        _t("q", [B, heads, S, d], layout="bshd"),
        _t("k", [B, heads, S, d], layout="bshd"),
        _t("v", [B, heads, S, d], layout="bshd"),
        # Every query row is computed (padded rows attend to the real keys and stay finite);
        # fixed here so that runs with fusebox-made inputs do the same.
        seq_len_q,
        _t("seq_len_kv", [B, 1, 1, 1], dtype="int32"),
        _t("o", None, layout="bshd"),
    ], [{"op": "sdpa_fwd", "name": "attn", "attn_scale": 1.0 / math.sqrt(d),
         "inputs": {"q": "q", "k": "k", "v": "v", "seq_len_q": "seq_len_q", "seq_len_kv": "seq_len_kv"},
         "outputs": {"o": "o"}}], symbols)


def pool_graph(B, N, H, symbols=None):
    """pooled_sum [1, B, H] (fp32) = mask [1, B, N] @ h [1, N, H]: per-sequence sums of
    the non-padding tokens (mask[b, n] = 1 for the tokens of sequence b)."""
    return _graph(f"minilm_pool_b{_dim_name(B)}_n{_dim_name(N)}_h{H}", [
        _t("mask", [1, B, N]), _t("h", [1, N, H]), _t("y", None, dtype="fp32"),
    ], [{"op": "matmul", "name": "pool", "inputs": {"a": "mask", "b": "h"}, "outputs": {"y": "y"}}], symbols)


def write_pipeline(out_dir, B, S, cfg=None, fused_qkv=False):
    """Writes graphs/b{B}_s{S}/*.json and minilm_b{B}_s{S}.json into out_dir (whose
    weights write_weights made, or at least whose config is given): every dim concrete.
    Returns the pipeline file's path."""
    cfg = check_config(cfg or load_config(out_dir))
    if not (isinstance(B, int) and isinstance(S, int) and B >= 1 and 1 <= S <= cfg["max_pos"]):
        raise MiniLMError(f"batch {B} and sequence length {S} must be >= 1, S <= {cfg['max_pos']}")
    return _write(out_dir, cfg, B, S, B * S, f"graphs/b{B}_s{S}", f"minilm_b{B}_s{S}" + ("_fqkv" if fused_qkv else ""),
                  None, fused_qkv)


# The symbolic pipeline's ranges: batch up to 256 sentences (issue 14's largest size; a symbol's
# range is what cuDNN's dynamic-shape kernels are built for), S up to the model's positions, N = B*S.
DYN_MAX_BATCH = 256
DYN_DEFAULT = (8, 128)
DYN_PIPELINE = "minilm.json"


def write_dynamic_pipeline(out_dir, cfg=None, max_batch=DYN_MAX_BATCH, fused_qkv=False):
    """Writes graphs/dyn/*.json and minilm.json: one pipeline for every batch B and sequence length
    S, whose graphs declare the symbols B, S and N (the rows, B*S; the reshape buffers that are
    [N, H] for the GEMMs and [B, heads, S, d] for the attention only agree when N = B*S, which
    `pipeline check` verifies at every shape). Run with `--shape` (dynamic_shape_args). Returns
    the pipeline file's path."""
    cfg = check_config(cfg or load_config(out_dir))
    if not (isinstance(max_batch, int) and max_batch >= 1):
        raise MiniLMError(f"max batch {max_batch} must be >= 1")
    B0, S0 = min(DYN_DEFAULT[0], max_batch), min(DYN_DEFAULT[1], cfg["max_pos"])
    symbols = {"B": {"min": 1, "max": max_batch, "default": B0},
               "S": {"min": 1, "max": cfg["max_pos"], "default": S0},
               "N": {"min": 1, "max": max_batch * cfg["max_pos"], "default": B0 * S0}}
    return _write(out_dir, cfg, "B", "S", "N", "graphs/dyn", DYN_PIPELINE[:-5] + ("_fqkv" if fused_qkv else ""),
                  symbols, fused_qkv)


def dynamic_range(out_dir):
    """{symbol: (min, max)} of the symbolic pipeline's graphs in out_dir (what a run may ask)."""
    rng = {}
    gdir = os.path.join(out_dir, "graphs", "dyn")
    for name in sorted(os.listdir(gdir)):
        path = os.path.join(gdir, name)
        try:
            with open(path) as f:
                for sym, r in json.load(f).get("symbols", {}).items():
                    lo, hi = (r["min"], r["max"]) if isinstance(r, dict) else (r[0], r[1])
                    old = rng.get(sym, (lo, hi))
                    rng[sym] = (max(int(lo), old[0]), min(int(hi), old[1]))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise MiniLMError(f"{path}: not a graph file with symbol ranges ({type(e).__name__}: {e}); "
                              f"rewrite it with `python3 -m fusebox_tools.models.minilm pipeline`") from e
    return rng


def check_dynamic_shape(out_dir, B, S):
    """MiniLMError naming the symbol and range when the symbolic pipeline cannot run B x S."""
    rng = dynamic_range(out_dir)
    for sym, v, what in (("B", B, "batch"), ("S", S, "sequence length"), ("N", B * S, "token count B*S")):
        lo, hi = rng.get(sym, (1, v))
        if not lo <= v <= hi:
            raise MiniLMError(f"{what} {v} is outside the pipeline's range [{lo}, {hi}] (symbol {sym} of "
                              f"{os.path.join(out_dir, 'graphs', 'dyn')}): embed in smaller batches, or write "
                              f"the pipeline for more with `python3 -m fusebox_tools.models.minilm pipeline --max-batch M`")


def dynamic_shape_args(B, S):
    """`pipeline run --shape` for the symbolic pipeline at B sequences of S tokens."""
    return ["--shape", f"B={B},S={S},N={B * S}"]


def _write(out_dir, cfg, B, S, N, gdir, name, symbols, fused_qkv=False):
    """fused_qkv: one GEMM per layer writes qkv{l} [3, N, H] and the attention reads its three
    parts (view buffers: docs/pipeline-format.md) instead of three GEMMs: 3 + 7 x layers stages."""
    H, F, nh, d, L = cfg["hidden"], cfg["ffn"], cfg["heads"], head_dim(cfg), cfg["layers"]
    os.makedirs(os.path.join(out_dir, gdir), exist_ok=True)
    graphs = {
        "embed": embed_graph(N, S, cfg["vocab"], H, symbols),
        "ln": ln_graph(N, H, cfg["eps"], symbols),
        "proj": linear_graph(N, H, H, symbols=symbols),
        "proj_residual": linear_graph(N, H, H, residual=True, symbols=symbols),
        "ffn_up": linear_graph(N, H, F, act="gelu_erf", symbols=symbols),
        "ffn_down": linear_graph(N, F, H, residual=True, symbols=symbols),
        "attn": attn_graph(B, nh, S, d, symbols),
        "qkv": qkv_graph(N, H, symbols),
        "pool": pool_graph(B, N, H, symbols),
    }
    files = {}
    for key, g in graphs.items():
        rel = f"{gdir}/{key}.json"
        with open(os.path.join(out_dir, rel), "w") as f:
            json.dump(g, f, indent=1)
        files[key] = rel

    stages, buffers, bind = {}, {}, {}

    def const(name):
        buffers[name] = {"kind": "constant", "file": f"weights/{name}.npy"}
        return name

    buffers["ids"] = {"kind": "input"}
    buffers["pos_type"] = {"kind": "input"}
    buffers["seq_len_q"] = {"kind": "input"}
    buffers["seq_len_kv"] = {"kind": "input"}
    buffers["pool_mask"] = {"kind": "input"}
    stages["embed"] = files["embed"]
    buffers["emb"] = {"kind": "intermediate"}
    bind["embed"] = {"ids": "ids", "word_emb": const("word_emb"), "pos_type": "pos_type", "emb": "emb"}
    stages["emb_ln"] = files["ln"]
    buffers["h0"] = {"kind": "intermediate", "reshape": True}
    bind["emb_ln"] = {"x": "emb", "scale": const("emb_ln_g"), "bias": const("emb_ln_b"), "y": "h0"}
    # `emb` is read by the layernorm only: [N, H, 1, 1], the same bytes as [N, H].
    for l in range(L):
        h, w = f"h{l}", lambda n: const(f"l{l}_{n}")  # noqa: E731
        if fused_qkv:
            stages[f"qkv{l}"] = files["qkv"]
            buffers[f"qkv{l}"] = {"kind": "intermediate"}
            bind[f"qkv{l}"] = {"a": h, "b": w("wqkv"), "bias": w("bqkv"), "y": f"qkv{l}"}
            for i, x in enumerate(("q", "k", "v")):
                buffers[f"{x}{l}"] = {"kind": "intermediate", "view": {"of": f"qkv{l}", "part": i, "parts": 3}}
        else:
            for x in ("q", "k", "v"):
                stages[f"{x}{l}"] = files["proj"]
                buffers[f"{x}{l}"] = {"kind": "intermediate", "reshape": True}
                bind[f"{x}{l}"] = {"a": h, "b": w("w" + x), "bias": w("b" + x), "y": f"{x}{l}"}
        stages[f"attn{l}"] = files["attn"]
        buffers[f"ctx{l}"] = {"kind": "intermediate", "reshape": True}
        bind[f"attn{l}"] = {"q": f"q{l}", "k": f"k{l}", "v": f"v{l}", "seq_len_q": "seq_len_q",
                            "seq_len_kv": "seq_len_kv", "o": f"ctx{l}"}
        stages[f"out{l}"] = files["proj_residual"]
        buffers[f"attn_res{l}"] = {"kind": "intermediate", "reshape": True}
        bind[f"out{l}"] = {"a": f"ctx{l}", "b": w("wo"), "bias": w("bo"), "residual": h, "y": f"attn_res{l}"}
        stages[f"ln1_{l}"] = files["ln"]
        buffers[f"a{l}"] = {"kind": "intermediate", "reshape": True}
        bind[f"ln1_{l}"] = {"x": f"attn_res{l}", "scale": w("ln1_g"), "bias": w("ln1_b"), "y": f"a{l}"}
        stages[f"up{l}"] = files["ffn_up"]
        buffers[f"ffn{l}"] = {"kind": "intermediate"}
        bind[f"up{l}"] = {"a": f"a{l}", "b": w("w1"), "bias": w("b1"), "y": f"ffn{l}"}
        stages[f"down{l}"] = files["ffn_down"]
        buffers[f"ffn_res{l}"] = {"kind": "intermediate", "reshape": True}
        bind[f"down{l}"] = {"a": f"ffn{l}", "b": w("w2"), "bias": w("b2"), "residual": f"a{l}",
                            "y": f"ffn_res{l}"}
        stages[f"ln2_{l}"] = files["ln"]
        buffers[f"h{l + 1}"] = {"kind": "intermediate", "reshape": True}
        bind[f"ln2_{l}"] = {"x": f"ffn_res{l}", "scale": w("ln2_g"), "bias": w("ln2_b"), "y": f"h{l + 1}"}
    stages["pool"] = files["pool"]
    buffers["pooled_sum"] = {"kind": "output"}
    # Buffers read both as [N, H, 1, 1] (layernorm) and [1, N, H] (GEMMs) or
    # [B, heads, S, d] bshd (attention) are marked "reshape"; the rest keep one shape.
    bind["pool"] = {"mask": "pool_mask", "h": f"h{L}", "y": "pooled_sum"}
    doc = {"name": name, "graphs": stages, "buffers": buffers, "bind": bind}
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def stage_count(cfg):
    return 3 + 9 * cfg["layers"]


# ------------------------------------------------------------------ inputs (the runner's host step)

def checked_ids(p, ids, B, S):
    """ids as an array of shape (B, S), every id a row of the word table; MiniLMError otherwise."""
    ids = np.asarray(ids)
    if ids.shape != (B, S):
        raise MiniLMError(f"ids have shape {ids.shape}, expected ({B}, {S})")
    if ids.min() < 0 or ids.max() >= p["word_emb"].shape[0]:
        raise MiniLMError(f"token ids must be in [0, {p['word_emb'].shape[0]})")
    return ids


def embed(p, ids, lengths, S, token_types=None):
    """The embedding lookup (host step): word[ids] + position[0..S) + token_type,
    float32 [B, S, H]. ids [B, S] int (padding positions hold the pad id)."""
    B = np.asarray(ids).shape[0]
    ids = checked_ids(p, ids, B, S)
    tt = np.zeros((B, S), dtype=np.int64) if token_types is None else np.asarray(token_types)
    return (p["word_emb"][ids] + p["pos_emb"][None, :S] + p["type_emb"][tt]).astype(np.float32)


def pos_type_rows(p, S):
    """[S, H] float32: the position rows 0..S-1 plus the token-type-0 row, what the embed stage
    adds to the looked-up word rows (row n of the batch gets row n % S)."""
    return (p["pos_emb"][:S] + p["type_emb"][0][None]).astype(np.float32)


def lookup(p, ids, pos_type):
    """The embed stage in numpy: word_emb[ids] + pos_type[n % S], float32 [N, H] (ids [N] ints)."""
    ids = np.asarray(ids).reshape(-1)
    S = pos_type.shape[0]
    return p["word_emb"][ids] + np.tile(np.asarray(pos_type, np.float32).reshape(S, -1), (ids.size // S, 1))


def pipeline_inputs(p, ids, lengths, S):
    """The pipeline's input buffers for `fusebox pipeline run --input`: name -> array."""
    lengths = np.asarray(lengths, dtype=np.int64)
    B = lengths.shape[0]
    if np.any(lengths < 1) or np.any(lengths > S):
        raise MiniLMError(f"sequence lengths must be in [1, {S}], got {lengths.tolist()}")
    ids = checked_ids(p, ids, B, S)
    H = p["word_emb"].shape[1]
    mask = np.zeros((1, B, B * S), dtype=np.float32)
    for b, n in enumerate(lengths):
        mask[0, b, b * S:b * S + n] = 1.0
    return {
        # The embed stage's: the token ids and the rows it adds to each looked-up row (token type 0).
        "ids": ids.astype(np.int32).reshape(B * S, 1, 1, 1),
        "pos_type": pos_type_rows(p, S).reshape(S, H, 1, 1),
        "seq_len_q": np.full((B, 1, 1, 1), S, dtype=np.int32),
        "seq_len_kv": lengths.astype(np.int32).reshape(B, 1, 1, 1),
        "pool_mask": mask,
    }


def finish(pooled_sum, lengths):
    """The runner's host step after the pipeline: mean over the tokens, L2 normalisation."""
    pooled = np.asarray(pooled_sum, dtype=np.float64).reshape(len(lengths), -1)
    mean = pooled / np.asarray(lengths, dtype=np.float64)[:, None]
    norm = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return (mean / norm).astype(np.float32)


# ------------------------------------------------------------------ numpy reference

def erf(x):
    """erf to about 1e-7 absolute (Abramowitz & Stegun 7.1.26), vectorized float64."""
    x = np.asarray(x, dtype=np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * \
        np.exp(-a * a)
    return s * y


def gelu_erf(x):
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(np.float32)


def layernorm(x, g, b, eps):
    x64 = x.astype(np.float64)
    mu = x64.mean(-1, keepdims=True)
    var = ((x64 - mu) ** 2).mean(-1, keepdims=True)
    return ((x64 - mu) / np.sqrt(var + eps) * g + b).astype(np.float32)


def attention(q, k, v, lengths):
    """Multi-head attention with a key padding mask. q, k, v [B, heads, S, d];
    key j of sequence b is kept iff j < lengths[b]; every query row is computed."""
    d = q.shape[-1]
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) / math.sqrt(d)
    S = k.shape[2]
    keep = np.arange(S)[None, :] < np.asarray(lengths)[:, None]  # [B, S]
    s = np.where(keep[:, None, None, :], s, -np.inf)
    s -= s.max(-1, keepdims=True)
    e = np.exp(s)
    return (np.einsum("bhij,bhjd->bhid", e / e.sum(-1, keepdims=True), v.astype(np.float64))).astype(np.float32)


def encoder_layer(x, L, cfg, lengths, rnd=None):
    """One post-LN BERT layer on x [B, S, H] (float32). rnd(x): rounding of each
    stage's output (bf16 buffers for a pipeline emulation; None: float32)."""
    r = rnd or (lambda a: a)
    B, S, H = x.shape
    nh, d = cfg["heads"], head_dim(cfg)

    def heads(t):  # [B, S, H] -> [B, heads, S, d]
        return t.reshape(B, S, nh, d).transpose(0, 2, 1, 3)

    q, k, v = (r(x @ L["w" + n] + L["b" + n]) for n in ("q", "k", "v"))
    ctx = r(attention(heads(q), heads(k), heads(v), lengths).transpose(0, 2, 1, 3).reshape(B, S, H))
    a = r(layernorm(r(ctx @ L["wo"] + L["bo"] + x), L["ln1_g"], L["ln1_b"], cfg["eps"]))
    f = r(gelu_erf(a @ L["w1"] + L["b1"]))
    return r(layernorm(r(f @ L["w2"] + L["b2"] + a), L["ln2_g"], L["ln2_b"], cfg["eps"]))


def reference(p, cfg, ids, lengths, S, rnd=None):
    """The whole model in numpy: (sentence embeddings [B, H] (mean pooled, L2
    normalised), last hidden state [B, S, H], pooled sums [B, H])."""
    r = rnd or (lambda a: a)
    x = r(embed(p, ids, lengths, S))
    x = r(layernorm(x, p["emb_ln_g"], p["emb_ln_b"], cfg["eps"]))
    for L in p["layers"]:
        x = encoder_layer(x, L, cfg, lengths, rnd)
    keep = (np.arange(S)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)
    pooled_sum = np.einsum("bs,bsh->bh", keep.astype(np.float64), x.astype(np.float64)).astype(np.float32)
    return finish(pooled_sum, lengths), x, pooled_sum


def write_tiny_tokenizer(out_dir, vocab):
    """host/tokenizer.json for a random model (the `tokenizers` package): BERT's special tokens,
    then letters, word pieces of letters, digits and punctuation, cut to the model's `vocab` ids,
    so that any English text tokenizes (letter by letter) into ids the random tables hold.
    Returns its path. ImportError without the package."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + letters + ["##" + c for c in letters] + \
        list("0123456789.,!?'-:;()\"")
    words = {w: i for i, w in enumerate(pieces[:vocab])}
    tok = Tokenizer(models.WordPiece(words, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    os.makedirs(os.path.join(out_dir, "host"), exist_ok=True)
    path = os.path.join(out_dir, "host", "tokenizer.json")
    tok.save(path)
    return path


def cosine_matrix(e):
    e = np.asarray(e, dtype=np.float64)
    n = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    return n @ n.T


# ------------------------------------------------------------------ CLI

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="safetensors -> weights/*.npy, host/*.npy and a pipeline")
    c.add_argument("--model", default="models/minilm/hf", help="the unpacked model (scripts/fetch_minilm.sh)")
    c.add_argument("--out", default="models/minilm/fusebox")
    c.add_argument("--batch", type=int, default=4)
    c.add_argument("--seq", type=int, default=128)
    pp = sub.add_parser("pipeline", help="the symbolic pipeline minilm.json (no --batch/--seq), or a concrete "
                                         "one for a batch and sequence length")
    pp.add_argument("--out", default="models/minilm/fusebox")
    pp.add_argument("--batch", type=int)
    pp.add_argument("--seq", type=int)
    pp.add_argument("--max-batch", type=int, default=DYN_MAX_BATCH, help="the symbolic pipeline's largest B")
    r = sub.add_parser("random", help="random weights of the right shapes (tests, no download)")
    r.add_argument("--out", required=True)
    r.add_argument("--batch", type=int, default=2)
    r.add_argument("--seq", type=int, default=16)
    r.add_argument("--layers", type=int, default=2)
    r.add_argument("--hidden", type=int, default=64)
    r.add_argument("--heads", type=int, default=2)
    r.add_argument("--ffn", type=int, default=128)
    r.add_argument("--vocab", type=int, default=100)
    r.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "convert":
            p, cfg = load_hf(a.model)
            n = write_weights(p, cfg, a.out)
            # The runner's tokenizer travels with the converted weights (one folder to carry).
            shutil.copyfile(os.path.join(a.model, "tokenizer.json"), os.path.join(a.out, "host", "tokenizer.json"))
            # ... and its cut (max_seq_length), which the runner follows as sentence-transformers does.
            sbert = os.path.join(a.model, "sentence_bert_config.json")
            if os.path.isfile(sbert):
                shutil.copyfile(sbert, os.path.join(a.out, "host", "sentence_bert_config.json"))
            path = write_pipeline(a.out, a.batch, a.seq)
            dyn = write_dynamic_pipeline(a.out)
            print(f"minilm: wrote {n / 1e6:.1f} MB of weights into {a.out}; pipelines {dyn} (every shape: "
                  f"--shape B=..,S=..,N=B*S) and {path}")
        elif a.cmd == "pipeline":
            print(write_dynamic_pipeline(a.out, max_batch=a.max_batch) if a.batch is None and a.seq is None
                  else write_pipeline(a.out, a.batch, a.seq))
        else:
            cfg = check_config(dict(MINILM_CONFIG, layers=a.layers, hidden=a.hidden, heads=a.heads, ffn=a.ffn,
                                    vocab=a.vocab, max_pos=max(a.seq, 16)))
            write_weights(random_params(cfg, a.seed), cfg, a.out)
            print(write_pipeline(a.out, a.batch, a.seq))
            print(write_dynamic_pipeline(a.out))
            try:  # a letter-by-letter tokenizer: the folder runs in minilm_embed (fusebox model embed) as is
                print(write_tiny_tokenizer(a.out, cfg["vocab"]))
            except ImportError:
                print("minilm: no host/tokenizer.json written (the tokenizers package is not installed)",
                      file=sys.stderr)
    except (MiniLMError, OSError) as e:
        print(f"minilm: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
