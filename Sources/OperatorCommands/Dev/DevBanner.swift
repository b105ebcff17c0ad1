/// What `siwa dev` prints once everything is ready: every URL, the `export` lines that let any later
/// command find this stack (no URL retyped, no secret on a command line), and lines to try.
struct DevBanner {
    var urls: DevStack.URLs
    var clientID: String
    /// `siwa`, or its full path when that binary is not the one on PATH.
    var siwa: String
    var workerStarted: Bool
    var deletesDatabase: Bool
    /// The app API token, in a 0600 file in dev's temporary folder.
    var apiTokenFile: String

    var text: String {
        var text = """

            siwa dev is running. Ctrl-C stops everything\(deletesDatabase ? " and deletes the database" : "").

              notification endpoint  POST \(urls.endpoint)
              receiver health        \(urls.receiver)/healthz  \(urls.receiver)/readyz
              receiver metrics       \(urls.receiver)/metrics

            """
        if workerStarted {
            text += "  worker ops             \(urls.workerOps)/healthz  \(urls.workerOps)/readyz\n"
            text += "  worker metrics         \(urls.workerOps)/metrics\n"
        } else {
            text += "  worker                 not started (--no-worker)\n"
        }
        if let appAPI = urls.appAPI { text += "  app API                \(appAPI)  (bearer token in \(apiTokenFile))\n" }
        text += "  Apple                  \(urls.fakeApple.map { "\($0) (fake: \(siwa) help fake-apple lists its test endpoints)" } ?? urls.appleBase)\n"
        if let caFile = urls.caFile {
            text += "  trusted CA             \(caFile)  (throwaway; SIWA_CA_FILE of the receiver and worker)\n"
        }
        text += "  DATABASE_URL           \(urls.database)\n"
        text += "  console                \(urls.console)  (the queue, deletions, each account's timeline)\n"
        if let webSignIn = urls.webSignIn {
            text += "  web sign-in            \(webSignIn)  (open in a browser: the fake Apple's page, then a ticket to redeem)\n"
        }

        text += "\nIn another terminal, paste these; then every siwa command finds this stack:\n"
        // `siwa` typed as is: its folder goes first on PATH when the shell would not find this binary.
        if siwa != "siwa", let slash = siwa.lastIndex(of: "/") {
            text += "  export PATH=\"\(siwa[..<slash]):$PATH\"\n"
        }
        text += "  export DATABASE_URL='\(urls.database)'\n"
        text += "  export SIWA_CLIENT_IDS=\(clientID)\n"
        text += "  export SIWA_RECEIVER_URL=\(urls.endpoint)\n"
        if let fake = urls.fakeApple { text += "  export SIWA_APPLE_BASE_URL=\(fake)\n" }
        // The printed commands call the fake too: over https they trust its CA.
        if let caFile = urls.caFile { text += "  export SIWA_CA_FILE=\(caFile)\n" }
        if let appAPI = urls.appAPI {
            text += "  export SIWA_APP_API_URL=\(appAPI)\n"
            text += "  export SIWA_APP_API_TOKENS_FILE=\(apiTokenFile)\n"
        }
        // The lines below run on their own too: over https they name the fake's CA.
        let trust = urls.caFile.map { "SIWA_CA_FILE=\($0) " } ?? ""
        if let fake = urls.fakeApple {
            text += """

                Try it (signs a notification with the fake's key and posts it):
                  \(trust)\(siwa) simulate consent-revoked --sub 000123.abc.0001 --client-id \(clientID) \
                --receiver-url \(urls.endpoint) --fake-apple-url \(fake)

                """
            if let appAPI = urls.appAPI {
                text += """

                    Sign in (app API nonce, the fake Apple's identity token for its hash, sign-in with the code):
                      \(trust)SIWA_APP_API_TOKENS_FILE=\(apiTokenFile) \(siwa) simulate sign-in --client-id \(clientID) \
                    --sub 000456.def.0001 --api-url \(appAPI) --fake-apple-url \(fake)

                    """
            }
        }
        text += "\nWhat is in the database (after pasting the lines above):\n  siwa status\n"
        return text
    }
}
