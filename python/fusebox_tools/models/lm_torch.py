"""The language model of docs/lm.md in plain torch: an independent reference for fusebox's trainer
(issue 33). Shares no code with fusebox or with fusebox_tools.models.lm_numpy; it reads and writes
files with fusebox_tools.core.safetensors_np only. Parameters carry docs/lm.md's names and shapes
(matrices [in, out], a layer computes x @ W); on CUDA the model runs under bf16 autocast (fp32
master weights and residual stream, bf16 matmuls and attention, fp32 norms, softmax statistics and
loss); on CPU in fp32. Attention is F.scaled_dot_product_attention(is_causal=True) with GQA
(enable_gqa where torch has it, else repeat_interleave: query head j reads KV head j // (H/KV)).

    python3 -m fusebox_tools.models.lm_torch grads --checkpoint init.safetensors --data DIR \\
        --out torch_grads.safetensors [--config C] [--batch-index 0]
    python3 -m fusebox_tools.models.lm_torch compare-grads fusebox_grads.safetensors torch_grads.safetensors
    python3 -m fusebox_tools.models.lm_torch train --checkpoint init.safetensors --data DIR --steps 500 \\
        --csv torch_losses.csv [--save out.safetensors] [--compile default]
    python3 -m fusebox_tools.models.lm_torch compare-losses fusebox_losses.csv torch_losses.csv --last 100
    python3 -m fusebox_tools.models.lm_torch bench --config C [--checkpoint CK] [--data DIR] \\
        [--modes eager,default,max-autotune-no-cudagraphs,reduce-overhead] [--json out.json]

grads writes `grad.<name>` (F32) for every parameter and metadata `loss`; compare-grads A B prints
per tensor rel-L2 = |a-b|_2/|b|_2 and the max abs error, and exits 1 when a rel-L2 is over 3e-2,
a tensor is missing, or the losses differ by more than 3e-2 relative. train writes
`step,loss,lr,grad_norm` per optimizer step and prints a JSON summary with the validation loss.
bench needs CUDA. compare-grads and compare-losses need numpy only. docs/lm-torch.md has the
commands of the H200 comparison.
"""
import argparse
import contextlib
import csv
import gc
import json
import math
import os
import statistics
import sys
import time

import numpy as np

from fusebox_tools.core import safetensors_np

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:  # compare-grads and compare-losses work without torch
    torch = F = nn = None

_MODEL = {"dim": 768, "layers": 12, "heads": 12, "kv_heads": 4, "head_dim": 64, "ffn_dim": 2048, "context": 1024,
          "rope_theta": 10000.0, "norm_eps": 1e-5, "init_std": 0.02}
_TRAIN = {"batch": 32, "accum": 1, "lr": 6e-4, "min_lr": 6e-5, "warmup": 100, "weight_decay": 0.1, "beta1": 0.9,
          "beta2": 0.95, "eps": 1e-8, "clip": 1.0, "seed": 1, "val_batches": 4}
PEAK_FLOPS = 813e12
MFU_FORMULA = ("MFU = (6 * N + 6 * layers * context * dim) * tokens_per_s / peak_flops, N = every parameter "
               "but tok_embeddings (the output matrix is a matmul and counts)")


def _need_torch():
    if torch is None:
        sys.exit("lm_torch: this command needs torch (pip install torch)")


def config(src):
    """(model, train, the document) from a path, JSON text or dict, defaults filled in."""
    if isinstance(src, dict):
        doc = src
    elif isinstance(src, str) and src.lstrip().startswith("{"):
        doc = json.loads(src)
    else:
        with open(src) as f:
            doc = json.load(f)
    m = {**_MODEL, **doc.get("model", {})}
    t = {**_TRAIN, **doc.get("train", {})}
    if "vocab" not in m:
        raise ValueError("config: model.vocab is required")
    if m["heads"] % m["kv_heads"] or m["head_dim"] % 2:
        raise ValueError("config: heads must be a multiple of kv_heads and head_dim even")
    return m, t, doc


