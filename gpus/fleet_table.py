"""The fleet page's node rows, written as HTML strings rather than through the template
engine: a fleet of a thousand nodes is a thousand rows of nine cells, which Django's template
language renders in a quarter of a second on two cores, and this in a few milliseconds
(benchmarks/bench_gpus.py). Everything from a node or the telemetry is escaped; the structure
mirrors what ``templates/gpus/fleet.html`` would have written, and the page tests read the
result as HTML.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from urllib.parse import quote

from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from gpus.readings import NodeSummary
from gpus.selectors import FleetNode

UNKNOWN = '<span class="muted">\u2013</span>'
#: Runs listed in a row; the rest are on the node's page.
RUNS_SHOWN = 3
#: The telemetry columns' names: on a phone each cell is shown after its column's name
#: (``data-label``; the page's table is ``stacked``).
TELEMETRY_LABELS = ("Utilisation", "Memory", "Hottest", "Power")


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _health(node: FleetNode) -> str:
    if node.healthy:
        cell = '<span class="state state-succeeded">Healthy</span>'
    elif not node.ready:
        cell = '<span class="state state-failed">Not ready</span>'
    else:
        cell = '<span class="state state-failed">Unhealthy</span>'
    if node.cordoned:
        cell += ' <span class="badge">cordoned</span>'
    if not node.healthy and node.problems:
        more = len(node.problems) - 1
        cell += f'<br><span class="small">{_e(node.problems[0])}'
        cell += f" (and {more} more)</span>" if more else "</span>"
    return cell


def _taints(node: FleetNode) -> str:
    if not node.taints:
        return '<span class="muted">none</span>'
    return "<br>".join(
        # <wbr>: a long key breaks at its parts, not in the middle of a word.
        '<span class="mono">'
        + _e(taint.get("key", "")).replace("/", "/<wbr>")
        + (f"<wbr>={_e(taint['value'])}" if taint.get("value") else "")
        + f"<wbr>:{_e(taint.get('effect', ''))}</span>"
        for taint in node.taints
    )


def _runs(node: FleetNode, node_url: str, run_url: str) -> str:
    if not node.runs:
        if node.other_gpus_in_use:
            count = node.other_gpus_in_use
            plural = "s" if count != 1 else ""
            return f'<span class="muted">{count} GPU{plural} held by other pods</span>'
        return '<span class="muted">none</span>'
    cells = []
    for item in node.runs[:RUNS_SHOWN]:
        workspace, run, gpus = item.get("workspace", ""), item.get("run", ""), item.get("gpus", 0)
        href = run_url.replace("WORKSPACE-SLUG", quote(str(workspace), safe="")).replace(
            "RUN-NAME", quote(str(run), safe="")
        )
        cells.append(
            f'<a class="mono" href="{_e(href)}">{_e(run)}</a> <span class="muted">'
            f"{_e(workspace)} · {_e(gpus)} GPU{'s' if gpus != 1 else ''}</span>"
        )
    html = "<br>".join(cells)
    if len(node.runs) > RUNS_SHOWN:
        html += (
            f'<br><a href="{_e(node_url)}#runs-heading">and {len(node.runs) - RUNS_SHOWN} more</a>'
        )
    return html


def _number(value: float | None, unit: str, *, scale: float = 1, digits: int = 0) -> str:
    if value is None:
        return UNKNOWN
    return f"{value / scale:.{digits}f} {unit}"


def _telemetry_cells(summary: NodeSummary | None) -> str:
    if summary is None:
        return "".join(
            f'<td class="num" data-label="{label}">{UNKNOWN}</td>' for label in TELEMETRY_LABELS
        )
    memory = _number(summary.memory_used_mib, "GiB", scale=1024, digits=1)
    if summary.memory_percent is not None:
        memory += f' <span class="muted small">{summary.memory_percent} %</span>'
    power = _number(summary.power_w, "W")
    if summary.xid_gpus:
        gpus = ", ".join(str(index) for index in summary.xid_gpus)
        power += f'<br><strong class="error-text small">XID on GPU {gpus}</strong>'
    return (
        f'<td class="num" data-label="Utilisation">{_number(summary.utilization, "%")}</td>'
        f'<td class="num" data-label="Memory">{memory}</td>'
        f'<td class="num" data-label="Hottest">{_number(summary.temperature_c, "°C")}</td>'
        f'<td class="num" data-label="Power">{power}</td>'
    )


#: A node's row without its telemetry: the HTML before and after the telemetry cells.
RowParts = tuple[str, str, str]  # (node name, before, after)


def row_parts(nodes: Iterable[FleetNode]) -> list[RowParts]:
    """Each node's row around its telemetry cells: what changes only when the sync changes
    the node, so the page keeps it between telemetry readings."""
    # One reverse() for all rows: node names need no more than quoting.
    base = reverse("gpu-node", kwargs={"node_name": "NODE"}).replace("NODE", "{}")
    run_url = reverse(
        "run-page", kwargs={"workspace_slug": "WORKSPACE-SLUG", "run_name": "RUN-NAME"}
    )
    parts = []
    for node in nodes:
        url = base.format(quote(node.name, safe=""))
        classes = ("node-unhealthy" if not node.healthy else "") + (
            " node-cordoned" if node.cordoned else ""
        )
        model = (
            f'<br><span class="muted small">{_e(node.gpu_model)}</span>' if node.gpu_model else ""
        )
        capacity = (
            f' <span class="muted small" title="capacity">({node.gpus_total})</span>'
            if node.gpus_allocatable != node.gpus_total
            else ""
        )
        before = (
            f'<tr class="{classes.strip()}" data-node="{_e(node.name)}">'
            f'<th scope="row"><a class="mono" href="{_e(url)}">{_e(node.name)}</a>{model}</th>'
            f'<td data-label="Health">{_health(node)}</td>'
            f'<td class="num" data-label="GPUs in use">'
            f"{node.gpus_in_use} / {node.gpus_allocatable}{capacity}</td>"
        )
        after = (
            f'<td class="small" data-label="Taints">{_taints(node)}</td>'
            f'<td class="small" data-label="Runs">{_runs(node, url, run_url)}</td>'
            "</tr>"
        )
        parts.append((node.name, before, after))
    return parts


def node_rows(parts: Iterable[RowParts], summaries: dict[str, NodeSummary]) -> SafeString:
    """The ``<tr>`` of each node, in order, with its telemetry now."""
    return mark_safe(  # noqa: S308 - every value is escaped where the parts are written
        "".join(
            f"{before}{_telemetry_cells(summaries.get(name))}{after}"
            for name, before, after in parts
        )
    )
