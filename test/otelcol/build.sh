#!/usr/bin/env bash
# Builds test/otelcol/bin/otelcol-test (the OpenTelemetry Collector with the
# otlp receiver and the contrib file exporter, core v0.161.0 / v1.67.0,
# contrib v0.161.0: main.go) once, cached in
# ${RELAYBUS_CACHE:-~/.cache/relaybus}/otelcol-<hash> (test/go_cached_build.sh).
# The first build takes several minutes.
exec bash "$(dirname "$0")/../go_cached_build.sh" "$(dirname "$0")" otelcol-test otelcol
