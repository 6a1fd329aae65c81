"""A one-page picture of a training run from its metrics.jsonl: reward per harness, loss, clipping, IS metrics.

python -m trainers.plots runs/train-xyz/metrics.jsonl runs/train-xyz/metrics.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def read_metrics(path: str | Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


def plot_metrics(metrics_jsonl: str | Path, out_png: str | Path) -> Path:
    """Write a 2x3 grid of the run's curves; works on a partial file (call it any time during a run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_jsonl)
    train = [r for r in rows if r.get("kind", "train") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))

    def series(data: list[dict], key: str) -> tuple[list[float], list[float]]:
        pts = [(r["step"], r[key]) for r in data if key in r and r[key] is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    ax = axes[0, 0]
    harness_keys = sorted({k for r in train for k in r if k.startswith("reward/")})
    for key in harness_keys:
        ax.plot(*series(train, key), label=f"train {key[7:]}")
    for key in sorted({k for r in evals for k in r if k.startswith("eval_reward/")}):
        ax.plot(*series(evals, key), "o--", label=f"held-out {key[12:]}")
    ax.set_title("reward per harness")
    ax.set_xlabel("step")
    if harness_keys or evals:
        ax.legend(fontsize=7)

    panels = [
        (axes[0, 1], ["loss", "pg_loss", "value_loss"], "loss"),
        (axes[0, 2], ["clip_frac", "is_clipped_frac", "is_masked_frac"], "clip / mask fractions"),
        (axes[1, 0], ["is_ratio_mean", "is_ratio_max"], "rollout IS ratio"),
        (axes[1, 1], ["is_kl_k3", "kl_ref"], "KL estimates (k3)"),
        (axes[1, 2], ["entropy", "groups_degenerate", "rollouts_failed"], "entropy, degenerate groups, failures"),
    ]
    for ax, keys, title in panels:
        for key in keys:
            xs, ys = series(train, key)
            if xs:
                ax.plot(xs, ys, label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m trainers.plots METRICS_JSONL OUT_PNG")
    print(plot_metrics(sys.argv[1], sys.argv[2]))
