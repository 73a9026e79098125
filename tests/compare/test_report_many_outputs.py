"""report.html of a run of many compared outputs (issue 28, item 4): past chartwindow.LIMIT a chart
draws an overview of the whole run in bars and a window of LIMIT outputs one by one around the first
divergence, and says so; at or below the limit it draws every output as before."""
import csv
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from dumpcompare import chartwindow, htmlreport

NS = {"s": "http://www.w3.org/2000/svg"}
LIMIT = chartwindow.LIMIT
ROOT = Path(__file__).resolve().parents[2]


def _run(n: int, statuses: dict[int, str], first: int | None, reference: bool = False, root: dict | None = None):
    """output_3/output_4-like dicts of ``n`` one-output modules, all matching (error 1e-6 against a
    tolerance of 1e-4) but ``statuses``; the first divergence at module ``first``."""
    results, modules = [], []
    for k in range(n):
        status = statuses.get(k, "match")
        error = {"mismatch": 0.5, "drift": 5e-5, "nonfinite": "NaN"}.get(status, 1e-6)
        results.append({"cid": f"C{k}", "point": f"L{k // 20}.p{k % 20}", "status": status, "error": error,
                        "tolerance": 1e-4, "strict_tolerance": 1e-5, "pair": None})
        modules.append({"pid": f"P{k}", "kind": "one_to_one", "train_modules": [f"model.m{k}"],
                        "rollout_modules": [f"model.m{k}"], "status": status, "module_priority_rank": None,
                        "rank_reason": "", "points": {"in": [], "param": [],
                                                      "out": [{"point": f"L{k // 20}.p{k % 20}", "cid": f"C{k}"}]}})
    compare = {"mode": "statistics", "results": results}
    if reference:
        compare["reference_forward"] = {"ran": True, "points": {
            f"C{k}": {"train": {"error": 1e-7}, "rollout": {"error": 0.3 if k >= (first or n) else 1e-7}}
            for k in range(n)}, "verdict": {"side": "rollout", "reason": "r"}}
    analysis = {"modules": modules, "first_divergence": {"pair": f"P{first}"} if first is not None else None,
                "vocabulary": {"statuses": {"clean": ["match", "drift"], "diverged": ["mismatch", "nonfinite"]}}}
    return "".join(htmlreport.pieces(compare, analysis, {}, root))


def _chart(page: str, cls: str):
    found = re.search(rf'<svg [^>]*class="chart {cls}".*?</svg>', page, flags=re.S)
    return ET.fromstring(found.group(0)) if found else None


def _points(chart) -> list:
    return [el for el in chart.iter() if (el.get("class") or "").startswith("pt ")]


def test_many_outputs_draw_the_window_around_the_first_divergence_and_an_overview():
    n, first = 3 * LIMIT, 1000
    # One mismatch among matches and a drift, far from the divergence; a nonfinite output alone.
    lone, drift, nonfinite = 300, 298, 1500
    statuses = {lone: "mismatch", drift: "drift", nonfinite: "nonfinite",
                **{k: "mismatch" for k in range(first, first + 40)}}
    page = _run(n, statuses, first)
    detail = _chart(page, "execution")
    points = _points(detail)
    assert len(points) == LIMIT
    tips = [p.find("s:title", NS).text for p in points]
    start = first - chartwindow.BEFORE
    assert tips[0].startswith(f"L{start // 20}.p{start % 20}: model.m{start} ")
    # the first-divergence mark sits on the divergent point, inside the window
    mark = detail.find(".//s:g[@class='mark first-divergence']", NS)
    at = next(p for p, t in zip(points, tips) if t.startswith(f"L{first // 20}.p{first % 20}: model.m{first} "))
    assert float(mark.find("s:circle", NS).get("cx")) == float(at.get("cx"))
    assert "mismatch" in at.get("class")
    # the sentence gives the counts and the place of the window
    assert (f"<b>{LIMIT} of {n} compared outputs drawn</b> one by one (outputs {start + 1}-{start + LIMIT} "
            "in execution order) around the first divergence; all of them are in output_3_value_compare.csv") in page
    # the overview: a bar of the one mismatch shows as a mismatch (drift beside it), the nonfinite one
    # as nonfinite, the first divergence in its bar, and the bars cover every output once
    over = _chart(page, "execution-overview")
    bars = [el for el in over.iter() if (el.get("class") or "").startswith("bin ")]
    assert len(bars) == chartwindow.BINS
    spans = [tuple(map(int, re.match(r"outputs (\d+)-(\d+)", b.find("s:title", NS).text).groups())) for b in bars]
    assert spans[0][0] == 1 and spans[-1][1] == n and all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:]))

    def bar(k):
        return next(b for b, (lo, hi) in zip(bars, spans) if lo <= k + 1 <= hi)
    assert bar(lone).get("class") == "bin mismatch" and bar(lone) is bar(drift)
    assert "worst mismatch, 1 diverged" in bar(lone).find("s:title", NS).text
    assert bar(nonfinite).get("class") == "bin nonfinite"
    assert float(bar(nonfinite).get("y")) < min(float(bar(k).get("y")) for k in (lone, first))
    assert bar(0).get("class") == "bin match"
    fd = over.find(".//s:g[@class='mark first-divergence']", NS)
    x = float(fd.find("s:line", NS).get("x1"))
    assert float(bar(first).get("x")) < x < float(bar(first).get("x")) + float(bar(first).get("width")) + 1
    assert fd.find("s:text", NS).text.endswith(f"(output {first + 1})")


