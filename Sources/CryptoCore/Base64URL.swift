/// Base64url without padding, as JOSE uses it (RFC 7515 §2, RFC 4648 §5).
///
/// Decoding is strict: only `A–Z a–z 0–9 - _` are accepted; `=`, `+`, `/`, whitespace, a
/// length of 4n+1 and non-zero unused trailing bits are all rejected, so every byte string has
/// exactly one accepted encoding.
package enum Base64URL {
    private static let alphabet: [UInt8] = Array(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    private static let invalid: UInt8 = 0xFF

    private static let decodingTable: [UInt8] = {
        var table = [UInt8](repeating: invalid, count: 256)
        for (index, character) in alphabet.enumerated() {
            table[Int(character)] = UInt8(index)
        }
        return table
    }()

    package static func encode(_ bytes: some Sequence<UInt8>) -> String {
        let input = Array(bytes)
        var output: [UInt8] = []
        output.reserveCapacity((input.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= input.count {
            let group = UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8 | UInt32(input[index + 2])
            appendCharacters(of: group, count: 4, to: &output)
            index += 3
        }
        switch input.count - index {
        case 1:
            appendCharacters(of: UInt32(input[index]) << 16, count: 2, to: &output)
        case 2:
            appendCharacters(of: UInt32(input[index]) << 16 | UInt32(input[index + 1]) << 8, count: 3, to: &output)
        default:
            break
        }
        return String(decoding: output, as: UTF8.self)
    }

    private static func appendCharacters(of group: UInt32, count: Int, to output: inout [UInt8]) {
        for position in 0..<count {
            let shift = UInt32(18 - 6 * position)
            output.append(alphabet[Int((group >> shift) & 0x3F)])
        }
    }

    /// Returns nil for any input that is not canonical unpadded base64url.
    package static func decode(_ text: some StringProtocol) -> [UInt8]? {
        decode(bytes: ArraySlice(text.utf8))
    }

    /// `decode(_:)` over bytes: a concrete type, so the hot loop is compiled for it (a generic
    /// across modules runs unspecialised, an order of magnitude slower).
    package static func decode(bytes characters: ArraySlice<UInt8>) -> [UInt8]? {
        if characters.count % 4 == 1 { return nil }
        var output: [UInt8] = []
        output.reserveCapacity(characters.count * 3 / 4)
        var accumulator: UInt32 = 0
        var bitCount = 0
        for character in characters {
            let value = decodingTable[Int(character)]
            if value == invalid { return nil }
            accumulator = accumulator << 6 | UInt32(value)
            bitCount += 6
            if bitCount >= 8 {
                bitCount -= 8
                output.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bitCount)))
                accumulator &= (1 << UInt32(bitCount)) - 1
            }
        }
        // The 2 or 4 unused bits of a final partial group must be zero (canonical encoding).
        if accumulator != 0 { return nil }
        return output
    }
}
