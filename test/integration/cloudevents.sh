#!/usr/bin/env bash
# CloudEvents 1.0 (option "cloudevents") end to end, every message parsed by
# both CloudEvents SDKs (PyPI cloudevents, npm cloudevents), installed at test
# time into a cache: http handlers in binary and structured mode to a real
# receiver (keyed and unkeyed events, one retried after a 500, Standard
# Webhooks signatures over the body sent) and kafka handlers in both modes
# with a real broker read back by kcat. The attributes are checked against
# what an envelope handler of the same events received (event id, wire name,
# key, seq, publish time, payload).
# editions: extension managed
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/http_lib.sh"

# The SDKs, pinned, from their registries into a cache under build/ (never
# scripts/install-deps.sh: only this test needs them).
PY_SDK=cloudevents==1.11.0
NODE_SDK=cloudevents@8.0.3
SDK_CACHE=${RELAYBUS_CE_SDK_CACHE:-$RELAYBUS_ROOT/build/ce-sdk}
if [[ ! -d "$SDK_CACHE/python/cloudevents" ]]; then
    log "installing $PY_SDK from PyPI into $SDK_CACHE/python"
    rm -rf "$SDK_CACHE/python.tmp"
    timeout 300 python3 -m pip install --quiet --disable-pip-version-check --target "$SDK_CACHE/python.tmp" "$PY_SDK" \
        >"$TMP/pip.log" 2>&1 && mv "$SDK_CACHE/python.tmp" "$SDK_CACHE/python" ||
        die "could not install $PY_SDK from PyPI (is the registry reachable?): $(tail -3 "$TMP/pip.log")"
fi
if [[ ! -d "$SDK_CACHE/node/node_modules/cloudevents" ]]; then
    command -v npm >/dev/null || die "npm is needed to install $NODE_SDK (scripts/install-deps.sh installs it)"
    log "installing $NODE_SDK from the npm registry into $SDK_CACHE/node"
    timeout 300 npm install --prefix "$SDK_CACHE/node" --no-audit --no-fund --loglevel=error "$NODE_SDK" \
        >"$TMP/npm.log" 2>&1 ||
        die "could not install $NODE_SDK from the npm registry (is it reachable?): $(tail -3 "$TMP/npm.log")"
fi
[[ -d "$SDK_CACHE/node/node_modules/cloudevents" ]] || die "npm installed no $NODE_SDK into $SDK_CACHE/node"

kafka_pick_port
kafka_start >"$TMP/kafka-start.log" 2>&1 &
KAFKA_STARTER=$!

http_test_db ce
SECRET=$(new_secret)
SOURCE_DEFAULT=/relaybus/$db
http_handler "$db" env "$URL/env" '{"backoff_base": "100ms"}' 'ce.#'
http_handler "$db" binh "$URL/binh" "{\"cloudevents\": \"binary\", \"secret\": \"$SECRET\", \"backoff_base\": \"100ms\"}" 'ce.#'
http_handler "$db" strh "$URL/strh" \
    "{\"cloudevents\": \"structured\", \"cloudevents_source\": \"urn:example:shop\", \"secret\": \"$SECRET\", \"backoff_base\": \"100ms\"}" \
    'ce.#'
# The second event fails once with 500 in both modes: its retry is the same
# CloudEvent (id) with the next relaybusattempt.
for p in /binh /strh; do recv_plan "$RECV_PORT" $p '[{"status": 500, "match": "\"n\": 2"}]'; done
wait "$KAFKA_STARTER" || die "the broker did not start: $(tail -5 "$TMP/kafka-start.log")"
kafka_handler "$db" kb ce-bin '{"cloudevents": "binary", "backoff_base": "100ms"}' 'ce.#'
kafka_handler "$db" ks ce-str '{"cloudevents": "structured", "backoff_base": "100ms"}' 'ce.#'
# type is the wire name: the exact route's wins over 'ce.#'.
for h in env binh strh kb ks; do sql "$db" "SELECT relay_route('ce.order', '$h', 'shop.order.v1')" >/dev/null; done

# Keyed (two keys, one of them twice) and unkeyed events.
sql "$db" "SELECT relay_publish('ce.order', jsonb_build_object('n', i, 'name', 'é ' || i),
                                CASE WHEN i <= 3 THEN 'cust-' || (i % 2) END)
             FROM generate_series(1, 5) i" >/dev/null
