"""The language model's data folder (docs/lm.md, "Data files"; docs/lm-data.md): plain text in,
a byte-level BPE tokenizer and the token streams out.

    python3 -m fusebox_tools.models.lm_data corpus --html DIR [--exclude GLOB ...] --out corpus.txt
    python3 -m fusebox_tools.models.lm_data prepare --text FILE [FILE ...] --vocab N
        [--val-fraction 0.01] --out DIR [--source-json J]
    python3 -m fusebox_tools.models.lm_data decode --data DIR --ids 1,2,3

`corpus` turns a tree of Sphinx HTML pages into one UTF-8 text file (one paragraph a line, a
blank line between pages). `prepare` splits the text at a line boundary (the last
`--val-fraction` of it is validation and is never seen by training, tokenizer included), trains
the tokenizer on the training part with `tokenizers`, tokenizes both parts and writes
train.npy, val.npy, tokenizer.json, vocab_bytes.json and data.json (last: a folder without it is
incomplete). Each file is written to a temporary file in DIR and renamed; DIR may hold nothing
else. `decode` prints the text of token ids, by concatenating their bytes from vocab_bytes.json.
Bad input is one line on stderr and exit status 2.
"""
import argparse
import fnmatch
import hashlib
import html.parser
import json
import os
import re
import sys

import numpy as np

DATA_FILES = ("train.npy", "val.npy", "tokenizer.json", "vocab_bytes.json", "data.json")
MIN_VOCAB = 256                 # the byte alphabet
MAX_VOCAB = 2 ** 31             # int32 ids
MAX_U16_VOCAB = 65536
MIN_STREAM_TOKENS = 3           # one sequence of 2 tokens: 2 inputs, 2 labels
CHUNK_CHARS = 1 << 20           # text is tokenized in pieces of about this size, cut after a newline
FORMAT = "fusebox-lm-data/1"


class DataError(Exception):
    """Bad input or a failed check: reported as one line, exit status 2."""


# ---- text in ----

def sha256_bytes(data):
    """The hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def read_text(path):
    """(text, {"name", "bytes", "sha256"}) of a UTF-8 text file; DataError if it is binary."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"cannot read text file {path}: {e.strerror}") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise DataError(f"{path} is not text: NUL byte at offset {nul}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text: bad byte at offset {e.start}") from None
    return text, {"name": os.path.basename(path), "bytes": len(data), "sha256": sha256_bytes(data)}


def read_texts(paths):
    """The files' texts joined (each ending in a newline) and their records for data.json."""
    parts, records = [], []
    for path in paths:
        text, record = read_text(path)
        if text and not text.endswith("\n"):
            text += "\n"
        parts.append(text)
        records.append(record)
    return "".join(parts), records


def split_text(text, val_fraction):
    """(train, val): val is the last lines of `text`, about `val_fraction` of its characters,
    cut at the start of a line."""
    cut = text.rfind("\n", 0, len(text) - int(len(text) * val_fraction)) + 1
    return text[:cut], text[cut:]


def chunks(text, size=CHUNK_CHARS):
    """`text` in pieces of about `size` characters, each ending after a newline where it can."""
    start = 0
    while start < len(text):
        end = text.find("\n", min(start + size, len(text)) - 1) + 1 or len(text)
        yield text[start:end]
        start = end


# ---- the tokenizer ----

def tokenizers_module():
    """The `tokenizers` package, or DataError saying how to install it."""
    try:
        import tokenizers
    except ImportError:
        raise DataError("the `tokenizers` package is missing (scripts/setup.sh installs it)") from None
    return tokenizers


def train_tokenizer(train_text, vocab):
    """A byte-level BPE tokenizer of exactly `vocab` ids trained on `train_text`."""
    tk = tokenizers_module()
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab, show_progress=False, special_tokens=[],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(chunks(train_text), trainer=trainer)
    got = tok.get_vocab_size()
    if got != vocab:
        raise DataError(f"the training text gives only {got} tokens, not --vocab {vocab}: "
                        f"use --vocab {got} or less, or more text")
    return tok


def byte_decoder():
    """The inverse of GPT-2's byte-to-character table that byte-level BPE writes tokens in."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
                 + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def vocab_bytes(tok):
    """Each id's bytes, in id order: decoding is concatenating them."""
    decoder = byte_decoder()
    out = []
    for i in range(tok.get_vocab_size()):
        token = tok.id_to_token(i)
        if token is None or any(c not in decoder for c in token):
            raise DataError(f"token id {i} ({token!r}) is not a byte-level token")
        out.append(bytes(decoder[c] for c in token))
    return out


