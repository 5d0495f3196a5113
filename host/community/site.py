"""The static results site of many submissions: one `index.html` (leaderboard per model and
per hardware class, sortable and filterable with plain JavaScript, no network), one page
per submission (its report: hardware, protocol, every figure with its interval), and the
cross-lab comparisons of the same model and map with `epi compare`'s fairness facts.

Only submissions the checker accepts are shown; the refused ones are listed with their
first problem, so a reader sees what was left out and why.
"""

from __future__ import annotations

import html
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from epi.core.text import DASH, format_number
from host.bundle import archive
from host.bundle.compare import differences, shown_values
from host.bundle.facts import facts
from host.community.check import SUMMARY, check
from host.community.record import ConfigFigures, Submission

_E = html.escape


@dataclass(frozen=True)
class Entry:
    directory: Path
    sub: Submission
    page: str  # the submission's report page, relative to the site root


def find(root: Path) -> list[Path]:
    """Every submission directory below `root` (one holding a summary.json), sorted."""
    return sorted(p.parent for p in root.rglob(SUMMARY) if p.is_file())


def _fmt(v: float | None, digits: int = 4) -> str:
    return format_number(v, f".{digits}g", missing=DASH)


def _ci(ci: list[float | None], coverage: float | None) -> str:
    lo, hi = [*ci, None, None][:2]
    if lo is None or hi is None:
        return "no interval"
    cov = f" ({coverage:.0%})" if coverage is not None else ""
    return f"[{_fmt(lo)}, {_fmt(hi)}]{cov}"


def _num_attr(v: float | None) -> str:
    return "" if v is None else repr(float(v))


_STYLE = """body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}
td,th{border:1px solid #bbb;padding:.25em .5em}th{cursor:pointer;background:#eee}
.modelled{color:#a40}"""

_SCRIPT = """
function applyFilters(){
  var f={};
  document.querySelectorAll('select.filter').forEach(function(s){f[s.dataset.key]=s.value;});
  var text=document.getElementById('q').value.toLowerCase(); var shown=0;
  document.querySelectorAll('#board tbody tr').forEach(function(r){
    var ok=r.textContent.toLowerCase().indexOf(text)>=0;
    for(var k in f){ if(f[k] && r.dataset[k]!==f[k]) ok=false; }
    r.style.display=ok?'':'none'; if(ok) shown++;
  });
  document.getElementById('shown').textContent=shown;
}
function sortBy(th){
  var table=document.getElementById('board'), col=th.cellIndex, body=table.tBodies[0];
  var asc=th.dataset.dir!=='asc'; th.dataset.dir=asc?'asc':'desc';
  var rows=Array.prototype.slice.call(body.rows);
  rows.sort(function(a,b){
    var x=a.cells[col].dataset.v, y=b.cells[col].dataset.v;
    if(x!==undefined && y!==undefined){
      x=x===''?Infinity:parseFloat(x); y=y===''?Infinity:parseFloat(y);
      return asc?x-y:y-x;}
    x=a.cells[col].textContent; y=b.cells[col].textContent;
    return asc?x.localeCompare(y):y.localeCompare(x);
  });
  rows.forEach(function(r){body.appendChild(r);});
}
document.querySelectorAll('select.filter,#q').forEach(function(e){
  e.addEventListener('input',applyFilters); e.addEventListener('change',applyFilters);});
document.querySelectorAll('#board th').forEach(function(th){
  th.addEventListener('click',function(){sortBy(th);});});
applyFilters();
"""


def _row(e: Entry, c: ConfigFigures) -> str:
    model = (c.model_sha256 or "?")[:12]
    cls = e.sub.hardware.board
    return (f'<tr data-model="{_E(model)}" data-hardware="{_E(cls)}" '
            f'data-power="{_E(e.sub.board)}">'
            f'<td><a href="{_E(e.page)}">{_E(e.sub.lab)}/{_E(e.sub.study)}</a></td>'
            f"<td>{_E(c.config)}</td><td>{_E(model)}</td>"
            f"<td>{_E((c.map_sha256 or '?')[:12])}</td><td>{_E(cls)}</td>"
            f'<td class="{_E(e.sub.board)}">{_E(c.power_source)}</td>'
            f'<td data-v="{_num_attr(c.j_per_token)}">{_fmt(c.j_per_token)}</td>'
            f"<td>{_ci(c.j_per_token_ci, c.j_ci_coverage)}</td>"
            f'<td data-v="{_num_attr(c.epi)}">{_fmt(c.epi)}</td>'
            f"<td>{_ci(c.epi_ci, c.epi_ci_coverage)}</td>"
            f'<td data-v="{_num_attr(c.accuracy)}">{_fmt(c.accuracy)}</td>'
            f'<td data-v="{c.n_runs_valid}">{c.n_runs_valid} of {c.n_runs} '
            f"({c.n_repeats} repeats)</td></tr>")


