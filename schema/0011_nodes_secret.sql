-- 0011_nodes_secret.sql — the credential that binds a worker to its node
-- id: the SHA-256 (hex) of the random secret the coordinator issued the
-- node at its first join (daemon/cluster/coordinator.h). A later join
-- with that node_uuid must present the secret. NULL for rows written
-- before this migration (the node's next join is issued one) and for the
-- coordinator's own row.
ALTER TABLE nodes ADD COLUMN secret_sha256 TEXT;
