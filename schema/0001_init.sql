-- 0001_init.sql — m6d state: runs, their phase changes, per-step metrics,
-- events and checkpoints. Applied once, in a transaction, by
-- daemon/state/state.c; PRAGMA user_version records the last applied file.
-- Times are unix seconds (REAL). m6d is the only writer; readers welcome.

CREATE TABLE runs (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  name        TEXT    NOT NULL,
  spec        TEXT    NOT NULL,            -- canonical spec JSON
  state       TEXT    NOT NULL DEFAULT 'queued'
              CHECK (state IN ('queued','running','paused','completed','failed','stopped')),
  phase       TEXT    NOT NULL DEFAULT 'pseudo'
              CHECK (phase IN ('pseudo','real')),
  step        INTEGER NOT NULL DEFAULT 0,   -- optimizer steps done
  total_steps INTEGER NOT NULL,
  created     REAL    NOT NULL,
  updated     REAL    NOT NULL,
  error       TEXT                          -- why it failed
);
CREATE INDEX runs_state ON runs(state, id);

-- One row per phase entered: (pseudo, 0) at start, (real, N) at delink.
CREATE TABLE phases (
  run       INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  phase     TEXT    NOT NULL CHECK (phase IN ('pseudo','real')),
  from_step INTEGER NOT NULL,
  at        REAL    NOT NULL,
  PRIMARY KEY (run, phase)
);

CREATE TABLE metrics (
  run          INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step         INTEGER NOT NULL,
  phase        TEXT    NOT NULL,
  train_loss   REAL,
  val_loss     REAL,                        -- NULL when no eval ran
  lr           REAL,
  tokens_per_s REAL,
  grad_norm    REAL,
  PRIMARY KEY (run, step)
);

CREATE TABLE events (
  id     INTEGER PRIMARY KEY AUTOINCREMENT,
  run    INTEGER REFERENCES runs(id) ON DELETE CASCADE,  -- NULL: daemon-wide
  time   REAL    NOT NULL,
  kind   TEXT    NOT NULL,                  -- submit, start, delink, pause, ...
  detail TEXT
);
CREATE INDEX events_run ON events(run, id);

CREATE TABLE checkpoints (
  run   INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
  step  INTEGER NOT NULL,
  path  TEXT    NOT NULL,
  bytes INTEGER NOT NULL,
  at    REAL    NOT NULL,
  PRIMARY KEY (run, step)
);
