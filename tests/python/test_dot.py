"""`fusebox check GRAPH --dot` and `fusebox build GRAPH --device ... --dot`
(docs/cli.md): the DOT text parsed structurally against `check --json` of the
same graph on every example; hostile names stay inside their labels; and, where
Graphviz is installed, `dot -Tsvg` accepts every picture."""
import glob
import json
import os
import re
import shutil
import subprocess

import pytest

from fusebox_tools.core.graph import REPO_ROOT, default_graphs

EXAMPLES = default_graphs()
DEVPROP = os.path.join(REPO_ROOT, "devices", "h200-cudnn-9.27.devprop")
TOKEN = re.compile(r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<arrow>->)|(?P<punct>[{}\[\];=,])|(?P<id>[A-Za-z_0-9.]+))',
                   re.S)


def tokens(text):
    pos, out = 0, []
    text = text.rstrip()
    while pos < len(text):
        m = TOKEN.match(text, pos)
        assert m and m.end() > pos, f"not DOT at byte {pos}: {text[pos:pos + 40]!r}"
        pos = m.end()
        kind = m.lastgroup
        val = m.group(kind)
        if kind == "str":
            val = re.sub(r'\\(["\\])', r"\1", val[1:-1])
        out.append((kind, val))
    return out


def parse_dot(text):
    """{"nodes": id -> attrs, "edges": [(src, dst, attrs)], "clusters": name ->
    {"attrs", "nodes"}, "graph": attrs}. Fails on anything unexpected."""
    toks = tokens(text)
    i = 0

    def take(kind=None, val=None):
        nonlocal i
        assert i < len(toks), "unexpected end of DOT"
        k, v = toks[i]
        assert (kind is None or k == kind) and (val is None or v == val), f"expected {kind} {val}, got {k} {v!r}"
        i += 1
        return v

    def attrs():
        out = {}
        take("punct", "[")
        while toks[i] != ("punct", "]"):
            key = take()
            take("punct", "=")
            out[key] = take()
            if toks[i] == ("punct", ","):
                i_inc()
        take("punct", "]")
        return out

    def i_inc():
        nonlocal i
        i += 1

    doc = {"nodes": {}, "edges": [], "clusters": {}, "graph": {}}

    def body(cluster):
        while toks[i] != ("punct", "}"):
            if toks[i] == ("id", "subgraph"):
                i_inc()
                name = take("id")
                take("punct", "{")
                doc["clusters"][name] = {"attrs": {}, "nodes": []}
                body(doc["clusters"][name])
                take("punct", "}")
                continue
            first = take()
            if first in ("graph", "node", "edge") and toks[i] == ("punct", "["):
                a = attrs()
                if first == "graph":
                    doc["graph"].update(a)
            elif toks[i] == ("arrow", "->"):
                i_inc()
                dst = take("id")
                doc["edges"].append((first, dst, attrs() if toks[i] == ("punct", "[") else {}))
            elif toks[i] == ("punct", "="):
                i_inc()
                (cluster["attrs"] if cluster else doc["graph"])[first] = take()
            else:
                doc["nodes"][first] = attrs() if toks[i] == ("punct", "[") else {}
                if cluster is not None:
                    cluster["nodes"].append(first)
            take("punct", ";")

    take("id", "digraph")
    take("id")
    take("punct", "{")
    body(None)
    take("punct", "}")
    assert i == len(toks), "text after the graph"
    return doc


def run(fusebox, *args):
    return subprocess.run([fusebox, *args], capture_output=True, text=True, timeout=300)


def check_json(fusebox, path):
    p = run(fusebox, "check", path, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def label_name(label):
    """The first line of a label: the tensor's or op's name."""
    return label.split("\\n", 1)[0]


def assert_matches(dot, doc):
    tensors = {k: v for k, v in dot["nodes"].items() if k.startswith("t")}
    ops = {k: v for k, v in dot["nodes"].items() if k.startswith("op")}
    assert [label_name(tensors[f"t{i}"]["label"]) for i in range(len(doc["tensors"]))] == \
        [t["name"] for t in doc["tensors"]]
    assert [label_name(ops[f"op{i}"]["label"]) for i in range(len(doc["ops"]))] == [o["name"] for o in doc["ops"]]
    by_name = {t["name"]: f"t{i}" for i, t in enumerate(doc["tensors"])}
    for i, t in enumerate(doc["tensors"]):
        n = dot["nodes"][f"t{i}"]
        if t["kind"] == "virtual":
            assert n.get("style") == "dashed", t
        else:
            assert "dashed" not in n.get("style", ""), t
        if t["kind"] != "scalar":
            dims = "[" + ", ".join(str(d) for d in t["dims"]) + "]"
            assert f"{dims} {t['dtype']}" in n["label"], (n["label"], dims)
    want = set()
    for i, o in enumerate(doc["ops"]):
        assert o["op"] in ops[f"op{i}"]["label"]
        for k, v in o["attrs"].items():
            if v is not None:
                assert f"{k}: " in ops[f"op{i}"]["label"], (k, ops[f"op{i}"]["label"])
        want |= {(by_name[t], f"op{i}", role) for role, t in o["inputs"].items()}
        want |= {(f"op{i}", by_name[t], role) for role, t in o["outputs"].items()}
    assert {(s, d, a.get("label")) for s, d, a in dot["edges"]} == want
    assert len(dot["edges"]) == len(want)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: os.path.basename(p))
