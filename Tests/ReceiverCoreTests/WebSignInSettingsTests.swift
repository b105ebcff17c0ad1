import ReceiverCore
import Settings
import Testing

/// `SIWA_PUBLIC_URL` and `SIWA_WEB_RETURN_URLS` (deploy/web-sign-in.md):
/// checked at start, each bad value refused naming its variable (the executable exits 2 with it).
@Suite struct WebSignInSettingsTests {
    static func settings(_ extra: [String: String]) throws -> WebSignInSettings? {
        try ReceiverConfigurationTests.configuration(extra).webSignIn
    }

    static func refusal(_ extra: [String: String]) -> ConfigurationError? {
        do {
            _ = try settings(extra)
            return nil
        } catch {
            return error as? ConfigurationError
        }
    }

    @Test func unsetIsNotServed() throws {
        #expect(try Self.settings([:]) == nil)
    }

    @Test func aGoodConfigurationGivesTheRedirectURI() throws {
        let settings = try #require(
            try Self.settings([
                "SIWA_PUBLIC_URL": "https://auth.example.com/",
                "SIWA_WEB_RETURN_URLS": "https://app.example.com/done, com.example.app:/signed-in,http://127.0.0.1:3000/cb",
            ]))
        #expect(settings.redirectURI == "https://auth.example.com/apple/sign-in/callback")
        #expect(settings.returnURLs == ["https://app.example.com/done", "com.example.app:/signed-in", "http://127.0.0.1:3000/cb"])
    }

    /// A loopback public URL naming port 0 follows the port the receiver binds (`siwa dev`, tests);
    /// any other keeps its own.
    @Test func portZeroOnLoopbackFollowsTheBoundPort() throws {
        for (url, resolved) in [
            ("http://127.0.0.1:0", "http://127.0.0.1:53117"), ("http://[::1]:0/", "http://[::1]:53117"),
            ("http://localhost:0", "http://localhost:53117"),
        ] {
            let settings = try #require(try Self.settings(["SIWA_PUBLIC_URL": url, "SIWA_WEB_RETURN_URLS": "https://app.example.com/done"]))
            #expect(settings.followsListeningPort, "\(url)")
            #expect(settings.resolved(listeningPort: 53117).redirectURI == resolved + "/apple/sign-in/callback")
        }
        let fixed = try #require(
            try Self.settings(["SIWA_PUBLIC_URL": "http://127.0.0.1:8080", "SIWA_WEB_RETURN_URLS": "https://app.example.com/done"]))
        #expect(!fixed.followsListeningPort && fixed.resolved(listeningPort: 53117).publicURL == "http://127.0.0.1:8080")
    }

    @Test(arguments: [
        "https://auth.example.com:0", "http://auth.example.com:0",
        "http://auth.example.com", "ftp://auth.example.com", "https://", "https://auth.example.com/prefix",
        "https://auth.example.com?x=1", "auth.example.com",
    ])
    func aBadPublicURLIsRefusedNamingIt(_ url: String) {
        let error = Self.refusal(["SIWA_PUBLIC_URL": url, "SIWA_WEB_RETURN_URLS": "https://app.example.com/done"])
        #expect(error?.variable == "SIWA_PUBLIC_URL", "\(url)")
    }

    @Test(arguments: [
        "javascript:alert(1)", "JavaScript://x%0aalert(1)", "data:text/html,<b>x</b>", "file:///etc/passwd",
        "http://app.example.com/done", "https:///nohost", "https://app.example.com/a b", "/relative", "vbscript:x",
    ])
    func aBadReturnURLIsRefusedNamingIt(_ url: String) {
        let error = Self.refusal(["SIWA_PUBLIC_URL": "https://auth.example.com", "SIWA_WEB_RETURN_URLS": "https://ok.example.com,\(url)"])
        #expect(error?.variable == "SIWA_WEB_RETURN_URLS", "\(url)")
    }

    @Test func eachNeedsTheOther() {
        #expect(Self.refusal(["SIWA_PUBLIC_URL": "https://auth.example.com"])?.variable == "SIWA_WEB_RETURN_URLS")
        #expect(Self.refusal(["SIWA_WEB_RETURN_URLS": "https://app.example.com/done"])?.variable == "SIWA_PUBLIC_URL")
    }

    @Test func parametersGoIntoTheQueryBeforeAnyFragment() {
        let added = [("siwa_ticket", "T"), ("siwa_app_state", "a b&c")]
        #expect(WebSignIn.adding(added, to: "https://x.example/done") == "https://x.example/done?siwa_ticket=T&siwa_app_state=a%20b%26c")
        #expect(WebSignIn.adding(added, to: "https://x.example/done?k=v#top") == "https://x.example/done?k=v&siwa_ticket=T&siwa_app_state=a%20b%26c#top")
        #expect(WebSignIn.adding(added, to: "com.example.app:/in#f") == "com.example.app:/in?siwa_ticket=T&siwa_app_state=a%20b%26c#f")
    }

    @Test func appleErrorsPassOnlyAsPlainCodes() {
        #expect(WebSignIn.errorCode("user_cancelled_authorize") == "user_cancelled_authorize")
        #expect(WebSignIn.errorCode("<script>") == "authorization_failed")
        #expect(WebSignIn.errorCode("") == "authorization_failed")
    }

    @Test func theNameComesFromUser() {
        #expect(
            WebSignIn.fullName(fromUser: #"{"name":{"firstName":"Jane","lastName":"Appleseed"},"email":"j@example.com"}"#)
                == #"{"family_name":"Appleseed","given_name":"Jane"}"#)
        #expect(WebSignIn.fullName(fromUser: nil) == nil)
        #expect(WebSignIn.fullName(fromUser: "not json") == nil)
    }
}
