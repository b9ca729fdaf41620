#!/usr/bin/env bash
# A kafka handler puts each key in the partition Kafka's Java client would
# (issue 26): 500 keys produced through relaybus with the default options, and
# the same keys produced by Kafka's own ConsoleProducer (the Java client, from
# the jars the broker runs) into a topic of the same partition count, read
# back with kcat; every key's partition must be the same. A handler that asks
# for librdkafka's consistent_random (the default before; pinned with the
# statement of docs/kafka.md's upgrade note) is produced too, to
# show that the comparison can fail: most of its keys land elsewhere. The
# Java client's placement is also checked against kafka_murmur2.py, the
# test's own murmur2, which mongo_kafka.sh uses for the sidecar.
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

N=500
PARTITIONS=6

kafka_start || die "the broker did not start"
new_db db kafkap || die "could not create a database"
check "a dispatcher serves the new database" wait_workers "$db" 1 20
for t in kp-relay kp-old kp-java; do
    kafka_create_topic "$t" "$PARTITIONS" || die "could not create topic $t"
done

# Keys of every length murmur2 treats differently (1..40 bytes, so each tail
# length), with multi-byte UTF-8 among them: the hash is over the key's bytes.
python3 - "$N" >"$TMP/keys.txt" <<'PY'
import sys
n = int(sys.argv[1])
for i in range(n):
    if i % 5 == 0:
        print("ключ-%d" % i + "é" * (i % 4))
    else:
        print(("%d-" % i + "abcdefghijklmnopqrstuvwxyz0123456789abcd")[: max(len(str(i)), 1 + i % 40)])
PY
check_eq "$N distinct keys" "$N" "$(sort -u "$TMP/keys.txt" | wc -l)"

kafka_handler "$db" relay kp-relay '{"concurrency": 64}' 'kp.#' || die "could not create the handler"
kafka_handler "$db" old kp-old '{"concurrency": 64, "producer": {"client.id": "kp-old"}}' 'kp.#' ||
    die "could not create the handler"
# The statement of docs/kafka.md's upgrade note (here for handler old only):
# pins the old placement, keeping the handler's other producer properties.
sql "$db" "SET ROLE relay_admin" "SELECT relay_alter_handler(name, NULL, jsonb_build_object('producer',
               coalesce(options->'producer', '{}') || '{\"partitioner\": \"consistent_random\"}'))
             FROM relay.handlers
            WHERE kind = 'kafka' AND NOT coalesce(options->'producer' ? 'partitioner', false)
              AND name = 'old'" >/dev/null
check_eq "the upgrade note's statement pins consistent_random and keeps client.id" \
    '{"client.id": "kp-old", "partitioner": "consistent_random"}' \
    "$(sql "$db" "SELECT options->'producer' FROM relay.handlers WHERE name = 'old'")"
check_eq "and leaves the default handler without a partitioner" "" \
    "$(sql "$db" "SELECT options->'producer'->>'partitioner' FROM relay.handlers WHERE name = 'relay'")"
psql -X -q -v ON_ERROR_STOP=1 -d "$db" -c "CREATE TABLE kp_keys (k text)" \
    -c "\\copy kp_keys FROM '$TMP/keys.txt'" </dev/null || die "could not load the keys"
sql "$db" "SELECT count(relay_publish('kp.ev', jsonb_build_object('k', k), k)) FROM kp_keys" >/dev/null

# The Java client: key<TAB>value lines; its default partitioner (murmur2 of
# the key's bytes, positive, modulo the partition count) places keyed records.
awk -v OFS='\t' '{ print $0, "v" }' "$TMP/keys.txt" |
    timeout -k 5 120 java -Xshare:auto -XX:TieredStopAtLevel=1 -cp "$(bash "$KAFKA_SCRIPT" classpath)" \
        org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$KAFKA_BOOTSTRAP" --topic kp-java \
        --property parse.key=true --property "key.separator=$(printf '\t')" >"$TMP/java.log" 2>&1 ||
    fail "Kafka's console producer ran" "$(tail -n 5 "$TMP/java.log")"

check "relaybus's deliveries are completed" wait_until 90 none_pending "$db" relay
check "the consistent_random handler's are completed" wait_until 90 none_pending "$db" old
for t in kp-relay kp-old kp-java; do
    check_topic_has "$t holds $N messages" "$db" relay "$t" "$N" 30
    timeout -k 5 30 kcat -C -b "$KAFKA_BOOTSTRAP" -t "$t" -e -q -o beginning -c "$N" -f '%k\t%p\n' \
        >"$TMP/$t.txt" 2>"$TMP/$t.err" || log "kcat $t: $(head -c 300 "$TMP/$t.err")"
done

py_facts parts "$TMP/keys.txt" "$TMP/kp-java.txt" "$TMP/kp-relay.txt" "$TMP/kp-old.txt" "$PARTITIONS" <<'PY'
import sys
from kafka_murmur2 import java_partition
def read(path):
    out = {}
    for line in open(path, encoding="utf-8"):
        k, _, p = line.rstrip("\n").rpartition("\t")
        out[k] = int(p)
    return out
keys = [l.rstrip("\n") for l in open(sys.argv[1], encoding="utf-8")]
java, relay, old = read(sys.argv[2]), read(sys.argv[3]), read(sys.argv[4])
print("java_keys=%d" % sum(k in java for k in keys))
print("relay_keys=%d" % sum(k in relay for k in keys))
print("agree=%d" % sum(k in java and relay.get(k) == java[k] for k in keys))
print("old_agree=%d" % sum(k in java and old.get(k) == java[k] for k in keys))
print("java_partitions_used=%d" % len(set(java.values())))
print("murmur2_py_agree=%d" % sum(java.get(k) == java_partition(k, int(sys.argv[5])) for k in keys))
PY
log "Java client vs relaybus (default): $(r agree) of $N keys in the same partition;" \
    "consistent_random: $(r old_agree) of $N"
check_eq "the Java client placed every key" "$N" "$(r java_keys)"
check_eq "it used every partition" "$PARTITIONS" "$(r java_partitions_used)"
check_eq "relaybus delivered every key" "$N" "$(r relay_keys)"
check_eq "every key is in the Java client's partition (default partitioner)" "$N" "$(r agree)"
check_eq "kafka_murmur2.py (which mongo_kafka.sh checks the sidecar with) places them as Java does" \
    "$N" "$(r murmur2_py_agree)"
check "consistent_random disagrees with the Java client for most keys (< $((N / 2)) agree)" \
    test "$(r old_agree)" -lt $((N / 2))
finish
