/// Every operation of the app API (Sources/AppAPI/README.md; the client flows: README.md, "App integration"),
/// declared once: `AppAPIServer` routes and decodes with these, `AppAPIOpenAPI` describes them.
enum AppAPIEndpoints {
    /// Longest authorization code accepted (Apple's are about 100 characters).
    static let maximumCodeLength = 2048
    /// Longest redirect URI accepted.
    static let maximumRedirectURILength = 2048
    /// Longest `app_user_id` accepted (the app's own identifier).
    static let maximumAppUserIDLength = 8192
    /// Longest member of `full_name`.
    static let maximumNamePartLength = 256
    /// The members of `full_name`: PersonNameComponents' (the web flow's `firstName`/`lastName`
    /// are `given_name`/`family_name`).
    static let namePartNames = ["given_name", "family_name", "middle_name", "name_prefix", "name_suffix", "nickname"]

    /// What any operation may answer besides its own errors: a path parameter holding an encoded
    /// `/` (or a `%00`, where the HTTP layer ends the path) lands on another path, 404 or 405.
    static let commonErrors: [AppAPIError] = [.unauthorized, .databaseUnavailable, .notFound, .methodNotAllowed]
    /// The HTTP layer's answer to a body over 16 KiB.
    static let payloadTooLarge = AppAPIError(status: 413, code: "payload_too_large")
    /// The HTTP layer's answer while the server stops.
    static let shuttingDown = AppAPIError(status: 503, code: "shutting_down")

    static let accountPath: [AppAPIPathSegment] = [.literal("v1"), .literal("accounts"), .parameter("client_id"), .parameter("sub")]

    static let nonces = AppAPIEndpoint(
        name: "nonces", method: "POST", path: [.literal("v1"), .literal("nonces")],
        summary: "Issues a single-use nonce; its SHA-256 (lowercase hex) goes into Apple's authorization request.",
        body: nil, successStatus: 201, successSchema: AppAPISchemas.nonce, errors: [.tooManyNonces])

    static let signIn = AppAPIEndpoint(
        name: "sign_in", method: "POST", path: [.literal("v1"), .literal("sign-in")],
        summary: "Verifies an identity token against a nonce, exchanges the authorization code, and records the sign-in.",
        body: [
            AppAPIField(name: "client_id", kind: .string(minLength: 1, maxLength: 255), required: true, nullable: false,
                        summary: "The bundle ID or Services ID the identity token was issued for."),
            AppAPIField(name: "identity_token", kind: .string(minLength: 1, maxLength: SignIn.maximumTokenBytes), required: true,
                        nullable: false, summary: "The identity token (JWT) Apple gave the client."),
            AppAPIField(name: "nonce", kind: .string(minLength: 1, maxLength: SignIn.maximumNonceBytes), required: true,
                        nullable: false, summary: "The raw nonce from POST /v1/nonces."),
            AppAPIField(name: "authorization_code", kind: .string(maxLength: maximumCodeLength),
                        summary: "The authorization code Apple gave the client; exchanged now (empty: none)."),
            AppAPIField(name: "redirect_uri", kind: .string(maxLength: maximumRedirectURILength),
                        summary: "The redirect URI of a web authorization (Services ID, Android); sent on the code exchange."),
            AppAPIField(name: "full_name", kind: .stringMembers(namePartNames, maxLength: maximumNamePartLength),
                        summary: "The user's name, which Apple gives the client on the first authorization only; absent: the stored name is kept."),
        ],
        alternateBody: AppAPIBodyForm(
            when: "ticket",
            fields: [
                AppAPIField(name: "ticket", kind: .string(minLength: 1, maxLength: TicketSignIn.maximumTicketLength), required: true,
                            nullable: false,
                            summary: "The siwa_ticket a web or Android sign-in returned with (GET /apple/sign-in on the receiver): the sign-in is finished with the identity token, nonce, code, redirect URI and name Apple posted to the receiver's callback. Single use, valid 5 minutes.")
            ]),
        successStatus: 200, successSchema: AppAPISchemas.signIn,
        errors: [.badRequest, .codeInvalid, .nonceInvalid, .tokenInvalid, .ticketInvalid, .accountDeleting, .tokenExchangeFailed,
                 .keysUnavailable])

    static let account = AppAPIEndpoint(
        name: "account", method: "GET", path: accountPath, summary: "The account, without its tokens.",
        body: nil, successStatus: 200, successSchema: AppAPISchemas.account, errors: [.badRequest, .accountNotFound])

    static let accountPatch = AppAPIEndpoint(
        name: "account_patch", method: "PATCH", path: accountPath, summary: "Sets the app's own user id on the account.",
        body: [
            AppAPIField(name: "app_user_id", kind: .string(maxLength: maximumAppUserIDLength), required: true,
                        summary: "The app's identifier for the user, or null to clear it.")
        ],
        successStatus: 200, successSchema: AppAPISchemas.account, errors: [.badRequest, .accountNotFound])

    static let deletion = AppAPIEndpoint(
        name: "deletion", method: "POST", path: accountPath + [.literal("deletion")],
        summary: "Deletes the account: revokes every refresh token at Apple, then marks it deleted.",
        body: [
            AppAPIField(name: "authorization_code", kind: .string(maxLength: maximumCodeLength),
                        summary: "A fresh authorization code (an account with no stored token, or one signed in again since its deletion): exchanged, and the token obtained revoked.")
        ],
        bodyRequired: false, successStatus: 202, successSchema: AppAPISchemas.deletion, errors: [.badRequest, .accountNotFound])

    static let changes = AppAPIEndpoint(
        name: "changes", method: "GET", path: [.literal("v1"), .literal("changes")],
        summary: "Account changes after an id, ascending.", body: nil,
        query: [
            AppAPIQueryParameter(name: "after", minimum: 0, maximum: Int64.max, defaultValue: 0, summary: "Changes with a larger id."),
            AppAPIQueryParameter(name: "limit", minimum: 1, maximum: 1000, defaultValue: 100, summary: "At most this many."),
        ],
        successStatus: 200, successSchema: AppAPISchemas.changes, errors: [.badRequest])

    static let openAPI = AppAPIEndpoint(
        name: "openapi", method: "GET", path: [.literal("v1"), .literal("openapi.json")],
        summary: "This document.", body: nil, successStatus: 200, successSchema: { ["type": "object"] }, errors: [])

    static let all = [nonces, signIn, account, accountPatch, deletion, changes, openAPI]
}
