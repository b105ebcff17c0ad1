import Foundation
import OutboundHTTP
import Testing

/// `HTTPClient.refusal(of:)` takes a quick path for plain `http(s)://host[:port]/path` URLs before
/// `URLComponents`: the quick path must never accept a URL the full check would refuse.
@Suite struct URLRuleTests {
    @Test func theQuickPathAcceptsTheURLsOfEveryCall() {
        for url in [
            "https://appleid.apple.com/auth/token", "https://appleid.apple.com/auth/keys", "http://127.0.0.1:8080/hook",
            "https://hooks.example.com/siwa?team=a&x=1", "http://localhost:1/a/b/c", "https://EXAMPLE.com/A-b_c~d",
        ] {
            #expect(HTTPClient.isPlainHTTPURL(url), "\(url)")
            #expect(HTTPClient.refusal(of: url) == nil, "\(url)")
        }
    }

    @Test func whatTheQuickPathLeavesIsStillJudgedInFull() {
        for url in ["ftp://127.0.0.1/x", "file:///etc/passwd", "http:///x", "127.0.0.1:80", "HTTPS://example.com/", "http://:80/"] {
            #expect(!HTTPClient.isPlainHTTPURL(url), "\(url)")
        }
        for url in ["ftp://127.0.0.1/x", "file:///etc/passwd", "http:///x", "127.0.0.1:80", "http://:80/", "http://a b/"] {
            #expect(HTTPClient.refusal(of: url) != nil, "\(url)")
        }
        #expect(HTTPClient.refusal(of: "HTTPS://example.com/") == nil, "an uppercase scheme is a URL all the same")
        #expect(HTTPClient.refusal(of: "https://user@example.com/%41") == nil)
    }

    /// 50,000 strings built from the characters URLs break on (seeded, so a failure repeats): each
    /// one the quick path accepts is a URL with an http(s) scheme and a host for `URLComponents` too.
    @Test func theQuickPathNeverAcceptsWhatURLComponentsRefuses() {
        let pieces = [
            "http://", "https://", "a", "Z", "9", ".", "-", ":", "80", "/", "?", "#", "@", "%", "%4", "[", "]", " ", "_", "~",
            "!", "$", "&", "'", "(", ")", "*", "+", ",", ";", "=", "é", "\\", "\"", "<", "|", "^", "`", "{",
        ]
        var state: UInt64 = 0x5157_4153_4945_4C44
        func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
        var accepted = 0
        for _ in 0..<50_000 {
            var url = next(2) == 0 ? "http://" : "https://"
            for _ in 0..<(1 + next(8)) { url += pieces[2 + next(pieces.count - 2)] }
            guard HTTPClient.isPlainHTTPURL(url) else { continue }
            accepted += 1
            let components = URLComponents(string: url)
            #expect(components != nil && ["http", "https"].contains(components?.scheme) && components?.host?.isEmpty == false, "\(url)")
        }
        #expect(accepted > 1_000, "the quick path is exercised, not only skipped")
    }
}
