"""The performance page's charts and tables, read from `bench/results/` (the files the benchmarks
saved), so the figures on the page are the figures of the runs."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _first_run(text: str) -> str:
    """The latest run of a results file: its first block, up to the next command line."""
    blocks = re.split(r"\n(?=\$ |# ~|## )", text.strip())
    return blocks[0]


def _read(name: str) -> str:
    return (RESULTS / name).read_text()


# --- parsers --------------------------------------------------------------------------------
def ring_vs_skiplocked(text: str | None = None) -> dict[str, dict[str, float]]:
    """design -> short, sustained, first and last minute (messages/s), from the summary table."""
    text = text or _read("ring_vs_skiplocked.txt")
    out: dict[str, dict[str, float]] = {}
    table = text.split("design          short /s", 1)[1].split("\n\n", 1)[0]
    for line in table.strip().splitlines()[1:]:
        name, *values = line.split()
        figures = dict(zip(("short", "sustained", "first", "last"), values, strict=True))
        out[name] = {k: _num(v) for k, v in figures.items() if v != "nan"}
    return out


def held_snapshot(text: str | None = None) -> dict[str, list[float]]:
    """'without' / 'with' -> ring batch messages/s in each 10 s of the run."""
    text = text or _read("ring_held_snapshot.txt")
    out = {}
    for held, series in re.findall(
        r"held snapshot: (no|yes), fillfactor dbq default\n\s+per 10 s:([^\n]+)", text
    ):
        out["with" if held == "yes" else "without"] = [_num(v) for v in series.split()]
    return out


def smart_batching(
    text: str | None = None, name: str = "smart_batching.txt"
) -> dict[tuple[str, str, str], dict[int, float]]:
    """(design, operation, off|on) -> threads -> messages/s, the latest run of results file
    `name`; repeated single-thread runs averaged; runs pinned to one CPU left out."""
    text = _first_run(text or _read(name))
    runs: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    pattern = rf"^\s+(ring|pipes)\s+(\S+)\s+(off|on)\s+(\d+) threads\s+{_NUMBER} msg/s(.*)$"
    for design, op, mode, threads, rate, rest in re.findall(pattern, text, re.M):
        if "one CPU" not in rest:
            runs[design, op, mode][int(threads)].append(_num(rate))
    return {key: {t: sum(v) / len(v) for t, v in sorted(by.items())} for key, by in runs.items()}


def smart_batching_options(text: str | None = None) -> list[tuple[str, str, float, float, float, float]]:
    """(design, call, off, on messages/s, on / off, on / the default call's on) of each call with
    its own options, the latest run."""
    text = _first_run(text or _read("smart_batching_options.txt"))
    rates = {
        (design, call, mode): _num(rate)
        for design, call, mode, rate in re.findall(
            rf"^\s+(ring|pipes)\s+\d+ threads\s+(\S+)\s+(off|on)\s+{_NUMBER} msg/s", text, re.M
        )
    }
    pattern = rf"^\s+(ring|pipes)\s+(\S+): on / off {_NUMBER} x .*?, on / \S+ on {_NUMBER} x"
    return [
        (design, call, rates[design, call, "off"], rates[design, call, "on"], _num(up), _num(near))
        for design, call, up, near in re.findall(pattern, text, re.M)
    ]


def stats_cost(text: str | None = None) -> list[tuple[int, float, float]]:
    """(slots, stats() p50 ms, counting rows p50 ms), the latest run."""
    text = _first_run(text or _read("stats_cost.txt"))
    pattern = rf"{_NUMBER} slots .*?stats p50\s+{_NUMBER} ms.*?counting rows p50\s+{_NUMBER} ms"
    return [(int(_num(s)), _num(a), _num(b)) for s, a, b in re.findall(pattern, text)]


def control_plane(text: str | None = None) -> tuple[int, list[tuple[float, int]]]:
    """(queues, [(seconds since the first create, queues Ready)]) of the latest run."""
    text = _first_run(text or _read("control_plane_1000_queues.txt"))
    counts = re.search(r"queues Ready, by seconds since the first was created: ([^\n]+)", text)
    assert counts, "no 'queues Ready, by seconds' line in the latest control-plane run"
    points = [(float(s), int(n)) for s, n in re.findall(r"(\d+)s (\d+)", counts.group(1))]
    return points[-1][1], [(0.0, 0), *points]


def spark_consume(text: str | None = None) -> list[tuple[str, float]]:
    """(way, messages/s) of the latest run."""
    text = _first_run(text or _read("spark_consume.txt"))
    return [
        (way.strip(), _num(rate))
        for way, rate in re.findall(rf"^  ((?:client|Spark)[^\n]*?)\s+{_NUMBER} msg/s", text, re.M)
    ]


def tls_cost(text: str | None = None) -> list[tuple[str, str, float, float]]:
    """(database, line, plain, verified TLS messages/s) of the latest run."""
    text = _first_run(text or _read("tls_cost.txt"))
    out = []
    for block in re.split(r"\n(?=\S)", text)[2:]:
        database, _, body = block.partition("\n")
        for line, plain, tls in re.findall(
            rf"^  (\w+)\s+plain\s+{_NUMBER}\s+verified TLS\s+{_NUMBER}", body, re.M
        ):
            out.append((database.strip(), line, _num(plain), _num(tls)))
    return out


def autoscale(text: str | None = None) -> dict[str, dict[str, list[int]]]:
    """'MODE TOTAL' -> {'replicas': [...], 'waiting': [...]} every 5 s, of the latest run."""
    text = _first_run(text or _read("autoscale.txt"))
    out: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for label, series, values in re.findall(
        r"^  curve ([\w-]+ [0-9,]+), every 5 s: (\w+) ([^\n]+)", text, re.M
    ):
        out[label][series] = [int(v) for v in values.split()]
    return dict(out)


def autoscale_rounds(text: str | None = None) -> list[tuple[str, str, str]]:
    """(messages, mode, the round's figures as printed) of the latest run."""
    text = _first_run(text or _read("autoscale.txt"))
    return re.findall(r"^\s*([0-9,]+) messages, ([\w-]+)\s*: ([^\n]+)", text, re.M)


def autoscale_at_rest(text: str | None = None) -> list[tuple[str, float, int]]:
    """(trigger, stats calls a second beyond the operator's own, sessions) of the latest run."""
    text = _first_run(text or _read("autoscale.txt"))
    return [(mode.strip(), _num(rate), int(held)) for mode, rate, held in re.findall(
        rf"^  at rest, ([\w -]+?)\s*: +{_NUMBER} calls a second beyond the operator's own, (\d+) sessions", text, re.M)]  # fmt: skip


# --- tables ---------------------------------------------------------------------------------
def _run_line(name: str) -> str:
    """The latest run's heading in its results file: command, date, commit."""
    first = _first_run(_read(name)).splitlines()[0].lstrip("$# ").strip()
    return f"\nLatest run, from `bench/results/{name}`: `{first}`\n"


def ring_table() -> str:
    rows = ["| design | 20 s from empty, /s | 5 min over 1M backlog, snapshot held, /s | first minute | last minute |",
            "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, f in ring_vs_skiplocked().items():
        cells = [f"{f[k]:,.0f}" if k in f else "" for k in ("short", "sustained", "first", "last")]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n" + _run_line("ring_vs_skiplocked.txt")


def smart_batching_table(design: str = "ring", name: str = "smart_batching.txt") -> str:
    data = smart_batching(name=name)
    threads = sorted({t for by in data.values() for t in by})
    rows = [f"| {design}, messages/s off → on | " + " | ".join(f"{t} threads" for t in threads) + " |",
            "|---|" + "---:|" * len(threads)]  # fmt: skip
    for op in ("push", "pop", "push+pop", "leased"):
        off, on = data.get((design, op, "off"), {}), data.get((design, op, "on"), {})
        cells = [f"{off[t]:,.0f} → {on[t]:,.0f}" if t in off and t in on else "" for t in threads]
        rows.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n" + _run_line(name)


def smart_batching_options_table() -> str:
    rows = ["| design | call | off, /s | on, /s | on / off | on / default call on |",
            "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    rows += [
        f"| {design} | `{call}` | {off:,.0f} | {on:,.0f} | {up:.2f} | {near:.2f} |"
        for design, call, off, on, up, near in smart_batching_options()
    ]
    return "\n".join(rows) + "\n" + _run_line("smart_batching_options.txt")


def stats_table() -> str:
    rows = ["| ring slots | stats() p50 | counting the rows p50 |", "|---:|---:|---:|"]
    rows += [f"| {s:,} | {a:.2f} ms | {b:,.1f} ms |" for s, a, b in stats_cost()]
    return "\n".join(rows) + "\n" + _run_line("stats_cost.txt")


def spark_table() -> str:
    data = spark_consume()
    base = data[0][1]
    rows = ["| way | messages/s | x client pop_many |", "|---|---:|---:|"]
    rows += [f"| {way} | {rate:,.0f} | {rate / base:.2f} |" for way, rate in data]
    return "\n".join(rows) + "\n" + _run_line("spark_consume.txt")


def tls_table() -> str:
    rows = ["| database | calls | plain, /s | verified TLS, /s | TLS / plain |", "|---|---|---:|---:|---:|"]
    rows += [
        f"| {db} | {line} | {plain:,.0f} | {tls:,.0f} | {tls / plain:.2f} |"
        for db, line, plain, tls in tls_cost()
    ]
    return "\n".join(rows) + "\n" + _run_line("tls_cost.txt")


def autoscale_table() -> str:
    rows = ["| messages | consumers | figures |", "|---:|---|---|"]
    rows += [f"| {n} | {mode} | {figures} |" for n, mode, figures in autoscale_rounds()]
    rows += ["", "| at rest, each queue empty | stats calls a second (beyond the operator's own) | sessions |",
             "|---|---:|---:|"]  # fmt: skip
    rows += [f"| {mode} | {rate:.2f} | {held} |" for mode, rate, held in autoscale_at_rest()]
    return "\n".join(rows) + "\n" + _run_line("autoscale.txt")


def control_plane_run() -> str:
    """The latest control-plane run as the bench printed it."""
    run = _first_run(_read("control_plane_1000_queues.txt"))
    return "```text\n" + run + "\n```\n"


TABLES: dict[str, Callable[[], str]] = {
    "control-plane": control_plane_run,
    "ring": ring_table,
    "smart-batching": smart_batching_table,
    "smart-batching-pipes": lambda: smart_batching_table("pipes", "smart_batching_pipes.txt"),
    "smart-batching-options": smart_batching_options_table,
    "stats-cost": stats_table,
    "spark": spark_table,
    "tls-cost": tls_table,
    "autoscale": autoscale_table,
}


# --- charts ---------------------------------------------------------------------------------
def _png(draw: Callable[[Axes], None], size: tuple[float, float] = (7.0, 3.6)) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=size, dpi=110)
    draw(ax)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    pyplot.close(fig)
    return out.getvalue()


def chart_held_snapshot(ax: Axes) -> None:
    series = held_snapshot()
    for label, rates in series.items():
        ax.plot(
            [10 * (i + 1) for i in range(len(rates))],
            rates,
            marker="o",
            label=f"ring batches, {label} a held snapshot",
        )
    ring = ring_vs_skiplocked()
    for name in ("ring-amo", "skiplocked"):
        f = ring[name]
        ax.plot(
            [30, 270],
            [f["first"], f["last"]],
            linestyle="--",
            marker="s",
            label=f"{name}, snapshot held (first and last minute)",
        )
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the run")
    ax.set_ylabel("messages/s (log)")
    ax.legend(fontsize=7)


def chart_smart_batching(ax: Axes) -> None:
    for (design, op, mode), by in smart_batching().items():
        if design == "ring" and op in ("push", "pop", "push+pop"):
            ax.plot(
                list(by),
                list(by.values()),
                marker="o",
                linestyle="-" if mode == "on" else ":",
                label=f"{op}, {mode}",
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("threads sharing one client")
    ax.set_ylabel("messages/s")
    ax.legend(fontsize=7, ncol=2)


def chart_stats_cost(ax: Axes) -> None:
    data = stats_cost()
    slots = [s for s, _, _ in data]
    ax.plot(slots, [a for _, a, _ in data], marker="o", label="stats() p50")
    ax.plot(slots, [b for _, _, b in data], marker="s", label="counting the ring's rows p50")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ring slots")
    ax.set_ylabel("ms (log)")
    ax.legend(fontsize=8)


def chart_control_plane(ax: Axes) -> None:
    queues, points = control_plane()
    ax.plot(
        [s for s, _ in points],
        [n for _, n in points],
        marker="o",
        label=f"{queues:,} Queues created by 8 threads",
    )
    ax.set_xlabel("seconds since the first create")
    ax.set_ylabel("Queues Ready")
    ax.legend(fontsize=8)


def chart_spark(ax: Axes) -> None:
    data = spark_consume()
    ax.barh([w for w, _ in data][::-1], [r for _, r in data][::-1])
    ax.set_xlabel("messages/s")
    ax.tick_params(axis="y", labelsize=7)


def chart_autoscale(ax: Axes) -> None:
    curves = autoscale()
    biggest = max(int(label.split()[1].replace(",", "")) for label in curves)
    for label, series in curves.items():
        mode, total = label.split()
        if int(total.replace(",", "")) == biggest:
            ax.plot([5 * i for i in range(len(series["waiting"]))], series["waiting"], marker="o", markersize=3,
                    label=f"{mode}: messages waiting")  # fmt: skip
    ax.set_xlabel("seconds since the push")
    ax.set_ylabel("messages waiting")
    ax.legend(fontsize=7, loc="upper right")
    replicas = ax.twinx()
    for label, series in curves.items():
        mode, total = label.split()
        if int(total.replace(",", "")) == biggest and mode != "fixed-1":
            replicas.step([5 * i for i in range(len(series["replicas"]))], series["replicas"], where="post",
                          linestyle=":", label=f"{mode}: replicas")  # fmt: skip
    replicas.set_ylabel("replicas (dotted)")
    replicas.legend(fontsize=7, loc="center right")


CHARTS: dict[str, Callable[[Axes], None]] = {
    "ring-held-snapshot.png": chart_held_snapshot,
    "smart-batching.png": chart_smart_batching,
    "stats-cost.png": chart_stats_cost,
    "control-plane.png": chart_control_plane,
    "spark-consume.png": chart_spark,
    "autoscale.png": chart_autoscale,
}


def charts() -> dict[str, bytes]:
    """File name -> PNG of every chart."""
    return {
        name: _png(draw, (7.0, 4.2) if name == "spark-consume.png" else (7.0, 3.6))
        for name, draw in CHARTS.items()
    }
