import JSON

/// The shapes the app API's endpoints are declared with (`AppAPIEndpoints`). One declaration
/// serves three readers: the router matches paths and methods with it, the decoders check bodies
/// and queries against it, and `AppAPIOpenAPI` writes the OpenAPI document from it, so the
/// document cannot say what the server does not do.
struct AppAPIField: Sendable {
    enum Kind: Sendable {
        /// A string of at most `maxLength` characters (Unicode scalars, as JSON Schema counts
        /// them), at least `minLength`; never with U+0000 (PostgreSQL's text cannot hold it).
        case string(minLength: Int = 0, maxLength: Int)
        /// An object whose members are all optional strings (or null) of at most `maxLength`.
        case stringMembers([String], maxLength: Int)
    }

    var name: String
    var kind: Kind
    var required = false
    /// Whether `null` is accepted (for an optional field: the same as leaving it out).
    var nullable = true
    var summary: String
}

/// An integer query parameter.
struct AppAPIQueryParameter: Sendable {
    var name: String
    var minimum: Int64
    var maximum: Int64
    var defaultValue: Int64
    var summary: String
}

/// One path segment: fixed text, or a named parameter (a non-empty string without U+0000).
enum AppAPIPathSegment: Sendable, Equatable {
    case literal(String)
    case parameter(String)
}

/// One operation of the app API.
struct AppAPIEndpoint: Sendable {
    /// The metrics' endpoint label and the document's `operationId`.
    var name: String
    var method: String
    var path: [AppAPIPathSegment]
    var summary: String
    /// The JSON body's fields; nil: the operation takes no body.
    var body: [AppAPIField]?
    /// Whether a body must be sent (false: an empty body reads as `{}`).
    var bodyRequired = true
    /// A second form of the body, read instead of `body` when the body has its member `when`
    /// (`POST /v1/sign-in {"ticket"}`).
    var alternateBody: AppAPIBodyForm? = nil
    var query: [AppAPIQueryParameter] = []
    var successStatus: Int
    /// JSON Schema of the success answer (a function: a schema is not Sendable data).
    var successSchema: @Sendable () -> [String: Any]
    /// The errors this operation answers besides the ones every operation may give
    /// (`AppAPIEndpoints.commonErrors`).
    var errors: [AppAPIError]

    /// `/v1/accounts/{client_id}/{sub}`, as the document writes it.
    var pathTemplate: String {
        "/" + path.map { segment in
            switch segment {
            case .literal(let text): text
            case .parameter(let name): "{\(name)}"
            }
        }.joined(separator: "/")
    }

    /// The path parameters when `parts` (the path split at `/`, after the leading one) is this
    /// endpoint's path; nil when it is not.
    func match(_ parts: [String]) -> [String: String]? {
        guard parts.count == path.count else { return nil }
        var parameters: [String: String] = [:]
        for (segment, part) in zip(path, parts) {
            switch segment {
            case .literal(let text): guard part == text else { return nil }
            case .parameter(let name): parameters[name] = part
            }
        }
        return parameters
    }
}

/// The other form of an endpoint's body: its fields, chosen when the body has the member `when`.
struct AppAPIBodyForm: Sendable {
    var when: String
    var fields: [AppAPIField]
}

/// A request checked against its endpoint: the path parameters, the body's members and the query.
struct AppAPIInput: Sendable {
    var parameters: [String: String]
    var body: [String: JSONValue]
    var query: [String: Int64]

    /// A string member; nil when absent or null (and, for `emptyIsAbsent`, when empty).
    func string(_ name: String, emptyIsAbsent: Bool = false) -> String? {
        guard case .string(let text)? = body[name] else { return nil }
        return emptyIsAbsent && text.isEmpty ? nil : text
    }

    /// Whether the member was sent (null included).
    func has(_ name: String) -> Bool { body[name] != nil }

    /// An object of string members, without the null or empty ones; nil when absent, null, or
    /// left with no member (an authorization after the first sends an empty name: not a new name).
    func stringMembers(_ name: String) -> [String: String]? {
        guard case .object(let members)? = body[name] else { return nil }
        var kept: [String: String] = [:]
        for (key, value) in members { if case .string(let text) = value, !text.isEmpty { kept[key] = text } }
        return kept.isEmpty ? nil : kept
    }

    /// Checks `request`'s path parameters, body and query against `endpoint`; the first rule
    /// broken is the error, naming the field (never the value).
    static func decode(
        _ endpoint: AppAPIEndpoint, parameters: [String: String], body bytes: [UInt8], query: [String: String]
    ) -> Result<AppAPIInput, AppAPIError> {
        for (name, value) in parameters.sorted(by: { $0.key < $1.key }) {
            if value.isEmpty || value.unicodeScalars.contains("\u{0}") {
                return .failure(.badRequest("path parameter \(name) must be a non-empty string without U+0000"))
            }
        }
        var members: [String: JSONValue] = [:]
        if let fields = endpoint.body {
            if bytes.isEmpty && !endpoint.bodyRequired {
                members = [:]
            } else {
                guard let object = JSONValue.object(bytes) else { return .failure(.badRequest("the body must be a JSON object")) }
                members = object
            }
            let form = endpoint.alternateBody.flatMap { members[$0.when] != nil ? $0.fields : nil } ?? fields
            for field in form {
                if let problem = check(field, members[field.name]) { return .failure(.badRequest(problem)) }
            }
        }
        var numbers: [String: Int64] = [:]
        for parameter in endpoint.query {
            guard let text = query[parameter.name] else {
                numbers[parameter.name] = parameter.defaultValue
                continue
            }
            guard let value = Int64(text), (parameter.minimum...parameter.maximum).contains(value) else {
                return .failure(
                    .badRequest("query parameter \(parameter.name) must be an integer from \(parameter.minimum) to \(parameter.maximum)"))
            }
            numbers[parameter.name] = value
        }
        return .success(AppAPIInput(parameters: parameters, body: members, query: numbers))
    }

    /// The rule `value` breaks for `field`, as a sentence; nil when it is fine.
    static func check(_ field: AppAPIField, _ value: JSONValue?) -> String? {
        guard let value else { return field.required ? "\(field.name) is required" : nil }
        if case .null = value { return field.nullable ? nil : "\(field.name) must not be null" }
        switch field.kind {
        case .string(let minimum, let maximum):
            guard case .string(let text) = value else { return "\(field.name) must be a string" }
            return checkString(text, name: field.name, minimum: minimum, maximum: maximum)
        case .stringMembers(let names, let maximum):
            guard case .object(let members) = value else { return "\(field.name) must be an object" }
            for name in names {
                switch members[name] {
                case nil, .null?: continue
                case .string(let text)?:
                    if let problem = checkString(text, name: "\(field.name).\(name)", minimum: 0, maximum: maximum) { return problem }
                default: return "\(field.name).\(name) must be a string"
                }
            }
            return nil
        }
    }

    private static func checkString(_ text: String, name: String, minimum: Int, maximum: Int) -> String? {
        let length = text.unicodeScalars.count
        if length < minimum { return minimum == 1 ? "\(name) must not be empty" : "\(name) is shorter than \(minimum) characters" }
        if length > maximum { return "\(name) is longer than \(maximum) characters" }
        if text.unicodeScalars.contains("\u{0}") { return "\(name) must not contain U+0000" }
        return nil
    }
}
