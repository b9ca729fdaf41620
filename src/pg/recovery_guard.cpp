#include "pg/recovery_guard.hpp"

#include "pg/pg_includes.hpp"

extern "C" {
#include "access/xlog.h"
}

namespace relaybus::pg {

void refuse_during_recovery(const char* function) {
  if (!RecoveryInProgress()) return;
  ereport(ERROR,
          (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION), errmsg("cannot execute %s on a server in recovery", function),
           errdetail("Deliveries are handed over and completed on the primary only: a lease taken on a "
                     "standby is unknown to the primary."),
           errhint("Connect to the primary, e.g. with target_session_attrs=read-write.")));
}

}  // namespace relaybus::pg