def learning_rate(step, total, t):
    """Warmup (step+1)/warmup, then cosine from lr to min_lr over the remaining steps."""
    w = t["warmup"]
    if step < w:
        return t["lr"] * (step + 1) / w
    progress = min(1.0, (step - w) / max(1, total - w))
    return t["min_lr"] + 0.5 * (t["lr"] - t["min_lr"]) * (1.0 + math.cos(math.pi * progress))


class Tokens:
    """A token stream under the batching rule: sequence j is m = j mod n_seq,
    inputs tokens[m*S : m*S+S], labels shifted by one."""

    def __init__(self, path, context):
        self.t = np.load(path, mmap_mode="r")
        self.S = context
        self.n_seq = (len(self.t) - 1) // context
        if self.t.ndim != 1 or self.n_seq < 1:
            raise ValueError(f"{path}: not a 1-D stream of more than {context} tokens")

    def batch(self, first_sequence, count):
        rows = [(j % self.n_seq) * self.S for j in range(first_sequence, first_sequence + count)]
        x = np.stack([np.asarray(self.t[r:r + self.S + 1], np.int64) for r in rows])
        return torch.from_numpy(x[:, :-1].copy()), torch.from_numpy(x[:, 1:].copy())

    def micro_batch(self, k, batch):
        return self.batch(k * batch, batch)


# ---------------------------------------------------------------- the model

def _has_enable_gqa():
    if torch is None:
        return False
    try:
        major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 5)


def rms_norm(x, gain, eps):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


def apply_rope(x, cos, sin):
    """Half layout on x [B, heads, S, head_dim]; cos, sin [S, head_dim/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module if nn else object):
    def __init__(self, m, gqa):
        super().__init__()
        d, hd, f = m["dim"], m["head_dim"], m["ffn_dim"]
        self.m, self.gqa = m, gqa
        self.attention_norm = nn.Parameter(torch.ones(d))
        self.wq = nn.Parameter(torch.zeros(d, m["heads"] * hd))
        self.wk = nn.Parameter(torch.zeros(d, m["kv_heads"] * hd))
        self.wv = nn.Parameter(torch.zeros(d, m["kv_heads"] * hd))
        self.wo = nn.Parameter(torch.zeros(m["heads"] * hd, d))
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.w_gate = nn.Parameter(torch.zeros(d, f))
        self.w_up = nn.Parameter(torch.zeros(d, f))
        self.w_down = nn.Parameter(torch.zeros(f, d))

    def forward(self, h, cos, sin):
        m = self.m
        B, S, _ = h.shape
        H, KV, D = m["heads"], m["kv_heads"], m["head_dim"]
        a = rms_norm(h, self.attention_norm, m["norm_eps"])
        q = (a @ self.wq).view(B, S, H, D).transpose(1, 2)
        k = (a @ self.wk).view(B, S, KV, D).transpose(1, 2)
        v = (a @ self.wv).view(B, S, KV, D).transpose(1, 2)
        q, k = apply_rope(q, cos, sin).to(v.dtype), apply_rope(k, cos, sin).to(v.dtype)
        if H != KV and self.gqa == "repeat":
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        kw = {"enable_gqa": True} if H != KV and self.gqa == "enable_gqa" else {}
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(D), **kw)
        h = h + o.transpose(1, 2).reshape(B, S, H * D) @ self.wo
        x = rms_norm(h, self.ffn_norm, m["norm_eps"])
        return h + (F.silu(x @ self.w_gate) * (x @ self.w_up)) @ self.w_down


class LM(nn.Module if nn else object):
    """docs/lm.md's model; named_parameters() gives its parameter names."""

    def __init__(self, m, gqa="auto"):
        super().__init__()
        if gqa == "auto":
            gqa = "enable_gqa" if _has_enable_gqa() else "repeat"
        self.m = m
        self.tok_embeddings = nn.Parameter(torch.zeros(m["vocab"], m["dim"]))
        self.layers = nn.ModuleList([Block(m, gqa) for _ in range(m["layers"])])
        self.norm = nn.Parameter(torch.ones(m["dim"]))
        self.output = nn.Parameter(torch.zeros(m["dim"], m["vocab"]))
        half = m["head_dim"] // 2
        inv = float(m["rope_theta"]) ** (-2.0 * torch.arange(half, dtype=torch.float64) / m["head_dim"])
        ang = torch.arange(m["context"], dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def forward(self, ids, labels=None):
        S = ids.shape[1]
        cos, sin = self.cos[:S], self.sin[:S]
        h = F.embedding(ids, self.tok_embeddings)
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = rms_norm(h, self.norm, self.m["norm_eps"]) @ self.output
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def load(cfg, checkpoint=None, device="cpu", gqa="auto", seed=None):
    """LM with fp32 weights from `checkpoint` (docs/lm.md's names, matrices [in, out]); without a
    checkpoint, docs/lm.md's initialization with torch's generator (seed: train.seed)."""
    _need_torch()
    m, t, _ = config(cfg)
    model = LM(m, gqa)
    if checkpoint:
        have = set(safetensors_np.keys(checkpoint))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name not in have:
                    raise KeyError(f"{checkpoint}: no parameter {name!r}")
                a = safetensors_np.read(checkpoint, name)
                if tuple(a.shape) != tuple(p.shape):
                    raise ValueError(f"{checkpoint}: {name} has shape {list(a.shape)}, expected {list(p.shape)}")
                p.copy_(torch.from_numpy(np.ascontiguousarray(a, np.float32)))
    else:
        g = torch.Generator().manual_seed(t["seed"] if seed is None else seed)
        small = m["init_std"] / math.sqrt(2 * m["layers"])
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    std = small if name.endswith((".wo", ".w_down")) else m["init_std"]
                    p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.to(device)


def autocast(device, precision):
    """bf16 autocast on CUDA (precision "bf16"), nothing for "fp32"."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def make_optimizer(model, t, fused=None):
    """torch.optim.AdamW; weight decay on the 2-D parameters only (embeddings and matrices)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() == 2]
    rest = [p for p in params if p.dim() != 2]
    if fused is None:
        fused = params[0].is_cuda
    return torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"], fused=bool(fused))


