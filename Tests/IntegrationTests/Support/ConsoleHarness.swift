import Foundation
import OutboundHTTP
import TestTiming
import Testing

/// `siwa console` as a real process, and the HTTP a browser would speak to it: cookies and
/// redirects handled by hand (the tests check them).
final class ConsoleProcess: @unchecked Sendable {
    // @unchecked: touched only from the test's own task.
    let process: ServiceProcess
    /// `http://127.0.0.1:PORT`, no trailing slash.
    let base: String

    init(databaseURL: String, listen: String = "127.0.0.1:0", environment: [String: String] = [:]) async throws {
        process = try ServiceProcess(
            "siwa", arguments: ["console", "--listen", listen],
            environment: ["DATABASE_URL": databaseURL, "SIWA_LOG_LEVEL": "debug"].merging(environment) { $1 })
        let printed = try await process.firstLogLine("its console line") { line in
            line.range(of: #"console on http://[0-9.]+:[0-9]+/"#, options: .regularExpression)
                .map { String(line[$0].dropFirst("console on ".count).dropLast()) }
        }
        // A wildcard listener is dialled on loopback.
        base = printed.replacingOccurrences(of: "//0.0.0.0:", with: "//127.0.0.1:")
    }

    func stop() async { await process.stop() }
}

/// One answer, with the headers the tests look at.
struct ConsoleAnswer: Sendable {
    var status: Int
    var headers: [String: String]
    var body: String

    func header(_ name: String) -> String? {
        headers.first { $0.key.lowercased() == name.lowercased() }?.value
    }

    /// The session cookie's value from `Set-Cookie`, if one was set.
    var sessionCookie: String? {
        guard let setCookie = header("Set-Cookie"), let range = setCookie.range(of: #"siwa_console=[A-Za-z0-9_-]+"#, options: .regularExpression)
        else { return nil }
        return String(setCookie[range])
    }

    /// The anti-forgery token of the page's forms.
    var formToken: String? {
        guard let range = body.range(of: #"name="csrf" value="[^"]+""#, options: .regularExpression) else { return nil }
        return String(body[range].dropFirst(#"name="csrf" value=""#.count).dropLast())
    }
}

/// The browser's side, by hand: the test client never follows a redirect (a 303 comes back as it
/// is) and keeps no cookies.
enum ConsoleHTTP {
    static func get(_ url: String, cookie: String? = nil, host: String? = nil) async throws -> ConsoleAnswer {
        try await send("GET", url, cookie: cookie, host: host)
    }

    /// A form POST (`application/x-www-form-urlencoded`).
    static func post(_ url: String, form: [String: String] = [:], cookie: String? = nil) async throws -> ConsoleAnswer {
        let body = form.map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")" }
            .joined(separator: "&")
        return try await send("POST", url, body: Data(body.utf8), cookie: cookie)
    }

    private static func send(_ method: String, _ url: String, body: Data? = nil, cookie: String?, host: String? = nil) async throws
        -> ConsoleAnswer
    {
        var headers: [(String, String)] = []
        if body != nil { headers.append(("Content-Type", "application/x-www-form-urlencoded")) }
        if let cookie { headers.append(("Cookie", cookie)) }
        if let host { headers.append(("Host", host)) }
        let response = try await HTTP.client.send(
            HTTPRequest(
                method: method, url: url, headers: headers, body: Array(body ?? Data()),
                timeout: TestTimeScale.scaled(.seconds(30))))
        return ConsoleAnswer(status: response.status, headers: response.headers, body: String(decoding: response.body, as: UTF8.self))
    }
}
