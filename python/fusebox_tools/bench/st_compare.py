"""`fusebox model embed` against sentence-transformers on the same GPU (issue 36): the same
sentences through both clients as a user runs them, embeddings compared sentence by sentence,
and embeddings per second, cold and warm.

    python3 -m fusebox_tools.bench.st_compare [--fusebox .gpu/fusebox] [--model models/minilm/fusebox]
        [--st-model DIR] [--sentences examples/sentences/mixed.txt] [--throughput-sentences 1000]
        [--batch-size 32] [--min-cos 0.9999] [--json-out st_compare.json]

Accuracy: --sentences (default examples/sentences/mixed.txt: short lines, a paragraph of more than
256 tokens, non-English lines) through `fusebox model embed --file F --json` and through
SentenceTransformer(DIR).encode(...); the cosine of each sentence's two embeddings must be at least
--min-cos (0.9999), else exit 1. Both cut at the model's max_seq_length (256).

Throughput: a file of --throughput-sentences generated sentences (fusebox_tools.models.minilm_sentences,
3 to 100 words; or --throughput-file), embeddings per second of
  fusebox cold   `fusebox model embed` in a new process with an empty plan cache (a fresh
                 $FUSEBOX_CACHE file): tokenization, plan builds, weights, every batch's run
  fusebox warm   the same command again: a new process, plans from that persistent cache
  st cold        a new Python process: import torch and sentence_transformers, load the model,
                 the first encode (process wall time)
  st warm        a second encode in that process (the model loaded, CUDA warm)
each covering what it says (fusebox's command is one process per call; sentence-transformers
keeps its model in the process, so its warm number has no start-up in it).

The sentence-transformers model: --st-model, a sentence-transformers folder (modules.json, ...;
models/minilm/hf as scripts/fetch_minilm.sh unpacks it, with 1_Pooling_config.json, is laid out
again in a temporary folder); default models/minilm/hf beside --model when it holds
model.safetensors, else one written from fusebox's converted weights (the same bf16-rounded
values fusebox computes with, in float32; tokenizer.json and sentence_bert_config.json from
MODEL/host), so that the comparison needs only the folder the GPU machine already carries.

Without torch, sentence_transformers or a GPU: one SKIP line, exit 0 (JSON {"skipped": why}).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from fusebox_tools.core.graph import REPO_ROOT, FuseboxError, fusebox_bin

DEFAULT_SENTENCES = os.path.join(REPO_ROOT, "examples", "sentences", "mixed.txt")
DEFAULT_MODEL = os.path.join(REPO_ROOT, "models", "minilm", "fusebox")
MIN_COS = 0.9999
# scripts/fetch_minilm.sh flattens the model zip's sub-folders: FILE_NAME -> FOLDER/NAME.
FLATTENED = {"1_Pooling_config.json": os.path.join("1_Pooling", "config.json")}


def skip_reason():
    """Why this comparison cannot run here (no torch, no sentence_transformers, no GPU), or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        return "sentence_transformers is not installed"
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    return None


def cosines(a, b):
    """Per-row cosine of two [N, H] arrays."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"embeddings of shape {a.shape} against {b.shape}")
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def accuracy_verdict(sentences, fb, st, min_cos=MIN_COS):
    """{"min_cos", "pass", "rows": [{"sentence", "cos", "pass"}]} of the two clients' embeddings."""
    c = cosines(fb, st)
    rows = [{"sentence": s if len(s) <= 80 else s[:77] + "...", "cos": float(x), "pass": bool(x >= min_cos)}
            for s, x in zip(sentences, c)]
    return {"min_cos": float(c.min()), "threshold": min_cos, "pass": bool(c.min() >= min_cos), "rows": rows}


def st_folder(st_model, model, work):
    """A folder SentenceTransformer() loads: --st-model (its flattened files laid out again), the
    unpacked model beside --model, or one written from fusebox's converted weights."""
    src = st_model
    if src is None:
        hf = os.path.join(os.path.dirname(os.path.abspath(model)), "hf")
        src = hf if os.path.isfile(os.path.join(hf, "model.safetensors")) else None
    out = os.path.join(work, "st_model")
    os.makedirs(out)
    if src is not None:
        for name in os.listdir(src):
            target = os.path.join(out, FLATTENED.get(name, name))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.path.abspath(os.path.join(src, name)), target)
        _module_folders(out)
        return out, os.path.abspath(src)
    _write_st_from_converted(model, out)
    return out, f"written from {os.path.abspath(model)} (fusebox's bf16-rounded weights, in float32)"


def _module_folders(out):
    """Each module folder modules.json names exists (Normalize has no files)."""
    path = os.path.join(out, "modules.json")
    if os.path.isfile(path):
        with open(path) as f:
            for mod in json.load(f):
                if mod.get("path"):
                    os.makedirs(os.path.join(out, mod["path"]), exist_ok=True)


