import Foundation
import SiwaModel

/// JSON Schemas (2020-12, as OpenAPI 3.1 uses them) of the app API's answers, beside the
/// functions that write them (`AppAPIJSON`); Schemathesis checks every answer against them in CI.
enum AppAPISchemas {
    static func nullable(_ type: String, _ extra: [String: Any] = [:]) -> [String: Any] {
        extra.merging(["type": [type, "null"]]) { _, new in new }
    }

    static var timestamp: [String: Any] { ["type": "string", "format": "date-time"] }
    static var nullableTimestamp: [String: Any] { nullable("string", ["format": "date-time"]) }
    static var status: [String: Any] {
        ["type": "string", "enum": AccountStatus.allCases.map(\.rawValue)]
    }
    static var realUserStatus: [String: Any] {
        ["type": ["string", "null"], "enum": ["unsupported", "unknown", "likely_real", NSNull()]]
    }

    static func fullName() -> [String: Any] {
        var members: [String: Any] = [:]
        for name in AppAPIEndpoints.namePartNames {
            members[name] = ["type": "string", "maxLength": AppAPIEndpoints.maximumNamePartLength]
        }
        return ["type": ["object", "null"], "properties": members, "additionalProperties": false]
    }

    static func object(_ properties: [String: Any]) -> [String: Any] {
        ["type": "object", "properties": properties, "required": properties.keys.sorted(), "additionalProperties": false]
    }

    @Sendable static func nonce() -> [String: Any] {
        object(["nonce": ["type": "string", "minLength": 22], "expires_at": timestamp])
    }

    @Sendable static func signIn() -> [String: Any] {
        object([
            "client_id": ["type": "string"], "sub": ["type": "string"], "email": nullable("string"),
            "email_verified": nullable("boolean"), "is_private_email": nullable("boolean"), "status": status,
            "app_user_id": nullable("string"), "new": ["type": "boolean"], "has_refresh_token": ["type": "boolean"],
            "full_name": fullName(), "real_user_status": realUserStatus,
        ])
    }

    @Sendable static func account() -> [String: Any] {
        object([
            "client_id": ["type": "string"], "sub": ["type": "string"], "app_user_id": nullable("string"), "status": status,
            "email": nullable("string"), "is_private_email": nullable("boolean"),
            "email_forwarding": nullable("string", ["enum": ["enabled", "disabled", NSNull()]]),
            "sessions_revoked_at": nullableTimestamp, "linked_at": nullableTimestamp, "updated_at": nullableTimestamp,
            "has_refresh_token": ["type": "boolean"], "full_name": fullName(), "real_user_status": realUserStatus,
        ])
    }

    @Sendable static func deletion() -> [String: Any] {
        object(["job_id": ["type": "integer"], "status": status])
    }

    @Sendable static func changes() -> [String: Any] {
        let change = object([
            "id": ["type": "integer"], "client_id": ["type": "string"], "sub": ["type": "string"],
            "app_user_id": nullable("string"), "change": ["type": "string"], "status": nullable("string"),
            "reason": nullable("string"), "created_at": timestamp,
        ])
        return object(["changes": ["type": "array", "items": change], "next": ["type": "integer"]])
    }

    /// `{"error":"<code>","detail":"..."}` with the codes a status may carry.
    static func error(codes: [String]) -> [String: Any] {
        [
            "type": "object", "required": ["error"], "additionalProperties": false,
            "properties": ["error": ["type": "string", "enum": codes], "detail": ["type": "string"]],
        ]
    }
}
