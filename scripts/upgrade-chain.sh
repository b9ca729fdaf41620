#!/usr/bin/env bash
# Prints the extension's upgrade scripts (sql/relaybus--A--B.sql) that lead
# from FROM to TO, in order; exit 1 if no chain does.
#
#   scripts/upgrade-chain.sh FROM TO
set -euo pipefail
(($# == 2)) || { echo "usage: $0 FROM TO" >&2; exit 2; }
cd "$(dirname "$0")/.."
v=$1
while [[ "$v" != "$2" ]]; do
    next=(sql/relaybus--"$v"--*.sql)
    [[ -e "${next[0]}" && ${#next[@]} == 1 ]] || { echo "$0: no single upgrade script from $v (towards $2)" >&2; exit 1; }
    echo "${next[0]}"
    v=${next[0]#sql/relaybus--"$v"--}
    v=${v%.sql}
done
