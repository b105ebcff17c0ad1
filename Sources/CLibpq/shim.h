#ifndef CLIBPQ_SHIM_H
#define CLIBPQ_SHIM_H
#include <libpq-fe.h>
// The wait for a statement's reply on its socket (Postgres/ReplyWatcher.swift): Swift's Glibc
// module leaves <sys/epoll.h> out.
#include <sys/epoll.h>

// PG_DIAG_* are character-literal macros, which Swift does not import.
static const int CLibpq_PG_DIAG_SQLSTATE = 'C';
static const int CLibpq_PG_DIAG_MESSAGE_PRIMARY = 'M';
static const int CLibpq_PG_DIAG_MESSAGE_DETAIL = 'D';
#endif
