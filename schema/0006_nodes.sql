-- 0006_nodes.sql — the coordinator's node registry (issue #14, part B:
-- daemon/cluster/). One row per node that ever joined, kept when it goes
-- (state lost or left) so that a reconnect with the same node_uuid finds
-- its row again. This m6d itself is the row with role 'coordinator'.
-- Times are unix seconds; sizes bytes.

CREATE TABLE nodes (
  id                 INTEGER PRIMARY KEY AUTOINCREMENT,
  hostname           TEXT    NOT NULL UNIQUE,  -- unique: a second one is refused
  node_uuid          TEXT    NOT NULL UNIQUE,  -- the node's STATE_DIR/node-id
  role               TEXT    NOT NULL DEFAULT 'worker'
                     CHECK (role IN ('coordinator','worker')),
  backend            TEXT    NOT NULL,         -- cpu, cuda
  devices            INTEGER NOT NULL,
  memory             INTEGER NOT NULL,         -- host memory
  free_device_memory INTEGER NOT NULL,         -- latest heartbeat's
  state              TEXT    NOT NULL DEFAULT 'joining'
                     CHECK (state IN ('joining','live','lost','left')),
  run                INTEGER REFERENCES runs(id) ON DELETE SET NULL,  -- current run
  rank               INTEGER,                  -- its rank in that run
  address            TEXT,                     -- peer address it joined from
  detail             TEXT,                     -- why lost or left
  last_heartbeat     REAL    NOT NULL,
  joined             REAL    NOT NULL,
  updated            REAL    NOT NULL
);
CREATE INDEX nodes_state ON nodes(state, id);
