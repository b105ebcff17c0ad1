import Testing
import WorkerCore
import TeamTransfer
import Settings

/// Pure worker logic: the files and settings the worker parses, no database, no network.
@Suite struct WorkerParsingTests {
    @Test func transferFileLinesRoundTripAndRejectWhatIsNotALine() throws {
        let users = [
            "user-1", "a,b", "say \"hi\"", "ümlaut", "two\nlines", "crlf\r\nend", "\"\n\"", "back\\slash, quoted",
            "back\\n literal", "tab\there", "trailing space ", " leading space", "nbsp\u{00A0}", "bell\u{07}", "nel\u{85}",
            "ls\u{2028}ps\u{2029}", "\u{301}combining first", "quote then mark \"\u{301}", "#hash", "\\",
        ]
        for user in users {
            let line = try #require(TransferFile.line(transferSub: "000123.abc.0001", appUserID: user))
            // One physical line, whoever splits it: no line feed, carriage return or Unicode line separator.
            #expect(!line.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) || $0.value == 0x2028 || $0.value == 0x2029 }, "\(line.debugDescription)")
            #expect(TransferFile.parse(line) == .entry(transferSub: "000123.abc.0001", appUserID: user), "\(line.debugDescription)")
            #expect(TransferFile.parse(line + "\r") == .entry(transferSub: "000123.abc.0001", appUserID: user), "\(line.debugDescription)")
        }
        #expect(TransferFile.line(transferSub: "t.1", appUserID: "two\nlines") == #"t.1,"two\nlines""#)
        #expect(TransferFile.line(transferSub: "t.1", appUserID: "say \"hi\"") == #"t.1,"say ""hi""""#)
        // An identifier with a separator would corrupt the file: refused, the caller reports the account.
        for transferSub in ["t,1", "t\n1", "t 1", "t\"1", ""] {
            #expect(TransferFile.line(transferSub: transferSub, appUserID: "user") == nil, "\(transferSub.debugDescription)")
        }
        #expect(TransferFile.parse("transfer_sub,app_user_id") == .skip)
        #expect(TransferFile.parse("  ") == .skip)
        for bad in [
            "nocomma", ",user", "t.1,", "t 1,user", "t.1,\"open", "t.1,a\"b", "t.1,a,b", #"t.1,"bad \q escape""#, #"t.1,"\u12""#,
            #"t.1,"\uD800""#, #"t.1,"end" after"#, #"t.1,"nul\u0000""#, "t.1,raw\u{0}nul",
        ] {
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
