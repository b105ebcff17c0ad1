-- How many times a claim of the job ended with its lease run out and no outcome recorded: the
-- process running it died (or hung past its lease) mid-run. siwa.rescue_expired_jobs counts them
-- and discards the job at the third with the error `process_died`, so one job that kills every
-- worker that takes it (an endpoint whose answer crashes the process, say) stops being retried and
-- the other jobs run. `siwa jobs retry` starts the count again. A graceful hand-back at shutdown
-- does not count. A constant default: no table rewrite on a live database.
ALTER TABLE siwa.jobs ADD COLUMN expired_leases integer NOT NULL DEFAULT 0;
