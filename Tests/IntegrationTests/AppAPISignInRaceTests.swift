import FakeApple
import Foundation
import Postgres
import Testing

/// A sign-in reads the account, asks Apple, then writes: a deletion can commit, and even finish,
/// between its two halves. Whatever the order of the transactions, the deletion stands.
@Suite(.serialized) struct AppAPISignInRaceTests {
    static let clientID = LifecycleHarness.clientID

    /// The app's deletion transaction began before the sign-in read the account (so its revoke job
    /// is older than the read), but committed only while Apple was being asked, and its revoke had
    /// finished before the sign-in wrote. The sign-in must not bring the account back.
    @Test func aDeletionWhoseTransactionBeganBeforeTheReadStillWins() async throws {
        try await withAppAPI { api in
            let sub = "001.race.begun-first"
            let app = try await api.lifecycle.database.connect()
            defer { app.close() }
            try await app.simpleQuery("BEGIN")
            let revokeJob = try await app.query("SELECT siwa.request_deletion(\(Self.clientID), \(sub))")[0]
                .decode(Int64.self, at: 0)

            let exchange = api.fake.holdNextCall(endpoint: "token", clientID: Self.clientID)
            let signIn = Task { try await api.signIn(sub: sub) }
            try await waitUntil("the sign-in reaches Apple") { exchange.hasArrived }

            try await app.simpleQuery("COMMIT")
            try await api.lifecycle.run(revokeJob)
            #expect(try await api.lifecycle.status(sub) == "deleted")

            exchange.release()
            let answer = try await signIn.value
            #expect(answer.status == 403 && answer.error == "account_deleting", "\(answer.status) \(answer.body)")
            #expect(try await api.lifecycle.status(sub) == "deleted", "the finished deletion was undone")
            #expect(try await api.lifecycle.storedToken(sub) == nil)

            // The token the exchange obtained is revoked at Apple, not left live.
            let issued = api.fake.refreshTokens(clientID: Self.clientID, sub: sub)
            #expect(issued.count == 1)
            let lateRevoke = try #require(
                try await api.lifecycle.scalar(
                    Int64.self,
                    "SELECT max(id) FROM siwa.jobs WHERE kind = 'revoke' AND client_id = \(Self.clientID) AND sub = \(sub) AND id > \(revokeJob)"))
            try await api.lifecycle.run(lateRevoke)
            #expect(issued.allSatisfy { api.fake.isRevoked(refreshToken: $0) == true })
        }
    }

    /// The same race on an account that already holds a token: no exchange, so the window is the
    /// few statements between the read and the write, but the rule is the same.
    @Test func aDeletionFinishedBetweenTheReadAndTheWriteWinsWithoutAnExchange() async throws {
        try await withAppAPI { api in
            let sub = "001.race.no-exchange"
            try await api.signedIn(sub: sub)
            let app = try await api.lifecycle.database.connect()
            defer { app.close() }
            try await app.simpleQuery("BEGIN")
            let revokeJob = try await app.query("SELECT siwa.request_deletion(\(Self.clientID), \(sub))")[0]
                .decode(Int64.self, at: 0)
            let read = try await api.connection.query(
                "SELECT now() AS read_at, status FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)")[0]
            #expect(try read.decode(String.self, column: "status") == "active", "the deletion is not visible yet")
            let readAt = try read.decode(Date.self, column: "read_at")
            try await app.simpleQuery("COMMIT")
            try await api.lifecycle.run(revokeJob)
            #expect(try await api.lifecycle.status(sub) == "deleted")

            // The write of a sign-in that read the account at `readAt`, before the deletion committed.
            let outcome = try await api.connection.query(
                "SELECT status FROM siwa.sign_in(\(Self.clientID), \(sub), NULL, NULL, NULL, \(readAt))")[0]
            #expect(try outcome.decode(String.self, column: "status") == "deleted", "the finished deletion was undone")
            #expect(try await api.lifecycle.status(sub) == "deleted")
        }
    }

    private func waitUntil(_ what: String, _ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while !condition() {
            guard ContinuousClock.now < deadline else { throw HarnessError(message: "timed out waiting until \(what)") }
            try await Task.sleep(for: .milliseconds(10))
        }
    }
}
