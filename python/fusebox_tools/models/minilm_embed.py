"""Sentence embeddings with all-MiniLM-L6-v2 run as a fusebox pipeline.

text -> token ids (the `tokenizers` package, the model's tokenizer.json) ->
embedding lookup (numpy, the runner's host step) -> `fusebox pipeline run
--input ... --save-outputs` (the encoder and the pooling sums on the GPU) ->
mean and L2 normalisation (host) -> embeddings; prints the cosine
similarities of the sentences. Checks (each exits 1 on a mismatch):

  --reference   the float32 numpy reference of the whole model (fusebox_tools.models.minilm)
                with the same (bf16-rounded) weights: per-sentence cosine >= --min-cos,
                and the last hidden state (buffer h6) within --max-rel-l2
  --torch       the same in torch on the GPU: transformers' BertModel loaded with these
                weights (the hand-written torch encoder below if transformers is absent)
  --verify      fusebox's own per-stage verification (`pipeline run --verify`)
  --no-fusebox  the references alone (CPU, no GPU needed): what the model gives

    python3 -m fusebox_tools.models.minilm_embed --model models/minilm/fusebox [--seq 128]
        [--reference] [--torch] [--verify] [--iters 20] [--json-out F] [--json]
        [--text TEXT ...] [--file SENTENCES.txt] [SENTENCE ...]

Sentences: the positional ones, then each --text, then each --file's non-empty
lines (UTF-8), in that order; none: the examples below (or --batch B generated).
As sentence-transformers' encode does (issue 36): each sentence is cut at the
model's max_seq_length (sentence_bert_config.json, else the model's positions:
max_seq_length()), and without --seq the sentences are sorted by token count
and run in batches of --batch-size (32), each padded to its own longest
(length_buckets), the embeddings returned in input order. Plans come from
fusebox's persistent plan cache (`pipeline run`'s default; --cache F,
--no-cache).
--json writes one JSON document to stdout (the embeddings, their cosine matrix,
the token counts, which path computed them) and the human text to stderr.
`fusebox model embed ARGS...` runs this runner (docs/cli.md).

The model folder is what `python3 -m fusebox_tools.models.minilm convert` wrote
(weights/, host/ with the embedding tables and tokenizer.json,
minilm_config.json); the pipeline for this batch and length is written into
it when missing.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from fusebox_tools.models import minilm as m
from fusebox_tools.core.graph import fusebox_bin, stage_profile, stage_profile_lines
from fusebox_tools.models.minilm_sentences import make_sentences

DEFAULT_SENTENCES = [
    # sentence-transformers' README example: similarities 0.6660, 0.1046, 0.1411
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A man is riding a horse.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
]


# --seq default: the batch's longest sentence rounded up to a multiple of this.
SEQ_STEP = 16
# Sentences per batch without --seq: sentence-transformers' encode(batch_size=32).
DEFAULT_BATCH_SIZE = 32
# The model's cut (sentence-transformers' own setting, in the model folder); without it the
# model's positions (minilm_config.json max_pos, from config.json's max_position_embeddings).
SBERT_CONFIG = "sentence_bert_config.json"

# --file bounds: a sentence file is text a person wrote, not a corpus (embed a corpus in batches).
MAX_FILE_BYTES = 16 << 20
MAX_SENTENCES = 4096


def read_sentence_file(path, max_bytes=MAX_FILE_BYTES, max_sentences=MAX_SENTENCES):
    """The non-empty lines of a UTF-8 text file, stripped, one sentence each. A file that is
    missing, a folder, unreadable, not UTF-8 text, larger than `max_bytes` or with more than
    `max_sentences` sentences (or none) is a ValueError naming it and saying what is accepted."""
    where = f"--file {path!r}"
    if os.path.isdir(path):
        raise ValueError(f"{where} is a folder: give a text file with one sentence per line")
    try:
        # A regular file only: a FIFO would block forever, a device never end (opened non-blocking, then fstat).
        with m.open_regular(path, "--file") as f:
            raw = f.read(max_bytes + 1)
    except m.MiniLMError as e:
        raise ValueError(f"{e}: give a text file with one sentence per line")
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror or e}): give a text file with one sentence per line")
    if len(raw) > max_bytes:
        raise ValueError(f"{where} is larger than {max_bytes >> 20} MiB: give at most {max_sentences} sentences "
                         "per run (split the file)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 text (invalid byte at offset {e.start}): save it as UTF-8")
    if "\0" in text:
        raise ValueError(f"{where} holds a NUL byte at offset {text.index(chr(0))}: not a text file")
    sentences = [line.strip() for line in text.split("\n") if line.strip()]
    if not sentences:
        raise ValueError(f"{where} has no sentences (every line is empty): give one sentence per line")
    if len(sentences) > max_sentences:
        raise ValueError(f"{where} has {len(sentences)} sentences, more than {max_sentences}: split the file")
    return sentences


def tokenize(tokenizer_json, sentences, S, max_positions=512, warn=None, max_tokens=None):
    """(ids [B, S] int64 padded with [PAD]=0, lengths [B]) with BERT's special tokens.
    A sentence longer than `max_tokens` (default S; at most S) tokens is cut to it, as
    sentence-transformers cuts at its max_seq_length ([SEP] kept last), with one warning line
    per sentence (`warn`, default stderr). An empty sentence, or S beyond the model's
    `max_positions`, is a ValueError naming it."""
    m.require_regular(tokenizer_json, "tokenizer")  # a FIFO there would block Tokenizer.from_file forever
    from tokenizers import Tokenizer

    if S > max_positions:
        raise ValueError(f"S={S} tokens exceeds the model's {max_positions} positions: give --seq {max_positions} "
                         "or less (longer texts are truncated)")
    sentences = list(sentences)
    for i, text in enumerate(sentences):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"sentence {i} is empty: nothing to embed (give text with at least one word)")
    cut = min(S, max_tokens or S)
    tok = Tokenizer.from_file(tokenizer_json)
    tok.no_truncation()
    tok.no_padding()
    for i, e in enumerate(tok.encode_batch(sentences)):
        if len(e.ids) > cut:
            (warn or (lambda msg: print(msg, file=sys.stderr)))(
                f"minilm_embed: warning: sentence {i} has {len(e.ids)} tokens; truncated to "
                + (f"S={S}" if cut == S else f"{cut} (the model's max_seq_length)"))
    tok.enable_truncation(max_length=cut)
    tok.enable_padding(length=S, pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    lengths = np.array([int(sum(e.attention_mask)) for e in enc], dtype=np.int64)
    return ids, lengths


def seq_bucket(longest, max_positions=512, step=SEQ_STEP):
    """S for a batch whose longest sentence has `longest` tokens: rounded up to a multiple of
    `step` (so that batches of similar lengths share a shape, hence a plan), at most the model's
    positions."""
    return max(step, min(max_positions, -(-int(longest) // step) * step))


def max_seq_length(model_dir, cfg):
    """(tokens, where from): the model's max_seq_length from sentence-transformers'
    sentence_bert_config.json (256 for all-MiniLM-L6-v2) in the converted folder, its host/
    (`minilm convert` copies it there) or the unpacked model beside it (../hf, where
    scripts/fetch_minilm.sh puts it), at most the model's positions; without that file, the
    positions (cfg["max_pos"], config.json's max_position_embeddings). A file that is not JSON
    or holds a max_seq_length that is not a positive integer is a ValueError naming it."""
    max_pos = int(cfg.get("max_pos", 512))
    for d in (model_dir, os.path.join(model_dir, "host"),
              os.path.join(os.path.dirname(os.path.abspath(model_dir)), "hf")):
        path = os.path.join(d, SBERT_CONFIG)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                v = json.load(f).get("max_seq_length")
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}: not a sentence-transformers config ({e}): fix or remove it")
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{path}: max_seq_length {v!r} is not a positive integer")
        return min(v, max_pos), path
    return max_pos, f"{m.CONFIG_FILE} max_pos (the model's max_position_embeddings; no {SBERT_CONFIG})"


def length_buckets(lengths, batch_size, max_positions=512, step=SEQ_STEP):
    """[(indices, S)]: the sentences sorted by token count, longest first (ties in input order),
    cut into batches of `batch_size`, each padded to its own longest (seq_bucket): what
    sentence-transformers' encode does (it sorts by text length), so that a short sentence is
    not padded to a long one's length. Putting results[k] at indices[k] restores input order."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    out = []
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        out.append((idx, seq_bucket(lengths[idx].max(), max_positions)))
    return out


def pipeline_for(model, B, S, static_pipeline=False, fused_qkv=False):
    """(pipeline file, extra `pipeline run` arguments) for B sequences of S tokens: the symbolic
    pipeline minilm.json with --shape (written when missing), or with `static_pipeline` the
    concrete minilm_b{B}_s{S}.json; `fused_qkv`: their _fqkv variants (one Q/K/V GEMM a layer)."""
    tag = "_fqkv" if fused_qkv else ""
    if static_pipeline:
        path = os.path.join(model, f"minilm_b{B}_s{S}{tag}.json")
        return (path if os.path.exists(path) else m.write_pipeline(model, B, S, fused_qkv=fused_qkv)), []
    path = os.path.join(model, m.DYN_PIPELINE[:-5] + tag + ".json")
    if not os.path.exists(path):
        path = m.write_dynamic_pipeline(model, fused_qkv=fused_qkv)
    m.check_dynamic_shape(model, B, S)
    return path, m.dynamic_shape_args(B, S)


def run_fusebox(pipeline, inputs, out_dir, fusebox=None, verify=False, iters=0, timeout=900, cuda_graph=False,
                profile=False, extra_args=(), tune=False):
    """`fusebox pipeline run` with these inputs; returns (report dict, run folder)."""
    in_dir = os.path.join(out_dir, "inputs_given")
    os.makedirs(in_dir, exist_ok=True)
    cmd = [fusebox_bin(fusebox), "pipeline", "run", pipeline, "--json", "--iters", str(iters), *extra_args]
    for name, arr in inputs.items():
        path = os.path.join(in_dir, f"{name}.npy")
        np.save(path, arr)
        cmd += ["--input", f"{name}={path}"]
    run_dir = os.path.join(out_dir, "run")
    cmd += ["--save-outputs", run_dir]
    if verify:
        cmd.append("--verify")
    if cuda_graph:
        cmd.append("--cuda-graph")
    if profile:
        cmd.append("--profile")
    print("minilm_embed: " + " ".join(cmd), file=sys.stderr)
    if tune:
        # Each graph of the pipeline timed at this shape, the fastest engine stored in the plan
        # cache, which `pipeline run` then reads (a warm cache: this costs nothing the next time).
        shape = [a for i, a in enumerate(extra_args) if a == "--shape" or (i and extra_args[i - 1] == "--shape")]
        tcmd = [fusebox_bin(fusebox), "pipeline", "tune", pipeline, "--json", *shape]
        print("minilm_embed: " + " ".join(tcmd), file=sys.stderr)
        tproc = subprocess.run(tcmd, capture_output=True, text=True, timeout=timeout)
        if tproc.returncode != 0:
            return {"ok": False, "error": "pipeline tune: " + tproc.stderr.strip()[-2000:]}, run_dir
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = {"ok": False, "error": proc.stderr.strip()[-2000:]}
    if proc.returncode != 0:
        report["ok"] = False
        report.setdefault("error", proc.stderr.strip()[-2000:])
        report["stderr"] = proc.stderr.strip()[-2000:]
    return report, run_dir


# ------------------------------------------------------------------ torch

def torch_embeddings(p, cfg, ids, lengths, S, device=None):
    """(embeddings [B, H], last hidden [B, S, H], what) in torch float32 with the
    same weights: transformers' BertModel when importable, else the encoder below."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    ids_t = torch.as_tensor(ids, device=dev)
    mask = (torch.arange(S, device=dev)[None, :] < torch.as_tensor(lengths, device=dev)[:, None]).long()
    try:
        hidden, what = _hf_bert(p, cfg, ids_t, mask, dev), "transformers BertModel (eager attention)"
    except ImportError:
        hidden, what = _torch_bert(p, cfg, ids_t, mask, dev), "hand-written torch BERT"
    maskf = mask.to(hidden.dtype)[..., None]
    mean = (hidden * maskf).sum(1) / maskf.sum(1).clamp(min=1e-9)
    emb = torch.nn.functional.normalize(mean, p=2, dim=1)
    return emb.double().cpu().numpy(), hidden.double().cpu().numpy(), what


def _state_dict(p, cfg):
    import torch

    sd = {"embeddings.word_embeddings.weight": p["word_emb"], "embeddings.position_embeddings.weight": p["pos_emb"],
          "embeddings.token_type_embeddings.weight": p["type_emb"], "embeddings.LayerNorm.weight": p["emb_ln_g"],
          "embeddings.LayerNorm.bias": p["emb_ln_b"]}
    for l, L in enumerate(p["layers"]):
        pre = f"encoder.layer.{l}."
        for short, hf in (("q", "attention.self.query"), ("k", "attention.self.key"),
                          ("v", "attention.self.value"), ("o", "attention.output.dense")):
            sd[pre + hf + ".weight"] = L["w" + short].T
            sd[pre + hf + ".bias"] = L["b" + short]
        sd[pre + "attention.output.LayerNorm.weight"] = L["ln1_g"]
        sd[pre + "attention.output.LayerNorm.bias"] = L["ln1_b"]
        sd[pre + "intermediate.dense.weight"] = L["w1"].T
        sd[pre + "intermediate.dense.bias"] = L["b1"]
        sd[pre + "output.dense.weight"] = L["w2"].T
        sd[pre + "output.dense.bias"] = L["b2"]
        sd[pre + "output.LayerNorm.weight"] = L["ln2_g"]
        sd[pre + "output.LayerNorm.bias"] = L["ln2_b"]
    return {k: torch.as_tensor(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}


def _hf_bert(p, cfg, ids, mask, dev):
    import torch
    from transformers import BertConfig, BertModel

    conf = BertConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
                      num_attention_heads=cfg["heads"], intermediate_size=cfg["ffn"], hidden_act="gelu",
                      layer_norm_eps=cfg["eps"], max_position_embeddings=cfg["max_pos"],
                      type_vocab_size=cfg["type_vocab"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    conf._attn_implementation = "eager"  # plain float32 softmax(QK^T)V, no fused kernel
    model = BertModel(conf, add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(_state_dict(p, cfg), strict=False)
    missing = [k for k in missing if "position_ids" not in k and "token_type_ids" not in k]
    if missing or unexpected:
        raise RuntimeError(f"BertModel state dict: missing {missing}, unexpected {unexpected}")
    model = model.to(dev).eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask,
                     token_type_ids=torch.zeros_like(ids)).last_hidden_state.float()


def torch_timing(p, cfg, ids, lengths, S, warmup=10, iters=50, compile_too=True,
                 compile_mode="max-autotune-no-cudagraphs", freezing=True, reference_sums=None):
    """GPU time of the same work in PyTorch, timed as fusebox's pipeline is
    (CUDA events around each call, median): transformers' BertModel in bf16
    with its default (SDPA) attention and the padding mask, plus the masked
    sum over tokens that fusebox's pool stage computes; eager, as one
    torch.cuda.CUDAGraph, and the two torch.compile variants of
    fusebox_tools.bench.model_variants (compile_mode, default max-autotune-no-cudagraphs,
    and reduce-overhead; compiled under no_grad with Inductor's freezing unless
    `freezing` is False). Every variant's sums are checked against eager's before
    it is timed, and eager's against `reference_sums` (fusebox's pooled sums of the
    same tokens) when given; a failed variant is in "failed" with its error.
    The same work as fusebox's pipeline: both start from the token ids (fusebox's
    embed stage looks up the word rows and adds the position and token-type rows
    on the GPU; torch's BertEmbeddings does the same), then LayerNorm, the encoder
    and the masked sum."""
    import torch
    from transformers import BertConfig, BertModel

    from fusebox_tools.models.resnet50_check import gpu_time_ms

    conf = BertConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
                      num_attention_heads=cfg["heads"], intermediate_size=cfg["ffn"], hidden_act="gelu",
                      layer_norm_eps=cfg["eps"], max_position_embeddings=cfg["max_pos"],
                      type_vocab_size=cfg["type_vocab"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel(conf, add_pooling_layer=False)
    model.load_state_dict(_state_dict(p, cfg), strict=False)
    model = model.to("cuda", dtype=torch.bfloat16).eval()
    input_ids = torch.as_tensor(np.asarray(ids), device="cuda", dtype=torch.long)
    token_types = torch.zeros_like(input_ids)
    mask = (torch.arange(S, device="cuda")[None, :] < torch.as_tensor(lengths, device="cuda")[:, None]).long()
    maskf = mask.to(torch.bfloat16)[..., None]

    def fwd():
        h = model(input_ids=input_ids, token_type_ids=token_types, attention_mask=mask).last_hidden_state
        return (h * maskf).sum(1)

    out = {"torch": torch.__version__, "attention": getattr(model.config, "_attn_implementation", "?"),
           "compile_mode": compile_mode, "failed": {},
           "from": "the token ids (as fusebox): embedding lookup, LayerNorm, encoder, masked sum"}
    with torch.inference_mode():
        ref = fwd().detach().clone()
        if reference_sums is not None:  # eager's own check: against fusebox's pooled sums, same tokens
            ok, detail = check_sums(ref, reference_sums)
            out["eager_check"] = {"pass": ok, "detail": detail}
            if not ok:
                out["failed"]["eager"] = f"outputs differ from fusebox's: {detail}"
        out["eager"] = gpu_time_ms(fwd, warmup, iters)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fwd()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static = fwd()
        g.replay()
        torch.cuda.synchronize()
        ok, detail = check_sums(static, ref)
        if ok:
            out["cuda_graph"] = gpu_time_ms(g.replay, warmup, iters)
        else:
            out["failed"]["cuda_graph"] = f"outputs differ from eager's: {detail}"
    if compile_too:
        from fusebox_tools.bench import model_variants

        # compiled for inference as a server would: no_grad, Inductor's freezing, with and without CUDA graphs
        variants = model_variants.compile_variants(fwd, compile_mode, lambda f: gpu_time_ms(f, warmup, iters),
                                                   lambda got: check_sums(got, ref), freezing=freezing)
        out["variants"] = variants
        for key, rec in variants.items():
            if "time" in rec:
                out[key] = rec["time"]
            else:
                out["failed"][key] = rec.get("error", "not timed")
        if "error" in variants["compile"]:
            out["compile_error"] = variants["compile"]["error"]
        out["compile_s"] = variants["compile"].get("compile_s")
    else:
        out["failed"].update({k: "not run (--no-compile)" for k in ("compile", "compile_cudagraphs")})
    return out


# Two bf16 computations of the masked token sums (torch's variants, or torch against fusebox): the
# runner's hidden-state bound (--max-rel-l2 default) on the sums.
SUMS_REL_L2 = 0.03


def check_sums(got, ref, max_rel_l2=SUMS_REL_L2):
    """(ok, detail): relative L2 of two [B, hidden] masked sums (tensors or arrays)."""
    g = np.asarray(got.double().cpu().numpy() if hasattr(got, "double") else got, np.float64)
    r = np.asarray(ref.double().cpu().numpy() if hasattr(ref, "double") else ref, np.float64)
    if g.shape != r.shape:
        return False, f"shape {g.shape} against {r.shape}"
    rel = float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30))
    return rel <= max_rel_l2, f"rel_l2 {rel:.1e} (<= {max_rel_l2:g})"


def _torch_bert(p, cfg, ids, mask, dev):
    import math

    import torch
    import torch.nn.functional as F

    sd = {k: v.to(dev) for k, v in _state_dict(p, cfg).items()}
    B, S = ids.shape
    H, nh = cfg["hidden"], cfg["heads"]
    d = H // nh

    def ln(x, pre):
        return F.layer_norm(x, (H,), sd[pre + ".weight"], sd[pre + ".bias"], cfg["eps"])

    def lin(x, pre):
        return x @ sd[pre + ".weight"].T + sd[pre + ".bias"]

    x = sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.position_embeddings.weight"][:S][None] + \
        sd["embeddings.token_type_embeddings.weight"][0]
    x = ln(x, "embeddings.LayerNorm")
    neg = torch.where(mask[:, None, None, :].bool(), 0.0, float("-inf")).to(x.dtype)
    with torch.no_grad():
        for l in range(cfg["layers"]):
            pre = f"encoder.layer.{l}."

            def heads(t):
                return t.view(B, S, nh, d).transpose(1, 2)

            q, k, v = (heads(lin(x, pre + "attention.self." + n)) for n in ("query", "key", "value"))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + neg, dim=-1) @ v
            ctx = att.transpose(1, 2).reshape(B, S, H)
            x = ln(lin(ctx, pre + "attention.output.dense") + x, pre + "attention.output.LayerNorm")
            f = F.gelu(lin(x, pre + "intermediate.dense"))
            x = ln(lin(f, pre + "output.dense") + x, pre + "output.LayerNorm")
    return x


# ------------------------------------------------------------------ comparisons

def compare_embeddings(name, got, ref, lengths, hidden_got=None, hidden_ref=None, min_cos=0.999,
                       max_rel_l2=0.03):
    """One result dict: per-sentence cosine of the embeddings, max |difference|,
    and the rel. L2 error of the last hidden state over the real tokens."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    res = {"against": name, "min_cos": float(cos.min()), "cos": [float(c) for c in cos],
           "max_abs": float(np.abs(got - ref).max()), "pass": bool(cos.min() >= min_cos)}
    if hidden_got is not None and hidden_ref is not None:
        keep = np.arange(hidden_ref.shape[1])[None, :] < np.asarray(lengths)[:, None]
        hg, hr = np.asarray(hidden_got, np.float64)[keep], np.asarray(hidden_ref, np.float64)[keep]
        rel = float(np.linalg.norm(hg - hr) / max(np.linalg.norm(hr), 1e-30))
        res["hidden_rel_l2"] = rel
        res["pass"] = res["pass"] and rel <= max_rel_l2
    return res


