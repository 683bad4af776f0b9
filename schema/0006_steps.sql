-- 0006_steps.sql — non-finite steps (issue 16 item 5): a step whose loss or
-- gradient norm was NaN or Inf is recorded with its row like any other, its
-- update skipped. 0 in rows written before this migration (NULL reads 0).

ALTER TABLE metrics ADD COLUMN skipped INTEGER;        -- 1: the update was skipped
ALTER TABLE metrics ADD COLUMN skipped_total INTEGER;  -- the run's skipped steps up to this one