def _write_st_from_converted(model, out):
    """A sentence-transformers folder (Transformer, mean Pooling, Normalize) holding the converted
    weights as a BertModel state dict, config.json from minilm_config.json, MODEL/host's
    tokenizer.json, and sentence_bert_config.json with the runner's max_seq_length."""
    from fusebox_tools.models import minilm as m
    from fusebox_tools.models import minilm_embed as me
    from fusebox_tools.core import safetensors_np

    p, cfg = m.load_converted(model)
    sd = {k: v.numpy() for k, v in me._state_dict(p, cfg).items()}
    safetensors_np.write(os.path.join(out, "model.safetensors"), sd)
    conf = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": cfg["vocab"],
            "hidden_size": cfg["hidden"], "num_hidden_layers": cfg["layers"], "num_attention_heads": cfg["heads"],
            "intermediate_size": cfg["ffn"], "hidden_act": "gelu", "layer_norm_eps": cfg["eps"],
            "max_position_embeddings": cfg["max_pos"], "type_vocab_size": cfg["type_vocab"],
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": 0}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    shutil.copyfile(os.path.join(model, "host", "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": cfg["max_pos"],
                   "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                   "mask_token": "[MASK]"}, f, indent=1)
    max_seq, _ = me.max_seq_length(model, cfg)
    with open(os.path.join(out, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": max_seq, "do_lower_case": False}, f)
    with open(os.path.join(out, "modules.json"), "w") as f:
        json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
                  f, indent=1)
    os.makedirs(os.path.join(out, "1_Pooling"))
    with open(os.path.join(out, "1_Pooling", "config.json"), "w") as f:
        json.dump({"word_embedding_dimension": cfg["hidden"], "pooling_mode_mean_tokens": True}, f)
    os.makedirs(os.path.join(out, "2_Normalize"))


def fusebox_embed(fusebox, model, path, batch_size, cache_file):
    """(wall seconds, JSON document) of `fusebox model embed --file path --json` in a new process
    with $FUSEBOX_CACHE = cache_file."""
    cmd = [fusebox, "model", "embed", "--model", model, "--file", path, "--json", "--batch-size", str(batch_size)]
    env = dict(os.environ, FUSEBOX_CACHE=cache_file)
    env.setdefault("FUSEBOX_PYTHON", sys.executable)  # the runner in this Python (numpy, tokenizers)
    print("st_compare: " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        doc = {"ok": False}
    if proc.returncode != 0 or "embeddings" not in doc:
        raise RuntimeError(f"fusebox model embed exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    return wall, doc


def st_embed(folder, path, batch_size, out_npy):
    """(process wall seconds, the worker's timings) of sentence-transformers in a new process."""
    cmd = [sys.executable, "-m", "fusebox_tools.bench.st_compare", "--st-worker", folder, path, out_npy,
           "--batch-size", str(batch_size)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"sentence-transformers worker exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])


def st_worker(folder, path, out_npy, batch_size):
    """In its own process: load, encode twice (timed apart), save the first encode's embeddings."""
    t0 = time.perf_counter()
    import torch
    from sentence_transformers import SentenceTransformer

    from fusebox_tools.models.minilm_embed import read_sentence_file

    t_import = time.perf_counter()
    sentences = read_sentence_file(path)
    model = SentenceTransformer(folder, device="cuda")
    torch.cuda.synchronize()
    t_load = time.perf_counter()
    emb = model.encode(sentences, batch_size=batch_size, convert_to_numpy=True)
    torch.cuda.synchronize()
    t_first = time.perf_counter()
    model.encode(sentences, batch_size=batch_size, convert_to_numpy=True)
    torch.cuda.synchronize()
    t_second = time.perf_counter()
    np.save(out_npy, np.asarray(emb, np.float64))
    print(json.dumps({"import_s": t_import - t0, "load_s": t_load - t_import, "first_encode_s": t_first - t_load,
                      "second_encode_s": t_second - t_first, "max_seq_length": model.max_seq_length,
                      "sentences": len(sentences), "torch": torch.__version__,
                      "sentence_transformers": __import__("sentence_transformers").__version__,
                      "device": torch.cuda.get_device_name(0)}))
    return 0


def throughput_file(n, work, given=None):
    if given:
        return given
    from fusebox_tools.models.minilm_sentences import make_sentences

    path = os.path.join(work, f"sentences_{n}.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(make_sentences(n)) + "\n")
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--st-worker", nargs=3, metavar=("FOLDER", "FILE", "OUT_NPY"), help=argparse.SUPPRESS)
    ap.add_argument("--fusebox", help="fusebox binary (default: $FUSEBOX_BIN, else build/fusebox)")
    ap.add_argument("--model", default=DEFAULT_MODEL, help="minilm convert's folder (fusebox model embed --model)")
    ap.add_argument("--st-model", help="a sentence-transformers folder (default: see the module doc)")
    ap.add_argument("--sentences", default=DEFAULT_SENTENCES, help="the accuracy file (one sentence a line)")
    ap.add_argument("--throughput-sentences", type=int, default=1000, help="generated sentences for the speed")
    ap.add_argument("--throughput-file", help="a sentence file for the speed instead of generated ones")
    ap.add_argument("--batch-size", type=int, default=32, help="both clients' batch size (encode's default)")
    ap.add_argument("--min-cos", type=float, default=MIN_COS)
    ap.add_argument("--json-out", help="write the report here")
    a = ap.parse_args(argv)
    if a.st_worker:
        return st_worker(*a.st_worker, a.batch_size)

    def finish(doc, rc):
        if a.json_out:
            with open(a.json_out, "w") as f:
                json.dump(doc, f, indent=1)
        return rc

    why = skip_reason()
    if why:
        print(f"st_compare: SKIP: {why} (run it where torch, sentence-transformers and a GPU are)")
        return finish({"skipped": why}, 0)
    try:
        fusebox = fusebox_bin(a.fusebox)
    except FuseboxError as e:
        print(f"st_compare: {e}", file=sys.stderr)
        return finish({"error": str(e)}, 2)
    if not os.path.isfile(os.path.join(a.model, "minilm_config.json")):
        msg = f"--model {a.model!r} is not minilm convert's folder (docs/models.md: carry models/minilm/fusebox)"
        print(f"st_compare: {msg}", file=sys.stderr)
        return finish({"error": msg}, 2)
    from fusebox_tools.models.minilm_embed import read_sentence_file

    work = tempfile.mkdtemp(prefix="st_compare_")
    doc = {"model": os.path.abspath(a.model), "batch_size": a.batch_size}
    try:
        folder, doc["st_model"] = st_folder(a.st_model, a.model, work)
        # accuracy: the same file through both clients
        sentences = read_sentence_file(a.sentences)
        _, fb = fusebox_embed(fusebox, a.model, a.sentences, a.batch_size, os.path.join(work, "acc_plans.sqlite"))
        _, st_info = st_embed(folder, a.sentences, a.batch_size, os.path.join(work, "acc.npy"))
        acc = accuracy_verdict(sentences, fb["embeddings"], np.load(os.path.join(work, "acc.npy")), a.min_cos)
        acc.update(file=os.path.relpath(a.sentences), fusebox_max_seq_length=fb.get("max_seq_length"),
                   st_max_seq_length=st_info.get("max_seq_length"), fusebox_lengths=fb.get("lengths"))
        doc["accuracy"] = acc
        doc["versions"] = {k: st_info.get(k) for k in ("torch", "sentence_transformers", "device")}
        print(f"accuracy on {acc['file']} ({len(sentences)} sentences; max_seq_length fusebox "
              f"{acc['fusebox_max_seq_length']}, sentence-transformers {acc['st_max_seq_length']}):")
        for r in acc["rows"]:
            print(f"  {'ok  ' if r['pass'] else 'FAIL'} cos {r['cos']:.6f}  {r['sentence']}")
        print(f"{'PASS' if acc['pass'] else 'FAIL'}: min cosine {acc['min_cos']:.6f} (threshold {a.min_cos})")

        # throughput: cold and warm, both clients
        tp = throughput_file(a.throughput_sentences, work, a.throughput_file)
        n = len(read_sentence_file(tp))
        cache = os.path.join(work, "plans.sqlite")  # empty: the cold run builds every plan
        cold_s, _ = fusebox_embed(fusebox, a.model, tp, a.batch_size, cache)
        warm_s, fbw = fusebox_embed(fusebox, a.model, tp, a.batch_size, cache)
        st_wall, st_t = st_embed(folder, tp, a.batch_size, os.path.join(work, "tp.npy"))
        tcos = cosines(fbw["embeddings"], np.load(os.path.join(work, "tp.npy")))
        rows = {"fusebox_cold": (cold_s, "new process, empty plan cache"),
                "fusebox_warm": (warm_s, "new process, plans from the persistent cache"),
                "st_cold": (st_wall, "new process: import, load, first encode"),
                "st_warm": (st_t["second_encode_s"], "second encode in the same process")}
        doc["throughput"] = {"sentences": n, "file": tp if a.throughput_file else f"generated ({n})",
                             "min_cos": float(tcos.min()), "batches": len(fbw.get("batches") or []),
                             "st_phases_s": {k: st_t[k] for k in ("import_s", "load_s", "first_encode_s",
                                                                  "second_encode_s")},
                             **{k: {"seconds": round(s, 3), "per_s": round(n / s, 1), "what": w}
                                for k, (s, w) in rows.items()}}
        print(f"throughput, {n} sentences (batch size {a.batch_size}; min cosine between the clients "
              f"{tcos.min():.6f}):")
        for k, (s, w) in rows.items():
            print(f"  {k:<13} {n / s:9.1f} embeddings/s  ({s:.2f} s: {w})")
        doc["ok"] = acc["pass"]
        return finish(doc, 0 if acc["pass"] else 1)
    except (RuntimeError, ValueError, OSError, subprocess.TimeoutExpired) as e:
        print(f"st_compare: {e}", file=sys.stderr)
        doc.update(ok=False, error=str(e))
        return finish(doc, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