def print_similarities(sentences, emb, most=16):
    c = m.cosine_matrix(emb)
    if len(sentences) > most:  # the benchmark's batches of 32 and 256: no 256 x 256 table
        off = c[~np.eye(len(sentences), dtype=bool)]
        print(f"cosine similarities of {len(sentences)} sentences: off-diagonal min {off.min():.3f}, "
              f"median {np.median(off):.3f}, max {off.max():.3f}")
        return
    print("cosine similarities:")
    for i, s in enumerate(sentences):
        print(f"  [{i}] {s}")
    print("      " + " ".join(f"{j:>6}" for j in range(len(sentences))))
    for i in range(len(sentences)):
        print(f"  [{i}] " + " ".join(f"{c[i, j]:6.3f}" for j in range(len(sentences))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sentences", nargs="*", help=f"default: {len(DEFAULT_SENTENCES)} example sentences")
    ap.add_argument("--text", action="append", default=[], metavar="TEXT",
                    help="one sentence (repeat for more); after the positional ones")
    ap.add_argument("--file", action="append", default=[], metavar="PATH",
                    help=f"a UTF-8 text file, one sentence per non-empty line (at most {MAX_SENTENCES} sentences, "
                         f"{MAX_FILE_BYTES >> 20} MiB); after --text")
    ap.add_argument("--json", action="store_true",
                    help="one JSON document on stdout (model, sentences, token counts, S, embeddings [B, hidden], "
                         "cosine matrix, computed_by); the human text goes to stderr")
    ap.add_argument("--batch", type=int,
                    help="B generated sentences (fusebox_tools.models.minilm_sentences, 3 to 100 words) instead of the "
                         "examples: the benchmark's batch sizes")
    ap.add_argument("--model", default="models/minilm/fusebox", help="minilm convert's folder")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: MODEL/host/tokenizer.json)")
    ap.add_argument("--seq", type=int, default=None,
                    help="S: every sentence in one batch padded to S tokens (the benchmark's shapes; tokens "
                         "beyond max_seq_length are cut all the same). Default: batches of --batch-size "
                         "sentences of similar length, each padded to its longest (rounded up to a multiple "
                         f"of {SEQ_STEP})")
    ap.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                    help="sentences per batch without --seq (default %(default)s, as sentence-transformers' "
                         "encode): sorted by token count, batched, output in input order")
    ap.add_argument("--no-cache", action="store_true",
                    help="pipeline run --no-cache: build every plan afresh (default: fusebox's persistent plan "
                         "cache, --cache, else $FUSEBOX_CACHE, else $XDG_CACHE_HOME/fusebox/plans.sqlite or "
                         "~/.cache/fusebox/plans.sqlite)")
    ap.add_argument("--cache", help="the plan cache file pipeline run uses (default: fusebox's, see --no-cache)")
    ap.add_argument("--static-pipeline", action="store_true",
                    help="run the concrete pipeline minilm_b{B}_s{S}.json instead of the symbolic minilm.json")
    ap.add_argument("--fused-qkv", action=argparse.BooleanOptionalAction, default=True,
                    help="one Q/K/V GEMM a layer, its three parts read by the attention (the _fqkv pipelines; "
                         "the default: 1.68x / 1.40x the best torch at 1 x 32 / 32 x 128 against 1.47x / 1.37x "
                         "with three GEMMs on the H200); --no-fused-qkv: three GEMMs (minilm.json)")
    ap.add_argument("--static-shapes", action="store_true",
                    help="symbolic pipeline: pipeline run --static-shapes (no dynamic-shape kernels)")
    ap.add_argument("--tune", action="store_true",
                    help="fusebox pipeline tune at this shape first (fastest engine per graph into the plan "
                         "cache, $FUSEBOX_CACHE), then run from the cache")
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--no-fusebox", action="store_true", help="run only the references (no GPU)")
    ap.add_argument("--verify", action="store_true", help="pipeline run --verify (per-stage references)")
    ap.add_argument("--iters", type=int, default=0, help="timed pipeline runs (pipeline run --iters)")
    ap.add_argument("--cuda-graph", action="store_true", help="pipeline run --cuda-graph (timed as one CUDA graph)")
    ap.add_argument("--profile", action="store_true",
                    help="pipeline run --profile: each stage alone, the slowest printed (issue 14's per-stage profile)")
    ap.add_argument("--reference", action="store_true", help="check against the numpy float32 reference")
    ap.add_argument("--torch", action="store_true", help="check against torch (transformers BertModel)")
    ap.add_argument("--torch-time", action="store_true",
                    help="time the same work in torch bf16: eager, CUDA graph, torch.compile (GPU)")
    ap.add_argument("--no-compile", action="store_true", help="with --torch-time: skip torch.compile")
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs",
                    help="with --torch-time: torch.compile's mode (default max-autotune-no-cudagraphs); "
                         "reduce-overhead is timed beside it")
    ap.add_argument("--no-freezing", action="store_true",
                    help="with --torch-time: compile without Inductor's freezing (default: frozen, no_grad)")
    ap.add_argument("--min-cos", type=float, default=0.999)
    ap.add_argument("--max-rel-l2", type=float, default=0.03)
    ap.add_argument("--out", help="keep inputs and fusebox's saved buffers here (default: a temporary folder)")
    ap.add_argument("--json-out", help="write the report (checks, timings, embeddings) to this file")
    a = ap.parse_intermixed_args(argv)  # sentences may sit between options
    if not a.json:
        return _embed(a)[0]
    # stdout carries the JSON document alone: everything printed for a person goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        rc, doc = _embed(a)
    print(json.dumps(_json_safe(doc), indent=1))
    return rc


