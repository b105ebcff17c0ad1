import AppleClient
import FakeApple
import Foundation
import Postgres
import StoredTokens

/// The invariants a quiescent account must satisfy, whatever the order of what happened to it.
extension ModelRun {
    private struct Change {
        var id: Int64
        var change: String
        var status: String?
        var reason: String?
        var notificationJTI: String?
        var appUserID: String?
    }

    private struct StoredNotification {
        var jti: String
        var type: String
        var eventTime: Date
        var processed: Bool
    }

    func check() async throws {
        let account = try await connection.query(
            """
            SELECT status, email_forwarding, linked_at, refresh_token_enc IS NOT NULL AS has_token
              FROM siwa.accounts WHERE client_id = \(clientID) AND sub = \(sub)
            """
        ).first.map {
            (
                status: try $0.decode(String.self, column: "status"),
                forwarding: try $0.decode(String?.self, column: "email_forwarding"),
                linkedAt: try $0.decode(Date?.self, column: "linked_at"), hasToken: try $0.decode(Bool.self, column: "has_token")
            )
        }
        let changes = try await connection.query(
            """
            SELECT id, change, status, reason, notification_jti, app_user_id FROM siwa.account_changes
             WHERE client_id = \(clientID) AND sub = \(sub) ORDER BY id
            """
        ).map {
            Change(
                id: try $0.decode(Int64.self, column: "id"), change: try $0.decode(String.self, column: "change"),
                status: try $0.decode(String?.self, column: "status"), reason: try $0.decode(String?.self, column: "reason"),
                notificationJTI: try $0.decode(String?.self, column: "notification_jti"),
                appUserID: try $0.decode(String?.self, column: "app_user_id"))
        }
        let notifications = try await connection.query(
            """
            SELECT jti, event_type, event_time, processed_at IS NOT NULL AS processed FROM siwa.notifications
             WHERE client_id = \(notificationClientID) AND sub = \(sub) ORDER BY event_time, jti
            """
        ).map {
            StoredNotification(
                jti: try $0.decode(String.self, column: "jti"), type: try $0.decode(String.self, column: "event_type"),
                eventTime: try $0.decode(Date.self, column: "event_time"), processed: try $0.decode(Bool.self, column: "processed"))
        }
        let jobs = try await connection.query(
            """
            SELECT id, kind, state, outcome, notification_jti,
                   coalesce((SELECT string_agg(coalesce(e->>'error', e #>> '{}'), ',') FROM jsonb_array_elements(errors) e), '')
                       AS errors
              FROM siwa.jobs WHERE client_id IN (\(clientID), \(notificationClientID)) ORDER BY id
            """
        ).map {
            (
                id: try $0.decode(Int64.self, column: "id"), kind: try $0.decode(String.self, column: "kind"),
                state: try $0.decode(String.self, column: "state"), outcome: try $0.decode(String?.self, column: "outcome"),
                jti: try $0.decode(String?.self, column: "notification_jti"),
                errors: "[" + (try $0.decode(String.self, column: "errors")) + "]"
            )
        }
        let tokens = world.fake.issuedTokens(clientID: clientID, sub: sub)
        trace.append(
            "end: account \(account?.status ?? "absent"); changes told to the app: "
                + changes.map { "\($0.change)→\($0.status ?? "-")" + ($0.reason.map { " (\($0))" } ?? "") }.joined(separator: ", "))
        let status = account?.status
        exercised["account ended \(status ?? "absent")", default: 0] += 1

        // Every requested deletion ends deleted.
        if status == "pending_deletion" {
            violations.append(.init(.deletionEndsDeleted, "pending_deletion at quiescence", "the account never left pending_deletion"))
        }
        if let last = committed.lastIndex(where: \.call.isDeletion),
            !committed[(last + 1)...].contains(where: { $0.call.isLink }), status != "deleted"
        {
            violations.append(
                .init(
                    .deletionEndsDeleted, "ends \(status ?? "without a row") with no link after the deletion",
                    "the last app call to commit was a deletion; the account ends \(status ?? "without a row")"))
        }
        for call in committed where call.call.isDeletion && call.statusBefore != "deleted" {
            if !changes.contains(where: { $0.change == "deleted" && $0.id > call.changeMark }) {
                violations.append(
                    .init(
                        .deletionEndsDeleted, "no deleted change after the request",
                        "request_deletion committed (change mark \(call.changeMark)) but no `deleted` change follows it"))
            }
        }

        // No refresh token outlives a deletion unrevoked: every token from a code given before a
        // committed deletion (the deletion's own included) is dead at Apple by the end. Unless the
        // account lives again after that deletion and holds the token: a sign-in that read the
        // account before the deletion can obtain its token after the deletion finished and a new
        // life began; revoking it then would end the new life's grant at Apple too (a revoke ends
        // the user's authorization, not one token), so the account keeps it for its next deletion.
        let heldAtEnd = try await heldTokens()
        for (position, call) in committed.enumerated() where call.call.isDeletion {
            let codes = Set(committed[...position].compactMap(\.code))
            let livesAgain = status != "deleted" && committed[(position + 1)...].contains(where: \.call.isLink)
            for token in tokens where token.code.map(codes.contains) == true && !token.dead {
                if livesAgain && heldAtEnd.contains(token.token) { continue }
                violations.append(
                    .init(
                        .tokensRevoked,
                        "token from a code before the deletion still live at Apple ("
                            + (everStored.contains(token.token) ? "it was stored)" : "never stored)"),
                        "a token issued \(token.issuedAt) (stored by us: \(everStored.contains(token.token))) was never revoked; account ends \(status ?? "-")"
                    ))
            }
        }
        // ...nor can a later deletion revoke a token the account no longer holds: one that was
        // replaced or discarded must be dead at Apple.
        let held = heldAtEnd
        for token in tokens where everStored.contains(token.token) && !held.contains(token.token) && !token.dead {
            violations.append(
                .init(
                    .tokensRevoked, "stored token dropped while live at Apple (by the \(dropped[token.token] ?? "?"))",
                    "a token issued \(token.issuedAt) was stored, then replaced or discarded unrevoked; account ends \(status ?? "-")"))
        }
        // An account that ends deleted has no live grant at Apple: whatever issued a token (a code
        // before the deletion, a late exchange, a sign-in that lost to it), it was revoked.
        if status == "deleted" {
            for token in tokens where !token.dead {
                violations.append(
                    .init(
                        .tokensRevoked, "deleted account with a live token at Apple",
                        "a token issued \(token.issuedAt) (stored by us: \(everStored.contains(token.token))) is live; the account ends deleted"))
            }
        }
        if status == "deleted", account?.hasToken == true {
            violations.append(.init(.tokensRevoked, "deleted account keeps a token", "refresh_token_enc is set on a deleted account"))
        }
        for change in changes where change.change == "deleted" && !["revoked", "no_token"].contains(change.reason ?? "") {
            violations.append(
                .init(.tokensRevoked, "deleted change reason \(change.reason ?? "NULL")", "change \(change.id) reason \(change.reason ?? "NULL")"))
        }

        // A successful exchange is never lost: each token Apple issued was stored, or is dead.
        for token in tokens where !token.dead && !everStored.contains(token.token) {
            let job = committed.first { $0.code != nil && $0.code == token.code }.flatMap { call in jobs.first { $0.id == call.jobID } }
            let ended = job.map {
                "\($0.kind) job ended \($0.outcome ?? $0.state)"
                    + ($0.errors.contains("database_error") ? " after a database error" : " with no local error recorded")
            } ?? "no job"
            violations.append(
                .init(
                    .exchangeNeverLost, "token issued by Apple neither stored nor revoked (\(ended))",
                    "a token issued \(token.issuedAt) was never stored and is live at Apple"))
        }

        checkChanges(changes, notifications: notifications, finalStatus: status)

        // After `deleted` or `apple_account_deleted` the account forgets who it was: no later change
        // row, and not the account itself, carries an app_user_id of a life that ended so.
        var forgotten: Set<String> = []
        var lives: Set<String> = []
        for change in changes {
            if let id = change.appUserID, forgotten.contains(id) {
                violations.append(
                    .init(.forgotten, "\(change.change) after a deletion carries the old app_user_id", "change \(change.id)"))
            }
            if let id = change.appUserID { lives.insert(id) }
            // The account reached it (an account-deleted while a deletion is pending leaves it pending).
            if change.status == "deleted" || change.status == "apple_account_deleted" {
                forgotten.formUnion(lives)
                lives = []
            }
        }
        let appUserID = try await connection.query(
            "SELECT app_user_id FROM siwa.accounts WHERE client_id = \(clientID) AND sub = \(sub)"
        ).first?.decode(String?.self, at: 0)
        if let appUserID, forgotten.contains(appUserID) {
            violations.append(.init(.forgotten, "the account holds an app_user_id of a deleted life", "status \(status ?? "-")"))
        }
        if status == "deleted" || status == "apple_account_deleted", appUserID != nil {
            violations.append(.init(.forgotten, "\(status ?? "") account keeps its app_user_id", "app_user_id is set"))
        }

        if grouped { try await checkGroupDeletion() }

        // No notification applied twice, and every one processed by exactly one completed job.
        for (jti, count) in Dictionary(grouping: changes.compactMap(\.notificationJTI), by: { $0 }).mapValues(\.count) where count > 1 {
            violations.append(.init(.notificationOnce, "notification with \(count) changes", "\(jti) has \(count) change rows"))
        }
        for notification in notifications {
            let mine = jobs.filter { $0.jti == notification.jti }
            if !notification.processed || mine.count != 1 || mine.first?.state != "completed" {
                violations.append(
                    .init(
                        .notificationOnce, "notification not processed exactly once",
                        "\(notification.jti): processed \(notification.processed), jobs \(mine.map(\.state))"))
            }
        }

        // Email forwarding ends at the newest email event of the account's current life.
        if let account, ["active", "consent_revoked"].contains(account.status) {
            let current = notifications.filter { notification in
                notification.type.hasPrefix("email-") && account.linkedAt.map { notification.eventTime >= $0 } ?? true
            }
            if let newest = current.last, current.filter({ $0.eventTime == newest.eventTime }).count == 1 {
                let expected = newest.type == "email-enabled" ? "enabled" : "disabled"
                if account.forwarding != expected {
                    violations.append(
                        .init(
                            .emailNewest, "forwarding not at the newest event",
                            "newest email event \(newest.jti) is \(newest.type); forwarding is \(account.forwarding ?? "NULL")"))
                }
            }
        }

        // Apple's consent-revoked and account-deleted end the account's life: an account still active
        // at the end has seen none newer than its link (with an app group: whatever the `aud`).
        if let account, account.status == "active" {
            for notification in notifications
            where ["consent-revoked", "account-deleted"].contains(notification.type)
                && account.linkedAt.map({ notification.eventTime >= $0 }) ?? true
            {
                violations.append(
                    .init(
                        .endingEventsApply, "active after a newer \(notification.type)",
                        "\(notification.jti) (\(notification.type)) is newer than the link, yet the account ends active"))
            }
        }

        // A returning user's grant is held: after a sign-in with a code that Apple exchanged, an
        // account still active holds a token Apple has not ended, unless the user ended their
        // grants after that sign-in (a consent-revoked sent before it but delivered after ends
        // only the grants older than the sign-in's).
        if status == "active", account?.hasToken == true, let signedIn = lastExchangedSignIn,
            !grantEnds.contains(where: { $0 > signedIn }), let current = try await currentToken(),
            tokens.first(where: { $0.token == current })?.dead == true
        {
            violations.append(
                .init(
                    .grantHeld, "active with an ended token after a sign-in with a code",
                    "the account's current token was ended at Apple before the last sign-in, whose code gave a live grant"))
        }

        for job in jobs where job.state == "discarded" {
            violations.append(.init(.quiescence, "\(job.kind) job discarded", "job \(job.id) was discarded"))
        }
    }