def encode(tok, text, dtype):
    """The token ids of `text` (encoded piece by piece), and the pieces' id lists."""
    pieces = list(chunks(text))
    ids = [e.ids for e in tok.encode_batch(pieces, add_special_tokens=False)]
    flat = np.fromiter((i for piece in ids for i in piece), dtype=dtype,
                       count=sum(len(piece) for piece in ids))
    return flat, pieces, ids


def check_round_trip(tok, table, pieces, ids, what):
    """Decoding by concatenating bytes gives back every piece; the tokenizer's own decoder gives
    back the first, middle and last piece."""
    for n, (piece, piece_ids) in enumerate(zip(pieces, ids)):
        if b"".join(table[i] for i in piece_ids) != piece.encode("utf-8"):
            raise DataError(f"{what}: piece {n} does not decode back to its text by vocab_bytes")
    for n in sorted({0, len(pieces) // 2, len(pieces) - 1}):
        if pieces and tok.decode(ids[n]) != pieces[n]:
            raise DataError(f"{what}: piece {n} does not decode back to its text by the tokenizer")


# ---- files out ----

def check_out_dir(out):
    """Creates `out` if missing; DataError if it holds anything but this tool's files."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"--out {out} exists and is not a folder")
    os.makedirs(out, exist_ok=True)
    ours = set(DATA_FILES) | {temp_name(n) for n in DATA_FILES}
    foreign = sorted(set(os.listdir(out)) - ours)
    if foreign:
        raise DataError(f"--out {out} holds files this tool did not write ({', '.join(foreign[:5])}): "
                        "refusing to write there; use a new or empty folder")


def temp_name(name):
    """The temporary name `name` is written under before the rename."""
    return f".{name}.tmp"


def write_atomic(out, name, write):
    """Calls write(file) on a temporary file in `out`, then renames it to `name`."""
    tmp = os.path.join(out, temp_name(name))
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(out, name))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def json_writer(doc):
    """A write(file) for write_atomic that writes `doc` as JSON."""
    return lambda f: f.write((json.dumps(doc, indent=1) + "\n").encode("utf-8"))


def write_data_folder(out, tok, table, train_ids, val_ids, info):
    """Writes the five files, data.json last (removed first, so a half-written folder has none)."""
    check_out_dir(out)
    if os.path.exists(os.path.join(out, "data.json")):
        os.remove(os.path.join(out, "data.json"))
    write_atomic(out, "train.npy", lambda f: np.save(f, train_ids, allow_pickle=False))
    write_atomic(out, "val.npy", lambda f: np.save(f, val_ids, allow_pickle=False))
    write_atomic(out, "tokenizer.json", lambda f: f.write(tok.to_str().encode("utf-8")))
    write_atomic(out, "vocab_bytes.json", json_writer({"vocab": len(table), "tokens": [b.hex() for b in table]}))
    write_atomic(out, "data.json", json_writer(info))


# ---- commands ----

def read_source_json(path):
    """The --source-json object (package, version, sha256, ...), or None."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise DataError(f"cannot read --source-json {path}: {e.strerror}") from None
    except ValueError as e:
        raise DataError(f"--source-json {path} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise DataError(f"--source-json {path} must hold a JSON object")
    return doc


def check_args(vocab, val_fraction):
    """DataError for a vocabulary or validation fraction out of range."""
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise DataError(f"--vocab {vocab} is out of range: {MIN_VOCAB} to {MAX_VOCAB} "
                        f"(uint16 files up to {MAX_U16_VOCAB}, int32 above)")
    if not 0 < val_fraction < 1:
        raise DataError(f"--val-fraction {val_fraction} must be between 0 and 1 (exclusive)")


def stream_dtype(vocab):
    """The token files' dtype: uint16 while every id fits, else int32 (docs/lm.md)."""
    return np.dtype("<u2") if vocab <= MAX_U16_VOCAB else np.dtype("<i4")


def check_stream(ids, what):
    """DataError if a token stream cannot give one sequence of 2 tokens."""
    if len(ids) < MIN_STREAM_TOKENS:
        raise DataError(f"the text is too short: its {what} part has {len(ids)} tokens, at least "
                        f"{MIN_STREAM_TOKENS} are needed (one sequence of 2 tokens); give more text")


def prepare(texts, vocab, out, val_fraction=0.01, source_json=None, log=print):
    """Writes the data folder `out` from the text files `texts`; returns data.json's object."""
    check_args(vocab, val_fraction)
    source = read_source_json(source_json)
    check_out_dir(out)
    text, records = read_texts(texts)
    train_text, val_text = split_text(text, val_fraction)
    if not train_text.strip() or not val_text.strip():
        raise DataError(f"the text is too short: {text.count(chr(10))} lines cannot be split into "
                        f"training and validation parts at --val-fraction {val_fraction}")
    tk = tokenizers_module()
    log(f"lm_data: {len(text.encode('utf-8'))} bytes of text; training the tokenizer (vocab {vocab})")
    tok = train_tokenizer(train_text, vocab)
    table = vocab_bytes(tok)
    dtype = stream_dtype(vocab)
    streams = {}
    for what, part in (("training", train_text), ("validation", val_text)):
        ids, pieces, piece_ids = encode(tok, part, dtype)
        check_stream(ids, what)
        check_round_trip(tok, table, pieces, piece_ids, what)
        streams[what] = ids
    info = {
        "format": FORMAT,
        "source": source,
        "texts": records,
        "split": {"val_fraction": val_fraction, "train_chars": len(train_text), "val_chars": len(val_text),
                  "train_bytes": len(train_text.encode("utf-8")), "val_bytes": len(val_text.encode("utf-8"))},
        "tokenizer": "byte-level BPE (tokenizers ByteLevel pre-tokenizer, no prefix space, no special tokens)",
        "tokenizers": tk.__version__,
        "vocab": vocab,
        "dtype": dtype.str,
        "tokens": {"train": int(len(streams["training"])), "val": int(len(streams["validation"]))},
    }
    write_data_folder(out, tok, table, streams["training"], streams["validation"], info)
    return info


def parse_ids(text):
    """[ints] of a comma-separated list; DataError if it is not one."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise DataError(f"--ids {text!r} is not a comma-separated list of integers") from None


def decode(data_dir, ids):
    """The bytes of token `ids` by vocab_bytes.json in `data_dir`."""
    path = os.path.join(data_dir, "vocab_bytes.json")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        table = [bytes.fromhex(h) for h in doc["tokens"]]
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{path} is not a vocab_bytes.json: {e}") from None
    bad = [i for i in ids if not 0 <= i < len(table)]
    if bad:
        raise DataError(f"token id {bad[0]} is out of range: the vocabulary has {len(table)} ids")
    return b"".join(table[i] for i in ids)


def encode_text(data_dir, text):
    """The token ids of `text` by the tokenizer.json in `data_dir` (what `fusebox serve lm --prompt` uses)."""
    path = os.path.join(data_dir, "tokenizer.json")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("the tokenizers package is missing (scripts/setup.sh installs it)") from None
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # the tokenizers package raises its own exception types
        raise DataError(f"cannot read {path}: {e}") from None
    return tok.encode(text).ids


# ---- HTML to text (the corpus) ----

class HtmlText(html.parser.HTMLParser):
    """The text of a Sphinx page's main part (the element with role="main", else <body>):
    one paragraph a line, <pre> kept as it is, scripts, styles and permalink marks dropped."""

    BLOCKS = {"p", "div", "section", "article", "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul", "ol",
              "dl", "dt", "dd", "pre", "table", "tr", "blockquote", "br", "hr", "figure", "caption",
              "td", "th", "main", "body"}
    SKIP = {"script", "style", "head", "title", "nav"}
    VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.lines, self.current = [], []
        self.stack = []           # open tags: (tag, starts the main part, skipped)
        self.saw_main = False     # the main part has begun: what came before it is dropped
        self.done = False         # the main part has ended: nothing more is text
        self.skip = 0             # open skipped elements
        self.pre = 0              # open <pre> elements

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        starts_main = not self.saw_main and attrs.get("role") == "main"
        skips = tag in self.SKIP or "headerlink" in (attrs.get("class") or "").split()
        if tag in self.BLOCKS:
            self.flush()
        if tag in self.VOID:
            return
        self.stack.append((tag, starts_main, skips))
        if starts_main:
            self.saw_main = True
            self.lines.clear()
        self.skip += skips
        self.pre += tag == "pre"

    def handle_endtag(self, tag):
        if tag in self.VOID or not any(t == tag for t, _, _ in self.stack):
            return
        if tag in self.BLOCKS:
            self.flush()      # before leaving <pre>: its last line keeps its indentation
        while self.stack:
            t, starts_main, skips = self.stack.pop()
            self.skip -= skips
            self.pre -= t == "pre"
            if starts_main:
                self.flush()
                self.done = True
            if t == tag:
                break

    def handle_data(self, data):
        if self.skip or self.done:
            return
        if self.pre:
            parts = data.split("\n")
            for part in parts[:-1]:
                self.current.append(part)
                self.flush(keep_blank=True)
            self.current.append(parts[-1])
        else:
            self.current.append(re.sub(r"\s+", " ", data))

    def flush(self, keep_blank=False):
        """Ends the line being built."""
        line = "".join(self.current)
        self.current = []
        line = line.rstrip() if self.pre else line.strip()
        if line or (keep_blank and self.lines and self.lines[-1]):
            self.lines.append(line)

    def text(self):
        """The page's text, no more than one blank line in a row."""
        self.flush()
        return re.sub(r"\n{3,}", "\n\n", "\n".join(self.lines)).strip("\n")


def html_to_text(markup):
    """The main text of one HTML page."""
    parser = HtmlText()
    parser.feed(markup)
    parser.close()
    return parser.text()


def html_pages(root, exclude):
    """The .html files under `root`, sorted, less those whose relative path matches a glob in
    `exclude`."""
    found = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames.sort()
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if name.endswith(".html") and not any(fnmatch.fnmatch(rel, g) for g in exclude):
                found.append(rel)
    return sorted(found)


def build_corpus(root, exclude, out):
    """Writes the text of every page under `root` to `out`; returns (pages, bytes)."""
    if not os.path.isdir(root):
        raise DataError(f"--html {root} is not a folder")
    pages, texts = html_pages(root, exclude), []
    for rel in pages:
        with open(os.path.join(root, rel), "rb") as f:
            page = html_to_text(f.read().decode("utf-8", errors="replace"))
        if page.strip():
            texts.append(page + "\n")
    if not texts:
        raise DataError(f"--html {root} holds no page with text")
    data = "\n".join(texts).encode("utf-8")
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, out)
    return len(texts), len(data)


# ---- the command line ----

def parse_args(argv):
    """The parsed command line."""
    ap = argparse.ArgumentParser(prog="python3 -m fusebox_tools.models.lm_data", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fusebox", help=argparse.SUPPRESS)  # passed by the fusebox CLI (serve lm --prompt); unused
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenizer and token streams from text files")
    p.add_argument("--text", nargs="+", required=True, help="UTF-8 text files, read in this order")
    p.add_argument("--vocab", type=int, required=True, help=f"vocabulary size, {MIN_VOCAB} to {MAX_VOCAB}")
    p.add_argument("--val-fraction", type=float, default=0.01, help="the text's last fraction for validation")
    p.add_argument("--out", required=True, help="the data folder (created; holds only these files)")
    p.add_argument("--source-json", help="a JSON object (package, version, sha256) copied into data.json")
    d = sub.add_parser("decode", help="the text of token ids")
    d.add_argument("--data", required=True, help="a data folder (its vocab_bytes.json)")
    d.add_argument("--ids", required=True, help="comma-separated token ids")
    e = sub.add_parser("encode", help="the token ids of a text (comma-separated)")
    e.add_argument("--data", required=True, help="a data folder (its tokenizer.json)")
    e.add_argument("--text", required=True, help="the text")
    e.add_argument("--out", help="write the ids here (atomically) instead of stdout")
    c = sub.add_parser("corpus", help="one text file from a tree of HTML pages")
    c.add_argument("--html", required=True, help="the folder of pages")
    c.add_argument("--exclude", nargs="*", default=[], help="globs of relative paths to leave out")
    c.add_argument("--out", required=True, help="the text file to write")
    return ap.parse_args(argv)


def main(argv=None):
    """Runs one command; 0 on success, 2 on bad input."""
    args = parse_args(argv)
    try:
        if args.command == "prepare":
            info = prepare(args.text, args.vocab, args.out, args.val_fraction, args.source_json)
            print(f"lm_data: wrote {args.out}: vocab {info['vocab']} ({info['dtype']}), "
                  f"{info['tokens']['train']} training and {info['tokens']['val']} validation tokens")
        elif args.command == "encode":
            ids = ",".join(str(i) for i in encode_text(args.data, args.text)) + "\n"
            if args.out:
                tmp = args.out + ".tmp"
                with open(tmp, "w") as f:
                    f.write(ids)
                os.replace(tmp, args.out)
            else:
                sys.stdout.write(ids)
        elif args.command == "decode":
            sys.stdout.buffer.write(decode(args.data, parse_ids(args.ids)))
            sys.stdout.buffer.write(b"\n")
        else:
            pages, size = build_corpus(args.html, args.exclude, args.out)
            print(f"lm_data: wrote {args.out}: {pages} pages, {size} bytes")
    except DataError as e:
        print(f"lm_data: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"lm_data: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
