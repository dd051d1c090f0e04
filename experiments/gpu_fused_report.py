"""Collect experiments/gpu_fused.sh's result files into ``OUT/summary.md`` and
``OUT/encoder_ratio.png`` (reads result files only).

    python experiments/gpu_fused_report.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def encoder_rows(out: Path) -> dict[tuple[str, str], list[dict]]:
    """(dtype, today|fused) -> the rows of bench encoder's JSON, where the file exists."""
    found = {}
    for path in sorted(out.glob("encoder_*_*.json")):
        _, dtype, mode = path.stem.split("_")
        found[(dtype, mode)] = json.loads(path.read_text())
    return found


def encoder_table(found: dict) -> list[str]:
    """Converted / original speed per length, one column per (dtype, mode)."""
    keys = sorted(found)
    lengths = sorted({r["length"] for rows in found.values() for r in rows})
    lines = ["| tokens | " + " | ".join(f"{d} {m}" for d, m in keys) + " |",
             "|---:|" + "---:|" * len(keys)]
    for L in lengths:
        cells = []
        for key in keys:
            r = next((r for r in found[key] if r["length"] == L), None)
            cells.append("-" if r is None else
                         f"{r['converted_sps'] / r['original_sps']:.2f} (b{r['batch_size']})")
        lines.append(f"| {L} | " + " | ".join(cells) + " |")
    return lines


def plot(found: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (dtype, mode), rows in sorted(found.items()):
        ax.plot([r["length"] for r in rows],
                [r["converted_sps"] / r["original_sps"] for r in rows], marker="o", ms=3,
                ls="-" if mode == "fused" else "--", label=f"{dtype} {mode}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xscale="log", xlabel="tokens", ylabel="converted / original (sentences/s)",
           title="MiniLM shapes, FAVOR+ M = 64, batch 32")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(out: str) -> int:
    out = Path(out)
    parts = ["# Fused kernels on the GPU (experiments/gpu_fused.sh)", ""]
    for name in ("env.txt", "status.txt"):
        if (out / name).exists():
            parts += [f"`{name}`:", "", "```", (out / name).read_text().strip(), "```", ""]
    log = out / "kernels_vs_naive.log"
    lines = log.read_text().strip().splitlines() if log.exists() else []
    if lines:
        parts += [f"Compiled kernels against the naive twins (pytest): `{lines[-1]}`", ""]
    if (out / "op" / "table.md").exists():
        parts += ["## Op level", "", (out / "op" / "table.md").read_text(), ""]
    found = encoder_rows(out)
    if found:
        parts += ["## Whole encoder: converted / original (sentences per second, batch)", "",
                  *encoder_table(found), ""]
        plot(found, out / "encoder_ratio.png")
    (out / "summary.md").write_text("\n".join(parts) + "\n")
    print(f"wrote {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
