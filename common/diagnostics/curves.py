"""The training-curves PNG of a run's TensorBoard scalars (``tools/plot_curves.py``; an MLflow run's artifact)."""


def panels(scalars):
    """``[(title, [(tag, points), ...], [(tag, points) on a second axis, ...]), ...]`` of the figure."""
    def pick(keep):
        return [(t, scalars[t]) for t in sorted(scalars) if keep(t)]

    metric = lambda t: t.startswith(("Train-", "Val-"))  # noqa: E731
    return [
        ("loss", pick(lambda t: metric(t) and "Loss" in t), []),
        ("accuracy and other metrics", pick(lambda t: metric(t) and "Loss" not in t), []),
        ("learning rate", pick(lambda t: t.startswith("LR/")), []),
        ("loss scale (left), skipped steps (right)", pick(lambda t: t == "Loss-Scale"),
         pick(lambda t: t == "Skipped-Steps")),
        ("samples/s (left), peak memory MiB (right)", pick(lambda t: t.startswith("Speed/")),
         pick(lambda t: t.startswith("Memory/"))),
    ]


def plot(scalars, out):
    """Draw :func:`panels` of ``scalars`` into the PNG file ``out``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = panels(scalars)
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 2.6 * len(rows)), sharex=True)
    for ax, (title, left, right) in zip(axes, rows):
        ax.set_title(title, fontsize=10)
        for tag, points in left:
            ax.plot(*zip(*points), marker="." if len(points) < 50 else None, label=tag)
        if right:
            twin = ax.twinx()
            for tag, points in right:
                twin.plot(*zip(*points), color="tab:red", label=tag)
            twin.legend(loc="upper right", fontsize=8)
        if left:
            ax.legend(loc="upper left", fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("global micro-batch")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
