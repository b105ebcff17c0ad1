import FakeApple
import Foundation
import Postgres
import Testing

/// Web and Android sign-in, served (deploy/web-sign-in.md): a real receiver's `/apple/sign-in` and callback,
/// the fake Apple's answers posted as Apple posts them, the ticket redeemed through the app API.
@Suite(.serialized) struct WebSignInTests {
    static func withStack<T>(maxPending: Int? = nil, _ body: (WebSignInStack) async throws -> T) async throws -> T {
        let stack = try await WebSignInStack(maxPending: maxPending)
        do {
            let value = try await body(stack)
            await stack.shutDown()
            return value
        } catch {
            await stack.shutDown()
            throw error
        }
    }

    /// Start → Apple → callback → return URL with a ticket → the app's back end redeems it: a new
    /// account with the name from `user`, its refresh token held (the fake Apple accepts the code
    /// only with the callback's redirect URI); the ticket and the state are single use; nothing
    /// secret in either process's log.
    @Test func aTicketFinishesTheSignInOnce() async throws {
        try await Self.withStack { stack in
            let start = try await stack.start([
                ("client_id", "com.example.app"), ("return_to", WebSignInStack.returnURL), ("app_state", "session-42"),
            ])
            #expect(start.status == 302, "\(start.body)")
            let location = try #require(start.location)
            #expect(location.hasPrefix(stack.api.fake.baseURL.absoluteString + "/auth/authorize?"))
            let authorize = WebSignInStack.query(of: location)
            #expect(authorize["response_type"] == "code id_token")
            #expect(authorize["response_mode"] == "form_post")
            #expect(authorize["client_id"] == "com.example.app")
            #expect(authorize["redirect_uri"] == stack.redirectURI)
            #expect(authorize["scope"] == "name email")
            let state = try #require(authorize["state"])
            let nonce = try #require(authorize["nonce"])
            #expect(state.count >= 22)
            #expect(nonce.count == 64 && nonce.allSatisfy { "0123456789abcdef".contains($0) })

            let form = stack.appleAnswer(authorize, sub: "001.web.new")
            let answer = try await stack.callback(form)
            #expect(answer.status == 303, "\(answer.body)")
            let back = try #require(answer.location)
            #expect(back.hasPrefix(WebSignInStack.returnURL + "?"))
            let returned = WebSignInStack.query(of: back)
            #expect(returned["siwa_app_state"] == "session-42")
            #expect(returned["siwa_error"] == nil)
            let ticket = try #require(returned["siwa_ticket"])
            #expect(ticket.count >= 22)

            // The same state again (a replayed form_post): 400, no redirect.
            let replayed = try await stack.callback(form)
            #expect(replayed.status == 400 && replayed.location == nil, "\(replayed.body)")

            try await Self.expectNewSignIn(redeeming: ticket, sub: "001.web.new", in: stack)

            let again = try await stack.redeem(ticket)
            #expect(again.status == 401 && again.error == "ticket_invalid", "\(again.body)")

            let secrets = [state, ticket] + form.filter { ["code", "id_token"].contains($0.0) }.map(\.1)
            for secret in secrets {
                #expect(!stack.receiver.log.contains(secret))
                #expect(!stack.api.log.contains(secret))
            }
        }
    }

    /// The ticket redeemed: 200, a new account named from `user`, its refresh token held; one
    /// exchange, which the fake Apple answers only with the redirect URI of the authorization.
    static func expectNewSignIn(redeeming ticket: String, sub: String, in stack: WebSignInStack) async throws {
        let signedIn = try await stack.redeem(ticket)
        #expect(signedIn.status == 200, "\(signedIn.body)")
        #expect(signedIn.json["new"] as? Bool == true)
        #expect(signedIn.json["sub"] as? String == sub)
        #expect(signedIn.json["has_refresh_token"] as? Bool == true)
        let name = signedIn.json["full_name"] as? [String: Any]
        #expect(name?["given_name"] as? String == "Jane")
        #expect(name?["family_name"] as? String == "Appleseed")
        #expect(stack.api.fake.refreshTokens(clientID: "com.example.app", sub: sub).count == 1)
        let exchanges = stack.api.fake.calls.filter { $0.endpoint == "token" }
        #expect(exchanges.count == 1 && exchanges.first?.status == 200)
    }