    /// The change rows tell a story the account could have lived: each status fits its change,
    /// a deletion once requested is never undone before it completes, `deleted` is only left by a
    /// new link and only notifications no older than the last applied one change the email
    /// forwarding, and the last row says the status the account has.
    private func checkChanges(_ changes: [Change], notifications: [StoredNotification], finalStatus: String?) {
        let allowed: [String: Set<String>] = [
            "linked": ["active", "pending_deletion"], "deletion_requested": ["pending_deletion"], "deleted": ["deleted"],
            "consent_revoked": ["consent_revoked", "pending_deletion"],
            "apple_account_deleted": ["apple_account_deleted", "pending_deletion"],
            "email_enabled": ["active", "consent_revoked"], "email_disabled": ["active", "consent_revoked"],
        ]
        let eventTimes = Dictionary(notifications.map { ($0.jti, $0.eventTime) }, uniquingKeysWith: { first, _ in first })
        var deletionOpen = false
        var deleted = false
        var lastEmailEvent: Date?
        for change in changes {
            if let statuses = allowed[change.change], !statuses.contains(change.status ?? "") {
                violations.append(
                    .init(
                        .causalChanges, "\(change.change) with status \(change.status ?? "NULL")",
                        "change \(change.id): \(change.change) leaves the account \(change.status ?? "NULL")"))
            }
            let newLife = change.change == "linked" && change.status == "active"
            if newLife { lastEmailEvent = nil }
            if deleted && !newLife && change.notificationJTI != nil {
                violations.append(
                    .init(
                        .deletedStaysDeleted, "\(change.change) applied to a deleted account",
                        "change \(change.id) (\(change.notificationJTI ?? "")) after `deleted`"))
            }
            if deletionOpen && change.status == "active" {
                violations.append(
                    .init(
                        .deletionEndsDeleted, "deletion undone: \(change.change) sets active",
                        "change \(change.id): \(change.change) sets active before the requested deletion completed"))
                deletionOpen = false
            }
            switch change.change {
            case "deletion_requested":
                deletionOpen = true
                deleted = false
            case "deleted":
                if !deletionOpen {
                    violations.append(
                        .init(.causalChanges, "deleted without a request", "change \(change.id): deleted with no deletion_requested before it"))
                }
                deletionOpen = false
                deleted = true
            case "email_enabled", "email_disabled":
                if let jti = change.notificationJTI, let time = eventTimes[jti] {
                    if let last = lastEmailEvent, time < last {
                        violations.append(
                            .init(.causalChanges, "older email event applied after a newer one", "change \(change.id) (\(jti))"))
                    }
                    lastEmailEvent = max(lastEmailEvent ?? time, time)
                }
            default:
                if newLife { deleted = false }
            }
        }
        if let last = changes.last(where: { $0.status != nil }), let finalStatus, last.status != finalStatus {
            violations.append(
                .init(
                    .causalChanges, "last change says \(last.status ?? "") but the account is \(finalStatus)",
                    "change \(last.id) (\(last.change)) says \(last.status ?? ""); the account is \(finalStatus)"))
        }
    }
}

