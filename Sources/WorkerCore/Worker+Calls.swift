import JobQueue
import Postgres
import Locking
import Logging
import Metrics

// The worker's Apple-calling kinds: claims up to SIWA_CONCURRENCY jobs and runs their handlers.
extension Worker {
    func dispatchLoop() async {
        await withDiscardingTaskGroup { group in
            while !stopping {
                let free = configuration.concurrency - state.withLock { $0.inFlight.count }
                if free > 0 {
                    do {
                        let jobs = try await queue.claim(
                            worker: configuration.workerID, limit: free, lease: configuration.jobLease)
                        if !jobs.isEmpty {
                            state.withLock { state in for job in jobs { state.inFlight[job.id] = job } }
                            metrics.inFlight.set(Double(state.withLock { $0.inFlight.count }))
                        }
                        for job in jobs {
                            metrics[job.kind].claimed.increment()
                            group.addTask { await self.execute(job) }
                        }
                    } catch {
                        logger.error("siwa-worker claim failed", metadata: ["error": "\(error)"])
                        await maintenanceBellFreeSleep(.seconds(1))
                        continue
                    }
                }
                if stopping { break }
                // A full claim may leave more due jobs: go again as soon as a slot frees (the bell).
                await callBell.wait(timeout: configuration.pollInterval)
            }
            // Shutdown: no more claims; give in-flight jobs the grace period, then hand them back.
            let deadline = ContinuousClock.now + configuration.shutdownGrace
            while state.withLock({ !$0.inFlight.isEmpty }), ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(20))
            }
            let leftover = state.withLock { Array($0.inFlight.values) }
            if !leftover.isEmpty {
                let released = (try? await queue.release(leftover)) ?? 0
                logger.warning(
                    "siwa-worker released unfinished jobs at shutdown",
                    metadata: ["count": .int(leftover.count), "released": .int(released)])
                group.cancelAll()
            }
        }
    }

    func execute(_ job: Job) async {
        let jobLogger = logger.with([
            "job_id": .int(Int(job.id)), "kind": .string(job.kind.rawValue), "client_id": .string(job.clientID),
        ])
        let action: JobAction
        if let handler = handlers[job.kind] {
            let result = await handler.run(job, logger: jobLogger)
            action = JobLifecycle.decide(result)
        } else {
            jobLogger.error(
                "siwa-worker has no handler for this job kind; snoozing it (never dropped)",
                metadata: ["snooze_seconds": .int(Int(JobLifecycle.unhandledKindSnooze.components.seconds))])
            action = JobLifecycle.unhandled(job)
        }
        do {
            // The handler's work is done (an Apple call may have been made): keep the result through a
            // failover rather than let the lease expire and the call run again. Within the lease the
            // job stays ours; the write is fenced, so repeating it is harmless.
            let written = try await retryingConnectionProblems(
                for: configuration.jobLease, operation: "record job result", logger: jobLogger
            ) { try await queue.apply(action, to: job, policy: policy) }
            if let written {
                // Counted as the database wrote it: siwa.job_retry decides a failure's retry or discard.
                metrics.count(written, kind: job.kind)
                switch (written, action) {
                case (.retried(let delay), .fail(let error, _)):
                    jobLogger.warning(
                        "siwa-worker job failed; retrying",
                        metadata: ["error": .string(error), "retry_in_seconds": .double(delay.seconds)])
                case (.discarded, .fail(let error, _)), (.discarded, .discard(let error)):
                    jobLogger.error("siwa-worker job discarded", metadata: ["error": .string(error)])
                default:
                    jobLogger.debug("siwa-worker job finished")
                }
            } else {
                jobLogger.warning("siwa-worker lost the job's lease; its result is dropped (another run owns it)")
            }
        } catch {
            jobLogger.error("siwa-worker could not record a job's result; its lease will expire", metadata: ["error": "\(error)"])
        }
        let count = state.withLock { state in
            state.inFlight[job.id] = nil
            return state.inFlight.count
        }
        metrics.inFlight.set(Double(count))
        callBell.ring()
    }
}
