"""Every op type fusebox knows (`fusebox ops --json`, from src/graph/ops/traits.h) has a torch
version in fusebox_tools.core.torch_ops.TORCH_OPS, keyed by the same names, and the table names no op
fusebox does not know (issue 30). Read from the module's source, so it runs without torch."""
import ast
import json
import os
import subprocess

TORCH_OPS_PY = os.path.join(os.path.dirname(__file__), "..", "..", "python", "fusebox_tools", "core", "torch_ops.py")


def torch_ops_names():
    tree = ast.parse(open(TORCH_OPS_PY).read())
    assigned = {n.targets[0].id: n.value for n in tree.body
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}

    def names_of(node):
        """The op names a dict entry of TORCH_OPS covers."""
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.DictComp):  # {kind: ... for kind in X} or for kind, f in X.items()
            it = node.generators[0].iter
            if isinstance(it, ast.Call):
                it = it.func.value
            return names_of(assigned[it.id])
        if isinstance(node, ast.Tuple):
            return [ast.literal_eval(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return [k.value for k in node.keys]
        raise AssertionError(f"TORCH_OPS entry not understood: {ast.dump(node)[:200]}")

    table = assigned["TORCH_OPS"]
    names = []
    for key, value in zip(table.keys, table.values):
        names += names_of(key if key is not None else value)
    return names


def test_every_fusebox_op_has_a_torch_version(fusebox):
    r = subprocess.run([fusebox, "ops", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ops = json.loads(r.stdout)["ops"]
    known = [o["op"] for o in ops]
    assert len(known) == len(set(known)) and len(known) > 30, known
    table = torch_ops_names()
    assert len(table) == len(set(table)), sorted(n for n in table if table.count(n) > 1)
    assert set(known) - set(table) == set(), "no torch version in TORCH_OPS"
    assert set(table) - set(known) == set(), "TORCH_OPS names ops fusebox does not know"


def test_ops_lists_traits(fusebox):
    r = subprocess.run([fusebox, "ops", "--json"], capture_output=True, text=True, timeout=60)
    ops = {o["op"]: o for o in json.loads(r.stdout)["ops"]}
    assert ops["embedding"]["traits"]["native_only"] is True
    assert ops["embedding"]["traits"]["index_inputs"] == ["ids"]
    assert ops["conv_dgrad"]["traits"]["bench_family"] == "conv_bwd"
    assert ops["sdpa_bwd"]["traits"]["reads_forward_outputs"] is True
    assert "epsilon" in ops["layernorm"]["traits"]["json_fields"]
    assert ops["add"]["traits"]["accepts_scalar_inputs"] is True
    assert ops["matmul"]["input_roles"] == ["a", "b"]
    # check --json gives each op the same traits.
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    r = subprocess.run([fusebox, "check", os.path.join(root, "examples", "graphs", "conv_dgrad.json"), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    op = json.loads(r.stdout)["ops"][0]
    assert op["traits"] == ops[op["op"]]["traits"]


def test_no_top_level_name_is_defined_twice():
    """A second `def apply_op` (or any top-level def) later in the module would silently replace the
    table's dispatch; read from the source, so it runs without torch."""
    tree = ast.parse(open(TORCH_OPS_PY).read())
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
