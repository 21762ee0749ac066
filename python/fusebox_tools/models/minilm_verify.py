"""Issue 14's MiniLM verification: at least 200 sentences of varied length
embedded by fusebox's pipeline and by the reference, same weights.

    python3 -m fusebox_tools.models.minilm_verify [--model models/minilm/fusebox] [--sentences 200]
        [--batch 50] [--seq 128] [--reference auto|sentence-transformers|transformers|numpy]
        [--min-cos 0.999] [--rank-tie 0.01] [--json-out F] [--emulate]

1. The sentences: fusebox_tools.models.minilm_sentences.make_sentences(N, --seed):
   deterministic, ten topics, 3 to 100 words (6 to 113 tokens for the
   default 200), the README's three first.
2. Tokens: the model's tokenizer.json (`tokenizers`), [CLS] ... [SEP],
   truncated at S = --seq tokens (a warning with the count of truncated
   sentences; none of the default 200 is longer than 113 tokens, so S=128 cuts
   nothing) and padded to S.
3. fusebox: the pipeline minilm_b{B}_s{S}.json (written when missing) run
   once per batch of B = --batch sentences (`fusebox pipeline run`, one
   process per batch; the plan cache makes the later ones warm; the last
   batch is filled up with copies of its last sentence, dropped after); the
   host steps of minilm_embed (embedding lookup before, mean and L2
   normalisation after).
4. The reference, float32 on the GPU, TF32 off:
   sentence-transformers  SentenceTransformer([Transformer, Pooling(mean), Normalize]),
                          the three modules of all-MiniLM-L6-v2's modules.json, the
                          Transformer loaded from a folder written here with the same
                          (converted, bf16-rounded) weights and tokenizer.json; its own
                          tokenization (compared with ours: reported) at its
                          max_seq_length (256: sentence_bert_config.json, read from --hf when
                          there) or at S when some sentence is truncated at S (the
                          same tokens on both sides). The tokenizer.json of the model
                          truncates at 128 itself; both sides override that.
   transformers           transformers' BertModel with those weights (eager attention), our
                          tokens, masked mean over the real tokens, L2 normalisation: what
                          sentence-transformers computes for this model
   numpy                  fusebox_tools.models.minilm.reference, float32 (CPU)
   auto (default)         the first of these that imports and runs (the JSON says which one
                          ran, and why the ones before it did not: `not_used`).
5. Checks: per-sentence cosine of the two embeddings >= --min-cos (0.999) for
   every sentence; the similarity ranking of all sentence pairs unchanged
   (minilm_sentences.ranking_check: no two pairs whose reference
   similarities differ by more than --rank-tie are ordered the other way by
   fusebox; the first disagreement is reported). Why tie 0.01: bf16 alone
   moves a pair's similarity by about 1e-3 (the model card's 0.6660 becomes
   0.6653, 0.1046 becomes 0.1058 with bf16 weights and buffers, numpy), so
   pairs closer than a few 1e-3 have no order the model could keep in bf16.
   Reported beside it: the resolution (the largest reference gap between two
   pairs fusebox orders the other way, i.e. the smallest tie that passes)
   and Spearman's rho. --emulate here (numpy, bf16 stage outputs against
   float32, the default 200 sentences): min cosine 0.999969, largest
   similarity change 3.0e-3, resolution 4.1e-3, 0 pairs out of order at tie 0.01.

Output: a summary on stdout, --json-out with every sentence's cosine and
token count, the worst five, the ranking check, PASS/FAIL. Exit 0 on PASS,
1 on FAIL, 2 on bad arguments or a missing model.

--emulate (CPU, no fusebox, no GPU): fusebox's embeddings replaced by the
numpy model with every stage's output rounded to bf16 (what the pipeline
stores between stages), to try the whole check and its thresholds here.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from fusebox_tools.models import minilm as m
from fusebox_tools.models import minilm_sentences as ms
from fusebox_tools.models.minilm_embed import _dump  # the JSON writer both MiniLM tools share

ST_MAX_SEQ_LENGTH = 256  # sentence_bert_config.json of all-MiniLM-L6-v2


def st_max_seq_length(hf_dir):
    """(max_seq_length, where from): the model's sentence_bert_config.json
    (scripts/fetch_minilm.sh unpacks it into models/minilm/hf) when present,
    else 256, what that file holds for all-MiniLM-L6-v2."""
    path = os.path.join(hf_dir or "", "sentence_bert_config.json")
    try:
        with open(path) as f:
            v = json.load(f).get("max_seq_length")
        if isinstance(v, int) and v > 0:
            return v, path
    except (OSError, ValueError, AttributeError):
        pass
    return ST_MAX_SEQ_LENGTH, "built in (sentence_bert_config.json of all-MiniLM-L6-v2)"


def token_counts(tokenizer_json, sentences):
    """Tokens per sentence with [CLS] and [SEP], untruncated (the model's
    tokenizer.json itself truncates at 128 and pads: both switched off)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_json)
    tok.no_truncation()
    tok.no_padding()
    return [len(e.ids) for e in tok.encode_batch(list(sentences))]


