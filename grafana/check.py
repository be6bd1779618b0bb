#!/usr/bin/env python3
"""Checks grafana/ordo-dashboard.json against a Prometheus server that scrapes Ordo.

What Grafana needs to load the dashboard: a title and uid, the datasource variable every
panel refers to, panels with unique ids and a place on the grid. Then every query, with the
dashboard's variables filled in as Grafana would, is run on the server: each must parse and
evaluate, and the panels named in MUST_SHOW must return data.

    grafana/check.py DASHBOARD PROMETHEUS_URL [PANEL_TITLE...]

Exits non-zero, saying why, on the first problem.
"""

import json
import sys
import urllib.parse
import urllib.request


def fail(why):
    print(f"dashboard: {why}", file=sys.stderr)
    sys.exit(1)


def query(server, expr):
    url = f"{server}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        return json.load(e)


def main():
    path, server, *must_show = sys.argv[1:]
    d = json.load(open(path))
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in d:
            fail(f"no {key}")
    variables = {v["name"]: v for v in d["templating"]["list"]}
    if variables.get("datasource", {}).get("query") != "prometheus":
        fail("no Prometheus datasource variable")
    # label_values(METRIC, LABEL), Grafana's own: the metric must exist with the label.
    for v in variables.values():
        q = v.get("definition", "")
        if q.startswith("label_values("):
            metric, label = (x.strip() for x in q[len("label_values("):-1].split(","))
            r = query(server, metric)
            if r.get("status") != "success" or not any(label in s["metric"] for s in r["data"]["result"]):
                fail(f"variable {v['name']}: no {metric} with a {label} label")
    ids = [p["id"] for p in d["panels"]]
    if len(ids) != len(set(ids)):
        fail(f"panel ids repeat: {ids}")
    titles = {p["title"] for p in d["panels"]}
    for t in must_show:
        if t not in titles:
            fail(f"no panel {t!r}")
    for p in d["panels"]:
        g = p.get("gridPos", {})
        if not all(k in g for k in ("x", "y", "w", "h")) or g["x"] + g["w"] > 24:
            fail(f"panel {p['title']!r} has no place on the 24-column grid: {g}")
        for t in p["targets"]:
            if t["datasource"]["uid"] != "${datasource}":
                fail(f"panel {p['title']!r} does not use the datasource variable")
            # As Grafana fills them: every instance, a rate window of a few scrapes.
            expr = t["expr"].replace("$instance", ".*").replace("$__rate_interval", "5s")
            r = query(server, expr)
            if r.get("status") != "success":
                fail(f"panel {p['title']!r}: {expr}: {r.get('error')}")
            if p["title"] in must_show and not r["data"]["result"]:
                fail(f"panel {p['title']!r}: {expr}: no data")
    print(f"dashboard: {len(d['panels'])} panels, every query evaluated, {len(must_show)} with data")


main()