def _error(msg, code=2):
    print(f"minilm_embed: {msg}", file=sys.stderr)
    return code, {"ok": False, "error": msg}


def _sentences(a):
    """The batch's sentences: positional, --text, --file lines (in that order), else --batch or the examples."""
    sentences = list(a.sentences) + list(a.text)
    for path in a.file:
        sentences += read_sentence_file(path)
    if a.batch is not None and (a.batch < 1 or sentences):
        raise ValueError("--batch B takes a positive B and no sentences (it generates B of them)")
    if len(sentences) > MAX_SENTENCES:
        raise ValueError(f"{len(sentences)} sentences, more than {MAX_SENTENCES}: embed them in several runs")
    return sentences or (make_sentences(a.batch) if a.batch else list(DEFAULT_SENTENCES))


def _embed(a):
    """The runner's work: (exit code, report document). Without --seq the sentences are sorted by
    token count and embedded in batches of --batch-size, each padded to its own longest
    (length_buckets, as sentence-transformers' encode), the results put back in input order."""
    try:
        sentences = _sentences(a)
    except ValueError as e:
        return _error(str(e))
    if not os.path.isfile(os.path.join(a.model, m.CONFIG_FILE)):
        return _error(f"--model {a.model!r}: no {m.CONFIG_FILE} there: give the folder `python3 -m "
                      "fusebox_tools.models.minilm convert` wrote (docs/models.md)")
    if a.batch_size < 1:
        return _error(f"--batch-size {a.batch_size}: give a positive number of sentences per batch")
    try:
        p, cfg = m.load_converted(a.model)
        max_pos = int(cfg.get("max_pos", 512))
        max_seq, max_seq_from = max_seq_length(a.model, cfg)
        tok = a.tokenizer or os.path.join(a.model, "host", "tokenizer.json")
        if a.seq is None:  # each batch its own length; padding beyond it is all [PAD]
            ids, lengths = tokenize(tok, sentences, seq_bucket(max_seq, max_pos), max_positions=max_pos,
                                    max_tokens=max_seq)
            buckets = length_buckets(lengths, a.batch_size, max_pos)
        else:  # one batch padded to S (the benchmark's shapes); still cut at max_seq_length
            ids, lengths = tokenize(tok, sentences, a.seq, max_positions=max_pos, max_tokens=min(a.seq, max_seq))
            buckets = [(np.arange(len(sentences)), a.seq)]
    except ImportError as e:
        return _error(f"{e}: the runner tokenizes with the `tokenizers` package (pip install tokenizers; "
                      "scripts/fetch_minilm.sh installs it)")
    except (m.MiniLMError, OSError, ValueError) as e:
        return _error(str(e))
    print(f"minilm_embed: max_seq_length {max_seq} tokens (from {max_seq_from}); {len(sentences)} sentences in "
          f"{len(buckets)} batch{'es' if len(buckets) > 1 else ''}")
    if len(buckets) == 1:
        rc, doc = _embed_batch(a, p, cfg, tok, sentences, ids[:, :buckets[0][1]], lengths, buckets[0][1])
    else:
        rc, doc = _embed_buckets(a, p, cfg, tok, sentences, ids, lengths, buckets)
    doc["max_seq_length"], doc["max_seq_length_from"] = max_seq, max_seq_from
    doc["batches"] = doc.get("batches") or [{"size": len(sentences), "seq": buckets[0][1]}]
    if a.json and "embeddings" in doc:
        doc["cosine"] = m.cosine_matrix(np.asarray(doc["embeddings"])).tolist()
    _dump(a.json_out, doc)
    return rc, doc


