import Foundation
import OutboundHTTP

/// The CLI's calls to our own servers (readiness checks, the fake Apple's key, the receiver, the app
/// API) over the one HTTP client; a caller that needs a private CA passes it (`SIWA_CA_FILE`).
enum CLIHTTP {
    struct Answer {
        var status: Int
        var body: String
    }

    /// Who was called and which setting points elsewhere, for the one line a failed call prints.
    struct Target {
        var what: String
        var hint: String
    }

    static func call(
        _ method: String, _ url: URL, json: Data? = nil, bearer: String? = nil, timeout: Duration = .seconds(30),
        caCertificates: String? = nil, target: Target? = nil
    ) async throws -> Answer {
        var headers: [(String, String)] = []
        if json != nil { headers.append(("Content-Type", "application/json")) }
        if let bearer { headers.append(("Authorization", "Bearer \(bearer)")) }
        do {
            let response = try await HTTPClient(extraCertificatesPEM: caCertificates).send(
                HTTPRequest(method: method, url: url.absoluteString, headers: headers, body: Array(json ?? Data()), timeout: timeout))
            return Answer(status: response.status, body: String(decoding: response.body, as: UTF8.self))
        } catch {
            guard let target else { throw error }
            let origin = "\(url.scheme ?? "http")://\(url.host ?? "?")\(url.port.map { ":\($0)" } ?? "")"
            // A certificate that did not verify is not a wrong address: say which setting trusts it.
            let hint = error.kind == .tls
                ? "SIWA_CA_FILE to the CA that signed its certificate (siwa dev prints it), or \(target.hint)" : target.hint
            throw CLIHTTPFailure(description: "cannot reach \(target.what) at \(origin) (\(error.kind.rawValue)); set \(hint)")
        }
    }
}

/// A call the CLI could not make, as one line for the operator (no path, query or header value).
struct CLIHTTPFailure: Error, CustomStringConvertible {
    var description: String
}