extension ModelRun {
    /// A deletion requested under one client ID of the group covers the account under the other:
    /// the one the user had there when the deletion committed ends deleted unless linked again
    /// since, and no token of a code given under it before that deletion is live at Apple.
    func checkGroupDeletion() async throws {
        let other = notificationClientID
        let status = try await self.status(of: other)
        let tokens = world.fake.issuedTokens(clientID: other, sub: sub)
        let held = try await heldTokens(of: other)
        for (position, call) in committed.enumerated() where call.call.isDeletion {
            let linkedAgain = committed[(position + 1)...].contains(where: \.call.isLink)
            if let before = call.otherStatusBefore, before != "deleted", !linkedAgain, status != "deleted" {
                violations.append(
                    .init(
                        .groupDeletion, "the group's other account ends \(status ?? "absent")",
                        "it was \(before) when the deletion committed under \(clientID)"))
            }
            let codes = Set(committed[...position].filter { $0.call == .linkInGroup }.compactMap(\.code))
            for token in tokens where token.code.map(codes.contains) == true && !token.dead {
                if linkedAgain && status != "deleted" && held.contains(token.token) { continue }
                violations.append(
                    .init(
                        .groupDeletion, "a token of the group's other client ID outlives the deletion",
                        "a token issued \(token.issuedAt) under \(other) is live; that account ends \(status ?? "absent")"))
            }
        }
        if status == "deleted" {
            for token in tokens where !token.dead {
                violations.append(
                    .init(.groupDeletion, "the group's other account is deleted with a live token", "issued \(token.issuedAt)"))
            }
        }
    }