def _select(key: str, label: str, values: set[str]) -> str:
    opts = "".join(f'<option value="{_E(v)}">{_E(v)}</option>' for v in sorted(values))
    return (f'<label>{_E(label)} <select class="filter" id="f-{key}" data-key="{key}">'
            f'<option value="">all</option>{opts}</select></label> ')


def _comparisons(entries: list[Entry]) -> list[str]:
    """Per model and map shared by two or more submissions: each lab's figures side by
    side and every difference `epi compare` flags as unfair."""
    groups: dict[tuple[str | None, str | None], list[tuple[Entry, ConfigFigures]]] = (
        defaultdict(list))
    for e in entries:
        for c in e.sub.configs:
            groups[(c.model_sha256, c.map_sha256)].append((e, c))
    out = ["<h2>Across labs: the same model and map</h2>"]
    cache = {}
    for (model, mp), members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len({(e.sub.lab, e.sub.study) for e, _ in members}) < 2:
            continue
        out.append(f"<h3>model {_E((model or '?')[:12])}, map {_E((mp or '?')[:12])}</h3>")
        out.append("<table><tr><th>submission</th><th>J/token</th><th>interval</th>"
                   "<th>EPI</th><th>interval</th><th>power</th></tr>")
        for e, c in members:
            out.append(f"<tr><td>{_E(e.sub.lab)}/{_E(e.sub.study)}</td>"
                       f"<td>{_fmt(c.j_per_token)}</td>"
                       f"<td>{_ci(c.j_per_token_ci, c.j_ci_coverage)}</td>"
                       f"<td>{_fmt(c.epi)}</td><td>{_ci(c.epi_ci, c.epi_ci_coverage)}</td>"
                       f"<td>{_E(c.power_source)}</td></tr>")
        out.append("</table>")
        fs = []
        for e, _ in members:
            key = e.directory
            if key not in cache:
                cache[key] = facts(archive.read(e.directory / e.sub.bundle_file))
            fs.append(cache[key])
        diffs = differences(fs)
        if not diffs:
            out.append("<p>No unfair difference: same build, power source, calibration, "
                       "accuracy items and metric.</p>")
        for d in diffs:
            vals = "".join(f"<li>{_E(e.sub.lab)}/{_E(e.sub.study)}: {_E(v)}</li>"
                           for (e, _), v in zip(members, shown_values(d), strict=True))
            out.append(f"<p><b>UNFAIR: {_E(d.aspect)} differ</b> ({_E(d.meaning)})</p>"
                       f"<ul>{vals}</ul>")
    return out if len(out) > 1 else [*out, "<p>No model and map shared by two labs.</p>"]


