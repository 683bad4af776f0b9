-- 0017_runs_spec_before.sql — a resume at another layout or budget
-- (m6ctl resume --world-size / --memory-budget) writes the run's new spec
-- before the resume is tried, and keeps the spec it replaced here until
-- the resume is answered: taken (NULL again) or refused (put back). A row
-- whose spec_before is set when m6d starts was left by an m6d that
-- stopped in between, with no answer given: it keeps the new spec where
-- the resume was recorded in the command log (replayed), else gets the
-- old one back.
ALTER TABLE runs ADD COLUMN spec_before TEXT;
