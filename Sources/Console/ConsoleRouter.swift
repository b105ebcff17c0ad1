import Foundation
import HTTPServer
import JobQueue
import Logging
import Postgres

/// Every request of the console: the Host check, the session and its anti-forgery token, the
/// login when one is required, then the page or the action. Every answer, errors included, goes out
/// with the same security headers.
struct ConsoleRouter: Sendable {
    let pool: PostgresPool
    let sessions: ConsoleSessions
    /// Loopback only: the host names a `Host` header may carry (a page of another site that got
    /// its name resolved to 127.0.0.1, DNS rebinding, is refused). Nil: any (a login protects it).
    let allowedHosts: Set<String>?
    let logger: Logger

    /// No script, no inline style, nothing from another origin, never in a frame.
    static let contentSecurityPolicy =
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

    func respond(_ request: HTTPRequest) async -> HTTPResponse {
        var response = await route(request)
        response.headers += [
            ("Content-Security-Policy", Self.contentSecurityPolicy), ("X-Content-Type-Options", "nosniff"),
            ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-store"),
            ("Cross-Origin-Opener-Policy", "same-origin"), ("Cross-Origin-Resource-Policy", "same-origin"),
        ]
        return response
    }

    private func route(_ request: HTTPRequest) async -> HTTPResponse {
        if let allowedHosts, !allowedHosts.contains(Self.hostName(request.header("host"))) {
            return .text(status: 421, "this console answers only to its loopback address\n")
        }
        let isRead = request.method == "GET" || request.method == "HEAD"
        guard isRead || request.method == "POST" else { return .text(status: 405, "method not allowed\n") }
        if request.path == "/console.css" {
            return HTTPResponse(status: 200, headers: [("Content-Type", "text/css; charset=utf-8")], body: Array(Layout.styleSheet.utf8))
        }

        var session = sessions.session(cookieHeader: request.header("cookie"))
        var setCookie: String?
        if sessions.requiresLogin {
            if request.path == "/login" { return isRead ? page(LoginPage.render(failed: false)) : login(request) }
            guard session != nil else {
                return isRead ? Self.redirect("/login") : Self.forbidden("not logged in; nothing was changed")
            }
        } else if session == nil {
            guard isRead else { return Self.forbidden("no session: load a page first; nothing was changed") }
            let opened = sessions.open()
            session = opened
            setCookie = sessions.cookie(opened)
        }
        guard let session else { return Self.forbidden("no session") }
        var context = Layout.Context(formToken: sessions.formToken(for: session), offersLogout: sessions.requiresLogin)
        if isRead {
            let query = request.query.filter { $0.key != "refresh" }.sorted { $0.key < $1.key }.map { ($0.key, Optional($0.value)) }
            context.refresh = Layout.Refresh(path: request.path, query: query, paused: request.query["refresh"] == "off")
        }

        var response: HTTPResponse
        if isRead {
            response = await read(request, context: context)
        } else {
            let fields = FormFields.parse(request)
            guard sessions.isValidFormToken(fields["csrf"], for: session) else {
                return Self.forbidden("the form's anti-forgery token is missing or wrong; nothing was changed")
            }
            response = await act(request, session: session, context: context)
        }
        if let setCookie { response.headers.append(("Set-Cookie", setCookie)) }
        return response
    }

    // MARK: Pages

