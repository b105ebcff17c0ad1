import Accounts
import Foundation
import SiwaModel

/// The one sentence at the top of an account's page: where it stands and, when something is
/// stuck, why and what happens next ("deletion requested 3 h ago; revoke failing: Apple answered
/// 503 five times; next try in 4 min").
struct AccountStanding {
    struct Pause {
        var reason: String
        var nextProbeSeconds: Double
    }

    var account: AccountRecord
    var timeline: AccountTimeline
    var pause: Pause?
    var now: Date

    var sentence: String {
        var parts = [statusPart]
        if account.status == .pendingDeletion { parts += deletionParts }
        if account.status == .active, let exchange = openJob("exchange"), !exchange.attempts.isEmpty {
            parts.append("code exchange failing: " + failureSummary(exchange) + "; " + nextTry(exchange))
        }
        if let webhooks = webhookPart { parts.append(webhooks) }
        return parts.joined(separator: "; ")
    }

    private var statusPart: String {
        switch account.status {
        case .pendingDeletion:
            let requested = timeline.changes.first { $0.change == "deletion_requested" }?.createdAt
                ?? timeline.jobs.filter { $0.kind == "revoke" }.map(\.createdAt).min()
            return "deletion requested " + (requested.map { Ages.ago($0, now: now) } ?? "(time unknown)")
        case .deleted:
            let deleted = timeline.changes.first { $0.change == "deleted" }
            let when = deleted.map { " " + Ages.ago($0.createdAt, now: now) } ?? ""
            switch deleted?.reason {
            case "revoked": return "deleted\(when): Apple accepted the revoke"
            case "no_token":
                return "deleted\(when) with no token to revoke: the user should stop using Sign in with Apple for the app in Settings"
            default: return "deleted\(when)"
            }
        case .active:
            let linked = account.linkedAt.map { ", linked " + Ages.ago($0, now: now) } ?? ""
            return "active\(linked); " + (account.hasRefreshToken ? "a refresh token is held" : "no refresh token held")
        case .consentRevoked:
            return "the user stopped using Sign in with Apple for the app "
                + Ages.ago(account.sessionsRevokedAt ?? account.updatedAt, now: now) + "; sessions ended"
        case .appleAccountDeleted:
            return "the user deleted their Apple account " + Ages.ago(account.sessionsRevokedAt ?? account.updatedAt, now: now)
                + "; sessions ended, token discarded"
        }
    }

    /// What the pending deletion waits for.
    private var deletionParts: [String] {
        if let exchange = openJob("exchange") {
            return ["waiting for a code exchange queued before it (job #\(exchange.id))"]
        }
        guard let revoke = openJob("revoke") else {
            let last = timeline.jobs.first { $0.kind == "revoke" }
            switch last?.state {
            case "discarded":
                return ["revoke discarded after \(Ages.times(last!.attempts.count)) (\(lastError(last!))): retry job #\(last!.id)"]
            case "cancelled":
                return ["revoke cancelled by an operator: call siwa.request_deletion again to queue one"]
            default:
                return ["no revoke queued"]
            }
        }
        var parts: [String] = []
        if revoke.attempts.isEmpty {
            parts.append(revoke.state == "running" ? "revoke being sent to Apple now" : "revoke queued, " + nextTry(revoke))
        } else {
            parts.append("revoke failing: " + failureSummary(revoke))
            parts.append(nextTry(revoke))
        }
        if let pause {
            parts.append(
                "calls for \(account.clientID) paused (\(pause.reason): Apple refused our credentials), "
                    + "next probe in \(Ages.span(max(0, pause.nextProbeSeconds)))")
        }
        return parts
    }

    private func openJob(_ kind: String) -> AccountTimeline.Job? {
        timeline.jobs.first { $0.kind == kind && ($0.state == "available" || $0.state == "running") }
    }

    /// "Apple answered 503 five times": the last error and how many attempts in a row ended so.
    private func failureSummary(_ job: AccountTimeline.Job) -> String {
        let last = job.attempts.last?.error ?? ""
        let repeated = job.attempts.reversed().prefix { $0.error == last }.count
        let summary = "\(Self.describe(last)) \(Ages.times(repeated))"
        let others = job.attempts.count - repeated
        return others > 0 ? summary + " (and \(others) earlier failure\(others == 1 ? "" : "s"))" : summary
    }

    private func lastError(_ job: AccountTimeline.Job) -> String { Self.describe(job.attempts.last?.error ?? "no error recorded") }

    private func nextTry(_ job: AccountTimeline.Job) -> String {
        if job.state == "running" { return "being tried now" }
        if job.runsInSeconds > 0 { return "next try in \(Ages.span(job.runsInSeconds))" }
        return "due now, waiting for a worker"
    }

    /// Job error codes in words; unknown codes as they are.
    static func describe(_ error: String) -> String {
        if error.hasPrefix("http_"), let status = Int(error.dropFirst(5)) { return "Apple answered \(status)" }
        if error.hasPrefix("apple_"), let status = Int(error.dropFirst(6).prefix(3)) { return "Apple refused it (\(status))" }
        switch error {
        case "rate_limited": return "Apple asked us to slow down (429)"
        case "timeout", "timed_out": return "Apple did not answer in time"
        case "connection", "connect", "connection_failed": return "Apple could not be reached"
        case "invalid_grant": return "Apple refused the code or token: used, expired, or its grant ended"
        case "invalid_client": return "Apple refused our credentials (Team ID, Key ID or key)"
        case "token_undecryptable": return "the stored token cannot be opened with SIWA_TOKEN_KEYS"
        case "token_response_incomplete": return "Apple's answer lacked the token"
        default: return error
        }
    }

    private var webhookPart: String? {
        let deliveries = timeline.jobs.filter { $0.kind == "webhook" }
        if let discarded = deliveries.first(where: { $0.state == "discarded" }) {
            return "a webhook delivery (job #\(discarded.id)) was discarded and holds this account's later changes back"
        }
        let waiting = deliveries.filter { $0.state == "available" || $0.state == "running" }
        guard !waiting.isEmpty else { return nil }
        return "\(waiting.count) change\(waiting.count == 1 ? "" : "s") not yet delivered to the app's webhook"
    }
}

/// Ages and spans in words a person reads at a glance.
enum Ages {
    /// `12 s`, `4 min`, `3 h`, `2 days`.
    static func span(_ seconds: Double) -> String {
        let total = Int(seconds.rounded())
        switch total {
        case ..<60: return "\(max(0, total)) s"
        case ..<3600: return "\(total / 60) min"
        case ..<(2 * 86_400): return "\(total / 3600) h"
        default: return "\(total / 86_400) days"
        }
    }

    static func ago(_ date: Date, now: Date) -> String { span(now.timeIntervalSince(date)) + " ago" }

    /// `once`, `twice`, `five times`, `12 times`.
    static func times(_ count: Int) -> String {
        let words = ["no times", "once", "twice", "three times", "four times", "five times", "six times", "seven times",
                     "eight times", "nine times", "ten times"]
        return count < words.count ? words[max(0, count)] : "\(count) times"
    }

    /// `2026-12-01 21:04:05 UTC`.
    static func timestamp(_ date: Date) -> String {
        if date == .distantFuture { return "held (no time set)" }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd HH:mm:ss 'UTC'"
        return formatter.string(from: date)
    }
}
