import Foundation

/// Small inline SVG charts drawn on the server: presentation attributes only (no `style`), so the
/// page's Content-Security-Policy allows no inline style and no script, and each bar carries a
/// `<title>` a browser shows on hover.
enum Charts {
    /// The last 24 hours, one pair of bars an hour: notifications received, requests rejected. The
    /// hours are UTC, as every time the console shows, and the axis says so.
    static func hourly(_ hours: [Overview.Hour]) -> HTML {
        let width = 720.0, height = 170.0, left = 36.0, bottom = 24.0, top = 22.0
        let plotHeight = height - bottom - top
        let slot = (width - left - 8) / Double(max(hours.count, 1))
        let highest = max(1, hours.map { max($0.received, $0.rejected) }.max() ?? 1)
        var bars: HTML = ""
        for (index, hour) in hours.enumerated() {
            let x = left + Double(index) * slot
            let label = Ages.timestamp(hour.start).dropLast(10) + ":00"
            for (offset, value, colour, what) in [(0.1, hour.received, "#2e5aac", "received"), (0.5, hour.rejected, "#b42318", "rejected")] {
                let barHeight = plotHeight * Double(value) / Double(highest)
                bars += """
                    <rect x="\(x + slot * offset)" y="\(top + plotHeight - barHeight)" width="\(slot * 0.38)" height="\(barHeight)" fill="\(colour)">\
                    <title>\(String(label)): \(value) \(what)</title></rect>
                    """
            }
            if index % 6 == 0 || index == hours.count - 1 {
                let utc = index == 0 ? " UTC" : ""
                bars += "<text x=\"\(x)\" y=\"\(height - 6)\" font-size=\"10\" fill=\"#667085\">\(String(label.suffix(5)))\(utc)</text>"
            }
        }
        return """
            <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 \(Int(width)) \(Int(height))" width="\(Int(width))" height="\(Int(height))" role="img" \
            aria-label="notifications received and rejected per hour, last 24 hours">\
            <text x="\(left)" y="14" font-size="11" fill="#1d2330">per hour (UTC), last 24 h: <tspan fill="#2e5aac">■ received</tspan> \
            <tspan fill="#b42318">■ rejected</tspan> (highest \(highest))</text>\
            <line x1="\(left)" y1="\(top + plotHeight)" x2="\(width - 8)" y2="\(top + plotHeight)" stroke="#d9dee7"/>\
            <text x="4" y="\(top + 8)" font-size="10" fill="#667085">\(highest)</text>\
            <text x="4" y="\(top + plotHeight)" font-size="10" fill="#667085">0</text>\(bars)</svg>
            """
    }

    /// The age buckets of the deletions pending now.
    static let deletionBuckets: [(name: String, below: Double)] = [
        ("< 1 h", 3600), ("1–6 h", 6 * 3600), ("6–24 h", 86_400), ("1–3 days", 3 * 86_400), ("> 3 days", .infinity),
    ]

    static func deletionAges(_ ages: [Double]) -> HTML {
        var counts = [Int](repeating: 0, count: deletionBuckets.count)
        for age in ages {
            counts[deletionBuckets.firstIndex { age < $0.below } ?? deletionBuckets.count - 1] += 1
        }
        let width = 360.0, rowHeight = 22.0, left = 70.0, top = 20.0
        let height = top + rowHeight * Double(deletionBuckets.count) + 6
        let widest = Double(max(1, counts.max() ?? 1))
        var rows: HTML = ""
        for (index, bucket) in deletionBuckets.enumerated() {
            let y = top + Double(index) * rowHeight
            let barWidth = (width - left - 40) * Double(counts[index]) / widest
            // Older buckets in warmer colours: a deletion older than a day is a compliance question.
            let colour = index >= 3 ? "#b42318" : index == 2 ? "#b54708" : "#2e5aac"
            rows += """
                <text x="6" y="\(y + 14)" font-size="11" fill="#1d2330">\(bucket.name)</text>\
                <rect x="\(left)" y="\(y + 3)" width="\(barWidth)" height="\(rowHeight - 8)" fill="\(colour)"><title>\(bucket.name): \(counts[index])</title></rect>\
                <text x="\(left + barWidth + 4)" y="\(y + 14)" font-size="11" fill="#667085">\(counts[index])</text>
                """
        }
        return """
            <svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 \(Int(width)) \(Int(height))" width="\(Int(width))" height="\(Int(height))" role="img" \
            aria-label="pending deletions by age"><text x="6" y="13" font-size="11" fill="#1d2330">pending deletions by age</text>\(rows)</svg>
            """
    }
}