    private func read(_ request: HTTPRequest, context: Layout.Context) async -> HTTPResponse {
        let path = request.path
        do {
            switch path {
            case "/":
                return page(OverviewPage.render(try await pool.withConnection { try await Overview.load($0) }, context: context))
            case "/accounts":
                let query = request.query["q"].flatMap { $0.isEmpty ? nil : $0 }
                var results: [AccountRecord] = []
                if let query { results = try await pool.withConnection { try await AccountRecord.search(query, on: $0) } }
                return page(AccountPages.search(query, results: results, context: context))
            case "/jobs":
                var filter = JobAdministration.Filter(limit: JobsPage.limit)
                filter.state = request.query["state"].flatMap { $0.isEmpty ? nil : $0 }
                filter.kind = request.query["kind"].flatMap { $0.isEmpty ? nil : $0 }
                filter.sub = request.query["sub"].flatMap { $0.isEmpty ? nil : $0 }
                if let state = filter.state, !JobAdministration.states.contains(state) {
                    return .text(status: 400, "state: expected one of \(JobAdministration.states.joined(separator: ", "))\n")
                }
                if let kind = filter.kind, !JobAdministration.kinds.contains(kind) {
                    return .text(status: 400, "kind: expected one of \(JobAdministration.kinds.joined(separator: ", "))\n")
                }
                let rows = try await pool.withConnection { try await JobAdministration(connection: $0).list(filter) }
                return page(JobsPage.render(rows, filter: filter, context: context))
            default:
                if path.hasPrefix("/accounts/") { return try await accountPage(path, context: context) }
                if path.hasPrefix("/jobs/") { return try await jobPage(path, context: context) }
                return .text(status: 404, "no such page\n")
            }
        } catch {
            return databaseFailure(error)
        }
    }

    private func accountPage(_ path: String, context: Layout.Context) async throws -> HTTPResponse {
        let rest = path.dropFirst("/accounts/".count)
        guard let slash = rest.firstIndex(of: "/"), slash != rest.startIndex, rest.index(after: slash) != rest.endIndex else {
            return .text(status: 404, "expected /accounts/{client_id}/{sub}\n")
        }
        let clientID = String(rest[..<slash])
        let sub = String(rest[rest.index(after: slash)...])
        let found = try await pool.withConnection { connection -> AccountPageData? in
            guard let account = try await AccountRecord.find(clientID: clientID, sub: sub, on: connection) else { return nil }
            let timeline = try await AccountTimeline.load(clientID: clientID, sub: sub, on: connection)
            let pause = try await connection.query(
                """
                SELECT reason, extract(epoch FROM next_probe_at - now())::float8 AS next_probe
                  FROM siwa.paused_clients WHERE client_id = \(clientID)
                """
            ).first.map {
                AccountStanding.Pause(reason: try $0.decode(String.self, column: "reason"), nextProbeSeconds: try $0.decode(Double.self, column: "next_probe"))
            }
            return AccountPageData(account: account, timeline: timeline, pause: pause)
        }
        guard let found else {
            return page(Layout.page("No such account", section: "Accounts", context: context,
                                    "<p>No account \(clientID) <span class=\"mono\">\(sub)</span>.</p>"), status: 404)
        }
        let standing = AccountStanding(account: found.account, timeline: found.timeline, pause: found.pause, now: Date())
        return page(AccountPages.account(found.account, timeline: found.timeline, standing: standing, context: context))
    }

    /// `/jobs/{id}`: one job, its attempts and its actions.
    private func jobPage(_ path: String, context: Layout.Context) async throws -> HTTPResponse {
        guard let id = Int64(path.dropFirst("/jobs/".count)), id > 0 else { return .text(status: 404, "expected /jobs/{id}\n") }
        guard let detail = try await pool.withConnection({ try await JobDetail.load(id, on: $0) }) else {
            return page(Layout.page("No such job", section: "Jobs", context: context, "<p>There is no job #\(id).</p>"), status: 404)
        }
        return page(JobPage.render(detail, context: context))
    }

    private struct AccountPageData: Sendable {
        var account: AccountRecord
        var timeline: AccountTimeline
        var pause: AccountStanding.Pause?
    }

    // MARK: Actions

