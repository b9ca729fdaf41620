#include "pg/http_delivery.hpp"

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/http_engine.hpp"
#include "core/outbound_policy.hpp"
#include "core/webhook_delivery.hpp"
#include "pg/complete.hpp"
#include "pg/guard.hpp"
#include "pg/leases.hpp"
#include "pg/settings.hpp"
#include "pg/spi_support.hpp"
#include "pg/worker_state.hpp"
#include "pg/worker_xact.hpp"

extern "C" {
#include "pgstat.h"
#include "storage/latch.h"
}

namespace relaybus::pg {

namespace {

// The dispatcher's HTTP state. Static storage: nothing here lives on a stack
// frame that a PostgreSQL error could unwind.
std::unique_ptr<core::HttpEngine> engine;
std::string engine_allowlist;
// What a claimed request is sent with: the handler as it was when claimed
// (the catalog cache may change before the request goes out).
struct StagedHandler {
    int32 id;
    std::string target;
    core::HandlerOptions options;
};
// A claimed delivery whose request is built when it is sent
// (core::build_webhook_request: webhook-timestamp and signature of that moment).
struct Queued {
    std::shared_ptr<const StagedHandler> handler;
    core::WebhookMessage msg;
    int64 expires_ms;  // epoch ms after which it may no longer be sent
};
std::vector<Queued> staged;  // claimed in the open transaction
// Claimed (committed) requests waiting for room under their handler's
// concurrency. Claiming ahead of what may be in flight lets a claim serve many
// requests, and lets the next request go out the moment a response comes in,
// without waiting for a transaction.
std::deque<Queued> queued;
std::unordered_map<int32, int> queued_of;  // handler id -> entries in `queued`
std::vector<int64> expired_ids;            // queued too long: their leases go back
std::vector<core::HttpResult> finished;
std::unordered_map<uint64, int64> published_us;  // delivery id -> publish time (latency)
// delivery id -> the token of the lease taken when it was claimed: the results
// are completed with it (compare-and-release), so a dispatcher that lost the
// lease meanwhile (stalled past it while another took over) completes nothing.
std::unordered_map<uint64, LeaseToken> lease_of;
std::vector<LeaseToken> expired_tokens;  // beside expired_ids
std::unordered_map<int32, core::CircuitBreaker> breakers;
int64 first_result_ms = 0;  // when the oldest result in `finished` came in  // per handler (core/webhook_delivery)

SavedPlan delete_plan = {"DELETE FROM relay.deliveries WHERE id = ANY ($1)", 1, {INT8ARRAYOID}, nullptr};

int64 now_ms() { return timestamptz_to_epoch_ms(GetCurrentTimestamp()); }

const char* allowlist_setting() { return guc_http_allowlist != nullptr ? guc_http_allowlist : ""; }

// Creates the engine, or gives it a reloaded relaybus.http_allowlist: at once,
// with requests in flight too (the engine checks every connection and every
// request against the list in force). Returns false (with a log line) if the
// setting is bad.
bool ensure_engine() {
    const char* setting = allowlist_setting();
    char err[kErrLen];
    bool ok = run_core(
        [&](std::string* why) {
            if (engine && engine_allowlist == setting) return true;
            core::HttpEngineOptions opts;
            if (!core::parse_allowlist(setting, &opts.allow, why)) return false;
            if (engine) {
                engine->set_allowlist(opts.allow);
                engine_allowlist = setting;
                return true;
            }
            opts.max_total = std::clamp(guc_max_in_flight, 1, 4096);
            engine = std::make_unique<core::HttpEngine>(opts);
            engine_allowlist = setting;
            if (!engine->ok()) {
                *why = "libcurl could not be initialized";
                engine.reset();
                return false;
            }
            return true;
        },
        err);
    if (!ok) ereport(WARNING, (errmsg("relaybus: http callouts are off: %s", err)));
    return ok && engine != nullptr;
}

}  // namespace

int64 http_lease_ms(const HandlerEntry* h) {
    return std::max<int64>(h->options.lease_ms, h->options.timeout_ms + 30000);
}

int http_capacity(const HandlerEntry* h) {
    if (!ensure_engine()) return 0;
    int capacity = 0;
    int64 now = now_ms();
    char err[kErrLen];
    (void)run_core(
        [&](std::string*) {
            const int conc = h->options.concurrency;
            engine->set_handler_limit(h->id, conc);
            int in_flight = static_cast<int>(engine->in_flight(h->id));
            auto q = queued_of.find(h->id);
            int waiting = q == queued_of.end() ? 0 : q->second;
            auto it = breakers.find(h->id);
            int limit = it == breakers.end() ? conc : it->second.limit(conc, now);
            // Claim ahead (in flight + queued up to 2 x concurrency + 256) while the
            // breaker is closed, and only once half of that is free, so that one
            // claim serves many requests; a tripped breaker claims no more than it sends.
            int ahead = limit < conc ? limit : 2 * conc + 256;
            int room = ahead - in_flight - waiting;
            if (limit == conc && room < ahead / 2) room = 0;
            int global = std::clamp(guc_max_in_flight, 1, 4096) - static_cast<int>(engine->in_flight()) -
                         static_cast<int>(queued.size());
            capacity = std::max(0, std::min(room, global));
            return true;
        },
        err);
    return capacity;
}

void http_stage(const HandlerEntry* h, const ClaimResult* res) {
    if (res->n == 0) return;
    // Copy what the requests need out of SPI into plain memory first: id,
    // event_id, topic, key, seq, payload, headers, attempt (claim.hpp).
    struct Row {
        int64 id, event_id, seq, published;
        char *topic, *key, *payload, *headers;
        int attempt;
    };
    int n = res->n;
    auto* rows = static_cast<Row*>(palloc(sizeof(Row) * n));
    for (int i = 0; i < n; i++) {
        int row = res->rows[i];
        HeapTuple tup = SPI_tuptable->vals[row];
        TupleDesc desc = SPI_tuptable->tupdesc;
        bool isnull = false;
        Row& r = rows[i];
        r.id = spi_int64(row, 1);
        r.event_id = spi_int64(row, 2);
        r.topic = SPI_getvalue(tup, desc, 3);
        r.key = SPI_getvalue(tup, desc, 4);  // NULL for an unkeyed delivery
        Datum seq = spi_col(row, 5, &isnull);
        r.seq = isnull ? 0 : DatumGetInt64(seq);
        r.payload = SPI_getvalue(tup, desc, 6);
        r.headers = SPI_getvalue(tup, desc, 7);
        r.attempt = DatumGetInt32(spi_col(row, 8, &isnull));
        r.published = DatumGetTimestampTz(spi_col(row, 10, &isnull));
    }
    int64 now = now_ms();
    // A queued request must still be sent, and answered within its timeout,
    // while its lease holds (http_lease_ms), with a margin: else it is not sent
    // and its lease goes back.
    int64 expires = now + std::max<int64>(1000, http_lease_ms(h) - h->options.timeout_ms - 15000);
    char err[kErrLen];
    if (!run_core(
            [&](std::string*) {
                auto handler = std::make_shared<const StagedHandler>(StagedHandler{h->id, h->target, h->options});
                for (int i = 0; i < n; i++) {
                    const Row& r = rows[i];
                    Queued q{handler, {}, expires};
                    q.msg.id = r.id;
                    q.msg.event_id = r.event_id;
                    q.msg.topic = r.topic != nullptr ? r.topic : "";
                    q.msg.has_key = r.key != nullptr;
                    if (r.key != nullptr) q.msg.key = r.key;
                    q.msg.seq = r.seq;
                    q.msg.attempt = r.attempt;
                    q.msg.published_at_ms = timestamptz_to_epoch_ms(r.published);
                    if (r.headers != nullptr) q.msg.headers_json = r.headers;
                    q.msg.payload_json = r.payload != nullptr ? r.payload : "null";
                    published_us[static_cast<uint64>(r.id)] = r.published;
                    lease_of[static_cast<uint64>(r.id)] = res->tokens[i];
                    staged.push_back(std::move(q));
                }
                return true;
            },
            err))
        ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("relaybus could not prepare http requests: %s", err)));
}