# ---------------------------------------------------------------- commands

def _device(args):
    _need_torch()
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("lm_torch: --device cuda but torch.cuda.is_available() is False (no CUDA device or a CPU torch)")
    prec = args.precision or ("bf16" if dev.startswith("cuda") else "fp32")
    if dev == "cpu" and args.device is None:
        print("lm_torch: no CUDA device, running on the CPU in fp32", file=sys.stderr)
    return dev, prec


def _config_source(args):
    if args.config:
        return args.config
    if args.checkpoint:
        meta = safetensors_np.metadata(args.checkpoint)
        if "config" in meta:
            return meta["config"]
    sys.exit("lm_torch: pass --config (the checkpoint has no config in its metadata)")


def _streams(data, val=None):
    if os.path.isdir(data):
        return os.path.join(data, "train.npy"), val or os.path.join(data, "val.npy")
    return data, val or os.path.join(os.path.dirname(os.path.abspath(data)), "val.npy")


def cmd_grads(args):
    dev, prec = _device(args)
    src = _config_source(args)
    m, t, _ = config(src)
    model = load(src, args.checkpoint, dev, args.gqa)
    ids, labels = Tokens(_streams(args.data)[0], m["context"]).micro_batch(args.batch_index, args.batch or t["batch"])
    with autocast(dev, prec):
        loss = model(ids.to(dev), labels.to(dev))
    loss.backward()
    grads = {"grad." + n: p.grad.detach().float().cpu().numpy() for n, p in model.named_parameters()}
    lv = loss.item()
    safetensors_np.write(args.out, grads, metadata={
        "loss": repr(lv), "batch_index": args.batch_index, "source": "lm_torch", "precision": prec,
        "device": torch.cuda.get_device_name() if dev.startswith("cuda") else "cpu", "torch": torch.__version__})
    print(json.dumps({"loss": lv, "out": args.out, "precision": prec}))
    return 0


