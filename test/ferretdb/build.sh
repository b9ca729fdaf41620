#!/usr/bin/env bash
# Builds test/ferretdb/bin/ferretdb-test (FerretDB v1.24.2, embeddable package,
# SQLite backend) once, cached in ${RELAYBUS_CACHE:-~/.cache/relaybus}/ferretdb-<hash>
# (test/go_cached_build.sh). The first build takes a few minutes.
exec bash "$(dirname "$0")/../go_cached_build.sh" "$(dirname "$0")" ferretdb-test ferretdb
