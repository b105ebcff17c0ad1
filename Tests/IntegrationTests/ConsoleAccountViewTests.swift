import Foundation
import Postgres
import Testing

/// The console and the app API show an account through one view (`AccountView` over
/// `siwa.account`): for the same row, every value the console's account page and search show is
/// the one the app API answers, and the page shows nothing else of the account but the retired
/// tokens' count. Fails when either reader goes its own way (a column read or reworked on one side
/// only, a field the page adds from elsewhere).
@Suite(.serialized) struct ConsoleAccountViewTests {
    static let clientID = LifecycleHarness.clientID

    /// An app API sign-in exchanges its code itself (no job): its `linked` change says so
    /// (`sign_in_code_exchanged`; `sign_in` without a code), for the app's feed and the console's
    /// timeline, as a link's change names its exchange job.
    @Test func anAppAPISignInsCodeExchangeIsOnTheTimeline() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.exchanged")
            #expect(try await api.signIn(sub: "001.codeless", withCode: false).status == 200)
            let reasons = try await api.connection.query(
                "SELECT sub, reason FROM siwa.account_changes WHERE change = 'linked' AND client_id = \(Self.clientID) ORDER BY sub"
            ).map { (try $0.decode(String.self, at: 0), try $0.decode(String?.self, at: 1)) }
            #expect(reasons.map(\.0) == ["001.codeless", "001.exchanged"] && reasons.map(\.1) == ["sign_in", "sign_in_code_exchanged"], "\(reasons)")
            let feed = try await api.request("GET", "/v1/changes?after=0")
            #expect(feed.body.contains(#""reason":"sign_in_code_exchanged""#), "\(feed.body)")
            try await api.lifecycle.database.withLogin(inRole: "siwa_worker") { url in
                let console = try await ConsoleProcess(databaseURL: url)
                let exchanged = try await ConsoleHTTP.get(console.base + URLPart(Self.clientID, "001.exchanged"))
                let codeless = try await ConsoleHTTP.get(console.base + URLPart(Self.clientID, "001.codeless"))
                await console.stop()
                #expect(exchanged.body.contains("its authorization code exchanged at Apple"), "\(exchanged.body)")
                #expect(codeless.body.contains("no code exchanged") && !codeless.body.contains("exchanged at Apple"), "\(codeless.body)")
            }
        }
    }

    @Test func theConsoleAndTheAppAPIShowTheSameAccountFromTheSameRow() async throws {
        try await withAppAPI { api in
            try await api.signedIn(sub: "001.same")
            #expect(try await api.request("PATCH", "/v1/accounts/\(Self.clientID)/001.same", body: ["app_user_id": "user-same"]).status == 200)
            // The rest of what the page shows, on the row itself, in whole seconds (the page shows
            // seconds, the API milliseconds).
            _ = try await api.connection.execute(
                """
                UPDATE siwa.accounts SET email_forwarding = 'disabled', sessions_revoked_at = '2026-11-30 08:15:07+00',
                       retired_tokens_enc = ARRAY['\\x01'::bytea, '\\x02'::bytea], linked_at = '2026-11-29 07:00:00+00',
                       updated_at = '2026-12-01 09:30:00+00'
                 WHERE client_id = \(Self.clientID) AND sub = '001.same'
                """)
            // And one with nothing but its status: every optional column NULL, no token.
            _ = try await api.connection.execute(
                """
                INSERT INTO siwa.accounts (client_id, sub, status, updated_at)
                VALUES (\(Self.clientID), '001.bare', 'consent_revoked', '2026-12-01 10:00:00+00')
                """)
            try await api.lifecycle.database.withLogin(inRole: "siwa_worker") { url in
                let console = try await ConsoleProcess(databaseURL: url)
                do {
                    for (sub, retired) in [("001.same", 2), ("001.bare", 0)] {
                        let answer = try await api.request("GET", "/v1/accounts/\(Self.clientID)/\(sub)")
                        #expect(answer.status == 200, "\(answer.body)")
                        let json = answer.json
                        let page = try await ConsoleHTTP.get(console.base + URLPart(Self.clientID, sub))
                        #expect(page.status == 200)
                        let shown = Self.definitions(page.body)
                        let expected = Self.pageFields(json, retired: retired)
                        #expect(shown.map(\.0) == expected.map(\.0), "the page's fields: \(shown.map(\.0))")
                        for (label, value) in expected {
                            #expect(shown.first { $0.0 == label }?.1 == value, "\(sub), \(label): the API answers \(answer.body)")
                        }
                        let search = try await ConsoleHTTP.get(console.base + "/accounts?q=" + sub)
                        let row = Self.cells(search.body)
                        #expect(row == [
                            json["client_id"] as? String ?? "?", json["sub"] as? String ?? "?", json["app_user_id"] as? String ?? "",
                            json["status"] as? String ?? "?", Self.consoleTime(json["updated_at"]),
                        ], "\(sub)'s search row; the API answers \(answer.body)")
                    }
                } catch {
                    print("---- siwa console log ----\n\(console.process.log.suffix(6000))")
                    await console.stop()
                    throw error
                }
                await console.stop()
            }
        }
    }

    /// What the account page must show for the app API's answer `json`, label by label, in order.
    static func pageFields(_ json: [String: Any], retired: Int) -> [(String, String)] {
        let email = (json["email"] as? String).map { $0 + (json["is_private_email"] as? Bool == true ? " private relay" : "") }
        let tokens = (json["has_refresh_token"] as? Bool == true ? "one held" : "none held")
            + (retired > 0 ? ", \(retired) earlier kept for a deletion to revoke" : "")
        return [
            ("client ID", json["client_id"] as? String ?? "?"), ("sub", json["sub"] as? String ?? "?"),
            ("app_user_id", json["app_user_id"] as? String ?? "none"), ("status", json["status"] as? String ?? "?"),
            ("email", email ?? "none"), ("email forwarding", json["email_forwarding"] as? String ?? "none"),
            ("refresh token", tokens), ("linked", json["linked_at"] is String ? consoleTime(json["linked_at"]) : "none"),
            ("sessions revoked", json["sessions_revoked_at"] is String ? consoleTime(json["sessions_revoked_at"]) : "none"),
            ("updated", consoleTime(json["updated_at"])),
        ]
    }

    /// `2026-12-01T09:30:00.000Z` as the console writes it, `2026-12-01 09:30:00 UTC`.
    static func consoleTime(_ value: Any?) -> String {
        guard let text = value as? String, let dot = text.firstIndex(of: ".") else { return "not a timestamp: \(value ?? "nil")" }
        return text[..<dot].replacingOccurrences(of: "T", with: " ") + " UTC"
    }

    /// The page's `<dl class="account">` as (term, text of its definition) pairs.
    static func definitions(_ body: String) -> [(String, String)] {
        guard let list = body.range(of: #"<dl class="account">[\s\S]*?</dl>"#, options: .regularExpression) else { return [] }
        let pattern = try! NSRegularExpression(pattern: #"<dt>(.*?)</dt><dd[^>]*>(.*?)</dd>"#)
        let text = String(body[list])
        return pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).map { match in
            (plain(text, match.range(at: 1)), plain(text, match.range(at: 2)))
        }
    }

    /// The cells of the search's one result row, as text.
    static func cells(_ body: String) -> [String] {
        guard let rows = body.range(of: #"<tbody>[\s\S]*?</tbody>"#, options: .regularExpression) else { return [] }
        let text = String(body[rows])
        #expect(text.components(separatedBy: "<tr>").count == 2, "one row: \(text)")
        let pattern = try! NSRegularExpression(pattern: #"<td[^>]*>(.*?)</td>"#)
        return pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).map { plain(text, $0.range(at: 1)) }
    }

    private static func plain(_ text: String, _ range: NSRange) -> String {
        String(text[Range(range, in: text)!]).replacingOccurrences(of: #"<[^>]+>"#, with: "", options: .regularExpression)
    }
}