    /// The account's current refresh token, decrypted.
    func currentToken() async throws -> String? {
        let sealed = try await connection.query(
            "SELECT refresh_token_enc FROM siwa.accounts WHERE client_id = \(clientID) AND sub = \(sub)"
        ).first?.decode([UInt8]?.self, at: 0)
        return try sealed.flatMap { try world.harness.tokenBox.open($0, clientID: clientID, sub: sub) }
    }

    /// The refresh tokens the account holds now, decrypted: the current one, and any the schema
    /// keeps for a later deletion to revoke (`retired_tokens_enc`, when the column exists).
    func heldTokens(of client: String? = nil) async throws -> Set<String> {
        let clientID = client ?? self.clientID
        let rows = try await connection.query(
            """
            SELECT refresh_token_enc, coalesce((to_jsonb(a) -> 'retired_tokens_enc')::text, '[]') AS retired
              FROM siwa.accounts a WHERE client_id = \(clientID) AND sub = \(sub)
            """)
        guard let row = rows.first else { return [] }
        var sealed: [[UInt8]] = try row.decode([UInt8]?.self, column: "refresh_token_enc").map { [$0] } ?? []
        // bytea in jsonb: "\\x0a1b..." strings.
        let retired = (try? JSONSerialization.jsonObject(with: Data(try row.decode(String.self, column: "retired").utf8))) as? [String]
        sealed += (retired ?? []).compactMap { Self.bytes(hex: $0.hasPrefix("\\x") ? String($0.dropFirst(2)) : $0) }
        return Set(sealed.compactMap { try? world.harness.tokenBox.open($0, clientID: clientID, sub: sub) })
    }