for h in env binh strh kb ks; do check "handler $h delivers everything" wait_until 90 none_pending "$db" $h; done
check_eq "the binary handler saw 6 requests (one retry)" 6 "$(recv_count "$LOG" /binh)"
check_eq "the structured handler saw 6 requests (one retry)" 6 "$(recv_count "$LOG" /strh)"
check_topic_has "ce-bin holds 5 messages" "$db" kb ce-bin 5 30
check_topic_has "ce-str holds 5 messages" "$db" ks ce-str 5 30

# Every request and message as {headers, body, key}, then through both SDKs.
PYTHONPATH="$INTEG_DIR" python3 - "$LOG" "$TMP" <<'PY' || die "could not extract the messages"
import json, sys
from http_log import records
log, tmp = sys.argv[1], sys.argv[2]
for path in ("binh", "strh"):
    msgs = [{"headers": r["headers"], "body": r["body"], "key": None} for r in records(log, "/" + path)]
    json.dump(msgs, open(f"{tmp}/{path}.msgs", "w"))
PY
for t in ce-bin ce-str; do
    kafka_consume $t "$TMP/$t.kcat" || die "kcat could not read $t"
    python3 - "$TMP/$t.kcat" "$TMP/$t.msgs" <<'PY' || die "could not extract the messages of $t"
import json, sys
msgs = []
for line in open(sys.argv[1]):
    if line.strip():
        m = json.loads(line)
        h = m.get("headers") or []
        msgs.append({"headers": dict(zip(h[0::2], h[1::2])), "body": m["payload"], "key": m.get("key")})