void http_send_staged() {
    if (staged.empty()) return;
    char err[kErrLen];
    (void)run_core(
        [&](std::string*) {
            for (auto& q : staged) {
                queued_of[q.handler->id]++;
                queued.push_back(std::move(q));
            }
            staged.clear();
            return true;
        },
        err);
    http_pump();
}

void http_pump() {
    if (queued.empty()) return;
    // A reloaded allow-list applies to these requests already.
    if (engine && engine_allowlist != allowlist_setting()) (void)ensure_engine();
    int64 now = now_ms();
    char err[kErrLen];
    (void)run_core(
        [&](std::string*) {
            // In claim order; a handler without room keeps its requests for later.
            core::HttpEngine::Batch batch;
            std::deque<Queued> keep;
            for (auto& q : queued) {
                uint64 tag = static_cast<uint64>(q.msg.id);
                int key = q.handler->id;
                // A handler whose breaker tripped sends no more than the breaker
                // allows (nothing while open, then one probe at a time): the rest
                // of its queue gives the leases back, to be claimed again later.
                auto b = breakers.find(key);
                bool tripped = b != breakers.end() && b->second.is_open() &&
                               static_cast<int>(engine != nullptr ? engine->in_flight(key) : 0) >=
                                   b->second.limit(1 << 20, now);
                if (now > q.expires_ms || engine == nullptr || tripped) {
                    expired_ids.push_back(static_cast<int64>(tag));
                    expired_tokens.push_back(lease_of[tag]);
                    lease_of.erase(tag);
                    published_us.erase(tag);
                    queued_of[key]--;
                    continue;
                }
                if (!engine->can_submit(key)) {
                    keep.push_back(std::move(q));
                    continue;
                }
                queued_of[key]--;
                std::string why;
                // Made now, as it goes out: its webhook-timestamp and signature
                // are those of this moment, however long it was queued.
                core::HttpRequest r = core::build_webhook_request(q.handler->options, q.handler->target, key,
                                                                  q.msg, now / 1000);
                // A request the engine refuses (bad URL or header) is a failure.
                if (!engine->submit(std::move(r), &why)) {
                    core::HttpResult failed;
                    failed.tag = tag;
                    failed.handler_key = key;
                    failed.outcome = core::HttpOutcome::Fail;
                    failed.error = why;
                    finished.push_back(std::move(failed));
                }
            }
            queued.swap(keep);
            return true;
        },
        err);
    if (!expired_ids.empty()) {
        // Not sent: the deliveries are claimed again (by this or another dispatcher).
        leases_release(expired_ids.data(), expired_tokens.data(), static_cast<int>(expired_ids.size()));
        expired_ids.clear();
        expired_tokens.clear();
    }
}

