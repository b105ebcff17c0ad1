import Foundation
import OutboundHTTP

/// The CLI's calls to our own servers (readiness checks, the fake Apple's key, the receiver) over
/// the one HTTP client; a caller that needs a private CA passes it (`SIWA_CA_FILE`).
enum CLIHTTP {
    struct Answer {
        var status: Int
        var body: String
    }

    static func call(
        _ method: String, _ url: URL, json: Data? = nil, bearer: String? = nil, timeout: Duration = .seconds(30),
        caCertificates: String? = nil
    ) async throws -> Answer {
        var headers: [(String, String)] = []
        if json != nil { headers.append(("Content-Type", "application/json")) }
        if let bearer { headers.append(("Authorization", "Bearer \(bearer)")) }
        let response = try await HTTPClient(extraCertificatesPEM: caCertificates).send(
            HTTPRequest(method: method, url: url.absoluteString, headers: headers, body: Array(json ?? Data()), timeout: timeout))
        return Answer(status: response.status, body: String(decoding: response.body, as: UTF8.self))
    }
}
