import Foundation
import Synchronization
import Locking

/// Counters, gauges and histograms rendered in Prometheus text format (version 0.0.4).
///
/// Names and labels follow Prometheus conventions: `_total` for counters, `_seconds` for
/// durations, base units. Labels are fixed at registration so a hostile request cannot grow the
/// series set (reasons and statuses come from small closed sets).
package final class MetricsRegistry: Sendable {
    private let families: Locked<[Family]> = Locked([])

    package init() {}

    private struct Family: Sendable {
        var name: String
        var help: String
        var type: String
        var render: @Sendable () -> [String]
    }

    package func counter(_ name: String, help: String, labels: [String: String] = [:]) -> Counter {
        let counter = Counter(name: name, labels: labels)
        register(name: name, help: help, type: "counter") { [counter] in [counter.sampleLine()] }
        return counter
    }

    package func gauge(_ name: String, help: String, labels: [String: String] = [:]) -> Gauge {
        let gauge = Gauge(name: name, labels: labels)
        register(name: name, help: help, type: "gauge") { [gauge] in [gauge.sampleLine()] }
        return gauge
    }

    /// A gauge computed when scraped (queue depth, key age).
    package func gauge(
        _ name: String, help: String, labels: [String: String] = [:], value: @escaping @Sendable () -> Double
    ) {
        register(name: name, help: help, type: "gauge") {
            ["\(name)\(renderLabels(labels)) \(formatNumber(value()))"]
        }
    }

    package func histogram(
        _ name: String, help: String, labels: [String: String] = [:], buckets: [Double] = Histogram.latencyBuckets
    ) -> Histogram {
        let histogram = Histogram(name: name, labels: labels, buckets: buckets)
        register(name: name, help: help, type: "histogram") { [histogram] in histogram.sampleLines() }
        return histogram
    }

    private func register(name: String, help: String, type: String, render: @escaping @Sendable () -> [String]) {
        families.withLock { $0.append(Family(name: name, help: help, type: type, render: render)) }
    }

    /// The exposition text: one HELP/TYPE header per metric name, then every series of that name.
    package func render() -> String {
        let snapshot = families.withLock { $0 }
        var order: [String] = []
        var grouped: [String: (help: String, type: String, lines: [String])] = [:]
        for family in snapshot {
            if grouped[family.name] == nil {
                order.append(family.name)
                grouped[family.name] = (family.help, family.type, [])
            }
            grouped[family.name]!.lines += family.render()
        }
        var text = ""
        for name in order {
            let entry = grouped[name]!
            text += "# HELP \(name) \(entry.help)\n# TYPE \(name) \(entry.type)\n"
            for line in entry.lines { text += line + "\n" }
        }
        return text
    }
}

package final class Counter: Sendable {
    private let name: String
    private let labels: [String: String]
    private let value = Atomic<Int>(0)

    fileprivate init(name: String, labels: [String: String]) {
        self.name = name
        self.labels = labels
    }

    package func increment(by amount: Int = 1) { value.add(amount, ordering: .relaxed) }
    package var current: Int { value.load(ordering: .relaxed) }
    fileprivate func sampleLine() -> String { "\(name)\(renderLabels(labels)) \(current)" }
}

package final class Gauge: Sendable {
    private let name: String
    private let labels: [String: String]
    private let value = Locked<Double>(0)

    fileprivate init(name: String, labels: [String: String]) {
        self.name = name
        self.labels = labels
    }

    package func set(_ newValue: Double) { value.withLock { $0 = newValue } }
    package func add(_ delta: Double) { value.withLock { $0 += delta } }
    package var current: Double { value.withLock { $0 } }
    fileprivate func sampleLine() -> String { "\(name)\(renderLabels(labels)) \(formatNumber(current))" }
}

package final class Histogram: Sendable {
    /// 0.5 ms to 10 s: receiver commits sit in the low milliseconds, Apple calls in the hundreds.
    package static let latencyBuckets: [Double] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
    ]

    /// 0.5 ms to 10 s, finer between 10 and 50 ms, where a request's tail sits under load.
    package static let requestBuckets: [Double] = [
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
    ]

    private struct State {
        var bucketCounts: [Int]
        var count = 0
        var sum = 0.0
    }

    private let name: String
    private let labels: [String: String]
    private let buckets: [Double]
    private let state: Locked<State>

    fileprivate init(name: String, labels: [String: String], buckets: [Double]) {
        self.name = name
        self.labels = labels
        self.buckets = buckets.sorted()
        self.state = Locked(State(bucketCounts: Array(repeating: 0, count: buckets.count)))
    }

    package func observe(_ value: Double) {
        let index = buckets.firstIndex { value <= $0 }
        state.withLock { state in
            if let index { state.bucketCounts[index] += 1 }
            state.count += 1
            state.sum += value
        }
    }

    /// Observes many values under one lock acquisition (a batch's worth, from a hot loop).
    package func observe(contentsOf values: some Sequence<Double>) {
        let observed = values.map { value in (index: buckets.firstIndex { value <= $0 }, value: value) }
        state.withLock { state in
            for (index, value) in observed {
                if let index { state.bucketCounts[index] += 1 }
                state.count += 1
                state.sum += value
            }
        }
    }

    package var count: Int { state.withLock { $0.count } }

    fileprivate func sampleLines() -> [String] {
        let snapshot = state.withLock { $0 }
        var lines: [String] = []
        var cumulative = 0
        for (bound, count) in zip(buckets, snapshot.bucketCounts) {
            cumulative += count
            var bucketLabels = labels
            bucketLabels["le"] = formatNumber(bound)
            lines.append("\(name)_bucket\(renderLabels(bucketLabels)) \(cumulative)")
        }
        var infinity = labels
        infinity["le"] = "+Inf"
        lines.append("\(name)_bucket\(renderLabels(infinity)) \(snapshot.count)")
        lines.append("\(name)_sum\(renderLabels(labels)) \(formatNumber(snapshot.sum))")
        lines.append("\(name)_count\(renderLabels(labels)) \(snapshot.count)")
        return lines
    }
}

private func renderLabels(_ labels: [String: String]) -> String {
    guard !labels.isEmpty else { return "" }
    let pairs = labels.keys.sorted().map { key -> String in
        let escaped = labels[key]!
            .replacingOccurrences(of: "\\", with: "\\\\")
            .replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n")
        return "\(key)=\"\(escaped)\""
    }
    return "{" + pairs.joined(separator: ",") + "}"
}

private func formatNumber(_ value: Double) -> String {
    if value.isNaN { return "NaN" }
    if value.isInfinite { return value > 0 ? "+Inf" : "-Inf" }
    if value == value.rounded(), abs(value) < 1e15 { return String(Int(value)) }
    return String(value)
}