size_t http_queued() { return queued.size(); }

void http_release_queued() {
    char err[kErrLen];
    (void)run_core(
        [&](std::string*) {
            for (const auto& q : queued) {
                uint64 tag = static_cast<uint64>(q.msg.id);
                expired_ids.push_back(q.msg.id);
                expired_tokens.push_back(lease_of[tag]);
                lease_of.erase(tag);
                published_us.erase(tag);
            }
            queued.clear();
            queued_of.clear();
            return true;
        },
        err);
    if (!expired_ids.empty()) {
        leases_release(expired_ids.data(), expired_tokens.data(), static_cast<int>(expired_ids.size()));
        expired_ids.clear();
        expired_tokens.clear();
    }
}

void http_drop_staged() {
    char err[kErrLen];
    (void)run_core(
        [&](std::string*) {
            for (const auto& q : staged) {
                published_us.erase(static_cast<uint64>(q.msg.id));
                lease_of.erase(static_cast<uint64>(q.msg.id));
            }
            staged.clear();
            return true;
        },
        err);
}

size_t http_in_flight() { return engine ? engine->in_flight() : 0; }

int http_collect() {
    char err[kErrLen];
    bool was_empty = finished.empty();
    (void)run_core(
        [&](std::string*) {
            if (engine) {
                auto more = engine->take_results();
                for (auto& r : more) finished.push_back(std::move(r));
            }
            return true;
        },
        err);
    if (was_empty && !finished.empty()) first_result_ms = now_ms();
    return static_cast<int>(finished.size());
}

