"""Inline SVG charts and value formatting for the report pages (no external assets)."""
from __future__ import annotations

import html

W, H, PAD = 560, 220, 40
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]


def escape(value) -> str:
    return html.escape(str(value))


def fmt(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3g}"
    return escape(value)


def line_chart(series: list[tuple[str, list, list]], title: str, hline: tuple[str, float] | None = None) -> str:
    points = [(x, y) for _, xs, ys in series for x, y in zip(xs, ys) if y is not None]
    if not points:
        return f"<p>{escape(title)}: no data.</p>"
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points) or 1
    ys = [p[1] for p in points] + ([hline[1]] if hline else [])
    y0, y1 = min(0.0, min(ys)), max(ys) or 1.0
    sx = lambda x: PAD + (x - x0) / ((x1 - x0) or 1) * (W - 2 * PAD)  # noqa: E731
    sy = lambda y: H - PAD + (y0 - y) / ((y1 - y0) or 1) * (H - 2 * PAD)  # noqa: E731
    parts = [f'<svg role="img" aria-label="{escape(title)}" width="{W}" height="{H}" viewBox="0 0 {W} {H}">',
             f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
             f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#888"/>',
             f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#888"/>',
             f'<text x="{PAD}" y="{H - PAD + 14}" font-size="10">{fmt(x0)}</text>',
             f'<text x="{W - PAD}" y="{H - PAD + 14}" font-size="10" text-anchor="end">{fmt(x1)}</text>',
             f'<text x="{PAD - 4}" y="{sy(y1) + 4}" font-size="10" text-anchor="end">{fmt(y1)}</text>',
             f'<text x="{PAD - 4}" y="{sy(y0) + 4}" font-size="10" text-anchor="end">{fmt(y0)}</text>']
    if hline:
        parts.append(f'<line x1="{PAD}" y1="{sy(hline[1])}" x2="{W - PAD}" y2="{sy(hline[1])}" stroke="#e377c2" '
                     f'stroke-dasharray="5,4"/><text x="{W - PAD}" y="{sy(hline[1]) - 4}" font-size="10" '
                     f'text-anchor="end" fill="#e377c2">{escape(hline[0])}</text>')
    for i, (name, xs, ys_) in enumerate(series):
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, ys_) if y is not None)
        color = COLORS[i % len(COLORS)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>'
                     f'<text x="{PAD + 8 + 110 * i}" y="{PAD - 6}" font-size="11" fill="{color}">{escape(name)}</text>')
        if len(xs) <= 60:  # few points (confirmations, probes): mark each, so a single one still shows
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>'
                      for x, y in zip(xs, ys_) if y is not None]
    return "".join(parts) + "</svg>"


def bar_chart(rows: list[tuple[str, float | None, float | None]], title: str, legend: bool = True) -> str:
    rows = [r for r in rows if r[1] is not None or r[2] is not None]
    height = 40 + 34 * len(rows)
    top = max([abs(v) for _, a, b in rows for v in (a, b) if v is not None] + [1e-9])
    label_w, bar_w = 210, W - 210 - 60
    parts = [f'<svg role="img" aria-label="{escape(title)}" width="{W}" height="{height}" viewBox="0 0 {W} {height}">',
             f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>']
    if legend:
        parts.append(f'<rect x="{label_w}" y="22" width="10" height="8" fill="#aaa"/><text x="{label_w + 14}" y="30" '
                     f'font-size="10">before</text><rect x="{label_w + 70}" y="22" width="10" height="8" '
                     f'fill="#1f77b4"/><text x="{label_w + 84}" y="30" font-size="10">after</text>')
    for i, (label, before, after) in enumerate(rows):
        y = 40 + 34 * i
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" font-size="11" text-anchor="end">{escape(label)}</text>')
        for j, (value, color) in enumerate(((before, "#aaa"), (after, "#1f77b4"))):
            if value is None:
                continue
            length = abs(value) / top * bar_w
            parts.append(f'<rect x="{label_w}" y="{y + 13 * j}" width="{length:.1f}" height="11" fill="{color}"/>'
                         f'<text x="{label_w + length + 4}" y="{y + 13 * j + 9}" font-size="10">{fmt(value)}</text>')
    return "".join(parts) + "</svg>"


def histogram(values: list[float], title: str, bins: int = 12) -> str:
    if not values:
        return f"<p>{escape(title)}: no data.</p>"
    lo, hi = min(values), max(values)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return bar_chart([(f"{lo + i * width:.1f} to {lo + (i + 1) * width:.1f}", None, float(c))
                      for i, c in enumerate(counts)], title, legend=False)
