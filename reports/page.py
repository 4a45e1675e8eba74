"""The HTML page: one self-contained file (inline CSS, a few lines of inline JS for the cell filter, PNG data URIs)."""
from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from typing import Any, Iterable

import pandas as pd

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2a36;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:22px}
header .sub{color:#c8d2dc;font-size:13px}nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;
padding:6px 28px;z-index:5}nav a{margin-right:16px;color:#1f5fa8;text-decoration:none}
main{padding:8px 28px 40px;max-width:1500px}section{margin:22px 0}h2{border-bottom:2px solid #1f2a36;padding-bottom:3px}
.verdict{font-size:16px;padding:12px 16px;border-radius:6px;margin:10px 0}.yes{background:#e3f4e1;border:1px solid #7cbf74}
.no{background:#fbe3e1;border:1px solid #d9837a}.unknown{background:#f3f0dc;border:1px solid #c9b96a}
table{border-collapse:collapse;font-size:12.5px;background:#fff}th,td{border:1px solid #ddd;padding:3px 7px;
text-align:right;white-space:nowrap}th{background:#eef1f4;position:sticky;top:34px}td.l,th.l{text-align:left}main{overflow-x:auto}section{overflow-x:auto}
td.k{max-width:260px;overflow:hidden;text-overflow:ellipsis;text-align:left;font-family:monospace;font-size:11px}
.v-FASTER{background:#c9ebc5}.v-SAME{background:#eceff1}.v-SLOWER{background:#f6c4bf}.v-AMBIGUOUS{background:#fbe7b5}
.st-failed{background:#f6c4bf}.st-skipped{color:#888}details{margin:6px 0;background:#fff;border:1px solid #ddd;
border-radius:4px;padding:4px 10px}summary{cursor:pointer;font-weight:600}img{max-width:100%}
.muted{color:#666;font-size:12.5px}table.cells td:last-child{white-space:normal;max-width:260px;text-align:left}table.wrap td{white-space:normal;max-width:600px}.wrapkv td{white-space:normal;max-width:1100px}.kv td{text-align:left;white-space:normal;overflow-wrap:anywhere;max-width:1100px}#filter{font-size:14px;padding:4px 8px;width:420px}
"""

FILTER_JS = """
function filterCells(q){q=q.toLowerCase();document.querySelectorAll('table.cells tbody tr').forEach(function(tr){
tr.style.display=tr.textContent.toLowerCase().indexOf(q)>=0?'':'none';});
document.querySelectorAll('details.shape').forEach(function(d){if(q){d.open=true;}});}
"""


def esc(x: Any) -> str:
    return html.escape(str(x))


def num(x: Any, fmt: str = "{:.3g}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return fmt.format(x)


def table(df: pd.DataFrame, cols: Iterable[tuple[str, str]], cls: str = "", fmt: dict[str, str] | None = None,
          left: Iterable[str] = ()) -> str:
    """An HTML table of df; cols maps column -> header; verdict/status columns get their colour class."""
    cols = list(cols)
    fmt = fmt or {}
    left = set(left)
    head = "".join(f'<th class="{"l" if c in left else ""}">{esc(h)}</th>' for c, h in cols)
    body = []
    for r in df.to_dict("records"):
        tds = []
        for c, _ in cols:
            v = r.get(c)
            klass = "l" if c in left else ""
            if c in ("verdict", "low_m_vs_aten", "status_check") and v:
                klass += f" v-{str(v).split()[0]}"
            if c == "status" and v in ("failed", "skipped"):
                klass += f" st-{v}"
            if c == "kernels":
                tds.append(f'<td class="k" title="{esc(v or "")}">{esc(v or "")}</td>')
                continue
            text = num(v, fmt[c]) if c in fmt and isinstance(v, (int, float)) and not isinstance(v, bool) else (
                "" if v is None or (isinstance(v, float) and math.isnan(v)) else esc(v))
            tds.append(f'<td class="{klass.strip()}">{text}</td>')
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def kv_table(items: dict[str, Any]) -> str:
    return '<table class="kv">' + "".join(f"<tr><th class='l'>{esc(k)}</th><td>{esc(v)}</td></tr>"
                                          for k, v in items.items()) + "</table>"


def page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    """sections: (id, heading, inner html)."""
    nav = "".join(f'<a href="#{sid}">{esc(h)}</a>' for sid, h, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{esc(h)}</h2>{inner}</section>' for sid, h, inner in sections)
    made = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)}</title>"
            f"<style>{CSS}</style><script>{FILTER_JS}</script></head><body>"
            f"<header><h1>{esc(title)}</h1><div class='sub'>{esc(subtitle)} · report built {made}</div></header>"
            f"<nav>{nav}</nav><main>{body}</main></body></html>")