def test_many_outputs_without_a_divergence_are_drawn_from_the_start():
    page = _run(LIMIT + 1, {}, None)
    assert len(_points(_chart(page, "execution"))) == LIMIT
    assert (f"{LIMIT} of {LIMIT + 1} compared outputs drawn</b> one by one (outputs 1-{LIMIT} in execution "
            "order) from the start (nothing diverged)") in page


def test_a_first_divergence_without_a_compared_output_is_not_called_nothing():
    page = _run(LIMIT + 1, {}, LIMIT + 5)
    assert f"(outputs 1-{LIMIT} in execution order) from the start (the first divergence has no compared output)" in page


def test_window_stays_inside_the_run_near_its_end():
    n = LIMIT + 100
    page = _run(n, {n - 3: "mismatch"}, n - 3)
    assert len(_points(_chart(page, "execution"))) == LIMIT
    assert f"(outputs 101-{n} in execution order) around the first divergence" in page


def test_up_to_the_limit_every_output_is_drawn_and_no_overview():
    page = _run(LIMIT, {LIMIT - 1: "mismatch"}, LIMIT - 1, reference=True)
    assert len(_points(_chart(page, "execution"))) == LIMIT
    assert "compared outputs drawn" not in page
    assert _chart(page, "execution-overview") is None and _chart(page, "reference-overview") is None
    assert len(_chart(page, "reference").findall("s:text", NS)) >= LIMIT


def test_reference_chart_of_many_outputs_draws_the_same_window():
    n, first = 3 * LIMIT, 900
    page = _run(n, {k: "mismatch" for k in range(first, n)}, first, reference=True)
    ref = _chart(page, "reference")
    labels = [t.text for t in ref.iter("{%s}text" % NS["s"]) if t.get("transform")]
    start = first - chartwindow.BEFORE
    assert len(labels) == LIMIT and labels[0] == f"L{start // 20}.p{start % 20}"
    assert page.count(f"<b>{LIMIT} of {n} compared outputs drawn</b>") == 2
    over = _chart(page, "reference-overview")
    rollout = over.find(".//s:polyline[@class='ref-line rollout']", NS)
    ys = [float(p.split(",")[1]) for p in rollout.get("points").split()]
    assert len(ys) == chartwindow.BINS
    # the rollout's departure from the reference shows in the bars from the divergence on
    split = chartwindow.bin_of(first, n)
    assert min(ys[:split]) > max(ys[split:])


def test_a_compared_pair_of_many_calls_is_drawn_around_its_first_divergence(tmp_path):
    """run_compare.py on tools/manydump.py's pair (3 unfoldable calls of 20 layers, layer 10's gate
    weight corrupted on the rollout side): more distinct outputs than the limit."""
    sys.path.insert(0, str(ROOT / "tools"))
    import manydump
    pair = manydump.write_pair(tmp_path / "pair", calls=3, layers=20, faults=["corrupt:rollout:gate:10"])
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"),
                    "--train", pair["train"], "--rollout", pair["rollout"], "--out-dir", str(out), "--quiet"],
                   check=True, timeout=300)
    doc3, doc4 = (json.loads((out / n).read_text()) for n in ("output_3_value_compare.json",
                                                              "output_4_module_analysis.json"))
    compared = {r["cid"] for r in doc3["results"]}
    points = list(dict.fromkeys(p["point"] for m in doc4["modules"] for p in m["points"]["out"] if p["cid"] in compared))
    assert len(points) > LIMIT
    fd = doc4["first_divergence"]
    fd_point = next(p["point"] for m in doc4["modules"] if m["pid"] == fd["pair"] for p in m["points"]["out"]
                    if p["cid"] in compared)
    k = points.index(fd_point)
    page = (out / "report.html").read_text(encoding="utf-8")
    start = k - chartwindow.BEFORE
    assert (f"<b>{LIMIT} of {len(points)} compared outputs drawn</b> one by one (outputs {start + 1}-"
            f"{start + LIMIT} in execution order) around the first divergence") in page
    with open(out / "output_3_value_compare.csv", newline="", encoding="utf-8") as fh:
        assert set(points) <= {row["point"] for row in csv.DictReader(fh)}
    detail = _chart(page, "execution")
    drawn = _points(detail)
    assert len(drawn) == LIMIT
    at = next(p for p in drawn if p.find("s:title", NS).text.startswith(f"{fd_point}: "))
    mark = detail.find(".//s:g[@class='mark first-divergence']", NS)
    assert float(mark.find("s:circle", NS).get("cx")) == float(at.get("cx")) and "mismatch" in at.get("class")
    over = _chart(page, "execution-overview")
    fd_bar = [b for b in over.iter() if (b.get("class") or "").startswith("bin ")][chartwindow.bin_of(k, len(points))]
    assert fd_bar.get("class") == "bin mismatch"


