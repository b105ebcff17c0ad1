import Postgres
import Testing
import WorkerCore

@Suite("Job wake-ups")
struct JobWakeUpTests {
    func wakeUp(_ payloads: String...) -> JobWakeUp {
        JobWakeUp(payloads.map { PostgresNotification(channel: "siwa_jobs", payload: $0, pid: 1) })
    }

    @Test func eachLoopIsWokenOnlyForItsOwnKindOfJob() {
        #expect(wakeUp("12") == JobWakeUp(notificationJobs: 12))
        #expect(wakeUp("0 calls") == JobWakeUp(calls: true))
        #expect(wakeUp("0 webhooks") == JobWakeUp(webhooks: true))
        #expect(wakeUp("3 calls webhooks") == JobWakeUp(notificationJobs: 3, calls: true, webhooks: true))
        #expect(wakeUp("2", "0 webhooks", "5") == JobWakeUp(notificationJobs: 7, webhooks: true))
        #expect(wakeUp() == JobWakeUp())
    }

    /// A payload it cannot read (a newer release's, a hand-sent NOTIFY) wakes every loop, as every
    /// NOTIFY did before payloads named their kinds: a missed wake-up costs a poll interval.
    @Test func anUnreadablePayloadWakesEveryLoop() {
        let everything = JobWakeUp(notificationJobs: 1, calls: true, webhooks: true)
        for payload in ["", "soon", "-3", "4 deliveries", "calls 3", "9999999999999999999999"] {
            #expect(wakeUp(payload) == everything, "\(payload)")
        }
        #expect(wakeUp("4", "later") == JobWakeUp(notificationJobs: 5, calls: true, webhooks: true))
    }
}