    private func act(_ request: HTTPRequest, session: String, context: Layout.Context) async -> HTTPResponse {
        if request.path == "/logout" {
            sessions.close(session)
            var response = Self.redirect(sessions.requiresLogin ? "/login" : "/")
            response.headers.append(("Set-Cookie", sessions.expiredCookie))
            return response
        }
        let parts = request.path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[1] == "jobs", let id = Int64(parts[2]), id > 0, parts[3] == "retry" || parts[3] == "cancel" else {
            return .text(status: 404, "no such action\n")
        }
        do {
            // The very functions `siwa jobs retry` and `siwa jobs cancel` (without --force) call.
            let (notice, refused) = try await pool.withConnection { connection -> (String, Bool) in
                let administration = JobAdministration(connection: connection)
                if parts[3] == "retry" {
                    let retried = try await administration.retry(.id(id))
                    return retried.isEmpty
                        ? ("job #\(id) was not retried: only discarded jobs, or available ones waiting out a retry, can be", true)
                        : ("job #\(id) will run again now", false)
                }
                let result = try await administration.cancel(.id(id), force: false)
                if !result.refused.isEmpty {
                    return ("refused to cancel job #\(id): it is the revoke of a pending deletion, which must never be dropped "
                        + "silently (siwa jobs cancel \(id) --force, if you truly mean it)", true)
                }
                if !result.cancelled.isEmpty { return ("job #\(id) cancelled", false) }
                return (result.alreadyFinal > 0 ? "job #\(id) is already final; left as it was" : "no job #\(id)", true)
            }
            logger.info("console.job_action", metadata: ["job_id": .string(String(id)), "action": .string(String(parts[3])),
                                                         "refused": .string(String(refused))])
            let rows = try await pool.withConnection { try await JobAdministration(connection: $0).list(.init(limit: JobsPage.limit)) }
            return page(JobsPage.render(rows, filter: .init(limit: JobsPage.limit), context: context,
                                        notice: JobsPage.notice(notice, refused: refused)), status: refused ? 409 : 200)
        } catch {
            return databaseFailure(error)
        }
    }

    private func login(_ request: HTTPRequest) -> HTTPResponse {
        let fields = FormFields.parse(request)
        guard let token = fields["token"], sessions.acceptsLogin(token) else {
            logger.warning("console.login_refused", metadata: ["remote": .string(request.remoteAddress ?? "")])
            return page(LoginPage.render(failed: true), status: 401)
        }
        var response = Self.redirect("/")
        response.headers.append(("Set-Cookie", sessions.cookie(sessions.open())))
        return response
    }

    // MARK: Answers

    private func page(_ html: HTML, status: Int = 200) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("Content-Type", "text/html; charset=utf-8")], body: Array(html.text.utf8))
    }

    private func databaseFailure(_ error: any Error) -> HTTPResponse {
        logger.error("console.database_failed", metadata: ["error": .string(String(describing: error))])
        let line = String(describing: error).split(separator: "\n").first.map(String.init) ?? "unknown error"
        return page("<!doctype html><title>database unavailable</title><p>The database did not answer: \(line)</p>", status: 503)
    }

    private static func redirect(_ location: String) -> HTTPResponse {
        HTTPResponse(status: 303, headers: [("Location", location), ("Content-Type", "text/plain; charset=utf-8")])
    }

    private static func forbidden(_ why: String) -> HTTPResponse { .text(status: 403, why + "\n") }

    /// `Host: 127.0.0.1:9400` → `127.0.0.1`; `[::1]:9400` → `[::1]`.
    static func hostName(_ header: String?) -> String {
        guard let header = header?.lowercased() else { return "" }
        if header.hasPrefix("["), let end = header.firstIndex(of: "]") { return String(header[...end]) }
        return String(header.split(separator: ":", maxSplits: 1).first ?? "")
    }
}

/// A form's fields, from a POST whose body is `application/x-www-form-urlencoded`.
private enum FormFields {
    static func parse(_ request: HTTPRequest) -> [String: String] {
        guard request.header("content-type")?.lowercased().hasPrefix("application/x-www-form-urlencoded") == true else { return [:] }
        return URLPart.formFields(request.bodyText)
    }
}