def compare_grads(a_path, b_path, tol_grad=3e-2, tol_loss=3e-2):
    """Per tensor rel-L2 |a-b|/|b| and max |a-b| (b is the reference); (rows, loss row, ok)."""
    rows, ok = [], True
    a_keys = set(safetensors_np.keys(a_path))
    for k in sorted(k for k in safetensors_np.keys(b_path) if k.startswith("grad.")):
        b = safetensors_np.read(b_path, k).astype(np.float64)
        if k not in a_keys:
            rows.append({"name": k, "error": f"missing in {a_path}"})
            ok = False
            continue
        a = safetensors_np.read(a_path, k).astype(np.float64)
        if a.shape != b.shape:
            rows.append({"name": k, "error": f"shape {list(a.shape)} vs {list(b.shape)}"})
            ok = False
            continue
        nb = float(np.linalg.norm(b))
        rel = float(np.linalg.norm(a - b)) / nb if nb > 0 else float(np.linalg.norm(a))
        good = bool(np.isfinite(rel) and rel <= tol_grad)
        ok &= good
        rows.append({"name": k, "rel_l2": rel, "max_abs_err": float(np.max(np.abs(a - b))) if a.size else 0.0,
                     "norm_ref": nb, "ok": good})
    if not rows:
        ok = False
    la, lb = safetensors_np.metadata(a_path).get("loss"), safetensors_np.metadata(b_path).get("loss")
    loss_row = {"a": None if la is None else float(la), "b": None if lb is None else float(lb)}
    if la is None or lb is None:
        loss_row["error"] = "no loss in the metadata"
        ok = False
    else:
        loss_row["rel"] = abs(float(la) - float(lb)) / max(abs(float(lb)), 1e-12)
        loss_row["ok"] = loss_row["rel"] <= tol_loss
        ok &= loss_row["ok"]
    return rows, loss_row, ok


def cmd_compare_grads(args):
    rows, loss_row, ok = compare_grads(args.a, args.b, args.tol_grad, args.tol_loss)
    if args.json:
        print(json.dumps({"tensors": rows, "loss": loss_row, "ok": ok}, indent=1))
    else:
        print(f"{'tensor':40s} {'rel_l2':>10s} {'max_abs_err':>12s} {'|b|':>10s}")
        for r in rows:
            if "error" in r:
                print(f"{r['name']:40s} FAIL {r['error']}")
            else:
                print(f"{r['name']:40s} {r['rel_l2']:10.3e} {r['max_abs_err']:12.3e} {r['norm_ref']:10.3e}"
                      + ("" if r["ok"] else "  FAIL"))
        if "rel" in loss_row:
            print(f"loss a={loss_row['a']:.6f} b={loss_row['b']:.6f} rel={loss_row['rel']:.3e}"
                  + ("" if loss_row["ok"] else "  FAIL"))
        else:
            print(f"loss: FAIL {loss_row['error']}")
        worst = max((r["rel_l2"] for r in rows if "rel_l2" in r), default=float("nan"))
        print(f"{'PASS' if ok else 'FAIL'}: {len(rows)} tensors, worst rel-L2 {worst:.3e} (limit {args.tol_grad}),"
              f" loss limit {args.tol_loss} relative")
    return 0 if ok else 1


def _load_optimizer_state(opt, model, checkpoint, step):
    have = set(safetensors_np.keys(checkpoint))
    names = dict(model.named_parameters())
    if not all("adam_m." + n in have and "adam_v." + n in have for n in names):
        return False
    fused = bool(opt.defaults.get("fused"))
    for n, p in names.items():
        opt.state[p] = {  # torch.optim.AdamW's state: step on the device when fused, else on the CPU
            "step": torch.tensor(float(step), dtype=torch.float32, device=p.device if fused else "cpu"),
            "exp_avg": torch.from_numpy(safetensors_np.read(checkpoint, "adam_m." + n)).to(p.device),
            "exp_avg_sq": torch.from_numpy(safetensors_np.read(checkpoint, "adam_v." + n)).to(p.device)}
    return True