def batches(n, B):
    """(start, stop) of each batch of B over n items."""
    return [(s, min(s + B, n)) for s in range(0, n, B)]


def fill(items, B):
    """items padded to B with copies of the last one."""
    return list(items) + [items[-1]] * (B - len(items))


# ------------------------------------------------------------------ the two sides

def fusebox_embeddings(args, p, cfg, sentences, log):
    """fusebox's embeddings of `sentences`, in batches of --batch through the symbolic pipeline
    (minilm.json, one plan per shape from the plan cache). The sequence length is dynamic: the
    sentences are ordered by length (as sentence-transformers batches them) and each batch is
    padded to its longest sentence rounded up to 16 tokens (at most --seq), so the batches run at
    several S without a pipeline file of their own; --fixed-seq pads every batch to --seq."""
    from fusebox_tools.models.minilm_embed import pipeline_for, run_fusebox, seq_bucket, tokenize

    B = args.batch
    tok = os.path.join(args.model, "host", "tokenizer.json")
    _, full = tokenize(tok, sentences, args.seq, warn=lambda msg: None)
    order = np.argsort(full, kind="stable") if not args.fixed_seq else np.arange(len(sentences))
    out = np.zeros((len(sentences), cfg["hidden"]))
    runs, pipelines = [], set()
    work = tempfile.mkdtemp(prefix="minilm_verify_")
    todo = batches(len(sentences), B)
    try:
        for k, (a, b) in enumerate(todo):
            idx = order[a:b]
            S = args.seq if args.fixed_seq else seq_bucket(full[idx].max(), args.seq)
            chunk = fill([sentences[i] for i in idx], B)
            ids, lengths = tokenize(tok, chunk, S, warn=lambda msg: None)
            pipeline, extra = pipeline_for(args.model, B, S, args.static_pipeline, args.fused_qkv)
            pipelines.add(os.path.relpath(pipeline))
            t0 = time.time()
            report, run_dir = run_fusebox(pipeline, m.pipeline_inputs(p, ids, lengths, S),
                                          os.path.join(work, f"b{k}"), args.fusebox, verify=args.verify_stages,
                                          extra_args=extra)
            runs.append({"batch": k, "sentences": [a, b], "seq": S, "ok": bool(report.get("ok")),
                         "wall_s": time.time() - t0, "error": report.get("error"), "verified": report.get("verified"),
                         "plans": [st.get("source") for st in report.get("stages", [])][:1]})
            if not report.get("ok"):
                raise RuntimeError(f"fusebox pipeline run, batch {k} (sentences {a}..{b - 1}): {report.get('error')}")
            out[idx] = m.finish(np.load(os.path.join(run_dir, "pooled_sum.npy")), lengths)[:b - a]
            shutil.rmtree(os.path.join(work, f"b{k}"), ignore_errors=True)  # every buffer was saved: GBs
            log(f"fusebox batch {k + 1}/{len(todo)}: {b - a} sentences at S={S}, {time.time() - t0:.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out, {"pipeline": sorted(pipelines), "runs": runs, "seqs": [r["seq"] for r in runs]}


def emulated_embeddings(args, p, cfg, sentences, log):
    """The numpy model with bf16 stage outputs (--emulate: no GPU)."""
    from fusebox_tools.models.minilm_embed import tokenize

    tok = os.path.join(args.model, "host", "tokenizer.json")
    out = []
    for a, b in batches(len(sentences), args.batch):
        ids, lengths = tokenize(tok, fill(sentences[a:b], args.batch), args.seq)
        out.append(m.reference(p, cfg, ids, lengths, args.seq, rnd=m.round_bf16)[0][:b - a])
        log(f"emulated batch {a}..{b - 1}")
    return np.concatenate(out), {"pipeline": "numpy model with bf16 stage outputs (--emulate)"}


def reference_embeddings(args, p, cfg, sentences, truncated, log):
    """(embeddings [n, H], info) from the reference named by --reference."""
    want = args.reference
    tried = []
    for kind in (["sentence-transformers", "transformers", "numpy"] if want == "auto" else [want]):
        try:
            if kind == "sentence-transformers":
                emb, info = _st_reference(args, p, cfg, sentences, truncated)
            elif kind == "transformers":
                emb, info = _hf_reference(args, p, cfg, sentences)
            else:
                emb, info = _numpy_reference(args, p, cfg, sentences)
            if tried:
                info["not_used"] = tried
            return emb, info
        except Exception as e:  # auto: the next reference, saying why; a named one: the error
            if want != "auto" or isinstance(e, KeyboardInterrupt):
                raise
            tried.append(f"{kind}: {type(e).__name__}: {str(e)[:300]}")
            log(f"reference {kind} not used ({type(e).__name__}: {str(e)[:300]})")
    raise ImportError("no reference available: " + "; ".join(tried))


def _no_tf32():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def write_hf_folder(p, cfg, tokenizer_json, folder):
    """A transformers folder (config, weights, tokenizer) of the converted model."""
    import torch  # noqa: F401
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from fusebox_tools.models.minilm_embed import _state_dict

    conf = BertConfig(vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], num_hidden_layers=cfg["layers"],
                      num_attention_heads=cfg["heads"], intermediate_size=cfg["ffn"], hidden_act="gelu",
                      layer_norm_eps=cfg["eps"], max_position_embeddings=cfg["max_pos"],
                      type_vocab_size=cfg["type_vocab"])
    model = BertModel(conf, add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(_state_dict(p, cfg), strict=False)
    missing = [k for k in missing if "position_ids" not in k and "token_type_ids" not in k]
    if missing or unexpected:
        raise RuntimeError(f"BertModel state dict: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(folder)
    tok = BertTokenizerFast(tokenizer_file=tokenizer_json, do_lower_case=True, model_max_length=cfg["max_pos"])
    tok.save_pretrained(folder)
    return folder


def _st_reference(args, p, cfg, sentences, truncated):
    torch = _no_tf32()
    import sentence_transformers
    from sentence_transformers import SentenceTransformer, models

    from fusebox_tools.models.minilm_embed import tokenize

    folder = tempfile.mkdtemp(prefix="minilm_st_")
    try:
        write_hf_folder(p, cfg, os.path.join(args.model, "host", "tokenizer.json"), folder)
        st_len, st_from = st_max_seq_length(args.hf)
        max_len = args.seq if truncated else st_len
        tr = models.Transformer(folder, max_seq_length=max_len)
        pool = models.Pooling(tr.get_word_embedding_dimension(), pooling_mode="mean")
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        st = SentenceTransformer(modules=[tr, pool, models.Normalize()], device=dev)
        st.eval()
        emb = st.encode(list(sentences), batch_size=32, convert_to_numpy=True, normalize_embeddings=False,
                        show_progress_bar=False)
        # Its tokens against ours (the same tokenizer.json, another code path).
        feats = st.tokenize(list(sentences))
        theirs = feats["input_ids"].cpu().numpy()
        mask = feats["attention_mask"].cpu().numpy()
        ours, lengths = tokenize(os.path.join(args.model, "host", "tokenizer.json"), sentences, args.seq)
        differ = [i for i in range(len(sentences))
                  if int(mask[i].sum()) != int(lengths[i]) or
                  not np.array_equal(theirs[i, :int(mask[i].sum())], ours[i, :int(lengths[i])])]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return np.asarray(emb, np.float64), {
        "reference": "sentence-transformers", "version": sentence_transformers.__version__,
        "torch": torch.__version__, "device": dev, "dtype": "float32 (TF32 off)",
        "modules": "Transformer (BertModel, same weights) + Pooling(mean) + Normalize", "max_seq_length": max_len,
        "model_max_seq_length": st_len, "model_max_seq_length_from": st_from,
        "tokens_differ": len(differ), "tokens_differ_first": differ[:5]}


def _hf_reference(args, p, cfg, sentences):
    torch = _no_tf32()
    import transformers  # noqa: F401  (ImportError here selects the next reference)

    from fusebox_tools.models.minilm_embed import tokenize, torch_embeddings

    out, what = [], None
    for a, b in batches(len(sentences), args.batch):
        ids, lengths = tokenize(os.path.join(args.model, "host", "tokenizer.json"), sentences[a:b], args.seq)
        e, _, what = torch_embeddings(p, cfg, ids, lengths, args.seq)
        out.append(e)
    return np.concatenate(out), {"reference": "transformers", "model": what, "version": transformers.__version__,
                                 "torch": torch.__version__, "dtype": "float32 (TF32 off)",
                                 "pooling": "mean over the real tokens, L2 normalisation (sentence-transformers' "
                                            "Pooling(mean) + Normalize)"}


def _numpy_reference(args, p, cfg, sentences):
    from fusebox_tools.models.minilm_embed import tokenize

    out = []
    for a, b in batches(len(sentences), args.batch):
        ids, lengths = tokenize(os.path.join(args.model, "host", "tokenizer.json"), sentences[a:b], args.seq)
        out.append(m.reference(p, cfg, ids, lengths, args.seq)[0])
    return np.concatenate(out), {"reference": "numpy", "model": "fusebox_tools.models.minilm.reference, float32"}


# ------------------------------------------------------------------ the verdict

def verdict(sentences, tokens, got, ref, min_cos, tie, seq):
    """The checks on two [n, H] embedding arrays: one JSON-able dict with ok."""
    cos = ms.cosines(got, ref)
    pairs, rsim = ms.pair_similarities(ref)
    _, fsim = ms.pair_similarities(got)
    rank = ms.ranking_check(rsim, fsim, tie, pairs, sentences)
    worst = [{"sentence": i, "cosine": float(cos[i]), "words": ms.word_count(sentences[i]), "tokens": tokens[i],
              "text": sentences[i]} for i in ms.worst(cos, 5)]
    cos_ok = bool(cos.min() >= min_cos)
    return {
        "ok": cos_ok and rank["ok"],
        "cosine": {"ok": cos_ok, "min_cos": min_cos, "min": float(cos.min()), "median": float(np.median(cos)),
                   "below": int((cos < min_cos).sum()), "worst": worst},
        "ranking": rank,
        "per_sentence": [{"cosine": float(c), "words": ms.word_count(s), "tokens": t, "truncated": t > seq}
                         for c, s, t in zip(cos, sentences, tokens)],
    }


def summary_lines(doc):
    v = doc["verdict"]
    c, r = v["cosine"], v["ranking"]
    ref = doc["reference"]
    L = [f"minilm_verify: {doc['n']} sentences ({doc['words']['min']}-{doc['words']['max']} words, "
         f"{doc['tokens']['min']}-{doc['tokens']['max']} tokens), S={doc['seq']}, batches of {doc['batch']}, "
         f"{doc['truncated']} truncated",
         f"  fusebox: {doc['fusebox'].get('pipeline')}",
         f"  reference: {ref.get('reference')} {ref.get('version', '')} ({ref.get('model') or ref.get('modules', '')})"
         + (f"; its tokens differ from ours for {ref['tokens_differ']} sentences" if "tokens_differ" in ref else "")
         + (f"; not used: {' | '.join(ref['not_used'])}" if ref.get("not_used") else ""),
         f"  cosine per sentence: min {c['min']:.6f}, median {c['median']:.6f}, {c['below']} below {c['min_cos']}"
         f": {'ok' if c['ok'] else 'FAIL'}"]
    for w in c["worst"]:
        L.append(f"    {w['cosine']:.6f}  #{w['sentence']} ({w['words']} words, {w['tokens']} tokens) "
                 f"{w['text'][:70]}{'...' if len(w['text']) > 70 else ''}")
    L.append(f"  ranking of {r['pairs']} pairs: {r['overtaken']} pairs out of order beyond tie {r['tie']}; "
             f"resolution {r['resolution']:.2e} (every two pairs further apart keep their order), Spearman "
             f"{r['spearman']:.6f}, largest similarity change {r['max_abs_change']:.2e}: {'ok' if r['ok'] else 'FAIL'}")
    if r.get("first"):
        f = r["first"]
        hi, lo = f["higher_in_reference"], f["lower_in_reference"]
        L.append(f"    first disagreement: pair {hi.get('sentences')} reference {hi['reference']:.5f} fusebox "
                 f"{hi['fusebox']:.5f} vs pair {lo.get('sentences')} reference {lo['reference']:.5f} fusebox "
                 f"{lo['fusebox']:.5f}")
    L.append(f"minilm_verify: {'PASS' if v['ok'] else 'FAIL'}")
    return L


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/minilm/fusebox", help="minilm convert's folder")
    ap.add_argument("--hf", default="models/minilm/hf",
                    help="the unpacked model (its sentence_bert_config.json: max_seq_length), when present")
    ap.add_argument("--sentences", type=int, default=200, help="how many generated sentences (default 200)")
    ap.add_argument("--seed", type=int, default=14, help="the sentence generator's seed")
    ap.add_argument("--batch", type=int, default=50, help="sentences per pipeline run (the pipeline's B)")
    ap.add_argument("--seq", type=int, default=128, help="S: tokens per sentence at most (truncated beyond)")
    ap.add_argument("--fixed-seq", action="store_true",
                    help="pad every batch to --seq (default: each batch to its longest sentence, rounded up to 16)")
    ap.add_argument("--static-pipeline", action="store_true",
                    help="concrete pipelines minilm_b{B}_s{S}.json instead of the symbolic minilm.json")
    ap.add_argument("--fused-qkv", action="store_true", help="the _fqkv pipelines: one Q/K/V GEMM a layer")
    ap.add_argument("--reference", default="auto", choices=("auto", "sentence-transformers", "transformers", "numpy"))
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--verify-stages", action="store_true",
                    help="pipeline run --verify (each stage against fusebox's reference: which stage diverges)")
    ap.add_argument("--emulate", action="store_true", help="no fusebox: the numpy model with bf16 stage outputs")
    ap.add_argument("--min-cos", type=float, default=0.999)
    ap.add_argument("--rank-tie", type=float, default=0.01)
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)

    def log(msg):
        print(f"minilm_verify: {msg}", file=sys.stderr, flush=True)

    if a.sentences < 2 or a.batch < 1 or a.seq < 2 or a.rank_tie < 0:
        print("minilm_verify: --sentences >= 2, --batch >= 1, --seq >= 2 and --rank-tie >= 0 are accepted",
              file=sys.stderr)
        return 2
    try:
        p, cfg = m.load_converted(a.model)
        if a.seq > cfg["max_pos"]:
            raise m.MiniLMError(f"--seq {a.seq} exceeds the model's {cfg['max_pos']} positions")
        sentences = ms.make_sentences(a.sentences, a.seed)
        tokens = token_counts(os.path.join(a.model, "host", "tokenizer.json"), sentences)
    except (m.MiniLMError, OSError, ValueError) as e:
        print(f"minilm_verify: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"minilm_verify: {e} (the `tokenizers` package: scripts/fetch_minilm.sh installs it)", file=sys.stderr)
        return 2
    truncated = sum(t > a.seq for t in tokens)
    if truncated:
        log(f"warning: {truncated} of {len(sentences)} sentences are longer than S={a.seq} tokens and are "
            f"truncated (on both sides)")
    words = [ms.word_count(s) for s in sentences]
    doc = {"n": len(sentences), "seed": a.seed, "seq": a.seq, "batch": a.batch, "truncated": truncated,
           "words": {"min": min(words), "max": max(words), "median": float(np.median(words))},
           "tokens": {"min": min(tokens), "max": max(tokens), "median": float(np.median(tokens))},
           "min_cos": a.min_cos, "rank_tie": a.rank_tie, "ok": False}
    t0 = time.time()
    try:
        if a.emulate:
            got, doc["fusebox"] = emulated_embeddings(a, p, cfg, sentences, log)
        else:
            got, doc["fusebox"] = fusebox_embeddings(a, p, cfg, sentences, log)
        doc["fusebox"]["seconds"] = round(time.time() - t0, 1)
        t0 = time.time()
        ref, doc["reference"] = reference_embeddings(a, p, cfg, sentences, truncated, log)
        doc["reference"]["seconds"] = round(time.time() - t0, 1)
    except Exception as e:  # one message and exit 1 (the JSON says what failed), not a traceback
        print(f"minilm_verify: {type(e).__name__}: {e}", file=sys.stderr)
        doc["error"] = f"{type(e).__name__}: {e}"
        _dump(a.json_out, doc)
        return 1
    doc["verdict"] = verdict(sentences, tokens, got, ref, a.min_cos, a.rank_tie, a.seq)
    doc["ok"] = doc["verdict"]["ok"]
    doc["sentences"] = sentences
    print("\n".join(summary_lines(doc)))
    _dump(a.json_out, doc)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
