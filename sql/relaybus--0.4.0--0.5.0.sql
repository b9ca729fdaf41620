-- relaybus 0.4.0 -> 0.5.0 (docs/operations.md, "Changing the SQL").
--
-- relay.agent_reports: what each relaybus-agent reports of its work, read by
-- the managed SQL edition's relay.workers, relay.handler_stats and
-- relay.handler_metrics (docs/managed.md, "The agents' counters in the
-- views"). The extension's workers keep their counters in shared memory, so
-- with the extension it stays empty; it is here so that both editions keep
-- one catalog and one version (docs/managed.md, "Upgrades").
\echo Use "ALTER EXTENSION relaybus UPDATE TO '0.5.0'" to load this file. \quit

CREATE UNLOGGED TABLE relay.agent_reports (
    agent        text NOT NULL,
    handler      text NOT NULL,
    backend_pid  integer NOT NULL,
    started_at   timestamptz NOT NULL,
    reported_at  timestamptz NOT NULL,
    stale_after  timestamptz NOT NULL,
    counters     jsonb NOT NULL,
    PRIMARY KEY (agent, handler)
);
REVOKE ALL ON relay.agent_reports FROM PUBLIC;
