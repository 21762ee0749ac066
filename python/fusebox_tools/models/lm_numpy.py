"""The language model of docs/lm.md in plain numpy: the independent CPU reference that fusebox's
trainer is checked against (forward, loss, the full backward, the batching rule, the LR schedule
and AdamW). Computes in float64 by default (--float32 for float32); small models only for the
backward, the loss runs any size one sequence at a time.

    python3 -m fusebox_tools.models.lm_numpy loss --config C --checkpoint CK --data TOKENS.npy \\
        --batch-index K [--bf16-weights] [--float32]          # prints {"loss": ...}
    python3 -m fusebox_tools.models.lm_numpy grads --config C --checkpoint CK --data TOKENS.npy \\
        --out grads.safetensors [--batch-index 0]             # grad.<name> F32, metadata loss
    python3 -m fusebox_tools.models.lm_numpy train --config C --checkpoint CK --data DIR \\
        --steps N --csv losses.csv [--save ck.safetensors]    # tiny models: step,loss,lr,grad_norm
    python3 -m fusebox_tools.models.lm_numpy init --config C --out init.safetensors [--seed S]

--config may be left out when the checkpoint's metadata carries the config (docs/lm.md,
Checkpoints). --data is a token .npy or a data folder (its train.npy; val.npy for validation).
--bf16-weights rounds the fp32 master weights to bf16 (nearest even) first, as fusebox does, for
the comparison with its bf16 step-0 loss (expect about 1e-2 relative agreement).

Not shared with fusebox_tools.models.lm_torch on purpose: the two are independent references.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

from fusebox_tools.core import safetensors_np

MODEL_DEFAULTS = {"dim": 768, "layers": 12, "heads": 12, "kv_heads": 4, "head_dim": 64, "ffn_dim": 2048,
                  "context": 1024, "rope_theta": 10000.0, "norm_eps": 1e-5, "init_std": 0.02}
# val_batches is not in docs/lm.md's example; 4 as in fusebox/train.h (--val-batches overrides).
TRAIN_DEFAULTS = {"batch": 32, "accum": 1, "lr": 6e-4, "min_lr": 6e-5, "warmup": 100, "weight_decay": 0.1,
                  "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "clip": 1.0, "seed": 1, "val_batches": 4}


# ---------------------------------------------------------------- config and parameters

def load_config(src):
    """(model, train) dicts with defaults filled in, from a path, JSON text or a dict."""
    if isinstance(src, dict):
        doc = src
    elif isinstance(src, str) and src.lstrip().startswith("{"):
        doc = json.loads(src)
    else:
        with open(src) as f:
            doc = json.load(f)
    model = dict(MODEL_DEFAULTS, **doc.get("model", {}))
    train = dict(TRAIN_DEFAULTS, **doc.get("train", {}))
    if "vocab" not in model:
        raise ValueError("config: model.vocab is required")
    if model["heads"] % model["kv_heads"]:
        raise ValueError(f"config: heads {model['heads']} is not a multiple of kv_heads {model['kv_heads']}")
    if model["head_dim"] % 2:
        raise ValueError(f"config: head_dim {model['head_dim']} must be even")
    return model, train


def param_shapes(m):
    """name -> shape, in docs/lm.md's order."""
    d, hd, f = m["dim"], m["head_dim"], m["ffn_dim"]
    out = {"tok_embeddings": (m["vocab"], d)}
    for i in range(m["layers"]):
        p = f"layers.{i}."
        out.update({p + "attention_norm": (d,), p + "wq": (d, m["heads"] * hd), p + "wk": (d, m["kv_heads"] * hd),
                    p + "wv": (d, m["kv_heads"] * hd), p + "wo": (m["heads"] * hd, d), p + "ffn_norm": (d,),
                    p + "w_gate": (d, f), p + "w_up": (d, f), p + "w_down": (f, d)})
    out["norm"] = (d,)
    out["output"] = (d, m["vocab"])
    return out


