import CCurl

/// One call's state while its easy handle is in the pool: the request's bytes curl reads (which
/// must outlive the transfer), what came back, and the continuation to resume.
///
/// @unchecked Sendable: made by the caller, then touched only by the pool's thread (curl's callbacks
/// run there too) from the moment it is queued until it is finished.
final class CurlTransfer: @unchecked Sendable {
    let request: HTTPRequest
    let handle: UnsafeMutableRawPointer
    private let continuation: CheckedContinuation<Result<HTTPResponse, HTTPFailure>, Never>
    private var headerList: UnsafeMutablePointer<curl_slist>?
    private let requestBody: UnsafeMutableBufferPointer<UInt8>
    private let errorBuffer = UnsafeMutablePointer<CChar>.allocate(capacity: Int(CURL_ERROR_SIZE) + 1)

    // What came back (the head of the final answer; interim 1xx heads are dropped).
    private var status: Int?
    private var headers: [String: String] = [:]
    private var headBytes = 0
    private var headComplete = false
    private var body: [UInt8] = []
    private var bodyBytesSeen = 0
    private var bodyCut = false
    /// A callback stopped the transfer because the answer outgrew what a call keeps.
    private var stoppedTooLarge = false
    /// The header callback stopped the transfer at a line that is no header.
    private var stoppedMalformed = false
    private var finished = false

    /// Headers beyond this many bytes fail the call: no answer needs more, and a head that never
    /// ends must not grow without bound.
    static let maximumHeadBytes = 64 << 10