def train_steps(model, opt, tokens, m, t, start, steps, total, sequences, dev, prec, step_fn=None, on_step=None):
    """Optimizer steps start .. start+steps-1 of `total`: accum micro-batches (each loss its mean /
    accum), clip_grad_norm_, the LR of docs/lm.md, opt.step(). Returns (rows, sequences)."""
    fwd = model if step_fn is None else step_fn
    params = [p for p in model.parameters()]
    rows = []
    for s in range(start, start + steps):
        lr = learning_rate(s, total, t)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        acc = 0.0
        for _ in range(t["accum"]):
            ids, labels = tokens.batch(sequences, t["batch"])
            sequences += t["batch"]
            with autocast(dev, prec):
                loss = fwd(ids.to(dev, non_blocking=True), labels.to(dev, non_blocking=True))
            (loss / t["accum"]).backward()
            acc = acc + loss.detach() / t["accum"]
        norm = torch.nn.utils.clip_grad_norm_(params, t["clip"])
        opt.step()
        rows.append((s, float(acc), lr, float(norm)))
        if on_step:
            on_step(*rows[-1])
    return rows, sequences


def validation_loss(model, tokens, t, batches, dev, prec):
    """Mean of the losses of micro-batches 0 .. batches-1 (equal sizes: the token mean)."""
    total = 0.0
    with torch.no_grad():
        for k in range(batches):
            ids, labels = tokens.micro_batch(k, t["batch"])
            with autocast(dev, prec):
                total += float(model(ids.to(dev), labels.to(dev)))
    return total / batches


def _save(path, model, opt, step, sequences, doc):
    names = dict(model.named_parameters())
    tensors = {n: p.detach().float().cpu().numpy() for n, p in names.items()}
    for n, p in names.items():
        st = opt.state.get(p, {})
        for key, name in (("exp_avg", "adam_m."), ("exp_avg_sq", "adam_v.")):
            tensors[name + n] = st[key].float().cpu().numpy() if key in st else np.zeros(p.shape, np.float32)
    tmp = path + ".tmp"
    safetensors_np.write(tmp, tensors, metadata={"format": "fusebox-lm/1", "step": str(step),
                                                 "sequences": str(sequences), "config": json.dumps(doc)})
    os.replace(tmp, path)


