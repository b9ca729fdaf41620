-- relaybus 0.3.0 -> 0.4.0 (docs/operations.md, "Changing the SQL").
--
-- Nothing of the extension's catalog changes: 0.4.0's library adds settings
-- (relaybus.otlp_endpoint, relaybus.otlp_headers) and behaviour, not SQL.
-- The version moves because the managed SQL edition's does
-- (relay._agent_notify gained the agent's poison isolation, and
-- relay._managed_version() records the edition's version), and the two
-- editions keep one version (docs/managed.md, "Upgrades").
\echo Use "ALTER EXTENSION relaybus UPDATE TO '0.4.0'" to load this file. \quit