def test_check_dot_matches_the_resolved_graph(fusebox, path):
    p = run(fusebox, "check", path, "--dot")
    assert p.returncode == 0, p.stderr
    dot = parse_dot(p.stdout)
    assert_matches(dot, check_json(fusebox, path))
    assert not dot["clusters"]
    if shutil.which("dot"):
        svg = subprocess.run(["dot", "-Tsvg"], input=p.stdout, capture_output=True, text=True, timeout=60)
        assert svg.returncode == 0 and "<svg" in svg.stdout, svg.stderr


HOSTILE = ['x"; evil [label="pwned"]; "', "back\\slash\\N\\G", "new\nline", "}{ -> ;", "tab\there",
           "esc\x1b[31m", "<b>html</b> & é"]


def hostile_graph(tmp_path):
    names = HOSTILE
    doc = {"name": 'g"}\n', "io_dtype": "bf16",
           "tensors": [{"name": names[0], "dims": [1, 8, 16], "layout": "row_major"},
                       {"name": names[1], "dims": [1, 16, 4], "layout": "row_major"},
                       {"name": names[2], "dims": [1, 1, 4]},
                       {"name": names[6]}],
           "ops": [{"op": "matmul", "name": names[3], "inputs": {"a": names[0], "b": names[1]},
                    "outputs": {"y": names[4]}},
                   {"op": "bias_add", "name": names[5], "inputs": {"x": names[4], "bias": names[2]},
                    "outputs": {"y": names[6]}}]}
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_hostile_names_stay_in_their_labels(fusebox, tmp_path):
    path = hostile_graph(tmp_path)
    p = run(fusebox, "check", path, "--dot")
    assert p.returncode == 0, p.stderr
    assert "\x1b" not in p.stdout and "\n" not in p.stdout.replace(";\n", "").replace("{\n", "").replace("}\n", "")
    dot = parse_dot(p.stdout)
    doc = check_json(fusebox, path)
    assert len(dot["nodes"]) == len(doc["tensors"]) + len(doc["ops"])
    assert "pwned" not in {a.get("label") for a in dot["nodes"].values()}
    labels = " ".join(a["label"] for a in dot["nodes"].values())
    assert 'x"; evil [label="pwned"]; "' in labels  # unescaped back to the name
    assert "back\\slash\\N\\G" in labels and "}{ -> ;" in labels
    assert "new\\x0aline" in labels.lower() and "esc\\x1b[31m" in labels.lower()  # shown, not acted on
    if shutil.which("dot"):
        svg = subprocess.run(["dot", "-Tsvg"], input=p.stdout, capture_output=True, text=True, timeout=60)
        assert svg.returncode == 0, svg.stderr
        assert "pwned" in svg.stdout  # as text inside the label
        assert svg.stdout.count("<g id=\"node") == len(dot["nodes"])


def test_dot_to_a_file(fusebox, tmp_path):
    path = os.path.join(REPO_ROOT, "examples", "graphs", "conv_bias_relu.json")
    out = tmp_path / "g.dot"
    p = run(fusebox, "check", path, f"--dot={out}")
    assert p.returncode == 0, p.stderr
    assert "conv_bias_relu" in p.stdout and "ok" in p.stdout  # the usual listing
    assert_matches(parse_dot(out.read_text()), check_json(fusebox, path))


def test_dot_refusals(fusebox, tmp_path):
    path = os.path.join(REPO_ROOT, "examples", "graphs", "conv_bias_relu.json")
    p = run(fusebox, "check", path, "--json", "--dot")
    assert p.returncode == 2 and "both write to stdout" in p.stderr
    copy = tmp_path / "g.json"
    shutil.copy(path, copy)
    p = run(fusebox, "check", str(copy), f"--dot={copy}")
    assert p.returncode == 2 and "graph file" in p.stderr, p.stderr
    assert json.loads(copy.read_text())  # untouched
    p = run(fusebox, "build", path, path, "--device", DEVPROP, "--dot")
    assert p.returncode == 2 and "--dot takes one graph" in p.stderr


