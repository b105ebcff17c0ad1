/// The bound values of a `PostgresQuery`, laid out for `PQexecParams` with as few allocations as
/// possible: every value's bytes live in one buffer (text values NUL-terminated), plus one small array
/// per libpq parameter array.
package struct PostgresBindings: Sendable, Hashable {
    /// Text format (libpq `paramFormats` 0) or binary (1).
    package enum Format: Int32, Sendable { case text = 0, binary = 1 }

    /// One bound value as the tests (and logs of shapes, never of values) see it.
    package enum Value: Sendable, Hashable {
        case null(type: UInt32)
        case text(String, type: UInt32)
        case binary([UInt8], type: UInt32)
    }

    private(set) var bytes: [UInt8] = []
    /// Start of each value in `bytes`; -1 for NULL.
    private(set) var offsets: [Int] = []
    private(set) var lengths: [Int32] = []
    private(set) var formats: [Int32] = []
    private(set) var types: [UInt32] = []
    /// Set when a text value could not be sent (libpq text parameters end at the first NUL byte).
    package private(set) var invalidReason: String?

    package init() {}

    package init(capacity: Int) {
        // Most values are keys, short strings and flags: 48 bytes each lets a statement's values
        // land in the buffer without it growing (a sign-in's statements grew it four times each).
        bytes.reserveCapacity(capacity * 48)
        offsets.reserveCapacity(capacity)
        lengths.reserveCapacity(capacity)
        formats.reserveCapacity(capacity)
        types.reserveCapacity(capacity)
    }

    package var count: Int { offsets.count }

    package subscript(index: Int) -> Value {
        let offset = offsets[index]
        if offset < 0 { return .null(type: types[index]) }
        let slice = Array(bytes[offset..<offset + Int(lengths[index])])
        return formats[index] == Format.text.rawValue
            ? .text(String(decoding: slice, as: UTF8.self), type: types[index])
            : .binary(slice, type: types[index])
    }

    package var values: [Value] { (0..<count).map { self[$0] } }

    package mutating func appendNull(type: UInt32) {
        offsets.append(-1)
        lengths.append(0)
        formats.append(Format.text.rawValue)
        types.append(type)
    }

    /// Appends a text-format value; the UTF-8 bytes are copied once.
    package mutating func appendText(_ text: some StringProtocol, type: UInt32) {
        let start = bytes.count
        bytes.append(contentsOf: text.utf8)
        finishText(start: start, type: type)
    }

    /// Appends a text-format value written by `write` straight into the buffer.
    package mutating func appendText(type: UInt32, _ write: (inout [UInt8]) -> Void) {
        let start = bytes.count
        write(&bytes)
        finishText(start: start, type: type)
    }

    private mutating func finishText(start: Int, type: UInt32) {
        if invalidReason == nil, bytes[start...].contains(0) {
            invalidReason = "parameter $\(offsets.count + 1) contains a NUL byte, which PostgreSQL text cannot hold"
        }
        offsets.append(start)
        lengths.append(Int32(bytes.count - start))
        formats.append(Format.text.rawValue)
        types.append(type)
        bytes.append(0)
    }

    /// Marks the bindings unsendable; the query then fails with `reason` before reaching the server.
    mutating func refuse(_ reason: String) {
        if invalidReason == nil { invalidReason = reason }
    }

    /// Appends a binary-format value (only for types with a fixed OID, so the server knows the layout).
    package mutating func appendBinary(type: UInt32, _ write: (inout [UInt8]) -> Void) {
        let start = bytes.count
        write(&bytes)
        offsets.append(start)
        lengths.append(Int32(bytes.count - start))
        formats.append(Format.binary.rawValue)
        types.append(type)
    }

    package mutating func appendBinary(_ value: [UInt8], type: UInt32) {
        appendBinary(type: type) { $0.append(contentsOf: value) }
    }

    /// Calls `body` with the four parallel arrays `PQexecParams` wants. Pointers live only inside `body`.
    func withLibpqArrays<Result>(
        _ body: (
            _ types: UnsafePointer<UInt32>?, _ values: UnsafePointer<UnsafePointer<CChar>?>?,
            _ lengths: UnsafePointer<Int32>?, _ formats: UnsafePointer<Int32>?
        ) throws(PostgresError) -> Result
    ) throws(PostgresError) -> Result {
        if let invalidReason { throw PostgresError(.invalidParameter, message: invalidReason) }
        if count == 0 { return try body(nil, nil, nil, nil) }
        // An empty buffer may have no base address, and a nil value pointer would mean NULL.
        var storage = bytes
        if storage.isEmpty { storage.append(0) }
        return try storage.withUnsafeBufferPointer { (buffer) throws(PostgresError) -> Result in
            let base = UnsafeRawPointer(buffer.baseAddress!)
            var pointers = [UnsafePointer<CChar>?](repeating: nil, count: count)
            for index in 0..<count where offsets[index] >= 0 {
                pointers[index] = (base + offsets[index]).assumingMemoryBound(to: CChar.self)
            }
            return try types.withUnsafeBufferPointer { (types) throws(PostgresError) -> Result in
                try lengths.withUnsafeBufferPointer { (lengths) throws(PostgresError) -> Result in
                    try formats.withUnsafeBufferPointer { (formats) throws(PostgresError) -> Result in
                        try pointers.withUnsafeBufferPointer { (values) throws(PostgresError) -> Result in
                            try body(types.baseAddress, values.baseAddress, lengths.baseAddress, formats.baseAddress)
                        }
                    }
                }
            }
        }
    }
}