json.dump(msgs, open(sys.argv[2], "w"))
PY
done
for f in binh:http strh:http ce-bin:kafka ce-str:kafka; do
    name=${f%%:*} binding=${f#*:}
    PYTHONPATH="$SDK_CACHE/python" python3 "$INTEG_DIR/cloudevents_parse.py" "$binding" "$TMP/$name.msgs" \
        >"$TMP/$name.py.json" 2>"$TMP/$name.py.err" || die "the python SDK script failed: $(tail -3 "$TMP/$name.py.err")"
    NODE_PATH="$SDK_CACHE/node/node_modules" node "$INTEG_DIR/cloudevents_parse.js" "$binding" "$TMP/$name.msgs" \
        >"$TMP/$name.js.json" 2>"$TMP/$name.js.err" || die "the npm SDK script failed: $(tail -3 "$TMP/$name.js.err")"
done

# What each SDK read, against the envelope handler's view of the same events.
py_facts ce "$LOG" "$TMP" "$SECRET" "$SOURCE_DEFAULT" <<'PY'
import base64, datetime, hashlib, hmac, json, sys
from http_log import records, facts
log, tmp, secret, source_default = sys.argv[1:5]
env = {}
for r in records(log, "/env"):
    env[r["env"]["event_id"]] = r["env"]
key = base64.b64decode(secret[len("whsec_"):])

def ms(t):
    return round(datetime.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp() * 1000)

def mismatches(e, source, content_type="application/json"):
    """The attributes of parsed event e that differ from the envelope's."""
    if "error" in e:
        return [e["error"]]
    v = env.get(int(e.get("id", "-1")))
    if v is None:
        return [f"id {e.get('id')} is no event's"]
    want = {"specversion": "1.0", "source": source, "type": v["topic"], "datacontenttype": content_type,
            "subject": v["key"], "relaybusseq": None if v["seq"] is None else str(v["seq"])}
    bad = [f"{a}={e.get(a)!r}, expected {w!r}" for a, w in want.items() if e.get(a) != w]
    if ms(e["time"]) != ms(v["published_at"]):
        bad.append(f"time={e['time']} for published_at {v['published_at']}")
    if e["data"] != v["payload"]:
        bad.append(f"data={e['data']!r}")
    return bad

out = {}
for name, source in (("binh", source_default), ("strh", "urn:example:shop"), ("ce-bin", source_default),
                     ("ce-str", source_default)):
    msgs = json.load(open(f"{tmp}/{name}.msgs"))
    for sdk in ("py", "js"):
        parsed = json.load(open(f"{tmp}/{name}.{sdk}.json"))
        # The PyPI SDK's Kafka from_structured takes every header for an
        # attribute, content-type (the format's) for datacontenttype too.
        quirk = name == "ce-str" and sdk == "py"
        ct = "application/cloudevents+json" if quirk else "application/json"
        bad = [b for e in parsed for b in mismatches(e, source, ct)]
        out[f"{name}_{sdk}_parsed"] = len(parsed)
        out[f"{name}_{sdk}_bad"] = "; ".join(bad[:3]) or "none"
        ids = [e.get("id") for e in parsed]
        out[f"{name}_{sdk}_ids"] = len(set(ids))
        if name in ("binh", "strh"):
            # The retried event: the same id, attempts 1 then 2.
            retried = [e for e in parsed if e.get("data", {}).get("n") == 2]
            out[f"{name}_{sdk}_retry"] = ",".join(f"{e['id'] == retried[0]['id']}:{e.get('relaybusattempt')}"
                                                 for e in retried)
    if name in ("binh", "strh"):
        ok = 0
        for m in msgs:
            h = m["headers"]
            signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.{m['body']}".encode()
            want = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
            ok += want in h.get("webhook-signature", "").split(" ")
        out[f"{name}_signed"] = ok
        out[f"{name}_content_type"] = ",".join(sorted({m["headers"].get("content-type", "") for m in msgs}))
    else:
        out[f"{name}_relay_seq_kept"] = sum("relay-id" in m["headers"] for m in msgs)
        out[f"{name}_content_type"] = ",".join(sorted({m["headers"].get("content-type", "") for m in msgs}))
out["events"] = len(env)
out["env_topic"] = ",".join(sorted({v["topic"] for v in env.values()}))
facts(out)
PY
check_eq "the envelope handler saw the 5 events" 5 "$(r events)"
check_eq "under the wire name" shop.order.v1 "$(r env_topic)"
for name in binh strh ce-bin ce-str; do
    n=5
    [[ $name == binh || $name == strh ]] && n=6
    for sdk in py js; do
        label=$([[ $sdk == py ]] && echo "PyPI cloudevents" || echo "npm cloudevents")
        check_eq "$name: $label parsed $n messages" $n "$(r ${name}_${sdk}_parsed)"
        check_eq "$name: $label read id, source, type, subject, time, data, relaybusseq as the envelope's" \
            none "$(r ${name}_${sdk}_bad)"
        check_eq "$name: $label saw 5 distinct ids" 5 "$(r ${name}_${sdk}_ids)"
    done
done
for name in binh strh; do
    for sdk in py js; do
        check_eq "$name: the retry after a 500 is the same event, relaybusattempt 1 then 2 ($sdk)" \
            "True:1,True:2" "$(r ${name}_${sdk}_retry)"
    done
    check_eq "$name: every request is signed over the body sent (Standard Webhooks)" 6 "$(r ${name}_signed)"
done
check_eq "binary mode: content-type application/json" application/json "$(r binh_content_type)"
check_eq "structured mode: content-type application/cloudevents+json" application/cloudevents+json \
    "$(r strh_content_type)"
check_eq "kafka binary: content-type header application/json" application/json "$(r ce-bin_content_type)"
check_eq "kafka structured: content-type header application/cloudevents+json" application/cloudevents+json \
    "$(r ce-str_content_type)"
for t in ce-bin ce-str; do check_eq "$t: relaybus's own headers stay" 5 "$(r ${t}_relay_seq_kept)"; done

# Refused options (SQLSTATE 22023), as the vectors test them in full.
check_eq "cloudevents with a kafka envelope is refused" \
    '22023: invalid option: option "cloudevents" cannot be combined with "envelope": true (the CloudEvent takes the envelope'"'"'s place)' \
    "$(sqlstate_of "$db" "relay_create_handler('kx', 'kafka', 'kafka://$KAFKA_BOOTSTRAP/x', '{\"cloudevents\": \"binary\", \"envelope\": true}')")"
check_eq "an unknown mode is refused" \
    '22023: invalid option: option "cloudevents" must be "binary" or "structured" (got "batch")' \
    "$(sqlstate_of "$db" "relay_alter_handler('binh', NULL, '{\"cloudevents\": \"batch\"}')")"
finish
