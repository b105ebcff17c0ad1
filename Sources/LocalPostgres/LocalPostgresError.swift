/// Why a throwaway cluster could not be set up, started or stopped.
package struct LocalPostgresError: Error, Sendable, CustomStringConvertible {
    package var message: String
    /// The tail of the failing command's output (or of the server log).
    package var output: String

    package init(_ message: String, output: String = "") {
        self.message = message
        self.output = output
    }

    package var description: String {
        let tail = output.split(separator: "\n", omittingEmptySubsequences: true).suffix(15).joined(separator: "\n")
        return tail.isEmpty ? message : "\(message)\n\(tail)"
    }
}
