import CryptoCore
import Dispatch
import Testing

@Suite struct P256Tests {
    @Test func signVerifyRawSignature() throws {
        let key = try P256.Signing.PrivateKey.generate()
        let message = Array("header.payload".utf8)
        let signature = try key.es256Signature(for: message)
        #expect(signature.count == 64)
        #expect(key.publicKey.isValidES256Signature(signature, for: message))
        #expect(!key.publicKey.isValidES256Signature(signature, for: Array("header.payloaD".utf8)))
        for index in [0, 31, 32, 63] {
            var flipped = signature
            flipped[index] ^= 0x01
            #expect(!key.publicKey.isValidES256Signature(flipped, for: message))
        }
        #expect(!key.publicKey.isValidES256Signature(Array(signature.prefix(63)), for: message))
        #expect(!key.publicKey.isValidES256Signature([], for: message))
        let other = try P256.Signing.PrivateKey.generate()
        #expect(!other.publicKey.isValidES256Signature(signature, for: message))
    }

    @Test func pemRoundTrips() throws {
        let key = try P256.Signing.PrivateKey.generate()
        let pem = key.pemRepresentation
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let reloaded = try P256.Signing.PrivateKey(pemRepresentation: pem)
        let signature = try reloaded.es256Signature(for: [1, 2, 3])
        #expect(key.publicKey.isValidES256Signature(signature, for: [1, 2, 3]))

        let publicPEM = key.publicKey.pemRepresentation
        #expect(publicPEM.hasPrefix("-----BEGIN PUBLIC KEY-----"))
        let publicKey = try P256.Signing.PublicKey(pemRepresentation: publicPEM)
        #expect(publicKey.isValidES256Signature(signature, for: [1, 2, 3]))
    }

    @Test func coordinatesRoundTrip() throws {
        let key = try P256.Signing.PrivateKey.generate()
        let x = key.publicKey.x
        let y = key.publicKey.y
        #expect(x.count == 32 && y.count == 32)
        let rebuilt = try P256.Signing.PublicKey(x: x, y: y)
        #expect(rebuilt.derRepresentation == key.publicKey.derRepresentation)
        let signature = try key.es256Signature(for: [9])
        #expect(rebuilt.isValidES256Signature(signature, for: [9]))
    }

    @Test func offCurvePointIsRejected() throws {
        let key = try P256.Signing.PrivateKey.generate()
        var y = key.publicKey.y
        y[31] ^= 0x01
        #expect(throws: CryptoError.self) { try P256.Signing.PublicKey(x: key.publicKey.x, y: y) }
        #expect(throws: CryptoError.self) { try P256.Signing.PublicKey(x: [1, 2], y: y) }
    }

    /// RFC 7515 Appendix A.3: ES256 JWS verified with the published x, y.
    @Test func rfc7515AppendixA3() throws {
        let publicKey = try P256.Signing.PublicKey(
            x: try #require(Base64URL.decode("f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU")),
            y: try #require(Base64URL.decode("x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0")))
        let signingInput = Array(
            ("eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFt"
                + "cGxlLmNvbS9pc19yb290Ijp0cnVlfQ").utf8)
        let signature = try #require(
            Base64URL.decode("DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djxLa8ISlSApmWQxfKTUJqPP3-Kg6NU1Q"))
        #expect(publicKey.isValidES256Signature(signature, for: signingInput))
        var flipped = signature
        flipped[10] ^= 0x01
        #expect(!publicKey.isValidES256Signature(flipped, for: signingInput))
    }

    @Test func rejectsNonP256Keys() throws {
        let rsa = try RSA.PrivateKey.generate()
        let error = #expect(throws: CryptoError.self) {
            try P256.Signing.PrivateKey(pemRepresentation: rsa.pemRepresentation)
        }
        #expect(error?.code == .unsupportedKey)
        #expect(throws: CryptoError.self) {
            try P256.Signing.PublicKey(pemRepresentation: rsa.publicKey.pemRepresentation)
        }
        #expect(throws: CryptoError.self) { try P256.Signing.PrivateKey(pemRepresentation: "not a key") }
    }
}

@Suite struct RSATests {
    @Test func signVerify() throws {
        let key = try RSA.PrivateKey.generate()
        let message = Array("header.payload".utf8)
        let signature = try key.rs256Signature(for: message)
        #expect(signature.count == 256)
        #expect(key.publicKey.isValidRS256Signature(signature, for: message))
        var flipped = signature
        flipped[100] ^= 0x01
        #expect(!key.publicKey.isValidRS256Signature(flipped, for: message))
        #expect(!key.publicKey.isValidRS256Signature(signature, for: Array("header.payloaD".utf8)))
        #expect(!key.publicKey.isValidRS256Signature([], for: message))

        let other = try RSA.PrivateKey.generate()
        #expect(!other.publicKey.isValidRS256Signature(signature, for: message))
    }

