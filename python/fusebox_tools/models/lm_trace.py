"""Request traces for `fusebox serve lm --bench` (issue 34), and the latency plot of its report.

    python3 -m fusebox_tools.models.lm_trace make --data DIR --requests 64 --rate 8 --out trace.json \\
        [--prompt-len 24 --prompt-spread 0.5 --new-tokens 16 --shared-prefix 8 --shared-fraction 0.5 --seed 1]
    python3 -m fusebox_tools.models.lm_trace plot --report report.json --out latency.png

`make` draws arrivals as a Poisson process at --rate requests per second (exponential gaps),
prompt lengths log-normally around --prompt-len, and prompts as slices of the data folder's
val.npy (text the training never saw); a --shared-fraction of the prompts start with the same
--shared-prefix tokens (a system prompt: the engine's prefix pages serve them). The trace is
{"requests": [{"arrival_s", "prompt", "max_new_tokens"}], "made_with": {...}}. `plot` draws the
report's time to first token per request and its distribution (matplotlib).
"""
import argparse
import json
import math
import os
import sys

import numpy as np


def make(tokens, requests, rate, prompt_len, spread, new_tokens, shared_prefix, shared_fraction, seed, context):
    """The trace as a dict (see the module doc)."""
    rng = np.random.default_rng(seed)
    t = 0.0
    prefix = [int(x) for x in tokens[:shared_prefix]]
    out = []
    for _ in range(requests):
        t += float(rng.exponential(1.0 / rate))
        n = int(min(max(1, round(prompt_len * math.exp(spread * rng.standard_normal()))), context - new_tokens))
        start = int(rng.integers(0, max(1, len(tokens) - n)))
        prompt = [int(x) for x in tokens[start:start + n]]
        if shared_prefix and rng.random() < shared_fraction:
            prompt = (prefix + prompt)[:max(n, shared_prefix + 1)][:context - new_tokens]
        out.append({"arrival_s": round(t, 6), "prompt": prompt, "max_new_tokens": int(new_tokens)})
    return {"requests": out,
            "made_with": {"requests": requests, "rate": rate, "prompt_len": prompt_len, "prompt_spread": spread,
                          "new_tokens": new_tokens, "shared_prefix": shared_prefix,
                          "shared_fraction": shared_fraction, "seed": seed}}


def plot(report, out):
    """The time-to-first-token plot of a `serve lm --bench --report` file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ttft = report["ttft_per_request_s"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=120)
    a.plot(range(len(ttft)), ttft, ".", markersize=4)
    a.set_xlabel("request (arrival order)")
    a.set_ylabel("time to first token (s)")
    a.grid(alpha=0.3)
    b.hist(ttft, bins=30)
    b.set_xlabel("time to first token (s)")
    b.set_ylabel("requests")
    fig.suptitle(f"{report['requests']} requests, {report['tokens_per_s']:.0f} tokens/s, "
                 f"ITL p50 {report['itl_s']['p50'] * 1e3:.1f} ms ({report['backend']})")
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m fusebox_tools.models.lm_trace", description=__doc__.splitlines()[0])
    ap.add_argument("--fusebox", help=argparse.SUPPRESS)  # passed by the fusebox CLI; unused
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="a request trace")
    m.add_argument("--data", required=True, help="a data folder (its val.npy) or a tokens .npy")
    m.add_argument("--requests", type=int, default=64)
    m.add_argument("--rate", type=float, default=8.0, help="requests per second (Poisson)")
    m.add_argument("--prompt-len", type=float, default=24)
    m.add_argument("--prompt-spread", type=float, default=0.5, help="sigma of the log-normal prompt length")
    m.add_argument("--new-tokens", type=int, default=16)
    m.add_argument("--shared-prefix", type=int, default=0)
    m.add_argument("--shared-fraction", type=float, default=0.5)
    m.add_argument("--context", type=int, default=1024, help="the model's context: prompt + new tokens fit it")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--out", required=True)
    p = sub.add_parser("plot", help="the latency plot of a serve report")
    p.add_argument("--report", required=True)
    p.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        if a.command == "make":
            path = os.path.join(a.data, "val.npy") if os.path.isdir(a.data) else a.data
            tokens = np.load(path, allow_pickle=False)
            if tokens.ndim != 1 or tokens.dtype.kind not in "iu" or len(tokens) < 2:
                raise ValueError(f"{path}: not a 1-D integer token file")
            if not (a.requests > 0 and a.rate > 0 and a.prompt_len >= 1 and 0 < a.new_tokens < a.context):
                raise ValueError("needs requests > 0, rate > 0, prompt-len >= 1 and 0 < new-tokens < context")
            doc = make(tokens, a.requests, a.rate, a.prompt_len, a.prompt_spread, a.new_tokens, a.shared_prefix,
                       a.shared_fraction, a.seed, a.context)
            tmp = a.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, a.out)
            print(f"lm_trace: {a.out}: {a.requests} requests over {doc['requests'][-1]['arrival_s']:.2f} s")
        else:
            with open(a.report) as f:
                plot(json.load(f), a.out)
            print(f"lm_trace: {a.out}")
    except (OSError, ValueError, KeyError) as e:
        print(f"lm_trace: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