def _report_page(e: Entry) -> str:
    s = e.sub
    hw = "".join(f"<tr><td>{_E(k)}</td><td>{_E(json.dumps(v))}</td></tr>"
                 for k, v in vars(s.hardware).items())
    proto = "".join(f"<tr><td>{_E(k)}</td><td>{_E(json.dumps(v))}</td></tr>"
                    for k, v in vars(s.protocol).items())
    figs = "".join(
        f"<tr><td>{_E(c.config)}</td><td>{_E(c.model_sha256 or '')}</td>"
        f"<td>{_E(c.map_sha256 or '')}</td><td>{_fmt(c.j_per_token)} "
        f"{_ci(c.j_per_token_ci, c.j_ci_coverage)}</td><td>{_fmt(c.accuracy)} "
        f"{_ci(c.accuracy_ci, None)}</td><td>{_fmt(c.epi)} "
        f"{_ci(c.epi_ci, c.epi_ci_coverage)}</td><td>{c.n_runs_valid} of {c.n_runs}</td>"
        f"<td>{_E(c.power_source)}</td><td>{_E(c.instrument_u_pct)}</td>"
        f"<td>{_E(c.qualification)}</td><td>{_E(c.reason or '')}</td></tr>"
        for c in s.configs)
    return (f"<!doctype html><meta charset=utf-8><title>{_E(s.lab)}/{_E(s.study)}</title>"
            f"<style>{_STYLE}</style><h1>{_E(s.lab)}/{_E(s.study)}</h1>"
            f"<p>board: <b>{_E(s.board)}</b>; bundle sha256 {_E(s.bundle_sha256)}; "
            f"epi {_E(s.epi_version)}</p><h2>Hardware</h2><table>{hw}</table>"
            f"<h2>Protocol</h2><table>{proto}</table><h2>Figures (gross J per generated "
            "token over whole requests)</h2><table><tr><th>config</th><th>model sha256</th>"
            "<th>map sha256</th><th>J/token</th><th>accuracy</th><th>EPI</th>"
            "<th>valid runs</th><th>power source</th><th>instrument u %</th>"
            f"<th>qualification</th><th>reason</th></tr>{figs}</table>"
            '<p><a href="../index.html">leaderboard</a></p>')


def build(root: Path, out: Path) -> tuple[list[Entry], list[str]]:
    """Write the site for the submissions below `root` into `out`; returns the entries
    shown and one line per submission left out."""
    entries, refused = [], []
    for d in find(root):
        problems = check(d)
        if problems:
            refused.append(f"{d}: {problems[0]}")
            continue
        sub = Submission.from_json((d / SUMMARY).read_text(encoding="utf-8"), str(d))
        entries.append(Entry(d, sub, f"submissions/{sub.lab}--{sub.study}.html"))
    # a configuration without a figure (no valid run) is not ranked; it is named below
    rows = [(e, c) for e in entries for c in e.sub.configs if c.j_per_token is not None]
    unranked = "".join(f"<li>{_E(e.sub.lab)}/{_E(e.sub.study)} {_E(c.config)}: "
                       f"{_E(c.reason or 'no figure')} ({c.n_runs_valid} of {c.n_runs} runs "
                       "valid)</li>" for e in entries for c in e.sub.configs
                       if c.j_per_token is None) or "<li>none</li>"
    head = ("<tr><th>submission</th><th>config</th><th>model sha256</th><th>map sha256</th>"
            "<th>hardware class</th><th>power</th><th>J/token</th><th>J/token interval</th>"
            "<th>EPI</th><th>EPI interval</th><th>accuracy</th><th>valid runs</th></tr>")
    left = "".join(f"<li>{_E(r)}</li>" for r in refused) or "<li>none</li>"
    page = "\n".join([
        "<!doctype html><meta charset=utf-8><title>epi community results</title>",
        f"<style>{_STYLE}</style><h1>epi community results</h1>",
        f"<p>{len(entries)} submission(s) accepted by <code>epi check-submission</code>; "
        "gross J per generated token over whole requests. Modelled power is marked and "
        "belongs to the modelled board only.</p>",
        "<p>" + _select("model", "model", {(c.model_sha256 or "?")[:12] for _, c in rows})
        + _select("hardware", "hardware class", {e.sub.hardware.board for e, _ in rows})
        + _select("power", "board", {e.sub.board for e, _ in rows})
        + '<label>text <input id="q" type="search"></label> '
        + '<span id="shown"></span> row(s) shown</p>',
        f'<table id="board"><thead>{head}</thead><tbody>',
        *(_row(e, c) for e, c in rows), "</tbody></table>",
        f"<h2>Configurations not ranked (no valid run)</h2><ul>{unranked}</ul>",
        *_comparisons(entries),
        f"<h2>Left out (refused by the checker)</h2><ul>{left}</ul>",
        f"<script>{_SCRIPT}</script>"])
    (out / "submissions").mkdir(parents=True, exist_ok=True)
    for e in entries:
        _write(out / e.page, _report_page(e))
    _write(out / "index.html", page)
    return entries, refused


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
