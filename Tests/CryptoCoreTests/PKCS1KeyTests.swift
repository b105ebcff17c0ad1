import CryptoCore
import Testing

/// A throwaway test key in traditional PKCS#1 form (`openssl genrsa -traditional 2048`).
@Suite struct PKCS1KeyTests {
    static let pkcs1PEM = """
-----BEGIN RSA PRIVATE KEY-----
MIIEpAIBAAKCAQEAvqapPfvmcIsHu3k6vmjJKHLf7xOCnoMD0V6XVdxNvCIy7gQ5
wuuqyA6Qk3cdLS5CnS5ICPS/a/1MbbZufZ3ifajZo4FOMm0nTEST2rPlkcMk0r1o
GEoelieo2ZJ9yQz8Zvp8OA5FU4FNkztL/gfyMXKD86ze+KHVurRlHiF8ZILVYWxo
1MyM1cPBRVFtS03UO954UMcTvjxHYLG0og+B+ESzpy9i30eXKN5FYbx8EPJdWjuq
gZ1zKyOfelqAKjLT1rxNpHzMnvQ7ZsWF+/J7U1ySWCSvoTLKtaEHqzVLLTpLXNN+
wd4yDmKqln5k9vfe+ALNfs6Xaahf67UUz/vRkQIDAQABAoIBAAC80wuPZaP93CnF
Gi44vKQtvo09mHDh1q+v4RiK5GjNucXRtKCd7yu7B3eyrZD8h1wSsUtHQhUsadr+
gyE6dKyrbkaI/UcaBL8Rd9Shhjz0+fZUa7sdpPn6o8ouHDvYySgt55SL6qIZSIel
dUg7vrdaXEEopvwSh84o9b98ZU3+lEBPxuwAFqOjLc+fp+CodIweGiNU5EQyrz4b
Ecu4ZgvU9fJl4Z3bJOylRF5IBd6BsP+Xs6vryPbrad7189z89+Y6hj/Ekfi/IN5g
m19WR5yfjJZcgIiWVv9d6LZMRtBmS18UWfEsR3AkhHQ/3c7HyPxpAFY0NAuJTS97
JvClXWECgYEA+ix+o7oIdcHS4jGeT3GPsZlcwchvmdmLWJEF30pw7x5XidfalX/b
tFJPZRvWChPMqrsLRQeo6ZlTFupsM3xUYp5vq3dWhqFlGIpWDheLuw1oKalbUFyj
pvPZ0a+s0REJJGOospQiNj7CqeReb0JKlP1CoOAey8t2RFbwAV7jJmECgYEAwxdM
hboBlww7FmIIiOVeIAl+78ETinBwz4o8Eq9H11DCweCffxjKsEw8lh4YFntQ+1Wk
qjcx++J4KiX93PE6JGbZbEt4+QLbOGb76hAoCxSH/Cp/+tBqaHaUEaBsP5QcgHvq
sPBxpPqqoH3ZhjVQieyg1/Z4JoVGiqgTwQsCGTECgYEAzADwnA6dy3jswKr5j4rp
REftTdBmwSyW5vgLs9P+V9+EPtGYW4TR4i+ksqyKU9llcmvoergOU79F9E/hP/LI
1UqhgU9lbY+64tIb7o3g0f3SzPZfkh6ZDRGYs9bvs+SScewaqtUFOPrgvq2NHGkQ
bIJBjPJ16nXV0VCbkmKQFMECgYEAtYdXb9MtKZR64o/jqyXp2Fudno+ElDud7K+O
yEAK1AHUxrwxDP1PlI3Ljk+AUGL8bnE5YB0tyFfpQibJui1H0ZlV1FvBu8p5m1jQ
LPJNoEnBYtVU8le9u2gizOf98Ybqom8raOrChCWuYNnZbvTq9PuWin1PPWCjy98r
SmPo1vECgYAy7qjtu8iKxU+DZUECi0Lzyk0OOEP5s1L85mCJlxGAIX9prbpnZllL
ro8diZ9JmrO5oUZd/TqZ10U9Hqt/QMv9ujeVxE9iwXetW9xNA/pdgKlDugHzhBWU
mZHYvZFFomjlMXQoadNLZ9Vo4Du3zGPkmrCuqn4PxTtA1hGseNnjdA==
-----END RSA PRIVATE KEY-----
"""

    @Test func loadsPKCS1AndWritesPKCS8() throws {
        let key = try RSA.PrivateKey(pemRepresentation: Self.pkcs1PEM)
        #expect(hexString(key.publicKey.modulus) == "bea6a93dfbe6708b07bb793abe68c92872dfef13829e8303d15e9755dc4dbc2232ee0439c2ebaac80e9093771d2d2e429d2e4808f4bf6bfd4c6db66e7d9de27da8d9a3814e326d274c4493dab3e591c324d2bd68184a1e9627a8d9927dc90cfc66fa7c380e4553814d933b4bfe07f2317283f3acdef8a1d5bab4651e217c6482d5616c68d4cc8cd5c3c145516d4b4dd43bde7850c713be3c4760b1b4a20f81f844b3a72f62df479728de4561bc7c10f25d5a3baa819d732b239f7a5a802a32d3d6bc4da47ccc9ef43b66c585fbf27b535c925824afa132cab5a107ab354b2d3a4b5cd37ec1de320e62aa967e64f6f7def802cd7ece9769a85febb514cffbd191")
        #expect(key.pemRepresentation.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let signature = try key.rs256Signature(for: [1, 2, 3])
        #expect(key.publicKey.isValidRS256Signature(signature, for: [1, 2, 3]))
    }
}
