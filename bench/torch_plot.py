"""Plots bench/torch_step.py's JSON files side by side: per model and rank count, the step
time of khor and DDP-gloo, and the gradient allreduce alone (khor vs gloo).

    /usr/bin/python3 bench/torch_plot.py docs/data/torch/step_n2.json \
        docs/data/torch/step_n4.json -o docs/data/torch/torch_step.png
"""
import argparse
import json

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    groups, khor_step, ddp_step, khor_ar, gloo_ar = [], [], [], [], []
    for f in a.files:
        d = json.load(open(f))
        rows = {(r["model"], r["mode"]): r for r in d["rows"]}
        for model in sorted({m for m, _ in rows}):
            groups.append("%s\nn=%d" % (model, d["ranks"]))
            khor_step.append(rows[(model, "khor")]["step_ms"])
            ddp_step.append(rows[(model, "ddp")]["step_ms"])
            khor_ar.append(rows[(model, "khor-ar")]["step_ms"])
            gloo_ar.append(rows[(model, "gloo-ar")]["step_ms"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(groups))
    w = 0.38
    for ax, (k, g, title) in zip(axes, ((khor_step, ddp_step, "training step (ms)"),
                                       (khor_ar, gloo_ar, "gradients allreduced alone (ms)"))):
        ax.bar([i - w / 2 for i in x], k, w, label="khor")
        ax.bar([i + w / 2 for i in x], g, w, label="DDP / gloo")
        ax.set_xticks(list(x))
        ax.set_xticklabels(groups)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
