# test/vectors/routes.tsv as the route parity tests read it (sourced, not run):
# routes.sh (the extension) and mongo_parity.sh's test_routes (the sidecar)
# create its handlers and routes, publish each of its topics twice (payload
# {"n": 1}, then {"n": 2}), and compare what they delivered with
# routes_expected, in the same format.
ROUTES_VECTORS=$(cd "$(dirname "${BASH_SOURCE[0]}")/../vectors" && pwd -P)/routes.tsv

# routes_expected: "N<TAB>TOPIC<TAB>HANDLER=WIRE ..." per publish round N and
# topic, sorted bytewise ("-": no wire name; handlers in byte order).
routes_expected() {
    local n
    for n in 1 2; do awk -F'\t' -v n=$n '$1 == "expect" { print n "\t" $2 "\t" $3 }' "$ROUTES_VECTORS"; done |
        LC_ALL=C sort
}

# routes_handlers: each handler's name once, in the table's order.
routes_handlers() { awk -F'\t' '$1 == "route" && !seen[$2]++ { print $2 }' "$ROUTES_VECTORS"; }

# routes_in_order forward|reverse: "HANDLER<TAB>PATTERN<TAB>WIRE" per route, in
# the table's order or the reverse ("-": no wire name).
routes_in_order() {
    awk -F'\t' -v OFS='\t' '$1 == "route" { print $2, $3, $4 }' "$ROUTES_VECTORS" |
        if [[ $1 == reverse ]]; then tac; else cat; fi
}

# routes_topics: each topic to publish, once.
routes_topics() { awk -F'\t' '$1 == "expect" { print $2 }' "$ROUTES_VECTORS"; }

# routes_compare NAME GOT_FILE: one assertion, GOT_FILE (sorted here) against routes_expected.
routes_compare() {
    LC_ALL=C sort -o "$2" "$2"
    if diff -u <(routes_expected) "$2" >"$2.diff"; then
        pass "$1: the handlers and wire names of test/vectors/routes.tsv ($(wc -l <"$2") topic rounds)"
    else
        fail "$1: deliveries differ from test/vectors/routes.tsv" "$(cat "$2.diff")"
    fi
}
