#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
#include <openssl/evp.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/rsa.h>
#include <openssl/bn.h>
#include <openssl/pem.h>
#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/core_names.h>
#include <openssl/param_build.h>
#include <openssl/crypto.h>

// OPENSSL_free is a function-like macro, which Swift cannot call.
static inline void COpenSSL_free(void *_Nullable pointer) { OPENSSL_free(pointer); }

// BIO_get_mem_data is a function-like macro over BIO_ctrl.
static inline long COpenSSL_BIO_get_mem_data(BIO *_Nonnull bio, char *_Nullable *_Nonnull data) {
    return BIO_get_mem_data(bio, data);
}

// Key selections are macros built from other macros (OR expressions), which Swift does not import.
static const int COpenSSL_EVP_PKEY_PUBLIC_KEY = EVP_PKEY_PUBLIC_KEY;
static const int COpenSSL_EVP_PKEY_KEYPAIR = EVP_PKEY_KEYPAIR;

// OSSL_PARAM_BLD_push_* keeps the key (and string value) pointers until OSSL_PARAM_BLD_to_param,
// so they must outlive the push call. Swift's String-to-pointer bridging does not; these return
// C string literals (static storage).
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_RSA_N(void) { return OSSL_PKEY_PARAM_RSA_N; }
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_RSA_E(void) { return OSSL_PKEY_PARAM_RSA_E; }
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_GROUP_NAME(void) { return OSSL_PKEY_PARAM_GROUP_NAME; }
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_PUB_KEY(void) { return OSSL_PKEY_PARAM_PUB_KEY; }
static inline const char *_Nonnull COpenSSL_GROUP_NAME_P256(void) { return SN_X9_62_prime256v1; }
#endif