def _embed_buckets(a, p, cfg, tok, sentences, ids, lengths, buckets):
    """Each bucket through _embed_batch; one document with the embeddings in input order."""
    B = len(sentences)
    doc = {"model": os.path.abspath(a.model), "tokenizer": os.path.abspath(tok), "sentences": sentences,
           "lengths": lengths.tolist(), "seq": max(S for _, S in buckets), "hidden": cfg["hidden"],
           "computed_by": "numpy float32 reference (--no-fusebox)" if a.no_fusebox else "fusebox pipeline",
           "checks": [], "ok": True, "batches": []}
    emb = np.zeros((B, cfg["hidden"]))
    have = True
    json_out, a.json_out = a.json_out, None  # the merged document is written once, by _embed
    try:
        for k, (idx, S) in enumerate(buckets):
            print(f"minilm_embed: batch {k + 1}/{len(buckets)}: {len(idx)} sentences, S={S}")
            rc, d = _embed_batch(a, p, cfg, tok, [sentences[i] for i in idx], ids[idx, :S], lengths[idx], S,
                                 quiet=True)
            entry = {"size": len(idx), "seq": S, "indices": [int(i) for i in idx], "fusebox": d.get("fusebox"),
                     "checks": d.get("checks", [])}
            if "torch_timing" in d:
                entry["torch_timing"] = d["torch_timing"]
            doc["batches"].append(entry)
            doc["checks"] += [dict(c, batch=k) for c in d.get("checks", [])]
            doc["ok"] = doc["ok"] and bool(d.get("ok")) and rc == 0
            if d.get("error"):
                doc.setdefault("error", d["error"])
            if "embeddings" in d:
                emb[idx] = np.asarray(d["embeddings"], np.float64)
            else:
                have = False
            if rc != 0 and not d.get("checks"):  # a run failed (not a check): stop here
                doc["ok"] = False
                return rc, doc
    finally:
        a.json_out = json_out
    if have:
        doc["embeddings"] = emb.tolist()
        if not a.json:
            print("embeddings:")
            print_similarities(sentences, emb)
    return (0 if doc["ok"] else 1), doc


