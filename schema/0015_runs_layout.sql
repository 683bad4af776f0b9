-- 0015_runs_layout.sql — the layout a run trains at, beside the summary of
-- 0009: nodes.world_size (ranks) and nodes.expert_parallel (the ranks
-- its experts are split over), stored at submit and rewritten when
-- `m6ctl resume RUN --world-size N` changes them. Rows from before this
-- migration keep NULL: the daemon reads both from the row's spec.
ALTER TABLE runs ADD COLUMN world_size INTEGER;
ALTER TABLE runs ADD COLUMN expert_parallel INTEGER;
