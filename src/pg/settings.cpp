#include "pg/pg_includes.hpp"
#include "pg/settings.hpp"

namespace relaybus::pg {

int guc_max_payload_bytes = 1024 * 1024;
int guc_max_key_bytes = 512;
int guc_priority_aging_ms = 10000;
int guc_max_leases = 65536;
int guc_claim_scan_limit = 10000;

void define_settings() {
    DefineCustomIntVariable(
        "relaybus.max_payload_bytes", "Largest payload relay_publish accepts, in bytes.",
        "Measured on the jsonb value as stored, before compression.", &guc_max_payload_bytes,
        1024 * 1024, 1, MaxAllocSize - 1, PGC_SUSET, GUC_UNIT_BYTE, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("relaybus.max_key_bytes", "Longest ordering key, in bytes.", nullptr,
                            &guc_max_key_bytes, 512, 1, 2048, PGC_SUSET, GUC_UNIT_BYTE, nullptr,
                            nullptr, nullptr);
    DefineCustomIntVariable(
        "relaybus.priority_aging", "Waiting time after which a delivery counts one priority class higher.",
        "0 disables aging (strict priority).", &guc_priority_aging_ms, 10000, 0, INT_MAX,
        PGC_SUSET, GUC_UNIT_MS, nullptr, nullptr, nullptr);
    DefineCustomIntVariable("relaybus.max_leases",
                            "Deliveries that can be leased (in flight) at once, cluster-wide.",
                            "Sizes a shared memory table; a claim past it returns fewer rows.",
                            &guc_max_leases, 65536, 64, 16 * 1024 * 1024, PGC_POSTMASTER, 0,
                            nullptr, nullptr, nullptr);
    DefineCustomIntVariable(
        "relaybus.claim_scan_limit", "Most pending rows one claim looks at to find ready ones.",
        "Bounds the work of a claim when many keys are blocked behind failing deliveries.",
        &guc_claim_scan_limit, 10000, 100, INT_MAX, PGC_SUSET, 0, nullptr, nullptr, nullptr);
    MarkGUCPrefixReserved("relaybus");
}

}  // namespace relaybus::pg