def cmd_train(args):
    dev, prec = _device(args)
    src = _config_source(args)
    m, t, doc = config(src)
    if args.batch:
        t["batch"] = args.batch
    if args.accum:
        t["accum"] = args.accum
    model = load(src, args.checkpoint, dev, args.gqa)
    opt = make_optimizer(model, t, fused=dev.startswith("cuda"))
    meta = safetensors_np.metadata(args.checkpoint) if args.checkpoint else {}
    start = int(meta.get("step", 0))
    sequences = int(meta.get("sequences", start * t["accum"] * t["batch"]))
    resumed = start > 0 and _load_optimizer_state(opt, model, args.checkpoint, start)
    total = args.total_steps or start + args.steps
    train_path, val_path = _streams(args.data, args.val)
    tokens = Tokens(train_path, m["context"])
    step_fn = None
    if args.compile:
        step_fn = torch.compile(model, mode=None if args.compile == "default" else args.compile)
    t0 = time.time()
    with open(args.csv, "w", newline="") as f:
        f.write("step,loss,lr,grad_norm\n")

        def log(s, lv, lr, gn):
            f.write(f"{s},{lv:.6f},{lr:.8g},{gn:.6f}\n")
            f.flush()
            if args.log_every and (s % args.log_every == 0 or s == start + args.steps - 1):
                print(f"step {s} loss {lv:.4f} lr {lr:.3e} grad_norm {gn:.3f} ({time.time() - t0:.0f} s)",
                      file=sys.stderr)

        rows, sequences = train_steps(model, opt, tokens, m, t, start, args.steps, total, sequences, dev, prec,
                                      step_fn, log)
    out = {"steps": args.steps, "first_step": start, "total_steps": total, "resumed_optimizer": bool(resumed),
           "final_loss": rows[-1][1] if rows else None, "csv": args.csv, "precision": prec,
           "seconds": round(time.time() - t0, 1)}
    vb = args.val_batches if args.val_batches is not None else t["val_batches"]
    if vb and os.path.exists(val_path):
        model.eval()
        out["val_loss"] = validation_loss(model, Tokens(val_path, m["context"]), t, vb, dev, prec)
        out["val_batches"] = vb
    if args.save:
        _save(args.save, model, opt, start + args.steps, sequences, doc)
        out["checkpoint"] = args.save
    print(json.dumps(out))
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _read_losses(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "step" not in rows[0] or "loss" not in rows[0]:
        sys.exit(f"compare-losses: {path}: expected a CSV with a header step,loss,... and rows")
    return {int(r["step"]): float(r["loss"]) for r in rows}


def cmd_compare_losses(args):
    a, b = _read_losses(args.a), _read_losses(args.b)
    steps = sorted(set(a) & set(b))
    if not steps:
        sys.exit("compare-losses: the two files share no step")
    last = steps[-args.last:]
    diffs = [abs(a[s] - b[s]) for s in last]
    out = {"steps_compared": len(last), "from_step": last[0], "to_step": last[-1],
           "mean_abs_diff": sum(diffs) / len(diffs), "max_abs_diff": max(diffs),
           "mean_a": sum(a[s] for s in last) / len(last), "mean_b": sum(b[s] for s in last) / len(last),
           "final_a": a[steps[-1]], "final_b": b[steps[-1]], "limit": args.limit,
           "only_in_a": len(set(a) - set(b)), "only_in_b": len(set(b) - set(a))}
    out["ok"] = out["mean_abs_diff"] <= args.limit
    print(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


# ---------------------------------------------------------------- bench

MODES = ["eager", "default", "max-autotune-no-cudagraphs", "reduce-overhead"]


def flops_per_token(m):
    """6 * (parameters but tok_embeddings) + 6 * layers * context * dim (MFU_FORMULA)."""
    n = count_params(m) - m["vocab"] * m["dim"]
    return 6 * n + 6 * m["layers"] * m["context"] * m["dim"]


def count_params(m):
    """Every parameter of docs/lm.md's table."""
    d, hd, f = m["dim"], m["head_dim"], m["ffn_dim"]
    layer = 2 * d + d * m["heads"] * hd * 2 + d * m["kv_heads"] * hd * 2 + 3 * d * f
    return m["vocab"] * d * 2 + d + m["layers"] * layer


def _bench_mode(mode, src, ckpt, m, t, tokens, args, init_state, dev="cuda"):
    model = load(src, None if init_state else ckpt, dev, args.gqa)
    if init_state:
        model.load_state_dict(init_state)
    opt = make_optimizer(model, t, fused=dev.startswith("cuda"))
    fwd = model if mode == "eager" else torch.compile(model, mode=None if mode == "default" else mode)
    params = list(model.parameters())
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    micro = [tokens.micro_batch(k, t["batch"]) for k in range(t["accum"] * (1 + args.warmup + args.steps))]
    micro = [(i.to(dev), l.to(dev)) for i, l in micro]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    def step(s):
        if mode == "reduce-overhead" and mark:
            mark()
        for g in opt.param_groups:
            g["lr"] = learning_rate(s, args.warmup + args.steps + 1, t)
        opt.zero_grad(set_to_none=True)
        acc = None
        for a in range(t["accum"]):
            ids, labels = micro[s * t["accum"] + a]
            with autocast(dev, "bf16"):
                loss = fwd(ids, labels)
            (loss / t["accum"]).backward()
            d = loss.detach().clone() / t["accum"]
            acc = d if acc is None else acc + d
        torch.nn.utils.clip_grad_norm_(params, t["clip"])
        opt.step()
        return acc

    t0 = time.perf_counter()
    loss0 = float(step(0))
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    res = {"mode": mode, "step0_loss": loss0, "first_step_s": first_s}
    if not math.isfinite(loss0):
        raise RuntimeError(f"step-0 loss is {loss0}")
    if args.eager_loss is not None and abs(loss0 - args.eager_loss) > 2e-2 * abs(args.eager_loss):
        res.update(status="failed", error=f"step-0 loss {loss0:.6f} vs eager {args.eager_loss:.6f} "
                                          f"(over 2e-2 relative)")
        return res
    t1 = time.perf_counter()
    for s in range(1, 1 + args.warmup):
        step(s)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t1
    times = []
    for s in range(1 + args.warmup, 1 + args.warmup + args.steps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        last = step(s)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    last = float(last)
    ms = statistics.median(times)
    tokens_per_step = t["batch"] * m["context"] * t["accum"]
    tps = tokens_per_step / (ms / 1e3)
    res.update(status="ok", ms_per_step=ms, ms_min=min(times), ms_max=max(times), tokens_per_s=tps,
               mfu=flops_per_token(m) * tps / args.peak_flops, last_loss=last,
               peak_mem_gib=torch.cuda.max_memory_allocated() / 2 ** 30,
               compile_s=max(0.0, first_s + warm_s - (1 + args.warmup) * ms / 1e3))
    if not math.isfinite(last):
        res.update(status="failed", error=f"loss {last} after {args.warmup + args.steps} steps")
    return res


def markdown_rows(report):
    head = ("| mode | status | tokens/s | ms/step | MFU | peak GiB | compile s | step-0 loss |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    lines = [head]
    for r in report["modes"]:
        if r.get("status") == "ok":
            lines.append(f"| {r['mode']} | ok | {r['tokens_per_s']:,.0f} | {r['ms_per_step']:.2f} | "
                         f"{100 * r['mfu']:.1f}% | {r['peak_mem_gib']:.2f} | {r['compile_s']:.1f} | "
                         f"{r['step0_loss']:.4f} |")
        else:
            err = str(r.get("error", "")).replace("|", "/").replace("\n", " ")[:120]
            loss0 = f"{r['step0_loss']:.4f}" if isinstance(r.get("step0_loss"), float) else "-"
            lines.append(f"| {r['mode']} | failed: {err} | - | - | - | - | - | {loss0} |")
    return "\n".join(lines)


def cmd_bench(args):
    _need_torch()
    if not torch.cuda.is_available():
        sys.exit("lm_torch bench: needs a CUDA device (torch.cuda.is_available() is False); nothing was timed")
    src = _config_source(args)
    m, t, _ = config(src)
    if args.batch:
        t["batch"] = args.batch
    if args.accum:
        t["accum"] = args.accum
    if args.data:
        tokens = Tokens(_streams(args.data)[0], m["context"])
    else:  # random tokens under the batching rule, the same for every mode
        tmp = os.path.join(args.tmp_dir, "lm_bench_tokens.npy")
        rng = np.random.default_rng(0)
        n = m["context"] * t["batch"] * t["accum"] * (2 + args.warmup + args.steps) + 1
        np.save(tmp, rng.integers(0, m["vocab"], n).astype(np.int32))
        tokens = Tokens(tmp, m["context"])
    init_state = None
    if not args.checkpoint:  # every mode starts from the same weights
        init_state = {k: v.detach().clone() for k, v in load(src, None, "cpu").state_dict().items()}
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": m,
              "batch": t["batch"], "accum": t["accum"], "tokens_per_step": t["batch"] * m["context"] * t["accum"],
              "parameters": count_params(m), "flops_per_token": flops_per_token(m), "mfu_formula": MFU_FORMULA,
              "peak_flops": args.peak_flops, "warmup": args.warmup, "timed_steps": args.steps,
              "timing": "CUDA events around the whole step (zero_grad, forward+loss, backward, clip_grad_norm_, "
                        "fused AdamW); median over the timed steps", "modes": []}
    args.eager_loss = None
    modes = args.modes.split(",")
    if modes[0] != "eager" and "eager" in modes:
        modes = ["eager"] + [x for x in modes if x != "eager"]
    for mode in modes:
        if mode not in MODES:
            report["modes"].append({"mode": mode, "status": "failed", "error": f"unknown mode (one of {MODES})"})
            continue
        try:
            r = _bench_mode(mode, src, args.checkpoint, m, t, tokens, args, init_state)
        except Exception as e:  # a mode that fails is reported, not dropped
            r = {"mode": mode, "status": "failed", "error": f"{type(e).__name__}: {e}"}
        if mode == "eager":
            if r.get("status") == "ok":
                args.eager_loss = r["step0_loss"]
            else:
                report["eager_failed"] = "the other modes' step-0 losses were not checked"
        report["modes"].append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "model"}), file=sys.stderr)
        gc.collect()
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(markdown_rows(report))
    print(MFU_FORMULA + f", peak_flops = {args.peak_flops:.4g}")
    return 0 if all(r.get("status") == "ok" for r in report["modes"]) else 1


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m fusebox_tools.models.lm_torch",
                                 description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def model_args(p, data_required=True, checkpoint_required=True):
        p.add_argument("--config", help="config JSON (default: the checkpoint's metadata)")
        p.add_argument("--checkpoint", required=checkpoint_required,
                       help="docs/lm.md checkpoint" + ("" if checkpoint_required else
                                                       " (default: docs/lm.md's init with torch's generator)"))
        p.add_argument("--data", required=data_required, help="a data folder (train.npy, val.npy) or a tokens .npy")
        p.add_argument("--batch", type=int, help="override train.batch")
        p.add_argument("--device", help="cuda or cpu (default cuda when available)")
        p.add_argument("--precision", choices=["bf16", "fp32"], help="default bf16 on CUDA, fp32 on the CPU")
        p.add_argument("--gqa", choices=["auto", "enable_gqa", "repeat"], default="auto")

    p = sub.add_parser("grads", help="step-0 loss and every gradient of micro-batch K")
    model_args(p)
    p.add_argument("--batch-index", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_grads)

    p = sub.add_parser("compare-grads", help="rel-L2 per gradient of A against B (the reference)")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tol-grad", type=float, default=3e-2)
    p.add_argument("--tol-loss", type=float, default=3e-2)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_compare_grads)

    p = sub.add_parser("train", help="optimizer steps from the checkpoint; losses CSV and validation loss")
    model_args(p)
    p.add_argument("--val", help="validation tokens (default val.npy beside the data)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--total-steps", type=int, help="T of the LR schedule (default: the end of this run)")
    p.add_argument("--accum", type=int, help="override train.accum")
    p.add_argument("--val-batches", type=int, help="default train.val_batches (4 when the config has none)")
    p.add_argument("--csv", required=True)
    p.add_argument("--summary", help="also write the JSON summary here")
    p.add_argument("--save", help="write a docs/lm.md checkpoint after the last step")
    p.add_argument("--compile", choices=["default", "max-autotune-no-cudagraphs", "reduce-overhead"])
    p.add_argument("--log-every", type=int, default=50)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare-losses", help="mean abs difference of the training losses over the last steps")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--last", type=int, default=100)
    p.add_argument("--limit", type=float, default=0.02, help="nats (exit 1 when the mean is over it)")
    p.set_defaults(func=cmd_compare_losses)

    p = sub.add_parser("bench", help="tokens/s of the training step per torch.compile mode (CUDA)")
    model_args(p, data_required=False, checkpoint_required=False)
    p.add_argument("--accum", type=int, help="override train.accum")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps (the median is reported)")
    p.add_argument("--peak-flops", type=float, default=PEAK_FLOPS)
    p.add_argument("--json", help="write the report here")
    p.add_argument("--tmp-dir", default="/tmp")
    p.set_defaults(func=cmd_bench)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
