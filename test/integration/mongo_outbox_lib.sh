# Helpers of the relaybus-mongo outbox suites (sourced after mongo_lib.sh, not
# run): mongo_outbox.sh and mongo_segments.sh.

outbox_count() { $PYM -c "import pymongo; print(pymongo.MongoClient('$URI')['$1'].relay_outbox.count_documents({}))"; }
setup_db() {  # DB PATH [handler options]
    "$BIN" init --database "$1" >/dev/null
    local opts=${3:-}
    [[ -n "$opts" ]] || opts='{}'
    "$BIN" handler create hook http "$HOOK$2" --options "$opts" --database "$1" >/dev/null
    "$BIN" route 'o.#' hook --database "$1"
}
report() {  # the checker's main counts, as one line
    echo "missing=${R[missing]} extra=${R[extra]} reissued=${R[reissued]} id_reuse=${R[id_reuse]} seq_reuse=${R[seq_reuse]} order=${R[order_violations]} gaps=${R[seq_gap_keys]} publish_order=${R[publish_order]} key=${R[seq_mismatch]}"
}
CLEAN="missing=0 extra=0 reissued=0 id_reuse=0 seq_reuse=0 order=0 gaps=0 publish_order=0 key=0"