    @Test func modulusExponentRoundTrip() throws {
        let key = try RSA.PrivateKey.generate()
        #expect(key.publicKey.modulus.count == 256)
        #expect(key.publicKey.exponent == [0x01, 0x00, 0x01])
        let rebuilt = try RSA.PublicKey(modulus: key.publicKey.modulus, exponent: key.publicKey.exponent)
        let signature = try key.rs256Signature(for: [1])
        #expect(rebuilt.isValidRS256Signature(signature, for: [1]))
        #expect(rebuilt.derRepresentation == key.publicKey.derRepresentation)
    }

    @Test func pemRoundTrips() throws {
        let key = try RSA.PrivateKey.generate()
        let pem = key.pemRepresentation
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let reloaded = try RSA.PrivateKey(pemRepresentation: pem)
        #expect(reloaded.publicKey.modulus == key.publicKey.modulus)
        let publicKey = try RSA.PublicKey(pemRepresentation: key.publicKey.pemRepresentation)
        #expect(publicKey.isValidRS256Signature(try reloaded.rs256Signature(for: [7]), for: [7]))
    }

    @Test func rejectsSmallAndMalformedKeys() throws {
        let key = try RSA.PrivateKey.generate()
        let small = Array(key.publicKey.modulus.prefix(128))  // 1024 bits
        let error = #expect(throws: CryptoError.self) {
            try RSA.PublicKey(modulus: small, exponent: [1, 0, 1])
        }
        #expect(error?.code == .unsupportedKey)
        #expect(throws: CryptoError.self) { try RSA.PublicKey(modulus: key.publicKey.modulus, exponent: [1]) }
        #expect(throws: CryptoError.self) { try RSA.PublicKey(modulus: key.publicKey.modulus, exponent: [2]) }
        #expect(throws: CryptoError.self) { try RSA.PublicKey(modulus: key.publicKey.modulus, exponent: []) }
        #expect(throws: CryptoError.self) { try RSA.PrivateKey.generate(bits: 1024) }
        let ec = try P256.Signing.PrivateKey.generate()
        #expect(throws: CryptoError.self) { try RSA.PrivateKey(pemRepresentation: ec.pemRepresentation) }
        #expect(throws: CryptoError.self) { try RSA.PublicKey(pemRepresentation: ec.publicKey.pemRepresentation) }
    }

    @Test func concurrentSigningWithOneKey() async throws {
        let key = try RSA.PrivateKey.generate()
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<32 {
                group.addTask {
                    let message = Array("message \(index)".utf8)
                    return key.publicKey.isValidRS256Signature(try key.rs256Signature(for: message), for: message)
                }
            }
            for try await valid in group { #expect(valid) }
        }
    }
}

/// A key sets its signature context up once and copies it for each operation: every operation
/// must then be independent of the others, whatever ran before on the key and on other threads
/// (a failed verification leaves nothing behind, a signature never sees another's message).
@Suite struct SignatureContextReuseTests {
    @Test func oneKeySignsAndVerifiesFromManyThreadsAtOnce() throws {
        let rsa = try RSA.PrivateKey.generate()
        let ec = try P256.Signing.PrivateKey.generate()
        // One slot per iteration, each written by its own thread only.
        nonisolated(unsafe) let answers = UnsafeMutableBufferPointer<Bool>.allocate(capacity: 64)
        answers.initialize(repeating: false)
        defer { answers.deallocate() }
        DispatchQueue.concurrentPerform(iterations: answers.count) { index in
            let message = Array("message \(index)".utf8)
            let other = Array("message \(index + 1)".utf8)
            var right = true
            do {
                let rsaSignature = try rsa.rs256Signature(for: message)
                let ecSignature = try ec.es256Signature(for: message)
                for _ in 0..<2 {
                    right = right && !rsa.publicKey.isValidRS256Signature(rsaSignature, for: other)
                    right = right && rsa.publicKey.isValidRS256Signature(rsaSignature, for: message)
                    right = right && !ec.publicKey.isValidES256Signature(ecSignature, for: other)
                    right = right && ec.publicKey.isValidES256Signature(ecSignature, for: message)
                }
                // RS256 is deterministic: the same message, the same bytes, whatever ran before.
                let again = try rsa.rs256Signature(for: message)
                right = right && again == rsaSignature
            } catch {
                right = false
            }
            answers[index] = right
        }
        #expect(answers.allSatisfy { $0 })
    }
}