    /// An app's own scheme (Android/iOS deep link) keeps its fragment after the added query.
    @Test func aCustomSchemeReturnKeepsItsFragment() async throws {
        try await Self.withStack { stack in
            let authorize = try await stack.started(returnTo: WebSignInStack.appReturnURL, appState: nil)
            let answer = try await stack.callback(stack.appleAnswer(authorize, sub: "001.web.app", firstName: nil, lastName: nil))
            #expect(answer.status == 303)
            let location = try #require(answer.location)
            #expect(location.hasPrefix("com.example.app:/signed-in?siwa_ticket="))
            #expect(location.hasSuffix("#web"))
            #expect(!location.contains("siwa_app_state"))
            let ticket = try #require(WebSignInStack.query(of: location)["siwa_ticket"])
            let signedIn = try await stack.redeem(ticket)
            #expect(signedIn.status == 200, "\(signedIn.body)")
            #expect(signedIn.json["full_name"] is NSNull)
        }
    }

    /// Every way in that is not exactly allowed is refused with 400 and no redirect; an unknown,
    /// spent or expired state or ticket too; the user cancelling returns with `siwa_error` only.
    @Test func whatIsNotExactlyAllowedIsRefused() async throws {
        try await Self.withStack { stack in
            let good = WebSignInStack.returnURL
            for (items, code) in [
                ([("client_id", "com.example.other"), ("return_to", good)], "client_id_unknown"),
                ([("return_to", good)], "client_id_unknown"),
                ([("client_id", "com.example.app")], "return_to_not_allowed"),
                ([("client_id", "com.example.app"), ("return_to", "https://evil.example.com/signed-in")], "return_to_not_allowed"),
                ([("client_id", "com.example.app"), ("return_to", good + "/")], "return_to_not_allowed"),
                ([("client_id", "com.example.app"), ("return_to", good + "?next=https://evil.example.com")], "return_to_not_allowed"),
                ([("client_id", "com.example.app"), ("return_to", "https://APP.example.com/signed-in")], "return_to_not_allowed"),
                ([("client_id", "com.example.app"), ("return_to", "https://app.example.com.evil.com/signed-in")], "return_to_not_allowed"),
                ([("client_id", "com.example.app"), ("return_to", "javascript:alert(1)")], "return_to_not_allowed"),
                ([("client_id", "com.example.app"), ("return_to", good), ("scope", "openid")], "scope_invalid"),
                ([("client_id", "com.example.app"), ("return_to", good), ("app_state", String(repeating: "a", count: 513))], "app_state_invalid"),
            ] {
                let answer = try await stack.start(items)
                #expect(answer.status == 400 && answer.location == nil, "\(items): \(answer.status) \(answer.body)")
                #expect(answer.body.contains(code), "\(items): \(answer.body)")
            }

            // An unknown state; one from a start, spent by a cancelled authorization; an expired one.
            let unknown = try await stack.callback([("state", "nosuchstate"), ("code", "c"), ("id_token", "a.b.c")])
            #expect(unknown.status == 400 && unknown.location == nil)
            let cancelled = try await stack.started()
            let back = try await stack.callback([("state", cancelled["state"] ?? ""), ("error", "user_cancelled_authorize")])
            #expect(back.status == 303)
            let returned = WebSignInStack.query(of: back.location ?? "")
            #expect(returned["siwa_error"] == "user_cancelled_authorize")
            #expect(returned["siwa_ticket"] == nil)
            #expect(returned["siwa_app_state"] == "session-42")
            let spent = try await stack.callback(stack.appleAnswer(cancelled, sub: "001.web.cancel"))
            #expect(spent.status == 400 && spent.location == nil)
            let late = try await stack.started()
            try await stack.api.connection.simpleQuery("UPDATE siwa.web_sign_in_states SET expires_at = now() - interval '1 second'")
            let expired = try await stack.callback(stack.appleAnswer(late, sub: "001.web.late"))
            #expect(expired.status == 400 && expired.location == nil)

            // A body that is not a form, and one over the cap.
            let notForm = try await stack.send("POST", stack.redirectURI, form: [("state", "x")], contentType: "application/json")
            #expect(notForm.status == 400)
            let huge = try await stack.callback([("state", "x"), ("id_token", String(repeating: "a", count: 20_000))])
            #expect(huge.status == 413)

            // Tickets: unknown, expired.
            let unknownTicket = try await stack.redeem("nosuchticket")
            #expect(unknownTicket.status == 401 && unknownTicket.error == "ticket_invalid", "\(unknownTicket.body)")
            let ticket = try #require(try await stack.ticket(sub: "001.web.expired")["siwa_ticket"])
            try await stack.api.connection.simpleQuery("UPDATE siwa.web_sign_in_tickets SET expires_at = now() - interval '1 second'")
            let expiredTicket = try await stack.redeem(ticket)
            #expect(expiredTicket.status == 401 && expiredTicket.error == "ticket_invalid", "\(expiredTicket.body)")
            #expect(stack.api.fake.calls.filter { $0.endpoint == "token" }.isEmpty)
        }
    }