    init(request: HTTPRequest, handle: UnsafeMutableRawPointer,
         continuation: CheckedContinuation<Result<HTTPResponse, HTTPFailure>, Never>) {
        self.request = request
        self.handle = handle
        self.continuation = continuation
        requestBody = .allocate(capacity: max(1, request.body.count))
        _ = requestBody.initialize(from: request.body)
        errorBuffer.initialize(repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
    }

    deinit {
        if let headerList { curl_slist_free_all(headerList) }
        requestBody.deallocate()
        errorBuffer.deallocate()
    }

    /// Sets every option of the call on the (fresh or reset) handle. The pool's rules come first:
    /// certificates verified, http/https only, no redirect followed, no signals, no verbose output
    /// (it would print request headers, so bearers). Returns curl's refusal, if any.
    func configure(trust: CurlTrust) -> CURLcode {
        let handle = handle
        // The first refusal is the answer, kept as a running value (an array of every result was
        // an allocation per call).
        var refusal = CURLE_OK
        func record(_ code: CURLcode) { if refusal == CURLE_OK { refusal = code } }
        func long(_ option: CURLoption, _ value: Int) { record(CCurl_setopt_long(handle, option, value)) }
        func string(_ option: CURLoption, _ value: String) { record(CCurl_setopt_string(handle, option, value)) }
        long(CURLOPT_NOSIGNAL, 1)
        long(CURLOPT_VERBOSE, 0)
        string(CURLOPT_PROTOCOLS_STR, "http,https")
        long(CURLOPT_FOLLOWLOCATION, 0)
        long(CURLOPT_SSL_VERIFYPEER, 1)
        long(CURLOPT_SSL_VERIFYHOST, 2)
        long(CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_2TLS)
        long(CURLOPT_TCP_NODELAY, 1)
        record(trust.apply(to: handle))
        let milliseconds = max(1, Int(request.timeout / .milliseconds(1)))
        long(CURLOPT_TIMEOUT_MS, milliseconds)
        long(CURLOPT_CONNECTTIMEOUT_MS, milliseconds)
        record(CCurl_setopt_pointer(handle, CURLOPT_ERRORBUFFER, errorBuffer))
        string(CURLOPT_URL, request.url)
        // A call to this machine never goes through a proxy, whatever http_proxy / ALL_PROXY say:
        // "" turns off the environment's proxies for this call (curl's CURLOPT_PROXY).
        if HTTPClient.callsLoopback(request.url) { string(CURLOPT_PROXY, "") }

        switch request.method {
        case "GET": long(CURLOPT_HTTPGET, 1)
        case "HEAD": long(CURLOPT_NOBODY, 1)
        default:
            // POSTFIELDS, never CURLOPT_POST alone: without it curl would read the body from stdin.
            record(CCurl_setopt_pointer(handle, CURLOPT_POSTFIELDS, requestBody.baseAddress))
            record(CCurl_setopt_offset(handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(request.body.count)))
            if request.method != "POST" { string(CURLOPT_CUSTOMREQUEST, request.method) }
        }
        // "Expect:" empty: curl would otherwise wait up to a second for a 100 before a larger body.
        for (name, value) in request.headers { headerList = curl_slist_append(headerList, "\(name): \(value)") }
        headerList = curl_slist_append(headerList, "Expect:")
        record(CCurl_setopt_pointer(handle, CURLOPT_HTTPHEADER, headerList))

        let context = Unmanaged.passUnretained(self).toOpaque()
        record(CCurl_setopt_write_callback(handle, CURLOPT_HEADERFUNCTION, CurlCallbacks.header))
        record(CCurl_setopt_pointer(handle, CURLOPT_HEADERDATA, context))
        record(CCurl_setopt_write_callback(handle, CURLOPT_WRITEFUNCTION, CurlCallbacks.body))
        record(CCurl_setopt_pointer(handle, CURLOPT_WRITEDATA, context))
        return refusal
    }

    /// One header line (status lines included, CRLF still on). Returns false to stop the transfer.
    fileprivate func received(headerLine bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        headBytes += bytes.count
        guard headBytes <= Self.maximumHeadBytes else {
            stoppedTooLarge = true
            return false
        }
        // After the head, curl passes a chunked body's trailer lines: read, never acted on.
        guard !headComplete else { return true }
        // Header lines are ASCII in practice: those are read as bytes, without breaking text into
        // Characters (2 % of a sign-in's CPU in the bench's profile); any other line goes the long way.
        if bytes.allSatisfy({ $0 < 0x80 }), let kept = receivedASCIIHeader(bytes) { return kept }
        var line = Substring(decoding: bytes, as: UTF8.self)
        while let last = line.last, last == "\r\n" || last == "\n" || last == "\r" { line = line.dropLast() }
        if line.hasPrefix("HTTP/") {
            // A new head (after a 100 Continue): what came before was interim.
            let code = line.split(separator: " ", maxSplits: 2).dropFirst().first.flatMap { Int($0) }
            status = code
            headers = [:]
            headComplete = false
        } else if line.isEmpty {
            if let status, status >= 200 { headComplete = true }
        } else if let colon = line.firstIndex(of: ":"), colon != line.startIndex, line.first != " ", line.first != "\t" {
            let name = line[..<colon].lowercased()
            let value = line[line.index(after: colon)...].trimmingWhitespace()
            headers[name] = headers[name].map { "\($0), \(value)" } ?? value
        } else {
            // No name, no colon, or a folded continuation (obsolete, and a way to smuggle headers).
            stoppedMalformed = true
            return false
        }
        return true
    }

    /// A header line of ASCII bytes, as `received(headerLine:)` reads one; nil for a line that is
    /// not a header (the status line, the empty line, a malformed one), left to the general path.
    private func receivedASCIIHeader(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool? {
        var end = bytes.count
        while end > 0, bytes[end - 1] == UInt8(ascii: "\r") || bytes[end - 1] == UInt8(ascii: "\n") { end -= 1 }
        guard end > 0, bytes[0] != UInt8(ascii: " "), bytes[0] != UInt8(ascii: "\t"),
            !bytes[..<end].starts(with: "HTTP/".utf8),
            let colon = bytes[..<end].firstIndex(of: UInt8(ascii: ":")), colon > 0
        else { return nil }
        let name = String(decoding: bytes[..<colon].map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }, as: UTF8.self)
        var valueStart = colon + 1
        var valueEnd = end
        while valueStart < valueEnd, bytes[valueStart] == UInt8(ascii: " ") || bytes[valueStart] == UInt8(ascii: "\t") { valueStart += 1 }
        while valueEnd > valueStart, bytes[valueEnd - 1] == UInt8(ascii: " ") || bytes[valueEnd - 1] == UInt8(ascii: "\t") { valueEnd -= 1 }
        let value = String(decoding: UnsafeBufferPointer(rebasing: bytes[valueStart..<valueEnd]), as: UTF8.self)
        headers[name] = headers[name].map { "\($0), \(value)" } ?? value
        return true
    }

    /// Body bytes. Returns false to stop the transfer (the body outgrew its limit).
    fileprivate func received(body bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        bodyBytesSeen += bytes.count
        switch request.bodyLimit {
        case .whole(let limit):
            guard bodyBytesSeen <= min(limit, HTTPClient.maximumBodyBytes) else {
                stoppedTooLarge = true
                return false
            }
            body.append(contentsOf: bytes)
        case .prefix(let kept):
            let room = max(0, kept - body.count)
            if bytes.count > room { bodyCut = true }
            body.append(contentsOf: bytes.prefix(room))
            guard bodyBytesSeen <= HTTPClient.maximumBodyBytes else {
                stoppedTooLarge = true
                return false
            }
        }
        return true
    }

    /// Resumes the caller with the answer or the failure `code` means. Runs once.
    func finish(_ code: CURLcode) {
        guard !finished else { return }
        finished = true
        continuation.resume(returning: result(of: code))
    }

    func finish(_ failure: HTTPFailure) {
        guard !finished else { return }
        finished = true
        continuation.resume(returning: .failure(failure))
    }

    private func result(of code: CURLcode) -> Result<HTTPResponse, HTTPFailure> {
        let answered = headComplete ? status : nil
        if code == CURLE_OK, let status = answered {
            return .success(HTTPResponse(status: status, headers: headers, body: body, bodyCut: bodyCut))
        }
        if code == CURLE_OK {
            return .failure(HTTPFailure(kind: .malformed, detail: "the answer ended without a status line and headers"))
        }
        let kind: HTTPFailure.Kind = stoppedTooLarge ? .tooLarge : stoppedMalformed ? .malformed : CurlCodes.kind(of: code)
        return .failure(HTTPFailure(kind: kind, status: answered, detail: CurlCodes.detail(code, message: errorBuffer)))
    }
}

/// curl's callbacks: C function pointers, so no captured context; the transfer comes through the
/// user-data pointer (unretained: the pool holds the transfer while its handle is in the multi).
enum CurlCallbacks {
    static let header: CCurl_write_callback = { data, size, count, context in
        let bytes = UnsafeBufferPointer(start: UnsafeRawPointer(data).assumingMemoryBound(to: UInt8.self), count: size * count)
        let transfer = Unmanaged<CurlTransfer>.fromOpaque(context!).takeUnretainedValue()
        return transfer.received(headerLine: bytes) ? size * count : 0
    }

    static let body: CCurl_write_callback = { data, size, count, context in
        let bytes = UnsafeBufferPointer(start: UnsafeRawPointer(data).assumingMemoryBound(to: UInt8.self), count: size * count)
        let transfer = Unmanaged<CurlTransfer>.fromOpaque(context!).takeUnretainedValue()
        return transfer.received(body: bytes) ? size * count : 0
    }
}

extension Substring {
    fileprivate func trimmingWhitespace() -> String {
        var text = self
        while let first = text.first, first == " " || first == "\t" { text = text.dropFirst() }
        while let last = text.last, last == " " || last == "\t" { text = text.dropLast() }
        return String(text)
    }
}