int64 http_results_age_ms() { return finished.empty() ? 0 : now_ms() - first_result_ms; }

int http_complete() {
    char err[kErrLen];
    int n = http_collect();
    if (n == 0) return 0;

    // Breaker entries exist before the PostgreSQL part below, which must not allocate C++ memory.
    (void)run_core(
        [&](std::string*) {
            for (const auto& r : finished) breakers.try_emplace(r.handler_key);
            return true;
        },
        err);
    TimestampTz now = GetCurrentTimestamp();
    int64 nowms = timestamptz_to_epoch_ms(now);
    Datum* done = static_cast<Datum*>(palloc(sizeof(Datum) * n));
    int32* done_handler = static_cast<int32*>(palloc(sizeof(int32) * n));
    int64* done_latency = static_cast<int64*>(palloc(sizeof(int64) * n));
    int ndone = 0;
    // The results' leases, checked (and marked) in the completing transaction.
    int64* ids = static_cast<int64*>(palloc(sizeof(int64) * n));
    LeaseToken* tokens = static_cast<LeaseToken*>(palloc0(sizeof(LeaseToken) * n));
    LeaseCheck* checks = static_cast<LeaseCheck*>(palloc(sizeof(LeaseCheck) * n));
    (void)run_core(
        [&](std::string*) {
            for (int i = 0; i < n; i++) {
                ids[i] = static_cast<int64>(finished[i].tag);
                auto it = lease_of.find(finished[i].tag);
                if (it != lease_of.end()) tokens[i] = it->second;  // else all zero: matches no lease
            }
            return true;
        },
        err);
    int lost = 0;

    PG_TRY();
    {
        worker_xact_begin();
        SpiScope scope;
        spi_begin(&scope);
        (void)leases_begin_completion(ids, tokens, nullptr, n, now, checks);
        for (int i = 0; i < n; i++) {
            const core::HttpResult& r = finished[i];
            int64 id = static_cast<int64>(r.tag);
            core::CircuitBreaker& b = breakers.find(r.handler_key)->second;
            const HandlerEntry* h = catalog_handler_by_id(r.handler_key);
            if (h != nullptr) b.record(r, h->options, nowms);
            if (checks[i] != LeaseCheck::Held) {
                lost++;  // the lease expired or another holder has it: complete nothing
            } else if (r.outcome == core::HttpOutcome::Success) {
                done[ndone] = Int64GetDatum(id);
                done_handler[ndone] = r.handler_key;
                auto it = published_us.find(r.tag);
                done_latency[ndone++] = it != published_us.end() ? now - it->second : 0;
            } else {
                bool dead = h != nullptr ? core::webhook_failure_is_permanent(h->options, r)
                                         : r.outcome == core::HttpOutcome::Fail;
                (void)nack_delivery(id, CStringGetTextDatum(r.error.c_str()), r.retry_after_ms, r.status, dead, true);
            }
            count_http(MyDatabaseId, r.handler_key, r.status,
                       b.is_open() ? TimestampTzPlusMilliseconds(now, b.open_until_ms() - nowms) : 0);
        }
        if (ndone > 0) {
            Datum arg = PointerGetDatum(construct_array(done, ndone, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
            spi_exec(&delete_plan, &arg, nullptr, false, 0);
        }
        spi_end(&scope);
        worker_xact_commit();
    }
    PG_CATCH();
    {
        // The results are lost; their leases lapse and the deliveries are sent again.
        for (const auto& r : finished) lease_of.erase(r.tag);
        finished.clear();
        PG_RE_THROW();
    }
    PG_END_TRY();
    count_delivered(MyDatabaseId, done_handler, done_latency, ndone);
    if (lost > 0)
        ereport(LOG, (errmsg("relaybus dispatcher: %d http result(s) not completed: their leases were lost", lost),
                      errdetail("The request outlived its lease (this worker stalled, or the lease ran out); "
                                "the delivery's next holder completes it.")));
    (void)run_core(
        [&](std::string*) {
            for (const auto& r : finished) {
                published_us.erase(r.tag);
                lease_of.erase(r.tag);
            }
            finished.clear();
            return true;
        },
        err);
    return n;
}

bool http_wait(long timeout_ms) {
    int nsock = 0;
    int* fds = nullptr;
    uint32* events = nullptr;
    int64 engine_timeout = -1;
    if (engine) {
        size_t cap = 0;
        char err[kErrLen];
        (void)run_core(
            [&](std::string*) {
                cap = engine->sockets().size();
                return true;
            },
            err);
        fds = static_cast<int*>(palloc(sizeof(int) * (cap + 1)));
        events = static_cast<uint32*>(palloc(sizeof(uint32) * (cap + 1)));
        (void)run_core(
            [&](std::string*) {
                for (const auto& w : engine->sockets()) {
                    uint32 ev = (w.read ? WL_SOCKET_READABLE : 0) | (w.write ? WL_SOCKET_WRITEABLE : 0);
                    if (ev == 0 || nsock >= static_cast<int>(cap)) continue;
                    fds[nsock] = w.fd;
                    events[nsock++] = ev;
                }
                engine_timeout = engine->timeout_ms();
                return true;
            },
            err);
    }
    // libcurl's own timers (often 0 or 1 ms while transfers run) end the wait
    // too, but they are the engine's business: they do not call for a claim or
    // a completion, so they do not count as a wake-up.
    bool engine_timer = false;
    if (engine_timeout >= 0 && engine_timeout < timeout_ms) {
        timeout_ms = static_cast<long>(engine_timeout);
        engine_timer = true;
    }
    // An open breaker lets its probe through when its backoff ends.
    int64 nowms = now_ms();
    for (const auto& kv : breakers) {
        const core::CircuitBreaker& b = kv.second;
        if (b.is_open() && b.open_until_ms() >= nowms && b.open_until_ms() - nowms + 1 < timeout_ms) {
            timeout_ms = static_cast<long>(b.open_until_ms() - nowms + 1);
            engine_timer = false;
        }
    }

    WaitEventSet* set = CreateWaitEventSet(CurrentMemoryContext, nsock + 2);
    AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, nullptr);
    AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, nullptr, nullptr);
    for (int i = 0; i < nsock; i++) AddWaitEventToSet(set, events[i], fds[i], nullptr, nullptr);
    WaitEvent occurred[64];
    int n = WaitEventSetWait(set, timeout_ms, occurred, lengthof(occurred), PG_WAIT_EXTENSION);
    FreeWaitEventSet(set);
    bool latch = false;
    for (int i = 0; i < n; i++)
        if (occurred[i].events & WL_LATCH_SET) latch = true;
    if (latch) ResetLatch(MyLatch);
    bool woken = latch || (n == 0 && !engine_timer);  // n == 0: the timeout passed
    if (!engine) return woken;
    char err[kErrLen];
    (void)run_core(
        [&](std::string*) {
            core::HttpEngine::Batch batch;
            for (int i = 0; i < n; i++) {
                const WaitEvent& e = occurred[i];
                if (e.events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE))
                    engine->on_socket(e.fd, (e.events & WL_SOCKET_READABLE) != 0,
                                      (e.events & WL_SOCKET_WRITEABLE) != 0);
            }
            if (engine->timeout_ms() == 0 || n == 0) engine->on_timeout();
            return true;
        },
        err);
    return woken;
}

void http_shutdown() {
    http_release_queued();
    char err[kErrLen];
    (void)run_core(
        [&](std::string*) {
            engine.reset();
            return true;
        },
        err);
}

}  // namespace relaybus::pg
