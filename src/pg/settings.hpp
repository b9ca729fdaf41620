// relaybus.* GUCs (see docs/configuration.md).
#pragma once

namespace relaybus::pg {

extern int guc_max_payload_bytes;
extern int guc_max_key_bytes;
extern int guc_priority_aging_ms;
extern int guc_max_leases;
extern int guc_claim_scan_limit;

void define_settings();

}  // namespace relaybus::pg
