import CryptoCore
import Foundation

/// The secrets a test's worker (or app API) holds, made fresh for each test and never shared.
enum TestSecrets {
    /// Apple's signing key as a `.p8` file (ES256, PEM): written to `directory`, or to a folder of
    /// its own under `$TMPDIR` (the caller deletes `directory` when done).
    struct SigningKey {
        let privateKey: P256.Signing.PrivateKey
        let directory: URL
        let path: String

        init(fileName: String = "AuthKey_TESTKEY.p8", in directory: URL? = nil) throws {
            privateKey = try P256.Signing.PrivateKey.generate()
            if let directory {
                self.directory = directory
            } else {
                self.directory = FileManager.default.temporaryDirectory.appendingPathComponent("siwa-key-\(UUID().uuidString)")
                try FileManager.default.createDirectory(at: self.directory, withIntermediateDirectories: true)
            }
            path = self.directory.appendingPathComponent(fileName).path
            try privateKey.pemRepresentation.write(toFile: path, atomically: true, encoding: .utf8)
        }
    }

    /// `SIWA_TOKEN_KEYS`: a random 32-byte key for each id, the first the current one.
    static func tokenKeys(_ ids: [String] = ["k1"]) -> String {
        ids.map { "\($0):\(Data(SecureRandom.bytes(count: 32)).base64EncodedString())" }.joined(separator: ",")
    }
}
