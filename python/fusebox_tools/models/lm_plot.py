"""Loss curves of language-model training runs (issue 33) as a PNG, with matplotlib: the
`losses.csv` files `fusebox train lm` and `fusebox_tools.models.lm_torch train` write (columns
step, loss, ...). `fusebox train lm` calls it at the end of a run; BENCHMARKS.md's training plot
puts fusebox's and torch's runs on one figure.

    python3 -m fusebox_tools.models.lm_plot --out loss.png RUN.csv [MORE.csv ...] [--labels a,b]
"""
import argparse
import csv
import os
import sys


def read_losses(path):
    """(steps, losses) of a losses CSV; ValueError naming the file when it is not one."""
    steps, losses = [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "step" not in reader.fieldnames or "loss" not in reader.fieldnames:
            raise ValueError(f"{path}: not a losses CSV (needs the columns step and loss)")
        for row in reader:
            steps.append(int(row["step"]))
            losses.append(float(row["loss"]))
    return steps, losses


def plot(paths, labels, out, title="training loss"):
    """Writes the PNG (through a temporary file, renamed) and returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for path, label in zip(paths, labels):
        steps, losses = read_losses(path)
        ax.plot(steps, losses, label=label, linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(paths) > 1:
        ax.legend()
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+", help="losses CSV files")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--labels", help="comma-separated legend labels (default: the files' folders)")
    p.add_argument("--title", default="training loss")
    p.add_argument("--fusebox", help=argparse.SUPPRESS)  # passed by the fusebox CLI; unused
    a = p.parse_args(argv)
    labels = a.labels.split(",") if a.labels else [os.path.basename(os.path.dirname(os.path.abspath(c))) for c in a.csv]
    if len(labels) != len(a.csv):
        print(f"lm_plot: {len(labels)} labels for {len(a.csv)} files", file=sys.stderr)
        return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("lm_plot: matplotlib is missing (scripts/setup.sh installs it): no plot written", file=sys.stderr)
        return 3
    try:
        print(f"loss plot: {plot(a.csv, labels, a.out, a.title)}")
    except (OSError, ValueError) as e:
        print(f"lm_plot: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
