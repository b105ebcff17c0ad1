#ifndef CLIBSSL_SHIM_H
#define CLIBSSL_SHIM_H
// libssl for the tests' TLS server only (Tests/ScriptedHTTPServer); no product links it.
#include <openssl/ssl.h>
#include <openssl/err.h>

static const int CLibssl_TLSEXT_ERR_NOACK = SSL_TLSEXT_ERR_NOACK;
#endif
