-- 0004_runs_delink_step.sql — the step at which a run delinked, stored once
-- by the coordinator when the delink happens; NULL: never delinked (still
-- in the pseudo phase, or trained from scratch with pseudo.steps 0, which
-- starts in the real phase and has nothing to delink).
ALTER TABLE runs ADD COLUMN delink_step INTEGER;

-- Runs that delinked before this column: the real phase's first step, for
-- runs that really had a pseudo phase (a from-scratch run has only its
-- real row, at step 0) and are in the real phase now.
UPDATE runs SET delink_step =
    (SELECT from_step FROM phases WHERE run = runs.id AND phase = 'real')
  WHERE phase = 'real'
    AND EXISTS (SELECT 1 FROM phases WHERE run = runs.id AND phase = 'pseudo')
    AND EXISTS (SELECT 1 FROM phases WHERE run = runs.id AND phase = 'real');
