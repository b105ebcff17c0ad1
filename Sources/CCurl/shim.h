#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H
#include <curl/curl.h>

// curl_easy_setopt, curl_easy_getinfo and curl_multi_setopt are variadic, which Swift cannot call:
// one typed helper per argument type they take here.
static inline CURLcode CCurl_setopt_long(CURL *_Nonnull handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode CCurl_setopt_string(CURL *_Nonnull handle, CURLoption option, const char *_Nullable value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode CCurl_setopt_pointer(CURL *_Nonnull handle, CURLoption option, void *_Nullable value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode CCurl_setopt_offset(CURL *_Nonnull handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode CCurl_setopt_blob(CURL *_Nonnull handle, CURLoption option, struct curl_blob *_Nonnull value) {
    return curl_easy_setopt(handle, option, value);
}

// The write and header callbacks share one C type.
typedef size_t (*CCurl_write_callback)(char *_Nonnull, size_t, size_t, void *_Nullable);
static inline CURLcode CCurl_setopt_write_callback(CURL *_Nonnull handle, CURLoption option, CCurl_write_callback _Nonnull callback) {
    return curl_easy_setopt(handle, option, callback);
}

static inline CURLcode CCurl_getinfo_long(CURL *_Nonnull handle, CURLINFO info, long *_Nonnull value) {
    return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode CCurl_getinfo_pointer(CURL *_Nonnull handle, CURLINFO info, void *_Nullable *_Nonnull value) {
    return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode CCurl_getinfo_string(CURL *_Nonnull handle, CURLINFO info, char *_Nullable *_Nonnull value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLMcode CCurl_multi_setopt_long(CURLM *_Nonnull multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}

// CURLMsg's `data` is a union Swift imports without its members' names being safe to read.
static inline CURLcode CCurl_message_result(const CURLMsg *_Nonnull message) { return message->data.result; }
#endif
