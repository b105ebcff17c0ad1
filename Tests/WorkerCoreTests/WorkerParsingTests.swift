import SiwaCore
import Testing
import WorkerCore

/// Pure worker logic: the files and settings the worker parses, no database, no network.
@Suite struct WorkerParsingTests {
    @Test func transferFileLinesRoundTripAndRejectWhatIsNotALine() {
        for user in ["user-1", "a,b", "say \"hi\"", "ümlaut"] {
            let line = TransferFile.line(transferSub: "000123.abc.0001", appUserID: user)
            #expect(TransferFile.parse(line) == .entry(transferSub: "000123.abc.0001", appUserID: user), "\(line)")
        }
        #expect(TransferFile.parse("transfer_sub,app_user_id") == .skip)
        #expect(TransferFile.parse("  ") == .skip)
        for bad in ["nocomma", ",user", "t.1,", "t 1,user", "t.1,\"open", "t.1,a\"b", "t.1,a,b"] {
            #expect(TransferFile.parse(bad) == .malformed, "\(bad)")
        }
    }

    @Test func appGroupsSettingIsChecked() throws {
        let ids = ["a.app", "a.web", "b.app", "b.web"]
        #expect(try WorkerConfiguration.parseAppGroups("a.app,a.web;b.app, b.web", clientIDs: ids) == [["a.app", "a.web"], ["b.app", "b.web"]])
        #expect(try WorkerConfiguration.parseAppGroups("", clientIDs: ids) == [])
        #expect(throws: ConfigurationError.self) { try WorkerConfiguration.parseAppGroups("a.app,c.web", clientIDs: ids) }
        #expect(throws: ConfigurationError.self) { try WorkerConfiguration.parseAppGroups("a.app,a.web;a.app,b.web", clientIDs: ids) }
        #expect(throws: ConfigurationError.self) { try WorkerConfiguration.parseAppGroups("a.app", clientIDs: ids) }
    }
}
