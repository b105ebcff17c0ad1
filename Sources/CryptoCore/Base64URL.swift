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
    /// across modules runs unspecialised, an order of magnitude slower). Four characters to three
    /// bytes at a time into an output sized once: the worker decodes every held notification's
    /// token (about 1 KB), and a byte-at-a-time loop with an append each was its hottest code
    /// after the RSA itself.
    package static func decode(bytes characters: ArraySlice<UInt8>) -> [UInt8]? {
        let remainder = characters.count % 4
        if remainder == 1 { return nil }
        let groups = characters.count / 4
        let table = decodingTable  // read the lazily made global once, not once a character
        var output = [UInt8](repeating: 0, count: groups * 3 + (remainder == 0 ? 0 : remainder - 1))
        var input = characters.startIndex
        var index = 0
        for _ in 0..<groups {
            let first = table[Int(characters[input])], second = table[Int(characters[input + 1])]
            let third = table[Int(characters[input + 2])], fourth = table[Int(characters[input + 3])]
            // Every valid value is below 64, `invalid` has the top bit set.
            if (first | second | third | fourth) & 0x80 != 0 { return nil }
            let group = UInt32(first) << 18 | UInt32(second) << 12 | UInt32(third) << 6 | UInt32(fourth)
            output[index] = UInt8(truncatingIfNeeded: group >> 16)
            output[index + 1] = UInt8(truncatingIfNeeded: group >> 8)
            output[index + 2] = UInt8(truncatingIfNeeded: group)
            input += 4
            index += 3
        }
        // A final partial group's 4 (two characters) or 2 (three) unused bits must be zero
        // (canonical encoding).
        switch remainder {
        case 2:
            let first = table[Int(characters[input])], second = table[Int(characters[input + 1])]
            if (first | second) & 0x80 != 0 || second & 0x0F != 0 { return nil }
            output[index] = first << 2 | second >> 4
        case 3:
            let first = table[Int(characters[input])], second = table[Int(characters[input + 1])]
            let third = table[Int(characters[input + 2])]
            if (first | second | third) & 0x80 != 0 || third & 0x03 != 0 { return nil }
            let group = UInt32(first) << 12 | UInt32(second) << 6 | UInt32(third)
            output[index] = UInt8(truncatingIfNeeded: group >> 10)
            output[index + 1] = UInt8(truncatingIfNeeded: group >> 2)
        default:
            break
        }
        return output
    }
}