def _root(n_causes: int, pid: str, suppressed: int) -> dict:
    """output_5-like: ``n_causes`` root causes at one module (one per call of a run of many calls)
    and ``suppressed`` structural pairs whose values agree."""
    return {"verdict": "root cause found", "root_causes": [
        {"rank": r, "category": "parameter_or_checkpoint_issue", "evidence": {"pair": pid}, "numbers": {}}
        for r in range(1, n_causes + 1)],
        "suppressed": {"structural_clean": [{"train_module": f"model.m{k}", "rollout_module": f"model.m{k}",
                                             "reason": "fused"} for k in range(suppressed)]}}


def test_root_causes_at_one_output_of_many_are_one_mark():
    page = _run(2 * LIMIT, {k: "mismatch" for k in range(700, 2 * LIMIT)}, 700, root=_root(10, "P700", 0))
    for cls in ("execution", "execution-overview"):
        marks = _chart(page, cls).findall(".//s:g[@class='mark root-cause']", NS)
        assert [m.find("s:text", NS).text.split(":")[0] for m in marks] == ["root causes 1, 2, 3, 4, 5, 6, 7, 8, 9, 10"]
    # a small run keeps a mark per root cause, as before
    page = _run(LIMIT, {LIMIT - 1: "mismatch"}, LIMIT - 1, root=_root(2, f"P{LIMIT - 1}", 0))
    marks = _chart(page, "execution").findall(".//s:g[@class='mark root-cause']", NS)
    assert [m.find("s:text", NS).text.split(":")[0] for m in marks] == ["root cause 1", "root cause 2"]


def test_tables_of_structural_pairs_list_the_first_rows_and_say_where_the_rest_are():
    rows = htmlreport.SUPPRESSED_ROWS
    page = _run(10, {}, None, root=_root(1, "P0", rows + 50))
    table = re.search(r"<summary>Structural pairs whose values agree: (\d+)</summary>(.*?)</details>", page, flags=re.S)
    assert int(table.group(1)) == rows + 50
    assert table.group(2).count("<tr>") == rows + 1
    assert (f"The first {rows} of {rows + 50}; output_5_root_cause_report.json <code>suppressed.structural_clean"
            "</code> holds them all.") in table.group(2)
    small = re.search(r"<summary>Structural pairs whose values agree: \d+</summary>(.*?)</details>",
                      _run(10, {}, None, root=_root(1, "P0", rows)), flags=re.S).group(1)
    assert small.count("<tr>") == rows + 1 and "holds them all" not in small


def _heat_rows(n: int, beyond_from: int | None) -> dict:
    """A tensor-mode output_3-like dict of ``n`` layer outputs with 8 per-token errors each, every
    token within the tolerance (1e-4) until row ``beyond_from``, whose token 3 is 100x past it."""
    results = []
    for k in range(n):
        values = [1e-6] * 8
        if beyond_from is not None and k >= beyond_from:
            values[3] = 1e-2
        results.append({"cid": f"C{k}", "point": f"L{k}.resid_out", "status": "match", "error": 1e-6,
                        "tolerance": 1e-4, "pair": None,
                        "tensor_metrics": {"per_token": {"values": values, "bucket": 1}}})
    return {"mode": "tensor", "results": results}


def test_a_heat_map_of_many_layer_outputs_draws_rows_around_the_first_token_beyond_tolerance():
    n = LIMIT + 300
    html = htmlreport.heatmap_section(_heat_rows(n, beyond_from=200))
    chart = _chart(html, "heatmap")
    labels = [el.text for el in chart.iter() if el.tag.endswith("text") and (el.text or "").endswith("resid_out")]
    start = 200 - chartwindow.BEFORE
    assert labels == [f"L{k}.resid_out" for k in range(start, start + LIMIT)]
    assert f"{LIMIT} of {n} layer outputs drawn</b> (rows {start + 1}-{start + LIMIT} in execution order) around " \
           "the first with a token beyond its tolerance" in html
    # Nothing beyond tolerance: drawn from the start, and said so.
    calm = htmlreport.heatmap_section(_heat_rows(n, beyond_from=None))
    assert f"(rows 1-{LIMIT} in execution order) from the start (no token beyond its tolerance)" in calm


def test_a_heat_map_up_to_the_limit_draws_every_row():
    html = htmlreport.heatmap_section(_heat_rows(LIMIT, beyond_from=10))
    assert "layer outputs drawn" not in html
    assert sum(1 for el in _chart(html, "heatmap").iter() if (el.text or "").endswith("resid_out")) == LIMIT
