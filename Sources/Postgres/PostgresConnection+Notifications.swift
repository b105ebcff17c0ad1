internal import CLibpq

#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// One `NOTIFY` delivered to a `LISTEN`ing connection.
package struct PostgresNotification: Sendable, Hashable {
    package var channel: String
    package var payload: String
    /// Server process id of the notifying session.
    package var pid: Int32

    package init(channel: String, payload: String, pid: Int32) {
        self.channel = channel
        self.payload = payload
        self.pid = pid
    }
}

extension PostgresConnection {
    /// `LISTEN "channel"` (the name is quoted as an identifier, so it is case-sensitive).
    package func listen(_ channel: String) async throws {
        try await simpleQuery("LISTEN " + postgresQuoteIdentifier(channel))
    }

    package func unlisten(_ channel: String) async throws {
        try await simpleQuery("UNLISTEN " + postgresQuoteIdentifier(channel))
    }

    /// `SELECT pg_notify(channel, payload)`; delivered when the surrounding transaction commits.
    package func notify(_ channel: String, payload: String = "") async throws {
        _ = try await execute("SELECT pg_notify(\(channel), \(payload))")
    }

    /// Returns the notifications that arrive within `timeout` (those already buffered at once), or an
    /// empty array when the timeout passes. Never blocks longer than `timeout`, and it occupies this
    /// connection meanwhile: use a dedicated listening connection.
    package func waitForNotifications(timeout: Duration) async throws -> [PostgresNotification] {
        try await onQueue { connection throws(PostgresError) in
            try Self.waitForNotifications(on: connection, timeout: timeout)
        }
    }

    /// `waitForNotifications(timeout:)` on the caller's thread (dedicated threads only).
    package func waitForNotificationsBlocking(timeout: Duration) throws -> [PostgresNotification] {
        try blocking { connection throws(PostgresError) in
            try Self.waitForNotifications(on: connection, timeout: timeout)
        }
    }

    static func waitForNotifications(on connection: OpaquePointer, timeout: Duration) throws(PostgresError)
        -> [PostgresNotification]
    {
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        // Consume what already arrived (also after earlier queries) before waiting.
        guard PQconsumeInput(connection) == 1 else {
            throw PostgresError(.connectionLost, message: libpqErrorMessage(connection))
        }
        var notifications = drainNotifications(connection)
        while notifications.isEmpty {
            let remaining = clock.now.duration(to: deadline)
            if remaining <= .zero { break }
            let socket = PQsocket(connection)
            guard socket >= 0 else {
                throw PostgresError(.connectionLost, message: "the connection has no socket")
            }
            var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
            let milliseconds = Int32(min(Double(Int32.max), (remaining / .milliseconds(1)).rounded(.up)))
            let ready = poll(&descriptor, 1, max(milliseconds, 1))
            if ready < 0 {
                if errno == EINTR { continue }
                throw PostgresError(.systemCallFailed, message: "poll failed: errno \(errno)")
            }
            if ready == 0 { continue }
            guard PQconsumeInput(connection) == 1 else {
                throw PostgresError(.connectionLost, message: libpqErrorMessage(connection))
            }
            notifications = drainNotifications(connection)
        }
        return notifications
    }

    static func drainNotifications(_ connection: OpaquePointer) -> [PostgresNotification] {
        var notifications: [PostgresNotification] = []
        while let notify = PQnotifies(connection) {
            defer { PQfreemem(notify) }  // one allocation holds the struct and its strings
            notifications.append(
                PostgresNotification(
                    channel: String(cString: notify.pointee.relname),
                    payload: notify.pointee.extra.map { String(cString: $0) } ?? "",
                    pid: notify.pointee.be_pid))
        }
        return notifications
    }
}
