"""The texts of a figure kept apart: its title wrapped until the renderer measures it clear of
the legend and inside the figure, and a check that no two texts overlap (the tests use it)."""

from __future__ import annotations

from typing import Any


def plain(figure: Any) -> None:
    """Every text of `figure` drawn as it is written: each is data (a label, a file name), so a
    `$` in it is a dollar sign, never the start of TeX that matplotlib would fail to parse."""
    from matplotlib.text import Text

    for text in figure.findobj(Text):
        text.set_parse_math(False)


def overlapping_texts(figure: Any) -> list[tuple[str, str]]:
    """Pairs of the figure's texts whose drawn boxes overlap: its title, axis labels, panel
    titles and legends, measured by the renderer (after a layout), named by their text."""
    plain(figure)
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()
    boxes = []
    texts = [getattr(figure, name, None) for name in ("_suptitle", "_supxlabel", "_supylabel")]
    texts += [axes.title for axes in figure.axes if axes.get_visible()]
    for text in texts:
        if text is not None and text.get_visible() and text.get_text().strip():
            boxes.append((text.get_text(), text.get_window_extent(renderer)))
    for legend in figure.legends + [a.get_legend() for a in figure.axes if a.get_legend()]:
        boxes.append(("legend", legend.get_window_extent(renderer)))
    return [
        (name, other)
        for n, (name, box) in enumerate(boxes)
        for other, second in boxes[n + 1 :]
        if box.overlaps(second)
    ]


def heading(figure: Any, title: str | Any) -> None:
    """Set the figure's title at the top left: a given text as it is, or `title(chars)` wrapped
    to fewer characters a line until its box stays inside the figure and clear of the legend.
    The y axis label, centred on the figure, is then centred below the title if it reached it."""
    chars = int(figure.bbox.width) // 6
    for _ in range(12):
        text = title if isinstance(title, str) else title(chars)
        heading = figure.suptitle(text, fontsize=9, x=0.01, ha="left")
        clashes = [pair for pair in overlapping_texts(figure) if text in pair]
        inside = heading.get_window_extent().x1 <= 0.99 * figure.bbox.x1  # as far as x=0.01
        if isinstance(title, str) or chars <= 20:
            break
        if inside and not any("legend" in pair for pair in clashes):
            break
        chars = max(20, int(chars * 0.85))
    label = figure._supylabel
    if label is not None and heading.get_window_extent().overlaps(label.get_window_extent()):
        label.set_y(heading.get_window_extent().y0 / 2 / figure.bbox.height)