    static func bytes(hex: String) -> [UInt8]? {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        return stride(from: 0, to: digits.count, by: 2).map { index -> UInt8? in
            UInt8(String(decoding: digits[index..<index + 2], as: UTF8.self), radix: 16)
        }.reduce(into: [UInt8]?([])) { result, byte in
            if let byte { result?.append(byte) } else { result = nil }
        }
    }
}

/// A broken rule: `key` (rule and kind) tells distinct defects apart; `detail` is for the report.
struct ModelViolation: Hashable, Sendable {
    var rule: ModelRule
    var kind: String
    var detail: String

    init(_ rule: ModelRule, _ kind: String, _ detail: String) {
        self.rule = rule
        self.kind = kind
        self.detail = detail
    }

    var key: String { "\(rule.rawValue): \(kind)" }
}

enum ModelRule: String, Hashable, Sendable, CaseIterable {
    case deletionEndsDeleted = "every requested deletion ends deleted"
    case tokensRevoked = "no refresh token outlives a deletion unrevoked"
    case deletedStaysDeleted = "deleted stays deleted under notifications"
    case notificationOnce = "no notification applied twice"
    case emailNewest = "email forwarding ends at the newest event"
    case endingEventsApply = "consent-revoked and account-deleted end the account's life"
    case causalChanges = "the app's change rows come in causal order"
    case exchangeNeverLost = "a successful exchange is never lost"
    case grantHeld = "a returning user's grant is held"
    case forgotten = "after a deletion the account forgets who it was"
    case groupDeletion = "a deletion covers the user's whole app group"
    case linkBlockedWhilePending = "a pending deletion blocks a new link"
    case appCall = "app calls succeed"
    case quiescence = "every job finishes"
    case harness = "the test harness itself"
}
