package import Foundation
import JOSE
import JSON

/// What Apple's token endpoint answers on success. `refreshToken` and `accessToken` are secrets.
package struct AppleTokenResponse: Sendable, Equatable {
    package var idToken: String?
    package var refreshToken: String?
    package var accessToken: String?

    package init(idToken: String?, refreshToken: String?, accessToken: String?) {
        self.idToken = idToken
        self.refreshToken = refreshToken
        self.accessToken = accessToken
    }
}

/// A call to Apple, classified by what the caller must do next.
package enum AppleCallOutcome<Value: Sendable & Equatable>: Sendable, Equatable {
    case success(Value)
    /// 5xx, timeout, connection failure: retry with backoff.
    case retryable(reason: String)
    /// 429: retry after the server's `Retry-After` when it sent one.
    case rateLimited(retryAfter: Duration?)
    /// 400 `invalid_client` / `unauthorized_client`: our keys or client ID are wrong.
    case configurationFault(error: String)
    /// 400 `invalid_grant`: the code or token is invalid, expired, used or revoked.
    case invalidGrant
    /// Any other 4xx (or unexpected answer), with Apple's `error` code when it sent one.
    case otherClientError(status: Int, code: String?)
}

/// Apple's Sign in with Apple REST endpoints: code exchange, refresh, revoke.
///
/// Every call mints a fresh client_secret; nothing it sends (secret, code, token) is logged or
/// put in an outcome.
package struct AppleAuthClient: Sendable {
    package let http: AppleHTTP
    package let signer: ClientSecretSigner

    package init(http: AppleHTTP, signer: ClientSecretSigner) {
        self.http = http
        self.signer = signer
    }

    /// `POST {base}/auth/token` with `grant_type=authorization_code`; `redirectURI`: the one a web
    /// authorization used (Apple refuses such a code without it, or with another).
    package func exchange(code: String, clientID: String, redirectURI: String? = nil) async -> AppleCallOutcome<AppleTokenResponse> {
        let redirect = redirectURI.map { [("redirect_uri", $0)] } ?? []
        return await tokenCall(clientID: clientID, fields: [("code", code), ("grant_type", "authorization_code")] + redirect)
    }

    /// `POST {base}/auth/token` with `grant_type=refresh_token` (reconciliation: is the token alive?).
    package func refresh(refreshToken: String, clientID: String) async -> AppleCallOutcome<AppleTokenResponse> {
        await tokenCall(clientID: clientID, fields: [("refresh_token", refreshToken), ("grant_type", "refresh_token")])
    }

    /// `POST {base}/auth/revoke` for a refresh token. Apple answers 200 even for an unknown token.
    package func revoke(refreshToken: String, clientID: String) async -> AppleCallOutcome<Bool> {
        let secret: String
        do { secret = try signer.makeSecret(clientID: clientID) } catch {
            return .configurationFault(error: "client_secret_signing_failed")
        }
        let fields = [
            ("client_id", clientID), ("client_secret", secret), ("token", refreshToken),
            ("token_type_hint", "refresh_token"),
        ]
        do {
            let response = try await http.postForm("auth/revoke", fields: fields)
            return Self.classify(response) { _ in true }
        } catch {
            return Self.classify(transportError: error)
        }
    }

    private func tokenCall(clientID: String, fields extra: [(String, String)]) async -> AppleCallOutcome<
        AppleTokenResponse
    > {
        let secret: String
        do { secret = try signer.makeSecret(clientID: clientID) } catch {
            return .configurationFault(error: "client_secret_signing_failed")
        }
        let fields = [("client_id", clientID), ("client_secret", secret)] + extra
        do {
            let response = try await http.postForm("auth/token", fields: fields)
            // The project's strict reader, not JSONSerialization (which bridged every value to an
            // object, a tenth of a sign-in's CPU): an answer it refuses is malformed.
            return Self.classify(response) { body in
                guard let object = JSONValue.object(body) else { return nil }
                return AppleTokenResponse(
                    idToken: object["id_token"]?.stringValue, refreshToken: object["refresh_token"]?.stringValue,
                    accessToken: object["access_token"]?.stringValue)
            }
        } catch {
            return Self.classify(transportError: error)
        }
    }

    /// Maps an HTTP answer to an outcome; `decode` turns a 200 body into the value (nil: malformed).
    package static func classify<Value>(
        _ response: AppleHTTPResponse, now: Date = Date(), decode: ([UInt8]) -> Value?
    ) -> AppleCallOutcome<Value> {
        switch response.status {
        case 200..<300:
            guard let value = decode(response.body) else { return .retryable(reason: "malformed_response") }
            return .success(value)
        case 429:
            return .rateLimited(retryAfter: RetryAfter.parse(response.headers["retry-after"], now: now))
        case 500...:
            return .retryable(reason: "http_\(response.status)")
        default:
            let code = response.oauthError
            switch code {
            case "invalid_client", "unauthorized_client": return .configurationFault(error: code ?? "invalid_client")
            case "invalid_grant": return .invalidGrant
            default: return .otherClientError(status: response.status, code: code.map(sanitize))
            }
        }
    }

    package static func classify<Value>(transportError error: any Error) -> AppleCallOutcome<Value> {
        if let transport = error as? AppleTransportError { return .retryable(reason: transport.kind.rawValue) }
        return .retryable(reason: "connection")
    }

    /// Apple's `error` field is foreign text: keep it short and plain before it is stored anywhere.
    static func sanitize(_ code: String) -> String {
        String(code.unicodeScalars.filter { $0.isASCII && ($0.properties.isAlphabetic || $0 == "_") }.prefix(40))
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.
package enum RetryAfter {
    /// Longest wait honoured; a larger value is clamped (a hostile or broken answer cannot park a job).
    package static let maximum: Duration = .seconds(3600)

    package static func parse(_ value: String?, now: Date = Date()) -> Duration? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if value.allSatisfy(\.isNumber) {
            guard let seconds = Int64(value) else { return maximum }
            return min(.seconds(seconds), maximum)
        }
        guard let date = httpDate(value) else { return nil }
        let seconds = max(0, date.timeIntervalSince(now))
        return min(.seconds(seconds.rounded(.up)), maximum)
    }

    /// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), plus the obsolete RFC 850 and asctime forms.
    static func httpDate(_ text: String) -> Date? {
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: text) { return date }
        }
        return nil
    }
}