    /// A ticket is a sign-in like any other: while a deletion is pending it is refused (403), and
    /// nothing is exchanged.
    @Test func aTicketForAnAccountBeingDeletedIsRefused() async throws {
        try await Self.withStack { stack in
            try await stack.api.signedIn(sub: "001.web.deleting")
            let deletion = try await stack.api.request("POST", "/v1/accounts/com.example.app/001.web.deleting/deletion")
            #expect(deletion.status == 202, "\(deletion.body)")
            let exchangesBefore = stack.api.fake.calls.filter { $0.endpoint == "token" }.count
            let ticket = try #require(try await stack.ticket(sub: "001.web.deleting")["siwa_ticket"])
            let answer = try await stack.redeem(ticket)
            #expect(answer.status == 403 && answer.error == "account_deleting", "\(answer.body)")
            #expect(stack.api.fake.calls.filter { $0.endpoint == "token" }.count == exchangesBefore)
        }
    }

    /// Redeemed by two back ends at once (a double submit): one sign-in, one `ticket_invalid`; a
    /// late redemption too. The harness's ticket, made without a receiver, is what a model step uses.
    @Test func aTicketRedeemedTwiceAtOnceSignsInOnce() async throws {
        try await withAppAPI { api in
            let ticket = try await api.webTicket(sub: "001.web.race")
            async let first = api.redeemTicket(ticket)
            async let second = api.redeemTicket(ticket)
            let answers = try await [first, second]
            #expect(answers.map(\.status).sorted() == [200, 401], "\(answers.map(\.body))")
            #expect(answers.contains { $0.error == "ticket_invalid" })
            #expect(api.fake.calls.filter { $0.endpoint == "token" }.count == 1)
            let late = try await api.redeemTicket(ticket)
            #expect(late.status == 401 && late.error == "ticket_invalid")
        }
    }

    /// Flooding the start URL: past the bound, 429 and nothing more kept; once the states expire,
    /// sign-ins start again.
    @Test func floodingTheStartURLIsBounded() async throws {
        try await Self.withStack(maxPending: 3) { stack in
            for _ in 0..<3 { _ = try await stack.started() }
            for _ in 0..<5 {
                let answer = try await stack.start([("client_id", "com.example.app"), ("return_to", WebSignInStack.returnURL)])
                #expect(answer.status == 429 && answer.location == nil, "\(answer.status) \(answer.body)")
            }
            let kept = try await stack.api.connection.query("SELECT count(*)::bigint FROM siwa.web_sign_in_states")[0].decode(Int64.self, at: 0)
            #expect(kept == 3)
            try await stack.api.connection.simpleQuery("UPDATE siwa.web_sign_in_states SET expires_at = now() - interval '1 second'")
            _ = try await stack.started()
        }
    }

    /// Unspent tickets are bounded apart from states: past the bound the callback still spends its
    /// state but keeps no ticket, and sends the browser back with `siwa_error=too_many_sign_ins`
    /// (and the app's state); the tickets already kept still sign in; once they are spent, new
    /// tickets are kept again.
    @Test func unspentTicketsAreBounded() async throws {
        try await Self.withStack(maxPending: 2) { stack in
            let kept = [try await stack.ticket(sub: "bounded-1")["siwa_ticket"], try await stack.ticket(sub: "bounded-2")["siwa_ticket"]]
            #expect(kept.allSatisfy { $0 != nil })
            let authorize = try await stack.started()
            let refused = try await stack.callback(stack.appleAnswer(authorize, sub: "bounded-3"))
            #expect(refused.status == 303, "\(refused.status) \(refused.body)")
            let back = WebSignInStack.query(of: refused.location ?? "")
            #expect(back["siwa_error"] == "too_many_sign_ins" && back["siwa_ticket"] == nil && back["siwa_app_state"] == "session-42", "\(back)")
            #expect(refused.location?.hasPrefix(WebSignInStack.returnURL + "?") == true, "\(refused.location ?? "no location")")
            let again = try await stack.callback(stack.appleAnswer(authorize, sub: "bounded-3"))
            #expect(again.status == 400, "the refused callback spent its state: \(again.status)")
            let tickets = try await stack.api.connection.query("SELECT count(*)::bigint FROM siwa.web_sign_in_tickets")[0].decode(Int64.self, at: 0)
            #expect(tickets == 2)
            for ticket in kept.compactMap({ $0 }) {
                let answer = try await stack.redeem(ticket)
                #expect(answer.status == 200, "\(answer.status) \(answer.body)")
            }
            #expect(try await stack.ticket(sub: "bounded-4")["siwa_ticket"] != nil)
        }
    }
}
