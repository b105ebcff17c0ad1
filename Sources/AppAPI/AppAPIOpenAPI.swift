import Foundation

/// `GET /v1/openapi.json`: the OpenAPI 3.1 document of the app API, written from
/// `AppAPIEndpoints` (the declarations the router and the decoders use), so every path, method,
/// request field, status and error code in it is one the server has.
enum AppAPIOpenAPI {
    static func document(version: String = "1") -> [String: Any] {
        var paths: [String: [String: Any]] = [:]
        for endpoint in AppAPIEndpoints.all {
            paths[endpoint.pathTemplate, default: [:]][endpoint.method.lowercased()] = operation(endpoint)
        }
        return [
            "openapi": "3.1.0",
            "info": [
                "title": "siwa-notifications app API", "version": version,
                "description": "Sign in with Apple for apps on any stack: nonces, sign-in, accounts, deletion, the change feed.",
            ],
            "paths": paths,
            "components": [
                "securitySchemes": ["bearer": ["type": "http", "scheme": "bearer"]]
            ],
            "security": [["bearer": [String]()]],
        ]
    }

    static func operation(_ endpoint: AppAPIEndpoint) -> [String: Any] {
        var parameters: [[String: Any]] = []
        for case .parameter(let name) in endpoint.path {
            parameters.append([
                "name": name, "in": "path", "required": true,
                "schema": ["type": "string", "minLength": 1, "pattern": noNUL],
            ])
        }
        for query in endpoint.query {
            parameters.append([
                "name": query.name, "in": "query", "required": false, "description": query.summary,
                "schema": [
                    "type": "integer", "minimum": query.minimum, "maximum": query.maximum, "default": query.defaultValue,
                ] as [String: Any],
            ])
        }
        var errors = AppAPIEndpoints.commonErrors + endpoint.errors
        if endpoint.body != nil { errors.append(AppAPIEndpoints.payloadTooLarge) }
        errors.append(AppAPIEndpoints.shuttingDown)
        var responses: [String: Any] = [
            String(endpoint.successStatus): [
                "description": "Success.",
                "content": ["application/json": ["schema": endpoint.successSchema()]],
            ]
        ]
        for (status, codes) in Dictionary(grouping: errors, by: \.status).sorted(by: { $0.key < $1.key }) {
            let names = Array(Set(codes.map(\.code))).sorted()
            responses[String(status)] = [
                "description": names.joined(separator: ", "),
                "content": ["application/json": ["schema": AppAPISchemas.error(codes: names)]],
            ]
        }
        var operation: [String: Any] = [
            "operationId": endpoint.name, "summary": endpoint.summary, "responses": responses,
        ]
        if !parameters.isEmpty { operation["parameters"] = parameters }
        if let fields = endpoint.body {
            operation["requestBody"] = [
                "required": endpoint.bodyRequired,
                "content": ["application/json": ["schema": bodySchema(endpoint, fields)]],
            ]
        }
        return operation
    }

    /// JSON Schema `pattern` of a string without U+0000 (PostgreSQL's text cannot hold it).
    static let noNUL = "^[^\\u0000]*$"

    /// The body's schema; with a second form, either (`anyOf`: a body holding the members of both is
    /// read as the second form, which its member `when` chooses).
    static func bodySchema(_ endpoint: AppAPIEndpoint, _ fields: [AppAPIField]) -> [String: Any] {
        guard let alternate = endpoint.alternateBody else { return schema(of: fields) }
        return ["anyOf": [schema(of: fields), schema(of: alternate.fields)]]
    }

    static func schema(of fields: [AppAPIField]) -> [String: Any] {
        var properties: [String: Any] = [:]
        for field in fields {
            var schema: [String: Any]
            switch field.kind {
            case .string(let minimum, let maximum):
                schema = ["type": field.nullable ? ["string", "null"] : "string", "maxLength": maximum, "pattern": noNUL]
                if minimum > 0 { schema["minLength"] = minimum }
            case .stringMembers(let names, let maximum):
                var members: [String: Any] = [:]
                for name in names {
                    members[name] = ["type": ["string", "null"], "maxLength": maximum, "pattern": noNUL]
                }
                schema = ["type": field.nullable ? ["object", "null"] : "object", "properties": members]
            }
            schema["description"] = field.summary
            properties[field.name] = schema
        }
        let required = fields.filter(\.required).map(\.name)
        var object: [String: Any] = ["type": "object", "properties": properties]
        if !required.isEmpty { object["required"] = required }
        return object
    }
}
