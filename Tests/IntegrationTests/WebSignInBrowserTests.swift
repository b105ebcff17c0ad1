import FakeApple
import Foundation
import Testing

/// The web sign-in in a real browser: headless Chromium opens the receiver's start URL, follows the
/// redirect to the fake Apple's authorize page, whose script posts Apple's answer (form_post) to
/// the receiver's callback, and lands on the return page with a ticket; the app's back end then
/// redeems it through the app API.
@Suite(.serialized) struct WebSignInBrowserTests {
    @Test func chromiumGoesFromTheStartURLToATicketThatSignsIn() async throws {
        guard FileManager.default.isExecutableFile(atPath: ConsoleBrowserTests.chromium) else {
            Issue.record("\(ConsoleBrowserTests.chromium) is missing: install Debian's chromium (deploy/scripts/install-deps.sh chromium)")
            return
        }
        let folder = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-web-sign-in-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        try await WebSignInTests.withStack { stack in
            stack.api.fake.authorizeAs(FakeAppleAuthorizeUser(
                sub: "001.browser.user", firstName: "Jane", lastName: "Appleseed", email: "jane@privaterelay.appleid.com"))
            let returnURL = stack.api.fake.baseURL.absoluteString + "/fake/signed-in"
            let start = stack.base + "/apple/sign-in?" + WebSignInStack.encode([
                ("client_id", "com.example.app"), ("return_to", returnURL), ("app_state", "browser-session-7"),
            ])
            let output = folder.appendingPathComponent("dom.html")
            // The virtual time budget lets the page's script submit its form and the browser follow
            // both redirects before the DOM is dumped.
            try await ConsoleBrowserTests.runChromium(["--virtual-time-budget=15000", "--dump-dom", start], stdout: output, in: folder)
            let dom = try String(contentsOf: output, encoding: .utf8)
            #expect(dom.contains("Back from Sign in with Apple"), "\(dom.prefix(2000))")
            #expect(dom.contains(#"<code id="app-state">browser-session-7</code>"#), "\(dom.prefix(2000))")
            let ticket = try #require(
                dom.firstMatch(of: #/<code id="ticket">([A-Za-z0-9_-]+)</code>/#).map { String($0.1) },
                "\(dom.prefix(2000))")

            // The fake binds the code to the redirect URI of its authorization: the exchange succeeds
            // only with the callback's.
            try await WebSignInTests.expectNewSignIn(redeeming: ticket, sub: "001.browser.user", in: stack)
        }
    }
}
