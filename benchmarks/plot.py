"""``results/overhead.png``: time each variant adds per call, next to unpatched torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VARIANTS = (
    ("unpatched again (control)", "unpatched torch", "#8c8c8c"),
    ("ours, native group", "ours, native group", "#1f77b4"),
    ("ours, reloadable group", "ours, reloadable group", "#6baed6"),
    ("slime-style, native group", "slime-style, native group", "#d62728"),
    ("slime-style, reloadable group", "slime-style, reloadable group", "#ff9896"),
)


def draw(overhead: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    functions = [name for name, rows in overhead.items() if isinstance(rows, dict)]
    fig, axes = plt.subplots(1, len(functions), figsize=(5.6 * len(functions), 4.0))
    for axis, function in zip(axes, functions, strict=True):
        rows = overhead[function]
        labels, values, errors, colors = [], [], [[], []], []
        for key, label, color in VARIANTS:
            stats = rows[key]["overhead_ns"]
            labels.append(label)
            values.append(stats["estimate"])
            errors[0].append(max(stats["estimate"] - stats["low"], 0.0))
            errors[1].append(max(stats["high"] - stats["estimate"], 0.0))
            colors.append(color)
        positions = list(range(len(labels)))
        axis.barh(positions, values, xerr=errors, color=colors, capsize=3)
        axis.set_yticks(positions, labels)
        axis.invert_yaxis()
        axis.axvline(150, color="#444444", linestyle="--", linewidth=1)
        axis.annotate(
            "150 ns target",
            (150, len(labels) - 0.5),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
        )
        for y, value in zip(positions, values, strict=True):
            axis.annotate(
                f"{value:+.0f} ns",
                (max(value, 0), y),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
            )
        base = rows["unpatched, native group"]["per_call_ns"]["median"]
        axis.set_title(f"{function} (unpatched: {base:,.0f} ns/call, median)", fontsize=10)
        axis.set_xlabel(
            f"ns added per call ({rows['unpatched again (control)']['overhead_ns']['statistic']})",
            fontsize=8,
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
