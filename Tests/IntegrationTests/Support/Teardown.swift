/// Steps that stop what a test started, awaited in reverse order when the test's body ends, also
/// when it throws (a `defer` cannot await, and a `Task` started in one is never waited for: the
/// next test would start while this one's processes still run).
final class Teardown {
    private var steps: [() async -> Void] = []

    func add(_ step: @escaping () async -> Void) { steps.append(step) }

    fileprivate func run() async {
        for step in steps.reversed() { await step() }
        steps = []
    }
}

/// Runs `body`, then every step it added to the teardown, awaited.
func withTeardown<T>(_ body: (Teardown) async throws -> T) async throws -> T {
    let teardown = Teardown()
    do {
        let value = try await body(teardown)
        await teardown.run()
        return value
    } catch {
        await teardown.run()
        throw error
    }
}