def _embed_batch(a, p, cfg, tok, sentences, ids, lengths, S, quiet=False):
    """One batch of B sentences padded to S tokens: fusebox's pipeline run and the checks asked for."""
    B = len(sentences)
    print(f"minilm_embed: {B} sentences, S={S}, tokens per sentence {lengths.tolist()}")
    doc = {"model": os.path.abspath(a.model), "tokenizer": os.path.abspath(tok), "sentences": sentences,
           "lengths": lengths.tolist(), "seq": S, "hidden": cfg["hidden"],
           "computed_by": "numpy float32 reference (--no-fusebox)" if a.no_fusebox else "fusebox pipeline",
           "checks": [], "ok": True}
    embeddings, hidden, pooled_sums = None, None, None

    if not a.no_fusebox:
        try:
            pipeline, extra = pipeline_for(a.model, B, S, a.static_pipeline, a.fused_qkv)
        except (m.MiniLMError, OSError) as e:
            return _error(str(e))
        if a.static_shapes:
            extra = extra + ["--static-shapes"]
        out_dir = tempfile.mkdtemp(prefix="minilm_", dir=a.out) if a.out and quiet else (
            a.out or tempfile.mkdtemp(prefix="minilm_"))
        if a.no_cache:
            extra = extra + ["--no-cache"]
        elif a.cache:
            extra = extra + ["--cache", a.cache]
        report, run_dir = run_fusebox(pipeline, m.pipeline_inputs(p, ids, lengths, S), out_dir, a.fusebox,
                                      a.verify, a.iters, cuda_graph=a.cuda_graph, profile=a.profile,
                                      extra_args=extra, tune=a.tune)
        doc["fusebox"] = {k: report.get(k) for k in ("ok", "error", "verified", "latency_ms", "eager_latency_ms",
                                                      "cuda_graph", "build_ms", "memory_bytes", "chain_verify")}
        if not report.get("ok"):
            print(f"minilm_embed: fusebox pipeline run failed: {report.get('error')}", file=sys.stderr)
            doc["ok"] = False
            _dump(a.json_out, doc)
            return 1, doc
        lat = report.get("latency_ms") or {}
        if lat.get("iters"):
            eager = report.get("eager_latency_ms") or {}
            print(f"fusebox pipeline: median {lat['median']:.3f} ms for {B} x {S} tokens ({len(report['stages'])} "
                  f"stages{', one CUDA graph; eager %.3f ms' % eager['median'] if eager.get('median') else ''})")
        doc["fusebox"]["stage_profile"] = stage_profile(report)
        for line in stage_profile_lines(report):
            print(line)
        last = f"h{cfg['layers']}"
        try:
            pooled_sums = np.load(os.path.join(run_dir, "pooled_sum.npy"))
            embeddings = m.finish(pooled_sums, lengths)
            hidden = np.load(os.path.join(run_dir, f"{last}.npy")).reshape(B, S, cfg["hidden"])
        except (OSError, ValueError) as e:
            msg = f"fusebox pipeline run reported success but its saved outputs are unreadable ({e})"
            print(f"minilm_embed: {msg}", file=sys.stderr)
            doc.update({"ok": False, "error": msg})
            _dump(a.json_out, doc)
            return 1, doc
        if not quiet:
            print("embeddings from fusebox:")
            print_similarities(sentences, embeddings)

    ref = None
    if a.reference or a.no_fusebox:
        ref, ref_hidden, _ = m.reference(p, cfg, ids, lengths, S)
        if embeddings is None:
            if not quiet:
                print("embeddings from the numpy float32 reference:")
                print_similarities(sentences, ref)
        else:
            doc["checks"].append(compare_embeddings("numpy float32 reference", embeddings, ref, lengths, hidden,
                                                    ref_hidden, a.min_cos, a.max_rel_l2))
    if a.torch:
        temb, thidden, what = torch_embeddings(p, cfg, ids, lengths, S)
        if embeddings is None:
            ref_np = m.reference(p, cfg, ids, lengths, S)[0]
            doc["checks"].append(compare_embeddings(f"{what} vs numpy", ref_np, temb, lengths, min_cos=0.99999))
        else:
            doc["checks"].append(compare_embeddings(what, embeddings, temb, lengths, hidden, thidden, a.min_cos,
                                                    a.max_rel_l2))
    if a.torch_time:
        t = torch_timing(p, cfg, ids, lengths, S, compile_too=not a.no_compile, compile_mode=a.compile_mode,
                         freezing=not a.no_freezing,
                         reference_sums=None if pooled_sums is None else pooled_sums.reshape(B, cfg["hidden"]))
        doc["torch_timing"] = t
        lat = (doc.get("fusebox") or {}).get("latency_ms") or {}
        print(f"torch {t['torch']} ({t['attention']} attention), GPU time per batch of {B} x {S} tokens, median:")
        for k in ("eager", "cuda_graph", "compile", "compile_cudagraphs"):
            if k in t:
                ratio = f"  (fusebox {lat['median']:.3f} ms: {t[k]['median'] / lat['median']:.2f}x)" if lat.get(
                    "median") else ""
                print(f"  torch {k:<11} {t[k]['median']:.3f} ms{ratio}")
        for k, err in (t.get("failed") or {}).items():
            print(f"  torch {k} failed: {err}")
    for c in doc["checks"]:
        extra = f", last hidden state rel_l2 {c['hidden_rel_l2']:.2e}" if "hidden_rel_l2" in c else ""
        print(f"{'PASS' if c['pass'] else 'FAIL'} against {c['against']}: min cosine {c['min_cos']:.6f}, "
              f"max |diff| {c['max_abs']:.2e}{extra}")
        doc["ok"] = doc["ok"] and c["pass"]
    if embeddings is not None:
        doc["embeddings"] = embeddings.tolist()
    elif (a.json or quiet) and ref is not None:  # --no-fusebox --json: the reference's are the embeddings asked for
        doc["embeddings"] = np.asarray(ref, np.float64).tolist()
    _dump(a.json_out, doc)
    return (0 if doc["ok"] else 1), doc


def _json_safe(x):
    """NaN and infinities (a broken model) as null: stdout stays valid JSON."""
    if isinstance(x, float):
        return x if np.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _dump(path, doc):
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
