#!/usr/bin/env bash
# Route resolution in the extension against test/vectors/routes.tsv, the table
# the sidecar (mongo_parity.sh, test_routes) and core's RouteResolver unit tests
# are held to: the same handlers, overlapping routes and topics give the same
# handlers and wire names in every store. The routes are created in the table's
# order in one database and in reverse in another (the answer must not depend on
# it); every topic is published twice in one session (a route-cache miss, then
# its memo).
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$INTEG_DIR/routes_lib.sh"

for order in forward reverse; do
    log "routes created in $order order"
    new_db db routes || die "could not create a database"
    {
        routes_handlers | awk '{ printf "SELECT relay_create_handler(%c%s%c, %cpull%c);\n", 39, $1, 39, 39, 39 }'
        routes_in_order $order | awk -F'\t' '{
            printf "SELECT relay_route(%c%s%c, %c%s%c, %s);\n", 39, $2, 39, 39, $1, 39,
                ($3 == "-" ? "NULL" : sprintf("%c%s%c", 39, $3, 39)) }'
    } >"$TMP/catalog.sql"
    check "handlers and $(grep -c relay_route "$TMP/catalog.sql") routes created ($order)" \
        psql_q -d "$db" -f "$TMP/catalog.sql"
    routes_topics | awk '{ for (n = 1; n <= 2; n++) printf "SELECT relay_publish(%c%s%c, %c{\"n\": %d}%c);\n", 39, $1, 39, 39, n, 39 }' \
        >"$TMP/publish.sql"
    check "every topic published twice in one session ($order)" psql_q -d "$db" -f "$TMP/publish.sql"
    sql "$db" "SELECT d.payload->>'n', d.topic,
                      string_agg(h.name || '=' || coalesce(d.wire_topic, '-'), ' ' ORDER BY h.name COLLATE \"C\")
               FROM relay.deliveries d JOIN relay.handlers h ON h.id = d.handler_id
               GROUP BY 1, 2" | tr '|' '\t' >"$TMP/got"
    routes_compare "$order" "$TMP/got"
done
finish
