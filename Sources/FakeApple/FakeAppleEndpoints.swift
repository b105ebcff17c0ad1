/// The fake Apple's own test endpoints, as `siwa help fake-apple` shows them (README.md in this
/// folder says the same for readers of the code).
package enum FakeAppleEndpoints {
    package static let help = """
        test endpoints (the fake's own). The examples run as written in a shell where siwa dev's export lines were
        pasted: SIWA_APPLE_BASE_URL is the fake's URL and, when it serves https, SIWA_CA_FILE its throwaway CA
        (for a fake started by hand, set SIWA_APPLE_BASE_URL to the URL it prints):
          POST /fake/codes            an authorization code for a user, to link an account (siwa.link_account):
            curl -s ${SIWA_CA_FILE:+--cacert "$SIWA_CA_FILE"} -X POST "$SIWA_APPLE_BASE_URL"/fake/codes -d '{"client_id":"com.example.app","sub":"000123.abc.0001"}'
            -> {"code":"c...","expires_in":300}
          POST /fake/identity-tokens  what a device gets at sign-in: an identity token whose nonce claim is the
                                      given one (the SHA-256 hex of the app API's raw nonce) and a fresh code:
            curl -s ${SIWA_CA_FILE:+--cacert "$SIWA_CA_FILE"} -X POST "$SIWA_APPLE_BASE_URL"/fake/identity-tokens \\
              -d '{"client_id":"com.example.app","sub":"000123.abc.0001","nonce":"<sha256 hex>","email":"a@example.com"}'
            -> {"identity_token":"eyJ...","authorization_code":"c..."}
          POST /fake/failures         the next answers of one endpoint (token, revoke, keys, usermigrationinfo):
                                      a status, an OAuth error name, "timeout", "slow" or "bad_signature":
            curl -s ${SIWA_CA_FILE:+--cacert "$SIWA_CA_FILE"} -X POST "$SIWA_APPLE_BASE_URL"/fake/failures -d '{"endpoint":"revoke","responses":[503,"invalid_grant"],"retry_after":2}'
            -> {"queued":2}
          GET  /auth/authorize        Apple's page for a web or Android sign-in (response_mode=form_post): a chooser
                                      (sub, name, email; Continue or Cancel), then a page that posts state, code,
                                      id_token and user (or error=user_cancelled_authorize) to the redirect_uri
          POST /fake/authorize-user   skip the chooser: every later authorize answers for this user ({} brings it back):
            curl -s ${SIWA_CA_FILE:+--cacert "$SIWA_CA_FILE"} -X POST "$SIWA_APPLE_BASE_URL"/fake/authorize-user -d '{"sub":"000123.abc.0001","first_name":"Jane","last_name":"Appleseed"}'
            -> {"authorize":"000123.abc.0001"}
          GET  /fake/signed-in        a return page showing siwa_ticket / siwa_error / siwa_app_state (siwa dev's return URL)
          GET  /fake/calls            every call to the Apple endpoints so far (endpoint, client_id, time)
          GET  /fake/signing-key      the key siwa simulate signs notifications with (test only)

        """
}
