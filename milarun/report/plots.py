"""Inline SVG plots made with matplotlib (Agg backend; no display needed).

Only numbers and device labels reach matplotlib, never test names, and
matplotlib XML-escapes any text it writes, so the SVG is safe to inline.
"""

import io
import re
from typing import Any

from ..analysis.summary import device_key

#: Colour of what the anomaly rules flagged on a plot (slow windows, stalls).
FLAG_COLOUR = "#d62728"

_XML_HEAD = re.compile(r"^.*?(?=<svg)", re.S)


def svg_text(fig):
    """The inline SVG of matplotlib figure ``fig`` (no XML header, no date: the same
    figure gives the same text). Call it inside the plotter's ``rc_context``."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return _XML_HEAD.sub("", buf.getvalue(), count=1)


def _short_number(value, _pos=None):
    """Tick label with a k/M/G suffix at 1000 and above (no milli: 0.5, not 500m)."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:g}{suffix}"
    return f"{value:g}"


class Plotter:
    """Reuses one figure for every plot: building a figure costs more than drawing it."""

    def __init__(self, size=(6.4, 2.6)):
        import matplotlib

        matplotlib.use("Agg", force=True)
        from matplotlib.figure import Figure

        self.rc: dict[Any, Any] = {
            "svg.fonttype": "none",
            "svg.hashsalt": "milarun",
            "font.size": 8,
        }
        self.matplotlib = matplotlib
        # CSS needs "#rrggbb"; matplotlib 3.11 gives (r, g, b) tuples
        from matplotlib.colors import to_hex

        self.colours = [to_hex(c) for c in matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]]
        # the flag colour stays for flags
        self.colours = [c for c in self.colours if c != FLAG_COLOUR]
        self.fig = Figure(figsize=size)
        # Fixed margins instead of tight_layout(), which costs a second draw per plot.
        self.fig.subplots_adjust(left=0.10, right=0.99, bottom=0.17, top=0.97)
        self.ax = self.fig.add_subplot(1, 1, 1)
        # Labels and grid are set once; each plot only swaps the data artists.
        # ax.clear() would rebuild every tick (most of the cost of a plot).
        with matplotlib.rc_context(self.rc):
            self.ax.set_xlabel("time since program start (s)")
            self.ax.set_ylabel("throughput (items/s)")
            # a fixed place, inside the figure whatever the tick labels' width
            self.ax.yaxis.set_label_coords(-0.075, 0.5)
            self.ax.grid(True, linewidth=0.3)
        # 670k rather than 670000: the fixed left margin fits the tick labels
        from matplotlib.ticker import FuncFormatter

        self.ax.yaxis.set_major_formatter(FuncFormatter(_short_number))

    def _svg(self):
        with self.matplotlib.rc_context(self.rc):
            return svg_text(self.fig)

    def throughput(self, results):
        """Return ``(svg, legend, marks)``: throughput over time for one test, one line
        per device.

        ``results`` are the test's records as the summary judged them
        (:class:`milarun.analysis.summary.Result`: each one's steady state and anomaly
        flags computed once, read here). For each device one
        successful run is drawn, the lowest-numbered one with a ``slow-windows``
        or ``stall`` flag, else the lowest-numbered one: sample midpoint in s since
        program start vs. rate in items/s, warm-up samples dotted. Under each
        line a wide pale band of the same colour covers the samples chosen by
        :func:`milarun.measure.stats.steady_state` (its steady-state window). The
        anomaly flags of the drawn runs (:func:`milarun.measure.anomalies.result_flags`)
        are marked in :data:`FLAG_COLOUR`: a cross on each slow window, a
        shaded span over each stall.

        ``legend`` is ``[(device, run, "#rrggbb")]`` and ``marks`` the set of
        flag kinds drawn (``"slow-windows"``, ``"stall"``); the page draws the
        legend in HTML, which is much cheaper than a matplotlib legend.
        ``(None, [], set())`` when there is nothing to draw.
        """
        chosen: dict = {}
        for res in results:
            rec = res.record
            samples = rec["timings"].get("train", {}).get("samples") or []
            if not rec.get("success") or not samples:
                continue
            dev = str(rec.get("device", ""))
            run = rec.get("run", 0)
            flags = res.record_flags
            # a flagged run first, so that its flags show; then the lowest run
            key = (not any(f.id in ("slow-windows", "stall") for f in flags), run)
            if dev not in chosen or key < chosen[dev][0]:
                chosen[dev] = (key, samples, flags, res.steady)
        if not chosen:
            return None, [], set()
        legend, marks = [], set()
        with self.matplotlib.rc_context(self.rc):
            ax = self.ax
            for artist in list(ax.lines) + list(ax.patches):
                artist.remove()
            for i, dev in enumerate(sorted(chosen, key=device_key)):
                (_, run), samples, flags, steady = chosen[dev]
                colour = self.colours[i % len(self.colours)]
                legend.append((dev, run, colour))
                xs = [(s["start"] + s["end"]) / 2 for s in samples]
                ys = [s["rate"] for s in samples]
                window = steady[1] if steady is not None else []
                if window:
                    band = [((s["start"] + s["end"]) / 2, s["rate"]) for s in window]
                    ax.plot(
                        *zip(*band),
                        color=colour,
                        linewidth=7,
                        alpha=0.22,
                        solid_capstyle="butt",
                        zorder=1,
                    )
                ax.plot(xs, ys, color=colour, linewidth=1, zorder=2)
                warm = [(x, y) for x, y, s in zip(xs, ys, samples) if s.get("warmup")]
                if warm:
                    ax.plot(*zip(*warm), "o", color=colour, markersize=2, zorder=3)
                for flag in flags:
                    if flag.id == "slow-windows":
                        spans = {tuple(sp) for sp in flag.figures["spans"]}
                        pts = [
                            (x, y)
                            for x, y, s in zip(xs, ys, samples)
                            if (s["start"], s["end"]) in spans
                        ]
                        if pts:
                            ax.plot(
                                *zip(*pts),
                                "x",
                                color=FLAG_COLOUR,
                                markersize=5,
                                markeredgewidth=1.2,
                                zorder=4,
                            )
                            marks.add("slow-windows")
                    elif flag.id == "stall":
                        for a, b in flag.figures["spans"]:
                            ax.axvspan(a, b, color=FLAG_COLOUR, alpha=0.12, linewidth=0, zorder=0)
                        marks.add("stall")
            ax.set_autoscale_on(True)
            ax.relim()
            ax.autoscale_view()
            ax.set_ylim(bottom=0)
        return self._svg(), legend, marks

    def heatmap(self, table):
        """SVG heat-map of per-GPU ratios (``{"devices", "rows"}`` from ``gpu_tables``).

        Rows are numbered (the HTML table next to it names them), so no test
        name enters the SVG.
        """
        import numpy as np

        devices, rows = table["devices"], table["rows"]
        if not rows or not devices:
            return None
        data = np.array(
            [
                [vals.get(d, np.nan) if vals.get(d) is not None else np.nan for d in devices]
                for _, vals in rows
            ],
            dtype=float,
        )
        from matplotlib.figure import Figure

        with self.matplotlib.rc_context(self.rc):
            fig = Figure(figsize=(1.2 + 0.5 * len(devices), 0.8 + 0.25 * len(rows)))
            ax = fig.add_subplot(1, 1, 1)
            im = ax.imshow(
                data,
                cmap="RdYlGn",
                vmin=max(0.0, float(np.nanmin(data)) - 0.01) if np.isfinite(data).any() else 0,
                vmax=1.0,
                aspect="auto",
            )
            ax.set_xticks(range(len(devices)), [str(d) for d in devices])
            ax.set_yticks(range(len(rows)), [str(i + 1) for i in range(len(rows))])
            ax.set_xlabel("device")
            ax.set_ylabel("test #")
            fig.colorbar(im, ax=ax, fraction=0.05)
            fig.tight_layout()
            return svg_text(fig)

    def scaling(self, table):
        """SVG plot of a node-progression test (one entry of
        :func:`milarun.report.breakdown.scaling_tables`): mean throughput (items/s)
        vs total GPUs ``n × g``, one line per g (GPUs per node) over the node
        counts n, and the ideal linear line ``n × g × T(1, 1)`` when there is a
        1x1 baseline. Labels hold only numbers. None when nothing has a rate.
        """
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter, MaxNLocator

        lines = []
        for g in table["gpus"]:
            points = [
                (n * g, table["cells"][(n, g)]["throughput"])
                for n in table["nodes"]
                if table["cells"].get((n, g)) and table["cells"][(n, g)]["throughput"] is not None
            ]
            if points:
                lines.append((g, points))
        if not lines:
            return None
        with self.matplotlib.rc_context(self.rc):
            fig = Figure(figsize=(5.0, 3.0))
            ax = fig.add_subplot(1, 1, 1)
            for i, (g, points) in enumerate(lines):
                ax.plot(
                    *zip(*points),
                    "o-",
                    color=self.colours[i % len(self.colours)],
                    linewidth=1,
                    markersize=3,
                    label=f"{g} GPU/node",
                )
            if table["base"] is not None:
                top = max(n * g for n in table["nodes"] for g in table["gpus"])
                ax.plot(
                    [0, top],
                    [0, top * table["base"]],
                    "--",
                    color="#888",
                    linewidth=1,
                    label="ideal: n × g × 1x1",
                )
            ax.set_xlabel("total GPUs (nodes × GPUs per node)")
            ax.set_ylabel("throughput (items/s)")
            ax.yaxis.set_major_formatter(FuncFormatter(_short_number))
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlim(left=0)
            ax.set_ylim(bottom=0)
            ax.grid(True, linewidth=0.3)
            ax.legend(loc="upper left", fontsize=7)
            fig.tight_layout()
            return svg_text(fig)

    def energy(self, rows):
        """SVG bar chart of energy efficiency: ``rows`` are ``[(number, items/J)]``
        (:func:`milarun.report.checks.energy_plot_rows`); bars are labelled by
        number only. None when there is nothing to draw."""
        from matplotlib.figure import Figure

        rows = [(n, v) for n, v in rows if v is not None]
        if not rows:
            return None
        with self.matplotlib.rc_context(self.rc):
            fig = Figure(figsize=(5.0, 0.8 + 0.25 * len(rows)))
            ax = fig.add_subplot(1, 1, 1)
            ax.barh(range(len(rows)), [v for _, v in rows], color=self.colours[0])
            ax.set_yticks(range(len(rows)), [str(n) for n, _ in rows])
            ax.invert_yaxis()
            ax.set_xlabel("energy efficiency (items/J = items/s per W)")
            ax.set_ylabel("test #")
            ax.grid(True, axis="x", linewidth=0.3)
            fig.tight_layout()
            return svg_text(fig)
