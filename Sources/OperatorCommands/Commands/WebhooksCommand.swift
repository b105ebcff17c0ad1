import Foundation
import JobQueue
import Postgres
import Webhooks
import Settings
import Metrics

/// `siwa webhooks test|disable`: check an endpoint by hand, or stop queueing deliveries.
enum WebhooksCommand: CLICommand {
    static let name = "webhooks"
    static let summary = "test (send a signed test event to SIWA_WEBHOOK_URL, print the answer) | disable | sink"

    static func run(_ source: ConfigurationSource) async -> Int32 {
        switch source.positional.first {
        case "test": return await test(source)
        case "disable": return await disable(source)
        case "sink": return await WebhookSinkCommand.run(source)
        default:
            FileHandle.standardError.write(Data(usage.text().utf8))
            return 2
        }
    }

    // MARK: test

    /// What a receiver gets from `siwa webhooks test`: the change object's shape, `change`
    /// `webhook_test`, `id` 0 (no real change has it), and a `webhook-id` of its own each time.
    static func testEvent(at date: Date) -> (id: String, body: [UInt8]) {
        let id = "test_" + (0..<8).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()
        let body = """
            {"id":0,"client_id":null,"sub":null,"app_user_id":null,"change":"webhook_test","status":null,\
            "reason":null,"created_at":"\(date.formatted(.iso8601))"}
            """
        return (id, Array(body.utf8))
    }

    private static func test(_ source: ConfigurationSource) async -> Int32 {
        if let unknown = source.unknownFlags(known: WebhookSettings.variables + ["SIWA_WEBHOOK_SECRET_FILE", "SIWA_CA", "SIWA_CA_FILE"]).first {
            CLI.error(name, "--\(unknown): unknown option")
            return 2
        }
        let settings: WebhookSettings
        do {
            guard let parsed = try WebhookSettings.parse(source) else {
                CLI.error(name, "SIWA_WEBHOOK_URL: is required (or --webhook-url URL)")
                return 2
            }
            settings = parsed
        } catch {
            CLI.error(name, "\(error)")
            return 2
        }
        let client = WebhookClient(url: settings.url, timeout: settings.timeout, caCertificates: settings.caCertificates)
        let now = Date()
        let event = testEvent(at: now)
        let timestamp = Int64(now.timeIntervalSince1970)
        let headers = WebhookSignature.headers(id: event.id, timestamp: timestamp, body: event.body, secret: settings.secret)
        print("POST \(settings.endpoint)")
        for (header, value) in headers { print("  \(header): \(value)") }
        print("  body: \(String(decoding: event.body, as: UTF8.self))")
        let started = ContinuousClock.now
        let result = await client.send(body: event.body, headers: headers)
        let elapsed = ContinuousClock.now - started
        let milliseconds = Int((elapsed.seconds * 1000).rounded())
        switch result {
        case .answered(let status, let bodyPrefix):
            print("answered \(status) in \(milliseconds) ms")
            if !bodyPrefix.isEmpty { print("  body: \(bodyPrefix.prefix(300))") }
            if (200...299).contains(status) {
                print("OK: this answer counts as delivered")
                return 0
            }
            print("NOT DELIVERED: \(result.errorText); the worker would retry it")
        case .timedOut, .connectionFailed:
            print("NOT DELIVERED after \(milliseconds) ms: \(result.errorText)")
        }
        return 1
    }

    // MARK: disable

    private static func disable(_ source: ConfigurationSource) async -> Int32 {
        guard let (url, logger) = CLI.databaseSettings(name, source) else { return 2 }
        guard let connection = await CLI.connect(name, url: url, logger: logger) else { return 1 }
        defer { connection.close() }
        do {
            let cancelled = try await WebhookQueue.disable(on: connection)
            print(
                "webhooks disabled: no delivery is queued for new changes; cancelled \(cancelled) queued "
                    + "deliver\(cancelled == 1 ? "y" : "ies") (siwa jobs list --kind webhook --state cancelled)")
            print("a worker started with SIWA_WEBHOOK_URL enables them again, from its start on")
            return 0
        } catch {
            CLI.error(name, CLI.oneLine(error))
            return 1
        }
    }
}
