-- 0007_steps.sql — non-finite steps (issue 16 item 5): a step whose loss or
-- gradient norm was NaN or Inf is recorded with its row like any other, its
-- update skipped. 0 in rows written before this migration (NULL reads 0).

ALTER TABLE metrics ADD COLUMN skipped INTEGER;        -- 1: the update was skipped
ALTER TABLE metrics ADD COLUMN skipped_total INTEGER;  -- the run's skipped steps up to this one

-- The command log (issue 16 item 7): every command m6d acknowledges (pause,
-- resume, delink, stop, submit) is a row here, written and synced before
-- the reply. pending: acknowledged, not yet applied at a step boundary
-- (m6d re-applies pending commands when it takes the run up again);
-- applied: done (or found to have nothing left to do), at step.
CREATE TABLE commands (
    id INTEGER PRIMARY KEY,
    run INTEGER NOT NULL REFERENCES runs(id),
    kind TEXT NOT NULL CHECK (kind IN ('pause', 'resume', 'delink', 'stop',
                                       'submit')),
    state TEXT NOT NULL CHECK (state IN ('pending', 'applied')),
    created REAL NOT NULL,   -- unix seconds
    applied REAL,            -- unix seconds, NULL while pending
    step INTEGER             -- the run's step when applied
);
CREATE INDEX commands_run_state ON commands(run, state, id);
