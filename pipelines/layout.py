"""Where each stage's box goes on the pipeline's page: a column per depth (a stage stands one
column right of the deepest stage it needs), stages in a column ordered to keep edges short,
and each edge a curve from the right side of one box to the left side of the next.

Pure and small: the page draws it as SVG with these numbers (the page's CSP allows no inline
styles, so positions are SVG attributes), and its tests are about the numbers."""

from __future__ import annotations

from dataclasses import dataclass

from tau.pipeline import Pipeline

#: A stage's box, and the room between columns (for an edge and its label) and rows.
BOX_WIDTH = 196
BOX_HEIGHT = 92
COLUMN_GAP = 124
ROW_GAP = 20
MARGIN = 8


@dataclass(frozen=True)
class Box:
    stage: str
    column: int
    row: int
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    #: An SVG path: a cubic curve from the source's right middle to the target's left middle.
    path: str
    #: The middle of the curve, where its label goes.
    label_x: int
    label_y: int


@dataclass(frozen=True)
class Graph:
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int

    def box(self, stage: str) -> Box:
        return next(box for box in self.boxes if box.stage == stage)


def layout(pipeline: Pipeline) -> Graph:
    """The boxes and edges of ``pipeline`` (whose graph has been checked: no circle)."""
    depth: dict[str, int] = {}
    for name in pipeline.order():
        needs = pipeline.stage(name).needs
        depth[name] = 1 + max((depth[need] for need in needs), default=-1)
    columns: dict[int, list[str]] = {}
    row_of: dict[str, float] = {}
    for column in range(max(depth.values(), default=-1) + 1):
        names = [stage.name for stage in pipeline.stages if depth[stage.name] == column]
        # Nearest to what they need: the mean row of their needs (file order among equals).
        names.sort(
            key=lambda name: (
                sum(row_of[need] for need in pipeline.stage(name).needs)
                / max(len(pipeline.stage(name).needs), 1)
            )
        )
        columns[column] = names
        for row, name in enumerate(names):
            row_of[name] = row
    boxes = tuple(
        Box(
            stage=name,
            column=column,
            row=row,
            x=MARGIN + column * (BOX_WIDTH + COLUMN_GAP),
            y=MARGIN + row * (BOX_HEIGHT + ROW_GAP),
        )
        for column, names in columns.items()
        for row, name in enumerate(names)
    )
    placed = {box.stage: box for box in boxes}
    edges = []
    for stage in pipeline.stages:
        for need in stage.needs:
            source, target = placed[need], placed[stage.name]
            x1, y1 = source.x + BOX_WIDTH, source.y + BOX_HEIGHT // 2
            x2, y2 = target.x, target.y + BOX_HEIGHT // 2
            bend = (x2 - x1) // 2
            edges.append(
                Edge(
                    source=need,
                    target=stage.name,
                    path=f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}",
                    label_x=(x1 + x2) // 2,
                    label_y=(y1 + y2) // 2,
                )
            )
    width = MARGIN * 2 + len(columns) * BOX_WIDTH + max(len(columns) - 1, 0) * COLUMN_GAP
    rows = max((len(names) for names in columns.values()), default=0)
    height = MARGIN * 2 + rows * BOX_HEIGHT + max(rows - 1, 0) * ROW_GAP
    return Graph(boxes, tuple(edges), width, height)