def init_params(m, seed):
    """docs/lm.md's initialization with numpy's generator (not fusebox's: comparisons share the file)."""
    rng = np.random.default_rng(seed)
    small = m["init_std"] / math.sqrt(2 * m["layers"])
    out = {}
    for name, shape in param_shapes(m).items():
        if len(shape) == 1:
            out[name] = np.ones(shape, np.float32)
        else:
            std = small if name.endswith((".wo", ".w_down")) else m["init_std"]
            out[name] = (rng.standard_normal(shape) * std).astype(np.float32)
    return out


def load_checkpoint(path, m):
    """name -> float32 array for every parameter of docs/lm.md, shapes checked."""
    have = set(safetensors_np.keys(path))
    out = {}
    for name, shape in param_shapes(m).items():
        if name not in have:
            raise KeyError(f"{path}: no parameter {name!r}")
        a = safetensors_np.read(path, name)
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{path}: {name} has shape {list(a.shape)}, the config says {list(shape)}")
        out[name] = a.astype(np.float32)
    return out


def save_checkpoint(path, params, adam_m, adam_v, step, sequences, config_doc):
    """docs/lm.md's checkpoint: parameters, adam_m.* and adam_v.* F32 and the metadata; written to a
    temporary file and renamed."""
    tensors = {k: np.asarray(v, np.float32) for k, v in params.items()}
    tensors.update({"adam_m." + k: np.asarray(v, np.float32) for k, v in adam_m.items()})
    tensors.update({"adam_v." + k: np.asarray(v, np.float32) for k, v in adam_v.items()})
    meta = {"format": "fusebox-lm/1", "step": str(step), "sequences": str(sequences),
            "config": json.dumps(config_doc)}
    tmp = path + ".tmp"
    safetensors_np.write(tmp, tensors, metadata=meta)
    os.replace(tmp, path)


def round_bf16(a):
    """float32 values rounded to the nearest bf16 (ties to even), as float32."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return np.where(np.isnan(a), a, r.view(np.float32)).astype(np.float32)


# ---------------------------------------------------------------- data, schedule

def load_tokens(path):
    """A 1-D token stream (.npy, uint16 or int32), memory-mapped."""
    t = np.load(path, mmap_mode="r")
    if t.ndim != 1:
        raise ValueError(f"{path}: tokens must be 1-D, got shape {t.shape}")
    return t


def n_sequences(n_tokens, context):
    n_seq = (n_tokens - 1) // context
    if n_seq < 1:
        raise ValueError(f"{n_tokens} tokens hold no sequence of {context} (+1 label)")
    return n_seq


def sequences_at(tokens, context, first, count):
    """Sequences first .. first+count-1 of the batching rule: (inputs, labels), int64 [count, S]."""
    n_seq = n_sequences(len(tokens), context)
    m = np.arange(first, first + count) % n_seq
    idx = m[:, None] * context + np.arange(context)[None, :]
    return np.asarray(tokens[idx], np.int64), np.asarray(tokens[idx + 1], np.int64)


def micro_batch(tokens, context, batch, k):
    """Micro-batch k: sequences k*B ... k*B + B - 1."""
    return sequences_at(tokens, context, k * batch, batch)


def lr_at(s, total, t):
    """docs/lm.md's learning rate of optimizer step s (from 0) of `total`."""
    if s < t["warmup"]:
        return t["lr"] * (s + 1) / t["warmup"]
    frac = min(1.0, (s - t["warmup"]) / max(1, total - t["warmup"]))
    return t["min_lr"] + (t["lr"] - t["min_lr"]) * (1 + math.cos(math.pi * frac)) / 2


# ---------------------------------------------------------------- the model

