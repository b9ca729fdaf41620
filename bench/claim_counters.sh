#!/usr/bin/env bash
# Deterministic counters of the pull path: one consumer looping relay_claim,
# relay_ack, COMMIT against a running server (PGHOST/PGPORT/PGUSER/PGDATABASE),
# with pg_stat_statements loaded; prints, per row deleted by relay_ack, the
# rows the claim's scans returned, the claim's buffers (nested statements
# included) and the ack's, and scans and nested statements per claim.
#
#   bench/claim_counters.sh HANDLER MAX PER_KEY CLAIMS
#
# Consumes deliveries of HANDLER. Used for docs/performance.md ("Claim and pull").
set -euo pipefail
(($# == 4)) || { echo "usage: $0 HANDLER MAX PER_KEY CLAIMS" >&2; exit 2; }
h=$1 max=$2 per_key=$3 n=$4
psql -q -X -A -t -F' ' -v ON_ERROR_STOP=1 <<SQL
set pg_stat_statements.track = 'all';
select pg_stat_statements_reset() \gset
do \$\$ declare ids bigint[]; begin
  for i in 1..$n loop
    select array_agg(id) into ids from relay_claim('$h', $max, null, $per_key);
    if ids is not null then perform relay_ack(ids); end if;
    commit;
  end loop; end \$\$;
with s as (select calls, rows, shared_blks_hit + shared_blks_read as blks, toplevel,
                  regexp_replace(query, '\s+', ' ', 'g') as q
             from pg_stat_statements where query not like '%pg_stat_statements%'),
 d as (select sum(rows) n from s where q like 'DELETE FROM relay.deliveries%'),
 c as (select calls, blks from s where q like 'select array_agg(id) from relay_claim%'),
 a as (select blks from s where q like 'SELECT relay_ack%'),
 sc as (select coalesce(sum(rows), 0) r, coalesce(sum(calls), 0) k from s
         where q like 'SELECT id, priority, key, not_before%' or q like 'WITH RECURSIVE%'),
 nested as (select sum(calls) k from s where not toplevel
             and q not like 'select array_agg%' and q not like 'SELECT relay_ack%')
select '$h max=$max per_key=$per_key claims=' || c.calls, 'rows/claim=' || round(d.n / c.calls, 1),
       'scan_rows/row=' || round(sc.r / d.n, 2), 'scans/claim=' || round(sc.k::numeric / c.calls, 2),
       'claim_blks/row=' || round(c.blks / d.n, 2), 'ack_blks/row=' || round(a.blks / d.n, 2),
       'nested_stmts/claim=' || round(nested.k::numeric / c.calls, 2)
  from c, d, a, sc, nested;
SQL
