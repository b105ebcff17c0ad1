/// `siwa.accounts.status`, as its CHECK constraint allows (a test keeps the two equal). The
/// transitions between them are decided in SQL only (`siwa.account_effect`,
/// sql/functions/accounts.sql); Swift reads them.
package enum AccountStatus: String, Sendable, CaseIterable {
    /// A completed link (an exchange or a sign-in).
    case active
    /// `consent-revoked` from Apple, or reconciliation found the token dead: token discarded.
    case consentRevoked = "consent_revoked"
    /// `account-deleted` from Apple: token discarded, personal data erased.
    case appleAccountDeleted = "apple_account_deleted"
    /// `siwa.request_deletion(...)`, until every token is revoked at Apple.
    case pendingDeletion = "pending_deletion"
    /// Deletion finished: every token revoked (or there was none), personal data erased.
    case deleted
}
