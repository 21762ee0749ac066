"""fusebox.torch_op: a fusebox plan as an opaque torch.library custom op, with
a fake implementation, so it traces under torch.compile(fullgraph=True) and
records into torch.cuda.graph captures (outputs and workspace come from
torch's allocator; the call never synchronizes)."""
import keyword
import re

from . import errors
from ._graph import Graph
from ._session import Session
from ._tensors import check, torch_dtype, view

_registered = {}
# Names a schema argument cannot take (torch's schema parser reads them as types or keywords).
_RESERVED = {"self", "out", "Tensor", "int", "float", "bool", "str", "None", "Scalar", "Device", "Layout",
             "ScalarType", "Generator", "Storage", "Any", "True", "False"}


def _ident(name, used):
    s = re.sub(r"\W", "_", name)
    if not s or s[0].isdigit() or keyword.iskeyword(s) or s in used or s in _RESERVED:
        s = f"t{len(used)}_{s}"
    used.add(s)
    return s


def torch_op(graph, name=None, outputs=None, *, session=None, plan=None, heuristics=None, engine=None):
    """Registers the graph as the custom op `name` ("namespace::op", default "fusebox::<graph name>")
    taking the graph's input tensors (in the graph's order, as positional arguments) and returning
    the `outputs` named (default: every output; one tensor for one output, else a tuple). Other
    outputs are computed into scratch tensors and dropped.

    The plan is built now (`plan`, or session.build(graph, heuristics=..., engine=...) on `session`,
    default a Session on torch's current device). Returns the op (callable; also torch.ops.NS.OP)."""
    import torch

    graph = Graph.coerce(graph)
    if session is None:
        session = plan.session if plan is not None else Session(device=torch.cuda.current_device())
    if plan is None:
        plan = session.build(graph, heuristics=heuristics, engine=engine)
    elif plan.graph is not graph and plan.graph.name != graph.name:
        raise errors.InvalidArgument(f"torch_op: the plan is for graph '{plan.graph.name}', not '{graph.name}'")
    ins = graph.inputs
    all_outs = graph.outputs
    out_names = [t.name for t in all_outs] if outputs is None else list(outputs)
    known = {t.name for t in all_outs}
    for n in out_names:
        if n not in known:
            raise errors.InvalidArgument(f"torch_op: '{n}' is not an output of graph '{graph.name}'; its outputs are "
                                         + ", ".join(t.name for t in all_outs))
    if not out_names:
        raise errors.InvalidArgument(f"torch_op: no outputs named for graph '{graph.name}'")
    qualname = name or "fusebox::" + re.sub(r"\W", "_", graph.name)
    if "::" not in qualname:
        qualname = "fusebox::" + qualname
    if qualname in _registered:
        raise errors.InvalidArgument(f"torch_op: an op named '{qualname}' is registered already (graph "
                                     f"'{_registered[qualname]}'); give another name=")

    used = set()
    params = ", ".join(f"Tensor {_ident(t.name, used)}" for t in ins)
    ret = "Tensor" if len(out_names) == 1 else "(" + ", ".join(["Tensor"] * len(out_names)) + ")"
    schema = f"({params}) -> {ret}"
    where = f"fusebox op '{qualname}'"
    out_specs = [(t, torch_dtype(t.dtype)) for t in all_outs]

    def _bad_arity(args):
        if len(args) != len(ins):
            raise errors.InvalidArgument(f"{where}: takes {len(ins)} tensors ({', '.join(t.name for t in ins)}); "
                                         f"given {len(args)}")

    def _outputs(device):
        return {t.name: torch.empty_strided(t.dims, t.strides, dtype=dt, device=device) for t, dt in out_specs}

    def _result(tensors):
        res = tuple(tensors[n] for n in out_names)
        return res[0] if len(res) == 1 else res

    def impl(*args):
        _bad_arity(args)
        tensors = dict(zip((t.name for t in ins), args))
        device = args[0].device if args else torch.device("cuda", session.device)
        tensors.update(_outputs(device))
        plan._run(tensors, None)
        return _result(tensors)

    def fake(*args):
        # Shapes and dtypes checked at trace time too (strides and pointers only when it runs).
        _bad_arity(args)
        for t, a in zip(ins, args):
            v = view(t.name, a, with_pointer=False)
            v.strides, v.ptr = tuple(t.strides), 1 << 20
            check(where, t, v, None)
        device = args[0].device if args else torch.device("cuda", session.device)
        return _result(_outputs(device))

    op = torch.library.custom_op(qualname, impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    _registered[qualname] = graph.name
    # Kept alive with the op: the plan, its session and graph.
    op.fusebox_plan = plan
    return op
