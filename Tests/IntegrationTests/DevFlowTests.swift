import Foundation
import OutboundHTTP
import Postgres
import Synchronization
import TestTiming
import Testing

/// The README's promise: a new user runs `siwa dev`, pastes the printed `siwa simulate ...` line, and
/// sees the notification arrive, be verified, stored and applied. Ctrl-C (SIGINT) stops it all.
@Suite(.serialized) struct DevFlowTests {
    /// `siwa dev` over a database of ours (`DATABASE_URL` set).
    @Test func printedSimulateLineWorksAgainstGivenDatabase() async throws {
        let database = try await LifecycleHarness.makeDatabase()
        do {
            let dev = try await startDev(["DATABASE_URL": database.url])
            let output = try await runPrintedSimulateLine(dev)
            try await expectApplied(output, databaseURL: database.url)
            try await expectPrintedSignInLineSignsIn(dev, databaseURL: database.url)
            try await expectPrintedWebSignInStartsAtTheFake(dev)
            try await interruptAndExpectCleanStop(dev, output: output)
        } catch {
            await database.drop()
            throw error
        }
        await database.drop()
    }

    /// `siwa dev` with `DATABASE_URL` unset: its own throwaway cluster, removed on Ctrl-C.
    @Test func printedSimulateLineWorksAgainstOwnCluster() async throws {
        let dev = try await startDev([:])
        let output = try await runPrintedSimulateLine(dev, timeout: .seconds(60))
        let dataDirectory = try #require(Self.capture(#"data in (/tmp/siwa-pg-[A-Za-z0-9]+)"#, in: dev.log))
        #expect(FileManager.default.fileExists(atPath: dataDirectory))
        let databaseURL = try #require(Self.capture(#"DATABASE_URL +(\S+)"#, in: dev.log))
        try await expectApplied(output, databaseURL: databaseURL)
        try await interruptAndExpectCleanStop(dev, output: output)
        #expect(dev.log.contains("PostgreSQL stopped and its directory removed"))
        #expect(!FileManager.default.fileExists(atPath: dataDirectory), "the throwaway cluster is deleted")
    }

    // MARK: Steps

    /// Every listener on port 0 (other tests may hold 8080/9090): dev reads back the ports its
    /// children bound and prints those, so the printed lines below only work when it read them right.
    private func startDev(_ environment: [String: String], ready marker: String = " simulate consent-revoked ")
        async throws -> ServiceProcess
    {
        let dev = try ServiceProcess(
            "siwa", arguments: ["dev"],
            environment: environment.merging([
                "SIWA_LISTEN": "127.0.0.1:0", "SIWA_OPS_LISTEN": "127.0.0.1:0", "SIWA_APP_API_LISTEN": "127.0.0.1:0",
                "SIWA_DEV_EXIT_AFTER": "120",  // a bound if the test dies before its SIGINT
                "HOME": ProcessInfo.processInfo.environment["HOME"] ?? "/tmp",
            ]) { $1 })
        // Up (it printed its lines), or gone; the callers' own bounded waits judge the rest.
        try? await waitUntil("siwa dev printed \(marker) or ended", timeout: .seconds(90), every: .milliseconds(100)) {
            !dev.isRunning || dev.log.contains(marker)
        }
        return dev
    }

    struct PrintedLine {
        var sub: String
        var clientID: String
    }

