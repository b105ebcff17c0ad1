extension Duration {
    /// The duration as fractional seconds, for metrics and Foundation APIs.
    package var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
