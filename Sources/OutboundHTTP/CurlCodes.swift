import CCurl

/// curl's result codes, sorted into the kinds callers act on.
enum CurlCodes {
    static func kind(of code: CURLcode) -> HTTPFailure.Kind {
        switch code {
        case CURLE_OPERATION_TIMEDOUT: .timeout
        case CURLE_COULDNT_CONNECT, CURLE_COULDNT_RESOLVE_HOST, CURLE_COULDNT_RESOLVE_PROXY: .connect
        case CURLE_SSL_CONNECT_ERROR, CURLE_PEER_FAILED_VERIFICATION, CURLE_SSL_CERTPROBLEM, CURLE_SSL_CIPHER,
            CURLE_SSL_CACERT_BADFILE, CURLE_SSL_ISSUER_ERROR, CURLE_SSL_PINNEDPUBKEYNOTMATCH, CURLE_SSL_INVALIDCERTSTATUS,
            CURLE_SSL_ENGINE_NOTFOUND, CURLE_SSL_ENGINE_SETFAILED, CURLE_SSL_ENGINE_INITFAILED, CURLE_SSL_CRL_BADFILE,
            CURLE_SSL_SHUTDOWN_FAILED, CURLE_USE_SSL_FAILED:
            .tls
        case CURLE_GOT_NOTHING, CURLE_RECV_ERROR, CURLE_SEND_ERROR, CURLE_PARTIAL_FILE: .closed
        // UNSUPPORTED_PROTOCOL after the URL check: an answer in no HTTP version (HTTP/0.9 is refused).
        case CURLE_WEIRD_SERVER_REPLY, CURLE_HTTP2, CURLE_HTTP2_STREAM, CURLE_BAD_CONTENT_ENCODING, CURLE_UNSUPPORTED_PROTOCOL,
            CURLE_HTTP3, CURLE_RANGE_ERROR:
            .malformed
        case CURLE_URL_MALFORMAT: .refusedURL
        case CURLE_ABORTED_BY_CALLBACK: .cancelled
        default: .other
        }
    }

    /// `curl <code>: <message>`: curl's own message for this transfer (its error buffer), which
    /// names at most a host and port, else its fixed text for the code. Kept to printable ASCII.
    static func detail(_ code: CURLcode, message: UnsafePointer<CChar>) -> String {
        var text = String(cString: message)
        if text.isEmpty { text = String(cString: curl_easy_strerror(code)) }
        let printable = text.unicodeScalars.filter { $0.isASCII && $0.value >= 0x20 && $0.value < 0x7f }
        return "curl \(code.rawValue): \(String(String.UnicodeScalarView(printable.prefix(200))))"
    }
}

/// Which certificate authorities `https://` calls trust: the system's store, plus the PEM of
/// `SIWA_CA_FILE` when set.
///
/// Debian's libcurl finds the system store twice: the bundle `/etc/ssl/certs/ca-certificates.crt`
/// (its default CAINFO) and the hashed directory `/etc/ssl/certs` (its default CAPATH), both
/// written by `ca-certificates`. Extra certificates replace the CAINFO (curl's CAINFO_BLOB takes
/// its place) and leave the CAPATH as it is, so the system's authorities still verify.
struct CurlTrust: Hashable, Sendable {
    var extraCertificatesPEM: String?
    /// nil: libcurl's built-in CAPATH (tests name a directory of their own).
    var systemDirectory: String?

    func apply(to handle: UnsafeMutableRawPointer) -> CURLcode {
        var result = CURLE_OK
        if let systemDirectory { result = CCurl_setopt_string(handle, CURLOPT_CAPATH, systemDirectory) }
        guard result == CURLE_OK, let extraCertificatesPEM else { return result }
        var bytes = Array(extraCertificatesPEM.utf8)
        return bytes.withUnsafeMutableBytes { buffer in
            // CURL_BLOB_COPY: curl keeps its own copy, so the buffer may go once this returns.
            var blob = curl_blob(data: buffer.baseAddress, len: buffer.count, flags: UInt32(CURL_BLOB_COPY))
            return CCurl_setopt_blob(handle, CURLOPT_CAINFO_BLOB, &blob)
        }
    }
}
