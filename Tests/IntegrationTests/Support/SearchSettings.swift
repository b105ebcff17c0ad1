import Foundation

/// How many random cases a model-based test tries and from which seed: `<prefix>_<COUNT NAME>`
/// and `<prefix>_SEED` (hex, `0x` optional) in the environment, else the default count and a
/// random seed. The test prints both, so a failure can be replayed with the same seed.
struct SearchSettings {
    var count: Int
    var seed: UInt64

    init(prefix: String, countName: String, defaultCount: Int, _ environment: [String: String] = ProcessInfo.processInfo.environment) {
        count = environment["\(prefix)_\(countName)"].flatMap(Int.init) ?? defaultCount
        seed = environment["\(prefix)_SEED"].flatMap { UInt64($0.replacingOccurrences(of: "0x", with: ""), radix: 16) }
            ?? UInt64.random(in: 0...UInt64.max)
    }

    var seedText: String { "0x" + String(seed, radix: 16) }
}
