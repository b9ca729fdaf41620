#!/usr/bin/env bash
# The bench report's SVG charts (issue 27, item 6): a short real run of
# relaybus-bench (one dispatch cell and one mixed cell with their floors, one
# sample each, on the bench's own throwaway cluster) writes dispatch.svg and
# mixed.svg beside report.md, linked from it; each chart is well-formed SVG
# whose bars carry exactly the numbers of comparison.json: the ratio to the
# floor per dispatch cell, p50/p95/p99 per mixed cell.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"  # py_facts

make -s -C "$RELAYBUS_ROOT/bench" >"$TMP/bench_build.log" 2>&1 || die "relaybus-bench did not build: $(tail -3 "$TMP/bench_build.log")"
OUT="$TMP/bench"
"$RELAYBUS_ROOT/bench/relaybus-bench" --cells 'disp.relay.pull.defaults.f1.unkeyed,mixed.relay.fire.r1000.defaults' \
    --no-peers --samples 1 --warmup 1 --window 2 --pg-config "$PG_CONFIG" --out "$OUT" >"$TMP/bench.log" 2>&1
check "relaybus-bench ran (exit 0)" test $? -eq 0
check "report.md links both charts" grep -q '](dispatch.svg)' "$OUT/report.md"
check "... the mixed one too" grep -q '](mixed.svg)' "$OUT/report.md"
check "no chart for a section without cells (publish)" test ! -e "$OUT/publish.svg"
py_facts charts "$OUT" <<'PY'
import json, sys, xml.etree.ElementTree as ET
out = sys.argv[1]
cells = {c["cell"]: c for c in json.load(open(f"{out}/comparison.json"))["cells"]}
NS = "{http://www.w3.org/2000/svg}"

def bars(name):
    """{label: [bar values]} of a chart, read back from its SVG."""
    root = ET.parse(f"{out}/{name}.svg").getroot()
    assert root.tag == NS + "svg", root.tag
    got, label = {}, None
    for el in root.iter():
        if el.tag == NS + "text" and el.get("text-anchor") == "end":
            label = el.text
            got[label] = []
        elif el.tag == NS + "rect" and el.get("class") == "bar":
            got[label].append(float(el.get("data-value")))
    return got

def close(a, b):
    return abs(a - b) <= 1e-4 * max(1.0, abs(b))

d = bars("dispatch")
want = {n: [c["ratio_to_floor"]] for n, c in cells.items() if c["group"] == "dispatch" and "ratio_to_floor" in c}
print("dispatch_cells=%d" % len(d))
print("dispatch_match=%s" % (sorted(d) == sorted(want) and all(close(x, y) for n in d for x, y in zip(d[n], want[n]))))
m = bars("mixed")
mixed = {n: c for n, c in cells.items() if c["group"] == "mixed"}
print("mixed_cells=%d" % len(m))
print("mixed_match=%s" % (sorted(m) == sorted(mixed) and all(
    len(m[n]) == 3 and all(close(x, mixed[n]["other"][k]) for x, k in zip(m[n], ("lat_p50_ms", "lat_p95_ms", "lat_p99_ms")))
    for n in m)))
PY
check_eq "dispatch.svg: one bar per dispatch cell" 1 "${R[dispatch_cells]:-}"
check_eq "... each the cell's ratio to its floor in comparison.json" True "${R[dispatch_match]:-}"
check_eq "mixed.svg: one group per mixed cell" 1 "${R[mixed_cells]:-}"
check_eq "... p50, p95 and p99 as in comparison.json" True "${R[mixed_match]:-}"
finish
