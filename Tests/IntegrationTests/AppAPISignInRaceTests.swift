import FakeApple
import Foundation
import Postgres
import Testing
import TestTiming

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
            let (app, revokeJob) = try await beginDeletion(api, sub: sub)
            defer { app.close() }

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
            #expect(api.fake.refreshTokens(clientID: Self.clientID, sub: sub).count == 1)
            try await revokeLateTokens(api, sub: sub, after: revokeJob)
        }
    }

    /// The same race on an account that already holds a token: no exchange, so the window is the
    /// few statements between the read and the write, but the rule is the same. Here the write is
    /// `siwa.sign_in` as the API calls it, with the count its read saw.
    @Test func aDeletionFinishedBetweenTheReadAndTheWriteWinsWithoutAnExchange() async throws {
        try await withAppAPI { api in
            let sub = "001.race.no-exchange"
            try await api.signedIn(sub: sub)
            let (app, revokeJob) = try await beginDeletion(api, sub: sub)
            defer { app.close() }
            let read = try await api.connection.query(
                "SELECT status, deletion_requests FROM siwa.accounts WHERE client_id = \(Self.clientID) AND sub = \(sub)")[0]
            #expect(try read.decode(String.self, column: "status") == "active", "the deletion is not visible yet")
            let seen = try read.decode(Int64.self, column: "deletion_requests")
            try await app.simpleQuery("COMMIT")
            try await api.lifecycle.run(revokeJob)
            #expect(try await api.lifecycle.status(sub) == "deleted")

            let outcome = try await api.connection.query(
                "SELECT status FROM siwa.sign_in(\(Self.clientID), \(sub), NULL, NULL, NULL, \(seen))")[0]
            #expect(try outcome.decode(String.self, column: "status") == "deleted", "the finished deletion was undone")
            #expect(try await api.lifecycle.status(sub) == "deleted")
        }
    }

    /// Found by the lifecycle model: the account was deleted, a sign-in (a new life) read it and
    /// asked Apple, and meanwhile the app requested the deletion again. The repeat changes nothing
    /// else (it returns the finished job), but it came after the sign-in's read, so it wins: the
    /// account stays deleted and the token the sign-in obtained is revoked.
    @Test func aRepeatedDeletionDuringASignInsExchangeWins() async throws {
        try await withAppAPI { api in
            let sub = "001.race.repeat"
            try await api.signedIn(sub: sub)
            let first = try await api.lifecycle.requestDeletion(sub: sub)
            try await api.lifecycle.run(first)
            #expect(try await api.lifecycle.status(sub) == "deleted")

            let exchange = api.fake.holdNextCall(endpoint: "token", clientID: Self.clientID)
            let signIn = Task { try await api.signIn(sub: sub) }
            try await waitUntil("the sign-in reaches Apple") { exchange.hasArrived }
            #expect(try await api.lifecycle.requestDeletion(sub: sub) == first, "a repeat returns the same job")
            exchange.release()
            let answer = try await signIn.value
            #expect(answer.status == 403 && answer.error == "account_deleting", "\(answer.status) \(answer.body)")
            #expect(try await api.lifecycle.status(sub) == "deleted")

            try await revokeLateTokens(api, sub: sub, after: first)

            // A sign-in that reads after the repeat is a new life again.
            let again = try await api.signIn(sub: sub)
            #expect(again.status == 200 && again.json["status"] as? String == "active", "\(again.body)")
        }
    }

    /// Previous-release workers call `siwa.sign_in` with the time of their read: a deletion
    /// committed after that read (its transaction begun before it) still wins.
    @Test func thePreviousReleasesSignInCallKeepsTheRule() async throws {
        try await withAppAPI { api in
            let sub = "001.race.old-worker"
            try await api.signedIn(sub: sub)
            let (app, revokeJob) = try await beginDeletion(api, sub: sub)
            defer { app.close() }
            let readAt = try await api.connection.query("SELECT now()")[0].decode(Date.self, at: 0)
            try await app.simpleQuery("COMMIT")
            try await api.lifecycle.run(revokeJob)
            let outcome = try await api.connection.query(
                "SELECT status FROM siwa.sign_in(\(Self.clientID), \(sub), NULL, NULL, NULL, \(readAt))")[0]
            #expect(try outcome.decode(String.self, column: "status") == "deleted", "the finished deletion was undone")
        }
    }

    /// The app's deletion of `sub` in a transaction of its own, left open: the caller commits it.
    private func beginDeletion(_ api: AppAPIHarness, sub: String) async throws -> (PostgresConnection, Int64) {
        let app = try await api.lifecycle.database.connect()
        try await app.simpleQuery("BEGIN")
        let job = try await app.query("SELECT siwa.request_deletion(\(Self.clientID), \(sub))")[0].decode(Int64.self, at: 0)
        return (app, job)
    }

    /// Runs the revoke the late token queued (after the deletion's job `after`) and checks every
    /// token Apple issued for `sub` ends revoked.
    private func revokeLateTokens(_ api: AppAPIHarness, sub: String, after deletion: Int64) async throws {
        let lateRevoke = try #require(
            try await api.lifecycle.scalar(
                Int64.self,
                "SELECT max(id) FROM siwa.jobs WHERE kind = 'revoke' AND client_id = \(Self.clientID) AND sub = \(sub) AND id > \(deletion)"))
        try await api.lifecycle.run(lateRevoke)
        #expect(api.fake.refreshTokens(clientID: Self.clientID, sub: sub).allSatisfy { api.fake.isRevoked(refreshToken: $0) == true })
    }

}
