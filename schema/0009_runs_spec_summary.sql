-- 0009_runs_spec_summary.sql — the four spec fields `m6ctl list` and
-- `status` show, stored at submit so that they read columns instead of
-- parsing every run's spec: pseudo.steps, device.memory_budget (bytes;
-- 0: no budget), device.backend ('cpu' or 'cuda') and delink.policy
-- ('step' or 'plateau'). Rows submitted before this migration keep NULL
-- here: the daemon reads those four from the row's spec instead (the
-- stored spec is the only place they are written down, and sizes such as
-- "2GiB" are not something SQL can parse).
ALTER TABLE runs ADD COLUMN pseudo_steps INTEGER;
ALTER TABLE runs ADD COLUMN device_budget INTEGER;
ALTER TABLE runs ADD COLUMN backend TEXT;
ALTER TABLE runs ADD COLUMN delink_policy TEXT;
