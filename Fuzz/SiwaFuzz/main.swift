// The receiver's decoding path as a fuzz target (deploy/fuzz/run.sh).
//
// Built with `-sanitize=fuzzer,address -D SIWA_LIBFUZZER`, main hands over to libFuzzer's
// driver, which feeds `fuzzOne`. Built plainly (every `swift build`), it keeps the target compiling
// and offers two modes:
//   SiwaFuzz replay PATH...          runs files (or every file in folders) once, prints outcomes
//   SiwaFuzz make-corpus CLAIMS DIR  writes the seed corpus: fixture claims signed with the fuzz key,
//                                    plus every malformed shape the tests know
import Foundation

/// libFuzzer's callback: one input, whole path, result ignored. Returns 0 as libFuzzer requires.
let fuzzOne: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt = { data, size in
    let body = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    _ = FuzzFixture.run(body)
    return 0
}

#if SIWA_LIBFUZZER
    // The entry point libFuzzer knows by name.
    @_cdecl("LLVMFuzzerTestOneInput")
    public func fuzzerTestOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt { fuzzOne(data, size) }

    // This file's code is the process's `main` (libFuzzer's own is not linked in), so hand over to
    // libFuzzer's driver explicitly.
    @_silgen_name("LLVMFuzzerRunDriver")
    func LLVMFuzzerRunDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
        _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
    ) -> CInt

    var argc = CommandLine.argc
    var argv = CommandLine.unsafeArgv
    exit(LLVMFuzzerRunDriver(&argc, &argv, fuzzOne))
#else
    let arguments = Array(CommandLine.arguments.dropFirst())
    switch arguments.first {
    case "replay":
        var outcomes: [String: Int] = [:]
        for path in arguments.dropFirst() {
            for file in FuzzFiles.list(path) {
                guard let data = FileManager.default.contents(atPath: file) else { continue }
                outcomes[FuzzFixture.run(Array(data)), default: 0] += 1
            }
        }
        for (outcome, count) in outcomes.sorted(by: { $0.key < $1.key }) { print("\(count)\t\(outcome)") }
    case "make-corpus" where arguments.count == 3:
        let written = try FuzzCorpus.write(claimsFile: arguments[1], to: arguments[2])
        print("wrote \(written) seeds to \(arguments[2])")
    default:
        FileHandle.standardError.write(Data("usage: SiwaFuzz replay PATH... | SiwaFuzz make-corpus CLAIMS.json DIR\n".utf8))
        exit(2)
    }
#endif