def rope_tables(context, head_dim, theta):
    """cos, sin [S, head_dim/2] (float64): theta_{p,i} = p * rope_theta^(-2i/head_dim)."""
    i = np.arange(head_dim // 2, dtype=np.float64)
    ang = np.arange(context, dtype=np.float64)[:, None] * float(theta) ** (-2.0 * i / head_dim)[None, :]
    return np.cos(ang), np.sin(ang)


def rope(x, cos, sin, inverse=False):
    """The half layout on x [B, S, heads, head_dim]; inverse rotates back (the backward)."""
    h = x.shape[-1] // 2
    S = x.shape[1]
    c, s = cos[None, :S, None, :].astype(x.dtype), sin[None, :S, None, :].astype(x.dtype)
    if inverse:
        s = -s
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def attention(q, k, v):
    """Causal attention, scale 1/sqrt(head_dim); q [B,S,H,D], k and v [B,S,KV,D]; query head j
    reads KV head j // (H / KV). Returns (o [B,S,H,D], probabilities [B,H,S,S], k and v expanded)."""
    H, KV, D = q.shape[2], k.shape[2], q.shape[3]
    g = H // KV
    ke, ve = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)  # head j -> KV head j // g
    sc = np.einsum("bshd,bthd->bhst", q, ke) / math.sqrt(D)
    S = q.shape[1]
    sc = np.where(np.triu(np.ones((S, S), bool), 1), -np.inf, sc)
    sc = sc - sc.max(-1, keepdims=True)
    p = np.exp(sc)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", p, ve), p, ke, ve


