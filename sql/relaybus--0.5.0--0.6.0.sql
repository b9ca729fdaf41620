-- relaybus 0.5.0 -> 0.6.0 (docs/operations.md, "Changing the SQL").
--
-- Nothing of the extension's catalog changes. The version moves because the
-- managed SQL edition's does (relay_claim of an ack-mode notify handler takes
-- over the leases of NOTIFYs nobody acked, as the extension's always did:
-- relay._claim_handler gained the arguments for it), and the two editions
-- keep one version (docs/managed.md, "Upgrades").
\echo Use "ALTER EXTENSION relaybus UPDATE TO '0.6.0'" to load this file. \quit
