import Foundation

/// The distinct defects a model run found, each with the first sequence that showed it, shrunk.
struct ModelReport {
    struct Defect {
        var violation: ModelViolation
        var occurrences: Int
        var first: ModelFailure
        var shrunk: [ModelStep]?
        var outcome: ModelSequence.Outcome?
        var note: String?
        /// Another defect whose shrunk sequence also shows this one.
        var shownBy: Int?
    }

    private(set) var defects: [Defect] = []
    let total: Int
    let runSeed: UInt64

    /// Shrinking stops after this many defects or this long, whichever comes first.
    static let maxShrunk = 12
    static let shrinkTime: Duration = .seconds(90)

    init(failures: [ModelFailure], total: Int, runSeed: UInt64) {
        self.total = total
        self.runSeed = runSeed
        var index: [String: Int] = [:]
        for failure in failures {
            var seen: Set<String> = []
            for violation in failure.violations where seen.insert(violation.key).inserted {
                if let at = index[violation.key] {
                    defects[at].occurrences += 1
                } else {
                    index[violation.key] = defects.count
                    defects.append(Defect(violation: violation, occurrences: 1, first: failure))
                }
            }
        }
    }

    /// Replays each defect's first sequence alone, then shrinks it to the steps that still break the
    /// same rule the same way. Known failures are not shrunk (they are already understood).
    mutating func shrinkDistinctDefects(generator: ModelGenerator, world: ModelWorld, known: Set<ModelRule> = []) async {
        let deadline = ContinuousClock.now + Self.shrinkTime
        let replays = LockedBox(0)
        for index in defects.indices where !known.contains(defects[index].violation.rule) {
            guard index < Self.maxShrunk, ContinuousClock.now < deadline else {
                defects[index].note = "not shrunk (time or count limit)"
                continue
            }
            let key = defects[index].violation.key
            let grouped = ModelGenerator.isGrouped(seed: defects[index].first.seed)
            if let other = defects.indices.first(where: { defects[$0].outcome?.violations.contains { $0.key == key } == true }) {
                defects[index].shownBy = other
                continue
            }
            let fails: ([ModelStep]) async -> Bool = { steps in
                guard ContinuousClock.now < deadline else { return false }
                let name = "shrink-\(replays.withValue { value -> Int in value += 1; return value })"
                let outcome = try? await ModelSequence.run(steps, grouped: grouped, world: world, name: name)
                return outcome?.violations.contains { $0.key == key } ?? false
            }
            let original = defects[index].first.steps
            guard await fails(original) else {
                defects[index].note = "did not fail again when replayed alone (an interleaving with other sequences?)"
                continue
            }
            var shrinker = ModelShrinker(budget: 120, stillFails: fails)
            let shrunk = await shrinker.shrink(original)
            defects[index].shrunk = shrunk
            defects[index].outcome = try? await ModelSequence.run(shrunk, grouped: grouped, world: world, name: "shrunk-\(index)")
        }
    }

    var text: String {
        guard !defects.isEmpty else { return "lifecycle model: every sequence ended right" }
        var lines: [String] = ["lifecycle model: \(defects.count) distinct defects (run seed 0x\(String(runSeed, radix: 16)))"]
        for (number, defect) in defects.enumerated() {
            lines.append("")
            lines.append("DEFECT \(number + 1): [\(defect.violation.rule.rawValue)] \(defect.violation.kind)")
            lines.append(
                "  in \(defect.occurrences) of \(total) sequences; first: sequence \(defect.first.index), "
                    + "SIWA_MODEL_REPLAY=0x\(String(defect.first.seed, radix: 16))")
            lines.append("  example: \(defect.violation.detail)")
            if let note = defect.note { lines.append("  \(note)") }
            if let other = defect.shownBy {
                lines.append("  shown by the shrunk sequence of DEFECT \(other + 1)")
                continue
            }
            let steps = defect.shrunk ?? defect.first.steps
            lines.append(defect.shrunk == nil ? "  sequence (\(steps.count) steps):" : "  shrunk from \(defect.first.steps.count) to \(steps.count) steps:")
            if ModelGenerator.isGrouped(seed: defect.first.seed) {
                lines.append("  (account linked under a Services ID grouped with the App ID Apple notifies)")
            }
            lines += steps.enumerated().map { "    \($0.offset + 1). \($0.element)" }
            if let outcome = defect.outcome {
                lines.append("  what happened:")
                lines += outcome.trace.map { "    \($0)" }
                lines.append("  broken:")
                lines += Set(outcome.violations.map { "[\($0.rule.rawValue)] \($0.kind): \($0.detail)" }).sorted().map { "    \($0)" }
            }
        }
        return lines.joined(separator: "\n")
    }

    static func describe(steps: [ModelStep], outcome: ModelSequence.Outcome) -> String {
        var lines = ["steps:"] + steps.enumerated().map { "  \($0.offset + 1). \($0.element)" }
        lines += ["what happened:"] + outcome.trace.map { "  \($0)" }
        lines += ["broken:"] + Set(outcome.violations.map { "  [\($0.rule.rawValue)] \($0.kind): \($0.detail)" }).sorted()
        return lines.joined(separator: "\n")
    }
}
