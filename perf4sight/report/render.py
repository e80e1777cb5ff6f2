"""One report, two renderings: a self-contained HTML page and the same content as Markdown.

The report is a list of blocks (:class:`Heading`, :class:`Text`, :class:`Table`, :class:`Image`);
:func:`to_html` embeds images as base64 data URIs, so the page is a single file that opens
offline; :func:`to_markdown` links the PNGs beside it. The HTML page sets ``document.title``
to ``"<title> [ready]"`` once loaded, or ``"<title> [error: ...]"`` if a script or image fails,
so a headless browser can tell a page that rendered cleanly.
"""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union
from urllib.parse import quote

__all__ = ["Heading", "Text", "Table", "Image", "Block", "to_html", "to_markdown"]


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Text:
    text: str


@dataclass
class Table:
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""


@dataclass
class Image:
    path: Path  # PNG written beside the report
    caption: str


Block = Union[Heading, Text, Table, Image]

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;padding:0 1.5em;\
max-width:1250px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}caption{caption-side:top;text-align:left;color:#555;\
padding:.2em 0;white-space:nowrap}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{color:#555;font-size:.9em}
p.note{color:#555}
"""

_SCRIPT = """
(function(){
  var base = document.title, failed = [];
  window.addEventListener('error', function(e){
    failed.push((e.target && e.target.tagName === 'IMG') ? 'image ' + e.target.alt : String(e.message));
    document.title = base + ' [error: ' + failed.join('; ') + ']';
  }, true);
  window.addEventListener('load', function(){
    var bad = Array.prototype.filter.call(document.images, function(i){ return !i.complete || i.naturalWidth === 0; });
    bad.forEach(function(i){ failed.push('image ' + i.alt); });
    document.title = base + (failed.length ? ' [error: ' + failed.join('; ') + ']' : ' [ready]');
  });
})();
"""


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def to_html(title: str, blocks: Sequence[Block]) -> str:
    """A complete HTML document (inline CSS, inline images, one small inline script)."""
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
           f"<title>{_esc(title)}</title><style>{_CSS}</style><script>{_SCRIPT}</script></head><body>",
           f"<h1>{_esc(title)}</h1>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{_esc(b.text)}</h{b.level}>")
        elif isinstance(b, Text):
            out.append(f"<p class=\"note\">{_esc(b.text)}</p>")
        elif isinstance(b, Table):
            cap = f"<caption>{_esc(b.caption)}</caption>" if b.caption else ""
            head = "".join(f"<th>{_esc(h)}</th>" for h in b.header)
            body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in b.rows)
            out.append(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(Path(b.path).read_bytes()).decode("ascii")
            out.append(f"<figure><img alt=\"{_esc(Path(b.path).name)}\" src=\"data:image/png;base64,{data}\">"
                       f"<figcaption>{_esc(b.caption)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def _md_cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def to_markdown(title: str, blocks: Sequence[Block]) -> str:
    """The same blocks as GitHub-flavoured Markdown; images link to the PNG files beside it."""
    out = [f"# {title}", ""]
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Text):
            out += [b.text, ""]
        elif isinstance(b, Table):
            if b.caption:
                out += [f"*{b.caption}*", ""]
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out.append("|" + "|".join("---" for _ in b.header) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in b.rows]
            out.append("")
        elif isinstance(b, Image):
            # the file's name as a link's address (a device's name may hold a space: scatter_jetson tx2.png ended the
            # link, which Markdown then showed as text); brackets in the alt text escaped
            alt = b.caption.replace("[", "\\[").replace("]", "\\]")
            out += [f"![{alt}]({quote(Path(b.path).name)})", "", f"*{b.caption}*", ""]
    return "\n".join(out)
