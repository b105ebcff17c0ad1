#ifndef CMICROHTTPD_SHIM_H
#define CMICROHTTPD_SHIM_H
// microhttpd.h expects the socket types to be declared before it.
#include <sys/types.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <microhttpd.h>

// Swift cannot call C variadic functions (MHD_start_daemon, MHD_get_connection_info,
// MHD_get_daemon_info) nor build a `va_list` callback (MHD_OPTION_EXTERNAL_LOGGER).
// These helpers give each use a fixed signature.

/// Where libmicrohttpd's error log goes: `function(context, message)`, already formatted.
/// Owned by the Swift caller, which keeps it alive until MHD_stop_daemon returns.
struct CMicroHTTPD_LogTarget {
    void (* _Nonnull function)(void * _Nullable context, const char * _Nonnull message);
    void * _Nullable context;
};

static void CMicroHTTPD_log_trampoline(void *cls, const char *format, va_list arguments) {
    char message[512];
    vsnprintf(message, sizeof message, format, arguments);
    const struct CMicroHTTPD_LogTarget *target = cls;
    target->function(target->context, message);
}

/// Whether this libmicrohttpd was built with TLS (Debian's links GnuTLS).
static inline int CMicroHTTPD_supports_tls(void) {
    return MHD_is_feature_supported(MHD_FEATURE_TLS) == MHD_YES;
}

static inline int CMicroHTTPD_hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/// MHD_UnescapeCallback for the path and the query: percent-decodes in place as libmicrohttpd's own
/// does, except that `%00` becomes the byte 0xFF. A decoded NUL would end the C string early and
/// the handler would act on a shorter path or value than the client sent (`/v1/accounts/c/v%00x`
/// as `/v1/accounts/c/v`); 0xFF is never part of UTF-8, so the Swift side refuses the request.
static size_t CMicroHTTPD_unescape(void *cls, struct MHD_Connection *connection, char *text) {
    (void)cls; (void)connection;
    char *read = text, *write = text;
    while (*read != '\0') {
        int high, low;
        if (read[0] == '%' && (high = CMicroHTTPD_hex_digit(read[1])) >= 0
            && (low = CMicroHTTPD_hex_digit(read[2])) >= 0) {
            int byte = high * 16 + low;
            *write++ = (char)(byte == 0 ? 0xFF : byte);
            read += 3;
        } else {
            *write++ = *read++;
        }
    }
    *write = '\0';
    return (size_t)(write - text);
}

/// Starts a daemon on an already bound and listening socket (so bind errors carry errno),
/// with an epoll thread pool, suspend/resume and an inter-thread channel (needed by
/// MHD_resume_connection and MHD_quiesce_daemon). Returns NULL on failure (see the log).
/// With `tls_key_pem` and `tls_cert_pem` (PEM text, kept by the caller until the daemon stops) it
/// serves HTTPS with GnuTLS priorities `tls_priorities`; with NULL, plain HTTP.
static inline struct MHD_Daemon * _Nullable CMicroHTTPD_start(
    int listen_fd, int turbo, unsigned int thread_count, unsigned int connection_limit,
    unsigned int per_ip_connection_limit, unsigned int connection_timeout_seconds,
    MHD_AccessHandlerCallback _Nonnull access_handler, void * _Nullable access_context,
    MHD_RequestCompletedCallback _Nonnull completed, void * _Nullable completed_context,
    MHD_NotifyConnectionCallback _Nonnull notify_connection, void * _Nullable notify_context,
    struct CMicroHTTPD_LogTarget * _Nonnull log_target,
    const char * _Nullable tls_key_pem, const char * _Nullable tls_cert_pem, const char * _Nullable tls_priorities)
{
    // A pool of threads, each with its own epoll set; handlers answer later through suspend/resume.
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC | MHD_USE_ERROR_LOG
        | MHD_USE_EPOLL;
    if (turbo) flags |= MHD_USE_TURBO;
    // The TLS options go in an array so one call serves both: empty (just the end) without TLS.
    struct MHD_OptionItem tls_options[4] = {{ MHD_OPTION_END, 0, NULL }};
    if (tls_key_pem != NULL && tls_cert_pem != NULL) {
        flags |= MHD_USE_TLS;
        tls_options[0] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)tls_key_pem };
        tls_options[1] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)tls_cert_pem };
        tls_options[2] = (struct MHD_OptionItem){ MHD_OPTION_HTTPS_PRIORITIES, 0, (void *)tls_priorities };
        tls_options[3] = (struct MHD_OptionItem){ MHD_OPTION_END, 0, NULL };
    }
    // The logger goes first: options are applied in order and later ones may log.
    // A pool of 1 is no pool (libmicrohttpd warns), just the internal polling thread.
    return MHD_start_daemon(flags, 0, NULL, NULL, access_handler, access_context,
        MHD_OPTION_EXTERNAL_LOGGER, CMicroHTTPD_log_trampoline, (void *)log_target,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)listen_fd,
        MHD_OPTION_THREAD_POOL_SIZE, thread_count > 1 ? thread_count : 0,
        MHD_OPTION_CONNECTION_LIMIT, connection_limit,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip_connection_limit,
        MHD_OPTION_CONNECTION_TIMEOUT, connection_timeout_seconds,
        MHD_OPTION_NOTIFY_COMPLETED, completed, completed_context,
        MHD_OPTION_NOTIFY_CONNECTION, notify_connection, notify_context,
        MHD_OPTION_UNESCAPE_CALLBACK, CMicroHTTPD_unescape, NULL,
        MHD_OPTION_ARRAY, tls_options,
        MHD_OPTION_END);
}

/// The client's address as text ("127.0.0.1", "::1"); returns 0 when unknown.
static inline int CMicroHTTPD_client_address(struct MHD_Connection * _Nonnull connection,
                                             char * _Nonnull buffer, socklen_t size) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL) return 0;
    const struct sockaddr *address = info->client_addr;
    if (address->sa_family == AF_INET) {
        return inet_ntop(AF_INET, &((const struct sockaddr_in *)address)->sin_addr, buffer, size) != NULL;
    }
    if (address->sa_family == AF_INET6) {
        return inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)address)->sin6_addr, buffer, size) != NULL;
    }
    return 0;
}

/// The connection's socket; -1 when unknown.
static inline int CMicroHTTPD_connection_fd(struct MHD_Connection * _Nonnull connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    return info == NULL ? -1 : (int)info->connect_fd;
}

/// The port the daemon listens on (useful after binding port 0); 0 when unknown.
static inline int CMicroHTTPD_bound_port(struct MHD_Daemon * _Nonnull daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : (int)info->port;
}

#endif