def _rms(x, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
    return x * r, r


def _rms_back(dy, x, r):
    """d/dx of y = x * r(x), r = (mean(x^2) + eps)^-1/2."""
    return r * dy - x * r ** 3 * np.mean(dy * x, -1, keepdims=True)


def forward(params, m, ids, dtype=np.float64, keep=False):
    """logits [B, S, vocab] of ids [B, S]; with keep, also the activations the backward needs."""
    P = {k: np.asarray(v, dtype) for k, v in params.items()}
    B, S = ids.shape
    H, KV, D, eps = m["heads"], m["kv_heads"], m["head_dim"], m["norm_eps"]
    cos, sin = rope_tables(S, D, m["rope_theta"])
    h = P["tok_embeddings"][ids]
    caches = []
    for i in range(m["layers"]):
        L = f"layers.{i}."
        c = {"h0": h}
        c["y1"], c["r1"] = _rms(h, eps)
        a = c["a"] = c["y1"] * P[L + "attention_norm"]
        q = (a @ P[L + "wq"]).reshape(B, S, H, D)
        k = (a @ P[L + "wk"]).reshape(B, S, KV, D)
        v = (a @ P[L + "wv"]).reshape(B, S, KV, D)
        c["qr"] = rope(q, cos, sin)
        o, c["p"], c["ke"], c["ve"] = attention(c["qr"], rope(k, cos, sin), v)
        c["o"] = o.reshape(B, S, H * D)
        h = c["h1"] = h + c["o"] @ P[L + "wo"]
        c["y2"], c["r2"] = _rms(h, eps)
        mm = c["m"] = c["y2"] * P[L + "ffn_norm"]
        c["gate"], c["up"] = mm @ P[L + "w_gate"], mm @ P[L + "w_up"]
        c["sig"] = 1.0 / (1.0 + np.exp(-c["gate"]))
        c["act"] = c["gate"] * c["sig"] * c["up"]
        h = h + c["act"] @ P[L + "w_down"]
        if keep:
            caches.append(c)
    yN, rN = _rms(h, eps)
    f = yN * P["norm"]
    logits = f @ P["output"]
    if not keep:
        return logits
    return logits, {"P": P, "layers": caches, "h": h, "yN": yN, "rN": rN, "f": f, "cos": cos, "sin": sin}


def cross_entropy_sum(logits, labels):
    """sum over tokens of -log softmax(logits)[label], and the probabilities."""
    mx = logits.max(-1, keepdims=True)
    e = np.exp(logits - mx)
    z = e.sum(-1, keepdims=True)
    lse = (mx + np.log(z))[..., 0]
    picked = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    return float(np.sum(lse - picked)), e / z


def loss(params, m, ids, labels, dtype=np.float64, rows=1):
    """Mean cross-entropy over the B*S tokens, computed `rows` sequences at a time."""
    total = 0.0
    for r in range(0, ids.shape[0], rows):
        total += cross_entropy_sum(forward(params, m, ids[r:r + rows], dtype), labels[r:r + rows])[0]
    return total / ids.size


def _backward(cache, m, ids, probs, labels, scale):
    """Gradients of scale * sum of the token losses, given forward(keep=True)'s cache."""
    P, B, S = cache["P"], ids.shape[0], ids.shape[1]
    H, KV, D, dim = m["heads"], m["kv_heads"], m["head_dim"], m["dim"]
    g = H // KV
    G = {}
    dlog = probs.copy()
    np.put_along_axis(dlog, labels[..., None], np.take_along_axis(dlog, labels[..., None], -1) - 1, -1)
    dlog *= scale

    def mat(x):
        return x.reshape(-1, x.shape[-1])

    G["output"] = mat(cache["f"]).T @ mat(dlog)
    df = dlog @ P["output"].T
    G["norm"] = np.sum(mat(df * cache["yN"]), 0)
    dh = _rms_back(df * P["norm"], cache["h"], cache["rN"])
    cos, sin = cache["cos"], cache["sin"]
    for i in reversed(range(m["layers"])):
        L, c = f"layers.{i}.", cache["layers"][i]
        # feed-forward: h2 = h1 + (silu(m Wg) * (m Wu)) Wd
        G[L + "w_down"] = mat(c["act"]).T @ mat(dh)
        dact = dh @ P[L + "w_down"].T
        sg, gate = c["sig"], c["gate"]
        dgate = dact * c["up"] * sg * (1 + gate * (1 - sg))
        dup = dact * gate * sg
        G[L + "w_gate"] = mat(c["m"]).T @ mat(dgate)
        G[L + "w_up"] = mat(c["m"]).T @ mat(dup)
        dm = dgate @ P[L + "w_gate"].T + dup @ P[L + "w_up"].T
        G[L + "ffn_norm"] = np.sum(mat(dm * c["y2"]), 0)
        dh = dh + _rms_back(dm * P[L + "ffn_norm"], c["h1"], c["r2"])
        # attention: h1 = h0 + o Wo
        G[L + "wo"] = mat(c["o"]).T @ mat(dh)
        do = (dh @ P[L + "wo"].T).reshape(B, S, H, D)
        p = c["p"]
        dp = np.einsum("bshd,bthd->bhst", do, c["ve"])
        dve = np.einsum("bhst,bshd->bthd", p, do)
        ds = p * (dp - np.sum(dp * p, -1, keepdims=True)) / math.sqrt(D)
        dqr = np.einsum("bhst,bthd->bshd", ds, c["ke"])
        dke = np.einsum("bhst,bshd->bthd", ds, c["qr"])
        dk = rope(dke.reshape(B, S, KV, g, D).sum(3), cos, sin, inverse=True).reshape(B, S, KV * D)
        dv = dve.reshape(B, S, KV, g, D).sum(3).reshape(B, S, KV * D)
        dq = rope(dqr, cos, sin, inverse=True).reshape(B, S, H * D)
        a = mat(c["a"])
        G[L + "wq"], G[L + "wk"], G[L + "wv"] = a.T @ mat(dq), a.T @ mat(dk), a.T @ mat(dv)
        da = dq @ P[L + "wq"].T + dk @ P[L + "wk"].T + dv @ P[L + "wv"].T
        G[L + "attention_norm"] = np.sum(mat(da * c["y1"]), 0)
        dh = dh + _rms_back(da * P[L + "attention_norm"], c["h0"], c["r1"])
    emb = np.zeros((m["vocab"], dim), dh.dtype)
    np.add.at(emb, ids.reshape(-1), mat(dh))
    G["tok_embeddings"] = emb
    return G


def loss_and_grads(params, m, ids, labels, dtype=np.float64, rows=None):
    """(mean cross-entropy over the B*S tokens, name -> gradient), `rows` sequences at a time."""
    rows = rows or ids.shape[0]
    total, grads = 0.0, None
    for r in range(0, ids.shape[0], rows):
        i, lab = ids[r:r + rows], labels[r:r + rows]
        logits, cache = forward(params, m, i, dtype, keep=True)
        s, probs = cross_entropy_sum(logits, lab)
        total += s
        g = _backward(cache, m, i, probs, lab, 1.0 / ids.size)
        grads = g if grads is None else {k: grads[k] + g[k] for k in grads}
    return total / ids.size, {k: grads[k] for k in param_shapes(m)}


# ---------------------------------------------------------------- the optimizer step

def train(params, m, t, tokens, steps, total=None, start_step=0, sequences=None, adam=None, dtype=np.float64,
          on_step=None):
    """Runs optimizer steps start_step .. start_step+steps-1 of `total` (default their end) in place
    on params (float64 copies are returned). Returns (params, (adam_m, adam_v), sequences, rows)
    with rows [(step, loss, lr, grad_norm)]."""
    total = total or start_step + steps
    B, S, accum = t["batch"], m["context"], t["accum"]
    P = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
    am, av = adam or ({k: np.zeros_like(v) for k, v in P.items()}, {k: np.zeros_like(v) for k, v in P.items()})
    am = {k: np.asarray(v, np.float64).copy() for k, v in am.items()}
    av = {k: np.asarray(v, np.float64).copy() for k, v in av.items()}
    seq = start_step * accum * B if sequences is None else sequences
    rows = []
    for s in range(start_step, start_step + steps):
        G = {k: np.zeros_like(v) for k, v in P.items()}
        step_loss = 0.0
        for _ in range(accum):
            ids, labels = sequences_at(tokens, S, seq, B)
            seq += B
            lv, g = loss_and_grads(P, m, ids, labels, dtype)
            step_loss += lv / accum
            for k in G:
                G[k] += g[k] / accum
        norm = math.sqrt(sum(float(np.sum(g * g)) for g in G.values()))
        coef = t["clip"] / (norm + 1e-6)
        if coef < 1:
            G = {k: g * coef for k, g in G.items()}
        lr = lr_at(s, total, t)
        n = s + 1
        b1, b2 = t["beta1"], t["beta2"]
        for k, p in P.items():
            if p.ndim == 2:
                p -= lr * t["weight_decay"] * p
            am[k] = b1 * am[k] + (1 - b1) * G[k]
            av[k] = b2 * av[k] + (1 - b2) * G[k] ** 2
            p -= lr * (am[k] / (1 - b1 ** n)) / (np.sqrt(av[k] / (1 - b2 ** n)) + t["eps"])
        rows.append((s, step_loss, lr, norm))
        if on_step:
            on_step(*rows[-1])
    return P, (am, av), seq, rows


def val_loss(params, m, t, tokens, batches, dtype=np.float64):
    """Mean loss over micro-batches 0 .. batches-1 of the validation stream."""
    return float(np.mean([loss(params, m, *micro_batch(tokens, m["context"], t["batch"], k), dtype)
                          for k in range(batches)]))


# ---------------------------------------------------------------- CLI

def _setup(args):
    cfg = args.config
    if cfg is None:
        meta = safetensors_np.metadata(args.checkpoint)
        if "config" not in meta:
            sys.exit(f"{args.checkpoint}: no config in its metadata; pass --config")
        cfg = json.loads(meta["config"])
    model, tr = load_config(cfg)
    if getattr(args, "batch", None):
        tr["batch"] = args.batch
    params = load_checkpoint(args.checkpoint, model)
    if getattr(args, "bf16_weights", False):
        params = {k: round_bf16(v) for k, v in params.items()}
    return model, tr, params


def _data_paths(data, val=None):
    if os.path.isdir(data):
        return os.path.join(data, "train.npy"), val or os.path.join(data, "val.npy")
    return data, val or os.path.join(os.path.dirname(os.path.abspath(data)), "val.npy")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m fusebox_tools.models.lm_numpy", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--config", help="config JSON (default: the checkpoint's metadata)")
        p.add_argument("--checkpoint", required=True)
        p.add_argument("--data", required=True, help="tokens .npy, or a data folder (its train.npy)")
        p.add_argument("--batch", type=int, help="override train.batch")
        p.add_argument("--float32", action="store_true", help="compute in float32 (default float64)")
        p.add_argument("--bf16-weights", action="store_true", help="round the weights to bf16 first")

    p = sub.add_parser("loss", help="mean cross-entropy of micro-batch K")
    common(p)
    p.add_argument("--batch-index", type=int, default=0)
    p.add_argument("--rows", type=int, default=1, help="sequences per forward (memory)")
    p = sub.add_parser("grads", help="loss and gradients of micro-batch K (small models)")
    common(p)
    p.add_argument("--batch-index", type=int, default=0)
    p.add_argument("--out", required=True)
    p = sub.add_parser("train", help="optimizer steps (tiny models)")
    common(p)
    p.add_argument("--val", help="validation tokens (default val.npy beside the data)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--total-steps", type=int, help="T of the LR schedule (default: the end of this run)")
    p.add_argument("--val-batches", type=int)
    p.add_argument("--csv", required=True)
    p.add_argument("--save", help="write the checkpoint after the last step")
    p = sub.add_parser("init", help="a step-0 checkpoint with numpy's generator")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int)
    args = ap.parse_args(argv)

    if args.cmd == "init":
        with open(args.config) as f:
            doc = json.load(f)
        model, tr = load_config(doc)
        params = init_params(model, tr["seed"] if args.seed is None else args.seed)
        zeros = {k: np.zeros_like(v) for k, v in params.items()}
        save_checkpoint(args.out, params, zeros, zeros, 0, 0, doc)
        print(json.dumps({"out": args.out, "parameters": int(sum(v.size for v in params.values()))}))
        return 0

    model, tr, params = _setup(args)
    dtype = np.float32 if args.float32 else np.float64
    train_path, val_path = _data_paths(args.data, getattr(args, "val", None))
    tokens = load_tokens(train_path)
    if args.cmd == "loss":
        ids, labels = micro_batch(tokens, model["context"], tr["batch"], args.batch_index)
        lv = loss(params, model, ids, labels, dtype, rows=args.rows)
        print(json.dumps({"loss": lv, "batch_index": args.batch_index, "tokens": int(ids.size),
                          "dtype": np.dtype(dtype).name, "bf16_weights": bool(args.bf16_weights)}))
    elif args.cmd == "grads":
        ids, labels = micro_batch(tokens, model["context"], tr["batch"], args.batch_index)
        lv, grads = loss_and_grads(params, model, ids, labels, dtype, rows=1)
        safetensors_np.write(args.out, {"grad." + k: g.astype(np.float32) for k, g in grads.items()},
                             metadata={"loss": repr(lv), "batch_index": args.batch_index, "source": "lm_numpy",
                                       "dtype": np.dtype(dtype).name})
        print(json.dumps({"loss": lv, "out": args.out}))
    elif args.cmd == "train":
        meta = safetensors_np.metadata(args.checkpoint)
        start = int(meta.get("step", 0))
        seqs = int(meta.get("sequences", start * tr["accum"] * tr["batch"]))
        keys = set(safetensors_np.keys(args.checkpoint))
        adam = None
        if start > 0 and all("adam_m." + k in keys and "adam_v." + k in keys for k in params):
            adam = ({k: safetensors_np.read(args.checkpoint, "adam_m." + k) for k in params},
                    {k: safetensors_np.read(args.checkpoint, "adam_v." + k) for k in params})
        with open(args.csv, "w") as f:
            f.write("step,loss,lr,grad_norm\n")

            def log(s, lv, lr, gn):
                f.write(f"{s},{lv:.6f},{lr:.8g},{gn:.6f}\n")
                f.flush()

            P, (am, av), seqs, rows = train(params, model, tr, tokens, args.steps, args.total_steps, start, seqs,
                                            adam, dtype, on_step=log)
        out = {"steps": args.steps, "final_loss": rows[-1][1] if rows else None, "csv": args.csv}
        vb = args.val_batches if args.val_batches is not None else tr["val_batches"]
        if vb and os.path.exists(val_path):
            out["val_loss"], out["val_batches"] = val_loss(P, model, tr, load_tokens(val_path), vb, dtype), vb
        if args.save:
            doc = {"model": model, "train": tr}
            save_checkpoint(args.save, P, am, av, start + args.steps, seqs, doc)
            out["checkpoint"] = args.save
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
