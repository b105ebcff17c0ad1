import Foundation
import HTTPServer
import Locking

/// The user `GET /auth/authorize` answers for: a `sub`, the name Apple would put in `user`, an
/// email; or the user pressing Cancel.
package struct FakeAppleAuthorizeUser: Sendable {
    package var sub: String
    package var firstName: String?
    package var lastName: String?
    package var email: String?
    package var cancels: Bool

    package init(sub: String, firstName: String? = nil, lastName: String? = nil, email: String? = nil, cancels: Bool = false) {
        self.sub = sub
        self.firstName = firstName
        self.lastName = lastName
        self.email = email
        self.cancels = cancels
    }
}

extension FakeApple {
    /// Every later `GET /auth/authorize` answers for `user` at once, without its chooser (nil: the chooser again).
    package func authorizeAs(_ user: FakeAppleAuthorizeUser?) {
        state.withLock { $0.authorizeUser = user }
    }

    /// `GET /auth/authorize` as Apple serves it to a website or an Android app (`response_mode=form_post`):
    /// a page that posts the answer to `redirect_uri` by itself: `state`, `code`, `id_token` (its
    /// `nonce` claim the one given, the code bound to that redirect URI) and `user` with the name, or
    /// `error=user_cancelled_authorize`. Who signs in: `authorizeAs`'s user, else the query's `sub`
    /// (and `first_name`, `last_name`, `email`, `cancel`) that its chooser page sends back here.
    func authorize(_ query: [String: String]) -> HTTPResponse {
        guard let clientID = query["client_id"], !clientID.isEmpty, let redirectURI = query["redirect_uri"],
            let scheme = URLComponents(string: redirectURI)?.scheme?.lowercased(), ["http", "https"].contains(scheme),
            query["response_mode"] == "form_post", query["response_type"]?.split(separator: " ").contains("code") == true
        else {
            return Self.page(status: 400, title: "invalid_request", body: "<p>invalid_request: client_id, an http(s) redirect_uri, response_mode=form_post and response_type with code are required.</p>")
        }
        let chosen = state.withLock { $0.authorizeUser }
        let user: FakeAppleAuthorizeUser
        if let chosen {
            user = chosen
        } else if let sub = query["sub"], !sub.isEmpty {
            user = FakeAppleAuthorizeUser(
                sub: sub, firstName: query["first_name"].flatMap { $0.isEmpty ? nil : $0 },
                lastName: query["last_name"].flatMap { $0.isEmpty ? nil : $0 }, email: query["email"].flatMap { $0.isEmpty ? nil : $0 },
                cancels: query["cancel"] != nil)
        } else {
            return chooser(query)
        }
        var fields: [(String, String)] = []
        if let state = query["state"] { fields.append(("state", state)) }
        if user.cancels {
            fields.append(("error", "user_cancelled_authorize"))
        } else {
            let issued = issueIdentityToken(
                clientID: clientID, sub: user.sub, nonce: query["nonce"] ?? "", email: user.email,
                isPrivateEmail: user.email.map { $0.hasSuffix("@privaterelay.appleid.com") }, redirectURI: redirectURI)
            fields += [("code", issued.authorizationCode), ("id_token", issued.identityToken)]
            if user.firstName != nil || user.lastName != nil {
                var name: [String: String] = [:]
                name["firstName"] = user.firstName
                name["lastName"] = user.lastName
                var object: [String: Any] = ["name": name]
                if let email = user.email { object["email"] = email }
                let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
                fields.append(("user", String(decoding: data, as: UTF8.self)))
            }
        }
        let inputs = fields.map { #"<input type="hidden" name="\#(Self.escape($0.0))" value="\#(Self.escape($0.1))">"# }.joined()
        return Self.page(
            title: "Signing in", onload: "document.forms[0].submit()",
            body: #"<form method="post" action="\#(Self.escape(redirectURI))">\#(inputs)<noscript><button>Continue</button></noscript></form>"#)
    }

    /// The fake's own sign-in page: who to sign in as, Continue or Cancel (sent back to `/auth/authorize`).
    private func chooser(_ query: [String: String]) -> HTTPResponse {
        let kept = ["response_type", "response_mode", "client_id", "redirect_uri", "scope", "state", "nonce"].compactMap { name in
            query[name].map { #"<input type="hidden" name="\#(name)" value="\#(Self.escape($0))">"# }
        }.joined()
        let body = #"""
            <h1>Sign in with Apple (fake)</h1>
            <p>\#(Self.escape(query["client_id"] ?? "")) asks for \#(Self.escape(query["scope"] ?? "nothing")).</p>
            <form method="get" action="/auth/authorize">\#(kept)
            <p><label>sub <input name="sub" value="000001.fake.user"></label></p>
            <p><label>first name <input name="first_name" value="Jane"></label> <label>last name <input name="last_name" value="Appleseed"></label></p>
            <p><label>email <input name="email" value="jane@privaterelay.appleid.com"></label></p>
            <p><button type="submit">Continue</button> <button type="submit" name="cancel" value="1">Cancel</button></p>
            </form>
            """#
        return Self.page(title: "Sign in with Apple (fake)", body: body)
    }

    /// `POST /fake/authorize-user {"sub", "first_name"?, "last_name"?, "email"?, "cancel"?}`: as `authorizeAs`;
    /// `{}` brings the chooser back.
    func adminAuthorizeUser(_ request: HTTPRequest) -> HTTPResponse {
        guard let object = try? JSONSerialization.jsonObject(with: Data(request.body)) as? [String: Any] else {
            return Self.oauthError("invalid_request")
        }
        guard let sub = object["sub"] as? String, !sub.isEmpty else {
            authorizeAs(nil)
            return Self.json(["authorize": "chooser"])
        }
        authorizeAs(
            FakeAppleAuthorizeUser(
                sub: sub, firstName: object["first_name"] as? String, lastName: object["last_name"] as? String,
                email: object["email"] as? String, cancels: object["cancel"] as? Bool ?? false))
        return Self.json(["authorize": sub])
    }

    /// `GET /fake/signed-in`: a return page for `siwa dev`'s web sign-in (a website's own page in
    /// production): what came back, and how the app's back end redeems the ticket.
    func signedInPage(_ query: [String: String]) -> HTTPResponse {
        var body = "<h1>Back from Sign in with Apple</h1>"
        if let ticket = query["siwa_ticket"] {
            body += #"<p>siwa_ticket: <code id="ticket">\#(Self.escape(ticket))</code></p>"#
            body += #"<p>The app's back end finishes the sign-in (single use, 5 minutes):</p><pre>curl -s -X POST "$SIWA_APP_API_URL/v1/sign-in" -H "Authorization: Bearer $(cut -d, -f1 "$SIWA_APP_API_TOKENS_FILE")" -d '{"ticket":"\#(Self.escape(ticket))"}'</pre>"#
        }
        if let error = query["siwa_error"] { body += #"<p>siwa_error: <code id="error">\#(Self.escape(error))</code></p>"# }
        if let appState = query["siwa_app_state"] { body += #"<p>siwa_app_state: <code id="app-state">\#(Self.escape(appState))</code></p>"# }
        return Self.page(title: "Signed in (fake return page)", body: body)
    }

    static func page(status: Int = 200, title: String, onload: String? = nil, body: String) -> HTTPResponse {
        let load = onload.map { #" onload="\#($0)""# } ?? ""
        let html = #"<!doctype html><html><head><meta charset="utf-8"><title>\#(title)</title></head><body\#(load)>\#(body)</body></html>"#
        return HTTPResponse(
            status: status, headers: [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")], body: Array(html.utf8))
    }

    static func escape(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.append(character)
            }
        }
        return out
    }
}