def test_build_dot_shows_the_engine(fusebox, tmp_path):
    path = os.path.join(REPO_ROOT, "examples", "graphs", "conv_bias_relu.json")
    cache = str(tmp_path / "c.sqlite")
    j = run(fusebox, "build", path, "--device", DEVPROP, "--cache", cache, "--json")
    assert j.returncode == 0, j.stderr
    built = json.loads(j.stdout)
    for source in ("built now", "plan cache hit"):
        args = ["build", path, "--device", DEVPROP, "--dot"] + (["--no-cache"] if source == "built now"
                                                                  else ["--cache", cache])
        p = run(fusebox, *args)
        assert p.returncode == 0, p.stderr
        dot = parse_dot(p.stdout)
        assert list(dot["clusters"]) == ["cluster_plan"]
        cl = dot["clusters"]["cluster_plan"]
        label = cl["attrs"]["label"]
        assert "one cuDNN engine for the whole graph: " + built["engine"] in label
        assert "workspace" in label and source in label and "deviceless" in label
        doc = check_json(fusebox, path)
        # every op and every virtual tensor inside the engine, memory tensors outside
        inside = {f"op{i}" for i in range(len(doc["ops"]))}
        inside |= {f"t{i}" for i, t in enumerate(doc["tensors"]) if t["kind"] == "virtual"}
        assert set(cl["nodes"]) == inside
        assert_matches(dot, doc)
        if shutil.which("dot"):
            svg = subprocess.run(["dot", "-Tsvg"], input=p.stdout, capture_output=True, text=True, timeout=60)
            assert svg.returncode == 0, svg.stderr


PIPELINES = sorted(glob.glob(os.path.join(REPO_ROOT, "examples", "pipelines", "*.json")))


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: os.path.basename(p))
def test_pipeline_dot_matches_the_checked_pipeline(fusebox, path):
    """`pipeline check --dot`: one node per buffer with its dims and kind, one
    cluster per stage (in stage order) holding its graph's ops, and an edge for
    every stage tensor bound to a buffer (buffer -> op for reads, op -> buffer
    for writes), labelled with the graph tensor."""
    p = run(fusebox, "pipeline", "check", path, "--dot")
    assert p.returncode == 0, p.stderr
    dot = parse_dot(p.stdout)
    q = run(fusebox, "pipeline", "check", path, "--json")
    assert q.returncode == 0, q.stderr
    doc = json.loads(q.stdout)
    buffers = {k: v for k, v in dot["nodes"].items() if re.fullmatch(r"b\d+", k)}
    assert [label_name(buffers[f"b{i}"]["label"]) for i in range(len(doc["buffers"]))] == \
        [b["name"] for b in doc["buffers"]]
    for i, b in enumerate(doc["buffers"]):
        label = buffers[f"b{i}"]["label"]
        assert "[" + ", ".join(str(d) for d in b["dims"]) + "] " + b["dtype"] in label, label
        assert b["kind"] in label, label
    assert len(dot["clusters"]) == len(doc["stages"])
    stage_labels = [c["attrs"]["label"] for c in dot["clusters"].values()]
    for k, st in enumerate(doc["stages"]):
        assert any(lab.startswith(f"{k + 1}. {st['name']}: graph {st['graph']}") for lab in stage_labels), stage_labels
    # every bound tensor is one labelled edge between its buffer and an op of its stage
    index = {b["name"]: i for i, b in enumerate(doc["buffers"])}
    bound = [(f"b{index[buf]}", tensor) for st in doc["stages"] for tensor, buf in st["bind"].items()]
    buffer_edges = [(s if s.startswith("b") else d, a["label"]) for s, d, a in dot["edges"]
                    if s.startswith("b") or d.startswith("b")]
    assert sorted(buffer_edges) == sorted(bound)
    if shutil.which("dot"):
        svg = subprocess.run(["dot", "-Tsvg"], input=p.stdout, capture_output=True, text=True, timeout=60)
        assert svg.returncode == 0 and "<svg" in svg.stdout, svg.stderr


def test_pipeline_dot_refuses_to_overwrite_the_pipeline(fusebox, tmp_path):
    src = PIPELINES[0]
    p = run(fusebox, "pipeline", "check", src, f"--dot={src}")
    assert p.returncode == 2 and "refusing to overwrite" in p.stderr, p.stderr
    stage_graph = os.path.join(os.path.dirname(src), next(iter(json.loads(open(src).read())["graphs"].values())))
    before = open(stage_graph).read()
    p = run(fusebox, "pipeline", "check", src, f"--dot={stage_graph}")
    assert p.returncode == 2 and "refusing to overwrite" in p.stderr, p.stderr
    assert open(stage_graph).read() == before
    p = run(fusebox, "pipeline", "check", src, "--json", "--dot")
    assert p.returncode == 2 and "both write to stdout" in p.stderr, p.stderr
    out = tmp_path / "p.dot"
    p = run(fusebox, "pipeline", "check", src, f"--dot={out}")
    assert p.returncode == 0 and ": ok" in p.stdout, p.stdout
    parse_dot(out.read_text())