    /// Waits for the printed `... simulate consent-revoked ...` line and runs it exactly as printed.
    private func runPrintedSimulateLine(_ dev: ServiceProcess, timeout: Duration = .seconds(30)) async throws -> PrintedLine {
        let (words, _) = try await runPrintedLine(dev, containing: " simulate consent-revoked ", timeout: timeout)
        func flag(_ name: String) -> String? { words.firstIndex(of: name).map { words[$0 + 1] } }
        return PrintedLine(sub: try #require(flag("--sub")), clientID: try #require(flag("--client-id")))
    }

    /// The printed `... simulate sign-in ...` line, run as printed: nonce, the fake Apple's identity
    /// token for its hash, sign-in with the code. It prints the verified identity, and the account is
    /// active with the exchanged token stored.
    private func expectPrintedSignInLineSignsIn(_ dev: ServiceProcess, databaseURL: String) async throws {
        let (words, output) = try await runPrintedLine(dev, containing: " simulate sign-in ", timeout: .seconds(30))
        // The token comes from a file the line names, never as a flag.
        let tokenFile = try #require(lastAssignments["SIWA_APP_API_TOKENS_FILE"], "\(words)")
        let token = try String(contentsOfFile: tokenFile, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(token.count >= 32 && !dev.log.contains("--api-token") && !words.joined(separator: " ").contains(token))
        let answer = try #require(
            try JSONSerialization.jsonObject(with: Data(output.dropFirst(4).utf8)) as? [String: Any], "\(output)")
        let sub = try #require(words.firstIndex(of: "--sub").map { words[$0 + 1] })
        #expect(answer["sub"] as? String == sub && answer["status"] as? String == "active")
        #expect(answer["has_refresh_token"] as? Bool == true && answer["new"] as? Bool == true)
        let db = try await PostgresConnection.connect(to: databaseURL, logger: TestDatabase.logger)
        defer { db.close() }
        let stored = try await db.query(
            "SELECT count(*) FROM siwa.accounts WHERE sub = \(sub) AND status = 'active' AND refresh_token_enc IS NOT NULL")
        #expect(try stored[0].decode(Int.self, at: 0) == 1)

        // The same line as a load (the sign-in benchmark's driver): lanes of keep-alive connections,
        // each sign-in a new `sub`, every one stored.
        var load = words
        load[try #require(load.firstIndex(of: "--sub")) + 1] = "\(sub)-load"
        // Siwa.run's output goes to files: a blocking read to the end of a pipe would hang for good if
        // a process started meanwhile by another test inherited the pipe's write end.
        let load7 = try await Siwa.run(
            Array(load.dropFirst()) + ["--count", "7", "--concurrency", "3"], environment: lastAssignments,
            timeout: .seconds(120))
        let (status, text) = (load7.status, load7.stdout + load7.stderr)
        #expect(status == 0 && text.contains("RESULT sign_ins=7 failures=0 "), "\(text)")
        let loaded = try await db.query(
            "SELECT count(*) FROM siwa.accounts WHERE sub LIKE \(sub + "-load-%") AND status = 'active' AND refresh_token_enc IS NOT NULL")
        #expect(try loaded[0].decode(Int.self, at: 0) == 7)
    }

    /// The printed web sign-in URL starts a sign-in at the fake Apple whose redirect URI is the
    /// receiver's own: its public URL named port 0, which the receiver took as the port it bound.
    private func expectPrintedWebSignInStartsAtTheFake(_ dev: ServiceProcess) async throws {
        let log = dev.log
        let receiver = try #require(Self.capture(#"receiver health +(http://\S+)/healthz"#, in: log), "\(log)")
        let apple = try #require(Self.capture(#" Apple +(https?://\S+)"#, in: log), "\(log)")
        let start = try #require(Self.capture(#"web sign-in +(http://\S+)"#, in: log), "\(log)")
        #expect(!receiver.hasSuffix(":0") && start.hasPrefix(receiver + "/apple/sign-in?"), "\(receiver) \(start)")
        let answer = try await HTTP.client.send(
            HTTPRequest(method: "GET", url: start, headers: [], body: [], timeout: TestTimeScale.scaled(.seconds(30))))
        let location = answer.headers["location"] ?? ""
        #expect(answer.status == 302 && location.hasPrefix(apple + "/auth/authorize?"), "\(answer.status) \(location)")
        #expect(WebSignInStack.query(of: location)["redirect_uri"] == receiver + "/apple/sign-in/callback", "\(location)")
    }

    /// Waits for a printed line containing `marker`, runs it exactly as printed, expects exit 0 and
    /// an answer starting with 200; returns its words and output (`lastAssignments`: the environment it set).
    private func runPrintedLine(_ dev: ServiceProcess, containing marker: String, timeout: Duration) async throws -> (
        [String], String
    ) {
        let line = try await dev.firstLogLine("a line with \(marker)", timeout: timeout) { $0.contains(marker) ? String($0) : nil }
        var words = line.split(separator: " ").map(String.init)
        // Leading NAME=value words are the environment the line sets (how secrets stay off the
        // command line, where every local user could read them).
        var assignments: [String: String] = [:]
        while let first = words.first, let equals = first.firstIndex(of: "="), first.prefix(while: { $0 != "=" }).allSatisfy({ $0.isUppercase || $0 == "_" }) {
            assignments[String(first[..<equals])] = String(first[first.index(after: equals)...])
            words.removeFirst()
        }
        // The first word runs as printed: `siwa` only when that is on PATH, else the binary's full path.
        let executable = words[0] == "siwa" ? try Siwa.binary().path : words[0]
        #expect(FileManager.default.isExecutableFile(atPath: executable), "\(line)")
        // Output to a file and a polled, bounded wait: a blocking read here would hold one of the
        // test process's few cooperative threads for the whole run and stall other suites.
        let outcome = try await ProgramRun.run(
            executable, Array(words.dropFirst()),
            environment: ProcessInfo.processInfo.environment.merging(assignments) { $1 }, mergeOutput: true)
        let text = outcome.stdout
        #expect(outcome.status == 0, "\(text)")
        #expect(text.hasPrefix("200"), "\(text)")
        lastAssignments = assignments
        return (words, text)
    }

    /// The environment the last line run by `runPrintedLine` set.
    private var lastAssignments: [String: String] {
        get { Self.assignments.withLock { $0 } }
        nonmutating set { Self.assignments.withLock { $0 = newValue } }
    }
    private static let assignments = Mutex<[String: String]>([:])

    /// Stored, verified (it is in the table at all), processed, applied: the account is consent_revoked.
    private func expectApplied(_ printed: PrintedLine, databaseURL: String) async throws {
        let db = try await PostgresConnection.connect(to: databaseURL, logger: TestDatabase.logger)
        defer { db.close() }
        try await db.waitFor(
            """
            SELECT count(*) FROM siwa.accounts
             WHERE client_id = \(printed.clientID) AND sub = \(printed.sub) AND status = 'consent_revoked'
               AND sessions_revoked_at IS NOT NULL
            """) { $0 == 1 }
        let outcome = try await db.query(
            "SELECT outcome FROM siwa.notifications WHERE sub = \(printed.sub) AND processed_at IS NOT NULL"
        ).first?.decode(String?.self, at: 0)
        #expect(outcome == "applied")
    }

    private func interruptAndExpectCleanStop(_ dev: ServiceProcess, output: PrintedLine) async throws {
        let receiverURL = try #require(Self.capture(#"receiver health +(http://\S+)/healthz"#, in: dev.log))
        dev.signal(SIGINT)
        let status = await dev.waitForExit(timeout: .seconds(30))
        #expect(status == 0, "\(dev.log)")
        let log = dev.log
        #expect(log.contains("SIGINT: stopping"))
        for child in ["worker", "receiver", "fake-apple"] {
            #expect(log.contains("[dev] \(child) stopped (status 0)"), "\(child) stopped cleanly:\n\(log)")
        }
        let answer = try? await HTTP.request("GET", receiverURL + "/healthz")
        #expect(answer == nil, "the receiver still answers after Ctrl-C")
    }

    static func capture(_ pattern: String, in text: String) -> String? {
        guard let regex = try? NSRegularExpression(pattern: pattern),
            let match = regex.firstMatch(in: text, range: NSRange(text.startIndex..., in: text)),
            let range = Range(match.range(at: 1), in: text)
        else { return nil }
        return String(text[range])
    }
}
