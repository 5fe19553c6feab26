"""Notebook 05's figures: scaling against k, the pipeline's timeline and idle share, the cost
of a synchronous step, and accuracy against the global batch. Plotting only: the measurements
are made in the notebook's cells and in `pipeline.py`'s workers."""


def _legend_below(fig, ax, ncol=3):
    """The axes' legend under the figure, where it covers no line."""
    fig.legend(*ax.get_legend_handles_labels(), loc='upper center', ncol=ncol, fontsize=7,
               bbox_to_anchor=(0.5, 0.02), frameon=False)


def plot_scaling(ks, seconds, accuracies, emulated, batch_size, epochs=None):
    """Seconds per epoch and test accuracy (after the last of `epochs` epochs) against k; the
    reference line is the ideal 1/k on real devices, and k=1's time where replicas share one
    device and take turns."""
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(7, 2.6))
    ax1.plot(ks, [seconds[k] for k in ks], 'o-', label='measured', zorder=3)
    ideal = [seconds[ks[0]] * ks[0] / k for k in ks]
    reference = [seconds[ks[0]]] * len(ks) if emulated else ideal
    label = f'k={ks[0]}\'s time (replicas take turns)' if emulated else 'ideal (1/k)'
    ax1.plot(ks, reference, '--', color='gray', label=label)
    top = 1.2 * max(max(seconds.values()), max(reference))  # room above both lines
    ax1.set(xlabel='devices k', ylabel='seconds per epoch', xticks=ks, ylim=(0, top))
    ax2.plot(ks, [accuracies[k] for k in ks], 'o-')
    ax2.set(xlabel='devices k', ylabel='test accuracy' + (f', epoch {epochs}' if epochs else ''),
            xticks=ks, ylim=(0, 1))
    fig.suptitle(f'LeNet, batch {batch_size}, ' + ('emulated replicas' if emulated else 'GPUs'))
    fig.tight_layout()
    _legend_below(fig, ax1)
    return fig


def plot_pipeline(timeline, idle, bubble, unequal):
    """The least idle step at the fewest and the most micro-batches, drawn per stage as forward
    (blue) and backward (orange) intervals, and the idle share against m beside both models."""
    import matplotlib.pyplot as plt
    ms = list(idle)
    fig, axes = plt.subplots(1, 3, figsize=(10, 2.6), gridspec_kw={'width_ratios': [1, 1, 1.1]})
    for ax, m in zip(axes, (ms[0], ms[-1])):
        t0 = min(e[0] for ev in timeline[m] for e in ev)
        for r, ev in enumerate(timeline[m]):
            for kind, color, name in (('F', 'tab:blue', 'forward'),
                                      ('B', 'tab:orange', 'backward')):
                ax.broken_barh([((e[0] - t0) * 1e3, (e[1] - e[0]) * 1e3) for e in ev
                                if e[2] == kind], (r - 0.35, 0.7), color=color,
                               label=name if r == 0 else None)
        ax.set(yticks=[0, 1], yticklabels=['stage 0', 'stage 1'], xlabel='ms',
               title=f'm={m}: idle {idle[m]:.0%}')
        ax.invert_yaxis()
    axes[2].plot(ms, [idle[m] for m in ms], 'o-', label='measured idle share')
    axes[2].plot(ms, [bubble[m] for m in ms], 'k--', label='(p-1)/(m+p-1)')
    axes[2].plot(ms, [unequal[m] for m in ms], 'g:', label='model with unequal stages')
    axes[2].set_xscale('log', base=2)
    axes[2].set(xlabel='micro-batches m', ylabel='idle share', xticks=ms, xticklabels=ms,
                ylim=(0, 1))
    axes[2].minorticks_off()
    fig.tight_layout()
    handles = [h for ax in (axes[0], axes[2]) for h in ax.get_legend_handles_labels()[0]]
    labels = [t for ax in (axes[0], axes[2]) for t in ax.get_legend_handles_labels()[1]]
    fig.legend(handles, labels, loc='upper center', ncol=5, fontsize=7,
               bbox_to_anchor=(0.5, 0.02), frameon=False)
    return fig


def plot_sync_step(t1, t2, t2_by_bytes, latency, bandwidth, gradient_bytes, t1_on, t2_on,
                   same_hardware=True):
    """Left: t1(b) against the per-device batch, with t2 and the overlapped step max(t1, t2)
    only where t1 and t2 were measured on the same hardware (else neither is drawn against
    the other). Right: the all-reduce's time against its size, with latency + bytes /
    bandwidth. t1_on, t2_on: what each ran on, for the panels' titles."""
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 2.8))
    bs = list(t1)
    ax1.plot(bs, [t1[b] for b in bs], 'o-', label='t1(b): compute')
    if same_hardware:
        ax1.axhline(t2, color='r', ls='--',
                    label=f't2: all-reduce of {gradient_bytes / 1e6:.1f} MB')
        ax1.plot(bs, [max(t1[b], t2) for b in bs], 'k:', label='step, overlapped: max(t1, t2)')
    ax1.set(xscale='log', yscale='log', xlabel='per-device batch b', ylabel='seconds',
            title=f't1 on {t1_on}')
    sizes = list(t2_by_bytes)
    ax2.plot(sizes, list(t2_by_bytes.values()), 'o', label='all-reduce, measured')
    line = [sizes[0] * (sizes[-1] / sizes[0]) ** (i / 49) for i in range(50)]
    ax2.plot(line, [latency + (s - sizes[0]) / bandwidth for s in line], 'k--',
             label='latency + bytes / bandwidth')
    ax2.axvline(gradient_bytes, color='gray', lw=0.8, ls=':', label='LeNet\'s gradient')
    ax2.set(xscale='log', yscale='log', xlabel='bytes all-reduced', ylabel='t2 (s)',
            title=f't2: {t2_on}')
    for ax in (ax1, ax2):
        ax.title.set_fontsize(9)
    fig.tight_layout()
    handles = [h for ax in (ax1, ax2) for h in ax.get_legend_handles_labels()[0]]
    labels = [t for ax in (ax1, ax2) for t in ax.get_legend_handles_labels()[1]]
    fig.legend(handles, labels, loc='upper center', ncol=3, fontsize=7,
               bbox_to_anchor=(0.5, 0.02), frameon=False)
    return fig


def plot_larger_batch(accuracy, steps, examples, lr):
    """Test accuracy after one epoch at each global batch, each point labelled with the steps
    it took and the examples it saw (examples: {batch: examples})."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(3.8, 2.6))
    batches = list(accuracy)
    ax.plot(batches, [accuracy[B] for B in batches], 'o-')
    for B in batches:
        ax.annotate(f'{steps[B]} steps\n{examples[B]:,} ex.', (B, accuracy[B]), fontsize=7,
                    textcoords='offset points', xytext=(4, 4))
    ax.set_xscale('log', base=2)
    ax.set(xlabel='global batch', ylabel='test accuracy', ylim=(0, 1), xticks=batches,
           xticklabels=batches, title=f'after 1 epoch, lr {lr:g}')
    ax.minorticks_off()
    ax.margins(x=0.2)
    return fig
