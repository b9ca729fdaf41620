-- relaybus 0.1.0 -> 0.2.0. CREATE EXTENSION runs relaybus--0.1.0.sql and then
-- this script, so every install exercises the upgrade path (docs/operations.md).
\echo Use "ALTER EXTENSION relaybus UPDATE TO '0.2.0'" to load this file. \quit
