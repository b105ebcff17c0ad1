import Foundation
import Postgres
import Testing

/// The account rules as a table: what every event does to an account in every status, one sentence
/// a row, checked against `siwa.account_effect` (sql/functions/accounts.sql) and, for Apple's four
/// events, against what the real notification batch does to a real account row, set-based and one
/// by one. Changing what an event does is one line of that function and one row here.
///
/// A row: `<a|an> <status> account that gets <event>` then `becomes <status>`, `stays <status>`, or
/// `is ignored (<outcome>)`, then what else it does, each after a comma: `its tokens are discarded`
/// (the grant at Apple is over), `its sessions end` (sessions_revoked_at is set), `its personal data
/// is erased`, `email forwarding becomes <enabled|disabled>`, ``change `<name>` `` (the row appended
/// to siwa.account_changes). `new` is an account with no row yet. What an event's time does (a
/// `stale` event) is not here: siwa.notification_outcome and the lifecycle tests own the order.
@Suite struct AccountEffectTableTests {
    static let table = """
        a new account that gets consent-revoked becomes consent_revoked, its tokens are discarded, its sessions end, change `consent_revoked`
        an active account that gets consent-revoked becomes consent_revoked, its tokens are discarded, its sessions end, change `consent_revoked`
        a consent_revoked account that gets consent-revoked is ignored (no_change)
        an apple_account_deleted account that gets consent-revoked is ignored (no_change)
        a pending_deletion account that gets consent-revoked stays pending_deletion, its sessions end, change `consent_revoked`
        a deleted account that gets consent-revoked is ignored (ignored_account_deleted)

        a new account that gets account-deleted becomes apple_account_deleted, its tokens are discarded, its sessions end, its personal data is erased, change `apple_account_deleted`
        an active account that gets account-deleted becomes apple_account_deleted, its tokens are discarded, its sessions end, its personal data is erased, change `apple_account_deleted`
        a consent_revoked account that gets account-deleted becomes apple_account_deleted, its tokens are discarded, its sessions end, its personal data is erased, change `apple_account_deleted`
        an apple_account_deleted account that gets account-deleted is ignored (no_change)
        a pending_deletion account that gets account-deleted stays pending_deletion, its sessions end, change `apple_account_deleted`
        a deleted account that gets account-deleted is ignored (ignored_account_deleted)

        a new account that gets email-enabled becomes active, email forwarding becomes enabled, change `email_enabled`
        an active account that gets email-enabled stays active, email forwarding becomes enabled, change `email_enabled`
        a consent_revoked account that gets email-enabled stays consent_revoked, email forwarding becomes enabled, change `email_enabled`
        an apple_account_deleted account that gets email-enabled is ignored (ignored_account_deleted)
        a pending_deletion account that gets email-enabled is ignored (ignored_account_deleted)
        a deleted account that gets email-enabled is ignored (ignored_account_deleted)

        a new account that gets email-disabled becomes active, email forwarding becomes disabled, change `email_disabled`
        an active account that gets email-disabled stays active, email forwarding becomes disabled, change `email_disabled`
        a consent_revoked account that gets email-disabled stays consent_revoked, email forwarding becomes disabled, change `email_disabled`
        an apple_account_deleted account that gets email-disabled is ignored (ignored_account_deleted)
        a pending_deletion account that gets email-disabled is ignored (ignored_account_deleted)
        a deleted account that gets email-disabled is ignored (ignored_account_deleted)

        a new account that gets linked becomes active, change `linked`
        an active account that gets linked stays active, change `linked`
        a consent_revoked account that gets linked becomes active, change `linked`
        an apple_account_deleted account that gets linked becomes active, change `linked`
        a pending_deletion account that gets linked is ignored (ignored_account_deleted)
        a deleted account that gets linked becomes active, change `linked`

        a new account that gets late_link is ignored (ignored_account_deleted)
        an active account that gets late_link is ignored (ignored_account_deleted)
        a consent_revoked account that gets late_link is ignored (ignored_account_deleted)
        an apple_account_deleted account that gets late_link is ignored (ignored_account_deleted)
        a pending_deletion account that gets late_link is ignored (ignored_account_deleted)
        a deleted account that gets late_link is ignored (ignored_account_deleted)

        a new account that gets deletion_requested becomes pending_deletion, change `deletion_requested`
        an active account that gets deletion_requested becomes pending_deletion, change `deletion_requested`
        a consent_revoked account that gets deletion_requested becomes pending_deletion, change `deletion_requested`
        an apple_account_deleted account that gets deletion_requested becomes pending_deletion, change `deletion_requested`
        a pending_deletion account that gets deletion_requested stays pending_deletion, change `deletion_requested`
        a deleted account that gets deletion_requested becomes pending_deletion, change `deletion_requested`

        a new account that gets deletion_finished is ignored (no_change)
        an active account that gets deletion_finished is ignored (no_change)
        a consent_revoked account that gets deletion_finished is ignored (no_change)
        an apple_account_deleted account that gets deletion_finished is ignored (no_change)
        a pending_deletion account that gets deletion_finished becomes deleted, its sessions end, its personal data is erased, change `deleted`
        a deleted account that gets deletion_finished is ignored (no_change)

        a new account that gets reconcile_invalid_grant is ignored (no_change)
        an active account that gets reconcile_invalid_grant becomes consent_revoked, its tokens are discarded, its sessions end, change `consent_revoked`
        a consent_revoked account that gets reconcile_invalid_grant is ignored (no_change)
        an apple_account_deleted account that gets reconcile_invalid_grant is ignored (no_change)
        a pending_deletion account that gets reconcile_invalid_grant is ignored (ignored_account_deleted)
        a deleted account that gets reconcile_invalid_grant is ignored (ignored_account_deleted)

        a new account that gets transferred becomes active, its tokens are discarded, change `transferred`
        an active account that gets transferred stays active, its tokens are discarded, change `transferred`
        a consent_revoked account that gets transferred becomes active, its tokens are discarded, change `transferred`
        an apple_account_deleted account that gets transferred becomes active, its tokens are discarded, change `transferred`
        a pending_deletion account that gets transferred is ignored (ignored_account_deleted)
        a deleted account that gets transferred is ignored (ignored_account_deleted)

        a new account that gets imported becomes active, change `imported`
        an active account that gets imported stays active, change `imported`
        a consent_revoked account that gets imported is ignored (no_change)
        an apple_account_deleted account that gets imported is ignored (no_change)
        a pending_deletion account that gets imported is ignored (ignored_account_deleted)
        a deleted account that gets imported is ignored (ignored_account_deleted)

        a new account that gets account-purged is ignored (ignored_unknown_type)
        an active account that gets account-purged is ignored (ignored_unknown_type)
        a consent_revoked account that gets account-purged is ignored (ignored_unknown_type)
        an apple_account_deleted account that gets account-purged is ignored (ignored_unknown_type)
        a pending_deletion account that gets account-purged is ignored (ignored_unknown_type)
        a deleted account that gets account-purged is ignored (ignored_unknown_type)
        """

