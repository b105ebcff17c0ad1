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
#include <openssl/x509.h>
#include <openssl/x509v3.h>

// OPENSSL_free is a function-like macro, which Swift cannot call.
static inline void COpenSSL_free(void *_Nullable pointer) { OPENSSL_free(pointer); }

// BIO_get_mem_data is a function-like macro over BIO_ctrl.
static inline long COpenSSL_BIO_get_mem_data(BIO *_Nonnull bio, char *_Nullable *_Nonnull data) {
    return BIO_get_mem_data(bio, data);
}

// Key selections are macros built from other macros (OR expressions), which Swift does not import.
static const int COpenSSL_EVP_PKEY_PUBLIC_KEY = EVP_PKEY_PUBLIC_KEY;
static const int COpenSSL_EVP_PKEY_KEYPAIR = EVP_PKEY_KEYPAIR;
static const int COpenSSL_MBSTRING_UTF8 = MBSTRING_UTF8;

// OSSL_PARAM_BLD_push_* keeps the key (and string value) pointers until OSSL_PARAM_BLD_to_param,
// so they must outlive the push call. Swift's String-to-pointer bridging does not; these return
// C string literals (static storage).
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_RSA_N(void) { return OSSL_PKEY_PARAM_RSA_N; }
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_RSA_E(void) { return OSSL_PKEY_PARAM_RSA_E; }
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_GROUP_NAME(void) { return OSSL_PKEY_PARAM_GROUP_NAME; }
static inline const char *_Nonnull COpenSSL_PKEY_PARAM_PUB_KEY(void) { return OSSL_PKEY_PARAM_PUB_KEY; }
static inline const char *_Nonnull COpenSSL_GROUP_NAME_P256(void) { return SN_X9_62_prime256v1; }

// X509V3_set_ctx fills a struct whose layout Swift would have to mirror; this adds one extension
// (`value` in openssl x509v3_config(5) syntax) to `cert`, issued by `issuer`. Returns 1 on success.
static inline int COpenSSL_add_extension(X509 *_Nonnull cert, X509 *_Nonnull issuer, int nid,
                                         const char *_Nonnull value) {
    X509V3_CTX context;
    X509V3_set_ctx(&context, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *extension = X509V3_EXT_conf_nid(NULL, &context, nid, value);
    if (extension == NULL) return 0;
    int added = X509_add_ext(cert, extension, -1);
    X509_EXTENSION_free(extension);
    return added;
}
#endif