    static let statuses: [String?] = [nil, "active", "consent_revoked", "apple_account_deleted", "pending_deletion", "deleted"]
    static let appleEvents = ["consent-revoked", "account-deleted", "email-enabled", "email-disabled"]
    static let events = appleEvents + [
        "linked", "late_link", "deletion_requested", "deletion_finished", "reconcile_invalid_grant", "transferred", "imported",
        "account-purged",  // a type Apple may add: changes nothing
    ]

    static var rows: [Effect] {
        get throws { try table.split(separator: "\n").map { try Effect(sentence: String($0)) } }
    }

    /// Every status meets every event exactly once.
    @Test func theTableHasOneRowForEveryStatusAndEvent() throws {
        let pairs = try Self.rows.map { "\($0.status ?? "new") × \($0.event)" }
        let expected = Self.statuses.flatMap { status in Self.events.map { "\(status ?? "new") × \($0)" } }
        #expect(pairs.sorted() == expected.sorted())
        #expect(Set(pairs).count == pairs.count)
    }

    /// The function says what the table says, row by row.
    @Test func accountEffectIsTheTable() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            for row in try Self.rows {
                let found = try await connection.query("""
                    SELECT e.next_status, e.outcome, e.ends_grant, e.ends_sessions, e.erases_personal_data,
                           e.email_forwarding, e.change
                      FROM siwa.account_effect(\(row.status), \(row.event)) e
                    """)[0]
                let effect = try Effect(
                    status: row.status, event: row.event, next: found.decode(String?.self, at: 0),
                    outcome: found.decode(String.self, at: 1), endsGrant: found.decode(Bool.self, at: 2),
                    endsSessions: found.decode(Bool.self, at: 3), erases: found.decode(Bool.self, at: 4),
                    forwarding: found.decode(String?.self, at: 5), change: found.decode(String?.self, at: 6))
                #expect(effect == row, "\(row.sentence)\n   the function: \(effect.sentence)")
            }
        }
    }

    /// Apple's events through the real notification batch (set-based, and one job at a time as the
    /// batch's isolated retry runs them), each against an account row in its status that holds
    /// tokens, personal data and live sessions: the account ends as the table says.
    @Test(arguments: [false, true]) func theNotificationBatchDoesWhatTheTableSays(oneByOne: Bool) async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            let rows = try Self.rows.filter { Self.appleEvents.contains($0.event) }
            for (index, row) in rows.enumerated() {
                let sub = "000\(index).effect"
                if let status = row.status {
                    try await connection.execute("""
                        INSERT INTO siwa.accounts (client_id, sub, status, app_user_id, email, is_private_email,
                                                   full_name, refresh_token_enc, retired_tokens_enc, linked_at)
                        VALUES ('com.example.app', \(sub), \(status), 'user', 'u@example.com', false,
                                '{"givenName": "Ada"}', '\\x01', '{"\\\\x02"}', now() - interval '1 day')
                        """)
                }
                try await connection.execute("""
                    INSERT INTO siwa.notifications (jti, client_id, sub, event_type, event_time, email, claims, jws)
                    VALUES (\(sub), 'com.example.app', \(sub), \(row.event), now(),
                            CASE WHEN \(row.event) LIKE 'email-%' THEN 'relay@privaterelay.appleid.com' END, '{"events": {}}', 'jws')
                    """)
            }
            let ran = try await connection.query("""
                SELECT count(*)::int FROM siwa.run_notification_batch('test', 1000, 30, \(oneByOne), 1, 60)
                 WHERE state = 'completed'
                """)[0].decode(Int.self, at: 0)
            #expect(ran == rows.count)

            for (index, row) in rows.enumerated() {
                let sub = "000\(index).effect"
                let account = try await connection.query("""
                    SELECT a.status, a.refresh_token_enc IS NULL AND a.retired_tokens_enc = '{}',
                           a.sessions_revoked_at IS NOT NULL, a.full_name IS NULL AND a.email IS DISTINCT FROM 'u@example.com',
                           a.email_forwarding, n.outcome, n.jws IS NULL,
                           ARRAY(SELECT c.change FROM siwa.account_changes c WHERE c.sub = a.sub ORDER BY c.id)::text
                      FROM siwa.accounts a JOIN siwa.notifications n ON n.jti = a.sub
                     WHERE a.client_id = 'com.example.app' AND a.sub = \(sub)
                    """)[0]
                let had = row.status != nil  // a new account is created active by the batch, with nothing to discard
                let changes = try account.decode(String.self, at: 7)
                let found = try Effect(
                    status: row.status, event: row.event, next: account.decode(String.self, at: 0),
                    outcome: account.decode(String.self, at: 5),
                    endsGrant: had ? account.decode(Bool.self, at: 1) : row.endsGrant,
                    endsSessions: account.decode(Bool.self, at: 2),
                    erases: had ? account.decode(Bool.self, at: 3) : row.erases,
                    forwarding: account.decode(String?.self, at: 4),
                    change: changes == "{}" ? nil : String(changes.dropFirst().dropLast()))
                var expected = row
                expected.next = row.next ?? "active"
                #expect(found == expected, "\(row.sentence)\n   the batch: \(found.sentence)")
                // A notification keeps its body only while its account is not deleted.
                let erasedNotification = row.erases || ["deleted", "apple_account_deleted"].contains(row.status ?? "")
                #expect(try account.decode(Bool.self, at: 6) == erasedNotification, "\(row.sentence): the notification's jws")
            }
        }
    }

    /// `imported` through the real import (`siwa.account_imported`), each against an account row in
    /// its status holding no token: the account ends as the table says, and the token goes where
    /// the outcome says (applied: the account's; ignored for a deletion: held for it to revoke; no
    /// change: nowhere).
    @Test func theImportDoesWhatTheTableSays() async throws {
        try await withMigratedDatabase { database in
            let connection = try await database.connect()
            defer { connection.close() }
            for (index, row) in try Self.rows.filter({ $0.event == "imported" }).enumerated() {
                let sub = "000\(index).import"
                if let status = row.status {
                    try await connection.execute(
                        "INSERT INTO siwa.accounts (client_id, sub, status) VALUES ('com.example.app', \(sub), \(status))")
                }
                let taken = try await connection.query(
                    "SELECT siwa.account_imported('com.example.app', \(sub), 'user', '\\x0a'::bytea)")[0].decode(Bool.self, at: 0)
                let account = try await connection.query("""
                    SELECT a.status, a.refresh_token_enc = '\\x0a'::bytea, '\\x0a'::bytea = ANY (a.retired_tokens_enc),
                           ARRAY(SELECT c.change FROM siwa.account_changes c WHERE c.sub = a.sub ORDER BY c.id)::text
                      FROM siwa.accounts a WHERE a.client_id = 'com.example.app' AND a.sub = \(sub)
                    """)[0]
                let changes = try account.decode(String.self, at: 3)
                let current = try account.decode(Bool?.self, at: 1) ?? false
                let held = try account.decode(Bool.self, at: 2)
                let found = Effect(
                    status: row.status, event: row.event, next: try account.decode(String.self, at: 0),
                    outcome: current ? "applied" : held ? "ignored_account_deleted" : "no_change",
                    endsGrant: false, endsSessions: false, erases: false, forwarding: nil,
                    change: changes == "{}" ? nil : String(changes.dropFirst().dropLast()))
                #expect(found == row, "\(row.sentence)\n   the import: \(found.sentence)")
                #expect(taken == current, "\(row.sentence): the import reports the token taken")
            }
        }
    }

    /// One row of the table: what `event` does to an account in `status` (nil: no row yet).
    struct Effect: Equatable {
        var status: String?
        var event: String
        var next: String?
        var outcome: String
        var endsGrant = false
        var endsSessions = false
        var erases = false
        var forwarding: String?
        var change: String?

        init(
            status: String?, event: String, next: String?, outcome: String, endsGrant: Bool, endsSessions: Bool,
            erases: Bool, forwarding: String?, change: String?
        ) {
            (self.status, self.event, self.next, self.outcome) = (status, event, next, outcome)
            (self.endsGrant, self.endsSessions, self.erases, self.forwarding, self.change) =
                (endsGrant, endsSessions, erases, forwarding, change)
        }

        /// Parses a row of the table (the grammar is the suite's comment).
        init(sentence: String) throws {
            let head = #/^an? (\w+) account that gets ([\w-]+) (?:becomes (\w+)|stays (\w+)|is ignored \((\w+)\))/#
            guard let match = sentence.firstMatch(of: head) else { throw Unreadable(sentence: sentence) }
            status = match.1 == "new" ? nil : String(match.1)
            event = String(match.2)
            if let stays = match.4, stays != match.1 { throw Unreadable(sentence: sentence) }
            next = (match.3 ?? match.4).map(String.init) ?? status
            outcome = match.5.map(String.init) ?? "applied"
            for clause in sentence[match.range.upperBound...].split(separator: ", ").map({ $0.trimmingCharacters(in: .init(charactersIn: ", ")) }) {
                switch clause {
                case "its tokens are discarded": endsGrant = true
                case "its sessions end": endsSessions = true
                case "its personal data is erased": erases = true
                case "email forwarding becomes enabled", "email forwarding becomes disabled":
                    forwarding = String(clause.split(separator: " ").last!)
                case let text where text.hasPrefix("change `") && text.hasSuffix("`"):
                    change = String(text.dropFirst("change `".count).dropLast())
                default: throw Unreadable(sentence: sentence)
                }
            }
        }

        /// The row as the table writes it.
        var sentence: String {
            let who = status ?? "new"
            var text = "\("aeiou".contains(who.first!) ? "an" : "a") \(who) account that gets \(event) "
            if outcome != "applied" {
                text += "is ignored (\(outcome))"
            } else {
                text += next == status ? "stays \(next ?? "new")" : "becomes \(next ?? "new")"
            }
            if endsGrant { text += ", its tokens are discarded" }
            if endsSessions { text += ", its sessions end" }
            if erases { text += ", its personal data is erased" }
            if let forwarding { text += ", email forwarding becomes \(forwarding)" }
            if let change { text += ", change `\(change)`" }
            return text
        }
    }

    struct Unreadable: Error, CustomStringConvertible {
        let sentence: String
        var description: String { "not a row of the account rules' table: \(sentence)" }
    }
}
